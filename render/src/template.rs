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

use crate::model::{GatewayRouting, Model, PathKind, PathRewrite, Policy, Protocol, ERROR_500, NOT_FOUND, UNAVAILABLE};
use crate::RenderError;

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
    frontends: Vec<FrontendView>,
    /// The `http-request` lines of every policy, each ending with its condition.
    policy_lines: Vec<String>,
    backends: Vec<BackendView>,
    not_found: &'static str,
    unavailable: &'static str,
    error_500: &'static str,
    snippets: &'a Snippets,
    /// Gateway API routing lines (absent for Ingress renders).
    gateway: Option<GatewayView>,
}

#[derive(Serialize)]
struct GatewayView {
    /// `http-request set-var(txn.rule) …` lines of the matches that need more than a path.
    match_lines: Vec<String>,
    /// Whether HTTPS listeners are told apart by SNI and Host (421 when they differ).
    misdirected: bool,
    /// `http-request …` lines drawing a split rule's sub-rule.
    split_lines: Vec<String>,
    /// `http-request …` lines of the filters, by rule.
    request_lines: Vec<String>,
    /// `http-response …` lines of the filters, by rule.
    response_lines: Vec<String>,
}

#[derive(Serialize)]
struct FrontendView {
    name: String,
    binds: Vec<String>,
    /// Routed by Gateway API rules (host keys by bind port).
    gateway: bool,
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
    /// `http-request` lines for the rules sending here (Gateway API timeouts).
    lines: Vec<String>,
}

#[derive(Serialize)]
struct ServerView {
    name: String,
    addr: String,
    disabled: bool,
    draining: bool,
    /// ` weight <n>` or empty.
    weight: String,
}

fn view<'a>(model: &Model, snippets: &'a Snippets) -> Result<View<'a>, RenderError> {
    let certs: Vec<String> =
        model.certs.iter().map(|c| config_arg(&c.path).map(|p| format!("crt {p}"))).collect::<Result<_, _>>()?;
    let mut frontends = Vec::new();
    for f in &model.frontends {
        let mut binds = Vec::new();
        for b in &f.binds {
            let mut s = config_arg(&std::net::SocketAddr::new(b.address, b.port).to_string())?;
            if b.tls {
                s.push_str(" ssl ");
                if b.certs.is_empty() {
                    s.push_str(&certs.join(" "));
                } else {
                    let own: Vec<String> =
                        b.certs.iter().map(|p| config_arg(p).map(|p| format!("crt {p}"))).collect::<Result<_, _>>()?;
                    s.push_str(&own.join(" "));
                    // Gateway API listeners speak HTTP/2 to clients that offer it.
                    s.push_str(" alpn h2,http/1.1");
                }
            }
            binds.push(s);
        }
        frontends.push(FrontendView { name: f.name.clone(), binds, gateway: model.gateway.is_some() });
    }
    let mut backends = Vec::new();
    for b in &model.backends {
        let mut servers = Vec::new();
        for s in &b.servers {
            let addr = match s.endpoint {
                // A parsed address and port, written by Rust, never object text: unquoted, so the
                // runtime claim reads it as the IP literal `set server … addr` takes.
                Some(a) => a.to_string(),
                // A parked slot: an address nothing listens on, never used while disabled.
                None => "127.0.0.1:1".to_string(),
            };
            servers.push(ServerView {
                name: s.name.clone(),
                addr,
                disabled: s.endpoint.is_none(),
                draining: s.draining,
                weight: match (s.draining, s.weight) {
                    (false, Some(w)) => format!(" weight {w}"),
                    _ => String::new(),
                },
            });
        }
        if !is_section_name(&b.name) {
            return Err(RenderError::Template(format!("{:?} is not a backend name", b.name)));
        }
        let o = &b.options;
        let timeouts = [("connect", o.connect_timeout), ("server", o.server_timeout)]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("timeout {k} {v}s")))
            .collect();
        let server_params = server_params(o.protocol).unwrap_or_default().to_string();
        // A rule's timeout applies where its requests go (`set-timeout` is a backend action).
        let mut lines = Vec::new();
        for a in model.gateway.iter().flat_map(|g| g.actions.iter()) {
            let Some(ms) = a.timeout_ms else { continue };
            if model.rules.iter().any(|r| r.id == a.rule && r.backend == b.name) {
                lines.push(format!(
                    "http-request set-timeout server {ms}ms if {{ var(txn.rule) -m str {} }}",
                    config_arg(&a.rule)?
                ));
            }
        }
        backends.push(BackendView {
            name: b.name.clone(),
            servers,
            timeouts,
            server_params,
            snippet: o.snippet.clone(),
            lines,
        });
    }
    let mut policy_lines = Vec::new();
    for p in &model.policies {
        policy_lines.extend(policy_lines_of(&p.id, &p.policy)?);
    }
    let health = model.health.map(|a| config_arg(&a.to_string())).transpose()?;
    let gateway = model.gateway.as_ref().map(gateway_view).transpose()?;
    Ok(View {
        health,
        frontends,
        policy_lines,
        backends,
        not_found: NOT_FOUND,
        unavailable: UNAVAILABLE,
        error_500: ERROR_500,
        snippets,
        gateway,
    })
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
/// request of the rule.
fn rewritten_path(p: &PathRewrite) -> Vec<(Vec<Piece>, String)> {
    match p {
        PathRewrite::Full(f) => vec![(vec![Piece::Lit(f.clone())], String::new())],
        PathRewrite::Prefix { matched, with } => {
            let trimmed = with.trim_end_matches('/').to_string();
            let exact = if trimmed.is_empty() { "/".to_string() } else { trimmed.clone() };
            vec![
                (vec![Piece::Lit(exact)], format!(" {{ var(txn.path) -m len {matched} }}")),
                (
                    vec![Piece::Lit(trimmed), Piece::Expr(format!("%[var(txn.path),bytes({matched})]"))],
                    format!(" !{{ var(txn.path) -m len {matched} }}"),
                ),
            ]
        }
    }
}

/// The Gateway API lines: matches as config rules in order, then each rule's filters.
fn gateway_view(g: &GatewayRouting) -> Result<GatewayView, RenderError> {
    let mut match_lines = Vec::new();
    for m in &g.matches {
        let mut c = format!("!{{ var(txn.rule) -m found }} {{ var(txn.hostid) -m str {} }}", config_arg(&m.host)?);
        match &m.path {
            None => {}
            Some((PathKind::Exact, p)) => c.push_str(&format!(" {{ var(txn.path) -m str -- {} }}", config_arg(p)?)),
            Some((PathKind::Prefix, p)) => {
                let re = format!("^{}(/|$)", regex_literal(p)?);
                c.push_str(&format!(" {{ var(txn.path) -m reg -- {} }}", config_arg(&re)?));
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
        match_lines.push(format!("http-request set-var(txn.rule) str({}) if {c}", config_arg(&m.rule)?));
    }
    let mut split_lines = Vec::new();
    for sp in &g.splits {
        let when = format!("{{ var(txn.rule) -m str {} }}", config_arg(&sp.rule)?);
        split_lines.push(format!("http-request set-var(txn.pick) rand({}) if {when}", sp.total.max(1)));
        for (sub, upto) in &sp.picks {
            split_lines.push(format!(
                "http-request set-var(txn.rule) str({}) if {when} {{ var(txn.pick) -m int lt {upto} }}",
                config_arg(sub)?
            ));
        }
    }
    let mut request_lines = Vec::new();
    let mut response_lines = Vec::new();
    for a in &g.actions {
        let when = format!("{{ var(txn.rule) -m str {} }}", config_arg(&a.rule)?);
        if let Some(r) = &a.redirect {
            let scheme = match &r.scheme {
                Some(s) => Piece::Lit(format!("{s}://")),
                None => Piece::Expr("%[ssl_fc,iif(https,http)]://".into()),
            };
            let host = match &r.hostname {
                Some(h) => Piece::Lit(h.clone()),
                None => Piece::Expr("%[var(txn.host)]".into()),
            };
            // (port piece, condition), the unconditional one last.
            let ports: Vec<(Option<Piece>, String)> = match (r.port, r.scheme.as_deref()) {
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
                (None, None) => vec![
                    (None, " !{ ssl_fc } { var(txn.lport) -m int 80 }".into()),
                    (None, " { ssl_fc } { var(txn.lport) -m int 443 }".into()),
                    (Some(Piece::Expr(":%[var(txn.lport)]".into())), String::new()),
                ],
            };
            let paths = match &r.path {
                None => vec![(vec![Piece::Expr("%[pathq]".into())], String::new())],
                Some(p) => rewritten_path(p),
            };
            for (port, pc) in &ports {
                for (path, qc) in &paths {
                    let mut pieces = vec![clone_piece(&scheme), clone_piece(&host)];
                    pieces.extend(port.iter().map(clone_piece));
                    pieces.extend(path.iter().map(clone_piece));
                    request_lines.push(format!(
                        "http-request redirect location {} code {} if {when}{pc}{qc}",
                        fmt_word(&pieces)?,
                        r.code
                    ));
                }
            }
            continue;
        }
        for (n, v) in &a.request_headers.set {
            request_lines.push(format!("http-request set-header {} {} if {when}", config_arg(n)?, log_format_arg(v)?));
        }
        for (n, v) in &a.request_headers.add {
            request_lines.push(format!("http-request add-header {} {} if {when}", config_arg(n)?, log_format_arg(v)?));
        }
        for n in &a.request_headers.remove {
            request_lines.push(format!("http-request del-header {} if {when}", config_arg(n)?));
        }
        if let Some(h) = &a.host_rewrite {
            request_lines.push(format!("http-request set-header host {} if {when}", log_format_arg(h)?));
        }
        if let Some(p) = &a.path_rewrite {
            for (pieces, c) in rewritten_path(p) {
                request_lines.push(format!("http-request set-path {} if {when}{c}", fmt_word(&pieces)?));
            }
        }
        for (n, v) in &a.response_headers.set {
            response_lines.push(format!(
                "http-response set-header {} {} if {when}",
                config_arg(n)?,
                log_format_arg(v)?
            ));
        }
        for (n, v) in &a.response_headers.add {
            response_lines.push(format!(
                "http-response add-header {} {} if {when}",
                config_arg(n)?,
                log_format_arg(v)?
            ));
        }
        for n in &a.response_headers.remove {
            response_lines.push(format!("http-response del-header {} if {when}", config_arg(n)?));
        }
    }
    Ok(GatewayView {
        match_lines,
        misdirected: !g.tls_listeners.is_empty(),
        split_lines,
        request_lines,
        response_lines,
    })
}

fn clone_piece(p: &Piece) -> Piece {
    match p {
        Piece::Lit(s) => Piece::Lit(s.clone()),
        Piece::Expr(s) => Piece::Expr(s.clone()),
    }
}

/// The config lines an Ingress's annotations add, as the built-in template writes them: the
/// frontend's `http-request` rules for its routes (under the policy id `id`), then each
/// backend directive and server parameter (for `haptic-controller migrate`).
pub fn annotation_lines(id: &str, m: &crate::annotations::Meaning) -> Result<Vec<String>, RenderError> {
    let mut out = policy_lines_of(id, &m.policy)?;
    let o = &m.backend;
    out.extend(o.connect_timeout.map(|s| format!("timeout connect {s}s (backend)")));
    out.extend(o.server_timeout.map(|s| format!("timeout server {s}s (backend)")));
    out.extend(server_params(o.protocol).map(|p| format!("server …{p} (every server of the backend)")));
    out.extend(o.snippet.iter().flat_map(|s| s.lines().map(|l| format!("{} (backend)", l.trim()))));
    Ok(out)
}

/// The words after a server's address for `protocol`, if any.
fn server_params(protocol: Protocol) -> Option<&'static str> {
    match protocol {
        Protocol::Http => None,
        Protocol::Https => Some(" ssl verify none"),
        Protocol::H2c => Some(" proto h2"),
        Protocol::H2s => Some(" ssl verify none alpn h2"),
    }
}

/// A policy's `http-request` rules, in the order they apply: source ranges, then the HTTPS
/// redirect, the body size, `app-root`, the redirect. Addresses and numbers are Rust's; the one
/// object text, a redirect target, is a quoted log-format word.
fn policy_lines_of(id: &str, p: &Policy) -> Result<Vec<String>, RenderError> {
    // Policy ids are ours (`p<n>`): written as they are, so the lines read plainly.
    let id = if id.bytes().all(|b| b.is_ascii_alphanumeric()) { id.to_string() } else { config_arg(id)? };
    let when = format!("{{ var(txn.policy) -m str {id} }}");
    let list = |c: &[crate::model::Cidr]| c.iter().map(ToString::to_string).collect::<Vec<_>>().join(" ");
    let mut out = Vec::new();
    if let Some(allow) = &p.allow {
        out.push(format!("http-request deny deny_status 403 if {when} !{{ src {} }}", list(allow)));
    }
    if !p.deny.is_empty() {
        out.push(format!("http-request deny deny_status 403 if {when} {{ src {} }}", list(&p.deny)));
    }
    if p.https_redirect {
        out.push(format!("http-request redirect scheme https code 308 if {when} !{{ ssl_fc }}"));
    }
    if let Some(n) = p.max_body {
        out.push(format!("http-request deny deny_status 413 if {when} {{ req.hdr_val(content-length) gt {n} }}"));
    }
    if let Some(root) = &p.app_root {
        out.push(format!("http-request redirect location {} code 302 if {when} {{ path / }}", log_format_arg(root)?));
    }
    if let Some(r) = &p.redirect {
        out.push(format!("http-request redirect location {} code {} if {when}", log_format_arg(&r.location)?, r.code));
    }
    Ok(out)
}

/// Whether `s` is written as a section name as is: `[a-z0-9._-]`, as Kubernetes names and
/// port names are (the runtime API names a backend by exactly the text after `backend`).
pub fn is_section_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 512
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
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
    let ctx = view(model, &t.snippets)?;
    let mut out = Capped { buf: Vec::new() };
    tmpl.render_captured_to(minijinja::Value::from(minijinja::value::Serde(&ctx)), &mut out)
        .map_err(|e| RenderError::Template(format!("{e:#}")))?;
    String::from_utf8(out.buf).map_err(|e| RenderError::Template(e.to_string()))
}

/// The snippets by section name, for callers that read them from a map.
pub fn snippets_from(map: &BTreeMap<String, String>) -> Snippets {
    let get = |k: &str| map.get(k).cloned().unwrap_or_default();
    Snippets { global: get("global"), defaults: get("defaults"), frontend: get("frontend"), backend: get("backend") }
}
