//! Ingress annotations: the `nginx.ingress.kubernetes.io/*` keys ingress-nginx users bring, and
//! the same keys under haptic's own prefix `haptic.dev/*`, read into typed, validated meanings.
//!
//! Owns which keys are supported ([`SUPPORTED`]), what each value may be, and what the Ingress
//! gets from them: a [`Policy`] for its routes (redirects, source ranges, body size), and
//! [`BackendOptions`] for the backends it names (timeouts, protocol, a checked snippet). A value
//! that does not parse refuses the Ingress (serving it without, say, its source range would open
//! what its author closed); a key with either prefix that is not supported is a warning naming
//! it, never silently dropped. Snippet keys are refused unless the admin allowed them, and then
//! pass [`haptic_haproxy::snippet::check`]. It must never hand on object text unchecked: every
//! value leaves here parsed (numbers, addresses, codes) or as text the template quotes.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use crate::model::Refusal;

/// ingress-nginx's annotation prefix.
pub const NGINX_PREFIX: &str = "nginx.ingress.kubernetes.io/";
/// haptic's own prefix, with the same keys and meanings.
pub const HAPTIC_PREFIX: &str = "haptic.dev/";

/// The keys read (without prefix), each with what it means here.
pub const SUPPORTED: &[(&str, &str)] = &[
    (
        "ssl-redirect",
        "`true`: plain-HTTP requests to this Ingress's routes are redirected to HTTPS (308) when it has `spec.tls`",
    ),
    ("force-ssl-redirect", "`true`: plain-HTTP requests are redirected to HTTPS (308), with or without `spec.tls`"),
    ("permanent-redirect", "every request is redirected to this URL (301, or `permanent-redirect-code`)"),
    ("permanent-redirect-code", "the code of `permanent-redirect`: 300–308"),
    ("temporal-redirect", "every request is redirected to this URL (302, or `temporal-redirect-code`)"),
    ("temporal-redirect-code", "the code of `temporal-redirect`: 300–308"),
    ("app-root", "a request for `/` is redirected (302) to this path"),
    ("whitelist-source-range", "only these comma-separated CIDRs may connect; others get 403"),
    ("allowlist-source-range", "the same as `whitelist-source-range`"),
    ("denylist-source-range", "these comma-separated CIDRs get 403"),
    ("proxy-body-size", "a request body over this size (`8m`, `512k`, bytes; `0` = no limit) gets 413"),
    ("proxy-connect-timeout", "seconds: HAProxy's `timeout connect` for the backends named"),
    ("proxy-read-timeout", "seconds: HAProxy's `timeout server` (the larger of read and send)"),
    ("proxy-send-timeout", "seconds: HAProxy's `timeout server` (the larger of read and send)"),
    ("backend-protocol", "HTTP, HTTPS (TLS, not verified), GRPC or H2C (HTTP/2 in clear), GRPCS (HTTP/2 over TLS)"),
    (
        "configuration-snippet",
        "HAProxy directives added to the backends named; only when the HAProxyConfig allows snippets",
    ),
    ("server-snippet", "the same as `configuration-snippet`"),
];

/// Snippet keys ingress-nginx has that have no HAProxy meaning: always refused.
const NGINX_ONLY_SNIPPETS: &[&str] = &["stream-snippet", "auth-snippet", "modsecurity-snippet"];

/// What the admin allows objects to bring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allowed {
    /// `configuration-snippet` / `server-snippet` (still checked).
    pub snippets: bool,
}

/// An IPv4 or IPv6 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Cidr {
    /// The address (host bits kept as written; HAProxy masks them).
    pub addr: IpAddr,
    /// The prefix length.
    pub len: u8,
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?} is not an IP address or CIDR"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => l.parse::<u8>().ok().filter(|n| *n <= max).ok_or_else(|| format!("{s:?}: bad prefix length"))?,
        };
        Ok(Cidr { addr, len })
    }
}

/// An HTTP redirect.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Redirect {
    /// Where to (object text: quoted by the template).
    pub location: String,
    /// 300–308.
    pub code: u16,
}

/// What a rule does to a request before it reaches its backend. Rules with equal policies share
/// one; the default (empty) policy adds nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Policy {
    /// When set, only these sources pass (403 otherwise).
    pub allow: Option<Vec<Cidr>>,
    /// These sources get 403.
    pub deny: Vec<Cidr>,
    /// Redirect plain HTTP to HTTPS (308).
    pub https_redirect: bool,
    /// The largest request body (Content-Length), in bytes; 413 above.
    pub max_body: Option<u64>,
    /// `/` redirects (302) here.
    pub app_root: Option<String>,
    /// Every request redirects here.
    pub redirect: Option<Redirect>,
}

impl Policy {
    /// Whether it does nothing.
    pub fn is_empty(&self) -> bool {
        *self == Policy::default()
    }
}

/// How HAProxy talks to a backend's servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum Protocol {
    /// HTTP/1.1 in clear.
    #[default]
    Http,
    /// HTTP/1.1 over TLS, the server's certificate not verified.
    Https,
    /// HTTP/2 in clear (`GRPC`, `H2C`).
    H2c,
    /// HTTP/2 over TLS, not verified (`GRPCS`).
    H2s,
}

/// What the Ingresses naming a backend set for it. Two Ingresses naming one backend must agree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BackendOptions {
    /// `timeout connect`, seconds.
    pub connect_timeout: Option<u32>,
    /// `timeout server`, seconds.
    pub server_timeout: Option<u32>,
    /// The protocol.
    pub protocol: Protocol,
    /// Checked directives added to the backend.
    pub snippet: Option<String>,
}

/// What one Ingress's annotations mean.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meaning {
    /// For its routes.
    pub policy: Policy,
    /// For the backends it names.
    pub backend: BackendOptions,
}

/// The annotation's field path in a [`Refusal`].
fn field(full_key: &str) -> String {
    format!("metadata.annotations[{full_key}]")
}

/// Reads `annotations` (an Ingress's, all of them) into their meaning: `Err` with every value
/// that does not parse or is not allowed (the Ingress is refused), `Ok` with the meaning and a
/// warning per key with our prefixes that is not supported, or set under both prefixes.
/// `has_tls`: the Ingress has `spec.tls` (for `ssl-redirect`).
pub fn read(
    annotations: &BTreeMap<String, String>,
    has_tls: bool,
    allowed: Allowed,
) -> Result<(Meaning, Vec<Refusal>), Vec<Refusal>> {
    let mut warnings = Vec::new();
    // key (unprefixed) → (full key, value); haptic.dev wins over nginx.
    let mut keys: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for (k, v) in annotations {
        for prefix in [NGINX_PREFIX, HAPTIC_PREFIX] {
            let Some(short) = k.strip_prefix(prefix) else { continue };
            match keys.get(short) {
                Some((other, ov)) if prefix == NGINX_PREFIX => {
                    if ov != v {
                        warnings
                            .push(Refusal { field: field(k), reason: format!("ignored: {other} is set too and wins") });
                    }
                }
                Some((other, ov)) => {
                    if ov != v {
                        warnings
                            .push(Refusal { field: field(other), reason: format!("ignored: {k} is set too and wins") });
                    }
                    keys.insert(short, (k, v));
                }
                None => {
                    keys.insert(short, (k, v));
                }
            }
        }
    }
    let mut errors = Vec::new();
    let mut m = Meaning::default();
    let mut bad = |key: &str, reason: String| errors.push(Refusal { field: field(key), reason });
    for (short, (key, value)) in &keys {
        let v = value.trim();
        match *short {
            "ssl-redirect" => match bool_of(v) {
                Ok(b) => m.policy.https_redirect |= b && has_tls,
                Err(e) => bad(key, e),
            },
            "force-ssl-redirect" => match bool_of(v) {
                Ok(b) => m.policy.https_redirect |= b,
                Err(e) => bad(key, e),
            },
            "permanent-redirect" | "temporal-redirect" => {
                let (code_key, default) = if *short == "permanent-redirect" {
                    ("permanent-redirect-code", 301)
                } else {
                    ("temporal-redirect-code", 302)
                };
                let (code_full, code) = match keys.get(code_key) {
                    None => (code_key, Ok(default)),
                    Some((k, c)) => (*k, redirect_code(c.trim())),
                };
                match (location(v), code) {
                    (Ok(location), Ok(code)) => {
                        if m.policy.redirect.is_some() {
                            bad(key, "permanent-redirect and temporal-redirect are both set".into());
                        } else {
                            m.policy.redirect = Some(Redirect { location, code });
                        }
                    }
                    (Err(e), _) => bad(key, e),
                    (_, Err(e)) => bad(code_full, e),
                }
            }
            "permanent-redirect-code" | "temporal-redirect-code" => {
                let base = short.trim_end_matches("-code");
                if !keys.contains_key(base) {
                    warnings.push(Refusal { field: field(key), reason: format!("ignored: {base} is not set") });
                }
            }
            "app-root" => match app_root(v) {
                Ok(p) => m.policy.app_root = Some(p),
                Err(e) => bad(key, e),
            },
            "whitelist-source-range" | "allowlist-source-range" => match cidrs(v) {
                Ok(c) => m.policy.allow.get_or_insert_with(Vec::new).extend(c),
                Err(e) => bad(key, e),
            },
            "denylist-source-range" => match cidrs(v) {
                Ok(c) => m.policy.deny.extend(c),
                Err(e) => bad(key, e),
            },
            "proxy-body-size" => match size(v) {
                Ok(0) => {}
                Ok(n) => m.policy.max_body = Some(n),
                Err(e) => bad(key, e),
            },
            "proxy-connect-timeout" => match seconds(v) {
                Ok(s) => m.backend.connect_timeout = Some(s),
                Err(e) => bad(key, e),
            },
            "proxy-read-timeout" | "proxy-send-timeout" => match seconds(v) {
                Ok(s) => m.backend.server_timeout = Some(m.backend.server_timeout.unwrap_or(0).max(s)),
                Err(e) => bad(key, e),
            },
            "backend-protocol" => match v.to_ascii_uppercase().as_str() {
                "HTTP" => m.backend.protocol = Protocol::Http,
                "HTTPS" => m.backend.protocol = Protocol::Https,
                "GRPC" | "H2C" => m.backend.protocol = Protocol::H2c,
                "GRPCS" => m.backend.protocol = Protocol::H2s,
                other => bad(key, format!("{other:?} is not HTTP, HTTPS, GRPC, GRPCS or H2C")),
            },
            "configuration-snippet" | "server-snippet" => {
                if !allowed.snippets {
                    bad(key, "snippet annotations are off; the HAProxyConfig's admin can allow them".into());
                } else if let Err(e) = haptic_haproxy::snippet::check(value) {
                    bad(key, format!("refused: {e}"));
                } else {
                    let s = m.backend.snippet.get_or_insert_with(String::new);
                    for line in value.lines().filter(|l| !l.trim().is_empty()) {
                        s.push_str("    ");
                        s.push_str(line.trim());
                        s.push('\n');
                    }
                }
            }
            s if NGINX_ONLY_SNIPPETS.contains(&s) => bad(key, "this snippet has no meaning in HAProxy".into()),
            s if SUPPORTED.iter().any(|(k, _)| *k == s) => {}
            _ => warnings.push(Refusal { field: field(key), reason: "not supported by haptic: ignored".into() }),
        }
    }
    if errors.is_empty() {
        Ok((m, warnings))
    } else {
        Err(errors)
    }
}

/// What haptic does with one annotation, for `haptic-controller migrate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "snake_case")]
pub enum Status {
    /// Read and applied; what it means here.
    Honoured(String),
    /// Read, but has no effect as set (a code without its redirect, the other prefix's copy).
    Ignored(String),
    /// A key with our prefixes that haptic does not support: a Warning Event names it.
    NotSupported,
    /// Its value is refused, and with it the whole Ingress.
    Refused(String),
}

/// One annotation and its [`Status`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explained {
    /// The full key.
    pub key: String,
    /// The value.
    pub value: String,
    /// What haptic does with it.
    pub status: Status,
}

/// Every annotation with one of our prefixes, and what haptic does with it, judged one key at a
/// time (with its companion `-code` key) as [`read`] judges it.
pub fn explain(annotations: &BTreeMap<String, String>, has_tls: bool, allowed: Allowed) -> Vec<Explained> {
    fn ours(k: &str) -> Option<&str> {
        k.strip_prefix(NGINX_PREFIX).or_else(|| k.strip_prefix(HAPTIC_PREFIX))
    }
    let mut out = Vec::new();
    for (key, value) in annotations {
        let Some(short) = ours(key) else { continue };
        let prefix = &key[..key.len() - short.len()];
        let mut one = BTreeMap::from([(key.clone(), value.clone())]);
        for companion in [format!("{short}-code"), short.trim_end_matches("-code").to_string()] {
            if let Some(v) = annotations.get(&format!("{prefix}{companion}")) {
                one.insert(format!("{prefix}{companion}"), v.clone());
            }
        }
        let f = field(key);
        let status = match read(&one, has_tls, allowed) {
            Err(refusals) => match refusals.iter().find(|r| r.field == f) {
                Some(r) => Status::Refused(r.reason.clone()),
                None => Status::Honoured(meaning_of(short)),
            },
            Ok((_, warnings)) => match warnings.iter().find(|w| w.field == f) {
                Some(w) if w.reason.starts_with("not supported") => Status::NotSupported,
                Some(w) => Status::Ignored(w.reason.clone()),
                None => Status::Honoured(meaning_of(short)),
            },
        };
        let status = match status {
            // The same key under the other prefix wins over this one.
            Status::Honoured(m)
                if prefix == NGINX_PREFIX
                    && annotations.get(&format!("{HAPTIC_PREFIX}{short}")).is_some_and(|v| v != value) =>
            {
                Status::Ignored(format!("ignored: {HAPTIC_PREFIX}{short} is set too and wins ({m})"))
            }
            s => s,
        };
        out.push(Explained { key: key.clone(), value: value.clone(), status });
    }
    out
}

/// What haptic would make of one Ingress's annotations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The Ingress.
    pub ingress: crate::model::ObjectRef,
    /// Each annotation with our prefixes.
    pub annotations: Vec<Explained>,
    /// Whether it would be served (no annotation refused).
    pub served: bool,
    /// The config lines its annotations add (the routes' policy as `p1`); when it is not
    /// served, those of its annotations that are not refused.
    pub rules: Vec<String>,
}

/// The [`Report`] of `ing`.
pub fn report(ing: &k8s_openapi::api::networking::v1::Ingress, allowed: Allowed) -> Report {
    let empty = BTreeMap::new();
    let a = ing.metadata.annotations.as_ref().unwrap_or(&empty);
    let has_tls = ing.spec.as_ref().and_then(|s| s.tls.as_ref()).is_some_and(|t| !t.is_empty());
    let lines = |m: &Meaning| crate::template::annotation_lines("p1", m).unwrap_or_else(|e| vec![format!("({e})")]);
    let (served, rules) = match read(a, has_tls, allowed) {
        Ok((m, _)) => (true, lines(&m)),
        // What the other annotations would add once the refused ones are fixed or removed.
        Err(refused) => {
            let rest: BTreeMap<String, String> = a
                .iter()
                .filter(|(k, _)| !refused.iter().any(|r| r.field == field(k)))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (false, read(&rest, has_tls, allowed).map(|(m, _)| lines(&m)).unwrap_or_default())
        }
    };
    Report {
        ingress: crate::model::ObjectRef {
            kind: "Ingress".into(),
            namespace: ing.metadata.namespace.clone().unwrap_or_default(),
            name: ing.metadata.name.clone().unwrap_or_default(),
        },
        annotations: explain(a, has_tls, allowed),
        served,
        rules,
    }
}

/// The reports as text: per Ingress, each annotation's status, then the config lines it adds.
pub fn report_text(reports: &[Report]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let (mut served, mut unsupported) = (0, 0);
    for r in reports {
        let verdict = if r.served { "served" } else { "NOT served: an annotation's value is refused" };
        let _ = writeln!(out, "{} ({verdict})", r.ingress);
        if r.annotations.is_empty() {
            let _ = writeln!(out, "  no nginx.ingress.kubernetes.io/ or haptic.dev/ annotations");
        }
        for a in &r.annotations {
            let (label, detail) = match &a.status {
                Status::Honoured(m) => ("honoured", m.clone()),
                Status::Ignored(why) => ("ignored", why.clone()),
                Status::NotSupported => {
                    unsupported += 1;
                    ("NOT SUPPORTED", "ignored, with a Warning Event on the Ingress".to_string())
                }
                Status::Refused(why) => ("REFUSED", why.clone()),
            };
            let _ = writeln!(out, "  {label:<13} {}={:?}: {detail}", a.key, a.value);
        }
        if !r.rules.is_empty() {
            let once = if r.served { "" } else { ", once the refused annotations are fixed or removed" };
            let _ = writeln!(out, "  HAProxy rules (p1 = this Ingress's routes{once}):");
            for l in &r.rules {
                let _ = writeln!(out, "    {l}");
            }
        }
        served += usize::from(r.served);
    }
    let _ = writeln!(
        out,
        "{} Ingresses: {served} would be served, {} refused; {unsupported} unsupported annotations",
        reports.len(),
        reports.len() - served
    );
    out
}

fn meaning_of(short: &str) -> String {
    SUPPORTED.iter().find(|(k, _)| *k == short).map(|(_, m)| m.to_string()).unwrap_or_default()
}

fn bool_of(v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{v:?} is not true or false")),
    }
}

fn redirect_code(v: &str) -> Result<u16, String> {
    v.parse::<u16>()
        .ok()
        .filter(|c| (300..=308).contains(c))
        .ok_or_else(|| format!("{v:?} is not a redirect code (300–308)"))
}

/// A redirect target: an absolute `http(s)://` URL or a path, printable ASCII without blanks.
fn location(v: &str) -> Result<String, String> {
    let ok_chars = v.bytes().all(|b| b.is_ascii_graphic());
    let ok_form = v.starts_with('/') || v.starts_with("http://") || v.starts_with("https://");
    if v.is_empty() || v.len() > 2048 || !ok_chars || !ok_form {
        return Err(format!("{v:?} is not an http(s):// URL or a path (printable ASCII, no blanks, ≤ 2048 bytes)"));
    }
    Ok(v.to_string())
}

fn app_root(v: &str) -> Result<String, String> {
    if !v.starts_with('/') || v == "/" {
        return Err(format!("{v:?} is not a path other than /"));
    }
    location(v)
}

fn cidrs(v: &str) -> Result<Vec<Cidr>, String> {
    let list: Vec<&str> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if list.is_empty() {
        return Err("no CIDR given".into());
    }
    let mut out: Vec<Cidr> = list.into_iter().map(str::parse).collect::<Result<_, _>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// An nginx size: bytes, or with `k`/`m`/`g` (binary multiples, either case).
fn size(v: &str) -> Result<u64, String> {
    let err = || format!("{v:?} is not a size (bytes, or a number with k, m or g)");
    let (num, mult) = match v.char_indices().last() {
        Some((i, c)) if c.eq_ignore_ascii_case(&'k') => (&v[..i], 1u64 << 10),
        Some((i, c)) if c.eq_ignore_ascii_case(&'m') => (&v[..i], 1 << 20),
        Some((i, c)) if c.eq_ignore_ascii_case(&'g') => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)).ok_or_else(err)
}

/// Whole seconds, 1 to a day (ingress-nginx takes plain numbers of seconds).
fn seconds(v: &str) -> Result<u32, String> {
    v.parse::<u32>()
        .ok()
        .filter(|s| (1..=86_400).contains(s))
        .ok_or_else(|| format!("{v:?} is not a number of seconds (1–86400)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (format!("{NGINX_PREFIX}{k}"), v.to_string())).collect()
    }

    fn ok(pairs: &[(&str, &str)]) -> Meaning {
        read(&ann(pairs), true, Allowed::default()).unwrap().0
    }

    fn refused(pairs: &[(&str, &str)]) -> String {
        let e = read(&ann(pairs), true, Allowed::default()).unwrap_err();
        e.iter().map(|r| format!("{}: {}", r.field, r.reason)).collect::<Vec<_>>().join("; ")
    }

    #[test]
    fn each_supported_key_has_its_meaning() {
        assert!(ok(&[("ssl-redirect", "true")]).policy.https_redirect);
        assert!(!read(&ann(&[("ssl-redirect", "true")]), false, Allowed::default()).unwrap().0.policy.https_redirect);
        assert!(
            read(&ann(&[("force-ssl-redirect", "true")]), false, Allowed::default()).unwrap().0.policy.https_redirect
        );
        let r = ok(&[("permanent-redirect", "https://example.com/new"), ("permanent-redirect-code", "308")]);
        assert_eq!(r.policy.redirect, Some(Redirect { location: "https://example.com/new".into(), code: 308 }));
        assert_eq!(ok(&[("temporal-redirect", "/elsewhere")]).policy.redirect.unwrap().code, 302);
        assert_eq!(ok(&[("app-root", "/app")]).policy.app_root.as_deref(), Some("/app"));
        let p = ok(&[("whitelist-source-range", "10.0.0.0/8, 192.168.1.1,::1/128")]).policy;
        assert_eq!(
            p.allow.unwrap().iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.0.0.0/8", "192.168.1.1/32", "::1/128"]
        );
        assert_eq!(ok(&[("denylist-source-range", "203.0.113.0/24")]).policy.deny.len(), 1);
        assert_eq!(ok(&[("proxy-body-size", "8m")]).policy.max_body, Some(8 << 20));
        assert_eq!(ok(&[("proxy-body-size", "0")]).policy.max_body, None);
        let b =
            ok(&[("proxy-connect-timeout", "3"), ("proxy-read-timeout", "60"), ("proxy-send-timeout", "90")]).backend;
        assert_eq!((b.connect_timeout, b.server_timeout), (Some(3), Some(90)));
        assert_eq!(ok(&[("backend-protocol", "GRPC")]).backend.protocol, Protocol::H2c);
        assert_eq!(ok(&[("backend-protocol", "https")]).backend.protocol, Protocol::Https);
        assert_eq!(ok(&[("backend-protocol", "GRPCS")]).backend.protocol, Protocol::H2s);
    }

    #[test]
    fn bad_values_refuse_the_ingress_naming_the_key() {
        for (pairs, want) in [
            (vec![("ssl-redirect", "yes")], "ssl-redirect]: \"yes\" is not true or false"),
            (vec![("permanent-redirect", "javascript:alert(1)")], "not an http(s):// URL"),
            (vec![("permanent-redirect", "https://a/\nb")], "not an http(s):// URL"),
            (
                vec![("permanent-redirect", "https://a"), ("permanent-redirect-code", "200")],
                "permanent-redirect-code]: \"200\" is not a redirect code",
            ),
            (vec![("app-root", "app")], "not a path"),
            (vec![("whitelist-source-range", "10.0.0.0/33")], "bad prefix length"),
            (vec![("whitelist-source-range", "everyone")], "not an IP address"),
            (vec![("proxy-body-size", "8x")], "not a size"),
            (vec![("proxy-read-timeout", "60s")], "not a number of seconds"),
            (vec![("backend-protocol", "FCGI")], "is not HTTP"),
            (vec![("configuration-snippet", "http-request deny")], "snippet annotations are off"),
            (vec![("stream-snippet", "x")], "no meaning in HAProxy"),
        ] {
            let got = refused(&pairs);
            assert!(got.contains(want), "{pairs:?}: {got}");
        }
    }

    #[test]
    fn unsupported_keys_warn_and_our_prefix_wins() {
        let mut a = ann(&[("enable-cors", "true"), ("proxy-body-size", "1m")]);
        a.insert(format!("{HAPTIC_PREFIX}proxy-body-size"), "2m".into());
        a.insert("other.example.com/whatever".into(), "x".into());
        let (m, warnings) = read(&a, false, Allowed::default()).unwrap();
        assert_eq!(m.policy.max_body, Some(2 << 20));
        let w: Vec<String> = warnings.iter().map(|r| format!("{}: {}", r.field, r.reason)).collect();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w.iter().any(|w| w.contains("enable-cors]: not supported")), "{w:?}");
        assert!(
            w.iter().any(|w| w.contains("nginx.ingress.kubernetes.io/proxy-body-size]: ignored: haptic.dev/")),
            "{w:?}"
        );
    }

    #[test]
    fn allowed_snippets_are_checked_and_indented() {
        let on = Allowed { snippets: true };
        let (m, _) = read(
            &ann(&[("configuration-snippet", "http-response set-header X-A 1\n\n  timeout server 5s")]),
            false,
            on,
        )
        .unwrap();
        assert_eq!(m.backend.snippet.as_deref(), Some("    http-response set-header X-A 1\n    timeout server 5s\n"));
        let e = read(&ann(&[("server-snippet", "http-request set-header X %[env(HOME)]")]), false, on).unwrap_err();
        assert!(e[0].reason.contains("reads the environment"), "{e:?}");
    }

    #[test]
    fn explain_names_each_key_and_what_happens_to_it() {
        let mut a = ann(&[
            ("permanent-redirect", "https://example.com/"),
            ("permanent-redirect-code", "308"),
            ("enable-cors", "true"),
            ("proxy-body-size", "huge"),
            ("configuration-snippet", "http-request deny"),
        ]);
        a.insert("kubernetes.io/ingress.class".into(), "nginx".into());
        let rows = explain(&a, false, Allowed::default());
        let got: BTreeMap<&str, &Status> =
            rows.iter().map(|r| (r.key.strip_prefix(NGINX_PREFIX).unwrap(), &r.status)).collect();
        assert_eq!(got.len(), 5, "only our prefixes: {rows:?}");
        assert!(matches!(got["permanent-redirect"], Status::Honoured(m) if m.contains("301")));
        assert!(matches!(got["permanent-redirect-code"], Status::Honoured(_)));
        assert_eq!(got["enable-cors"], &Status::NotSupported);
        assert!(matches!(got["proxy-body-size"], Status::Refused(r) if r.contains("not a size")));
        assert!(matches!(got["configuration-snippet"], Status::Refused(r) if r.contains("off")));
    }

    #[test]
    fn a_report_names_each_annotation_and_the_rules() {
        let mut ing = k8s_openapi::api::networking::v1::Ingress::default();
        ing.metadata.name = Some("shop".into());
        ing.metadata.namespace = Some("web".into());
        ing.metadata.annotations = Some(ann(&[("whitelist-source-range", "10.0.0.0/8"), ("enable-cors", "true")]));
        let r = report(&ing, Allowed::default());
        assert!(r.served);
        let text = report_text(&[r]);
        assert!(text.starts_with("Ingress web/shop (served)\n"), "{text}");
        assert!(
            text.contains("honoured      nginx.ingress.kubernetes.io/whitelist-source-range=\"10.0.0.0/8\""),
            "{text}"
        );
        assert!(text.contains("NOT SUPPORTED nginx.ingress.kubernetes.io/enable-cors"), "{text}");
        assert!(
            text.contains("http-request deny deny_status 403 if { var(txn.policy) -m str p1 } !{ src 10.0.0.0/8 }"),
            "{text}"
        );
        assert!(text.ends_with("1 Ingresses: 1 would be served, 0 refused; 1 unsupported annotations\n"), "{text}");
    }

    #[test]
    fn every_supported_key_is_documented_once() {
        let mut keys: Vec<&str> = SUPPORTED.iter().map(|(k, _)| *k).collect();
        keys.sort();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n);
    }
}
