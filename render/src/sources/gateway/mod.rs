//! The Gateway API translator: the GatewayClass a fleet serves, its Gateways (with the ListenerSets
//! they admit, [`listener_sets`]) and the
//! HTTPRoutes, GRPCRoutes, TLSRoutes and TCPRoutes (the others lowered to the HTTPRoutes they
//! mean, [`grpc_route`], [`l4_routes`]) attached to them (with ReferenceGrants, Namespaces, Services,
//! EndpointSlices and the TLS Secrets listeners name) to the [`Model`] and to every status the
//! API defines.
//!
//! Owns the Gateway API semantics: listeners (HTTP, HTTPS terminating TLS from Secrets, TLS
//! passing connections through by SNI, TCP, hostnames, `allowedRoutes` by namespace `Same` / `All` / `Selector` and by kind), conflicts
//! between listeners of one port, attachment by `parentRefs` (name, `sectionName`, `port`),
//! hostname intersection (the more specific of listener and route hostname; a request goes to
//! the most specific listener of its port only), match precedence (Exact path, then the longest
//! prefix, then method, then most headers, then most query parameters, then the oldest route,
//! then `namespace/name`, then rule and match order), path / header / query / method matches,
//! the filters RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect and URLRewrite,
//! ReferenceGrants for cross-namespace backends and certificates, weighted backends (server
//! weights of one backend per rule, so a weight shift is a runtime change), 500 for a rule
//! whose backends are all invalid or missing, the stable bind port of each (Gateway, listener
//! port), the Service each Gateway gets (with the `spec.infrastructure` keys the admin allows;
//! the others are named in the Gateway's Accepted message), hostnames owned by namespace per
//! listener port when the admin asks ([`crate::ownership`]; off by default, attachment then
//! stays as the spec says), and the conditions with their reasons. Host/path
//! routing stays in maps: a route added, removed or retargeted changes maps only unless it
//! brings method, header or query matches or filters. It must never let one bad object
//! block the others, nor put a value into the Model that the map builder or the template
//! cannot quote.

use haptic_haproxy::names::{is_fetch_arg_name, is_section_name};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;

use self::api::*;
use crate::model::*;
use crate::ownership::{Claimant, HostSharing};
use crate::slots::{Endpoint, SlotMap};
use crate::sources::common::{obj, parse_host, parse_path, stable_id, SERVICE_NAME_LABEL};

mod addresses;
pub mod api;
mod assemble;
mod backend_tls;
mod ca_refs;
mod grpc_route;
mod l4_routes;
mod listener_sets;
mod listeners;
mod routes;

/// The controller name a GatewayClass must have for haptic to serve it.
pub const GATEWAY_CONTROLLER: &str = "haptic.dev/gateway-controller";
pub use backend_tls::PolicyOutcome;
pub use listener_sets::admits;
/// The extended features the translator implements (the GatewayClass's `supportedFeatures`,
/// with the core ones the suite expects listed too).
pub const SUPPORTED_FEATURES: &[&str] = &[
    "BackendTLSPolicy",
    "Gateway",
    "GatewayAddressEmpty",
    "GatewayBackendClientCertificate",
    "GatewayFrontendClientCertificateValidation",
    "GatewayFrontendClientCertificateValidationInsecureFallback",
    "GatewayHTTPListenerIsolation",
    "GatewayInfrastructure",
    "GatewayPort8080",
    "GatewayStaticAddresses",
    "HTTPRouteCORS",
    "GRPCRoute",
    "GRPCRouteNamedRouteRule",
    "TCPRoute",
    "TLSRoute",
    "TLSRouteModeMixed",
    "TLSRouteModeTerminate",
    "HTTPRoute",
    "HTTPRoute303RedirectStatusCode",
    "HTTPRoute307RedirectStatusCode",
    "HTTPRoute308RedirectStatusCode",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteBackendRequestHeaderModification",
    "HTTPRouteBackendTimeout",
    "HTTPRouteDestinationPortMatching",
    "GatewayHTTPSListenerDetectMisdirectedRequests",
    "HTTPRouteHostRewrite",
    "HTTPRouteMethodMatching",
    "HTTPRouteNamedRouteRule",
    "HTTPRouteParentRefPort",
    "HTTPRoutePathRedirect",
    "HTTPRoutePathRewrite",
    "HTTPRoutePortRedirect",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteRequestMirror",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteRequestPercentageMirror",
    "HTTPRouteRequestTimeout",
    "HTTPRouteResponseHeaderModification",
    "HTTPRouteRetry",
    "HTTPRouteSchemeRedirect",
    "ListenerSet",
    "ReferenceGrant",
];

/// Everything the Gateway translator reads.
#[derive(Debug, Clone, Default)]
pub struct GatewayInput {
    /// The class this fleet serves.
    pub class_name: String,
    /// GatewayClasses.
    pub classes: Vec<std::sync::Arc<GatewayClass>>,
    /// Gateways (those of other classes are ignored).
    pub gateways: Vec<std::sync::Arc<Gateway>>,
    /// ListenerSets (those whose parent is not a Gateway of the class are ignored).
    pub listener_sets: Vec<std::sync::Arc<ListenerSet>>,
    /// HTTPRoutes (those attached to no Gateway of the class get no status).
    pub routes: Vec<std::sync::Arc<HttpRoute>>,
    /// GRPCRoutes (likewise).
    pub grpc_routes: Vec<std::sync::Arc<GrpcRoute>>,
    /// TLSRoutes (likewise).
    pub tls_routes: Vec<std::sync::Arc<TlsRoute>>,
    /// TCPRoutes (likewise).
    pub tcp_routes: Vec<std::sync::Arc<TcpRoute>>,
    /// ReferenceGrants.
    pub grants: Vec<std::sync::Arc<ReferenceGrant>>,
    /// Namespaces (for `allowedRoutes.namespaces.selector`).
    pub namespaces: Vec<std::sync::Arc<Namespace>>,
    /// Services (backends, and the Gateways' own Services in the fleet's namespace).
    pub services: Vec<std::sync::Arc<Service>>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<std::sync::Arc<EndpointSlice>>,
    /// The Secrets listeners name.
    pub secrets: Vec<std::sync::Arc<Secret>>,
    /// BackendTLSPolicies.
    pub backend_tls_policies: Vec<std::sync::Arc<BackendTlsPolicy>>,
    /// ConfigMaps (the CA certificates BackendTLSPolicies name).
    pub config_maps: Vec<std::sync::Arc<ConfigMap>>,
    /// The last ACKed render's slot map (server slots and bind ports).
    pub previous_slots: SlotMap,
    /// Listening and slot settings.
    pub settings: GatewaySettings,
    /// Objects (HTTPRoutes, Secrets) left out of this render, each with why: a route is not
    /// accepted by any parent, a Secret is an unresolved certificate reference
    /// ([`crate::narrow`] decides which).
    pub excluded: BTreeMap<ObjectRef, crate::narrow::Exclusion>,
}

/// Listening and slot settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySettings {
    /// Address to bind.
    pub bind_address: IpAddr,
    /// The first bind port handed to a (Gateway, listener port).
    pub first_bind_port: u16,
    /// Minimum server slots per backend.
    pub min_slots: usize,
    /// The `health` frontend's port.
    pub health_port: Option<u16>,
    /// The fleet's namespace (where each Gateway's Service lives).
    pub namespace: String,
    /// What is done to request paths before routing.
    pub paths: crate::model::PathNormalization,
    /// What every request meets before it is routed (logs, forwarded headers, timeouts, …).
    pub edge: crate::edge::Edge,
    /// The `spec.infrastructure` label and annotation keys that pass to a Gateway's Service:
    /// exact keys, or prefixes written with a trailing `*` ([`infrastructure_key_allowed`]).
    pub infrastructure_keys: Vec<String>,
    /// `Shared` (the default): attachment as the spec says. `Namespace`: on each listener port,
    /// a hostname belongs to the namespace of the oldest HTTPRoute attached with it; routes of
    /// other namespaces are refused that hostname there ([`crate::ownership`]).
    pub host_sharing: HostSharing,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        GatewaySettings {
            bind_address: IpAddr::from([0, 0, 0, 0]),
            first_bind_port: 20000,
            min_slots: 8,
            health_port: None,
            namespace: "default".into(),
            paths: crate::model::PathNormalization::Normalize,
            edge: crate::edge::Edge::default(),
            infrastructure_keys: Vec::new(),
            host_sharing: HostSharing::Shared,
        }
    }
}

/// One condition as the API writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cond {
    /// Type.
    pub type_: &'static str,
    /// True or False.
    pub status: bool,
    /// Reason.
    pub reason: &'static str,
    /// Message.
    pub message: String,
    /// The object's generation this was decided for.
    pub observed_generation: i64,
}

/// The status of the served GatewayClass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClassStatus {
    /// Its name.
    pub name: String,
    /// Its UID (a class deleted and created again under its name is another object).
    pub uid: Option<String>,
    /// Conditions.
    pub conditions: Vec<Cond>,
    /// `status.supportedFeatures`.
    pub supported_features: Vec<&'static str>,
}

/// One listener's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListenerStatus {
    /// Its name.
    pub name: String,
    /// The route kinds it takes.
    pub supported_kinds: Vec<RouteGroupKind>,
    /// How many routes are attached.
    pub attached_routes: i32,
    /// Conditions.
    pub conditions: Vec<Cond>,
}

/// The Service a Gateway gets in the fleet's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GatewayService {
    /// Its name.
    pub name: String,
    /// Listener port → bind port.
    pub ports: Vec<(u16, u16)>,
    /// Labels from `spec.infrastructure`.
    pub labels: BTreeMap<String, String>,
    /// Annotations from `spec.infrastructure`.
    pub annotations: BTreeMap<String, String>,
    /// The static address it is asked to carry (the first of the Gateway's `spec.addresses`).
    pub address: Option<IpAddr>,
}

/// One Gateway's status and Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GatewayOutcome {
    /// The Gateway.
    pub object: ObjectRef,
    /// Its UID (owner of nothing: the Service lives in another namespace; for Events).
    pub uid: Option<String>,
    /// Conditions.
    pub conditions: Vec<Cond>,
    /// Listeners, in spec order.
    pub listeners: Vec<ListenerStatus>,
    /// How many ListenerSets it accepts (`status.attachedListenerSets`).
    pub attached_listener_sets: i32,
    /// `status.addresses` values (IP addresses).
    pub addresses: Vec<String>,
    /// Its Service.
    pub service: GatewayService,
}

/// One ListenerSet's status (those whose parent is a Gateway of the class).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListenerSetOutcome {
    /// The ListenerSet.
    pub object: ObjectRef,
    /// Its UID.
    pub uid: Option<String>,
    /// Conditions.
    pub conditions: Vec<Cond>,
    /// Listeners, in spec order (none when it is not accepted as a whole).
    pub listeners: Vec<ListenerStatus>,
}

/// One parent's entry in a route's status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParentStatus {
    /// The parentRef as written.
    pub parent_ref: ParentReference,
    /// Conditions.
    pub conditions: Vec<Cond>,
}

/// One route's status entries (only for parents that are Gateways of the served class or their
/// ListenerSets).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RouteOutcome {
    /// The route.
    pub object: ObjectRef,
    /// Its UID (a route deleted and created again under its name is another object).
    pub uid: Option<String>,
    /// Its entries.
    pub parents: Vec<ParentStatus>,
}

/// Everything a Gateway render decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayOutput {
    /// What HAProxy serves.
    pub model: Model,
    /// Slots (and bind ports) to keep.
    pub slots: SlotMap,
    /// The served class's status (none when the class is missing or not ours).
    pub class: Option<ClassStatus>,
    /// Other classes naming our controller whose status nobody has decided for their current
    /// generation: no fleet of this controller serves them (Accepted False, Pending).
    pub unserved: Vec<ClassStatus>,
    /// One per Gateway of the class.
    pub gateways: Vec<GatewayOutcome>,
    /// One per ListenerSet whose parent is one of them.
    pub listener_sets: Vec<ListenerSetOutcome>,
    /// One per HTTPRoute with a parent among them.
    pub routes: Vec<RouteOutcome>,
    /// One per BackendTLSPolicy.
    pub policies: Vec<PolicyOutcome>,
    /// One verdict per route and Gateway (for logs and Events).
    pub verdicts: Vec<Verdict>,
}

fn cond(type_: &'static str, status: bool, reason: &'static str, message: impl Into<String>, gen: i64) -> Cond {
    Cond { type_, status, reason, message: message.into(), observed_generation: gen }
}

/// Whether the admin's `patterns` (exact keys, or prefixes ending in `*`) let `key` pass.
pub fn infrastructure_key_allowed(patterns: &[String], key: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => key.starts_with(prefix),
        None => p == key,
    })
}

/// The labels and annotations of `spec.infrastructure` the `patterns` let pass, and the
/// fields of those they refuse (`spec.infrastructure.labels[<key>]`, sorted).
pub fn infrastructure(
    infra: Option<&GatewayInfrastructure>,
    patterns: &[String],
) -> (BTreeMap<String, String>, BTreeMap<String, String>, Vec<String>) {
    let (mut labels, mut annotations, mut refused) = (BTreeMap::new(), BTreeMap::new(), Vec::new());
    let Some(infra) = infra else { return (labels, annotations, refused) };
    for (field, from, to) in
        [("labels", &infra.labels, &mut labels), ("annotations", &infra.annotations, &mut annotations)]
    {
        for (k, v) in from {
            if infrastructure_key_allowed(patterns, k) {
                to.insert(k.clone(), v.clone());
            } else {
                refused.push(format!("spec.infrastructure.{field}[{k}]"));
            }
        }
    }
    (labels, annotations, refused)
}

/// The name of the Service of Gateway `ns/name` (a DNS label, at most 63 characters).
pub fn service_name(ns: &str, name: &str) -> String {
    let mut base: String = format!("{ns}-{name}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .take(36)
        .collect();
    while base.ends_with('-') {
        base.pop();
    }
    format!("gw-{base}-{}", stable_id("", &[ns, name]))
}

/// The name of the Service that stands for Gateway `name` in its own namespace (an
/// ExternalName alias of its Service): `<name>-gateway` when that is a Service name, else
/// `gw-<hash>`.
pub fn alias_name(name: &str) -> String {
    let n = format!("{name}-gateway");
    let label = n.len() <= 63
        && n.starts_with(|c: char| c.is_ascii_lowercase())
        && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if label {
        n
    } else {
        format!("gw-{}", stable_id("", &[name]))
    }
}

/// Whether a header value, path or host can go into config as a quoted word (no NUL, CR, LF;
/// not empty; not `}` alone, which closes an anonymous ACL).
fn is_word(s: &str) -> bool {
    !s.is_empty() && s != "}" && haptic_haproxy::quote::config_arg(s).is_ok()
}

fn labels_match(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    for (k, v) in sel.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return false;
        }
    }
    for e in sel.match_expressions.iter().flatten() {
        let vals = e.values.clone().unwrap_or_default();
        let ok = match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| vals.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !vals.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Whether a ReferenceGrant in `to_ns` lets a `from_kind` in `from_ns` refer to the
/// `to_kind` (core group) named `to_name`.
fn granted(
    grants: &[std::sync::Arc<ReferenceGrant>],
    from_kind: &str,
    from_ns: &str,
    to_kind: &str,
    to_ns: &str,
    to_name: &str,
) -> bool {
    grants.iter().filter(|g| g.metadata.namespace.as_deref() == Some(to_ns)).any(|g| {
        g.spec.from.iter().any(|f| f.group == GROUP && f.kind == from_kind && f.namespace == from_ns)
            && g.spec
                .to
                .iter()
                .any(|t| t.group.is_empty() && t.kind == to_kind && t.name.as_deref().is_none_or(|n| n == to_name))
    })
}

/// A listener after validation.
#[derive(Debug, Clone)]
struct Lst {
    name: String,
    port: u16,
    https: bool,
    hostname: Option<HostMatch>,
    /// Protocol supported and not conflicted: routes may attach.
    usable: bool,
    /// What the listener carries, and so which route kinds it takes.
    carries: Carries,
    /// A TLS listener that terminates TLS (for TLSRoutes) with its certificates.
    terminate: bool,
    /// The route kinds it takes.
    kinds: Vec<RouteKind>,
    from: FromNamespaces,
    selector: Option<LabelSelector>,
    certs: Vec<String>,
    /// How its bind checks clients' certificates, with the CA file (HTTPS listeners).
    clients: Option<(ClientVerify, Cert)>,
    /// The ListenerSet it comes from (`namespace/name`); none for a Gateway's own.
    set: Option<String>,
}

/// A ListenerSet whose parent is a Gateway of the class, decided.
struct Set<'a> {
    /// Its Gateway, among [`Gateways::gws`].
    gi: usize,
    /// The ListenerSet.
    ls: &'a ListenerSet,
    /// Its listeners, in spec order (none unless it is accepted).
    listeners: Vec<Lst>,
}

/// What a route's parentRef names: a Gateway or a ListenerSet (by index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parent {
    /// Among [`Gateways::gws`].
    Gateway(usize),
    /// Among [`Gateways::sets`].
    Set(usize),
}

/// What a listener carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carries {
    /// HTTP requests, in clear or over TLS it terminates: HTTPRoutes and GRPCRoutes.
    Http,
    /// TLS connections passed through by SNI: TLSRoutes.
    Sni,
    /// TCP connections: TCPRoutes.
    Tcp,
}

impl Carries {
    /// Whether a route of `kind` can attach to a listener that carries this.
    fn takes(self, kind: RouteKind) -> bool {
        match kind {
            RouteKind::Http | RouteKind::Grpc => self == Carries::Http,
            RouteKind::Tls => self == Carries::Sni,
            RouteKind::Tcp => self == Carries::Tcp,
        }
    }
}

/// The intersection of a listener hostname and a route hostname, if any.
fn intersect(listener: &Option<HostMatch>, route: &HostMatch) -> Option<HostMatch> {
    use HostMatch::*;
    let Some(l) = listener else { return Some(route.clone()) };
    let under = |h: &str, suffix: &str| h.ends_with(suffix) && h.len() > suffix.len();
    match (l, route) {
        (Exact(a), Exact(b)) => (a == b).then(|| l.clone()),
        (Exact(a), Suffix(s)) => under(a, s).then(|| l.clone()),
        (Suffix(s), Exact(b)) => under(b, s).then(|| route.clone()),
        (Suffix(s), Suffix(t)) => {
            if t == s || under(t, s) {
                Some(route.clone())
            } else if under(s, t) {
                Some(l.clone())
            } else {
                None
            }
        }
        (_, Any) => Some(l.clone()),
        _ => None,
    }
}

fn gateway_host(h: &str) -> Result<HostMatch, String> {
    Ok(match parse_host(h)? {
        HostMatch::Wildcard(s) => HostMatch::Suffix(s),
        other => other,
    })
}

/// Whether a request for a host matching `h` would rather go to a listener with hostname `l`
/// (more specific than the listener `own`).
fn claimed_by(h: &HostMatch, l: &Option<HostMatch>, own: &Option<HostMatch>) -> bool {
    let more_specific = match (l, own) {
        (Some(HostMatch::Exact(_)), Some(HostMatch::Exact(_))) | (None, _) => false,
        (Some(HostMatch::Exact(_)), _) => true,
        (Some(HostMatch::Suffix(a)), Some(HostMatch::Suffix(b))) => a.len() > b.len(),
        (Some(HostMatch::Suffix(_)), None) => true,
        _ => false,
    };
    more_specific && intersect(l, h).as_ref() == Some(h)
}

/// One (route, rule, match) ready to order.
#[derive(Debug, Clone)]
struct Candidate {
    key: (u8, std::cmp::Reverse<usize>, u8, std::cmp::Reverse<usize>, std::cmp::Reverse<usize>),
    order: (usize, usize, usize),
    path: (PathKind, String),
    method: Option<String>,
    headers: Vec<(String, String)>,
    query: Vec<(String, String)>,
    rule: RuleId,
}

/// A backend to plan: its endpoints, each endpoint's weight (when weighted) and how it is
/// spoken to.
type PlannedBackend = (Vec<Endpoint>, BTreeMap<SocketAddr, u32>, Speaks);

/// How the Gateway speaks to a backend: its protocol, and TLS as a BackendTLSPolicy asks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Speaks {
    protocol: Protocol,
    tls: Option<UpstreamTls>,
    /// The rule's retries (a backend of its own per Service port and retry).
    retry: Option<Retry>,
}

/// A rule's backends once resolved.
struct Resolved {
    /// (backend name, weight, endpoints, how it is spoken to)
    refs: Vec<(String, u32, Vec<Endpoint>, Speaks)>,
    /// The weight of refs that are invalid or missing.
    invalid_weight: u32,
    /// Every ref with a weight, in order: its backend (None: invalid or missing, answered
    /// with 500), weight and own request header operations.
    each: Vec<(Option<String>, u32, HeaderOps)>,
    /// The backends the rule's requests are copied to: (backend name, endpoints, how it is
    /// spoken to).
    mirrors: Vec<(String, Vec<Endpoint>, Speaks)>,
}

/// The Gateways of the class with their validated listeners and bind ports, and the indexes
/// routes are resolved against.
struct Gateways<'a> {
    input: &'a GatewayInput,
    /// The Gateways of the class, oldest first.
    gws: Vec<&'a Gateway>,
    /// Each Gateway's listeners, in spec order.
    listeners: Vec<Vec<Lst>>,
    /// The ListenerSets of those Gateways, in precedence order (the order of
    /// [`GatewayOutput::listener_sets`]).
    sets: Vec<Set<'a>>,
    /// Each (Gateway, listener port)'s bind port, by [`port_key`].
    bind_ports: BTreeMap<String, u16>,
    /// Namespace labels by name.
    ns_labels: BTreeMap<&'a str, BTreeMap<String, String>>,
    /// Services by (namespace, name).
    services: BTreeMap<(&'a str, &'a str), &'a Service>,
    /// EndpointSlices by (namespace, Service name from their label).
    slices: BTreeMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>,
    /// The BackendTLSPolicies, decided.
    tls: backend_tls::Policies,
    /// Each Gateway's client certificate for backends spoken to over TLS (its file's path).
    client_certs: Vec<Option<String>>,
}

/// What the listeners open and the attached routes add up to, before it becomes the Model.
#[derive(Default)]
struct Attached {
    /// (bind port, host) → candidates.
    tables: BTreeMap<(u16, HostMatch), Vec<Candidate>>,
    /// Bind port → listener port.
    ports: BTreeMap<u16, u16>,
    /// HTTPS bind port → certificate files.
    https_binds: BTreeMap<u16, Vec<String>>,
    /// (bind port, hostname, stable id) of each HTTPS listener.
    tls_listeners: Vec<TlsListener>,
    http_binds: BTreeSet<u16>,
    /// The bind ports of TLS Passthrough listeners.
    sni_binds: BTreeSet<u16>,
    /// The bind ports of TCP listeners.
    tcp_binds: BTreeSet<u16>,
    /// Bind port → the certificate files of its TLS listeners that terminate TLS.
    tls_terminate: BTreeMap<u16, Vec<String>>,
    /// The (bind port, host) tables of TLS listeners that terminate TLS.
    terminated: BTreeSet<(u16, HostMatch)>,
    /// The backends TLS and TCP connections pass through to (`mode tcp`).
    tcp_backends: BTreeSet<String>,
    /// Rule → (backend, route).
    rules: BTreeMap<RuleId, (String, ObjectRef)>,
    /// Rule → its filters, for the rules that have some.
    policies: BTreeMap<RuleId, Policy>,
    backends: BTreeMap<String, PlannedBackend>,
    splits: Vec<Split>,
    /// (bind port, hostname) → its owner, when hostnames belong to namespaces.
    owned: BTreeMap<(u16, HostMatch), Claimant>,
    /// HTTPS bind port → how it checks clients' certificates.
    clients: BTreeMap<u16, ClientVerify>,
    /// The CA files those checks read, by path.
    client_cas: BTreeMap<String, Cert>,
    /// The Gateways' client certificates for backends, by path.
    client_certs: BTreeMap<String, Cert>,
    /// (namespace, Service) → the Gateways (by index) whose attached routes send to it.
    reached: BTreeMap<(String, String), BTreeSet<usize>>,
}

impl Gateways<'_> {
    /// The Gateway a parent belongs to.
    fn gateway_of(&self, p: Parent) -> usize {
        match p {
            Parent::Gateway(gi) => gi,
            Parent::Set(si) => self.sets[si].gi,
        }
    }

    /// A parent's own listeners.
    fn listeners_of(&self, p: Parent) -> &[Lst] {
        match p {
            Parent::Gateway(gi) => &self.listeners[gi],
            Parent::Set(si) => &self.sets[si].listeners,
        }
    }

    /// Every listener on Gateway `gi`'s listener port `port`: its own and its ListenerSets'.
    fn on_port(&self, gi: usize, port: u16) -> impl Iterator<Item = &Lst> {
        let sets = self.sets.iter().filter(move |s| s.gi == gi).flat_map(|s| s.listeners.iter());
        self.listeners[gi].iter().chain(sets).filter(move |l| l.port == port)
    }
}

/// The key of a (Gateway, listener port) among the bind ports: `namespace/name:port`.
fn port_key(g: &Gateway, p: u16) -> String {
    format!("{}/{}:{p}", g.metadata.namespace.as_deref().unwrap_or(""), g.metadata.name.as_deref().unwrap_or(""))
}

/// The statuses of the other classes naming our controller that nobody has decided for their
/// current generation.
fn unserved(input: &GatewayInput) -> Vec<ClassStatus> {
    let mut out = Vec::new();
    for c in &input.classes {
        let name = c.metadata.name.clone().unwrap_or_default();
        if c.spec.controller_name != GATEWAY_CONTROLLER || name == input.class_name {
            continue;
        }
        let gen = c.metadata.generation.unwrap_or(0);
        let decided = c
            .status
            .as_ref()
            .is_some_and(|s| s.conditions.iter().any(|k| k.type_ == "Accepted" && k.observed_generation == Some(gen)));
        if !decided {
            out.push(ClassStatus {
                name,
                uid: c.metadata.uid.clone(),
                conditions: vec![cond("Accepted", false, "Pending", "no HAProxyConfig serves this class", gen)],
                supported_features: vec![],
            });
        }
    }
    out
}

/// Translates: the class's status, the Gateways' listeners and statuses
/// ([`listeners`]), each HTTPRoute attached to them ([`routes`]), then the Model and slot map
/// ([`assemble`]).
pub fn translate_gateway(input: &GatewayInput) -> GatewayOutput {
    let mut out = GatewayOutput::default();
    let class = input.classes.iter().find(|c| {
        c.metadata.name.as_deref() == Some(input.class_name.as_str()) && c.spec.controller_name == GATEWAY_CONTROLLER
    });
    let st = &input.settings;
    out.model.health = st.health_port.map(|p| SocketAddr::new(st.bind_address, p));
    out.model.paths = st.paths;
    out.model.edge = st.edge.clone();
    out.unserved = unserved(input);
    let Some(class) = class else {
        return out;
    };
    let cgen = class.metadata.generation.unwrap_or(0);
    out.class = Some(ClassStatus {
        name: input.class_name.clone(),
        uid: class.metadata.uid.clone(),
        conditions: vec![cond("Accepted", true, "Accepted", "served by haptic", cgen)],
        supported_features: SUPPORTED_FEATURES.to_vec(),
    });
    let mut gws: Vec<&Gateway> =
        input.gateways.iter().map(|g| &**g).filter(|g| g.spec.gateway_class_name == input.class_name).collect();
    gws.sort_by_key(|g| (g.metadata.creation_timestamp.as_ref().map(|t| t.0), obj("Gateway", &g.metadata)));
    let ns_labels: BTreeMap<&str, BTreeMap<String, String>> = input
        .namespaces
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n.metadata.labels.clone().unwrap_or_default())))
        .collect();
    let admitted = listener_sets::admit(input, &gws, &ns_labels);
    let bind_ports = listeners::bind_ports(input, &gws, &listener_sets::ports(&admitted));
    out.slots.bind_ports = bind_ports.clone();
    let mut certs: BTreeMap<String, Cert> = BTreeMap::new();
    let mut glisteners: Vec<Vec<Lst>> = Vec::new();
    let mut client_certs: Vec<Option<Cert>> = Vec::new();
    for g in &gws {
        let (ls, mut outcome) = listeners::gateway(input, g, &bind_ports, &mut certs);
        let (client, resolved) = listeners::backend_client_cert(input, g);
        outcome.conditions.push(resolved);
        client_certs.push(client);
        out.gateways.push(outcome);
        glisteners.push(ls);
    }
    let sets = listener_sets::decide(input, &gws, admitted, (&bind_ports, &mut certs), &mut out);
    let mut slices: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for sl in &input.endpoint_slices {
        let svc = sl.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).map(String::as_str);
        if let (Some(ns), Some(svc)) = (sl.metadata.namespace.as_deref(), svc) {
            slices.entry((ns, svc)).or_default().push(&**sl);
        }
    }
    let gw = Gateways {
        input,
        gws,
        listeners: glisteners,
        sets,
        bind_ports,
        ns_labels,
        services: input
            .services
            .iter()
            .filter_map(|s| Some(((s.metadata.namespace.as_deref()?, s.metadata.name.as_deref()?), &**s)))
            .collect(),
        slices,
        tls: backend_tls::Policies::decide(input),
        client_certs: client_certs.iter().map(|c| c.as_ref().map(|c| c.path.clone())).collect(),
    };
    let mut acc = Attached {
        client_certs: client_certs.into_iter().flatten().map(|c| (c.path.clone(), c)).collect(),
        ..Default::default()
    };
    listeners::binds(&gw, &mut acc);
    let lowered: Vec<grpc_route::Lowered> = input.grpc_routes.iter().map(|r| grpc_route::lower(r)).collect();
    let tls: Vec<HttpRoute> = input.tls_routes.iter().map(|r| l4_routes::lower_tls(r)).collect();
    let tcp: Vec<HttpRoute> = input.tcp_routes.iter().map(|r| l4_routes::lower_tcp(r)).collect();
    let mut all: Vec<routes::RouteIn<'_>> = input
        .routes
        .iter()
        .map(|route| routes::RouteIn { kind: RouteKind::Http, route, lowering: None })
        .chain(lowered.iter().map(|l| routes::RouteIn {
            kind: RouteKind::Grpc,
            route: &l.route,
            lowering: l.bad.clone(),
        }))
        .chain(tls.iter().map(|route| routes::RouteIn { kind: RouteKind::Tls, route, lowering: None }))
        .chain(tcp.iter().map(|route| routes::RouteIn { kind: RouteKind::Tcp, route, lowering: None }))
        .collect();
    // By age, every kind together: the older route wins a conflict.
    all.sort_by_key(|r| {
        (r.route.metadata.creation_timestamp.as_ref().map(|t| t.0), obj(r.kind.name(), &r.route.metadata))
    });
    for (rank, r) in all.into_iter().enumerate() {
        routes::route(&gw, rank, r, &mut acc, &mut out);
    }
    let gateways: Vec<ObjectRef> = out.gateways.iter().map(|g| g.object.clone()).collect();
    out.policies = gw.tls.outcomes(&acc.reached, &gateways);
    assemble::model(input, acc, (certs, gw.tls.files), &mut out);
    out.verdicts.sort_by(|a, b| a.object.cmp(&b.object));
    out
}

/// The backend a rule sends to: the one Service port's backend, a weighted backend of the
/// rule's own holding every endpoint of its backends, or the 500 backend.
fn rule_backend(
    ns: &str,
    route: &str,
    ri: usize,
    res: Resolved,
    backends: &mut BTreeMap<String, PlannedBackend>,
) -> String {
    if res.refs.is_empty() {
        return ERROR_500.to_string();
    }
    if res.refs.len() == 1 && res.invalid_weight == 0 {
        let (name, _, eps, speaks) = res.refs.into_iter().next().unwrap_or_default();
        backends.entry(name.clone()).or_insert((eps, BTreeMap::new(), speaks));
        return name;
    }
    // One backend for the rule: each endpoint weighted by its Service's share over its count.
    let name = format!("route_{ns}_{route}_{ri}");
    let name = if is_section_name(&name) { name } else { stable_id("route_", &[ns, route, &ri.to_string()]) };
    let shares: Vec<f64> = res.refs.iter().map(|(_, w, eps, _)| f64::from(*w) / eps.len().max(1) as f64).collect();
    let top = shares.iter().cloned().fold(0.0f64, f64::max).max(f64::MIN_POSITIVE);
    let mut eps_all: BTreeMap<SocketAddr, (bool, u32)> = BTreeMap::new();
    for ((_, _, eps, _), share) in res.refs.iter().zip(&shares) {
        let w = ((share / top) * 256.0).round().clamp(1.0, 256.0) as u32;
        for e in eps {
            let entry = eps_all.entry(e.addr).or_insert((e.draining, 0));
            entry.1 = (entry.1 + w).min(256);
        }
    }
    let speaks = res.refs[0].3.clone();
    let eps = eps_all.iter().map(|(a, (d, _))| Endpoint { addr: *a, draining: *d }).collect();
    let weights = eps_all.into_iter().map(|(a, (_, w))| (a, w)).collect();
    backends.insert(name.clone(), (eps, weights, speaks));
    name
}

/// A Gateway API duration (`1h`, `30s`, `500ms`, `1m30s`; at most four parts) in milliseconds.
pub fn duration_ms(s: &str) -> Result<u64, String> {
    let mut total: u64 = 0;
    let mut rest = s;
    let mut parts = 0;
    if s.is_empty() {
        return Err("an empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 5 {
            return Err(format!("{s:?} is not a duration"));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| format!("{s:?} is not a duration"))?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('s') {
            (1000, 1)
        } else {
            return Err(format!("{s:?} is not a duration"));
        };
        rest = &rest[len..];
        total += n * unit;
        parts += 1;
        if parts > 4 {
            return Err(format!("{s:?} has more than four parts"));
        }
    }
    Ok(total)
}

/// A match, checked and ordered by the API's precedence.
fn compile_match(m: &HttpRouteMatch) -> Result<Candidate, String> {
    let p = m.path.clone().unwrap_or_default();
    let kind = match p.type_.unwrap_or_default() {
        PathMatchType::Exact => PathKind::Exact,
        PathMatchType::PathPrefix => PathKind::Prefix,
        other => return Err(format!("path type {other} is not supported")),
    };
    let path = parse_path(kind, Some(p.value.as_deref().unwrap_or("/")))?;
    if !is_word(&path) {
        return Err(format!("path {path:?} cannot be written"));
    }
    let method = match &m.method {
        Some(mm) if is_fetch_arg_name(mm) => Some(mm.to_ascii_uppercase()),
        Some(mm) => return Err(format!("method {mm:?} is not a token")),
        None => None,
    };
    let mut headers = Vec::new();
    for h in &m.headers {
        if h.type_.clone().unwrap_or_default() != MatchType::Exact {
            return Err("only Exact header matches are supported".into());
        }
        if !is_fetch_arg_name(&h.name) || !is_word(&h.value) {
            return Err(format!("header {:?} cannot be matched", h.name));
        }
        let name = h.name.to_ascii_lowercase();
        // The first of two entries with one name counts (the API says so).
        if !headers.iter().any(|(n, _): &(String, String)| *n == name) {
            headers.push((name, h.value.clone()));
        }
    }
    let mut query = Vec::new();
    for q in &m.query_params {
        if q.type_.clone().unwrap_or_default() != MatchType::Exact {
            return Err("only Exact query parameter matches are supported".into());
        }
        if !is_fetch_arg_name(&q.name) || !is_word(&q.value) {
            return Err(format!("query parameter {:?} cannot be matched", q.name));
        }
        if !query.iter().any(|(n, _): &(String, String)| *n == q.name) {
            query.push((q.name.clone(), q.value.clone()));
        }
    }
    use std::cmp::Reverse;
    let key = (
        u8::from(kind != PathKind::Exact),
        Reverse(path.len()),
        u8::from(method.is_none()),
        Reverse(headers.len()),
        Reverse(query.len()),
    );
    Ok(Candidate {
        key,
        order: Default::default(),
        path: (kind, path),
        method,
        headers,
        query,
        rule: RuleId::default(),
    })
}

/// The rule's header operations, then a backend's own.
fn merge_ops(rule: &HeaderOps, backend: &HeaderOps) -> HeaderOps {
    let mut out = rule.clone();
    out.set.extend(backend.set.iter().cloned());
    out.add.extend(backend.add.iter().cloned());
    out.remove.extend(backend.remove.iter().cloned());
    out
}

fn header_ops(f: &HttpHeaderFilter) -> Result<HeaderOps, String> {
    let pair = |h: &HttpHeader| -> Result<(String, String), String> {
        if !is_fetch_arg_name(&h.name) || !is_word(&h.value) {
            return Err(format!("header {:?} cannot be written", h.name));
        }
        Ok((h.name.clone(), h.value.clone()))
    };
    let mut ops = HeaderOps {
        set: f.set.iter().map(pair).collect::<Result<_, _>>()?,
        add: f.add.iter().map(pair).collect::<Result<_, _>>()?,
        remove: vec![],
    };
    for r in &f.remove {
        if !is_fetch_arg_name(r) {
            return Err(format!("header {r:?} cannot be removed"));
        }
        ops.remove.push(r.clone());
    }
    Ok(ops)
}

fn path_modifier(p: &HttpPathModifier, prefix: Option<usize>) -> Result<PathRewrite, String> {
    match &p.type_ {
        PathModifierType::ReplaceFullPath => {
            let v = p.replace_full_path.clone().unwrap_or_else(|| "/".into());
            if !v.starts_with('/') || !is_word(&v) {
                return Err(format!("path {v:?} cannot be written"));
            }
            Ok(PathRewrite::Full(v))
        }
        PathModifierType::ReplacePrefixMatch => {
            let v = p.replace_prefix_match.clone().unwrap_or_else(|| "/".into());
            if !v.starts_with('/') || !is_word(&v) {
                return Err(format!("path {v:?} cannot be written"));
            }
            let Some(matched) = prefix else {
                return Err("ReplacePrefixMatch needs a PathPrefix match".into());
            };
            Ok(PathRewrite::Prefix { matched, with: v })
        }
        other => Err(format!("path modifier {other} is not supported")),
    }
}

/// A CORS filter as the policy answers it: preflights of an allowed origin answered here,
/// its responses with the CORS headers; wildcards reflect what the request sent.
fn cors(f: &HttpCorsFilter) -> Result<Cors, String> {
    let origins = crate::sources::common::origins(f.allow_origins.iter().map(String::as_str))?;
    let list = |what: &str, l: &[String]| -> Result<String, String> {
        if l.iter().any(|t| t == "*") {
            return Ok("*".into());
        }
        match l.iter().find(|t| !is_fetch_arg_name(t)) {
            Some(t) => Err(format!("{what} {t:?} is not a token")),
            None => Ok(l.join(", ")),
        }
    };
    let expose = list("header", &f.expose_headers)?;
    Ok(Cors {
        origins,
        methods: list("method", &f.allow_methods)?,
        headers: list("header", &f.allow_headers)?,
        expose: (!expose.is_empty()).then_some(expose),
        credentials: f.allow_credentials.unwrap_or(false),
        max_age: u32::try_from(f.max_age.unwrap_or(5)).map_err(|_| "maxAge is negative".to_string())?,
        reflect: true,
    })
}

/// A rule's filters as the policy of its requests.
fn compile_filters(filters: &[HttpRouteFilter], prefix: Option<usize>) -> Result<Policy, String> {
    let mut a = Policy::default();
    for f in filters {
        match &f.type_ {
            FilterType::RequestHeaderModifier => {
                a.request_headers = header_ops(&f.request_header_modifier.clone().unwrap_or_default())?
            }
            FilterType::ResponseHeaderModifier => {
                a.response_headers = header_ops(&f.response_header_modifier.clone().unwrap_or_default())?
            }
            FilterType::RequestRedirect => {
                let r = f.request_redirect.clone().unwrap_or_default();
                let scheme = match r.scheme.as_deref() {
                    None => None,
                    Some(s @ ("http" | "https")) => Some(s.to_string()),
                    Some(s) => return Err(format!("scheme {s:?} is not supported")),
                };
                let hostname = match &r.hostname {
                    Some(h) => match parse_host(h)? {
                        HostMatch::Exact(h) => Some(h),
                        _ => return Err("a redirect hostname cannot be a wildcard".into()),
                    },
                    None => None,
                };
                let code = match r.status_code.unwrap_or(302) {
                    c @ (301 | 302 | 303 | 307 | 308) => c as u16,
                    c => return Err(format!("status code {c} is not supported")),
                };
                let port = r.port.map(|p| u16::try_from(p).map_err(|_| format!("port {p}"))).transpose()?;
                let path = r.path.as_ref().map(|p| path_modifier(p, prefix)).transpose()?;
                a.redirect = Some(Redirect::Rewrite { scheme, hostname, port, path, code });
            }
            FilterType::Cors => a.cors = Some(cors(&f.cors.clone().unwrap_or_default())?),
            FilterType::UrlRewrite => {
                let u = f.url_rewrite.clone().unwrap_or_default();
                if let Some(h) = &u.hostname {
                    match parse_host(h)? {
                        HostMatch::Exact(h) => a.host_rewrite = Some(h),
                        _ => return Err("a rewritten hostname cannot be a wildcard".into()),
                    }
                }
                a.path_rewrite = u.path.as_ref().map(|p| path_modifier(p, prefix)).transpose()?;
            }
            // Its backend is resolved with the rule's own ([`routes`]).
            FilterType::RequestMirror => {}
            other => return Err(format!("filter {other} is not supported")),
        }
    }
    Ok(a)
}

/// The tries a rule's `retry` asks for as HAProxy makes them, or why it cannot. HAProxy tries
/// again at once, so a `backoff` other than 0 cannot be honoured; `attempts` left out is one.
fn retry_of(r: &HttpRouteRetry) -> Result<Retry, String> {
    if let Some(b) = r.backoff.as_deref() {
        if duration_ms(b)? != 0 {
            return Err(format!("backoff {b}: HAProxy tries again at once, it cannot wait between tries"));
        }
    }
    let mut codes = Vec::new();
    for &c in &r.codes {
        match u16::try_from(c) {
            Ok(c) if RETRY_CODES.contains(&c) => codes.push(c),
            _ => return Err(format!("HAProxy cannot retry on status {c} (it can on {RETRY_CODES:?})")),
        }
    }
    codes.sort_unstable();
    codes.dedup();
    let attempts = u32::try_from(r.attempts.unwrap_or(1)).map_err(|_| "attempts is negative".to_string())?;
    Ok(Retry { codes, attempts })
}

/// The share of requests a RequestMirror filter copies, `numerator` out of `denominator`
/// (`None`: every request).
fn mirror_share(m: &HttpRequestMirrorFilter) -> Result<Option<(u32, u32)>, String> {
    let (n, d) = match (m.percent, &m.fraction) {
        (Some(_), Some(_)) => return Err("percent and fraction are exclusive".into()),
        (None, None) => return Ok(None),
        (Some(p), None) => (p, 100),
        (None, Some(f)) => (f.numerator, f.denominator.unwrap_or(100)),
    };
    match (u32::try_from(n), u32::try_from(d)) {
        (Ok(n), Ok(d)) if d > 0 && n <= d => Ok((n < d).then_some((n, d))),
        _ => Err(format!("a share of {n} in {d} is not a fraction of the requests")),
    }
}

/// A set of objects as one YAML or JSON document lists them (`gateways`, `listenerSets`, `routes`, `grpcRoutes`,
/// `tlsRoutes`, `tcpRoutes`, `grants`, `namespaces`, `services`, `endpointSlices`, `secrets`,
/// `backendTlsPolicies`, `configMaps`): test fixtures and offline renders.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayObjects {
    /// Gateways.
    pub gateways: Vec<Gateway>,
    /// ListenerSets.
    pub listener_sets: Vec<ListenerSet>,
    /// HTTPRoutes.
    pub routes: Vec<HttpRoute>,
    /// GRPCRoutes.
    pub grpc_routes: Vec<GrpcRoute>,
    /// TLSRoutes.
    pub tls_routes: Vec<TlsRoute>,
    /// TCPRoutes.
    pub tcp_routes: Vec<TcpRoute>,
    /// ReferenceGrants.
    pub grants: Vec<ReferenceGrant>,
    /// Namespaces.
    pub namespaces: Vec<Namespace>,
    /// Services.
    pub services: Vec<Service>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Secrets.
    pub secrets: Vec<Secret>,
    /// BackendTLSPolicies.
    pub backend_tls_policies: Vec<BackendTlsPolicy>,
    /// ConfigMaps.
    pub config_maps: Vec<ConfigMap>,
}

impl GatewayObjects {
    /// The translator input serving these objects under the class `class` (which names our
    /// controller), with `settings`.
    pub fn input(self, class: &str, settings: GatewaySettings) -> GatewayInput {
        let mut c = GatewayClass::default();
        c.metadata.name = Some(class.into());
        c.metadata.generation = Some(1);
        c.spec.controller_name = GATEWAY_CONTROLLER.into();
        GatewayInput {
            class_name: class.into(),
            classes: vec![c.into()],
            gateways: arcs(self.gateways),
            listener_sets: arcs(self.listener_sets),
            routes: arcs(self.routes),
            grpc_routes: arcs(self.grpc_routes),
            tls_routes: arcs(self.tls_routes),
            tcp_routes: arcs(self.tcp_routes),
            grants: arcs(self.grants),
            namespaces: arcs(self.namespaces),
            services: arcs(self.services),
            endpoint_slices: arcs(self.endpoint_slices),
            secrets: arcs(self.secrets),
            backend_tls_policies: arcs(self.backend_tls_policies),
            config_maps: arcs(self.config_maps),
            previous_slots: SlotMap::default(),
            settings,
            excluded: BTreeMap::new(),
        }
    }
}

/// Each of `v` in an `Arc`.
fn arcs<T>(v: Vec<T>) -> Vec<std::sync::Arc<T>> {
    v.into_iter().map(std::sync::Arc::new).collect()
}

/// Fixture loading for the tests.
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;

    pub(crate) fn input(yaml: &str) -> GatewayInput {
        let f: GatewayObjects = serde_saphyr::from_str(yaml).unwrap();
        f.input("haptic", GatewaySettings { min_slots: 2, namespace: "fleet".into(), ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::input;
    use super::*;
    use proptest::prelude::*;

    const FIXTURE: &str = include_str!("../../../tests/fixtures/gateway.yaml");

    fn gw<'a>(o: &'a GatewayOutput, name: &str) -> &'a GatewayOutcome {
        o.gateways.iter().find(|g| g.object.name == name).unwrap()
    }

    fn listener<'a>(g: &'a GatewayOutcome, name: &str) -> &'a ListenerStatus {
        g.listeners.iter().find(|l| l.name == name).unwrap()
    }

    fn has(conds: &[Cond], type_: &str, status: bool, reason: &str) -> bool {
        conds.iter().any(|c| c.type_ == type_ && c.status == status && c.reason == reason)
    }

    fn parent<'a>(o: &'a GatewayOutput, route: &str, section: Option<&str>) -> &'a ParentStatus {
        let r = o.routes.iter().find(|r| r.object.name == route).unwrap_or_else(|| panic!("no status for {route}"));
        r.parents.iter().find(|p| p.parent_ref.section_name.as_deref() == section).unwrap()
    }

    #[test]
    fn a_retry_is_what_retry_on_can_say_or_refused() {
        let r = |y: &str| -> HttpRouteRetry { serde_saphyr::from_str(y).unwrap() };
        assert_eq!(
            retry_of(&r("{codes: [503, 500, 503], attempts: 3}")),
            Ok(Retry { codes: vec![500, 503], attempts: 3 })
        );
        assert_eq!(retry_of(&r("{codes: [], backoff: 0s}")), Ok(Retry { codes: vec![], attempts: 1 }));
        for bad in ["{codes: [599]}", "{codes: [200]}", "{codes: [500], backoff: 100ms}", "{attempts: -1}"] {
            assert!(retry_of(&r(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_mirror_copies_its_share_of_the_requests_and_a_share_that_is_not_a_fraction_is_refused() {
        let m = |y: &str| -> HttpRequestMirrorFilter {
            serde_saphyr::from_str(&format!("{{backendRef: {{name: m, port: 80}}{y}}}")).unwrap()
        };
        assert_eq!(mirror_share(&m("")), Ok(None));
        assert_eq!(mirror_share(&m(", percent: 100")), Ok(None));
        assert_eq!(mirror_share(&m(", percent: 35")), Ok(Some((35, 100))));
        assert_eq!(mirror_share(&m(", percent: 0")), Ok(Some((0, 100))));
        assert_eq!(mirror_share(&m(", fraction: {numerator: 25, denominator: 50}")), Ok(Some((25, 50))));
        assert_eq!(mirror_share(&m(", fraction: {numerator: 5}")), Ok(Some((5, 100))));
        assert_eq!(mirror_share(&m(", fraction: {numerator: 3, denominator: 3}")), Ok(None));
        for bad in [
            ", percent: 101",
            ", percent: -1",
            ", fraction: {numerator: 1, denominator: 0}",
            ", fraction: {numerator: 4, denominator: 3}",
            ", percent: 5, fraction: {numerator: 1}",
        ] {
            assert!(mirror_share(&m(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_class_is_accepted_with_its_features_and_other_classes_are_left_alone() {
        let o = translate_gateway(&input(FIXTURE));
        let c = o.class.as_ref().unwrap();
        assert!(has(&c.conditions, "Accepted", true, "Accepted"));
        assert_eq!(c.conditions[0].observed_generation, 1);
        assert!(c.supported_features.contains(&"HTTPRouteQueryParamMatching"));
        assert_eq!(o.gateways.len(), 1, "the Gateway of class `other` is not ours");
        assert!(!o.routes.iter().any(|r| r.object.name == "not-ours"));
        assert!(o.unserved.is_empty());
        // Another class naming our controller, which no fleet has decided on: Pending.
        let mut i = input(FIXTURE);
        let mut other = (*i.classes[0]).clone();
        other.metadata.name = Some("spare".into());
        other.metadata.generation = Some(4);
        i.classes.push(other.into());
        let o = translate_gateway(&i);
        assert_eq!(o.unserved.len(), 1);
        assert_eq!((o.unserved[0].name.as_str(), o.unserved[0].conditions[0].observed_generation), ("spare", 4));
        assert!(has(&o.unserved[0].conditions, "Accepted", false, "Pending"));
        // A class naming another controller is not served.
        let mut i = input(FIXTURE);
        std::sync::Arc::make_mut(&mut i.classes[0]).spec.controller_name = "example.com/other".into();
        let o = translate_gateway(&i);
        assert!(o.class.is_none() && o.gateways.is_empty() && o.routes.is_empty());
    }

    #[test]
    fn listeners_report_kinds_refs_and_attached_routes() {
        let o = translate_gateway(&input(FIXTURE));
        let g = gw(&o, "front");
        assert!(g.conditions.iter().all(|c| c.observed_generation == 3));
        let http = listener(g, "http");
        let kinds: Vec<&str> = http.supported_kinds.iter().map(|k| k.kind.as_str()).collect();
        assert_eq!(kinds, ["HTTPRoute", "GRPCRoute"], "every kind an HTTP listener takes, when it names none");
        assert!(has(&http.conditions, "Programmed", true, "Programmed"));
        // main (sectionName http) and exact-host (no sectionName, any host) attach.
        assert_eq!(http.attached_routes, 2);
        // exact-host attaches to `exact`; no-host does not (its hostname does not intersect).
        assert_eq!(listener(g, "exact").attached_routes, 1);
        // Only blue's route passes the selector.
        assert_eq!(listener(g, "wild").attached_routes, 1);
        let odd = listener(g, "odd-kind");
        assert!(odd.supported_kinds.is_empty());
        assert!(has(&odd.conditions, "ResolvedRefs", false, "InvalidRouteKinds"));
        assert_eq!(odd.attached_routes, 0);
        let broken = listener(g, "broken-tls");
        assert!(has(&broken.conditions, "ResolvedRefs", false, "InvalidCertificateRef"));
        assert!(has(&broken.conditions, "Programmed", false, "Invalid"));
        assert_eq!(broken.attached_routes, 1, "routes attach to a listener with unresolved refs");
        let https = listener(g, "https");
        assert!(has(&https.conditions, "ResolvedRefs", true, "ResolvedRefs"));
        // No Service address yet: not Programmed.
        assert!(has(&g.conditions, "Programmed", false, "AddressNotAssigned"));
        assert!(has(&g.conditions, "Accepted", true, "Accepted"));
    }

    #[test]
    fn left_out_routes_and_secrets_are_refused_in_their_own_statuses() {
        let mut i = input(FIXTURE);
        let o = translate_gateway(&i);
        assert!(has(&parent(&o, "main", Some("http")).conditions, "Accepted", true, "Accepted"));
        let why = crate::narrow::Exclusion::Suspect;
        let r = |kind: &str, name: &str| ObjectRef { kind: kind.into(), namespace: "edge".into(), name: name.into() };
        i.excluded.insert(r("HTTPRoute", "main"), why.clone());
        i.excluded.insert(r("Secret", "site"), why.clone());
        let o = translate_gateway(&i);
        let main = parent(&o, "main", Some("http"));
        assert!(has(&main.conditions, "Accepted", false, "UnsupportedValue"), "{main:?}");
        assert!(main.conditions.iter().any(|c| c.message == why.to_string()));
        let v = o.verdicts.iter().find(|v| v.object.name == "main").unwrap();
        assert!(!v.accepted() && v.left_out() && v.refusals[0].field == "spec.parentRefs", "{v:?}");
        let https = listener(gw(&o, "front"), "https");
        assert!(has(&https.conditions, "ResolvedRefs", false, "InvalidCertificateRef"), "{https:?}");
        assert!(!o.model.certs.iter().any(|c| c.path == "certs/edge_site.pem"));
        // The other routes still attach.
        assert!(has(&parent(&o, "exact-host", None).conditions, "Accepted", true, "Accepted"));
    }

    #[test]
    fn a_secret_whose_key_does_not_match_is_an_invalid_certificate_ref() {
        let mut i = input(FIXTURE);
        let other = rcgen::generate_simple_self_signed(vec!["x.example".into()]).unwrap();
        let data = std::sync::Arc::make_mut(&mut i.secrets[0]).data.as_mut().unwrap();
        data.insert("tls.key".into(), k8s_openapi::ByteString(other.signing_key.serialize_pem().into_bytes()));
        let o = translate_gateway(&i);
        let https = listener(gw(&o, "front"), "https");
        let c = https.conditions.iter().find(|c| c.type_ == "ResolvedRefs").unwrap();
        assert!(!c.status && c.reason == "InvalidCertificateRef", "{c:?}");
        assert!(o.model.certs.is_empty());
    }

    #[test]
    fn the_gateway_service_names_every_usable_port_and_the_address_programs_it() {
        let mut i = input(FIXTURE);
        let o = translate_gateway(&i);
        let svc = gw(&o, "front").service.clone();
        assert!(svc.name.len() <= 63 && svc.name.starts_with("gw-edge-front-"), "{}", svc.name);
        let ports: Vec<u16> = svc.ports.iter().map(|p| p.0).collect();
        assert_eq!(ports, [80, 443, 8443, 8080]);
        let binds: BTreeSet<u16> = svc.ports.iter().map(|p| p.1).collect();
        assert_eq!(binds.len(), 4, "one bind port per listener port");
        let mut s = Service::default();
        s.metadata.name = Some(svc.name.clone());
        s.metadata.namespace = Some("fleet".into());
        s.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            cluster_ip: Some("10.0.0.42".into()),
            ..Default::default()
        });
        i.services.push(s.into());
        let o = translate_gateway(&i);
        let g = gw(&o, "front");
        assert_eq!(g.addresses, ["10.0.0.42"]);
        assert!(has(&g.conditions, "Programmed", true, "Programmed"));
    }

    #[test]
    fn a_static_address_is_programmed_only_once_the_service_carries_it() {
        let mut i = input(FIXTURE);
        let front = i.gateways.iter().position(|g| g.metadata.name.as_deref() == Some("front")).unwrap();
        let ask = |i: &mut GatewayInput, addrs: &[(Option<&str>, &str)]| {
            let mut g = (*i.gateways[front]).clone();
            g.spec.addresses = addrs
                .iter()
                .map(|(t, v)| GatewaySpecAddress { type_: t.map(str::to_string), value: Some(v.to_string()) })
                .collect();
            i.gateways[front] = g.into();
        };
        ask(&mut i, &[(Some("test/fake"), "x"), (None, "192.0.2.1"), (Some("IPAddress"), "10.96.0.200")]);
        let g = gw(&translate_gateway(&i), "front").clone();
        assert!(has(&g.conditions, "Accepted", false, "UnsupportedAddress"));
        assert_eq!(g.service.address, None, "nothing is asked of the Service for a Gateway not accepted");
        ask(&mut i, &[(None, "192.0.2.1"), (Some("IPAddress"), "10.96.0.200")]);
        let g = gw(&translate_gateway(&i), "front").clone();
        assert!(has(&g.conditions, "Accepted", true, "Accepted"));
        assert!(has(&g.conditions, "Programmed", false, "AddressNotUsable"));
        assert_eq!(g.service.address, Some("192.0.2.1".parse().unwrap()), "the first address is asked for");
        assert!(g.addresses.is_empty());
        ask(&mut i, &[(Some("IPAddress"), "10.96.0.200")]);
        let mut s = Service::default();
        s.metadata.name = Some(g.service.name.clone());
        s.metadata.namespace = Some("fleet".into());
        s.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            cluster_ip: Some("10.96.7.7".into()),
            ..Default::default()
        });
        i.services.push(s.clone().into());
        let g = gw(&translate_gateway(&i), "front").clone();
        assert!(has(&g.conditions, "Programmed", false, "AddressNotUsable"), "the Service still has its old address");
        assert!(g.addresses.is_empty(), "never the address the Gateway did not ask for");
        s.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.200".into());
        i.services = vec![s.into()];
        let g = gw(&translate_gateway(&i), "front").clone();
        assert!(has(&g.conditions, "Programmed", true, "Programmed"));
        assert_eq!(g.addresses, ["10.96.0.200"]);
    }

    #[test]
    fn the_alias_is_a_service_name_and_parameters_are_refused() {
        assert_eq!(alias_name("front"), "front-gateway");
        for odd in ["a.b", "9lives", &"x".repeat(60)] {
            let a = alias_name(odd);
            assert!(a.starts_with("gw-") && a.len() <= 63, "{a}");
        }
        let mut i = input(FIXTURE);
        let front = i.gateways.iter().position(|g| g.metadata.name.as_deref() == Some("front")).unwrap();
        let mut g = (*i.gateways[front]).clone();
        g.spec.infrastructure = Some(GatewayInfrastructure {
            parameters_ref: Some(ParametersReference {
                group: "invalid.io".into(),
                kind: "X".into(),
                name: "x".into(),
                namespace: None,
            }),
            ..Default::default()
        });
        i.gateways[front] = g.into();
        let g = gw(&translate_gateway(&i), "front").clone();
        assert!(has(&g.conditions, "Accepted", false, "InvalidParameters"));
    }

    #[test]
    fn bind_ports_stay_when_gateways_come_and_go() {
        let mut i = input(FIXTURE);
        let first = translate_gateway(&i);
        let mut g2 = (*i.gateways[0]).clone();
        g2.metadata.name = Some("aaa-first".into());
        g2.metadata.creation_timestamp = None;
        i.gateways.push(g2.into());
        i.previous_slots = first.slots.clone();
        let second = translate_gateway(&i);
        for (k, p) in &first.slots.bind_ports {
            assert_eq!(second.slots.bind_ports[k], *p, "{k}");
        }
        assert_eq!(second.slots.bind_ports.len(), 8);
        let all: BTreeSet<u16> = second.slots.bind_ports.values().copied().collect();
        assert_eq!(all.len(), 8, "two Gateways on port 80 never share a bind port");
    }

    #[test]
    fn routes_report_attachment_reasons() {
        let o = translate_gateway(&input(FIXTURE));
        let main = parent(&o, "main", Some("http"));
        assert!(has(&main.conditions, "Accepted", true, "Accepted"));
        assert!(has(&main.conditions, "ResolvedRefs", true, "ResolvedRefs"));
        assert!(main.conditions.iter().all(|c| c.observed_generation == 2));
        assert!(has(&parent(&o, "blue-route", Some("wild")).conditions, "Accepted", true, "Accepted"));
        let red = parent(&o, "red-route", Some("wild"));
        assert!(has(&red.conditions, "Accepted", false, "NotAllowedByListeners"));
        assert_eq!(red.conditions[0].observed_generation, 4);
        assert!(has(&parent(&o, "red-route", Some("nope")).conditions, "Accepted", false, "NoMatchingParent"));
        assert!(has(&parent(&o, "no-host", Some("exact")).conditions, "Accepted", false, "NoMatchingListenerHostname"));
        let cross = parent(&o, "cross", Some("https"));
        assert!(has(&cross.conditions, "Accepted", true, "Accepted"));
        assert!(has(&cross.conditions, "ResolvedRefs", false, "RefNotPermitted"));
        let bad = parent(&o, "bad-backends", Some("https"));
        assert!(has(&bad.conditions, "ResolvedRefs", false, "InvalidKind"));
    }

    fn rule_of<'a>(m: &'a Model, port_of: u16, host: &HostMatch, path: &str) -> &'a Rule {
        let t = m.hosts.iter().find(|t| t.port == Some(port_of) && &t.host == host).unwrap();
        let id = &t.paths.iter().find(|p| p.path == path).unwrap().rule;
        m.rules.iter().find(|r| &r.id == id).unwrap()
    }

    #[test]
    fn backends_grants_weights_and_500() {
        let o = translate_gateway(&input(FIXTURE));
        let b443 = o.slots.bind_ports["edge/front:443"];
        let b80 = o.slots.bind_ports["edge/front:80"];
        let m = &o.model;
        assert_eq!(rule_of(m, b443, &HostMatch::Any, "/granted").backend, "edge_web_80");
        assert_eq!(rule_of(m, b443, &HostMatch::Any, "/ungranted").backend, ERROR_500);
        let bad = HostMatch::Exact("bad.example.com".into());
        assert_eq!(rule_of(m, b443, &bad, "/kind").backend, ERROR_500);
        assert_eq!(rule_of(m, b443, &bad, "/missing").backend, ERROR_500);
        let split = rule_of(m, b80, &HostMatch::Any, "/split");
        let be = m.backends.iter().find(|b| b.name == split.backend).unwrap();
        let w: Vec<(String, Option<u16>)> =
            be.servers.iter().filter_map(|s| Some((s.endpoint?.to_string(), s.weight))).collect();
        // web: 90 over two endpoints (45 each, the top share: 256); api: 10 over one (57).
        assert_eq!(
            w,
            [
                ("10.0.0.1:8080".into(), Some(256)),
                ("10.0.0.2:8080".into(), Some(256)),
                ("10.0.1.1:9090".into(), Some(57))
            ]
        );
    }

    #[test]
    fn hostnames_intersect_and_listeners_stay_isolated() {
        let o = translate_gateway(&input(FIXTURE));
        let b80 = o.slots.bind_ports["edge/front:80"];
        let hosts: Vec<&HostMatch> = o.model.hosts.iter().filter(|t| t.port == Some(b80)).map(|t| &t.host).collect();
        // exact-host's hostnames: exact.example.com (its listener's and the any-host one's),
        // *.wild.example.com on the any-host listener is claimed by the wild listener, whose
        // own table exists; nowhere.other.com only through the any-host listener.
        assert!(hosts.contains(&&HostMatch::Exact("exact.example.com".into())));
        assert!(hosts.contains(&&HostMatch::Exact("nowhere.other.com".into())));
        assert!(hosts.contains(&&HostMatch::Suffix(".wild.example.com".into())));
        let wild = o.model.hosts.iter().find(|t| t.host == HostMatch::Suffix(".wild.example.com".into())).unwrap();
        assert!(wild.paths.is_empty(), "exact-host is not allowed on the wild listener: {wild:?}");
        let a = o.model.hosts.iter().find(|t| t.host == HostMatch::Exact("a.wild.example.com".into())).unwrap();
        assert_eq!(o.model.rules.iter().find(|r| r.id == a.paths[0].rule).unwrap().backend, "blue_svc_80");
        // Intersections.
        let ex = |s: &str| HostMatch::Exact(s.into());
        let sx = |s: &str| HostMatch::Suffix(s.into());
        assert_eq!(intersect(&Some(sx(".a.com")), &ex("x.y.a.com")), Some(ex("x.y.a.com")));
        assert_eq!(intersect(&Some(sx(".a.com")), &ex("a.com")), None);
        assert_eq!(intersect(&Some(ex("x.a.com")), &sx(".a.com")), Some(ex("x.a.com")));
        assert_eq!(intersect(&Some(sx(".a.com")), &sx(".b.a.com")), Some(sx(".b.a.com")));
        assert_eq!(intersect(&Some(sx(".b.a.com")), &sx(".a.com")), Some(sx(".b.a.com")));
        assert_eq!(intersect(&None, &HostMatch::Any), Some(HostMatch::Any));
    }

    #[test]
    fn precedence_puts_conditional_matches_in_config_in_order() {
        let o = translate_gateway(&input(FIXTURE));
        let g = &o.model;
        let b80 = o.slots.bind_ports["edge/front:80"];
        let any = o.model.hosts.iter().find(|t| t.port == Some(b80) && t.host == HostMatch::Any).unwrap();
        let ms: Vec<(Option<&str>, usize)> = g
            .matches
            .iter()
            .filter(|m| m.host == any.id)
            .map(|m| (m.path.as_ref().map(|p| p.1.as_str()), m.headers.len()))
            .collect();
        // Exact /exact, then the longer prefixes /split and /moved (in rule order), then /v2;
        // `/` stays in the maps only.
        assert_eq!(ms, [(Some("/exact"), 0), (Some("/split"), 0), (Some("/moved"), 0), (Some("/v2"), 1)]);
        let paths: Vec<&str> = any.paths.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["/exact", "/moved", "/split", "/"]);
    }

    #[test]
    fn render_is_deterministic_escapes_values_and_route_churn_is_maps_only() {
        let t = crate::Templates::default();
        let (a, _) = crate::render_gateway(&input(FIXTURE), &t).unwrap();
        let (b, _) = crate::render_gateway(&input(FIXTURE), &t).unwrap();
        assert_eq!(a, b);
        let cfg = String::from_utf8(a.files["haproxy.cfg"].clone()).unwrap();
        assert!(cfg.contains("set-header 'X-Via' 'haptic %%[env(HOME)]'"), "{cfg}");
        assert!(cfg.contains("del-header 'X-Drop'"), "{cfg}");
        // A timeout is a map entry the backends' defaults read, never a backend line.
        assert!(!cfg.contains("set-timeout server 1500"), "{cfg}");
        let timeouts = String::from_utf8(a.files["maps/policy_timeouts.map"].clone()).unwrap();
        assert!(timeouts.lines().any(|l| l.ends_with(" 1500")), "{timeouts}");
        assert!(cfg.contains("://'new.example.com'%[pathq] code 301 if"), "{cfg}");
        assert!(cfg.contains("backend haptic_error_500\n    http-request return status 500"), "{cfg}");
        assert!(cfg.contains("crt 'certs/edge_site.pem'"), "{cfg}");
        // Another path-only route on a host without conditional matches: maps only.
        let mut i = input(FIXTURE);
        let mut extra = (**i.routes.iter().find(|r| r.metadata.name.as_deref() == Some("blue-route")).unwrap()).clone();
        extra.metadata.name = Some("blue-2".into());
        extra.spec.hostnames = vec!["b.wild.example.com".into()];
        i.routes.push(extra.into());
        let (c, _) = crate::render_gateway(&i, &t).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&a.files["haproxy.cfg"]),
            String::from_utf8_lossy(&c.files["haproxy.cfg"]),
            "a path-only route changes maps only"
        );
        assert_ne!(a.files["maps/hosts.map"], c.files["maps/hosts.map"]);
    }

    #[test]
    fn a_new_route_with_a_filter_its_namespace_already_uses_changes_maps_only() {
        let t = crate::Templates::default();
        let (a, _) = crate::render_gateway(&input(FIXTURE), &t).unwrap();
        let mut i = input(FIXTURE);
        let main = i.routes.iter().find(|r| r.metadata.name.as_deref() == Some("main")).unwrap();
        let mut moved = (**main).clone();
        moved.metadata.name = Some("moved-too".into());
        moved.spec.hostnames = vec!["c.example.com".into()];
        moved.spec.rules = vec![main.spec.rules[4].clone()];
        i.routes.push(moved.into());
        let (b, out) = crate::render_gateway(&i, &t).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&a.files["haproxy.cfg"]),
            String::from_utf8_lossy(&b.files["haproxy.cfg"]),
            "the redirect is the policy main's /moved already has"
        );
        assert_ne!(a.files["maps/policies.map"], b.files["maps/policies.map"]);
        let redirects: Vec<_> = out.model.policies.iter().filter(|p| p.policy.redirect.is_some()).collect();
        assert_eq!(redirects.len(), 1, "{redirects:?}");
        let users = out.model.rules.iter().filter(|r| r.policy.as_ref() == Some(&redirects[0].id)).count();
        assert_eq!(users, 2);
    }

    fn one_route(host: &str, path: &str, header: &str) -> GatewayInput {
        let mut i = input(FIXTURE);
        let r =
            std::sync::Arc::make_mut(i.routes.iter_mut().find(|r| r.metadata.name.as_deref() == Some("main")).unwrap());
        r.spec.hostnames = vec![host.to_string()];
        r.spec.rules[2].matches[0].path.as_mut().unwrap().value = Some(path.to_string());
        r.spec.rules[2].matches[0].headers[0].value = header.to_string();
        r.spec.rules[2].filters[0].request_header_modifier.as_mut().unwrap().set[0].value = header.to_string();
        i
    }

    /// Each section's header words and each line's first word.
    fn structure(cfg: &str) -> Vec<(String, usize)> {
        cfg.lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(|l| {
                let t = haptic_haproxy::cfg::tokenize(l);
                (t.first().cloned().unwrap_or_default(), t.len())
            })
            .collect()
    }

    #[test]
    fn hostnames_belong_to_namespaces_only_when_the_admin_says_so() {
        let mut i = input(FIXTURE);
        // `bad-backends` (edge, no creationTimestamp: the oldest) has bad.example.com on the
        // https listener, which allows every namespace. A younger route of red and one of edge
        // claim a path there too.
        let extra: Vec<HttpRoute> = serde_saphyr::from_str(
            r#"
- metadata: {name: intruder, namespace: red, creationTimestamp: "2026-02-01T00:00:00Z"}
  spec:
    parentRefs: [{name: front, namespace: edge, sectionName: https}]
    hostnames: [bad.example.com]
    rules: [{matches: [{path: {type: PathPrefix, value: /steal}}], backendRefs: [{name: svc, port: 80}]}]
- metadata: {name: sibling, namespace: edge, creationTimestamp: "2026-02-01T00:00:00Z"}
  spec:
    parentRefs: [{name: front, sectionName: https}]
    hostnames: [bad.example.com]
    rules: [{matches: [{path: {type: PathPrefix, value: /more}}], backendRefs: [{name: web, port: 80}]}]
"#,
        )
        .unwrap();
        i.routes.extend(extra.into_iter().map(std::sync::Arc::new));
        // The routes some host table's path or match selects.
        let sources = |o: &GatewayOutput| -> BTreeSet<String> {
            let m = &o.model;
            let matched = m.matches.iter().map(|x| &x.rule);
            let ids: BTreeSet<&RuleId> =
                m.hosts.iter().flat_map(|t| t.paths.iter().map(|p| &p.rule)).chain(matched).collect();
            m.rules
                .iter()
                .filter(|r| ids.contains(&r.id))
                .map(|r| format!("{}/{}", r.source.namespace, r.source.name))
                .collect()
        };
        let v = |o: &GatewayOutput, n: &str| o.verdicts.iter().find(|v| v.object.name == n).unwrap().clone();
        // Off by default: attachment as the spec says, both serve.
        let o = translate_gateway(&i);
        assert!(sources(&o).contains("red/intruder") && sources(&o).contains("edge/sibling"), "{:?}", sources(&o));
        assert!(v(&o, "intruder").accepted(), "{:?}", v(&o, "intruder"));
        // On: the younger route of another namespace is refused the hostname; its sibling serves.
        i.settings.host_sharing = HostSharing::Namespace;
        let o = translate_gateway(&i);
        assert!(!sources(&o).contains("red/intruder"), "{:?}", sources(&o));
        assert!(sources(&o).contains("edge/sibling"));
        let r = v(&o, "intruder");
        assert_eq!(r.refusals[0].field, "spec.hostnames");
        assert_eq!(r.refusals[0].cause, Cause::NotAllowed, "{r:?}");
        assert!(v(&o, "sibling").accepted());
    }

    #[test]
    fn infrastructure_keys_pass_only_as_the_admin_allows() {
        let allow = vec!["team".to_string(), "example.com/*".to_string()];
        assert!(infrastructure_key_allowed(&allow, "team"));
        assert!(infrastructure_key_allowed(&allow, "example.com/owner"));
        assert!(!infrastructure_key_allowed(&allow, "teams"), "an exact key is exact");
        assert!(!infrastructure_key_allowed(&allow, "external-dns.alpha.kubernetes.io/hostname"));
        assert!(!infrastructure_key_allowed(&allow, "sub.example.com/x"), "a prefix is a prefix");
        assert!(!infrastructure_key_allowed(&[], "team"), "nothing passes by default");
        let mut i = input(FIXTURE);
        let g = std::sync::Arc::make_mut(&mut i.gateways[0]);
        g.spec.infrastructure = Some(GatewayInfrastructure {
            labels: [("team".into(), "a".into()), ("app.kubernetes.io/name".into(), "x".into())].into(),
            annotations: [
                ("example.com/owner".into(), "a".into()),
                ("service.beta.kubernetes.io/aws-load-balancer-internal".into(), "false".into()),
                ("external-dns.alpha.kubernetes.io/hostname".into(), "victim.example.com".into()),
            ]
            .into(),
            parameters_ref: None,
        });
        let name = g.metadata.name.clone().unwrap();
        // Empty by default: nothing reaches the Service, the Gateway serves and says why.
        let o = translate_gateway(&i);
        let out = gw(&o, &name);
        assert!(out.service.labels.is_empty() && out.service.annotations.is_empty(), "{:?}", out.service);
        let accepted = out.conditions.iter().find(|c| c.type_ == "Accepted").unwrap();
        assert!(accepted.status, "{accepted:?}");
        let infra = i.gateways[0].spec.infrastructure.clone();
        let (.., refused) = infrastructure(infra.as_ref(), &[]);
        assert_eq!(
            refused,
            [
                "spec.infrastructure.labels[app.kubernetes.io/name]",
                "spec.infrastructure.labels[team]",
                "spec.infrastructure.annotations[example.com/owner]",
                "spec.infrastructure.annotations[external-dns.alpha.kubernetes.io/hostname]",
                "spec.infrastructure.annotations[service.beta.kubernetes.io/aws-load-balancer-internal]",
            ]
        );
        // Allowed keys pass; the others are still named.
        i.settings.infrastructure_keys = allow;
        let o = translate_gateway(&i);
        let out = gw(&o, &name);
        assert_eq!(out.service.labels, [("team".to_string(), "a".to_string())].into());
        assert_eq!(out.service.annotations, [("example.com/owner".to_string(), "a".to_string())].into());
        let (.., refused) = infrastructure(infra.as_ref(), &i.settings.infrastructure_keys);
        assert_eq!(
            refused,
            [
                "spec.infrastructure.labels[app.kubernetes.io/name]",
                "spec.infrastructure.annotations[external-dns.alpha.kubernetes.io/hostname]",
                "spec.infrastructure.annotations[service.beta.kubernetes.io/aws-load-balancer-internal]",
            ]
        );
        let with_refused = out.conditions.iter().find(|c| c.type_ == "Accepted").unwrap().clone();
        assert!(with_refused.status, "{with_refused:?}");
        // Without spec.infrastructure, the condition is the plain one.
        std::sync::Arc::make_mut(&mut i.gateways[0]).spec.infrastructure = None;
        let o = translate_gateway(&i);
        let plain = gw(&o, &name).conditions.iter().find(|c| c.type_ == "Accepted").unwrap().clone();
        assert_eq!((plain.status, plain.reason), (true, "Accepted"));
        assert_ne!(plain.message, with_refused.message, "the refused keys are named");
        assert_eq!(infrastructure(None, &[]).2, Vec::<String>::new());
    }

    #[test]
    fn durations() {
        assert_eq!(duration_ms("500ms"), Ok(500));
        assert_eq!(duration_ms("1h30m10s5ms"), Ok(5_410_005));
        assert_eq!(duration_ms("0s"), Ok(0));
        for bad in ["", "1", "1d", "ms", "1h1h1h1h1h", "123456s"] {
            assert!(duration_ms(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// Hostile hostnames, paths and header values never change the config's structure:
        /// the route is refused (and absent) or its values are single quoted words.
        #[test]
        fn hostile_values_never_change_the_structure(
            host in "[a-z.*%{}#'\" \\\\\n\r-]{0,20}",
            path in "/[ -~\n\r]{0,30}",
            header in "[ -~\n\r\t]{0,30}",
        ) {
            let t = crate::Templates::default();
            // A shorter prefix is outranked by the longer prefixes of its host, which then become
            // config rules too: the harmless baseline has a path of the same length.
            let plain_path = format!("/{}", "p".repeat(path.len() - 1));
            let (plain, _) = crate::render_gateway(&one_route("plain.example.com", &plain_path, "plain"), &t).unwrap();
            let (render, out) = crate::render_gateway(&one_route(&host, &path, &header), &t).unwrap();
            let cfg = String::from_utf8(render.files["haproxy.cfg"].clone()).unwrap();
            let base = String::from_utf8(plain.files["haproxy.cfg"].clone()).unwrap();
            let accepted = parent(&out, "main", Some("http")).conditions[0].status;
            if accepted {
                prop_assert_eq!(structure(&cfg), structure(&base));
            } else {
                prop_assert!(structure(&cfg).len() < structure(&base).len());
            }
            let (again, _) = crate::render_gateway(&one_route(&host, &path, &header), &t).unwrap();
            prop_assert_eq!(render, again);
        }
    }
}
