//! The templates: the Model as `haproxy.cfg` text through minijinja.
//!
//! Owns the template environment (auto-escape off, strict undefined, a fuel cap and an output
//! cap), the built-in template (`templates/haproxy.cfg.j2`, embedded in the binary), the admin's
//! override and snippets (global, defaults, frontend, backend), and the view the template sees:
//! every value from an object in it is already a quoted config word (`haptic_haproxy::quote`).
//! It must never decide routing: the template only lays out what the Model says.

use std::collections::BTreeMap;

use haptic_haproxy::quote::{config_arg, log_format_arg, regex_literal};
use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde::Serialize;

use crate::model::{
    HeaderOps, HostLookup, Model, PathKind, PathRewrite, Policy, Protocol, Redirect, DEFAULT_RULE, ERROR_500,
    NOT_FOUND, UNAVAILABLE,
};
use crate::names::{map_table, var_table, MapFile, Var};
use crate::RenderError;
use haptic_haproxy::http::ERROR_PAGES;
use haptic_haproxy::names::is_section_name;

/// The built-in template.
pub const BUILTIN: &str = include_str!("../templates/haproxy.cfg.j2");
/// How much work a template may do (minijinja fuel).
pub const FUEL: u64 = 5_000_000;
/// The largest `haproxy.cfg` a template may produce.
pub const MAX_OUTPUT: usize = 16 << 20;

/// The template and snippets an admin may give.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Templates {
    /// Replaces [`BUILTIN`] when set.
    pub main: Option<String>,
    /// Raw config text added to sections (trusted: written by the admin).
    pub snippets: Snippets,
}

/// Admin snippets, inserted verbatim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Snippets {
    /// End of `global`.
    pub global: String,
    /// End of `defaults`.
    pub defaults: String,
    /// End of every frontend.
    pub frontend: String,
    /// End of every backend.
    pub backend: String,
}

#[derive(Serialize)]
struct View<'a> {
    health: Option<String>,
    /// Whether each frontend normalises the request path before routing (`normalize-uri`,
    /// which HAProxy 2.6 and 3.0 expose only with `expose-experimental-directives`).
    normalize_paths: bool,
    frontends: Vec<FrontendView>,
    /// Whether some rule has a policy (its [`Var::Policy`] is then looked up).
    policies: bool,
    /// The `http-request` lines of every policy, each ending with its condition.
    policy_lines: Vec<String>,
    /// The `replace-path` line of every rewrite, each ending with its condition.
    rewrite_lines: Vec<String>,
    /// The lines choosing a canary's or its main backend by header or cookie.
    canary_lines: Vec<String>,
    /// The `http-response` lines of every policy.
    response_lines: Vec<String>,
    /// The stick-table backends of policies with limits: (name, `stick-table` line).
    tables: Vec<(String, String)>,
    /// The userlists: (name, `user` lines).
    userlists: Vec<(String, Vec<String>)>,
    /// The SNI-routing frontend, when some host passes TLS through.
    passthrough: Option<PassthroughView>,
    backends: Vec<BackendView>,
    not_found: &'static str,
    /// The rule of requests no host and path selects.
    default_rule: &'static str,
    unavailable: &'static str,
    error_500: &'static str,
    snippets: &'a Snippets,
    /// `http-request set-var(txn.rule) …` lines of the matches that need more than a path.
    match_lines: Vec<String>,
    /// `http-request …` lines drawing a split rule's sub-rule.
    split_lines: Vec<String>,
    /// Whether the 500 backend is written: some rule names it, or some frontend looks hosts up
    /// by listener (whose rules may come to name it by a map change).
    error_500_backend: bool,
    /// The map files by key (`maps.rules` is `maps/rules.map`).
    maps: BTreeMap<&'static str, &'static str>,
    /// The transaction variables by key (`txn.rule` is `txn.rule`).
    txn: BTreeMap<&'static str, &'static str>,
    /// The sample expression the regex path map is looked up with.
    regex_lookup: String,
    /// The edge's lines ([`crate::edge`]).
    edge: EdgeView,
    /// The mirror's script and frontend, when some policy mirrors requests.
    mirror: Option<MirrorView>,
}

/// Where the mirror's script is and where its frontend listens ([`crate::mirror`]).
#[derive(Serialize)]
struct MirrorView {
    /// The script's path, quoted.
    lua: String,
    /// The environment variable naming the socket to the script.
    env: &'static str,
    /// `abns@…`, quoted.
    socket: String,
}

/// The lines of [`crate::edge::Edge`], by section.
#[derive(Serialize)]
struct EdgeView {
    /// For `global`.
    global: Vec<String>,
    /// For `defaults` (the timeouts among them).
    defaults: Vec<String>,
    /// For the `mode tcp` backends' `defaults`: the connect, server and tunnel timeouts.
    tcp_defaults: Vec<String>,
    /// For every HTTP frontend, before routing.
    frontend: Vec<String>,
    /// The stats and exporter frontend's bind, when there is one.
    stats: Option<String>,
}

#[derive(Serialize)]
struct PassthroughView {
    /// The TLS binds, plain.
    binds: Vec<String>,
    /// The abstract socket of the TLS-terminating frontend, when there is one.
    terminate: Option<String>,
}

#[derive(Serialize)]
struct FrontendView {
    name: String,
    binds: Vec<String>,
    /// Host tables found by host and listener ([`crate::model::HostLookup::Listener`]).
    by_listener: bool,
    /// HTTPS listeners told apart by SNI and Host (421 when they differ).
    misdirected: bool,
    /// `mode tcp` ([`crate::model::HostLookup::Sni`], [`crate::model::HostLookup::Port`]).
    l4: bool,
    /// The fetch of the SNI the host table is found by (none: the listener port's table).
    sni_fetch: Option<&'static str>,
    /// Wait for the TLS ClientHello (`req.ssl_sni`).
    hello: bool,
    /// The bind ports whose TLS listeners terminate TLS, of an SNI frontend.
    terminate: Vec<TerminateView>,
}

/// A bind port of a `sni` frontend whose TLS listeners terminate TLS: its connections go to
/// `socket` with the PROXY protocol, where a `mode tcp` bind decrypts them with `certs` (none:
/// no certificate resolved, its connections are refused).
#[derive(Serialize)]
struct TerminateView {
    port: u16,
    /// `abns@…`, quoted.
    socket: String,
    /// `crt <path>` words.
    certs: String,
}

#[derive(Serialize)]
struct BackendView {
    name: String,
    servers: Vec<ServerView>,
    /// `timeout …` lines.
    timeouts: Vec<String>,
    /// Words after each server's address (the protocol's).
    server_params: String,
    /// A checked snippet from the Ingresses naming it.
    snippet: Option<String>,
    /// The `cookie` line of cookie affinity.
    cookie: Option<String>,
    /// `mode tcp` (a passthrough backend).
    tcp: bool,
    /// `http-request` lines for the rules sending here (Gateway API timeouts).
    lines: Vec<String>,
    /// `retry-on` and `retries` lines, when its requests are retried.
    retry: Vec<String>,
}

#[derive(Serialize)]
struct ServerView {
    name: String,
    addr: String,
    disabled: bool,
    draining: bool,
    /// The value of its affinity cookie (its name), when the backend has affinity.
    cookie: Option<String>,
    /// Its weight, when not the default and not draining.
    weight: Option<u16>,
    /// A `backup` server.
    backup: bool,
    /// The words the fields above stand for, each with a leading space (`disabled`, `weight`,
    /// `backup`, `cookie`, in that order): what the built-in template writes after `addr`.
    words: String,
}

/// The words after a server's address that its view's fields stand for (`disabled`, `weight`,
/// `backup`, `cookie`), each with a leading space.
fn server_words(s: &ServerView) -> String {
    let mut w = String::new();
    if s.disabled {
        w.push_str(" disabled");
    }
    if s.draining {
        w.push_str(" weight 0");
    } else if let Some(n) = s.weight {
        w.push_str(&format!(" weight {n}"));
    }
    if s.backup {
        w.push_str(" backup");
    }
    if let Some(c) = &s.cookie {
        w.push_str(&format!(" cookie {c}"));
    }
    w
}

fn view<'a>(model: &Model, snippets: &'a Snippets) -> Result<View<'a>, RenderError> {
    let (frontends, passthrough) = frontend_views(model)?;
    let backends = model.backends.iter().map(|b| backend_view(model, b)).collect::<Result<_, _>>()?;
    let mut policy_lines = Vec::new();
    let mut response_lines = Vec::new();
    let mut tables = Vec::new();
    for p in &model.policies {
        policy_lines.extend(policy_lines_of(&p.id, &p.policy)?);
        response_lines.extend(response_lines_of(&p.id, &p.policy)?);
        if let Some(l) = &p.policy.limit {
            tables.push((table_of(&p.id), table_line(l)));
            if l.rpm.is_some() {
                tables.push((minute_table_of(&p.id), MINUTE_TABLE.to_string()));
            }
        }
    }
    let mut userlists = Vec::new();
    for u in &model.userlists {
        if !is_section_name(&u.name) {
            return Err(RenderError::Template(format!("{:?} is not a userlist name", u.name)));
        }
        let users = u
            .users
            .iter()
            .map(|(name, hash)| Ok(format!("user {} password {}", config_arg(name)?, config_arg(hash)?)))
            .collect::<Result<_, RenderError>>()?;
        userlists.push((u.name.clone(), users));
    }
    let mut rewrite_lines = Vec::new();
    for w in &model.rewrites {
        rewrite_lines
            .extend(path_rewrite_lines(&w.rewrite, &format!("{{ var({}) -m str {} }}", Var::Rewrite, our_id(&w.id)?))?);
    }
    let mut canary_lines = Vec::new();
    for c in &model.canaries {
        canary_lines.extend(canary_lines_of(&c.id, &c.selector)?);
    }
    let health = model.health.map(|a| config_arg(&a.to_string())).transpose()?;
    let (match_lines, split_lines) = match_and_split_lines(model)?;
    let by_listener = model.frontends.iter().any(|f| matches!(f.hosts, HostLookup::Listener(_)));
    let error_500_backend = by_listener || model.rules.iter().any(|r| r.backend == ERROR_500);
    Ok(View {
        health,
        normalize_paths: model.paths == crate::model::PathNormalization::Normalize,
        frontends,
        policies: !model.policies.is_empty(),
        policy_lines,
        rewrite_lines,
        canary_lines,
        response_lines,
        tables,
        userlists,
        passthrough,
        backends,
        not_found: NOT_FOUND,
        default_rule: DEFAULT_RULE,
        unavailable: UNAVAILABLE,
        error_500: ERROR_500,
        snippets,
        match_lines,
        split_lines,
        error_500_backend,
        maps: map_table(),
        txn: var_table(),
        regex_lookup: crate::maps::regex_lookup(),
        edge: EdgeView {
            global: model.edge.global_lines(),
            defaults: model.edge.defaults_lines(),
            tcp_defaults: model.edge.tcp_backend_defaults_lines(),
            frontend: model.edge.frontend_lines(),
            stats: model.edge.stats.map(|a| config_arg(&a.to_string())).transpose()?,
        },
        mirror: if crate::mirror::used(model) {
            Some(MirrorView {
                lua: config_arg(crate::mirror::SCRIPT_PATH)?,
                env: crate::mirror::SOCKET_ENV,
                socket: config_arg(&crate::mirror::socket(model))?,
            })
        } else {
            None
        },
    })
}

/// The frontends' binds, and the passthrough frontend when some host passes TLS through.
fn frontend_views(model: &Model) -> Result<(Vec<FrontendView>, Option<PassthroughView>), RenderError> {
    // The default certificate first on the binds that serve every Ingress's certificates:
    // HAProxy serves a bind's first `crt` to an SNI no other certificate names, so an unknown
    // name never sees a tenant's certificate.
    let default = model.edge.default_certificate.as_ref().map(|_| crate::edge::DEFAULT_CERTIFICATE_PATH);
    let certs: Vec<String> = default
        .into_iter()
        .chain(model.certs.iter().map(|c| c.path.as_str()))
        .map(|p| config_arg(p).map(|p| format!("crt {p}")))
        .collect::<Result<_, _>>()?;
    let mut frontends = Vec::new();
    // With passthrough hosts, a `mode tcp` frontend takes the TLS binds and routes by SNI; the
    // other connections go on, through an abstract socket, to the TLS-terminating frontend.
    let mut passthrough: Option<PassthroughView> =
        (!model.passthrough.is_empty()).then(|| PassthroughView { binds: vec![], terminate: None });
    for f in &model.frontends {
        let mut binds = Vec::new();
        for b in &f.binds {
            let addr = std::net::SocketAddr::new(b.address, b.port).to_string();
            // A client-facing bind: PROXY protocol when the edge says so.
            let mut s = format!("{}{}", config_arg(&addr)?, model.edge.bind_words());
            if b.tls {
                if let Some(pt) = passthrough.as_mut() {
                    pt.binds.push(s);
                    if certs.is_empty() {
                        continue;
                    }
                    let inner = config_arg(&format!("abns@haptic-https-{addr}"))?;
                    pt.terminate = Some(inner.clone());
                    s = format!("{inner} accept-proxy");
                }
                s.push_str(" ssl ");
                if b.certs.is_empty() {
                    s.push_str(&certs.join(" "));
                } else {
                    // A Gateway listener's own certificates (its Gateway's, not a route's): the
                    // listener's first one answers an SNI none names, as before.
                    let own: Vec<String> =
                        b.certs.iter().map(|p| config_arg(p).map(|p| format!("crt {p}"))).collect::<Result<_, _>>()?;
                    s.push_str(&own.join(" "));
                }
                // HTTP/2 to clients that offer it, on every version (2.6 offers only HTTP/1.1
                // without it).
                s.push_str(" alpn h2,http/1.1");
                if let Some(c) = &b.clients {
                    // An insecure fallback lets through a missing certificate (`optional`) and
                    // one that does not verify (every error ignored, at depth 0 and above).
                    let verify = if c.required { "required" } else { "optional ca-ignore-err all crt-ignore-err all" };
                    s.push_str(&format!(" ca-file {} verify {verify}", config_arg(&c.ca_file)?));
                }
            }
            binds.push(s);
        }
        if !binds.is_empty() {
            let (by_listener, misdirected) = match &f.hosts {
                HostLookup::Host | HostLookup::Sni(_) | HostLookup::Port => (false, false),
                HostLookup::Listener(l) => (true, !l.tls.is_empty()),
            };
            let terminate: Vec<TerminateView> = match &f.hosts {
                HostLookup::Sni(ts) => ts.iter().map(terminate_view).collect::<Result<_, _>>()?,
                _ => Vec::new(),
            };
            let sni = matches!(f.hosts, HostLookup::Sni(_));
            // A port whose terminating listeners have no usable certificate is not decrypted: its
            // connections are refused (the template's `reject`), never passed through.
            let decrypting: Vec<String> = terminate
                .iter()
                .filter(|t| !t.certs.is_empty())
                .map(|t| format!("{} accept-proxy ssl {}", t.socket, t.certs))
                .collect();
            let decrypted = (!decrypting.is_empty()).then(|| FrontendView {
                name: format!("{}_terminated", f.name),
                binds: decrypting,
                by_listener: false,
                misdirected: false,
                l4: true,
                sni_fetch: Some("ssl_fc_sni"),
                hello: false,
                terminate: Vec::new(),
            });
            frontends.push(FrontendView {
                name: f.name.clone(),
                binds,
                by_listener,
                misdirected,
                l4: sni || f.hosts == HostLookup::Port,
                sni_fetch: sni.then_some("req.ssl_sni"),
                hello: sni,
                terminate,
            });
            frontends.extend(decrypted);
        }
    }
    Ok((frontends, passthrough))
}

/// A bind port whose TLS listeners terminate TLS, as the template writes it.
fn terminate_view(t: &crate::model::TlsTermination) -> Result<TerminateView, RenderError> {
    let socket = config_arg(&format!("abns@haptic-tls-{}", t.port))?;
    let certs: Vec<String> =
        t.certs.iter().map(|p| config_arg(p).map(|p| format!("crt {p}"))).collect::<Result<_, _>>()?;
    Ok(TerminateView { port: t.port, socket, certs: certs.join(" ") })
}

/// One backend's section.
/// The view of server `s` of backend `b`.
fn server_view(b: &crate::model::Backend, s: &crate::model::Server) -> ServerView {
    let addr = match s.endpoint {
        // A parsed address and port, written by Rust, never object text: unquoted, so the
        // runtime claim reads it as the IP literal `set server … addr` takes.
        Some(a) => a.to_string(),
        // A parked slot: an address nothing listens on, never used while disabled.
        None => "127.0.0.1:1".to_string(),
    };
    let mut server = ServerView {
        name: s.name.clone(),
        addr,
        disabled: s.endpoint.is_none(),
        draining: s.draining,
        cookie: b.options.affinity.as_ref().map(|_| s.name.clone()),
        weight: s.weight.filter(|_| !s.draining && s.endpoint.is_some()),
        backup: s.backup,
        words: String::new(),
    };
    server.words = server_words(&server);
    server
}

/// What the built-in template writes of server `s` of backend `b` after its name and a space:
/// its address, then its words.
pub(crate) fn server_text(b: &crate::model::Backend, s: &crate::model::Server) -> String {
    let v = server_view(b, s);
    v.addr + &v.words
}

fn backend_view(model: &Model, b: &crate::model::Backend) -> Result<BackendView, RenderError> {
    let servers = b.servers.iter().map(|s| server_view(b, s)).collect();
    if !is_section_name(&b.name) {
        return Err(RenderError::Template(format!("{:?} is not a backend name", b.name)));
    }
    let o = &b.options;
    let timeouts = [("connect", o.connect_timeout), ("server", o.server_timeout)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| format!("timeout {k} {v}s")))
        .collect();
    let server_params = server_params(o)?;
    let retry = o.retry.as_ref().map(retry_lines).transpose()?.unwrap_or_default();
    // A policy's timeout applies where its rules' requests go (`set-timeout` is a backend
    // action).
    let mut lines = Vec::new();
    for p in &model.policies {
        let Some(ms) = p.policy.timeout_ms else { continue };
        if model.rules.iter().any(|r| r.policy.as_ref() == Some(&p.id) && r.backend == b.name) {
            lines.push(format!(
                "http-request set-timeout server {ms}ms if {{ var({}) -m str {} }}",
                Var::Policy,
                our_id(&p.id)?
            ));
        }
    }
    Ok(BackendView {
        name: b.name.clone(),
        servers,
        timeouts,
        server_params,
        snippet: o.snippet.clone(),
        cookie: o.affinity.as_ref().map(cookie_line).transpose()?,
        tcp: o.passthrough,
        lines,
        retry,
    })
}

/// A backend's `retry-on` and `retries` lines: connection failures, empty answers and the
/// statuses asked (each one `retry-on` knows, Rust integers).
fn retry_lines(r: &crate::model::Retry) -> Result<Vec<String>, RenderError> {
    let mut on = vec!["conn-failure".to_string(), "empty-response".to_string()];
    for &c in &r.codes {
        if !crate::model::RETRY_CODES.contains(&c) {
            return Err(RenderError::Template(format!("retry-on cannot retry on {c}")));
        }
        on.push(c.to_string());
    }
    Ok(vec![format!("retry-on {}", on.join(" ")), format!("retries {}", r.attempts)])
}

/// One piece of a log-format string: literal text (escaped) or a sample expression of ours.
enum Piece {
    Lit(String),
    Expr(String),
}

/// The pieces as one config word: literals quoted through `log_format_arg`, touching the
/// expressions (quoted and unquoted parts that touch form one word).
fn fmt_word(pieces: &[Piece]) -> Result<String, RenderError> {
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Lit(s) if s.is_empty() => {}
            Piece::Lit(s) => out.push_str(&log_format_arg(s)?),
            Piece::Expr(e) => out.push_str(e),
        }
    }
    if out.is_empty() {
        return Err(RenderError::Template("an empty log-format word".into()));
    }
    Ok(out)
}

/// A path after a rewrite, as alternatives `(pieces, condition)` that together cover every
/// request of the rule. A regex rewrite has no such form (it is a `replace-path` line).
fn rewritten_path(p: &PathRewrite) -> Result<Vec<(Vec<Piece>, String)>, RenderError> {
    Ok(match p {
        PathRewrite::Regex { .. } => {
            return Err(RenderError::Template("a redirect's path cannot be a regex rewrite".into()))
        }
        PathRewrite::Full(f) => vec![(vec![Piece::Lit(f.clone())], String::new())],
        PathRewrite::Prefix { matched, with } => {
            let trimmed = with.trim_end_matches('/').to_string();
            let exact = if trimmed.is_empty() { "/".to_string() } else { trimmed.clone() };
            let path = Var::Path;
            vec![
                (vec![Piece::Lit(exact)], format!(" {{ var({path}) -m len {matched} }}")),
                (
                    vec![Piece::Lit(trimmed), Piece::Expr(format!("%[var({path}),bytes({matched})]"))],
                    format!(" !{{ var({path}) -m len {matched} }}"),
                ),
            ]
        }
    })
}

/// The lines rewriting the path of the requests matching `when`: a regex rewrite's
/// `replace-path`, the others' `set-path` per case.
fn path_rewrite_lines(p: &PathRewrite, when: &str) -> Result<Vec<String>, RenderError> {
    if let PathRewrite::Regex { pattern, with } = p {
        return Ok(vec![format!(
            "http-request replace-path {} {} if {when}",
            config_arg(pattern)?,
            log_format_arg(with)?
        )]);
    }
    let mut out = Vec::new();
    for (pieces, c) in rewritten_path(p)? {
        out.push(format!("http-request set-path {} if {when}{c}", fmt_word(&pieces)?));
    }
    Ok(out)
}

/// The lines of header operations `ops` of `phase` (`http-request`, `http-response`) for the
/// messages matching `when`, in the order set, add, remove.
fn header_lines(phase: &str, ops: &HeaderOps, when: &str) -> Result<Vec<String>, RenderError> {
    let mut out = Vec::new();
    for (n, v) in &ops.set {
        out.push(format!("{phase} set-header {} {} if {when}", config_arg(n)?, log_format_arg(v)?));
    }
    for (n, v) in &ops.add {
        out.push(format!("{phase} add-header {} {} if {when}", config_arg(n)?, log_format_arg(v)?));
    }
    for n in &ops.remove {
        out.push(format!("{phase} del-header {} if {when}", config_arg(n)?));
    }
    Ok(out)
}

/// The matches as config rules in order, and the draws of split rules.
fn match_and_split_lines(g: &Model) -> Result<(Vec<String>, Vec<String>), RenderError> {
    let mut match_lines = Vec::new();
    for m in &g.matches {
        match_lines.push(match_line(m)?);
    }
    let mut split_lines = Vec::new();
    let (rule, pick) = (Var::Rule, Var::Pick);
    for sp in &g.splits {
        let when = format!("{{ var({rule}) -m str {} }}", config_arg(&sp.rule)?);
        split_lines.push(format!("http-request set-var({pick}) rand({}) if {when}", sp.total.max(1)));
        for (sub, upto) in &sp.picks {
            split_lines.push(format!(
                "http-request set-var({rule}) str({}) if {when} {{ var({pick}) -m int lt {upto} }}",
                config_arg(sub)?
            ));
        }
    }
    Ok((match_lines, split_lines))
}

/// The condition line of one Gateway match: it names its rule when the request matches.
fn match_line(m: &crate::model::MatchRule) -> Result<String, RenderError> {
    let (rule, host, path) = (Var::Rule, Var::HostId, Var::Path);
    let mut c = format!("!{{ var({rule}) -m found }} {{ var({host}) -m str {} }}", config_arg(&m.host)?);
    match &m.path {
        None => {}
        Some((PathKind::Exact, p)) => c.push_str(&format!(" {{ var({path}) -m str -- {} }}", config_arg(p)?)),
        Some((PathKind::Prefix, p)) => {
            let re = format!("^{}(/|$)", regex_literal(p)?);
            c.push_str(&format!(" {{ var({path}) -m reg -- {} }}", config_arg(&re)?));
        }
        // A regex the translator checked (`haptic_haproxy::regex::check`), anchored at the start.
        Some((PathKind::Regex, p)) => {
            c.push_str(&format!(" {{ var({path}) -m reg -- {} }}", config_arg(&format!("^(?:{p})"))?));
        }
    }
    if let Some(method) = &m.method {
        c.push_str(&format!(" {{ method -- {} }}", config_arg(method)?));
    }
    for (n, v) in &m.headers {
        c.push_str(&format!(" {{ req.fhdr({n}) -m str -- {} }}", config_arg(v)?));
    }
    for (n, v) in &m.query {
        c.push_str(&format!(" {{ urlp({n}) -m str -- {} }}", config_arg(v)?));
    }
    Ok(format!("http-request set-var({rule}) str({}) if {c}", config_arg(&m.rule)?))
}

/// The lines of a Gateway redirect for requests matching `when`: one per port and path case.
fn redirect_lines(r: &Redirect, when: &str) -> Result<Vec<String>, RenderError> {
    let (scheme, hostname, port, path, code) = match r {
        Redirect::Location { location, code } => {
            return Ok(vec![format!(
                "http-request redirect location {} code {code} if {when}",
                log_format_arg(location)?
            )])
        }
        Redirect::Rewrite { scheme, hostname, port, path, code } => (scheme, hostname, *port, path, *code),
    };
    let mut out = Vec::new();
    let scheme_piece = match scheme {
        Some(s) => Piece::Lit(format!("{s}://")),
        None => Piece::Expr("%[ssl_fc,iif(https,http)]://".into()),
    };
    let host = match hostname {
        Some(h) => Piece::Lit(h.clone()),
        None => Piece::Expr(format!("%[var({})]", Var::Host)),
    };
    // (port piece, condition), the unconditional one last.
    let ports: Vec<(Option<Piece>, String)> = match (port, scheme.as_deref()) {
        (Some(p), Some(s)) => {
            let default = (s == "http" && p == 80) || (s == "https" && p == 443);
            vec![(if default { None } else { Some(Piece::Lit(format!(":{p}"))) }, String::new())]
        }
        (Some(p), None) => {
            let with = (Some(Piece::Lit(format!(":{p}"))), String::new());
            match p {
                80 => vec![(None, " !{ ssl_fc }".into()), with],
                443 => vec![(None, " { ssl_fc }".into()), with],
                _ => vec![with],
            }
        }
        (None, Some(_)) => vec![(None, String::new())],
        (None, None) => {
            let lport = Var::ListenerPort;
            vec![
                (None, format!(" !{{ ssl_fc }} {{ var({lport}) -m int 80 }}")),
                (None, format!(" {{ ssl_fc }} {{ var({lport}) -m int 443 }}")),
                (Some(Piece::Expr(format!(":%[var({lport})]"))), String::new()),
            ]
        }
    };
    let paths = match path {
        None => vec![(vec![Piece::Expr("%[pathq]".into())], String::new())],
        Some(p) => rewritten_path(p)?,
    };
    for (port, pc) in &ports {
        for (path, qc) in &paths {
            let mut pieces = vec![clone_piece(&scheme_piece), clone_piece(&host)];
            pieces.extend(port.iter().map(clone_piece));
            pieces.extend(path.iter().map(clone_piece));
            out.push(format!("http-request redirect location {} code {} if {when}{pc}{qc}", fmt_word(&pieces)?, code));
        }
    }
    Ok(out)
}

fn clone_piece(p: &Piece) -> Piece {
    match p {
        Piece::Lit(s) => Piece::Lit(s.clone()),
        Piece::Expr(s) => Piece::Expr(s.clone()),
    }
}

/// The backend's `cookie` line for `a`: the cookie is inserted (never sent on to the server),
/// not cached, `HttpOnly`, with the `Max-Age` and `Path` asked for.
pub(crate) fn cookie_line(a: &crate::model::Affinity) -> Result<String, RenderError> {
    let mut l = format!("cookie {} insert indirect nocache httponly", config_arg(&a.name)?);
    if let Some(n) = a.max_age {
        l.push_str(&format!(" attr {}", config_arg(&format!("Max-Age={n}"))?));
    }
    if let Some(p) = &a.path {
        l.push_str(&format!(" attr {}", config_arg(&format!("Path={p}"))?));
    }
    if let Some(s) = a.same_site {
        l.push_str(&format!(" attr {}", config_arg(&format!("SameSite={s}"))?));
    }
    if a.secure {
        l.push_str(" secure");
    }
    Ok(l)
}

/// The words after a server's address for a backend's options (each starting with a blank):
/// the protocol's, and TLS towards the server: not verified, unless `proxy-ssl-verify` asks,
/// against the Secret's CA, for the name asked (sent as SNI when asked), with a client
/// certificate when the Secret has one. Paths are ours; the name a checked DNS name; all quoted.
pub(crate) fn server_params(o: &crate::model::BackendOptions) -> Result<String, RenderError> {
    let tls = matches!(o.protocol, Protocol::Https | Protocol::H2s);
    let mut out = String::new();
    if o.protocol == Protocol::H2c {
        out.push_str(" proto h2");
    }
    if tls {
        out.push_str(" ssl");
        match o.upstream_tls.as_ref() {
            Some(t) if t.verify => {
                let ca = t
                    .ca_file
                    .as_deref()
                    .ok_or_else(|| RenderError::Template("proxy-ssl-verify without a CA".into()))?;
                out.push_str(&format!(" verify required ca-file {}", config_arg(ca)?));
                if let Some(n) = &t.name {
                    out.push_str(&format!(" verifyhost {}", config_arg(n)?));
                }
            }
            _ => out.push_str(" verify none"),
        }
        if let Some(t) = &o.upstream_tls {
            if let (true, Some(n)) = (t.sni, t.sni_name.as_ref().or(t.name.as_ref())) {
                out.push_str(&format!(" sni {}", config_arg(&format!("str({n})"))?));
            }
            if let Some(c) = &t.client_cert {
                out.push_str(&format!(" crt {}", config_arg(c)?));
            }
        }
    }
    if o.protocol == Protocol::H2s {
        out.push_str(" alpn h2");
    }
    Ok(out)
}

/// A policy's `http-request` rules, in the order they apply: source ranges, then the HTTPS
/// redirect, CORS preflights, authentication, the body size, `app-root`, the redirect, then the
/// request headers, the Host header and the path. Addresses and numbers are Rust's; object
/// text (redirect targets, header values, hosts, paths) is a quoted config or log-format word.
pub(crate) fn policy_lines_of(id: &str, p: &Policy) -> Result<Vec<String>, RenderError> {
    let id = our_id(id)?;
    let (when, cors) = (format!("{{ var({}) -m str {id} }}", Var::Policy), Var::Cors);
    let list = |c: &[crate::model::Cidr]| c.iter().map(ToString::to_string).collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    if let Some(allow) = &p.allow {
        out.push(format!("http-request deny deny_status 403 if {when} !{{ src {} }}", list(allow)));
    }
    if !p.deny.is_empty() {
        out.push(format!("http-request deny deny_status 403 if {when} {{ src {} }}", list(&p.deny)));
    }
    if let Some(l) = &p.limit {
        let t = table_of(&id);
        // Exempt sources are neither tracked nor refused.
        let when = if l.exempt.is_empty() { when.clone() } else { format!("{when} !{{ src {} }}", list(&l.exempt)) };
        out.push(format!("http-request track-sc1 src table {t} if {when}"));
        if let Some(rps) = l.rps {
            let n = u64::from(rps) * u64::from(l.window);
            out.push(format!("http-request deny deny_status 503 if {when} {{ sc_http_req_rate(1,{t}) gt {n} }}"));
        }
        if let Some(c) = l.connections {
            out.push(format!("http-request deny deny_status 503 if {when} {{ sc_conn_cur(1,{t}) gt {c} }}"));
        }
        if let Some(rpm) = l.rpm {
            let m = minute_table_of(&id);
            out.push(format!("http-request track-sc2 src table {m} if {when}"));
            out.push(format!("http-request deny deny_status 503 if {when} {{ sc_http_req_rate(2,{m}) gt {rpm} }}"));
        }
    }
    if p.https_redirect {
        out.push(format!("http-request redirect scheme https code 308 if {when} !{{ ssl_fc }}"));
    }
    if let Some(c) = &p.cors {
        for o in &c.origins {
            let matches = match o {
                crate::model::Origin::Any => "{ req.hdr(origin) -m found }".to_string(),
                crate::model::Origin::Exact(e) => format!("{{ req.hdr(origin) -m str -- {} }}", config_arg(e)?),
                crate::model::Origin::Pattern(r) => format!("{{ req.hdr(origin) -m reg -- {} }}", config_arg(r)?),
            };
            out.push(format!("http-request set-var({cors}) str(1) if {when} {matches}"));
        }
        out.push(format!("http-request set-var({}) req.hdr(origin) if {when} {{ var({cors}) -m found }}", Var::Origin));
        let mut hdrs = cors_headers(c, true)?;
        hdrs.push(("access-control-max-age", config_arg(&c.max_age.to_string())?));
        let hdrs: Vec<String> = hdrs.iter().map(|(k, v)| format!("hdr {k} {v}")).collect();
        out.push(format!(
            "http-request return status 204 content-type text/plain {} if {when} {{ var({cors}) -m found }} METH_OPTIONS",
            hdrs.join(" ")
        ));
        if c.reflect {
            // A preflight from an origin not allowed is answered too, without any CORS header.
            out.push(format!(
                "http-request return status 204 if {when} METH_OPTIONS {{ req.hdr(origin) -m found }} \
                 {{ req.hdr(access-control-request-method) -m found }}"
            ));
        }
    }
    if let Some(a) = &p.auth {
        if !is_section_name(&a.userlist) {
            return Err(RenderError::Template(format!("{:?} is not a userlist name", a.userlist)));
        }
        out.push(format!(
            "http-request auth realm {} if {when} !{{ http_auth({}) }}",
            config_arg(&a.realm)?,
            a.userlist
        ));
    }
    if let Some(n) = p.max_body {
        out.push(format!("http-request deny deny_status 413 if {when} {{ req.hdr_val(content-length) gt {n} }}"));
    }
    if let Some(root) = &p.app_root {
        out.push(format!("http-request redirect location {} code 302 if {when} {{ path / }}", log_format_arg(root)?));
    }
    if let Some(r) = &p.redirect {
        out.extend(redirect_lines(r, &when)?);
    }
    out.extend(header_lines("http-request", &p.request_headers, &when)?);
    if let Some(h) = &p.host_rewrite {
        out.push(format!("http-request set-header host {} if {when}", log_format_arg(h)?));
    }
    if let Some(r) = &p.path_rewrite {
        out.extend(path_rewrite_lines(r, &when)?);
    }
    for m in &p.mirrors {
        out.extend(crate::mirror::line(m, &when)?);
    }
    Ok(out)
}

/// A policy's `http-response` rules: the CORS headers for an allowed origin, the response
/// header operations, then the error
/// pages: a backend response with a listed status is replaced by HAProxy's own response with
/// that status (`return` ends the `http-response` rules). `default-errorfiles` takes the proxy's
/// `errorfile` for it, else HAProxy's built-in page; HAProxy refuses `default-errorfiles` for a
/// status without a built-in page ([`ERROR_PAGES`]), which is then answered with an empty
/// body. The statuses are Rust integers.
pub(crate) fn response_lines_of(id: &str, p: &Policy) -> Result<Vec<String>, RenderError> {
    let (when, cors) = (format!("{{ var({}) -m str {} }}", Var::Policy, our_id(id)?), Var::Cors);
    let mut out = Vec::new();
    if let Some(c) = &p.cors {
        let mut hdrs = cors_headers(c, false)?;
        if let Some(e) = &c.expose {
            hdrs.push(("access-control-expose-headers", log_format_arg(e)?));
        }
        for (k, v) in hdrs {
            out.push(format!("http-response set-header {k} {v} if {when} {{ var({cors}) -m found }}"));
        }
    }
    out.extend(header_lines("http-response", &p.response_headers, &when)?);
    for &code in &p.error_pages {
        if !(400..=599).contains(&code) {
            return Err(RenderError::Template(format!("{code} is not an error status")));
        }
        let page = if ERROR_PAGES.contains(&code) { " default-errorfiles" } else { "" };
        out.push(format!("http-response return status {code}{page} if {when} {{ status {code} }}"));
    }
    Ok(out)
}

/// The CORS headers of a `preflight` answer or of a response, values as quoted log-format
/// words: the origin (`*`, or the request's own once it matched), methods, headers,
/// credentials, and (a preflight, reflecting, [`crate::model::Cors::reflect`]) the exposed
/// headers, which a response gets from [`response_lines_of`]. Reflecting, `*` methods or headers are
/// what the preflight asked for (`req.fhdr`: the whole header, commas and all), and responses
/// carry neither.
fn cors_headers(c: &crate::model::Cors, preflight: bool) -> Result<Vec<(&'static str, String)>, RenderError> {
    let origin = if c.origins.contains(&crate::model::Origin::Any) && !c.reflect {
        "'*'".to_string()
    } else {
        format!("'%[var({})]'", Var::Origin)
    };
    let mut out = vec![("access-control-allow-origin", origin)];
    for (name, list, asked) in [
        ("access-control-allow-methods", &c.methods, "access-control-request-method"),
        ("access-control-allow-headers", &c.headers, "access-control-request-headers"),
    ] {
        match (c.reflect, preflight, list.as_str()) {
            (false, _, _) => out.push((name, log_format_arg(list)?)),
            (true, false, _) | (true, true, "") => {}
            (true, true, "*") => out.push((name, format!("'%[req.fhdr({asked})]'"))),
            (true, true, _) => out.push((name, log_format_arg(list)?)),
        }
    }
    if let Some(e) = c.expose.as_ref().filter(|_| c.reflect && preflight) {
        out.push(("access-control-expose-headers", log_format_arg(e)?));
    }
    if c.credentials {
        out.push(("access-control-allow-credentials", "'true'".to_string()));
    }
    Ok(out)
}

/// The stick table of policy `id`'s limits.
pub(crate) fn table_of(id: &str) -> String {
    format!("haptic_limit_{id}")
}

/// The stick table of policy `id`'s requests per minute (`limit-rpm`).
pub(crate) fn minute_table_of(id: &str) -> String {
    format!("haptic_limit_{id}_rpm")
}

/// The `stick-table` line of a [`minute_table_of`] table: client addresses and their request
/// rate over 60 seconds.
pub(crate) const MINUTE_TABLE: &str = "stick-table type ipv6 size 100k expire 60s store http_req_rate(60s)";

/// The `stick-table` line for `l`: client addresses (IPv4 as mapped IPv6), their request rate
/// over the window and their concurrent requests.
pub(crate) fn table_line(l: &crate::model::Limit) -> String {
    format!("stick-table type ipv6 size 100k expire {}s store http_req_rate({}s),conn_cur", l.window.max(60), l.window)
}

/// The lines by which a canary selector `s` (id `id`) sends a request to the rule's canary
/// backend ([`MapFile::CanaryBackends`]) or main backend ([`MapFile::MainBackends`]) outright:
/// the cookie first, then the header, so the header decides when both are present. Names are
/// checked (`[A-Za-z0-9_.-]`) and quoted; a value follows `--` (never read as a flag).
fn canary_lines_of(id: &str, s: &crate::model::CanarySelector) -> Result<Vec<String>, RenderError> {
    let id = our_id(id)?;
    let when = format!("{{ var({}) -m str {id} }}", Var::Canary);
    let to = |m: MapFile| format!("http-request set-var({}) var({}),map_str({m})", Var::Backend, Var::Rule);
    let mut out = Vec::new();
    let mut by = |fetch: String, always: String, never: Option<String>| {
        out.push(format!("{} if {when} {{ {fetch} -m str -- {always} }}", to(MapFile::CanaryBackends)));
        if let Some(never) = never {
            out.push(format!("{} if {when} {{ {fetch} -m str -- {never} }}", to(MapFile::MainBackends)));
        }
    };
    if let Some(c) = &s.cookie {
        by(config_arg(&format!("req.cook({c})"))?, "always".into(), Some("never".into()));
    }
    if let Some(h) = &s.header {
        let fetch = config_arg(&format!("req.hdr({h})"))?;
        match (&s.header_value, &s.header_pattern) {
            (Some(v), _) => by(fetch, config_arg(v)?, None),
            (None, Some(p)) => out.push(format!(
                "{} if {when} {{ {fetch} -m reg -- {} }}",
                to(MapFile::CanaryBackends),
                config_arg(p)?
            )),
            (None, None) => by(fetch, "always".into(), Some("never".into())),
        }
    }
    Ok(out)
}

/// One of our ids (a policy's or a rewrite's): written as it is when alphanumeric, so the lines read
/// plainly; quoted otherwise.
pub(crate) fn our_id(id: &str) -> Result<String, RenderError> {
    Ok(if !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric()) { id.to_string() } else { config_arg(id)? })
}

struct Capped {
    buf: Vec<u8>,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > MAX_OUTPUT {
            return Err(std::io::Error::other(format!("output over {MAX_OUTPUT} bytes")));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Renders `haproxy.cfg`.
pub fn render_cfg(model: &Model, t: &Templates) -> Result<String, RenderError> {
    render_view(&view(model, &t.snippets)?, t)
}

/// [`render_cfg`] with `hole` in place of every server's address and no words after it; `None`
/// for a template of the admin's (only the built-in one is known to write a server's fields
/// but its name only through [`server_text`]).
pub(crate) fn render_with_holes(model: &Model, t: &Templates, hole: &str) -> Result<Option<String>, RenderError> {
    if t.main.is_some() {
        return Ok(None);
    }
    let mut ctx = view(model, &t.snippets)?;
    for s in ctx.backends.iter_mut().flat_map(|b| b.servers.iter_mut()) {
        s.addr = hole.to_string();
        s.words.clear();
    }
    render_view(&ctx, t).map(Some)
}

fn render_view(ctx: &View<'_>, t: &Templates) -> Result<String, RenderError> {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(FUEL));
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
        .map_err(|e| RenderError::Template(format!("{e:#}")))?;
    env.set_syntax(syntax);
    let src = t.main.as_deref().unwrap_or(BUILTIN);
    env.add_template("haproxy.cfg", src).map_err(|e| RenderError::Template(format!("{e:#}")))?;
    let tmpl = env.get_template("haproxy.cfg").map_err(|e| RenderError::Template(format!("{e:#}")))?;
    let mut out = Capped { buf: Vec::new() };
    tmpl.render_captured_to(minijinja::Value::from(minijinja::value::Serde(ctx)), &mut out)
        .map_err(|e| RenderError::Template(format!("{e:#}")))?;
    String::from_utf8(out.buf).map_err(|e| RenderError::Template(e.to_string()))
}

/// The snippets by section name, for callers that read them from a map.
pub fn snippets_from(map: &BTreeMap<String, String>) -> Snippets {
    let get = |k: &str| map.get(k).cloned().unwrap_or_default();
    Snippets { global: get("global"), defaults: get("defaults"), frontend: get("frontend"), backend: get("backend") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every key of the maps in `v`, at any depth.
    fn keys(v: &serde_json::Value, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    out.insert(k.clone());
                    keys(x, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| keys(x, out)),
            _ => {}
        }
    }

    /// A replacement template's author finds every key of the view in `docs/template.md`: the
    /// views of Ingress fixtures with every part (passthrough, canaries, policies, affinity) and
    /// of a Gateway fixture with HTTPS listeners, matches and splits.
    #[test]
    fn every_key_of_the_view_is_documented() {
        let doc = include_str!("../../docs/template.md");
        let ingress = |y: &str| crate::translate_ingress(&crate::ingress::fixture::input(y)).0;
        let mut models: Vec<Model> = [
            include_str!("../tests/fixtures/annotations.yaml"),
            include_str!("../tests/fixtures/canary.yaml"),
            include_str!("../tests/fixtures/nginx.yaml"),
            include_str!("../tests/fixtures/tenants.yaml"),
        ]
        .into_iter()
        .map(ingress)
        .collect();
        let gateway = crate::gateway::fixture::input(include_str!("../tests/fixtures/gateway.yaml"));
        models.push(crate::gateway::translate_gateway(&gateway).model);
        let mut seen = BTreeSet::new();
        for m in &models {
            let v = serde_json::to_value(view(m, &Snippets::default()).unwrap()).unwrap();
            keys(&v, &mut seen);
        }
        for k in ["terminate", "backup", "misdirected", "split_lines", "paths_regex", "rule"] {
            assert!(seen.contains(k), "the fixtures no longer reach {k}: {seen:?}");
        }
        let missing: Vec<&String> = seen.iter().filter(|k| !doc.contains(&format!("`{k}`"))).collect();
        assert!(missing.is_empty(), "keys of the view docs/template.md does not name: {missing:?}");
    }
}
