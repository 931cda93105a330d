//! The Ingress translator: `networking.k8s.io/v1` Ingresses of one IngressClass, with their
//! Services, EndpointSlices and TLS Secrets, to the [`Model`].
//!
//! Owns the Ingress semantics: which Ingresses the class serves (`spec.ingressClassName`, or
//! none and the legacy `kubernetes.io/ingress.class` annotation, or neither and the class is
//! the default), hosts (exact, lowercased; `*.suffix` matches exactly one
//! label), `pathType` Exact, Prefix (segment-wise: `/foo` matches `/foo` and `/foo/…`, never
//! `/foobar`; a trailing `/` is ignored) and ImplementationSpecific (here: the same as Prefix),
//! longest match first and Exact before Prefix on equal paths, host ownership (by
//! [`crate::ownership`]: a host, the catch-all of rules without host and `defaultBackend`
//! included, is routed only by its owner's namespace unless hosts are shared; a canary joins
//! only a route of its own namespace; `ssl-passthrough` only on a host its namespace owns; a
//! host whose namespace does not own the default backend answers its unmatched paths 404, and
//! a host nobody of its namespace routes any more keeps an empty table rather than fall to
//! another namespace's wildcard or catch-all), several Ingresses on one host merged (a
//! host/path claimed twice goes to the oldest Ingress by creationTimestamp, then
//! namespace/name; the other's path is refused in its own verdict), `defaultBackend` (the same
//! rule), TLS from `kubernetes.io/tls` Secrets, Service ports by number and by name (the
//! target port comes from the EndpointSlice port of the same name), and endpoints from
//! EndpointSlices only (ready, or serving and terminating as draining), and each Ingress's
//! annotations (read by [`annotations`]: a bad value refuses the whole Ingress, backends
//! named with different options refuse the later Ingress's path). A Service that is missing
//! answers 503 and warns. It must never let one bad object block the others, nor put a
//! value into the Model that the map builder or the template cannot quote.

use haptic_haproxy::names::is_section_name;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Display;
use std::net::IpAddr;
use std::sync::Arc;

use haptic_haproxy::quote;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};

use self::annotations::{Allowed, BackendOptions, Policy};
use crate::model::{
    Cause, Cert, HostMatch, Model, ObjectRef, PathKind, PathRewrite, Refusal, Verdict, Why, UNAVAILABLE,
};
use crate::ownership::{Claim, Claimant, HostSharing, Owners};
use crate::slots::SlotMap;
pub use crate::sources::common::SERVICE_NAME_LABEL;
use crate::sources::common::{obj, parse_host, secret_pem, unique_id};

mod admit;
pub mod annotations;
mod assemble;
mod incremental;

pub use incremental::Incremental;

/// The controller name an IngressClass must have for haptic to serve it.
pub const INGRESS_CONTROLLER: &str = "haptic.dev/ingress-controller";
/// The annotation marking the default IngressClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

/// Everything the Ingress translator reads.
#[derive(Debug, Clone, Default)]
pub struct IngressInput {
    /// The class served.
    pub class: IngressClass,
    /// All Ingresses seen (those of other classes are ignored, without verdict).
    pub ingresses: Vec<Arc<Ingress>>,
    /// Services.
    pub services: Vec<Arc<Service>>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// TLS Secrets the Ingresses name.
    pub secrets: Vec<Arc<Secret>>,
    /// The last ACKed render's slot map.
    pub previous_slots: SlotMap,
    /// Listening and slot settings.
    pub settings: Settings,
    /// What the admin allows Ingress annotations to bring.
    pub allowed: Allowed,
    /// Allowed snippets (as [`snippet_checks`] gives them) that `haproxy -c` refused in their own
    /// backend, with its words: the Ingresses bringing them are refused.
    pub refused_snippets: BTreeMap<String, String>,
    /// Objects (Ingresses, Secrets) left out of this render, each with why: an Ingress is
    /// refused whole, a Secret is read as missing ([`crate::narrow`] decides which).
    pub excluded: BTreeMap<ObjectRef, crate::narrow::Exclusion>,
    /// Whether namespaces may share a host ([`crate::ownership`]).
    pub sharing: HostSharing,
}

/// An allowed snippet an Ingress brings, and the config `haproxy -c` checks it in on its own
/// (`haptic_haproxy::snippet::check_config`): a shell runs the check and hands back the refused
/// ones as [`IngressInput::refused_snippets`], so a snippet that does not parse refuses only its
/// Ingress and never fails the render's gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnippetCheck {
    /// The first Ingress bringing it.
    pub object: ObjectRef,
    /// The snippet as it joins its backend (the key of [`IngressInput::refused_snippets`]).
    pub snippet: String,
    /// The config to check.
    pub config: String,
}

/// The allowed snippets the served Ingresses bring, once each, in object order.
pub fn snippet_checks(input: &IngressInput) -> Vec<SnippetCheck> {
    let mut out: Vec<SnippetCheck> = Vec::new();
    let mut ings: Vec<&Ingress> = input.ingresses.iter().map(|i| &**i).filter(|i| served(&input.class, i)).collect();
    ings.sort_by_key(|i| obj("Ingress", &i.metadata));
    for ing in ings {
        let has_tls = ing.spec.as_ref().and_then(|s| s.tls.as_ref()).is_some_and(|t| !t.is_empty());
        let empty = BTreeMap::new();
        let Ok((m, _)) = annotations::read(ing.metadata.annotations.as_ref().unwrap_or(&empty), has_tls, input.allowed)
        else {
            continue;
        };
        if let Some(snippet) = m.backend.snippet {
            if !out.iter().any(|c| c.snippet == snippet) {
                let config = haptic_haproxy::snippet::check_config(&snippet);
                out.push(SnippetCheck { object: obj("Ingress", &ing.metadata), snippet, config });
            }
        }
    }
    out
}

/// Listening and slot settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Address to bind.
    pub bind_address: IpAddr,
    /// Plain HTTP port.
    pub http_port: u16,
    /// HTTPS port (used when some Ingress has a valid TLS Secret).
    pub https_port: u16,
    /// Minimum server slots per backend.
    pub min_slots: usize,
    /// A `health` frontend on this port answering `/healthz` and `/ready` with 200 (the pods'
    /// probes), when set.
    pub health_port: Option<u16>,
    /// What is done to request paths before routing.
    pub paths: crate::model::PathNormalization,
    /// What every request meets before it is routed (logs, forwarded headers, timeouts, …).
    pub edge: crate::edge::Edge,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            bind_address: IpAddr::from([0, 0, 0, 0]),
            http_port: 8080,
            https_port: 8443,
            min_slots: 8,
            health_port: None,
            paths: crate::model::PathNormalization::Normalize,
            edge: crate::edge::Edge::default(),
        }
    }
}

/// The class an Ingress names without `spec.ingressClassName`, deprecated by Kubernetes but
/// still set by some tools (cert-manager's HTTP-01 solver Ingresses, older charts).
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// Whether `class` is ours and serves `ing`: `spec.ingressClassName` names it, or, without
/// one, the legacy class annotation does, or, without either, it is the default class.
pub fn served(class: &IngressClass, ing: &Ingress) -> bool {
    let ours = class.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(INGRESS_CONTROLLER);
    let name = class.metadata.name.as_deref().unwrap_or_default();
    let default = class.metadata.annotations.as_ref().and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION)).map(String::as_str)
        == Some("true");
    let legacy = ing.metadata.annotations.as_ref().and_then(|a| a.get(LEGACY_CLASS_ANNOTATION));
    ours && match (ing.spec.as_ref().and_then(|s| s.ingress_class_name.as_deref()), legacy) {
        (Some(c), _) => c == name,
        (None, Some(c)) => c.trim() == name,
        (None, None) => default,
    }
}

/// The Secrets (namespace, name) that the Ingresses `class` serves name, for TLS, basic
/// authentication (`auth-secret`) and TLS towards backends (`proxy-ssl-secret`), either prefix:
/// the only Secrets the translator reads.
pub fn tls_secret_refs<'a>(
    class: &IngressClass,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
) -> std::collections::BTreeSet<(String, String)> {
    let mut out = std::collections::BTreeSet::new();
    for ing in ingresses.into_iter().filter(|i| served(class, i)) {
        let ns = ing.metadata.namespace.clone().unwrap_or_default();
        for t in ing.spec.as_ref().and_then(|s| s.tls.as_deref()).unwrap_or_default() {
            if let Some(name) = t.secret_name.as_deref().filter(|n| !n.is_empty()) {
                out.insert((ns.clone(), name.to_string()));
            }
        }
        let a = ing.metadata.annotations.as_ref();
        for p in [annotations::NGINX_PREFIX, annotations::HAPTIC_PREFIX] {
            for key in ["auth-secret", "proxy-ssl-secret"] {
                let Some(v) = a.and_then(|a| a.get(&format!("{p}{key}"))).map(|n| n.trim()) else { continue };
                // `ns/name` only for this namespace: never another namespace's Secret.
                let name = match v.split_once('/') {
                    Some((other, n)) if other == ns => n,
                    Some(_) => continue,
                    None => v,
                };
                if !name.is_empty() {
                    out.insert((ns.clone(), name.to_string()));
                }
            }
        }
    }
    out
}

/// A host table's id in the maps: `h` and the [`unique_id`] of the host as it is matched, so
/// hosts coming and going never move another host's id.
pub fn host_id(host: &HostMatch, taken: &HashSet<String>) -> String {
    unique_id("h", &[&host_name(host)], taken)
}

/// The host as its id is taken: the match kind's sign, then the name.
fn host_name(host: &HostMatch) -> String {
    match host {
        HostMatch::Exact(h) => format!("={h}"),
        HostMatch::Wildcard(s) => format!("*{s}"),
        HostMatch::Suffix(s) => format!("+{s}"),
        HostMatch::Any => String::new(),
    }
}

/// A rule's id in the maps: `r` and the [`unique_id`] of its host, path and path kind. A
/// host/path is one namespace's (ownership), so an id, once in the maps, only ever stands for
/// that namespace's rule, whatever other routes come and go.
fn rule_id(host: &HostMatch, path: &str, kind: PathKind, taken: &HashSet<String>) -> String {
    // The kind's `Debug` name, as ids have always been made of.
    let kind = match kind {
        PathKind::Exact => "Exact",
        PathKind::Prefix => "Prefix",
        PathKind::Regex => "Regex",
    };
    unique_id("r", &[&host_name(host), path, kind], taken)
}

/// Where a host/path sends a request, and what it does to it on the way.
#[derive(Debug, Clone)]
struct Route {
    backend: String,
    /// The Ingress's policy, one allocation shared by all its routes.
    policy: Arc<Policy>,
    /// (pattern anchored at the start, `replace-path` format).
    rewrite: Option<PathRewrite>,
    source: ObjectRef,
    canary: Option<RouteCanary>,
}

/// A canary joined to a route.
#[derive(Debug, Clone)]
struct RouteCanary {
    backend: String,
    canary: annotations::Canary,
    /// The weighted backend's name.
    weighted: String,
}

/// Whether `ing` says it is a canary (either prefix; a bad value is judged by its reading).
fn is_canary(ing: &Ingress) -> bool {
    let a = ing.metadata.annotations.as_ref();
    [annotations::HAPTIC_PREFIX, annotations::NGINX_PREFIX]
        .iter()
        .any(|p| a.and_then(|a| a.get(&format!("{p}canary"))).is_some_and(|v| v.trim() == "true"))
}

/// The name of the weighted backend holding `main`'s and `canary`'s servers for the canary
/// Ingress `ingress` (of `canary`'s namespace): one per canary Ingress, so two canaries of one
/// pair keep their own weights. Backend names hold no `.`, so only the Ingress's name may.
fn canary_backend(main: &str, canary: &str, ingress: &str) -> String {
    format!("canary.{main}.{canary}.{ingress}")
}

/// The server weights of a weighted backend: (each of the `n_main` main servers, each of the
/// `n_canary` canary servers), so the canary servers together take `weight / total` of the
/// requests. The larger is 256 (HAProxy's most), the other rounded, never 0 when its share is not.
pub fn canary_weights(n_main: usize, n_canary: usize, weight: u32, total: u32) -> (u16, u16) {
    let (nm, nc, w, t) = (n_main as u64, n_canary as u64, u64::from(weight), u64::from(total.max(1)));
    // Per-server shares over the common denominator t * nm * nc.
    let fm = if nm == 0 { 0 } else { (t - w.min(t)) * nc.max(1) };
    let fc = if nc == 0 { 0 } else { w.min(t) * nm.max(1) };
    let top = fm.max(fc);
    let scale = |f: u64| -> u16 {
        if f == 0 {
            0
        } else {
            u16::try_from(((f * 256 + top / 2) / top).max(1)).unwrap_or(256)
        }
    };
    if top == 0 {
        (0, 0)
    } else {
        (scale(fm), scale(fc))
    }
}

/// The rewrite of a path of `kind` to `target`: the pattern HAProxy's `replace-path` matches.
fn rewrite_of(kind: PathKind, path: &str, target: &Option<String>) -> Result<Option<PathRewrite>, String> {
    let Some(t) = target else { return Ok(None) };
    let re = match kind {
        PathKind::Regex => format!("^(?i:{path})"),
        PathKind::Exact => format!("^{}$", quote::regex_literal(path).map_err(|e| e.to_string())?),
        PathKind::Prefix => format!("^{}", quote::regex_literal(path).map_err(|e| e.to_string())?),
    };
    quote::config_arg(&re).map_err(|e| e.to_string())?;
    Ok(Some(PathRewrite::Regex { pattern: re, with: t.clone() }))
}

/// Where a backend's endpoints come from: the EndpointSlices of a Service (`service` in `ns`)
/// and the port of theirs named `port` (`""` for the Service port without name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct EndpointSource {
    ns: String,
    service: String,
    port: String,
}

// The two maps looked up once per path are hash maps: nothing reads them in order.
struct Ctx<'a> {
    /// Services by (namespace, name).
    services: HashMap<(&'a str, &'a str), &'a Service>,
    /// Where each backend's endpoints come from.
    backends: BTreeMap<String, EndpointSource>,
    /// Each backend's options and the Ingress that set them first; a backend is in it exactly
    /// when it is in `backends`.
    options: HashMap<String, (BackendOptions, ObjectRef)>,
    /// Where the `default-backend` endpoints of the backends that have one come from (none: its
    /// Service is missing or has no port, so no endpoints).
    fallbacks: BTreeMap<String, Option<EndpointSource>>,
}

impl<'a> Ctx<'a> {
    /// Indexes the input's Services once, so each lookup is a map lookup.
    fn new(input: &'a IngressInput) -> Self {
        let services = input
            .services
            .iter()
            .filter_map(|s| Some(((s.metadata.namespace.as_deref()?, s.metadata.name.as_deref()?), &**s)))
            .collect();
        Ctx { services, backends: BTreeMap::new(), options: HashMap::new(), fallbacks: BTreeMap::new() }
    }
}

/// The EndpointSlices by (namespace, Service name from their label).
fn slice_index(slices: &[Arc<EndpointSlice>]) -> SliceIndex<'_> {
    let mut out: SliceIndex<'_> = BTreeMap::new();
    for sl in slices {
        let svc = sl.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).map(String::as_str);
        if let (Some(ns), Some(svc)) = (sl.metadata.namespace.as_deref(), svc) {
            out.entry((ns, svc)).or_default().push(sl);
        }
    }
    out
}

/// EndpointSlices by the namespace and Service they belong to.
type SliceIndex<'a> = BTreeMap<(&'a str, &'a str), Vec<&'a Arc<EndpointSlice>>>;

/// The EndpointSlices `src` names among the indexed ones.
fn slices_of<'b>(index: &'b SliceIndex<'_>, src: &'b EndpointSource) -> &'b [&'b Arc<EndpointSlice>] {
    index.get(&(src.ns.as_str(), src.service.as_str())).map_or(&[], Vec::as_slice)
}

impl Ctx<'_> {
    /// Resolves a backend reference to a backend name (or [`UNAVAILABLE`] with a warning). Two
    /// Ingresses naming one backend with different [`BackendOptions`]: the later is refused.
    /// `opts`: what the naming Ingress's annotations set for the backend, and that Ingress.
    fn backend(
        &mut self,
        ns: &str,
        b: &IngressBackend,
        field: &dyn Display,
        opts: (&BackendOptions, &ObjectRef),
        v: &mut Verdict,
    ) -> Result<String, Refusal> {
        let refuse = |f: &str, r: String| Refusal::new(Cause::Invalid, format!("{field}.{f}"), r);
        if b.resource.is_some() {
            return Err(refuse("resource", "resource backends are not supported".into()));
        }
        let Some(svc_ref) = &b.service else { return Err(refuse("service", "no service".into())) };
        let Some(port) = &svc_ref.port else { return Err(refuse("service.port", "no port".into())) };
        let Some(svc) = self.services.get(&(ns, svc_ref.name.as_str())).copied() else {
            v.warnings.push(Refusal::new(
                Cause::Missing,
                format!("{field}.service.name"),
                format!("Service {ns}/{} does not exist: answered with 503", svc_ref.name),
            ));
            return Ok(UNAVAILABLE.to_string());
        };
        let ports = svc.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default();
        let (sp, label) = match (&port.name, port.number) {
            (Some(n), _) => (ports.iter().find(|p| p.name.as_deref() == Some(n)), n.clone()),
            (None, Some(num)) => (ports.iter().find(|p| p.port == num), num.to_string()),
            (None, None) => return Err(refuse("service.port", "neither name nor number".into())),
        };
        let Some(sp) = sp else {
            return Err(refuse("service.port", format!("Service {ns}/{} has no port {label}", svc_ref.name)));
        };
        // One backend per Service port, however the Ingress names it: by the port's name when
        // it has one, else by its number.
        let canonical = sp.name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| sp.port.to_string());
        // A passthrough backend is `mode tcp`: one of its own beside the Service port's HTTP one.
        let tcp = if opts.0.passthrough { ".tcp" } else { "" };
        let name = format!("{ns}_{}_{canonical}{tcp}", svc_ref.name);
        if !is_section_name(&name) {
            return Err(refuse("service", format!("{name:?} is not a backend name (DNS labels and port names only)")));
        }
        match self.options.get(&name) {
            Some((o, by)) if o != opts.0 => {
                return Err(Refusal::new(
                    Cause::Conflict,
                    format!("{field}.service"),
                    format!("backend {name} is set up differently by {by} (timeouts, protocol or snippet annotations)"),
                ))
            }
            Some(_) => return Ok(name),
            None => {
                self.options.insert(name.clone(), (opts.0.clone(), opts.1.clone()));
            }
        }
        let port = sp.name.clone().unwrap_or_default();
        self.backends.insert(name.clone(), EndpointSource { ns: ns.into(), service: svc_ref.name.clone(), port });
        if let Some(fb) = &opts.0.fallback {
            let src = match self.services.get(&(ns, fb.as_str())).copied() {
                Some(svc) => {
                    let first = svc.spec.as_ref().and_then(|s| s.ports.as_deref()).and_then(|p| p.first());
                    first.map(|p| EndpointSource {
                        ns: ns.into(),
                        service: fb.clone(),
                        port: p.name.clone().unwrap_or_default(),
                    })
                }
                None => {
                    v.warnings.push(Refusal {
                        cause: Cause::Missing,
                        field: annotations::field_of_key("default-backend"),
                        message: format!("Service {ns}/{fb} does not exist: no backup servers"),
                    });
                    None
                }
            };
            self.fallbacks.insert(name.clone(), src);
        }
        Ok(name)
    }
}

/// Who an Ingress is, by age.
fn claimant(ing: &Ingress) -> Claimant {
    Claimant {
        created: ing.metadata.creation_timestamp.as_ref().map(|t| t.0),
        namespace: ing.metadata.namespace.clone().unwrap_or_default(),
        name: ing.metadata.name.clone().unwrap_or_default(),
    }
}

/// The hosts `ing` claims, valid or not otherwise (an Ingress refused for another reason, or
/// left out, keeps its hosts): its rules' hosts (the catch-all for a rule without host), the
/// catch-all for `defaultBackend`, and its `server-alias` hosts. A canary claims nothing: it
/// joins routes of its own namespace.
fn claims(ing: &Ingress, allowed: Allowed) -> Vec<Claim> {
    if is_canary(ing) {
        return Vec::new();
    }
    let spec = ing.spec.clone().unwrap_or_default();
    let has_tls = !spec.tls.as_deref().unwrap_or_default().is_empty();
    let empty = BTreeMap::new();
    let meaning = annotations::read(ing.metadata.annotations.as_ref().unwrap_or(&empty), has_tls, allowed).ok();
    let exclusive = meaning.as_ref().is_some_and(|(m, _)| m.backend.passthrough);
    let by = claimant(ing);
    let claim = |host: HostMatch, exclusive: bool| Claim { host, by: by.clone(), exclusive };
    let mut out = Vec::new();
    for rule in spec.rules.as_deref().unwrap_or_default().iter().filter(|r| r.http.is_some()) {
        match rule.host.as_deref() {
            None | Some("") => out.push(claim(HostMatch::Any, false)),
            Some(h) => out.extend(parse_host(h).ok().map(|h| claim(h, exclusive))),
        }
    }
    if spec.default_backend.is_some() {
        out.push(claim(HostMatch::Any, false));
    }
    for alias in meaning.iter().flat_map(|(m, _)| &m.paths.aliases) {
        out.push(claim(alias.clone(), false));
    }
    out
}

/// Where a request for `host` goes when `host` has no table: a wildcard table matching it,
/// else the catch-all.
fn fallthrough(host: &HostMatch) -> Vec<HostMatch> {
    match host {
        HostMatch::Exact(h) => {
            let wild = h.split_once('.').map(|(_, rest)| HostMatch::Wildcard(format!(".{rest}")));
            wild.into_iter().chain([HostMatch::Any]).collect()
        }
        HostMatch::Wildcard(_) | HostMatch::Suffix(_) => vec![HostMatch::Any],
        HostMatch::Any => vec![],
    }
}

/// The host tables that must exist though no route of theirs was accepted: a claimed host
/// whose requests would otherwise reach a wildcard or catch-all routed by a namespace that may
/// not route the host. Passthrough-only hosts have no HTTP table.
fn kept_hosts(owners: &Owners, claims: &[Claim], routed: &BTreeSet<HostMatch>) -> BTreeSet<HostMatch> {
    let http: BTreeSet<&HostMatch> = claims.iter().filter(|c| !c.exclusive).map(|c| &c.host).collect();
    let mut out = BTreeSet::new();
    for (host, _) in owners.hosts().filter(|(h, _)| **h != HostMatch::Any && http.contains(h)) {
        let mine = owners.namespaces(host);
        let taken = fallthrough(host).into_iter().find(|f| routed.contains(f));
        if let Some(f) = taken {
            if owners.namespaces(&f).iter().any(|ns| !mine.contains(ns)) {
                out.insert(host.clone());
            }
        }
    }
    out
}

/// A route's key: (host, path, kind).
type RouteKey = (HostMatch, String, PathKind);

/// What the served Ingresses add up to, gathered one Ingress at a time ([`admit`]) and then
/// turned into the Model ([`assemble`]).
struct Routes<'a> {
    ctx: Ctx<'a>,
    routes: BTreeMap<RouteKey, Route>,
    default: Option<Route>,
    certs: BTreeMap<String, Cert>,
    userlists: BTreeMap<String, crate::model::Userlist>,
    upstream_certs: BTreeMap<String, Cert>,
    /// SNI host → (backend, Ingress).
    passthrough: BTreeMap<String, (String, ObjectRef)>,
    /// Some TLS entry has no Secret and is served the default certificate (HTTPS is needed).
    default_tls: bool,
}

/// What an input translates to before its endpoints: the Model without its backends, one
/// verdict per served Ingress, and what each backend wants. None of it reads an EndpointSlice
/// or the previous slot map.
#[derive(Debug)]
struct Translated {
    model: Model,
    verdicts: Vec<Verdict>,
    wants: assemble::Wants,
}

/// Translates all but the endpoints (see [`Translated`]).
fn translate_routes(input: &IngressInput) -> Translated {
    let mut ings: Vec<&Ingress> = input.ingresses.iter().map(|i| &**i).filter(|i| served(&input.class, i)).collect();
    // Canaries last: they join the routes the others made.
    ings.sort_by_key(|i| {
        (is_canary(i), i.metadata.creation_timestamp.as_ref().map(|t| t.0), obj("Ingress", &i.metadata))
    });
    let all_claims: Vec<Claim> = ings.iter().flat_map(|i| claims(i, input.allowed)).collect();
    let owners = Owners::new(all_claims.clone(), input.sharing);
    let mut acc = Routes {
        ctx: Ctx::new(input),
        routes: BTreeMap::new(),
        default: None,
        certs: BTreeMap::new(),
        userlists: BTreeMap::new(),
        upstream_certs: BTreeMap::new(),
        passthrough: BTreeMap::new(),
        default_tls: false,
    };
    let mut verdicts: Vec<Verdict> =
        ings.into_iter().map(|ing| admit::ingress(input, &owners, ing, &mut acc)).collect();
    verdicts.sort_by(|a, b| a.object.cmp(&b.object));
    let (model, wants) = assemble::model(input, &owners, &all_claims, acc);
    Translated { model, verdicts, wants }
}

/// Translates: the Model, one verdict per served Ingress (and per Secret problem, inside the
/// Ingress's verdict), and the slot map of this render.
pub fn translate_ingress(input: &IngressInput) -> (Model, Vec<Verdict>, SlotMap) {
    let Translated { mut model, verdicts, wants } = translate_routes(input);
    let (backends, slot_map) = wants.backends(input, &mut assemble::BackendMemo::default());
    model.backends = backends;
    (model, verdicts, slot_map)
}

/// Joins the canary `c` (a path of a canary Ingress: its namespace, backend and field) to the
/// route at `key`, made by another Ingress.
fn join_canary(
    ctx: &mut Ctx<'_>,
    routes: &mut BTreeMap<(HostMatch, String, PathKind), Route>,
    key: &(HostMatch, String, PathKind),
    c: &annotations::Canary,
    (ns, backend, field): (&str, &IngressBackend, &dyn Display),
    opts: (&BackendOptions, &ObjectRef),
    v: &mut Verdict,
) -> Result<(), Refusal> {
    let refuse = |cause: Cause, message: String| Refusal::new(cause, format!("{field}.path"), message);
    let (_, path, kind) = key;
    let Some(route) = routes.get(key) else {
        return Err(refuse(
            Cause::Missing,
            format!("no other Ingress routes {kind:?} {path} on this host: a canary needs one"),
        ));
    };
    if route.source.namespace != ns {
        return Err(refuse(
            Cause::NotAllowed,
            format!(
                "{kind:?} {path} on this host is routed by {}: a canary joins only a route of its own namespace",
                route.source
            ),
        ));
    }
    if let Some(other) = &route.canary {
        return Err(refuse(
            Cause::Conflict,
            format!("{kind:?} {path} on this host already has a canary ({})", other.weighted),
        ));
    }
    let main = route.backend.clone();
    let be = ctx.backend(ns, backend, &format_args!("{field}.backend"), opts, v)?;
    if be == main {
        return Err(refuse(Cause::Invalid, format!("the canary's backend is the main one ({main})")));
    }
    let (mo, co) = (ctx.options.get(&main).map(|o| &o.0), ctx.options.get(&be).map(|o| &o.0));
    if main != UNAVAILABLE && be != UNAVAILABLE && mo != co {
        return Err(refuse(
            Cause::Conflict,
            format!(
                "backend {be} is set up differently from {main} (timeouts, protocol, affinity or snippet annotations)"
            ),
        ));
    }
    let name = canary_backend(&main, &be, &opts.1.name);
    if !is_section_name(&name) {
        return Err(refuse(Cause::Invalid, format!("{name:?} is not a backend name")));
    }
    if let Some(route) = routes.get_mut(key) {
        route.canary = Some(RouteCanary { backend: be, canary: c.clone(), weighted: name });
    }
    Ok(())
}

/// The fewest slots a backend with `options` gets for `endpoints`, given its slot count so far
/// (`prev_count`) and the settings' minimum. A backend whose servers cannot be added at runtime
/// (cookie affinity) grows to the next power of two, so its growth reloads only on doublings.
fn slots_for(options: &BackendOptions, endpoints: usize, prev_count: usize, min_slots: usize) -> usize {
    let have = min_slots.max(prev_count);
    if options.affinity.is_some() && endpoints > have {
        endpoints.next_power_of_two()
    } else {
        min_slots
    }
}

/// The files of the Secret `t` names (in `ns`: `name` or `ns/name`): its `ca.crt` and its
/// `tls.crt` with `tls.key`, setting their paths in `t`; or why not.
fn upstream_files(input: &IngressInput, ns: &str, t: &mut annotations::UpstreamTls) -> Result<Vec<Cert>, Why> {
    let name = match t.secret.split_once('/') {
        Some((other, _)) if other != ns => {
            return Err(Why::new(
                Cause::NotAllowed,
                format!("{:?}: only a Secret of this Ingress's namespace ({ns}) can be named", t.secret),
            ))
        }
        Some((_, n)) => n.to_string(),
        None => t.secret.clone(),
    };
    let me = ObjectRef { kind: "Secret".into(), namespace: ns.into(), name: name.clone() };
    if let Some(why) = input.excluded.get(&me) {
        return Err(Why::new(Cause::LeftOut, format!("Secret {ns}/{name} is left out: {why}")));
    }
    let Some(s) = input
        .secrets
        .iter()
        .find(|s| s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(&name))
    else {
        return Err(Why::new(Cause::Missing, format!("Secret {ns}/{name} does not exist")));
    };
    let data = s.data.clone().unwrap_or_default();
    let why = |e: crate::pem::PemError| Why::invalid(format!("Secret {ns}/{name}: {e}"));
    let mut out = Vec::new();
    let cert = |path: String, f: crate::pem::CertFile| Cert {
        path,
        hosts: vec![],
        source: me.clone(),
        pem: f.pem,
        not_after: f.not_after,
    };
    if let Some(ca) = data.get("ca.crt") {
        let path = format!("certs/upstream_{ns}_{name}_ca.pem");
        t.ca_file = Some(path.clone());
        out.push(cert(path, crate::pem::ca_bundle("ca.crt", &ca.0).map_err(why)?));
    } else if t.verify {
        return Err(Why::invalid(format!("Secret {ns}/{name} has no ca.crt to verify the backends with")));
    }
    match (data.get("tls.crt"), data.get("tls.key")) {
        (Some(c), Some(k)) => {
            let path = format!("certs/upstream_{ns}_{name}_client.pem");
            t.client_cert = Some(path.clone());
            out.push(cert(path, crate::pem::certified(&c.0, &k.0).map_err(why)?));
        }
        (None, None) => {}
        _ => return Err(Why::invalid(format!("Secret {ns}/{name}: tls.crt and tls.key go together"))),
    }
    if out.is_empty() {
        return Err(Why::invalid(format!("Secret {ns}/{name} has neither ca.crt nor tls.crt/tls.key")));
    }
    Ok(out)
}

/// The userlist of the Secret `a` names in `ns`, or why not.
fn auth_users(input: &IngressInput, ns: &str, a: &annotations::AuthRequest) -> Result<crate::model::Userlist, Why> {
    let me = ObjectRef { kind: "Secret".into(), namespace: ns.into(), name: a.secret.clone() };
    if let Some(why) = input.excluded.get(&me) {
        return Err(Why::new(Cause::LeftOut, format!("Secret {ns}/{} is left out: {why}", a.secret)));
    }
    let Some(s) = input
        .secrets
        .iter()
        .find(|s| s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(&a.secret))
    else {
        return Err(Why::new(Cause::Missing, format!("Secret {ns}/{} does not exist", a.secret)));
    };
    let data: BTreeMap<String, Vec<u8>> =
        s.data.clone().unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    let users = annotations::users(&data, a.map).map_err(|e| Why::invalid(format!("Secret {ns}/{}: {e}", a.secret)))?;
    let name = format!("auth_{ns}_{}", a.secret);
    if !is_section_name(&name) {
        return Err(Why::invalid(format!("{name:?} is not a userlist name")));
    }
    Ok(crate::model::Userlist {
        name,
        users,
        source: ObjectRef { kind: "Secret".into(), namespace: ns.into(), name: a.secret.clone() },
    })
}

/// The certificate file (chain, then key) of a `kubernetes.io/tls` Secret, or why not.
fn tls_pem(input: &IngressInput, ns: &str, name: &str) -> Result<crate::pem::CertFile, Why> {
    if let Some(why) = input.excluded.get(&ObjectRef { kind: "Secret".into(), namespace: ns.into(), name: name.into() })
    {
        return Err(Why::new(Cause::LeftOut, format!("Secret {ns}/{name} is left out: {why}")));
    }
    secret_pem(&input.secrets, ns, name)
}

/// Fixture loading shared by the unit tests and the integration tests' copies.
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;

    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub(crate) struct Fixture {
        pub ingresses: Vec<Ingress>,
        pub services: Vec<Service>,
        pub endpoint_slices: Vec<EndpointSlice>,
        pub secrets: Vec<Secret>,
    }

    pub(crate) fn class() -> IngressClass {
        let mut c = IngressClass::default();
        c.metadata.name = Some("haptic".into());
        c.spec = Some(k8s_openapi::api::networking::v1::IngressClassSpec {
            controller: Some(INGRESS_CONTROLLER.into()),
            ..Default::default()
        });
        c
    }

    /// The Model (with its backends) that a render of the fixture `yaml` hands the template.
    pub(crate) fn model(yaml: &str) -> crate::model::Model {
        let i = input(yaml);
        let mut t = translate_routes(&i);
        t.model.backends = t.wants.backends(&i, &mut assemble::BackendMemo::default()).0;
        t.model
    }

    pub(crate) fn input(yaml: &str) -> IngressInput {
        let f: Fixture = serde_saphyr::from_str(yaml).unwrap();
        IngressInput {
            class: class(),
            ingresses: f.ingresses.into_iter().map(Arc::new).collect(),
            services: f.services.into_iter().map(Arc::new).collect(),
            endpoint_slices: f.endpoint_slices.into_iter().map(Arc::new).collect(),
            secrets: f.secrets.into_iter().map(Arc::new).collect(),
            previous_slots: SlotMap::default(),
            settings: Settings { min_slots: 2, ..Settings::default() },
            allowed: Allowed::default(),
            refused_snippets: BTreeMap::new(),
            excluded: BTreeMap::new(),
            sharing: HostSharing::Namespace,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::input;
    use super::*;

    const BASIC: &str = include_str!("../../../tests/fixtures/basic.yaml");

    fn verdict<'a>(v: &'a [Verdict], name: &str) -> &'a Verdict {
        v.iter().find(|v| v.object.name == name).unwrap()
    }

    #[test]
    fn the_class_is_named_by_the_field_else_the_legacy_annotation_else_the_default() {
        let class = |default: bool| -> IngressClass {
            let mut c = IngressClass::default();
            c.metadata.name = Some("haptic".into());
            c.spec = Some(k8s_openapi::api::networking::v1::IngressClassSpec {
                controller: Some(INGRESS_CONTROLLER.into()),
                ..Default::default()
            });
            if default {
                c.metadata.annotations = Some([(DEFAULT_CLASS_ANNOTATION.to_string(), "true".to_string())].into());
            }
            c
        };
        let ing = |field: Option<&str>, legacy: Option<&str>| -> Ingress {
            let mut i = Ingress {
                spec: Some(k8s_openapi::api::networking::v1::IngressSpec {
                    ingress_class_name: field.map(str::to_string),
                    ..Default::default()
                }),
                ..Default::default()
            };
            i.metadata.annotations = legacy.map(|l| [(LEGACY_CLASS_ANNOTATION.to_string(), l.to_string())].into());
            i
        };
        let (ours, default) = (class(false), class(true));
        assert!(served(&ours, &ing(Some("haptic"), None)));
        assert!(!served(&ours, &ing(Some("nginx"), Some("haptic"))), "the field wins over the annotation");
        assert!(served(&ours, &ing(None, Some("haptic"))), "cert-manager's solver Ingresses");
        assert!(!served(&default, &ing(None, Some("nginx"))), "another class's, even for the default class");
        assert!(served(&default, &ing(None, None)));
        assert!(!served(&ours, &ing(None, None)));
    }

    #[test]
    fn precedence_merging_and_refusals() {
        let (model, verdicts, _) = translate_ingress(&input(BASIC));
        // Another class's Ingress gets no verdict.
        assert_eq!(verdicts.len(), 2);
        let old = verdict(&verdicts, "old");
        assert!(old.accepted(), "{old:?}");
        let young = verdict(&verdicts, "young");
        let fields: Vec<&str> = young.refusals.iter().map(|r| r.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.defaultBackend",
                "spec.rules[0].http.paths[0].path",
                "spec.rules[0].http.paths[3].backend.service.port",
                "spec.tls[0].secretName",
            ],
            "{young:?}"
        );
        assert_eq!((young.refusals[1].cause, young.refusals[3].cause), (Cause::Conflict, Cause::Missing), "{young:?}");
        assert_eq!(young.warnings.len(), 1);
        assert_eq!(young.warnings[0].field, "spec.rules[0].http.paths[2].backend.service.name");
        // Hosts: the exact host (lowercased) before the wildcard.
        assert_eq!(model.hosts[0].host, HostMatch::Exact("shop.example.com".into()));
        assert_eq!(model.hosts[1].host, HostMatch::Wildcard(".example.com".into()));
        // Paths longest first; ImplementationSpecific is a prefix.
        let paths: Vec<(&str, PathKind)> = model.hosts[0].paths.iter().map(|p| (p.path.as_str(), p.kind)).collect();
        assert_eq!(
            paths,
            [
                ("/exact", PathKind::Exact),
                ("/cart", PathKind::Prefix),
                ("/gone", PathKind::Prefix),
                ("/api", PathKind::Prefix)
            ]
        );
        // The old Ingress's /api goes to api by its port name; the missing Service to 503.
        let rule = |path: &str| {
            let id = &model.hosts[0].paths.iter().find(|p| p.path == path).unwrap().rule;
            model.rules.iter().find(|r| &r.id == id).unwrap().backend.clone()
        };
        assert_eq!(rule("/api"), "shop_api_http");
        assert_eq!(rule("/gone"), crate::model::UNAVAILABLE);
        assert_eq!(model.default_rule.as_deref(), Some("default"));
        assert!(model.certs.is_empty());
    }

    const ANNOTATIONS: &str = include_str!("../../../tests/fixtures/annotations.yaml");

    #[test]
    fn annotations_become_policies_and_backend_options() {
        let (model, verdicts, _) = translate_ingress(&input(ANNOTATIONS));
        let v = |n: &str| verdict(&verdicts, n).clone();
        // A bad value refuses the whole Ingress: none of its routes is served.
        let moved = v("moved");
        assert_eq!(moved.refusals.len(), 1, "{moved:?}");
        assert_eq!(moved.refusals[0].field, "metadata.annotations[haptic.dev/permanent-redirect]");
        assert!(!model.hosts.iter().any(|h| h.host == HostMatch::Exact("old.example.com".into())));
        // An unsupported key warns and the Ingress serves.
        let open = v("open");
        assert!(open.accepted(), "{open:?}");
        assert_eq!(open.warnings[0].field, "metadata.annotations[nginx.ingress.kubernetes.io/mirror-target]");
        // Snippets are off: refused in that Ingress's verdict, the others serve.
        let snippet = v("snippet");
        assert_eq!(snippet.refusals[0].cause, Cause::NotAllowed, "{snippet:?}");
        // The later Ingress naming `web` with other timeouts is refused that path.
        let same = v("same-backend");
        assert_eq!(same.refusals[0].cause, Cause::Conflict, "{same:?}");
        assert!(v("guarded").accepted() && v("moved-ok").accepted());
        let web = model.backends.iter().find(|b| b.name == "shop_web_80").unwrap();
        assert_eq!(web.options.server_timeout, Some(60));
        // Four distinct policies (guarded, open, moved-ok, secure), each rule naming its own.
        assert_eq!(model.policies.len(), 4, "{:?}", model.policies);
        let grpc = model.backends.iter().find(|b| b.name == "shop_grpc_80").unwrap();
        assert_eq!(grpc.options.protocol, crate::model::Protocol::H2c);
        let policy_of = |host: &str| {
            let t = model.hosts.iter().find(|h| h.host == HostMatch::Exact(host.into())).unwrap();
            let r = model.rules.iter().find(|r| r.id == t.paths[0].rule).unwrap();
            let id = r.policy.clone().unwrap();
            model.policies.iter().find(|p| p.id == id).unwrap().policy.clone()
        };
        let g = policy_of("guarded.example.com");
        assert_eq!(g.allow.as_ref().unwrap()[0].to_string(), "10.0.0.0/8");
        assert_eq!((g.max_body, g.app_root.as_deref()), (Some(1024), Some("/app")));
        assert_eq!(policy_of("open.example.com").deny[0].to_string(), "192.0.2.0/24");
        assert_eq!(policy_of("older.example.com").redirect.unwrap().code(), 308);
    }

    #[test]
    fn a_route_added_or_removed_keeps_policy_ids_and_the_config() {
        let base = input(ANNOTATIONS);
        let render = |i: &IngressInput| crate::render(i, &Default::default()).unwrap();
        let before = render(&base);
        let mut more = base.clone();
        let mut extra = (**more.ingresses.iter().find(|i| i.metadata.name.as_deref() == Some("open")).unwrap()).clone();
        extra.metadata.name = Some("open-2".into());
        extra.metadata.creation_timestamp = None;
        let rule = &mut extra.spec.as_mut().unwrap().rules.as_mut().unwrap()[0];
        rule.host = Some("another.example.com".into());
        more.ingresses.push(std::sync::Arc::new(extra));
        let after = render(&more);
        assert_eq!(
            String::from_utf8_lossy(&before.files["haproxy.cfg"]),
            String::from_utf8_lossy(&after.files["haproxy.cfg"]),
            "a route with an existing policy changes maps only"
        );
        assert_ne!(before.files["maps/policies.map"], after.files["maps/policies.map"]);
    }

    const NGINX: &str = include_str!("../../../tests/fixtures/nginx.yaml");

    #[test]
    fn regex_paths_rewrites_aliases_and_affinity() {
        let r = crate::render(&input(NGINX), &Default::default()).unwrap();
        let v = |n: &str| verdict(&r.verdicts, n).clone();
        for n in ["rewrite", "regex", "vhost", "sticky"] {
            assert!(v(n).accepted(), "{:?}", v(n));
        }
        // The catastrophic regex is refused on its own path; the Ingress's other path serves.
        let bad = v("bad-regex");
        assert_eq!(bad.refusals.len(), 1, "{bad:?}");
        assert_eq!(bad.refusals[0].field, "spec.rules[0].http.paths[0].path");
        assert_eq!(bad.refusals[0].cause, Cause::Invalid, "{bad:?}");
        let file = |f: &str| String::from_utf8(r.files[f].clone()).unwrap();
        let regex = file("maps/paths_regex.map");
        let lines: Vec<&str> = regex.lines().collect();
        // Longest first; each under its host id, case-insensitive, anchored at the start.
        assert_eq!(lines.len(), 3, "{regex}");
        let hosts = file("maps/hosts.map");
        let id = |host: &str| hosts.lines().find_map(|l| l.strip_prefix(&format!("{host} "))).unwrap().to_string();
        assert!(lines[0].starts_with(&format!("^{}~(?i:/static/.*\\.css$) r", id("re.example.com"))), "{regex}");
        assert!(lines[1].starts_with(&format!("^{}~(?i:/foo(/|$)(.*)) r", id("rw.example.com"))), "{regex}");
        assert!(lines[2].starts_with(&format!("^{}~(?i:/ok) r", id("bad.example.com"))), "{regex}");
        // The Exact path stays exact, and rewrites by its literal self.
        assert!(file("maps/paths_exact.map").contains("/exact r"));
        let cfg = file("haproxy.cfg");
        assert!(cfg.contains("map_reg(maps/paths_regex.map)"), "{cfg}");
        let (model, _, _) = translate_ingress(&input(NGINX));
        let rewrite = |regex: &str| {
            let is = |w: &&crate::model::RewriteEntry| matches!(&w.rewrite, PathRewrite::Regex { pattern, .. } if pattern == regex);
            model.rewrites.iter().find(is).unwrap().id.clone()
        };
        let (foo, exact) = (rewrite("^(?i:/foo(/|$)(.*))"), rewrite("^/exact$"));
        let line =
            format!("http-request replace-path '^(?i:/foo(/|$)(.*))' '/\\2' if {{ var(txn.rewrite) -m str {foo} }}");
        assert!(cfg.contains(&line), "{line}\n{cfg}");
        let line = format!("http-request replace-path '^/exact$' '/\\2' if {{ var(txn.rewrite) -m str {exact} }}");
        assert!(cfg.contains(&line), "{line}\n{cfg}");
        assert_eq!(file("maps/rewrites.map").lines().count(), 2);
        // upstream-vhost is a policy line; the aliases route like the Ingress's own host.
        assert!(cfg.contains("http-request set-header host 'internal.example' if { var(txn.policy) -m str p"), "{cfg}");
        let hosts = file("maps/hosts.map");
        assert!(hosts.contains("alias.example.com h") && hosts.contains("vhost.example.com h"), "{hosts}");
        assert!(file("maps/wildcards.map").contains(".alias.example.org h"));
        // Cookie affinity: the cookie line and each server's cookie, its name.
        assert!(
            cfg.contains("    cookie 'route' insert indirect nocache httponly attr 'Max-Age=60' attr 'Path=/' attr 'SameSite=Strict' secure\n"),
            "{cfg}"
        );
        assert!(cfg.contains("server SRV_1 10.0.1.1:8080 cookie SRV_1\n"), "{cfg}");
        assert!(cfg.contains("server SRV_2 10.0.1.1:8081 cookie SRV_2\n"), "{cfg}");
    }

    #[test]
    fn an_alias_never_takes_another_ingress_path() {
        let mut i = input(NGINX);
        let vhost = std::sync::Arc::make_mut(
            i.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some("vhost")).unwrap(),
        );
        vhost
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("nginx.ingress.kubernetes.io/server-alias".into(), "rw.example.com".into());
        let mut exact = (*i.ingresses[0]).clone();
        exact.metadata.name = Some("rw-root".into());
        exact.metadata.annotations = None;
        let rule = &mut exact.spec.as_mut().unwrap().rules.as_mut().unwrap()[0];
        rule.http.as_mut().unwrap().paths.truncate(1);
        rule.http.as_mut().unwrap().paths[0].path = Some("/".into());
        i.ingresses.push(std::sync::Arc::new(exact));
        let (_, verdicts, _) = translate_ingress(&i);
        let v = verdict(&verdicts, "vhost");
        assert!(v.accepted(), "{v:?}");
        assert_eq!(v.warnings[0].field, "metadata.annotations[nginx.ingress.kubernetes.io/server-alias]", "{v:?}");
        assert_eq!(v.warnings[0].cause, Cause::Conflict, "{v:?}");
    }

    const CANARY: &str = include_str!("../../../tests/fixtures/canary.yaml");

    #[test]
    fn canary_weights_split_by_share_per_server() {
        assert_eq!(canary_weights(1, 1, 20, 100), (256, 64));
        assert_eq!(canary_weights(1, 1, 50, 100), (256, 256));
        assert_eq!(canary_weights(1, 1, 0, 100), (256, 0));
        assert_eq!(canary_weights(1, 1, 100, 100), (0, 256));
        assert_eq!(canary_weights(4, 1, 20, 100), (256, 256), "4 × 20 % each : 20 %");
        assert_eq!(canary_weights(1, 4, 20, 100), (256, 16));
        assert_eq!(canary_weights(10, 1, 1, 100), (256, 26));
        assert_eq!(canary_weights(0, 1, 20, 100), (0, 256), "no main endpoint: all to the canary");
        assert_eq!(canary_weights(1, 0, 20, 100), (256, 0));
        assert_eq!(canary_weights(1, 1, 1, 3), (256, 128));
    }

    #[test]
    fn a_canary_joins_the_route_as_a_weighted_backend() {
        let r = crate::render(&input(CANARY), &Default::default()).unwrap();
        let v = |n: &str| verdict(&r.verdicts, n).clone();
        assert!(v("main").accepted() && v("preview").accepted() && v("by-value").accepted(), "{:?}", r.verdicts);
        let orphan = v("orphan");
        assert_eq!(orphan.refusals[0].cause, Cause::Missing, "{orphan:?}");
        let file = |f: &str| String::from_utf8(r.files[f].clone()).unwrap();
        let cfg = file("haproxy.cfg");
        // The weighted backend: the main's server at 256, the canary's at 64 (20 %).
        assert!(cfg.contains("backend canary.shop_stable_80.shop_preview_80.preview\n"), "{cfg}");
        assert!(
            cfg.contains("    server SRV_1 10.0.0.1:8080 weight 256\n    server SRV_2 10.0.9.1:8080 weight 64\n"),
            "{cfg}"
        );
        // Both rules go to a weighted backend; the selectors pick one of its two outright.
        let rules = file("maps/rules.map");
        assert!(rules.contains(" canary.shop_stable_80.shop_preview_80.preview\n"), "{rules}");
        assert!(rules.contains(" canary.shop_stable_80.shop_preview_80.by-value\n"), "{rules}");
        assert_eq!(file("maps/canary_backends.map").matches("shop_preview_80").count(), 3);
        assert_eq!(file("maps/main_backends.map").matches("shop_stable_80").count(), 3);
        assert_eq!(file("maps/canaries.map").lines().count(), 3);
        // Each selector by the header it reads.
        let (model, _, _) = translate_ingress(&input(CANARY));
        let by = |header: &str| {
            model.canaries.iter().find(|c| format!("{:?}", c.selector).contains(header)).unwrap().id.clone()
        };
        let (cookie, env, beta) = (by("X-Canary"), by("X-Env"), by("X-Beta"));
        for line in [
            "http-request set-var(txn.canary) var(txn.rule),map_str(maps/canaries.map)".to_string(),
            format!("http-request set-var(txn.backend) var(txn.rule),map_str(maps/canary_backends.map) if {{ var(txn.canary) -m str {cookie} }} {{ 'req.cook(canary)' -m str -- always }}"),
            format!("http-request set-var(txn.backend) var(txn.rule),map_str(maps/main_backends.map) if {{ var(txn.canary) -m str {cookie} }} {{ 'req.cook(canary)' -m str -- never }}"),
            format!("http-request set-var(txn.backend) var(txn.rule),map_str(maps/canary_backends.map) if {{ var(txn.canary) -m str {cookie} }} {{ 'req.hdr(X-Canary)' -m str -- always }}"),
            format!("http-request set-var(txn.backend) var(txn.rule),map_str(maps/canary_backends.map) if {{ var(txn.canary) -m str {env} }} {{ 'req.hdr(X-Env)' -m str -- 'staging' }}"),
            format!("http-request set-var(txn.backend) var(txn.rule),map_str(maps/canary_backends.map) if {{ var(txn.canary) -m str {beta} }} {{ 'req.hdr(X-Beta)' -m reg -- '^(alice|bob)$' }}"),
        ] {
            assert!(cfg.contains(&line), "{line}\n{cfg}");
        }
    }

    #[test]
    fn a_weight_shift_is_a_runtime_change() {
        let mut i = input(CANARY);
        let render = |i: &IngressInput| {
            let r = crate::render(i, &Default::default()).unwrap();
            (String::from_utf8(r.files["haproxy.cfg"].clone()).unwrap(), r.slots)
        };
        let (before, slots) = render(&i);
        i.previous_slots = slots;
        let preview = std::sync::Arc::make_mut(
            i.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some("preview")).unwrap(),
        );
        preview
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("nginx.ingress.kubernetes.io/canary-weight".into(), "50".into());
        let (after, _) = render(&i);
        let d = haptic_haproxy::claim::diff_cfg(&before, &after);
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        assert_eq!(
            d.runtime_reasons(),
            ["backend canary.shop_stable_80.shop_preview_80.preview: server SRV_2 weight 64 -> 256"]
        );
    }

    #[test]
    fn a_canary_with_other_backend_options_is_refused() {
        let mut i = input(CANARY);
        let preview = std::sync::Arc::make_mut(
            i.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some("preview")).unwrap(),
        );
        preview
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("nginx.ingress.kubernetes.io/backend-protocol".into(), "GRPC".into());
        let (_, verdicts, _) = translate_ingress(&i);
        let v = verdict(&verdicts, "preview");
        assert_eq!(v.refusals[0].cause, Cause::Conflict, "{v:?}");
    }

    #[test]
    fn ssl_passthrough_routes_exact_hosts_by_sni_to_tcp_backends() {
        let yaml = r#"
ingresses:
  - metadata: {name: pt, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z", annotations: {nginx.ingress.kubernetes.io/ssl-passthrough: "true"}}
    spec:
      ingressClassName: haptic
      rules:
        - host: pt.example.com
          http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}, {path: /x, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
        - host: "*.example.com"
          http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
  - metadata: {name: again, namespace: shop, creationTimestamp: "2026-01-02T00:00:00Z", annotations: {nginx.ingress.kubernetes.io/ssl-passthrough: "true"}}
    spec:
      ingressClassName: haptic
      rules:
        - host: pt.example.com
          http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
  - metadata: {name: plain, namespace: shop, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      ingressClassName: haptic
      rules:
        - host: plain.example.com
          http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
services:
  - metadata: {name: web, namespace: shop}
    spec: {ports: [{port: 80, targetPort: 8080}]}
"#;
        let (model, verdicts, _) = translate_ingress(&input(yaml));
        let pt = verdict(&verdicts, "pt");
        assert_eq!(pt.refusals[0].field, "spec.rules[1].host", "{pt:?}");
        assert!(
            pt.warnings.iter().any(|w| w.cause == Cause::Differs && w.field == "spec.rules[0].http.paths"),
            "{pt:?}"
        );
        let again = verdict(&verdicts, "again");
        assert_eq!(
            (again.refusals[0].cause, again.refusals[0].field.as_str()),
            (Cause::Conflict, "spec.rules[0].host")
        );
        assert_eq!(model.passthrough.len(), 1);
        assert_eq!(
            (model.passthrough[0].host.as_str(), model.passthrough[0].backend.as_str()),
            ("pt.example.com", "shop_web_80.tcp")
        );
        // Its backend is TCP, beside the HTTP one `plain` uses; no HTTP route for its host.
        let names: Vec<&str> = model.backends.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["shop_web_80", "shop_web_80.tcp"]);
        assert!(model.backends[1].options.passthrough);
        assert!(!model.hosts.iter().any(|h| h.host == HostMatch::Exact("pt.example.com".into())));
        assert!(model.frontends.iter().any(|f| f.name == "https"), "the HTTPS port is bound");
        let cfg =
            String::from_utf8(crate::render(&input(yaml), &Default::default()).unwrap().files["haproxy.cfg"].clone())
                .unwrap();
        assert!(cfg.contains("frontend tls_passthrough\n    mode tcp\n"), "{cfg}");
        // It follows the `mode tcp` defaults and carries no `mode` line of its own.
        let (http, tcp) = cfg.split_once("\ndefaults haptic_tcp_backends\n    mode tcp\n").expect("the tcp defaults");
        assert!(tcp.contains("\nbackend shop_web_80.tcp\n    server "), "{cfg}");
        assert!(http.contains("\nbackend shop_web_80\n") && !http.contains("shop_web_80.tcp"), "{cfg}");
        assert!(!cfg.contains("frontend https\n"), "nothing to terminate: {cfg}");
    }

    #[test]
    fn a_default_backend_becomes_backup_servers() {
        let mut i = input(BASIC);
        let ing = std::sync::Arc::make_mut(
            i.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some("old")).unwrap(),
        );
        ing.metadata.annotations =
            Some([("nginx.ingress.kubernetes.io/default-backend".to_string(), "web".to_string())].into());
        let (model, verdicts, slots) = translate_ingress(&i);
        assert!(verdict(&verdicts, "old").accepted(), "{verdicts:?}");
        let api = model.backends.iter().find(|b| b.name == "shop_api_http").unwrap();
        let backups: Vec<(&str, Option<String>)> = api
            .servers
            .iter()
            .filter(|s| s.backup)
            .map(|s| (s.name.as_str(), s.endpoint.map(|e| e.to_string())))
            .collect();
        assert_eq!(
            backups,
            [("BAK_1", Some("10.0.0.1:8080".to_string())), ("BAK_2", Some("10.0.0.2:8080".to_string()))]
        );
        assert!(slots.backends.contains_key("shop_api_http#backup"));
        let cfg =
            String::from_utf8(crate::render(&i, &Default::default()).unwrap().files["haproxy.cfg"].clone()).unwrap();
        assert!(cfg.contains("    server BAK_1 10.0.0.1:8080 backup\n"), "{cfg}");
        // Its slots go with the backend: never a section of their own.
        i.previous_slots = slots;
        i.ingresses.clear();
        let (model, _, s2) = translate_ingress(&i);
        assert!(model.backends.iter().all(|b| is_section_name(&b.name)), "{:?}", s2.retired);
        // The default backend gaining an endpoint beyond its slots is a runtime server add.
        let mut i = input(BASIC);
        let ing = std::sync::Arc::make_mut(
            i.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some("old")).unwrap(),
        );
        ing.metadata.annotations =
            Some([("nginx.ingress.kubernetes.io/default-backend".to_string(), "web".to_string())].into());
        let before = crate::render(&i, &Default::default()).unwrap();
        i.previous_slots = before.slots.clone();
        let mut extra = i.endpoint_slices[0].endpoints[0].clone();
        extra.addresses = vec!["10.0.0.7".into()];
        Arc::make_mut(&mut i.endpoint_slices[0]).endpoints.push(extra);
        let after = crate::render(&i, &Default::default()).unwrap();
        let text = |r: &crate::Render| String::from_utf8(r.files["haproxy.cfg"].clone()).unwrap();
        let d = haptic_haproxy::claim::diff_cfg(&text(&before), &text(&after));
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        assert!(
            d.runtime_reasons().iter().any(|r| r.contains("server BAK_3 added (10.0.0.7:8080)")),
            "{:?}",
            d.runtime_reasons()
        );
        // A missing default backend warns; the Ingress serves.
        let mut i = input(BASIC);
        let ing = std::sync::Arc::make_mut(
            i.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some("old")).unwrap(),
        );
        ing.metadata.annotations =
            Some([("nginx.ingress.kubernetes.io/default-backend".to_string(), "nope".to_string())].into());
        let (_, verdicts, _) = translate_ingress(&i);
        let old = verdict(&verdicts, "old");
        assert!(
            old.accepted()
                && old.warnings.iter().any(|w| w.cause == Cause::Missing
                    && w.field == "metadata.annotations[nginx.ingress.kubernetes.io/default-backend]"),
            "{old:?}"
        );
    }

    #[test]
    fn an_affinity_backend_grows_by_doubling() {
        let aff = BackendOptions {
            affinity: Some(annotations::Affinity {
                name: "c".into(),
                max_age: None,
                path: None,
                secure: false,
                same_site: None,
            }),
            ..Default::default()
        };
        assert_eq!(slots_for(&aff, 3, 0, 8), 8);
        assert_eq!(slots_for(&aff, 9, 8, 8), 16);
        assert_eq!(slots_for(&aff, 17, 16, 8), 32);
        assert_eq!(slots_for(&aff, 12, 16, 8), 8, "the previous count holds (slots never shrink)");
        assert_eq!(slots_for(&BackendOptions::default(), 9, 8, 8), 8, "others grow one by one, at runtime");
    }

    #[test]
    fn a_snippet_haproxy_refuses_and_a_left_out_object_refuse_only_their_ingress() {
        let mut i = input(ANNOTATIONS);
        i.allowed = Allowed { snippets: true };
        let checks = snippet_checks(&i);
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert_eq!(checks[0].object.name, "snippet");
        assert!(checks[0].config.ends_with("backend snippet_check\n    http-response set-header X-Snippet yes\n\n"));
        i.refused_snippets.insert(checks[0].snippet.clone(), "line 7: unknown keyword".into());
        i.excluded.insert(
            ObjectRef { kind: "Ingress".into(), namespace: "shop".into(), name: "open".into() },
            crate::narrow::Exclusion::Suspect,
        );
        let (model, verdicts, _) = translate_ingress(&i);
        let snippet = verdict(&verdicts, "snippet");
        assert_eq!(
            snippet.refusals[0].field,
            "metadata.annotations[nginx.ingress.kubernetes.io/configuration-snippet]"
        );
        assert_eq!(snippet.refusals[0].cause, Cause::GateRefused, "{snippet:?}");
        assert_eq!(verdict(&verdicts, "open").refusals[0].cause, Cause::LeftOut);
        assert!(verdict(&verdicts, "open").left_out() && !snippet.left_out(), "{verdicts:?}");
        assert!(verdict(&verdicts, "guarded").accepted());
        assert!(!model.backends.iter().any(|b| b.name == "shop_snip_80"));
        assert!(!model.hosts.iter().any(|h| h.host == HostMatch::Exact("open.example.com".into())));
    }

    #[test]
    fn a_left_out_secret_marks_the_verdict_of_the_ingress_naming_it() {
        let mut i = input(BASIC);
        let (_, verdicts, _) = translate_ingress(&i);
        let young = verdict(&verdicts, "young");
        assert!(!young.left_out(), "a missing Secret is the translator's own refusal: {young:?}");
        let name = i.ingresses.iter().find(|g| g.metadata.name.as_deref() == Some("young")).unwrap().spec.as_ref();
        let secret = name.and_then(|s| s.tls.as_ref()).unwrap()[0].secret_name.clone().unwrap();
        i.excluded.insert(
            ObjectRef { kind: "Secret".into(), namespace: "shop".into(), name: secret },
            crate::narrow::Exclusion::TooLarge(1),
        );
        let (_, verdicts, _) = translate_ingress(&i);
        let young = verdict(&verdicts, "young");
        let tls = young.refusals.iter().find(|r| r.field == "spec.tls[0].secretName");
        assert!(young.left_out() && tls.is_some_and(|r| r.cause == Cause::LeftOut), "{young:?}");
        assert!(!verdict(&verdicts, "old").left_out());
    }

    #[test]
    fn allowed_snippets_join_their_backend() {
        let mut i = input(ANNOTATIONS);
        i.allowed = Allowed { snippets: true };
        let (model, verdicts, _) = translate_ingress(&i);
        assert!(verdict(&verdicts, "snippet").accepted());
        let b = model.backends.iter().find(|b| b.name == "shop_snip_80").unwrap();
        assert_eq!(b.options.snippet.as_deref(), Some("    http-response set-header X-Snippet yes\n"));
    }

    #[test]
    fn endpoints_named_ports_and_conditions() {
        let (model, _, slots) = translate_ingress(&input(BASIC));
        let be = |n: &str| model.backends.iter().find(|b| b.name == n).unwrap();
        let api: Vec<_> = be("shop_api_http").servers.iter().filter_map(|s| s.endpoint).collect();
        assert_eq!(api, ["10.0.1.1:9090".parse().unwrap()]);
        let web = be("shop_web_80");
        let live: Vec<_> = web.servers.iter().filter_map(|s| s.endpoint.map(|e| (e.to_string(), s.draining))).collect();
        assert_eq!(live, [("10.0.0.1:8080".to_string(), false), ("10.0.0.2:8080".to_string(), true)]);
        assert_eq!(slots.backends["shop_web_80"].count, 2);
    }

    #[test]
    fn only_served_ingresses_name_secrets() {
        let i = input(BASIC);
        let refs = tls_secret_refs(&i.class, i.ingresses.iter().map(|i| &**i));
        assert_eq!(refs.into_iter().collect::<Vec<_>>(), [("shop".to_string(), "nowhere".to_string())]);
        let mut other = i.class.clone();
        other.metadata.name = Some("nginx".into());
        assert!(
            tls_secret_refs(&other, i.ingresses.iter().map(|i| &**i)).is_empty(),
            "the nginx Ingress has no tls and is not ours"
        );
    }

    #[test]
    fn a_backend_name_haproxy_cannot_name_is_refused() {
        let mut i = input(BASIC);
        // Only the apiserver keeps names lowercase; a manifest read offline may not.
        Arc::make_mut(&mut i.services[1]).metadata.name = Some("Api".into());
        for ing in &mut i.ingresses {
            let ing = std::sync::Arc::make_mut(ing);
            for r in ing.spec.as_mut().unwrap().rules.iter_mut().flatten() {
                for p in r.http.iter_mut().flat_map(|h| h.paths.iter_mut()) {
                    let svc = p.backend.service.as_mut().unwrap();
                    if svc.name == "api" {
                        svc.name = "Api".into();
                    }
                }
            }
        }
        let (model, verdicts, _) = translate_ingress(&i);
        let old = verdict(&verdicts, "old");
        assert_eq!(old.refusals[0].field, "spec.rules[0].http.paths[0].backend.service", "{old:?}");
        assert_eq!(old.refusals[0].cause, Cause::Invalid, "{old:?}");
        assert!(model.backends.iter().all(|b| is_section_name(&b.name)));
    }

    #[test]
    fn slots_stay_across_renders() {
        let mut i = input(BASIC);
        let (_, _, s1) = translate_ingress(&i);
        // 10.0.0.1 goes away, two new endpoints come.
        i.previous_slots = s1.clone();
        let eps = &mut Arc::make_mut(&mut i.endpoint_slices[0]).endpoints;
        eps[0].addresses = vec!["10.0.0.9".into()];
        eps[2].addresses = vec!["10.0.0.8".into()];
        eps[2].conditions = None;
        let (_, _, s2) = translate_ingress(&i);
        let a = "10.0.0.2:8080".parse().unwrap();
        assert_eq!(s2.backends["shop_web_80"].endpoints[&a], s1.backends["shop_web_80"].endpoints[&a]);
        assert_eq!(s2.backends["shop_web_80"].count, 3);
    }

    #[test]
    fn a_named_port_is_one_backend_by_name_and_by_number() {
        let mut i = input(BASIC);
        // The old Ingress's /api names api's port `http`; now also by its number, on another path.
        let rules = Arc::make_mut(&mut i.ingresses[0]).spec.as_mut().unwrap().rules.as_mut().unwrap();
        let mut by_number = rules[0].http.as_ref().unwrap().paths[0].clone();
        by_number.path = Some("/api-by-number".into());
        by_number.backend.service.as_mut().unwrap().port =
            Some(k8s_openapi::api::networking::v1::ServiceBackendPort { name: None, number: Some(80) });
        rules[0].http.as_mut().unwrap().paths.push(by_number);
        let (model, verdicts, _) = translate_ingress(&i);
        assert!(verdict(&verdicts, "old").accepted(), "{verdicts:?}");
        let api: Vec<&str> =
            model.backends.iter().map(|b| b.name.as_str()).filter(|n| n.starts_with("shop_api")).collect();
        assert_eq!(api, ["shop_api_http"]);
        let targets: BTreeSet<&str> = model.rules.iter().map(|r| r.backend.as_str()).collect();
        assert!(!targets.contains("shop_api_80"), "{targets:?}");
    }

    #[test]
    fn a_backend_losing_its_last_route_stays_parked_and_comes_back() {
        let mut i = input(BASIC);
        let (_, _, s1) = translate_ingress(&i);
        assert!(s1.retired.is_empty());
        // Every Ingress gone: each backend stays, every slot parked, its count kept.
        i.previous_slots = s1.clone();
        let ingresses = std::mem::take(&mut i.ingresses);
        let (model, verdicts, s2) = translate_ingress(&i);
        assert!(verdicts.is_empty() && model.rules.is_empty());
        assert_eq!(s2.retired, s1.backends.keys().cloned().collect::<Vec<_>>());
        for b in &model.backends {
            assert!(b.servers.iter().all(|s| s.endpoint.is_none()), "{b:?}");
            assert_eq!(b.servers.len(), s1.backends[&b.name].count, "{b:?}");
        }
        // Routed again: the same endpoints in the same slots, nothing retired.
        i.previous_slots = s2;
        i.ingresses = ingresses;
        let (_, _, s3) = translate_ingress(&i);
        assert!(s3.retired.is_empty());
        for (name, b) in &s1.backends {
            assert_eq!(s3.backends[name].endpoints, b.endpoints, "{name}");
        }
    }

    #[test]
    fn render_is_deterministic_and_quoted() {
        let t = crate::Templates::default();
        let a = crate::render(&input(BASIC), &t).unwrap();
        let b = crate::render(&input(BASIC), &t).unwrap();
        assert_eq!(a, b);
        let cfg = String::from_utf8(a.files["haproxy.cfg"].clone()).unwrap();
        assert!(cfg.contains("default-path config"), "{cfg}");
        assert!(cfg.contains("backend shop_web_80\n"), "{cfg}");
        assert!(cfg.contains("server SRV_2 10.0.0.2:8080 weight 0"), "{cfg}");
        let h = host_id(&HostMatch::Exact("shop.example.com".into()), &HashSet::new());
        let prefix = String::from_utf8(a.files["maps/paths_prefix.map"].clone()).unwrap();
        assert!(prefix.starts_with(&format!("{h}/exact/")) || prefix.starts_with(&format!("{h}/cart/")), "{prefix}");
        assert!(prefix.contains(&format!("{h}/api/ ")), "{prefix}");
        let exact = String::from_utf8(a.files["maps/paths_exact.map"].clone()).unwrap();
        assert!(exact.contains(&format!("{h}/api ")), "{exact}");
        let hosts = String::from_utf8(a.files["maps/hosts.map"].clone()).unwrap();
        assert_eq!(hosts, format!("shop.example.com {h}\n"));
    }

    /// A host's id is its own: hosts added before or after it (in map order) never move it, so
    /// a runtime change of several map files never routes its requests through another host's
    /// paths while the files change one by one.
    #[test]
    fn a_host_keeps_its_id_whatever_other_hosts_come_and_go() {
        let t = crate::Templates::default();
        let ids = |i: &IngressInput| -> BTreeMap<String, String> {
            let r = crate::render(i, &t).unwrap();
            let hosts = String::from_utf8(r.files["maps/hosts.map"].clone()).unwrap();
            hosts.lines().filter_map(|l| l.split_once(' ')).map(|(h, id)| (h.to_string(), id.to_string())).collect()
        };
        let before = ids(&input(BASIC));
        let mut more = input(BASIC);
        let mut extra = (*more.ingresses[0]).clone();
        extra.metadata.name = Some("extra".into());
        let rules = extra.spec.as_mut().unwrap().rules.as_mut().unwrap();
        rules[0].host = Some("a.example.com".into());
        rules.truncate(1);
        more.ingresses.push(std::sync::Arc::new(extra));
        let after = ids(&more);
        assert_eq!(after.len(), before.len() + 1, "{after:?}");
        for (host, id) in &before {
            assert_eq!(after.get(host), Some(id), "{host}");
        }
        let taken: HashSet<String> = [host_id(&HostMatch::Any, &HashSet::new())].into();
        assert_ne!(host_id(&HostMatch::Any, &taken), host_id(&HostMatch::Any, &HashSet::new()));
    }

    #[test]
    fn a_template_error_and_a_snippet() {
        let mut t = crate::Templates { main: Some("{{ nope }}".into()), ..Default::default() };
        assert!(matches!(crate::render(&input(BASIC), &t), Err(crate::RenderError::Template(_))));
        t.main = None;
        t.snippets.global = "    maxconn 1000".into();
        let r = crate::render(&input(BASIC), &t).unwrap();
        assert!(String::from_utf8_lossy(&r.files["haproxy.cfg"]).contains("maxconn 1000"));
    }
}
