//! Ingress annotations: the `nginx.ingress.kubernetes.io/*` keys ingress-nginx users bring, and
//! the same keys under haptic's own prefix `haptic.dev/*`, read into typed, validated meanings.
//!
//! Owns which keys are supported ([`SUPPORTED`]), what each value may be, and what the Ingress
//! gets from them: a [`Policy`] for its routes (redirects, source ranges, body size, error
//! pages), and [`BackendOptions`] for the backends it names (timeouts, protocol, a checked
//! snippet). A value that does not parse refuses the Ingress (serving it without, say, its
//! source range would open what its author closed); a key with either prefix that is not
//! supported is a warning naming it, never silently dropped. Snippet keys are refused unless the
//! admin allowed them, and then pass [`haptic_haproxy::snippet::check`]. It must never hand on
//! object text unchecked: every value leaves here parsed (numbers, addresses, codes) or as text
//! the template quotes.

use std::collections::BTreeMap;

use serde::Serialize;

pub use crate::model::{
    Affinity, BackendOptions, BasicAuth, CanarySelector, Cidr, Cors, Limit, Origin, Policy, Protocol, Redirect,
    UpstreamTls,
};
use crate::model::{Cause, Refusal};

pub use self::handlers::{Annotation, SUPPORTED};
use self::handlers::{Entry, Reading};
use haptic_haproxy::quote::{config_arg, log_format_arg};

use crate::template::{
    cookie_line, minute_table_of, our_id, policy_lines_of, response_lines_of, server_params, table_line, table_of,
    MINUTE_TABLE,
};
use crate::RenderError;

mod handlers;
mod values;

/// ingress-nginx's annotation prefix.
pub const NGINX_PREFIX: &str = "nginx.ingress.kubernetes.io/";
/// haptic's own prefix, with the same keys and meanings.
pub const HAPTIC_PREFIX: &str = "haptic.dev/";

/// The most distinct statuses `custom-http-errors` may list.
pub const MAX_ERROR_PAGES: usize = 50;

/// Snippet keys ingress-nginx has that have no HAProxy meaning: always refused.
const NGINX_ONLY_SNIPPETS: &[&str] = &["stream-snippet", "auth-snippet", "modsecurity-snippet"];

/// What the admin allows objects to bring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allowed {
    /// `configuration-snippet` / `server-snippet` (still checked).
    pub snippets: bool,
}

/// What `auth-type: basic` asks for, before its Secret is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthRequest {
    /// The Secret's name (this Ingress's namespace).
    pub secret: String,
    /// `auth-file` (key `auth`, htpasswd lines) or `auth-map` (user → hash).
    pub map: bool,
    /// The realm.
    pub realm: String,
    /// The annotation naming the Secret, for a refusal.
    pub field: String,
}

/// How an Ingress's paths are read and rewritten.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathOptions {
    /// Prefix and ImplementationSpecific paths are regular expressions (`use-regex`, or implied
    /// by `rewrite-target`).
    pub regex: bool,
    /// The path sent to the backend, as HAProxy's `replace-path` format: `\1`…`\9` for the
    /// path regex's groups, every other byte literal (quoted by the template).
    pub rewrite: Option<String>,
    /// Extra hosts served with the same paths (`server-alias`).
    pub aliases: Vec<crate::model::HostMatch>,
}

/// A canary Ingress's meaning: its share and selectors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Canary {
    /// Its share of requests is `weight / total`.
    pub weight: u32,
    /// See `weight`.
    pub total: u32,
    /// Header and cookie selection.
    pub selector: CanarySelector,
}

/// What one Ingress's annotations mean.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meaning {
    /// When set, the Ingress is a canary of another one's host/paths.
    pub canary: Option<Canary>,
    /// For its routes.
    pub policy: Policy,
    /// For the backends it names.
    pub backend: BackendOptions,
    /// For its paths.
    pub paths: PathOptions,
    /// Basic authentication, whose Secret the translator reads.
    pub auth: Option<AuthRequest>,
}

/// The annotation's field path in a [`Refusal`].
fn field(full_key: &str) -> String {
    format!("metadata.annotations[{full_key}]")
}

/// The field path of the annotation `short` under ingress-nginx's prefix, where the Ingress's
/// own annotations are not at hand.
pub(crate) fn field_of_key(short: &str) -> String {
    field(&format!("{NGINX_PREFIX}{short}"))
}

/// The field path of the annotation `short` as `meta` sets it (`haptic.dev/` when both are set).
pub(crate) fn field_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, short: &str) -> String {
    set_field(meta, short).unwrap_or_else(|| field_of_key(short))
}

/// The field path of the annotation `short` when `meta` sets it under either prefix
/// (`haptic.dev/` first).
pub(crate) fn set_field(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    short: &str,
) -> Option<String> {
    let set = meta.annotations.as_ref()?;
    [HAPTIC_PREFIX, NGINX_PREFIX]
        .into_iter()
        .map(|p| format!("{p}{short}"))
        .find(|k| set.contains_key(k))
        .map(|k| field(&k))
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
    let keys = ours(annotations, &mut warnings);
    let mut r = Reading { keys, has_tls, allowed, m: Meaning::default(), errors: Vec::new(), warnings };
    let set: Vec<(&str, (&str, &str))> = r.keys.iter().map(|(s, kv)| (*s, *kv)).collect();
    for (short, (key, raw)) in set {
        match handlers::handler(short) {
            Some(read) => read(&mut r, Entry { short, key, raw }),
            None if NGINX_ONLY_SNIPPETS.contains(&short) => r.bad(key, "this snippet has no meaning in HAProxy".into()),
            None => {
                let why = match short {
                    s if s.starts_with("auth-tls-") => " (client certificates are not read)",
                    _ => "",
                };
                r.unsupported(key, format!("not supported by haptic: ignored{why}"))
            }
        }
    }
    passthrough_alone(&mut r);
    // As ingress-nginx: plain HTTP to an Ingress with TLS is redirected to HTTPS unless
    // `ssl-redirect` says "false" (a passthrough Ingress's HTTPS is its backend's own).
    if has_tls && !r.keys.contains_key("ssl-redirect") && !r.m.backend.passthrough {
        r.m.policy.https_redirect = true;
    }
    if r.errors.is_empty() {
        Ok((r.m, r.warnings))
    } else {
        Err(r.errors)
    }
}

/// The keys with our prefixes: key (unprefixed) → (full key, value); haptic.dev wins over
/// nginx, with a warning when the two differ.
fn ours<'a>(
    annotations: &'a BTreeMap<String, String>,
    warnings: &mut Vec<Refusal>,
) -> BTreeMap<&'a str, (&'a str, &'a str)> {
    let mut keys: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for (k, v) in annotations {
        for prefix in [NGINX_PREFIX, HAPTIC_PREFIX] {
            let Some(short) = k.strip_prefix(prefix) else { continue };
            match keys.get(short) {
                Some((other, ov)) if prefix == NGINX_PREFIX => {
                    if ov != v {
                        warnings.push(Refusal::new(
                            Cause::Ignored,
                            field(k),
                            format!("ignored: {other} is set too and wins"),
                        ));
                    }
                }
                Some((other, ov)) => {
                    if ov != v {
                        warnings.push(Refusal::new(
                            Cause::Ignored,
                            field(other),
                            format!("ignored: {k} is set too and wins"),
                        ));
                    }
                    keys.insert(short, (k, v));
                }
                None => {
                    keys.insert(short, (k, v));
                }
            }
        }
    }
    keys
}

/// `ssl-passthrough` passes TLS on as it is: nothing that acts on HTTP or on TLS towards the
/// backend can apply with it.
fn passthrough_alone(r: &mut Reading<'_>) {
    let b = &r.m.backend;
    if !b.passthrough {
        return;
    }
    if b.affinity.is_some() || b.upstream_tls.is_some() || b.protocol != Protocol::Http || b.snippet.is_some() {
        if let Some((full, _)) = r.keys.get("ssl-passthrough") {
            r.errors.push(Refusal {
                cause: Cause::Invalid,
                field: field(full),
                message: "ssl-passthrough passes TLS on as it is: affinity, backend-protocol, proxy-ssl-* and snippets cannot apply".into(),
            });
        }
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

/// Every annotation with one of our prefixes, and what haptic does with it, as [`read`] judges
/// the Ingress's annotations together.
pub fn explain(annotations: &BTreeMap<String, String>, has_tls: bool, allowed: Allowed) -> Vec<Explained> {
    fn ours(k: &str) -> Option<&str> {
        k.strip_prefix(NGINX_PREFIX).or_else(|| k.strip_prefix(HAPTIC_PREFIX))
    }
    // All keys are read together (one key's meaning can depend on another's: `canary-weight` on
    // `canary`, `cors-*` on `enable-cors`); the warnings of an Ingress with refused keys are
    // those of the others read without them.
    let (refused, warnings) = match read(annotations, has_tls, allowed) {
        Ok((_, w)) => (Vec::new(), w),
        Err(refused) => {
            let rest: BTreeMap<String, String> = annotations
                .iter()
                .filter(|(k, _)| !refused.iter().any(|r| r.field == field(k)))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let w = read(&rest, has_tls, allowed).map(|(_, w)| w).unwrap_or_default();
            (refused, w)
        }
    };
    let mut out = Vec::new();
    for (key, value) in annotations {
        let Some(short) = ours(key) else { continue };
        let prefix = &key[..key.len() - short.len()];
        let f = field(key);
        let status = match (refused.iter().find(|r| r.field == f), warnings.iter().find(|w| w.field == f)) {
            (Some(r), _) => Status::Refused(r.message.clone()),
            (None, Some(w)) if w.cause == Cause::NotSupported => Status::NotSupported,
            (None, Some(w)) if w.cause == Cause::Ignored => Status::Ignored(w.message.clone()),
            // Applied, with a remark (a Warning Event) on what differs from ingress-nginx.
            (None, Some(w)) => Status::Honoured(format!("{}; {}", meaning_of(short), w.message)),
            (None, None) => Status::Honoured(meaning_of(short)),
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
    let lines = |m: &Meaning| annotation_lines("p1", m).unwrap_or_else(|e| vec![format!("({e})")]);
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

/// The config lines an Ingress's annotations add, as the built-in template writes them: the
/// frontend's `http-request` rules for its routes (under the policy id `id`), then each
/// backend directive and server parameter (for `haptic-controller migrate`).
pub fn annotation_lines(id: &str, m: &Meaning) -> Result<Vec<String>, RenderError> {
    let mut out = policy_lines_of(id, &m.policy)?;
    if let Some(a) = &m.auth {
        out.push(format!(
            "http-request auth realm {} if {{ var({}) -m str {} }} !{{ http_auth(<the users of Secret {}>) }}",
            config_arg(&a.realm)?,
            crate::names::Var::Policy,
            our_id(id)?,
            a.secret
        ));
    }
    out.extend(response_lines_of(id, &m.policy)?);
    if let Some(l) = &m.policy.limit {
        out.push(format!("{} (in backend {})", table_line(l), table_of(&our_id(id)?)));
        if l.rpm.is_some() {
            out.push(format!("{MINUTE_TABLE} (in backend {})", minute_table_of(&our_id(id)?)));
        }
    }
    let o = &m.backend;
    out.extend(o.connect_timeout.map(|s| format!("timeout connect {s}s (backend)")));
    out.extend(o.server_timeout.map(|s| format!("timeout server {s}s (backend)")));
    let params = server_params(o)?;
    if !params.is_empty() {
        out.push(format!("server …{params} (every server of the backend)"));
    }
    if let Some(a) = &o.affinity {
        out.push(format!("{} (backend; each server gets `cookie <its name>`)", cookie_line(a)?));
    }
    if let Some(t) = &m.paths.rewrite {
        out.push(format!(
            "http-request replace-path '^(?i:<path>)' {} (per path, for the route's rewrite id)",
            log_format_arg(t)?
        ));
    }
    out.extend(o.snippet.iter().flat_map(|s| s.lines().map(|l| format!("{} (backend)", l.trim()))));
    Ok(out)
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
    SUPPORTED.iter().find(|a| a.key == short).map(|a| a.meaning.to_string()).unwrap_or_default()
}

/// Why an authentication Secret's users cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsersError {
    /// An `auth-file` Secret without the key `auth`.
    #[error("the Secret has no key `auth`")]
    NoAuthKey,
    /// Its `auth` is not UTF-8.
    #[error("the Secret's `auth` is not UTF-8")]
    NotUtf8,
    /// A line (1-based) of `auth` is not `user:hash`.
    #[error("line {0}: not user:hash")]
    NotUserHash(usize),
    /// No user at all.
    #[error("the Secret names no user")]
    NoUser,
    /// A user name outside letters, digits and `._@+-` (cut to 64 characters).
    #[error("{0:?} is not a user name (letters, digits, '._@+-')")]
    BadUserName(String),
    /// An Apache MD5 or SHA1 hash, which crypt(3) cannot check.
    #[error(
        "user {0}: an Apache MD5 or SHA1 hash, which crypt(3) cannot check: make it with `htpasswd -B` or `openssl passwd -6`"
    )]
    ApacheHash(String),
    /// Not a crypt(3) hash HAProxy's `userlist` takes.
    #[error("user {0}: not a crypt(3) hash ($1$, $5$, $6$, $2y$/$2b$ bcrypt, $y$ yescrypt)")]
    NotCrypt(String),
}

/// The users of an auth Secret's data (`auth-file`: key `auth` with `user:hash` lines;
/// `auth-map`: user → hash), sorted, or why not. Only crypt(3) hashes HAProxy's `userlist` can
/// check are accepted.
pub fn users(data: &BTreeMap<String, Vec<u8>>, map: bool) -> Result<Vec<(String, String)>, UsersError> {
    let mut out = Vec::new();
    if map {
        for (u, h) in data {
            out.push((u.clone(), String::from_utf8_lossy(h).trim().to_string()));
        }
    } else {
        let text = data.get("auth").ok_or(UsersError::NoAuthKey)?;
        let text = std::str::from_utf8(text).map_err(|_| UsersError::NotUtf8)?;
        for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#')) {
            let (u, h) = l.trim().split_once(':').ok_or(UsersError::NotUserHash(i + 1))?;
            out.push((u.to_string(), h.to_string()));
        }
    }
    if out.is_empty() {
        return Err(UsersError::NoUser);
    }
    for (u, h) in &out {
        let user_ok =
            !u.is_empty() && u.len() <= 64 && u.bytes().all(|b| b.is_ascii_alphanumeric() || b"._@+-".contains(&b));
        if !user_ok {
            return Err(UsersError::BadUserName(u.chars().take(64).collect()));
        }
        if h.starts_with("$apr1$") || h.starts_with("{SHA}") {
            return Err(UsersError::ApacheHash(u.clone()));
        }
        let crypt = ["$1$", "$5$", "$6$", "$2a$", "$2b$", "$2y$", "$y$", "$7$"].iter().any(|p| h.starts_with(p));
        let chars = h.len() <= 512 && h.bytes().all(|b| b.is_ascii_alphanumeric() || b"./$=,+-".contains(&b));
        if !crypt || !chars {
            return Err(UsersError::NotCrypt(u.clone()));
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
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

    /// The annotations refused (unprefixed key) and why.
    fn refused(pairs: &[(&str, &str)]) -> Vec<(String, Cause)> {
        let e = read(&ann(pairs), true, Allowed::default()).unwrap_err();
        e.iter().map(|r| (key_of(&r.field), r.cause)).collect()
    }

    /// The unprefixed key of an annotation's field path.
    fn key_of(field: &str) -> String {
        let key = field.strip_prefix("metadata.annotations[").and_then(|f| f.strip_suffix(']')).unwrap_or(field);
        key.strip_prefix(NGINX_PREFIX).or_else(|| key.strip_prefix(HAPTIC_PREFIX)).unwrap_or(key).to_string()
    }

    #[test]
    fn each_supported_key_has_its_meaning() {
        assert!(ok(&[("ssl-redirect", "true")]).policy.https_redirect);
        // As ingress-nginx: an Ingress with TLS redirects unless told not to.
        assert!(ok(&[]).policy.https_redirect);
        assert!(!ok(&[("ssl-redirect", "false")]).policy.https_redirect);
        assert!(!read(&ann(&[]), false, Allowed::default()).unwrap().0.policy.https_redirect);
        assert!(!ok(&[("ssl-passthrough", "true")]).policy.https_redirect);
        assert!(!read(&ann(&[("ssl-redirect", "true")]), false, Allowed::default()).unwrap().0.policy.https_redirect);
        assert!(
            read(&ann(&[("force-ssl-redirect", "true")]), false, Allowed::default()).unwrap().0.policy.https_redirect
        );
        let r = ok(&[("permanent-redirect", "https://example.com/new"), ("permanent-redirect-code", "308")]);
        assert_eq!(
            r.policy.redirect,
            Some(Redirect::Location { location: "https://example.com/new".into(), code: 308 })
        );
        assert_eq!(ok(&[("temporal-redirect", "/elsewhere")]).policy.redirect.unwrap().code(), 302);
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
            (vec![("ssl-redirect", "yes")], ("ssl-redirect", Cause::Invalid)),
            (vec![("permanent-redirect", "javascript:alert(1)")], ("permanent-redirect", Cause::Invalid)),
            (vec![("permanent-redirect", "https://a/\nb")], ("permanent-redirect", Cause::Invalid)),
            (
                vec![("permanent-redirect", "https://a"), ("permanent-redirect-code", "200")],
                ("permanent-redirect-code", Cause::Invalid),
            ),
            (vec![("app-root", "app")], ("app-root", Cause::Invalid)),
            (vec![("whitelist-source-range", "10.0.0.0/33")], ("whitelist-source-range", Cause::Invalid)),
            (vec![("whitelist-source-range", "everyone")], ("whitelist-source-range", Cause::Invalid)),
            (vec![("proxy-body-size", "8x")], ("proxy-body-size", Cause::Invalid)),
            (vec![("proxy-read-timeout", "60s")], ("proxy-read-timeout", Cause::Invalid)),
            (vec![("backend-protocol", "FCGI")], ("backend-protocol", Cause::Invalid)),
            (vec![("configuration-snippet", "http-request deny")], ("configuration-snippet", Cause::NotAllowed)),
            (vec![("stream-snippet", "x")], ("stream-snippet", Cause::Invalid)),
        ] {
            let got = refused(&pairs);
            assert!(got.iter().any(|(k, c)| (k.as_str(), *c) == want), "{pairs:?}: {got:?}");
        }
    }

    #[test]
    fn unsupported_keys_warn_and_our_prefix_wins() {
        let mut a = ann(&[("mirror-target", "https://m.example"), ("proxy-body-size", "1m")]);
        a.insert(format!("{HAPTIC_PREFIX}proxy-body-size"), "2m".into());
        a.insert("other.example.com/whatever".into(), "x".into());
        let (m, warnings) = read(&a, false, Allowed::default()).unwrap();
        assert_eq!(m.policy.max_body, Some(2 << 20));
        let w: Vec<(&str, Cause)> = warnings.iter().map(|r| (r.field.as_str(), r.cause)).collect();
        assert_eq!(
            w,
            [
                ("metadata.annotations[nginx.ingress.kubernetes.io/proxy-body-size]", Cause::Ignored),
                ("metadata.annotations[nginx.ingress.kubernetes.io/mirror-target]", Cause::NotSupported),
            ],
            "{warnings:?}"
        );
        // One that people ask for.
        let (_, w) = read(&ann(&[("auth-tls-secret", "ns/ca")]), false, Allowed::default()).unwrap();
        assert_eq!(w[0].cause, Cause::NotSupported, "{w:?}");
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
        assert_eq!(
            (e[0].field.as_str(), e[0].cause),
            (field(&format!("{NGINX_PREFIX}server-snippet")).as_str(), Cause::NotAllowed),
            "{e:?}"
        );
    }

    #[test]
    fn explain_names_each_key_and_what_happens_to_it() {
        let mut a = ann(&[
            ("permanent-redirect", "https://example.com/"),
            ("permanent-redirect-code", "308"),
            ("mirror-target", "https://m.example"),
            ("proxy-body-size", "huge"),
            ("configuration-snippet", "http-request deny"),
        ]);
        a.insert("kubernetes.io/ingress.class".into(), "nginx".into());
        let rows = explain(&a, false, Allowed::default());
        let got: BTreeMap<&str, &Status> =
            rows.iter().map(|r| (r.key.strip_prefix(NGINX_PREFIX).unwrap(), &r.status)).collect();
        assert_eq!(got.len(), 5, "only our prefixes: {rows:?}");
        assert!(matches!(got["permanent-redirect"], Status::Honoured(_)));
        assert!(matches!(got["permanent-redirect-code"], Status::Honoured(_)));
        assert_eq!(got["mirror-target"], &Status::NotSupported);
        assert!(matches!(got["proxy-body-size"], Status::Refused(_)));
        assert!(matches!(got["configuration-snippet"], Status::Refused(_)));
    }

    #[test]
    fn explain_judges_keys_that_depend_on_others_together() {
        let a = ann(&[
            ("canary", "true"),
            ("canary-weight", "20"),
            ("enable-cors", "true"),
            ("cors-max-age", "60"),
            ("session-cookie-name", "x"),
            ("limit-burst-multiplier", "0"),
            ("limit-rps", "5"),
        ]);
        let rows = explain(&a, false, Allowed::default());
        let got: BTreeMap<&str, &Status> =
            rows.iter().map(|r| (r.key.strip_prefix(NGINX_PREFIX).unwrap(), &r.status)).collect();
        assert!(matches!(got["canary-weight"], Status::Honoured(_)), "{got:?}");
        assert!(matches!(got["cors-max-age"], Status::Honoured(_)), "{got:?}");
        assert!(matches!(got["session-cookie-name"], Status::Ignored(_)), "{got:?}");
        assert!(matches!(got["limit-burst-multiplier"], Status::Refused(_)), "{got:?}");
        assert!(matches!(got["limit-rps"], Status::Honoured(_)), "{got:?}");
    }

    #[test]
    fn a_report_names_each_annotation_and_the_rules() {
        let mut ing = k8s_openapi::api::networking::v1::Ingress::default();
        ing.metadata.name = Some("shop".into());
        ing.metadata.namespace = Some("web".into());
        ing.metadata.annotations =
            Some(ann(&[("whitelist-source-range", "10.0.0.0/8"), ("mirror-target", "https://m.example")]));
        let r = report(&ing, Allowed::default());
        assert!(r.served);
        let text = report_text(&[r]);
        assert!(text.starts_with("Ingress web/shop (served)\n"), "{text}");
        assert!(
            text.contains("honoured      nginx.ingress.kubernetes.io/whitelist-source-range=\"10.0.0.0/8\""),
            "{text}"
        );
        assert!(text.contains("NOT SUPPORTED nginx.ingress.kubernetes.io/mirror-target"), "{text}");
        assert!(
            text.contains("http-request deny deny_status 403 if { var(txn.policy) -m str p1 } !{ src 10.0.0.0/8 }"),
            "{text}"
        );
        assert!(text.ends_with("1 Ingresses: 1 would be served, 0 refused; 1 unsupported annotations\n"), "{text}");
    }

    #[test]
    fn regex_rewrite_vhost_and_aliases() {
        let m = ok(&[("rewrite-target", "/$2"), ("upstream-vhost", "Internal.example:8080")]);
        assert_eq!(m.paths.rewrite.as_deref(), Some("/\\2"));
        assert!(m.paths.regex, "rewrite-target implies use-regex");
        assert_eq!(m.policy.host_rewrite.as_deref(), Some("internal.example:8080"));
        assert!(ok(&[("use-regex", "true")]).paths.regex);
        assert!(!ok(&[("use-regex", "false")]).paths.regex);
        assert_eq!(ok(&[("rewrite-target", "/a%b/$1x")]).paths.rewrite.as_deref(), Some("/a%b/\\1x"));
        let a = ok(&[("server-alias", "www.example.com, *.shop.example.com,www.example.com")]).paths.aliases;
        assert_eq!(
            a,
            [
                crate::model::HostMatch::Exact("www.example.com".into()),
                crate::model::HostMatch::Wildcard(".shop.example.com".into())
            ]
        );
        for (pairs, want) in [
            (vec![("rewrite-target", "/$host")], ("rewrite-target", Cause::Invalid)),
            (vec![("rewrite-target", "/$12")], ("rewrite-target", Cause::Invalid)),
            (vec![("rewrite-target", "/a\\1")], ("rewrite-target", Cause::Invalid)),
            (vec![("rewrite-target", "/a?b=1")], ("rewrite-target", Cause::Invalid)),
            (vec![("rewrite-target", "https://x/")], ("rewrite-target", Cause::Invalid)),
            (vec![("rewrite-target", "/a b")], ("rewrite-target", Cause::Invalid)),
            (vec![("use-regex", "yes")], ("use-regex", Cause::Invalid)),
            (vec![("upstream-vhost", "a b")], ("upstream-vhost", Cause::Invalid)),
            (vec![("upstream-vhost", "%[env(HOME)]")], ("upstream-vhost", Cause::Invalid)),
            (vec![("server-alias", "a b.example")], ("server-alias", Cause::Invalid)),
            (vec![("server-alias", " , ")], ("server-alias", Cause::Invalid)),
        ] {
            let got = refused(&pairs);
            assert!(got.iter().any(|(k, c)| (k.as_str(), *c) == want), "{pairs:?}: {got:?}");
        }
    }

    #[test]
    fn cookie_affinity() {
        let a = ok(&[("affinity", "cookie")]).backend.affinity.unwrap();
        let plain =
            Affinity { name: "INGRESSCOOKIE".into(), max_age: None, path: None, secure: false, same_site: None };
        assert_eq!(a, plain);
        let a = ok(&[
            ("affinity", "cookie"),
            ("affinity-mode", "persistent"),
            ("session-cookie-name", "route"),
            ("session-cookie-expires", "172800"),
            ("session-cookie-max-age", "3600"),
            ("session-cookie-path", "/app"),
            ("session-cookie-secure", "true"),
            ("session-cookie-samesite", "lax"),
        ])
        .backend
        .affinity
        .unwrap();
        assert_eq!(
            a,
            Affinity {
                name: "route".into(),
                max_age: Some(3600),
                path: Some("/app".into()),
                secure: true,
                same_site: Some("Lax")
            }
        );
        assert_eq!(
            ok(&[("affinity", "cookie"), ("session-cookie-expires", "60")]).backend.affinity.unwrap().max_age,
            Some(60)
        );
        for (pairs, want) in [
            (vec![("affinity", "ip")], ("affinity", Cause::Invalid)),
            (vec![("affinity", "cookie"), ("session-cookie-name", "a b")], ("session-cookie-name", Cause::Invalid)),
            (vec![("affinity", "cookie"), ("session-cookie-name", "a;b")], ("session-cookie-name", Cause::Invalid)),
            (
                vec![("affinity", "cookie"), ("session-cookie-expires", "1h")],
                ("session-cookie-expires", Cause::Invalid),
            ),
            (
                vec![("affinity", "cookie"), ("session-cookie-path", "/a;Domain=x")],
                ("session-cookie-path", Cause::Invalid),
            ),
            (vec![("affinity", "cookie"), ("session-cookie-secure", "yes")], ("session-cookie-secure", Cause::Invalid)),
            (
                vec![("affinity", "cookie"), ("session-cookie-samesite", "Lax; Domain=x")],
                ("session-cookie-samesite", Cause::Invalid),
            ),
            (vec![("affinity-mode", "sticky")], ("affinity-mode", Cause::Invalid)),
        ] {
            let got = refused(&pairs);
            assert!(got.iter().any(|(k, c)| (k.as_str(), *c) == want), "{pairs:?}: {got:?}");
        }
        let (_, w) = read(&ann(&[("session-cookie-name", "x")]), false, Allowed::default()).unwrap();
        assert_eq!(w[0].cause, Cause::Ignored, "{w:?}");
    }

    #[test]
    fn cors_limits_and_basic_auth() {
        let c = ok(&[("enable-cors", "true")]).policy.cors.unwrap();
        assert_eq!((c.origins.clone(), c.credentials, c.max_age), (vec![Origin::Any], true, 1_728_000));
        assert!(c.methods.starts_with("GET, PUT"));
        let c = ok(&[
            ("enable-cors", "true"),
            ("cors-allow-origin", "https://a.example, https://*.b.example:8443"),
            ("cors-allow-methods", "GET,POST"),
            ("cors-allow-headers", "X-A, x-b"),
            ("cors-expose-headers", "X-Total"),
            ("cors-allow-credentials", "false"),
            ("cors-max-age", "60"),
        ])
        .policy
        .cors
        .unwrap();
        assert_eq!(
            c.origins,
            [Origin::Exact("https://a.example".into()), Origin::Pattern("^https://[^/]+\\.b\\.example:8443$".into())]
        );
        assert_eq!((c.methods.as_str(), c.headers.as_str()), ("GET, POST", "X-A, x-b"));
        assert_eq!((c.expose.as_deref(), c.credentials, c.max_age), (Some("X-Total"), false, 60));
        let l = ok(&[("limit-rps", "10"), ("limit-burst-multiplier", "3"), ("limit-connections", "4")]).policy.limit;
        assert_eq!(l, Some(Limit { rps: Some(10), window: 3, connections: Some(4), rpm: None, exempt: vec![] }));
        let l = ok(&[("limit-rpm", "120"), ("limit-whitelist", "10.0.0.0/8, ::1")]).policy.limit.unwrap();
        assert_eq!((l.rps, l.rpm), (None, Some(120)));
        assert_eq!(l.exempt.iter().map(ToString::to_string).collect::<Vec<_>>(), ["10.0.0.0/8", "::1/128"]);
        let (_, w) = read(&ann(&[("limit-whitelist", "10.0.0.0/8")]), false, Allowed::default()).unwrap();
        assert_eq!(w[0].cause, Cause::Ignored, "{w:?}");
        assert_eq!(ok(&[("limit-connections", "2")]).policy.limit.unwrap().rps, None);
        let a = ok(&[("auth-type", "basic"), ("auth-secret", "users"), ("auth-realm", "Shop only")]).auth.unwrap();
        assert_eq!((a.secret.as_str(), a.realm.as_str(), a.map), ("users", "Shop only", false));
        assert!(
            ok(&[("auth-type", "basic"), ("auth-secret", "u"), ("auth-secret-type", "auth-map")]).auth.unwrap().map
        );
        for (pairs, want) in [
            (
                vec![("enable-cors", "true"), ("cors-allow-origin", "javascript:x")],
                ("cors-allow-origin", Cause::Invalid),
            ),
            (
                vec![("enable-cors", "true"), ("cors-allow-origin", "https://a b")],
                ("cors-allow-origin", Cause::Invalid),
            ),
            (vec![("enable-cors", "true"), ("cors-allow-methods", "GET;rm")], ("cors-allow-methods", Cause::Invalid)),
            (vec![("enable-cors", "true"), ("cors-max-age", "-1")], ("cors-max-age", Cause::Invalid)),
            (vec![("limit-rps", "0")], ("limit-rps", Cause::Invalid)),
            (vec![("limit-rpm", "1m")], ("limit-rpm", Cause::Invalid)),
            (vec![("limit-rps", "1"), ("limit-whitelist", "everyone")], ("limit-whitelist", Cause::Invalid)),
            (vec![("limit-rps", "1"), ("limit-burst-multiplier", "0")], ("limit-burst-multiplier", Cause::Invalid)),
            (vec![("auth-type", "digest")], ("auth-type", Cause::Invalid)),
            (vec![("auth-type", "basic")], ("auth-type", Cause::Invalid)),
            (vec![("auth-type", "basic"), ("auth-secret", "other/users")], ("auth-secret", Cause::Invalid)),
            (
                vec![("auth-type", "basic"), ("auth-secret", "u"), ("auth-realm", "a\"b")],
                ("auth-realm", Cause::Invalid),
            ),
        ] {
            let got = refused(&pairs);
            assert!(got.iter().any(|(k, c)| (k.as_str(), *c) == want), "{pairs:?}: {got:?}");
        }
        let (_, w) = read(&ann(&[("cors-max-age", "5"), ("auth-realm", "x")]), false, Allowed::default()).unwrap();
        assert_eq!(w.len(), 2, "{w:?}");
    }

    #[test]
    fn auth_secrets_hold_crypt_hashes_only() {
        let file = |t: &str| BTreeMap::from([("auth".to_string(), t.as_bytes().to_vec())]);
        let u = users(&file("bob:$2y$05$abcdefghijklmnopqrstuv\n# c\n\nalice:$6$salt$hash/x.\n"), false).unwrap();
        assert_eq!(u.iter().map(|(u, _)| u.as_str()).collect::<Vec<_>>(), ["alice", "bob"]);
        let map = BTreeMap::from([("carol".to_string(), b"$5$s$h".to_vec())]);
        assert_eq!(users(&map, true).unwrap(), [("carol".to_string(), "$5$s$h".to_string())]);
        for (text, want) in [
            ("a:$apr1$abcd$oTxW9", UsersError::ApacheHash("a".into())),
            ("a:{SHA}abc=", UsersError::ApacheHash("a".into())),
            ("a:plain", UsersError::NotCrypt("a".into())),
            ("a:$6$s$h 'x'", UsersError::NotCrypt("a".into())),
            ("a b:$6$s$h", UsersError::BadUserName("a b".into())),
            ("# c\nnocolon", UsersError::NotUserHash(2)),
            ("", UsersError::NoUser),
        ] {
            assert_eq!(users(&file(text), false), Err(want), "{text:?}");
        }
        assert_eq!(users(&BTreeMap::new(), false), Err(UsersError::NoAuthKey));
        let latin1 = BTreeMap::from([("auth".to_string(), vec![b'a', b':', 0xff])]);
        assert_eq!(users(&latin1, false), Err(UsersError::NotUtf8));
    }

    #[test]
    fn proxy_ssl() {
        let t = ok(&[
            ("backend-protocol", "HTTPS"),
            ("proxy-ssl-secret", "shop/upstream"),
            ("proxy-ssl-verify", "on"),
            ("proxy-ssl-name", "Backend.Internal"),
            ("proxy-ssl-server-name", "on"),
        ])
        .backend
        .upstream_tls
        .unwrap();
        assert_eq!(
            (t.secret.as_str(), t.verify, t.name.as_deref(), t.sni),
            ("shop/upstream", true, Some("backend.internal"), true)
        );
        assert!(!ok(&[("proxy-ssl-secret", "s")]).backend.upstream_tls.unwrap().verify);
        for (pairs, want) in [
            (vec![("proxy-ssl-secret", "a/b/c")], ("proxy-ssl-secret", Cause::Invalid)),
            (vec![("proxy-ssl-secret", "s"), ("proxy-ssl-verify", "yes")], ("proxy-ssl-verify", Cause::Invalid)),
            (vec![("proxy-ssl-secret", "s"), ("proxy-ssl-name", "*.x")], ("proxy-ssl-name", Cause::Invalid)),
            (vec![("proxy-ssl-secret", "s"), ("proxy-ssl-server-name", "on")], ("proxy-ssl-secret", Cause::Invalid)),
        ] {
            let got = refused(&pairs);
            assert!(got.iter().any(|(k, c)| (k.as_str(), *c) == want), "{pairs:?}: {got:?}");
        }
        let (_, w) = read(&ann(&[("proxy-ssl-verify", "on")]), false, Allowed::default()).unwrap();
        assert_eq!(w[0].cause, Cause::Ignored, "{w:?}");
    }

    #[test]
    fn canary_selectors() {
        let c = ok(&[
            ("canary", "true"),
            ("canary-weight", "20"),
            ("canary-by-header", "X-Beta"),
            ("canary-by-header-pattern", "^(a|b)$"),
            ("canary-by-cookie", "beta"),
        ])
        .canary
        .unwrap();
        assert_eq!((c.weight, c.total), (20, 100));
        assert_eq!(c.selector.header_pattern.as_deref(), Some("^(a|b)$"));
        assert_eq!(c.selector.cookie.as_deref(), Some("beta"));
        for (pairs, want) in [
            (vec![("canary", "true"), ("canary-weight", "101")], ("canary-weight", Cause::Invalid)),
            (vec![("canary", "true"), ("canary-by-header", "X Y")], ("canary-by-header", Cause::Invalid)),
            (vec![("canary", "true"), ("canary-by-header-value", "v")], ("canary-by-header-value", Cause::Invalid)),
            (
                vec![("canary", "true"), ("canary-by-header", "X"), ("canary-by-header-pattern", "(a+)+")],
                ("canary-by-header-pattern", Cause::Invalid),
            ),
        ] {
            let got = refused(&pairs);
            assert!(got.iter().any(|(k, c)| (k.as_str(), *c) == want), "{pairs:?}: {got:?}");
        }
        let (_, w) = read(&ann(&[("canary-weight", "5")]), false, Allowed::default()).unwrap();
        assert_eq!(w[0].cause, Cause::Ignored, "{w:?}");
    }

    #[test]
    fn ssl_passthrough_takes_no_http_backend_options() {
        assert!(ok(&[("ssl-passthrough", "true")]).backend.passthrough);
        assert!(!ok(&[("ssl-passthrough", "false")]).backend.passthrough);
        for pairs in [
            vec![("ssl-passthrough", "true"), ("backend-protocol", "HTTPS")],
            vec![("ssl-passthrough", "true"), ("affinity", "cookie")],
        ] {
            assert_eq!(refused(&pairs), [("ssl-passthrough".to_string(), Cause::Invalid)], "{pairs:?}");
        }
        assert_eq!(refused(&[("ssl-passthrough", "on")]), [("ssl-passthrough".to_string(), Cause::Invalid)]);
    }

    #[test]
    fn custom_http_errors_are_statuses_from_400_to_599() {
        let (m, w) = read(&ann(&[("custom-http-errors", "503, 404 ,503,500")]), false, Allowed::default()).unwrap();
        assert_eq!(m.policy.error_pages, [404, 500, 503]);
        assert!(w.is_empty(), "every one has a HAProxy page: {w:?}");
        assert_eq!(ok(&[("custom-http-errors", "599")]).policy.error_pages, [599]);
        let mut a = BTreeMap::new();
        a.insert(format!("{HAPTIC_PREFIX}custom-http-errors"), "502".to_string());
        assert_eq!(read(&a, false, Allowed::default()).unwrap().0.policy.error_pages, [502]);
        let fifty: Vec<String> = (400..450).map(|c: u16| c.to_string()).collect();
        assert_eq!(ok(&[("custom-http-errors", &fifty.join(","))]).policy.error_pages.len(), 50);
        let many: Vec<String> = (400..451).map(|c: u16| c.to_string()).collect();
        for v in [
            "399",
            "600",
            "200",
            "abc",
            "404,abc",
            "+404",
            "0404",
            "404;503",
            "404,,503",
            "404,",
            "",
            "  ",
            &many.join(","),
        ] {
            let got = refused(&[("custom-http-errors", v)]);
            assert_eq!(got, [("custom-http-errors".to_string(), Cause::Invalid)], "{v:?}");
        }
    }

    #[test]
    fn custom_http_errors_warn_where_they_differ_from_ingress_nginx() {
        // With default-backend: both apply, and the Ingress is told the pages are HAProxy's.
        let (m, w) =
            read(&ann(&[("custom-http-errors", "404,503"), ("default-backend", "errors")]), false, Allowed::default())
                .unwrap();
        assert_eq!((m.policy.error_pages.as_slice(), m.backend.fallback.as_deref()), (&[404, 503][..], Some("errors")));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].field, "metadata.annotations[nginx.ingress.kubernetes.io/custom-http-errors]");
        assert_eq!(w[0].cause, Cause::Differs, "{w:?}");
        // A status HAProxy has no page for: an empty body, said so.
        let (m, w) = read(&ann(&[("custom-http-errors", "418,503,451")]), false, Allowed::default()).unwrap();
        assert_eq!(m.policy.error_pages, [418, 451, 503]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(
            (w[0].field.as_str(), w[0].cause),
            ("metadata.annotations[nginx.ingress.kubernetes.io/custom-http-errors]", Cause::Differs),
            "{w:?}"
        );
        // migrate: honoured, with the remark.
        let rows =
            explain(&ann(&[("custom-http-errors", "503"), ("default-backend", "errors")]), false, Allowed::default());
        let row = rows.iter().find(|r| r.key.ends_with("custom-http-errors")).unwrap();
        assert!(
            matches!(&row.status, Status::Honoured(m) if m.contains("not the default-backend Service's")),
            "{row:?}"
        );
        let row = rows.iter().find(|r| r.key.ends_with("default-backend")).unwrap();
        assert!(matches!(&row.status, Status::Honoured(_)), "{row:?}");
    }

    #[test]
    fn custom_http_errors_render_as_returns_of_the_policy() {
        let m = read(&ann(&[("custom-http-errors", "503,404,418")]), false, Allowed::default()).unwrap().0;
        let lines = annotation_lines("p1", &m).unwrap();
        assert_eq!(
            lines,
            [
                "http-response return status 404 default-errorfiles if { var(txn.policy) -m str p1 } { status 404 }",
                "http-response return status 418 if { var(txn.policy) -m str p1 } { status 418 }",
                "http-response return status 503 default-errorfiles if { var(txn.policy) -m str p1 } { status 503 }",
            ]
        );
    }

    #[test]
    fn the_migration_guide_lists_every_supported_key_as_supported() {
        let doc = include_str!("../../../../../docs/migrating-from-ingress-nginx.md");
        let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `")).collect();
        for Annotation { key, .. } in SUPPORTED {
            let row = rows
                .iter()
                .find(|r| r.split(" | ").next().unwrap_or_default().contains(&format!("`{key}")))
                .unwrap_or_else(|| panic!("docs/migrating-from-ingress-nginx.md has no row for `{key}`"));
            assert!(row.contains("| supported"), "`{key}` is not marked supported: {row}");
        }
    }

    #[test]
    fn every_supported_key_is_documented_once() {
        let mut keys: Vec<&str> = SUPPORTED.iter().map(|a| a.key).collect();
        keys.sort();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n);
    }
}
