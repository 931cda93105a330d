//! The Model: what HAProxy is to serve, independent of which API (Ingress, Gateway API) said so.
//!
//! Owns the types between translators and the map builder/templates: frontends and binds, TLS
//! certificates, host → path → rule tables, rules → backends, backends → named server slots.
//! It must never hold config text built from an object: names here are ours or checked by the
//! translator, and the template quotes every object value through `haptic_haproxy::quote`.
//! Every source says what a rule does in the same types: a [`Rule`] names its backend and its
//! [`Policy`] (every filter: source ranges, limits, redirects, header and path changes,
//! timeouts), a [`PathRewrite`] is one type whichever API asked for it, and a redirect one
//! [`Redirect`]. The policy types rules and backends carry ([`Policy`], [`BackendOptions`] and
//! their parts) are defined here, so the template and the map builder never depend on a
//! source: a source fills them in.

use serde::Serialize;

use std::net::IpAddr;

/// Everything one render serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Model {
    /// Listening frontends.
    pub frontends: Vec<Frontend>,
    /// TLS certificates, selected by SNI from their names.
    pub certs: Vec<Cert>,
    /// PEM files for TLS towards backends (CA bundles, client certificates) and the CA bundles
    /// binds check clients' certificates against: written under `certs/`, never served as a
    /// bind's certificate.
    pub upstream_certs: Vec<Cert>,
    /// Host tables, exact hosts first, then wildcards, then the catch-all.
    pub hosts: Vec<HostTable>,
    /// Route rules by id.
    pub rules: Vec<Rule>,
    /// The rule used when no host/path matches (an Ingress `defaultBackend`).
    pub default_rule: Option<RuleId>,
    /// Backends with their server slots, sorted by name.
    pub backends: Vec<Backend>,
    /// The distinct non-empty policies rules use, each one namespace's, by id (`p` and hex digits
    /// of its namespace and content).
    pub policies: Vec<PolicyEntry>,
    /// The userlists basic authentication checks against, sorted by name.
    pub userlists: Vec<Userlist>,
    /// Hosts whose TLS connections pass through to a backend by SNI (`ssl-passthrough`), sorted.
    pub passthrough: Vec<Passthrough>,
    /// The distinct canary selectors rules use, by id (`c` and hex digits of its content).
    pub canaries: Vec<CanaryEntry>,
    /// The distinct path rewrites rules use, by id (`w` and hex digits of its content).
    pub rewrites: Vec<RewriteEntry>,
    /// Where the `health` frontend (`/healthz`, `/ready`) listens, if anywhere.
    pub health: Option<std::net::SocketAddr>,
    /// Matches with a method, header or query condition (and the path matches that outrank
    /// them on their host), in the order HAProxy tries them: config rules keyed by host id.
    pub matches: Vec<MatchRule>,
    /// Rules whose requests a random draw by weight sends to one of their sub-rules (each with
    /// its own backend and policy).
    pub splits: Vec<Split>,
    /// Whether request paths are normalised before routing.
    pub paths: PathNormalization,
    /// What every request meets before it is routed (logs, forwarded headers, timeouts, …).
    pub edge: crate::edge::Edge,
}

/// What HAProxy does to a request's path before it is routed (and before the backend sees it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub enum PathNormalization {
    /// Decode percent-escapes of unreserved characters, upper-case the others, merge repeated
    /// slashes and resolve `.` and `..` segments (`http-request normalize-uri`), so `//admin`,
    /// `/%61dmin`, `/./admin` and `/x/../admin` are all routed, and served, as `/admin`. As
    /// ingress-nginx routes them.
    #[default]
    Normalize,
    /// Route the path exactly as the client sent it.
    Off,
}

/// A rule split among sub-rules by weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Split {
    /// The rule the matches select.
    pub rule: RuleId,
    /// Sub-rules with the upper bound (exclusive) of their share of `0..total`.
    pub picks: Vec<(RuleId, u32)>,
    /// The sum of the weights.
    pub total: u32,
}

/// One match evaluated as a config rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MatchRule {
    /// The host table's id.
    pub host: String,
    /// Path condition (none: any path).
    pub path: Option<(PathKind, String)>,
    /// Method (upper case, a token).
    pub method: Option<String>,
    /// Headers (name lowercased, a token; value exact).
    pub headers: Vec<(String, String)>,
    /// Query parameters (name a token; value exact).
    pub query: Vec<(String, String)>,
    /// The rule it selects.
    pub rule: RuleId,
}

/// A header modifier's operations, in the order applied: set, add, remove.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct HeaderOps {
    /// Replace (or add).
    pub set: Vec<(String, String)>,
    /// Append.
    pub add: Vec<(String, String)>,
    /// Remove.
    pub remove: Vec<String>,
}

impl HeaderOps {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.add.is_empty() && self.remove.is_empty()
    }
}

/// A path replacement.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum PathRewrite {
    /// The whole path.
    Full(String),
    /// The matched prefix (its length in bytes) by this.
    Prefix {
        /// Bytes of the matched prefix.
        matched: usize,
        /// The replacement.
        with: String,
    },
    /// The path matching `pattern` by `with`.
    Regex {
        /// The pattern, anchored at the start (checked; pattern text, quoted by the template).
        pattern: String,
        /// The `replace-path` format (`\1`…`\9` for groups; quoted by the template).
        with: String,
    },
}

/// A frontend, its binds and how its requests find their host table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Frontend {
    /// Our name (`http`, `https`, `gateway`).
    pub name: String,
    /// Where it listens.
    pub binds: Vec<Bind>,
    /// How a request's host table is found.
    pub hosts: HostLookup,
}

/// How a frontend's requests find their host table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub enum HostLookup {
    /// By the Host header alone: an exact host, else a one-label wildcard
    /// ([`HostMatch::Wildcard`]), else the catch-all (`maps/hosts.map`, `maps/wildcards.map`).
    #[default]
    Host,
    /// By the Host header and the listener the request arrived on (keys `host@bind port`): an
    /// exact host, else the longest suffix ([`HostMatch::Suffix`]), else the listener's
    /// catch-all (`maps/hosts.map`, `maps/suffixes.map`).
    Listener(Listeners),
    /// As [`HostLookup::Listener`], by the SNI of a TLS ClientHello instead of a Host header:
    /// the frontend is `mode tcp` and passes each connection, undecrypted, to the backend of
    /// its host table's `/` entry (a Gateway's TLS listeners). A connection whose host table
    /// belongs to a listener that terminates TLS goes first, with its original destination in
    /// the PROXY protocol, to a `mode tcp` frontend that decrypts it with the listener's
    /// certificates and finds the same table by the SNI it decrypted.
    Sni(Vec<TlsTermination>),
    /// By the listener port alone (its catch-all table, `@<port>`): the frontend is `mode tcp`
    /// and passes each connection to the backend of that table's `/` entry (a Gateway's TCP
    /// listeners).
    Port,
}

/// The TLS listeners of one bind port of a [`HostLookup::Sni`] frontend that terminate TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TlsTermination {
    /// The bind port.
    pub port: u16,
    /// Their certificate files (the first one answers a name none of them names).
    pub certs: Vec<String>,
    /// Their host tables' ids (`maps/tls_terminate.map`).
    pub tables: Vec<String>,
}

/// The listeners of a [`HostLookup::Listener`] frontend.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Listeners {
    /// Bind port → the listener port it serves (`maps/ports.map`): what redirects name.
    pub ports: Vec<(u16, u16)>,
    /// The HTTPS listeners: a request whose Host selects another listener than its SNI is
    /// answered 421 (`maps/listeners.map`, `maps/listener_suffixes.map`).
    pub tls: Vec<TlsListener>,
}

/// An HTTPS listener as SNI and Host select it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct TlsListener {
    /// Its bind port.
    pub port: u16,
    /// Its hostname (`None`: any host).
    pub host: Option<HostMatch>,
    /// Its id, a map value only.
    pub id: String,
}

/// One listening address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Bind {
    /// IP address to bind.
    pub address: std::net::IpAddr,
    /// Port.
    pub port: u16,
    /// TLS with every [`Cert`] of the model (or [`Bind::certs`] when not empty).
    pub tls: bool,
    /// The certificate paths of this bind only (empty: every certificate).
    pub certs: Vec<String>,
    /// Clients' certificates checked against a CA file, when asked.
    pub clients: Option<ClientVerify>,
}

/// How a TLS bind checks clients' certificates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientVerify {
    /// The CA bundle's path in the tree.
    pub ca_file: String,
    /// A client without a valid certificate is refused (`verify required`); otherwise every
    /// client is let through, with a certificate or not, valid or not (an insecure fallback).
    pub required: bool,
}

/// A PEM bundle (certificate chain and key) written under `certs/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cert {
    /// Relative path (`certs/<namespace>_<name>.pem`).
    pub path: String,
    /// The hosts that named it (HAProxy selects by the certificate's own names).
    pub hosts: Vec<String>,
    /// Where it came from.
    pub source: ObjectRef,
    /// The bytes: certificates (and key) re-encoded by [`crate::pem`], nothing else.
    #[serde(skip)]
    pub pem: Vec<u8>,
    /// The earliest notAfter of its certificates, in seconds since the Unix epoch.
    #[serde(skip)]
    pub not_after: i64,
}

/// How a host is matched.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum HostMatch {
    /// Exactly this (lowercase) host.
    Exact(String),
    /// `*.suffix`: exactly one label before `.suffix` (held without the `*`, as `.suffix`).
    Wildcard(String),
    /// `*.suffix` as Gateway API reads it: one or more labels before `.suffix` (held as
    /// `.suffix`), the longest suffix first.
    Suffix(String),
    /// Any host (a rule without `host`).
    Any,
}

/// The paths of one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostTable {
    /// The host.
    pub host: HostMatch,
    /// Our id for it (`h<n>`), a map value only.
    pub id: String,
    /// For Gateway API: the bind port whose requests it serves (keys end in `@<port>`).
    pub port: Option<u16>,
    /// Its paths, longest first.
    pub paths: Vec<PathEntry>,
    /// A request on it that no path matches answers 404 ([`NOT_FOUND_RULE`]) instead of going
    /// to [`Model::default_rule`] (which then belongs to another namespace).
    pub unmatched_not_found: bool,
}

/// How a path is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum PathKind {
    /// The whole path equals it.
    Exact,
    /// Segment-wise prefix: equal, or followed by `/`. Held without a trailing `/` (except `/`).
    Prefix,
    /// A case-insensitive regular expression matched from the path's start (checked by
    /// `haptic_haproxy::regex::check`).
    Regex,
}

/// One host/path → rule entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathEntry {
    /// Exact or prefix.
    pub kind: PathKind,
    /// The path.
    pub path: String,
    /// The rule it selects.
    pub rule: RuleId,
}

/// Declares an id: a map value and config word the translators make (never object text).
macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id `s`.
            pub fn new(s: impl Into<String>) -> Self {
                $name(s.into())
            }

            /// Its text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name(s)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name(s.to_string())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

id! {
    /// A rule id (`r` and hex digits of its host and path; `g` and those of its route in a
    /// Gateway; [`DEFAULT_RULE`] for the default backend's), a map value only: changing which
    /// rule a path selects changes maps only.
    RuleId
}

/// The rule of requests no host and path selects (an Ingress `defaultBackend`): the template
/// sets it when no map gave a rule.
pub const DEFAULT_RULE: &str = "default";

/// What a rule does: here, send to one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rule {
    /// The id.
    pub id: RuleId,
    /// The backend name (one of [`Model::backends`], or [`UNAVAILABLE`]).
    pub backend: String,
    /// The policy applied before the backend (one of [`Model::policies`]), if any.
    pub policy: Option<PolicyId>,
    /// The path rewrite applied before the backend (one of [`Model::rewrites`]), if any.
    pub rewrite: Option<String>,
    /// When the rule has a canary: `backend` is then the weighted backend holding both.
    pub canary: Option<RuleCanary>,
    /// The object that made it.
    pub source: ObjectRef,
}

id! {
    /// A policy id (`p` and hex digits), a map value only: which rules a policy applies to
    /// changes maps only.
    PolicyId
}

/// A policy and its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyEntry {
    /// The id.
    pub id: PolicyId,
    /// What it does.
    pub policy: Policy,
}

/// A host whose TLS connections go, undecrypted, to a `mode tcp` backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Passthrough {
    /// The host (exact, lowercase): the SNI it is chosen by, a map key.
    pub host: String,
    /// The backend (`<namespace>_<service>_<port>.tcp`).
    pub backend: String,
    /// The Ingress.
    pub source: ObjectRef,
}

/// A `userlist` section: users and their crypt(3) hashes from a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Userlist {
    /// Its name (`auth_<namespace>_<secret>`).
    pub name: String,
    /// (user, hash), checked (`crate::annotations::users`) and quoted by the template.
    pub users: Vec<(String, String)>,
    /// The Secret.
    pub source: ObjectRef,
}

/// A rule's canary: the two backends its weighted backend holds, and what selects one of them
/// outright.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleCanary {
    /// The main backend.
    pub main: String,
    /// The canary's backend.
    pub canary: String,
    /// The selector (one of [`Model::canaries`]), if any.
    pub selector: Option<String>,
}

/// A canary selector and its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CanaryEntry {
    /// The id (`c` and hex digits), a map value only.
    pub id: String,
    /// What it selects by.
    pub selector: CanarySelector,
}

/// A path rewrite and its id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct RewriteEntry {
    /// The id (`w` and hex digits), a map value only.
    pub id: String,
    /// What it does.
    pub rewrite: PathRewrite,
}

/// The backend that has no servers (HAProxy answers 503): a Service that is missing.
pub const UNAVAILABLE: &str = "haptic_unavailable";
/// The backend answering 404 when nothing matches and there is no default backend.
pub const NOT_FOUND: &str = "haptic_not_found";
/// The rule id of a request answered 404: no rule has it, so `maps/rules.map` gives
/// [`NOT_FOUND`].
pub const NOT_FOUND_RULE: &str = "not_found";
/// The backend answering 500: a Gateway API rule whose backends are all invalid or missing.
pub const ERROR_500: &str = "haptic_error_500";

/// A backend: one Service port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Backend {
    /// `<namespace>_<service>_<port>` (Kubernetes names are DNS labels; still quoted in config).
    pub name: String,
    /// Its server slots in slot order.
    pub servers: Vec<Server>,
    /// What the Ingresses naming it set (timeouts, protocol, a checked snippet).
    pub options: BackendOptions,
}

/// One named server slot (`SRV_<n>`, from 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Server {
    /// `SRV_<n>`.
    pub name: String,
    /// The endpoint in it, or `None` for a spare slot (parked `disabled`).
    pub endpoint: Option<std::net::SocketAddr>,
    /// A serving but terminating endpoint: weight 0, no new traffic.
    pub draining: bool,
    /// Its weight when not the default (a canary's weighted backend); a runtime change.
    pub weight: Option<u16>,
    /// A `backup` server (`BAK_<n>`, a `default-backend` endpoint): used while no other is up.
    pub backup: bool,
}

/// A Kubernetes object by kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectRef {
    /// `Ingress`, `Secret`, …
    pub kind: String,
    /// Namespace (empty for cluster-scoped).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// What kind of refusal or remark a [`Refusal`] is: what status writers, reports and tests
/// decide by, never by its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Cause {
    /// The value is not valid (it does not parse, is out of range, or cannot be served as
    /// written).
    Invalid,
    /// The value is valid but not allowed here: the HAProxyConfig's admin has not allowed it
    /// (snippets, what a snippet reads), or it names another namespace's object or host.
    NotAllowed,
    /// Another object of the same namespace already routes or sets it (a host and path, the
    /// default backend, a passthrough host, a backend set up differently).
    Conflict,
    /// An object it names does not exist.
    Missing,
    /// The gate's `haproxy -c` refuses the part of the config it brings (a snippet).
    GateRefused,
    /// It, or a Secret it names, is left out of renders: with it the render failed
    /// `haproxy -c` (the controller's narrowing decides which objects).
    LeftOut,
    /// A remark: the value is applied with a difference from ingress-nginx, or with a
    /// consequence worth knowing (a missing Service answers 503).
    Differs,
    /// A remark: haptic does not support the key, which is ignored.
    NotSupported,
    /// A remark: the key has no effect (another key wins, or one it needs is not set).
    Ignored,
}

/// One refused part of an object (or a remark on one): the kind, the field and a message for
/// people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The kind.
    pub cause: Cause,
    /// The field path (`spec.rules[0].http.paths[1].path`).
    pub field: String,
    /// Why, for people (status messages and Events); nothing decides by it.
    pub message: String,
}

impl Refusal {
    /// A refusal of `field` for `cause`.
    pub fn new(cause: Cause, field: impl Into<String>, message: impl Into<String>) -> Self {
        Refusal { cause, field: field.into(), message: message.into() }
    }

    /// The refusal of `field` for a [`Why`].
    pub fn at(field: impl Into<String>, why: Why) -> Self {
        Refusal { cause: why.cause, field: field.into(), message: why.message }
    }
}

/// A refusal not yet tied to a field: what a helper that reads a value or an object answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Why {
    /// The kind.
    pub cause: Cause,
    /// Why, for people.
    pub message: String,
}

impl Why {
    /// A `cause` with its message.
    pub fn new(cause: Cause, message: impl Into<String>) -> Self {
        Why { cause, message: message.into() }
    }

    /// An [`Cause::Invalid`] value.
    pub fn invalid(message: impl Into<String>) -> Self {
        Why::new(Cause::Invalid, message)
    }
}

/// The outcome for one object: accepted when `refusals` is empty; otherwise the named parts
/// were left out while everything else keeps deploying.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// The object.
    pub object: ObjectRef,
    /// What was refused.
    pub refusals: Vec<Refusal>,
    /// Non-fatal remarks (a missing Service answers 503).
    pub warnings: Vec<Refusal>,
}

impl Verdict {
    /// A verdict of `object` with nothing refused yet.
    pub fn of(object: ObjectRef) -> Self {
        Verdict { object, refusals: vec![], warnings: vec![] }
    }

    /// Nothing refused.
    pub fn accepted(&self) -> bool {
        self.refusals.is_empty()
    }

    /// Refused because it, or a Secret it names, is left out of renders.
    pub fn left_out(&self) -> bool {
        self.refusals.iter().any(|r| r.cause == Cause::LeftOut)
    }
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
pub enum Redirect {
    /// To this location (object text: quoted by the template).
    Location {
        /// Where to.
        location: String,
        /// 300–308.
        code: u16,
    },
    /// To the request's own URL with the parts given replaced.
    Rewrite {
        /// `http` / `https`, or the request's.
        scheme: Option<String>,
        /// Host, or the request's.
        hostname: Option<String>,
        /// Port, or as the scheme or listener says.
        port: Option<u16>,
        /// Path, or the request's (with its query).
        path: Option<PathRewrite>,
        /// 300–308.
        code: u16,
    },
}

impl Redirect {
    /// The status code.
    pub fn code(&self) -> u16 {
        match self {
            Redirect::Location { code, .. } | Redirect::Rewrite { code, .. } => *code,
        }
    }
}

/// What a rule does to a request before it reaches its backend, and to the backend's response:
/// the filters of any source (source ranges, limits, authentication, CORS, redirects, header
/// and path changes, timeouts, error pages). Rules of one namespace with equal policies share
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
    /// Request headers changed before the backend (names checked tokens, values object text
    /// quoted by the template).
    pub request_headers: HeaderOps,
    /// The Host header sent to the backend (object text: quoted by the template).
    pub host_rewrite: Option<String>,
    /// The path sent to the backend.
    pub path_rewrite: Option<PathRewrite>,
    /// The server timeout of the rule's requests, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Response headers changed before the client.
    pub response_headers: HeaderOps,
    /// CORS: preflights answered, response headers added.
    pub cors: Option<Cors>,
    /// Per client address request and concurrency limits (a stick table per policy).
    pub limit: Option<Limit>,
    /// HTTP basic authentication against a userlist.
    pub auth: Option<BasicAuth>,
    /// Backend responses with these statuses (400–599, sorted, distinct) are replaced by
    /// HAProxy's own response with the same status (`custom-http-errors`).
    pub error_pages: Vec<u16>,
    /// Copies of the request sent to other backends, their answers dropped.
    pub mirrors: Vec<Mirror>,
}

/// A copy of a rule's request (as its backend gets it: after the header, Host and path changes)
/// sent to another backend without waiting for it; what that backend answers is dropped.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Mirror {
    /// The backend the copy goes to (a backend of the Model).
    pub backend: String,
    /// The share of requests copied, `numerator` out of `denominator` (`None`: every request).
    pub share: Option<(u32, u32)>,
}

/// An origin CORS allows.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Origin {
    /// Any (`*`).
    Any,
    /// Exactly this `scheme://host[:port]` (object text: quoted by the template).
    Exact(String),
    /// `scheme://*.suffix[:port]`: a pattern built here from escaped literals, anchored.
    Pattern(String),
}

/// CORS as ingress-nginx answers it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Cors {
    /// The origins allowed.
    pub origins: Vec<Origin>,
    /// `Access-Control-Allow-Methods` (checked tokens, `, `-joined).
    pub methods: String,
    /// `Access-Control-Allow-Headers` (checked tokens).
    pub headers: String,
    /// `Access-Control-Expose-Headers` (checked tokens), if any.
    pub expose: Option<String>,
    /// `Access-Control-Allow-Credentials: true`.
    pub credentials: bool,
    /// `Access-Control-Max-Age`, seconds.
    pub max_age: u32,
    /// As the Gateway API's CORS filter: a `*` origin answers with the request's origin, `*`
    /// methods or headers answer a preflight with what it asked for (so credentials can go with
    /// them), and only preflights carry the methods and headers. Otherwise as ingress-nginx.
    pub reflect: bool,
}

/// Per client address limits: over either, 503.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Limit {
    /// Requests per second (`limit-rps`), measured over `window` seconds.
    pub rps: Option<u32>,
    /// The window, seconds (`limit-burst-multiplier`, default 5): up to `rps × window` requests
    /// in any `window` seconds, so a burst of that size passes and the sustained rate is `rps`.
    pub window: u32,
    /// Concurrent requests (`limit-connections`).
    pub connections: Option<u32>,
    /// Requests per minute (`limit-rpm`), measured over 60 seconds.
    pub rpm: Option<u32>,
    /// Sources neither counted nor refused (`limit-whitelist`).
    pub exempt: Vec<Cidr>,
}

/// HTTP basic authentication.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct BasicAuth {
    /// The userlist section's name (ours: `auth_<namespace>_<secret>`).
    pub userlist: String,
    /// The realm (printable ASCII without `"` or `\`; quoted by the template).
    pub realm: String,
}

impl Policy {
    /// Whether it does nothing.
    pub fn is_empty(&self) -> bool {
        // Field by field (a new field fails to compile here until it is added), without building
        // a default Policy per call: the render asks this of every route.
        let Policy {
            allow,
            deny,
            https_redirect,
            max_body,
            app_root,
            redirect,
            request_headers,
            host_rewrite,
            path_rewrite,
            timeout_ms,
            response_headers,
            cors,
            limit,
            auth,
            error_pages,
            mirrors,
        } = self;
        allow.is_none()
            && deny.is_empty()
            && !https_redirect
            && max_body.is_none()
            && app_root.is_none()
            && redirect.is_none()
            && request_headers.is_empty()
            && host_rewrite.is_none()
            && path_rewrite.is_none()
            && timeout_ms.is_none()
            && response_headers.is_empty()
            && cors.is_none()
            && limit.is_none()
            && auth.is_none()
            && error_pages.is_empty()
            && mirrors.is_empty()
    }
}

/// How HAProxy talks to a backend's servers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
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
    /// Cookie affinity.
    pub affinity: Option<Affinity>,
    /// TLS towards the servers with a CA and/or a client certificate from a Secret.
    pub upstream_tls: Option<UpstreamTls>,
    /// The backend takes TLS connections passed through (`mode tcp`), not HTTP.
    pub passthrough: bool,
    /// A Service of the same namespace whose endpoints are the backend's `backup` servers.
    pub fallback: Option<String>,
    /// Requests retried on connection failures and these answers.
    pub retry: Option<Retry>,
}

/// When and how often HAProxy tries a request again (`retry-on`, `retries`): on a failed
/// connection, an empty answer, and the answers with `codes`, at once, up to `attempts` times.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Retry {
    /// Statuses retried: each one `retry-on` knows ([`RETRY_CODES`]), sorted, distinct.
    pub codes: Vec<u16>,
    /// The most tries after the first.
    pub attempts: u32,
}

/// The statuses HAProxy's `retry-on` can retry on.
pub const RETRY_CODES: &[u16] = &[401, 403, 404, 408, 425, 500, 501, 502, 503, 504];

/// TLS towards a backend's servers, from `proxy-ssl-*` or a BackendTLSPolicy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UpstreamTls {
    /// The Secret's name (this Ingress's namespace; empty for a BackendTLSPolicy).
    pub secret: String,
    /// Verify the servers' certificates against the Secret's `ca.crt`.
    pub verify: bool,
    /// The name their certificates must carry (a DNS name).
    pub name: Option<String>,
    /// Send `name` as SNI.
    pub sni: bool,
    /// The name sent as SNI instead of `name`, when the two differ (a BackendTLSPolicy's
    /// `hostname` beside the subject alternative name it checks).
    pub sni_name: Option<String>,
    /// The CA bundle's path in the tree, once the translator read the Secret.
    pub ca_file: Option<String>,
    /// The client certificate's path in the tree (chain and key), once read.
    pub client_cert: Option<String>,
}

/// Sticky sessions by an inserted cookie whose value names the server slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Affinity {
    /// The cookie's name (an RFC 6265 token).
    pub name: String,
    /// Its `Max-Age`, seconds.
    pub max_age: Option<u32>,
    /// Its `Path` (printable ASCII, no blanks, `;` or `,`).
    pub path: Option<String>,
    /// `Secure` (`session-cookie-secure`).
    pub secure: bool,
    /// Its `SameSite`: `Strict`, `Lax` or `None`.
    pub same_site: Option<&'static str>,
}

/// Which requests a canary takes besides its weighted share: by header (`always`/`never`, or
/// equal to a value), then by cookie (`always`/`never`); the header decides first.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct CanarySelector {
    /// The header's name (`[A-Za-z0-9_-]`).
    pub header: Option<String>,
    /// The value that selects the canary (object text, quoted by the template; never `}`).
    pub header_value: Option<String>,
    /// A pattern the header's value matches to select the canary (checked by
    /// `haptic_haproxy::regex::check`; quoted by the template).
    pub header_pattern: Option<String>,
    /// The cookie's name (`[A-Za-z0-9_.-]`).
    pub cookie: Option<String>,
}

impl CanarySelector {
    /// Whether it selects nothing (weight only).
    pub fn is_empty(&self) -> bool {
        self.header.is_none() && self.cookie.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_is_empty_exactly_when_it_is_the_default() {
        assert!(Policy::default().is_empty());
        let set: [fn(&mut Policy); 9] = [
            |p| p.deny.push(Cidr { addr: IpAddr::from([10, 0, 0, 0]), len: 8 }),
            |p| p.https_redirect = true,
            |p| p.max_body = Some(1),
            |p| p.app_root = Some("/a".into()),
            |p| p.request_headers.remove.push("x".into()),
            |p| p.timeout_ms = Some(1),
            |p| p.response_headers.add.push(("x".into(), "y".into())),
            |p| p.error_pages.push(503),
            |p| p.mirrors.push(Mirror { backend: "b".into(), share: None }),
        ];
        for f in set {
            let mut p = Policy::default();
            f(&mut p);
            assert!(!p.is_empty(), "{p:?}");
            assert_ne!(p, Policy::default());
        }
    }
}
