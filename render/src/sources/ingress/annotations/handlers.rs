//! The annotation table: every supported key (without prefix) with what it means here and the
//! small function that reads it.
//!
//! Owns the one list of keys ([`SUPPORTED`]): a key cannot be listed without its handler, nor
//! read without being listed. Each handler reads its key's value (and the values of the keys it
//! depends on) into the [`Meaning`] being built, or refuses it with the field and why; a key
//! that only qualifies another (`canary-weight`, `cors-*`, `session-cookie-*`) warns when what it
//! qualifies is not set. It must never read a key that is not its own or one it depends on, nor
//! hand on object text unchecked.

use std::collections::BTreeMap;

use haptic_haproxy::http::ERROR_PAGES;
use haptic_haproxy::names::is_section_name;

use super::values::{
    app_root, bool_of, cidrs, location, name_of, redirect_code, rewrite_target, seconds, size, statuses, token, tokens,
    vhost,
};
use super::{
    field, Affinity, Allowed, AuthRequest, Canary, CanarySelector, Cors, Limit, Meaning, Origin, Protocol, Redirect,
    UpstreamTls,
};
use crate::model::{Cause, Refusal};

/// One supported annotation.
#[derive(Debug)]
pub struct Annotation {
    /// The key, without prefix.
    pub key: &'static str,
    /// What it means here (for `haptic-controller migrate` and the docs).
    pub meaning: &'static str,
    /// Reads its value into the meaning being built.
    pub(super) read: Handler,
}

/// Reads one annotation (its full key and value) into a [`Reading`].
pub(super) type Handler = fn(&mut Reading<'_>, Entry<'_>);

/// One annotation as set: its full key and its value as written.
#[derive(Clone, Copy)]
pub(super) struct Entry<'a> {
    /// The key without prefix.
    pub short: &'a str,
    /// The full key (with the prefix that won).
    pub key: &'a str,
    /// The value as written.
    pub raw: &'a str,
}

impl<'a> Entry<'a> {
    /// The value without surrounding blanks.
    fn v(&self) -> &'a str {
        self.raw.trim()
    }
}

/// One Ingress's annotations being read: the keys set, the meaning so far, what is refused and
/// what is remarked.
pub(super) struct Reading<'a> {
    /// Key (unprefixed) → (full key, value); `haptic.dev/` wins over `nginx.ingress…/`.
    pub keys: BTreeMap<&'a str, (&'a str, &'a str)>,
    /// The Ingress has `spec.tls`.
    pub has_tls: bool,
    /// What the admin allows.
    pub allowed: Allowed,
    /// The meaning so far.
    pub m: Meaning,
    /// Values that do not parse or are not allowed.
    pub errors: Vec<Refusal>,
    /// Remarks.
    pub warnings: Vec<Refusal>,
}

impl<'a> Reading<'a> {
    /// Refuses the annotation `key` (full key): its value is not valid.
    pub fn bad(&mut self, key: &str, message: String) {
        self.errors.push(Refusal::new(Cause::Invalid, field(key), message));
    }

    /// Refuses the annotation `key` (full key): its value is not allowed here.
    pub fn forbid(&mut self, key: &str, message: String) {
        self.errors.push(Refusal::new(Cause::NotAllowed, field(key), message));
    }

    /// Remarks on the annotation `key` (full key), applied with a difference from ingress-nginx.
    pub fn warn(&mut self, key: &str, message: impl Into<String>) {
        self.warnings.push(Refusal::new(Cause::Differs, field(key), message));
    }

    /// Remarks that the annotation `key` (full key) has no effect, and why.
    pub fn ignore(&mut self, key: &str, message: impl Into<String>) {
        self.warnings.push(Refusal::new(Cause::Ignored, field(key), message));
    }

    /// Remarks that haptic does not support the annotation `key` (full key), which is ignored.
    pub fn unsupported(&mut self, key: &str, message: impl Into<String>) {
        self.warnings.push(Refusal::new(Cause::NotSupported, field(key), message));
    }

    /// The annotation `short` as set: its full key and trimmed value.
    fn get(&self, short: &str) -> Option<(&'a str, &'a str)> {
        self.keys.get(short).map(|(full, v)| (*full, v.trim()))
    }

    /// Whether the annotation `short` is set.
    fn has(&self, short: &str) -> bool {
        self.keys.contains_key(short)
    }

    /// Whether the annotation `short` is set to `want`.
    fn is(&self, short: &str, want: &str) -> bool {
        self.get(short).is_some_and(|(_, v)| v == want)
    }

    /// Sets what `parsed` holds, or refuses `key` with its error.
    fn take<T>(&mut self, key: &str, parsed: Result<T, String>, set: impl FnOnce(&mut Meaning, T)) {
        match parsed {
            Ok(t) => set(&mut self.m, t),
            Err(e) => self.bad(key, e),
        }
    }
}

/// The handler of `short`, if it is supported.
pub(super) fn handler(short: &str) -> Option<Handler> {
    SUPPORTED.iter().find(|a| a.key == short).map(|a| a.read)
}

/// The keys read (without prefix), each with what it means here and its handler.
pub const SUPPORTED: &[Annotation] = &[
    Annotation {
        key: "ssl-redirect",
        meaning: "`true` (also when absent, as ingress-nginx): plain-HTTP requests to this Ingress's routes are redirected to HTTPS (308) when it has `spec.tls`; `false`: served over plain HTTP",
        read: ssl_redirect,
    },
    Annotation {
        key: "force-ssl-redirect",
        meaning: "`true`: plain-HTTP requests are redirected to HTTPS (308), with or without `spec.tls`",
        read: force_ssl_redirect,
    },
    Annotation {
        key: "permanent-redirect",
        meaning: "every request is redirected to this URL (301, or `permanent-redirect-code`)",
        read: permanent_redirect,
    },
    Annotation { key: "permanent-redirect-code", meaning: "the code of `permanent-redirect`: 300–308", read: redirect_code_key },
    Annotation {
        key: "temporal-redirect",
        meaning: "every request is redirected to this URL (302, or `temporal-redirect-code`)",
        read: temporal_redirect,
    },
    Annotation { key: "temporal-redirect-code", meaning: "the code of `temporal-redirect`: 300–308", read: redirect_code_key },
    Annotation { key: "app-root", meaning: "a request for `/` is redirected (302) to this path", read: app_root_key },
    Annotation {
        key: "whitelist-source-range",
        meaning: "only these comma-separated CIDRs may connect; others get 403",
        read: allow_range,
    },
    Annotation { key: "allowlist-source-range", meaning: "the same as `whitelist-source-range`", read: allow_range },
    Annotation { key: "denylist-source-range", meaning: "these comma-separated CIDRs get 403", read: deny_range },
    Annotation {
        key: "proxy-body-size",
        meaning: "a request body over this size (`8m`, `512k`, bytes; `0` = no limit) gets 413",
        read: body_size,
    },
    Annotation {
        key: "proxy-connect-timeout",
        meaning: "seconds: HAProxy's `timeout connect` for the backends named",
        read: connect_timeout,
    },
    Annotation {
        key: "proxy-read-timeout",
        meaning: "seconds: HAProxy's `timeout server` (the larger of read and send)",
        read: server_timeout,
    },
    Annotation {
        key: "proxy-send-timeout",
        meaning: "seconds: HAProxy's `timeout server` (the larger of read and send)",
        read: server_timeout,
    },
    Annotation {
        key: "backend-protocol",
        meaning: "HTTP, HTTPS (TLS, not verified), GRPC or H2C (HTTP/2 in clear), GRPCS (HTTP/2 over TLS)",
        read: backend_protocol,
    },
    Annotation {
        key: "configuration-snippet",
        meaning: "HAProxy directives added to the backends named; only when the HAProxyConfig allows snippets",
        read: snippet,
    },
    Annotation { key: "server-snippet", meaning: "the same as `configuration-snippet`", read: snippet },
    Annotation {
        key: "use-regex",
        meaning: "`true`: this Ingress's Prefix and ImplementationSpecific paths are case-insensitive regular expressions anchored at the start (PCRE subset; nested quantifiers refused)",
        read: use_regex,
    },
    Annotation {
        key: "rewrite-target",
        meaning: "the path sent to the backend; `$1`…`$9` are the path regex's capture groups (implies `use-regex`)",
        read: rewrite_target_key,
    },
    Annotation { key: "upstream-vhost", meaning: "the Host header sent to the backend", read: upstream_vhost },
    Annotation {
        key: "affinity",
        meaning: "`cookie`: sticky sessions by an inserted cookie naming the server (a backend with it grows its slots by reload, doubling)",
        read: affinity,
    },
    Annotation {
        key: "affinity-mode",
        meaning: "`balanced` or `persistent`: both keep a client on its server while that server is up",
        read: affinity_mode,
    },
    Annotation {
        key: "session-cookie-name",
        meaning: "the affinity cookie's name (default `INGRESSCOOKIE`)",
        read: needs_affinity,
    },
    Annotation { key: "session-cookie-expires", meaning: "seconds: the affinity cookie's `Max-Age`", read: needs_affinity },
    Annotation {
        key: "session-cookie-max-age",
        meaning: "seconds: the affinity cookie's `Max-Age` (wins over `session-cookie-expires`)",
        read: needs_affinity,
    },
    Annotation { key: "session-cookie-path", meaning: "the affinity cookie's `Path`", read: needs_affinity },
    Annotation { key: "session-cookie-secure", meaning: "`true`: the affinity cookie is `Secure`", read: needs_affinity },
    Annotation {
        key: "session-cookie-samesite",
        meaning: "`Strict`, `Lax` or `None`: the affinity cookie's `SameSite`",
        read: needs_affinity,
    },
    Annotation {
        key: "enable-cors",
        meaning: "`true`: preflight `OPTIONS` requests from an allowed origin answer 204 with the CORS headers; other responses to it get them",
        read: enable_cors,
    },
    Annotation {
        key: "cors-allow-origin",
        meaning: "comma-separated origins (`*`, `https://a.example`, `https://*.a.example`; default `*`)",
        read: needs_cors,
    },
    Annotation {
        key: "cors-allow-methods",
        meaning: "`Access-Control-Allow-Methods` (default `GET, PUT, POST, DELETE, PATCH, OPTIONS`)",
        read: needs_cors,
    },
    Annotation {
        key: "cors-allow-headers",
        meaning: "`Access-Control-Allow-Headers` (default ingress-nginx's list)",
        read: needs_cors,
    },
    Annotation { key: "cors-expose-headers", meaning: "`Access-Control-Expose-Headers`", read: needs_cors },
    Annotation {
        key: "cors-allow-credentials",
        meaning: "`Access-Control-Allow-Credentials: true` (default `true`)",
        read: needs_cors,
    },
    Annotation { key: "cors-max-age", meaning: "`Access-Control-Max-Age`, seconds (default 1728000)", read: needs_cors },
    Annotation {
        key: "limit-rps",
        meaning: "requests per second per client address, over `limit-burst-multiplier` seconds (a stick table); over it, 503",
        read: limit,
    },
    Annotation {
        key: "limit-burst-multiplier",
        meaning: "the window of `limit-rps` in seconds, so its burst (default 5)",
        read: burst_multiplier,
    },
    Annotation { key: "limit-connections", meaning: "concurrent requests per client address; over it, 503", read: limit },
    Annotation {
        key: "limit-rpm",
        meaning: "requests per minute per client address, over 60 seconds (a second stick table); over it, 503",
        read: limit,
    },
    Annotation {
        key: "limit-whitelist",
        meaning: "comma-separated CIDRs the `limit-*` annotations do not count or refuse",
        read: limit_whitelist,
    },
    Annotation {
        key: "auth-type",
        meaning: "`basic`: HTTP basic authentication against `auth-secret` (401 without valid credentials)",
        read: auth_type,
    },
    Annotation {
        key: "auth-secret",
        meaning: "the Secret (this namespace) with the users: key `auth`, htpasswd lines with crypt(3) hashes (`htpasswd -B`, `openssl passwd -6`)",
        read: needs_basic_auth,
    },
    Annotation {
        key: "auth-secret-type",
        meaning: "`auth-file` (default: key `auth`) or `auth-map` (a key per user, its hash the value)",
        read: needs_basic_auth,
    },
    Annotation { key: "auth-realm", meaning: "the realm of `auth-type: basic`", read: needs_basic_auth },
    Annotation {
        key: "proxy-ssl-secret",
        meaning: "a Secret (this namespace) with `ca.crt` (to verify the backends' certificates) and/or `tls.crt`/`tls.key` (a client certificate); needs backend-protocol HTTPS or GRPCS",
        read: proxy_ssl_secret,
    },
    Annotation {
        key: "proxy-ssl-verify",
        meaning: "`on`: the backends' certificates must verify against the Secret's `ca.crt` (else 503)",
        read: needs_proxy_ssl_secret,
    },
    Annotation {
        key: "proxy-ssl-name",
        meaning: "the name the backends' certificates must carry (and the SNI sent, with `proxy-ssl-server-name`)",
        read: needs_proxy_ssl_secret,
    },
    Annotation {
        key: "proxy-ssl-server-name",
        meaning: "`on`: send `proxy-ssl-name` as SNI",
        read: needs_proxy_ssl_secret,
    },
    Annotation {
        key: "default-backend",
        meaning: "a Service (this namespace, its first port) whose endpoints serve as backup servers while the routed Service has no ready endpoint",
        read: default_backend,
    },
    Annotation {
        key: "ssl-passthrough",
        meaning: "`true`: TLS to this Ingress's hosts is not terminated: connections are routed by SNI (exact hosts) to the first path's Service as they are",
        read: ssl_passthrough,
    },
    Annotation {
        key: "canary",
        meaning: "`true`: this Ingress's paths are canaries of the same host/path of another Ingress, sharing its traffic through server weights",
        read: canary,
    },
    Annotation {
        key: "canary-weight",
        meaning: "the canary's share of requests, of `canary-weight-total` (runtime server weights: no reload)",
        read: needs_canary,
    },
    Annotation {
        key: "canary-weight-total",
        meaning: "the total `canary-weight` is a share of (default 100)",
        read: needs_canary,
    },
    Annotation {
        key: "canary-by-header",
        meaning: "a request with this header `always` goes to the canary, `never` to the main backend",
        read: needs_canary,
    },
    Annotation {
        key: "canary-by-header-value",
        meaning: "with `canary-by-header`: a request whose header equals this goes to the canary",
        read: needs_canary,
    },
    Annotation {
        key: "canary-by-header-pattern",
        meaning: "with `canary-by-header` (and no `-value`): a request whose header matches this regular expression (the `use-regex` subset) goes to the canary",
        read: needs_canary,
    },
    Annotation {
        key: "canary-by-cookie",
        meaning: "a request with this cookie `always` goes to the canary, `never` to the main backend",
        read: needs_canary,
    },
    Annotation {
        key: "server-alias",
        meaning: "comma-separated extra hosts with the same paths as this Ingress's hosts",
        read: server_alias,
    },
    Annotation {
        key: "custom-http-errors",
        meaning: "comma-separated statuses 400–599: a backend response with one of them is replaced by HAProxy's own response for that status (its error page; an empty body for a status HAProxy has no page for), not by the default backend's",
        read: custom_http_errors,
    },
];

fn ssl_redirect(r: &mut Reading<'_>, e: Entry<'_>) {
    let has_tls = r.has_tls;
    r.take(e.key, bool_of(e.v()), |m, b| m.policy.https_redirect |= b && has_tls);
}

fn force_ssl_redirect(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, bool_of(e.v()), |m, b| m.policy.https_redirect |= b);
}

fn permanent_redirect(r: &mut Reading<'_>, e: Entry<'_>) {
    redirect(r, e, "permanent-redirect-code", 301);
}

fn temporal_redirect(r: &mut Reading<'_>, e: Entry<'_>) {
    redirect(r, e, "temporal-redirect-code", 302);
}

/// A redirect of every request, its code from `code_key` (else `default`).
fn redirect(r: &mut Reading<'_>, e: Entry<'_>, code_key: &str, default: u16) {
    let (code_full, code) = match r.keys.get(code_key) {
        None => (code_key, Ok(default)),
        Some((k, c)) => (*k, redirect_code(c.trim())),
    };
    match (location(e.v()), code) {
        (Ok(location), Ok(code)) => {
            if r.m.policy.redirect.is_some() {
                r.bad(e.key, "permanent-redirect and temporal-redirect are both set".into());
            } else {
                r.m.policy.redirect = Some(Redirect::Location { location, code });
            }
        }
        (Err(err), _) => r.bad(e.key, err),
        (_, Err(err)) => r.bad(code_full, err),
    }
}

fn redirect_code_key(r: &mut Reading<'_>, e: Entry<'_>) {
    let base = e.short.trim_end_matches("-code");
    if !r.has(base) {
        r.ignore(e.key, format!("ignored: {base} is not set"));
    }
}

fn app_root_key(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, app_root(e.v()), |m, p| m.policy.app_root = Some(p));
}

fn allow_range(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, cidrs(e.v()), |m, c| m.policy.allow.get_or_insert_with(Vec::new).extend(c));
}

fn deny_range(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, cidrs(e.v()), |m, c| m.policy.deny.extend(c));
}

fn body_size(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, size(e.v()), |m, n| {
        if n != 0 {
            m.policy.max_body = Some(n);
        }
    });
}

fn connect_timeout(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, seconds(e.v()), |m, s| m.backend.connect_timeout = Some(s));
}

fn server_timeout(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, seconds(e.v()), |m, s| m.backend.server_timeout = Some(m.backend.server_timeout.unwrap_or(0).max(s)));
}

fn backend_protocol(r: &mut Reading<'_>, e: Entry<'_>) {
    let v = e.v();
    match v.to_ascii_uppercase().as_str() {
        "HTTP" => r.m.backend.protocol = Protocol::Http,
        "HTTPS" => r.m.backend.protocol = Protocol::Https,
        "GRPC" | "H2C" => r.m.backend.protocol = Protocol::H2c,
        "GRPCS" => r.m.backend.protocol = Protocol::H2s,
        other => r.bad(e.key, format!("{other:?} is not HTTP, HTTPS, GRPC, GRPCS or H2C")),
    }
}

fn snippet(r: &mut Reading<'_>, e: Entry<'_>) {
    let value = e.raw;
    if !r.allowed.snippets {
        r.forbid(e.key, "snippet annotations are off; the HAProxyConfig's admin can allow them".into());
    } else if let Err(err) = haptic_haproxy::snippet::check(value, haptic_haproxy::snippet::Section::Backend) {
        r.forbid(e.key, format!("refused: {err}"));
    } else {
        // Only the blanks HAProxy skips are trimmed (the check refused every other
        // control byte), so the lines rendered are the lines checked.
        let s = r.m.backend.snippet.get_or_insert_with(String::new);
        for line in value.split('\n').map(|l| l.trim_matches([' ', '\t'])).filter(|l| !l.is_empty()) {
            s.push_str("    ");
            s.push_str(line);
            s.push('\n');
        }
    }
}

fn use_regex(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, bool_of(e.v()), |m, b| m.paths.regex |= b);
}

fn rewrite_target_key(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, rewrite_target(e.v()), |m, t| {
        m.paths.rewrite = Some(t);
        m.paths.regex = true;
    });
}

fn upstream_vhost(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, vhost(e.v()), |m, h| m.policy.host_rewrite = Some(h));
}

fn server_alias(r: &mut Reading<'_>, e: Entry<'_>) {
    let list: Vec<&str> = e.v().split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if list.is_empty() {
        r.bad(e.key, "no host given".into());
    }
    for h in list {
        match crate::sources::common::parse_host(h) {
            Ok(h) if !r.m.paths.aliases.contains(&h) => r.m.paths.aliases.push(h),
            Ok(_) => {}
            Err(err) => r.bad(e.key, err),
        }
    }
}

fn affinity(r: &mut Reading<'_>, e: Entry<'_>) {
    let v = e.v();
    if v != "cookie" {
        r.bad(e.key, format!("{v:?} is not `cookie`"));
        return;
    }
    let mut a = Affinity { name: "INGRESSCOOKIE".into(), max_age: None, path: None, secure: false, same_site: None };
    if let Some((full, n)) = r.get("session-cookie-name") {
        match token(n) {
            Ok(n) => a.name = n,
            Err(err) => r.bad(full, err),
        }
    }
    for k in ["session-cookie-expires", "session-cookie-max-age"] {
        if let Some((full, n)) = r.get(k) {
            match n.parse::<u32>().ok().filter(|n| *n <= 10 * 365 * 86_400) {
                Some(n) if k.ends_with("max-age") || a.max_age.is_none() => a.max_age = Some(n),
                Some(_) => {}
                None => r.bad(full, format!("{n:?} is not a number of seconds (up to ten years)")),
            }
        }
    }
    if let Some((full, p)) = r.get("session-cookie-path") {
        let ok =
            p.starts_with('/') && p.len() <= 1024 && p.bytes().all(|b| b.is_ascii_graphic() && !b";,".contains(&b));
        if ok {
            a.path = Some(p.to_string());
        } else {
            r.bad(full, format!("{p:?} is not a cookie path (printable ASCII from '/', no ';' or ',')"));
        }
    }
    if let Some((full, v)) = r.get("session-cookie-secure") {
        match bool_of(v) {
            Ok(b) => a.secure = b,
            Err(err) => r.bad(full, err),
        }
    }
    if let Some((full, v)) = r.get("session-cookie-samesite") {
        match ["Strict", "Lax", "None"].into_iter().find(|s| s.eq_ignore_ascii_case(v)) {
            Some(s) => a.same_site = Some(s),
            None => r.bad(full, format!("{v:?} is not `Strict`, `Lax` or `None`")),
        }
    }
    r.m.backend.affinity = Some(a);
}

fn affinity_mode(r: &mut Reading<'_>, e: Entry<'_>) {
    let v = e.v();
    if !matches!(v, "balanced" | "persistent") {
        r.bad(e.key, format!("{v:?} is not `balanced` or `persistent`"));
    }
}

fn needs_affinity(r: &mut Reading<'_>, e: Entry<'_>) {
    if !r.has("affinity") {
        r.ignore(e.key, "ignored: affinity is not set");
    }
}

fn canary(r: &mut Reading<'_>, e: Entry<'_>) {
    match bool_of(e.v()) {
        Ok(false) => {}
        Ok(true) => {
            let mut c = Canary { weight: 0, total: 100, selector: CanarySelector::default() };
            canary_weight(r, &mut c);
            canary_selector(r, &mut c.selector);
            r.m.canary = Some(c);
        }
        Err(err) => r.bad(e.key, err),
    }
}

/// `canary-weight-total` and `canary-weight`.
fn canary_weight(r: &mut Reading<'_>, c: &mut Canary) {
    if let Some((full, t)) = r.get("canary-weight-total") {
        match t.parse::<u32>().ok().filter(|t| (1..=1_000_000).contains(t)) {
            Some(t) => c.total = t,
            None => r.bad(full, format!("{t:?} is not a number from 1 to 1000000")),
        }
    }
    if let Some((full, w)) = r.get("canary-weight") {
        match w.parse::<u32>().ok().filter(|w| *w <= c.total) {
            Some(w) => c.weight = w,
            None => r.bad(full, format!("{w:?} is not a number from 0 to {}", c.total)),
        }
    }
}

/// `canary-by-header`, its `-value` or `-pattern`, and `canary-by-cookie`.
fn canary_selector(r: &mut Reading<'_>, s: &mut CanarySelector) {
    if let Some((full, h)) = r.get("canary-by-header") {
        match name_of(h) {
            Ok(h) => s.header = Some(h),
            Err(err) => r.bad(full, err),
        }
    }
    if let Some((full, hv)) = r.get("canary-by-header-value") {
        let ok = !hv.is_empty() && hv != "}" && hv.len() <= 1024 && hv.bytes().all(|b| b.is_ascii_graphic());
        if !ok {
            r.bad(full, format!("{hv:?} is not a header value (printable ASCII, no blanks, not `}}`)"));
        } else if s.header.is_none() {
            r.bad(full, "canary-by-header is not set".into());
        } else {
            s.header_value = Some(hv.to_string());
        }
    }
    if let Some((full, p)) = r.get("canary-by-header-pattern") {
        if s.header.is_none() {
            r.bad(full, "canary-by-header is not set".into());
        } else if s.header_value.is_some() {
            r.ignore(full, "ignored: canary-by-header-value is set and wins");
        } else {
            match haptic_haproxy::regex::check(p) {
                Ok(_) if p != "}" => s.header_pattern = Some(p.to_string()),
                Ok(_) => r.bad(full, "`}` is not a pattern here".into()),
                Err(err) => r.bad(full, format!("{p:?} is not an accepted regular expression: {err}")),
            }
        }
    }
    if let Some((full, ck)) = r.get("canary-by-cookie") {
        match name_of(ck) {
            Ok(ck) => s.cookie = Some(ck),
            Err(err) => r.bad(full, err),
        }
    }
}

fn needs_canary(r: &mut Reading<'_>, e: Entry<'_>) {
    if !r.is("canary", "true") {
        r.ignore(e.key, "ignored: canary is not `true`");
    }
}

fn enable_cors(r: &mut Reading<'_>, e: Entry<'_>) {
    match bool_of(e.v()) {
        Ok(false) => {}
        Ok(true) => {
            let c = cors(r);
            r.m.policy.cors = Some(c);
        }
        Err(err) => r.bad(e.key, err),
    }
}

/// CORS from the `cors-*` keys, ingress-nginx's defaults for those not set.
fn cors(r: &mut Reading<'_>) -> Cors {
    let mut c = Cors {
        origins: vec![Origin::Any],
        methods: "GET, PUT, POST, DELETE, PATCH, OPTIONS".into(),
        headers: "DNT, Keep-Alive, User-Agent, X-Requested-With, If-Modified-Since, Cache-Control, Content-Type, Range, Authorization".into(),
        expose: None,
        credentials: true,
        max_age: 1_728_000,
        reflect: false,
    };
    if let Some((full, o)) = r.get("cors-allow-origin") {
        match crate::sources::common::origins(o.split(',').map(str::trim).filter(|s| !s.is_empty())) {
            Ok(o) => c.origins = o,
            Err(err) => r.bad(full, err),
        }
    }
    for (k, slot) in [("cors-allow-methods", &mut c.methods), ("cors-allow-headers", &mut c.headers)] {
        if let Some((full, l)) = r.get(k) {
            match tokens(l) {
                Ok(t) => *slot = t,
                Err(err) => r.bad(full, err),
            }
        }
    }
    if let Some((full, l)) = r.get("cors-expose-headers") {
        match tokens(l) {
            Ok(t) => c.expose = Some(t),
            Err(err) => r.bad(full, err),
        }
    }
    if let Some((full, b)) = r.get("cors-allow-credentials") {
        match bool_of(b) {
            Ok(b) => c.credentials = b,
            Err(err) => r.bad(full, err),
        }
    }
    if let Some((full, n)) = r.get("cors-max-age") {
        match n.parse::<u32>() {
            Ok(n) => c.max_age = n,
            Err(_) => r.bad(full, format!("{n:?} is not a number of seconds")),
        }
    }
    c
}

fn needs_cors(r: &mut Reading<'_>, e: Entry<'_>) {
    if !r.is("enable-cors", "true") {
        r.ignore(e.key, "ignored: enable-cors is not `true`");
    }
}

/// `limit-rps`, `limit-rpm` and `limit-connections`.
fn limit(r: &mut Reading<'_>, e: Entry<'_>) {
    let v = e.v();
    let Some(n) = v.parse::<u32>().ok().filter(|n| (1..=1_000_000).contains(n)) else {
        r.bad(e.key, format!("{v:?} is not a number from 1 to 1000000"));
        return;
    };
    let burst = match e.short {
        "limit-rps" => r.keys.get("limit-burst-multiplier").map(|(full, w)| (*full, *w)),
        _ => None,
    };
    let l = r.m.policy.limit.get_or_insert(Limit {
        rps: None,
        window: 5,
        connections: None,
        rpm: None,
        exempt: Vec::new(),
    });
    match e.short {
        "limit-connections" => l.connections = Some(n),
        "limit-rpm" => l.rpm = Some(n),
        _ => l.rps = Some(n),
    }
    if let Some((full, w)) = burst {
        match w.trim().parse::<u32>().ok().filter(|w| (1..=3600).contains(w)) {
            Some(w) => l.window = w,
            None => r.bad(full, format!("{w:?} is not a number from 1 to 3600")),
        }
    }
}

fn limit_whitelist(r: &mut Reading<'_>, e: Entry<'_>) {
    // Keys are read in order: the limits ("limit-c…", "limit-r…") come before it.
    match (cidrs(e.v()), r.m.policy.limit.as_mut()) {
        (Ok(c), Some(l)) => l.exempt = c,
        (Ok(_), None) => r.ignore(e.key, "ignored: none of limit-rps, limit-rpm, limit-connections is set"),
        (Err(err), _) => r.bad(e.key, err),
    }
}

fn burst_multiplier(r: &mut Reading<'_>, e: Entry<'_>) {
    if !r.has("limit-rps") {
        r.ignore(e.key, "ignored: limit-rps is not set");
    }
}

fn auth_type(r: &mut Reading<'_>, e: Entry<'_>) {
    let v = e.v();
    if v != "basic" {
        r.bad(e.key, format!("{v:?} is not `basic` (digest is not supported)"));
        return;
    }
    let Some((secret_key, secret)) = r.get("auth-secret") else {
        r.bad(e.key, "auth-secret is not set".into());
        return;
    };
    let map = match r.get("auth-secret-type") {
        None | Some((_, "auth-file")) => false,
        Some((_, "auth-map")) => true,
        Some((full, t)) => {
            r.bad(full, format!("{t:?} is not `auth-file` or `auth-map`"));
            false
        }
    };
    let realm = r.get("auth-realm").map_or("Authentication Required", |(_, v)| v);
    if realm.is_empty()
        || realm.len() > 256
        || !realm.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        if let Some((full, _)) = r.get("auth-realm") {
            r.bad(full, format!("{realm:?} is not a realm (printable ASCII, no '\"' or '\\')"));
        }
    }
    // A name with a namespace (`ns/name`) would read another namespace's Secret.
    if secret.contains('/') || !is_section_name(secret) || secret.len() > 253 {
        r.bad(secret_key, format!("{secret:?} is not the name of a Secret in this Ingress's namespace"));
        return;
    }
    r.m.auth = Some(AuthRequest { secret: secret.into(), map, realm: realm.into(), field: field(secret_key) });
}

fn needs_basic_auth(r: &mut Reading<'_>, e: Entry<'_>) {
    if !r.is("auth-type", "basic") {
        r.ignore(e.key, "ignored: auth-type is not `basic`");
    }
}

fn proxy_ssl_secret(r: &mut Reading<'_>, e: Entry<'_>) {
    let v = e.v();
    let mut on = |k: &str| -> bool {
        match r.get(k) {
            None | Some((_, "off" | "false")) => false,
            Some((_, "on" | "true")) => true,
            Some((full, other)) => {
                r.bad(full, format!("{other:?} is not on or off"));
                false
            }
        }
    };
    let verify = on("proxy-ssl-verify");
    let sni = on("proxy-ssl-server-name");
    let mut t = UpstreamTls { secret: String::new(), verify, sni, ..Default::default() };
    if let Some((full, n)) = r.get("proxy-ssl-name") {
        match crate::sources::common::parse_host(n) {
            Ok(crate::model::HostMatch::Exact(h)) => t.name = Some(h),
            _ => r.bad(full, format!("{n:?} is not a DNS name")),
        }
    }
    if t.sni && t.name.is_none() {
        r.bad(e.key, "proxy-ssl-server-name needs proxy-ssl-name (the SNI to send)".into());
    }
    // `ns/name` is accepted for this namespace only (checked by the translator).
    let name = v.rsplit('/').next().unwrap_or_default();
    if !is_section_name(name) || name.len() > 253 || v.matches('/').count() > 1 {
        r.bad(e.key, format!("{v:?} is not a Secret name"));
    }
    t.secret = v.to_string();
    r.m.backend.upstream_tls = Some(t);
}

fn needs_proxy_ssl_secret(r: &mut Reading<'_>, e: Entry<'_>) {
    if !r.has("proxy-ssl-secret") {
        r.ignore(e.key, "ignored: proxy-ssl-secret is not set");
    }
}

fn default_backend(r: &mut Reading<'_>, e: Entry<'_>) {
    let v = e.v();
    let ok = is_section_name(v) && !v.contains('.') && v.len() <= 63;
    if ok {
        r.m.backend.fallback = Some(v.to_string());
    } else {
        r.bad(e.key, format!("{v:?} is not the name of a Service in this Ingress's namespace"));
    }
}

fn custom_http_errors(r: &mut Reading<'_>, e: Entry<'_>) {
    let codes = match statuses(e.v()) {
        Ok(codes) => codes,
        Err(err) => return r.bad(e.key, err),
    };
    let mut notes = Vec::new();
    let bare: Vec<String> = codes.iter().filter(|c| !ERROR_PAGES.contains(c)).map(ToString::to_string).collect();
    if !bare.is_empty() {
        notes.push(format!(
            "HAProxy has no error page for {}: such a response is replaced by one with the same status and an empty body",
            bare.join(", ")
        ));
    }
    if r.has("default-backend") {
        notes.push(
            "the error pages are HAProxy's, not the default-backend Service's (HAProxy cannot hand a backend's response over to another backend); default-backend still serves as backup servers".into(),
        );
    }
    if !notes.is_empty() {
        r.warn(e.key, notes.join("; "));
    }
    r.m.policy.error_pages = codes;
}

fn ssl_passthrough(r: &mut Reading<'_>, e: Entry<'_>) {
    r.take(e.key, bool_of(e.v()), |m, b| m.backend.passthrough = b);
}
