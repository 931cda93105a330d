//! The Ingress translator: `networking.k8s.io/v1` Ingresses of one IngressClass, with their
//! Services, EndpointSlices and TLS Secrets, to the [`Model`].
//!
//! Owns the Ingress semantics: which Ingresses the class serves (`spec.ingressClassName`, or
//! none and the class is the default), hosts (exact, lowercased; `*.suffix` matches exactly one
//! label), `pathType` Exact, Prefix (segment-wise: `/foo` matches `/foo` and `/foo/…`, never
//! `/foobar`; a trailing `/` is ignored) and ImplementationSpecific (here: the same as Prefix),
//! longest match first and Exact before Prefix on equal paths, several Ingresses on one host
//! merged (a host/path claimed twice goes to the oldest Ingress by creationTimestamp, then
//! namespace/name; the other's path is refused in its own verdict), `defaultBackend` (the same
//! rule), TLS from `kubernetes.io/tls` Secrets, Service ports by number and by name (the
//! target port comes from the EndpointSlice port of the same name), and endpoints from
//! EndpointSlices only (ready, or serving and terminating as draining), and each Ingress's
//! annotations (read by [`crate::annotations`]: a bad value refuses the whole Ingress, backends
//! named with different options refuse the later Ingress's path). A Service that is missing
//! answers 503 and warns. It must never let one bad object block the others, nor put a
//! value into the Model that the map builder or the template cannot quote.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use haptic_haproxy::quote;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend, IngressClass};

use crate::annotations::{self, Allowed, BackendOptions, Policy};
use crate::model::{
    Backend, Bind, Cert, Frontend, HostMatch, HostTable, Model, ObjectRef, PathEntry, PathKind, PolicyEntry, Refusal,
    Rule, Verdict, UNAVAILABLE,
};
use crate::slots::{self, Endpoint, SlotMap};

/// The controller name an IngressClass must have for haptic to serve it.
pub const INGRESS_CONTROLLER: &str = "haptic.dev/ingress-controller";
/// The annotation marking the default IngressClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// The label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Everything the Ingress translator reads.
#[derive(Debug, Clone, Default)]
pub struct IngressInput {
    /// The class served.
    pub class: IngressClass,
    /// All Ingresses seen (those of other classes are ignored, without verdict).
    pub ingresses: Vec<Ingress>,
    /// Services.
    pub services: Vec<Service>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// TLS Secrets the Ingresses name.
    pub secrets: Vec<Secret>,
    /// The last ACKed render's slot map.
    pub previous_slots: SlotMap,
    /// Listening and slot settings.
    pub settings: Settings,
    /// What the admin allows Ingress annotations to bring.
    pub allowed: Allowed,
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
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            bind_address: IpAddr::from([0, 0, 0, 0]),
            http_port: 8080,
            https_port: 8443,
            min_slots: 8,
            health_port: None,
        }
    }
}

fn obj(kind: &str, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectRef {
    ObjectRef {
        kind: kind.to_string(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// Whether `class` is ours and serves `ing`.
pub fn served(class: &IngressClass, ing: &Ingress) -> bool {
    let ours = class.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(INGRESS_CONTROLLER);
    let name = class.metadata.name.as_deref().unwrap_or_default();
    let default = class.metadata.annotations.as_ref().and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION)).map(String::as_str)
        == Some("true");
    ours && match ing.spec.as_ref().and_then(|s| s.ingress_class_name.as_deref()) {
        Some(c) => c == name,
        None => default,
    }
}

/// The TLS Secrets (namespace, name) that the Ingresses `class` serves name: the only Secrets
/// the translator reads.
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
    }
    out
}

/// A validated host.
pub(crate) fn parse_host(h: &str) -> Result<HostMatch, String> {
    let h = h.to_ascii_lowercase();
    let (wild, rest) = match h.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, h.as_str()),
    };
    let label_ok =
        |l: &str| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if rest.is_empty() || rest.len() > 253 || !rest.split('.').all(label_ok) {
        return Err(format!("{h:?} is not a DNS name (or `*.` and one)"));
    }
    Ok(if wild { HostMatch::Wildcard(format!(".{rest}")) } else { HostMatch::Exact(rest.to_string()) })
}

/// A validated, normalised path.
pub(crate) fn parse_path(kind: PathKind, p: Option<&str>) -> Result<String, String> {
    let p = p.unwrap_or("/");
    if !p.starts_with('/') {
        return Err(format!("{p:?} does not start with '/'"));
    }
    // The longest key and value a path makes (a prefix path's key, under the longest host id
    // and rule id) must fit a map line.
    let id = u32::MAX;
    if let Err(e) =
        quote::map_key(&format!("h0{p}")).and_then(|_| quote::map_line(&format!("h{id}{p}/"), &format!("r{id}")))
    {
        return Err(format!("{:?} cannot be a map key: {e}", p.chars().take(64).collect::<String>()));
    }
    Ok(match kind {
        PathKind::Prefix if p.len() > 1 => p.trim_end_matches('/').to_string().max("/".to_string()),
        _ => p.to_string(),
    })
}

struct Ctx<'a> {
    /// Services by (namespace, name).
    services: BTreeMap<(&'a str, &'a str), &'a Service>,
    /// EndpointSlices by (namespace, Service name from their label).
    slices: BTreeMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>,
    backends: BTreeMap<String, Vec<Endpoint>>,
    /// Each backend's options and the Ingress that set them first.
    options: BTreeMap<String, (BackendOptions, ObjectRef)>,
}

impl<'a> Ctx<'a> {
    /// Indexes the input's Services and EndpointSlices once, so each lookup is a map lookup.
    fn new(input: &'a IngressInput) -> Self {
        let key = |m: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, name: Option<&'a str>| {
            Some((m.namespace.as_deref()?, name?))
        };
        let services =
            input.services.iter().filter_map(|s| Some((key(&s.metadata, s.metadata.name.as_deref())?, s))).collect();
        let mut slices: BTreeMap<_, Vec<_>> = BTreeMap::new();
        for sl in &input.endpoint_slices {
            let svc = sl.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).map(String::as_str);
            if let Some(k) = key(&sl.metadata, svc) {
                slices.entry(k).or_default().push(sl);
            }
        }
        Ctx { services, slices, backends: BTreeMap::new(), options: BTreeMap::new() }
    }
}

impl Ctx<'_> {
    /// Resolves a backend reference to a backend name (or [`UNAVAILABLE`] with a warning). Two
    /// Ingresses naming one backend with different [`BackendOptions`]: the later is refused.
    /// `opts`: what the naming Ingress's annotations set for the backend, and that Ingress.
    fn backend(
        &mut self,
        ns: &str,
        b: &IngressBackend,
        field: &str,
        opts: (&BackendOptions, &ObjectRef),
        v: &mut Verdict,
    ) -> Result<String, Refusal> {
        let refuse = |f: &str, r: String| Refusal { field: format!("{field}.{f}"), reason: r };
        if b.resource.is_some() {
            return Err(refuse("resource", "resource backends are not supported".into()));
        }
        let Some(svc_ref) = &b.service else { return Err(refuse("service", "no service".into())) };
        let Some(port) = &svc_ref.port else { return Err(refuse("service.port", "no port".into())) };
        let Some(svc) = self.services.get(&(ns, svc_ref.name.as_str())).copied() else {
            v.warnings.push(refuse(
                "service.name",
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
        let name = format!("{ns}_{}_{canonical}", svc_ref.name);
        if !crate::template::is_section_name(&name) {
            return Err(refuse("service", format!("{name:?} is not a backend name (DNS labels and port names only)")));
        }
        match self.options.get(&name) {
            Some((o, by)) if o != opts.0 => {
                return Err(refuse(
                    "service",
                    format!("backend {name} is set up differently by {by} (timeouts, protocol or snippet annotations)"),
                ))
            }
            Some(_) => {}
            None => {
                self.options.insert(name.clone(), (opts.0.clone(), opts.1.clone()));
            }
        }
        if !self.backends.contains_key(&name) {
            let slices = self.slices.get(&(ns, svc_ref.name.as_str())).map_or(&[][..], Vec::as_slice);
            let eps = endpoints(slices, sp.name.as_deref().unwrap_or(""));
            self.backends.insert(name.clone(), eps);
        }
        Ok(name)
    }
}

/// The endpoints of one Service port from its EndpointSlices (`slices`, the Service's own):
/// ready ones, and serving terminating ones as draining. `port_name` is the Service port's name
/// (`""` when unnamed).
pub(crate) fn endpoints(slices: &[&EndpointSlice], port_name: &str) -> Vec<Endpoint> {
    let mut out = BTreeMap::new();
    for s in slices {
        if !matches!(s.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        let Some(port) = s
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|p| p.name.as_deref().unwrap_or("") == port_name)
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for e in &s.endpoints {
            let c = e.conditions.clone().unwrap_or_default();
            // An unset `ready` means ready; `serving` defaults to `ready`.
            let ready = c.ready.unwrap_or(true) && !c.terminating.unwrap_or(false);
            let draining = !ready && c.serving.unwrap_or(false) && c.terminating.unwrap_or(false);
            if !ready && !draining {
                continue;
            }
            for a in &e.addresses {
                if let Ok(ip) = a.parse::<IpAddr>() {
                    let addr = SocketAddr::new(ip, port);
                    let d: &mut bool = out.entry(addr).or_insert(draining);
                    *d = *d && draining;
                }
            }
        }
    }
    out.into_iter().map(|(addr, draining)| Endpoint { addr, draining }).collect()
}

/// Translates: the Model, one verdict per served Ingress (and per Secret problem, inside the
/// Ingress's verdict), and the slot map of this render.
pub fn translate_ingress(input: &IngressInput) -> (Model, Vec<Verdict>, SlotMap) {
    let mut ings: Vec<&Ingress> = input.ingresses.iter().filter(|i| served(&input.class, i)).collect();
    ings.sort_by_key(|i| (i.metadata.creation_timestamp.as_ref().map(|t| t.0), obj("Ingress", &i.metadata)));
    let mut ctx = Ctx::new(input);
    // (host, kind, path) → (rule's backend, policy, source)
    let mut routes: BTreeMap<(HostMatch, String, PathKind), (String, Policy, ObjectRef)> = BTreeMap::new();
    let mut default: Option<(String, Policy, ObjectRef)> = None;
    let mut certs: BTreeMap<String, Cert> = BTreeMap::new();
    let mut verdicts = Vec::new();
    for ing in ings {
        let me = obj("Ingress", &ing.metadata);
        let ns = me.namespace.clone();
        let mut v = Verdict { object: me.clone(), refusals: vec![], warnings: vec![] };
        let spec = ing.spec.clone().unwrap_or_default();
        let has_tls = !spec.tls.as_deref().unwrap_or_default().is_empty();
        let meaning = match annotations::read(
            ing.metadata.annotations.as_ref().unwrap_or(&BTreeMap::new()),
            has_tls,
            input.allowed,
        ) {
            Ok((m, warnings)) => {
                v.warnings.extend(warnings);
                m
            }
            Err(refusals) => {
                // Served without what its annotations ask (a source range, a redirect), the
                // Ingress would do what its author did not mean: none of it is served.
                v.refusals.extend(refusals);
                verdicts.push(v);
                continue;
            }
        };
        let opts = (&meaning.backend, &me);
        if let Some(b) = &spec.default_backend {
            match ctx.backend(&ns, b, "spec.defaultBackend", opts, &mut v) {
                Ok(be) => match &default {
                    Some((_, _, by)) => v.refusals.push(Refusal {
                        field: "spec.defaultBackend".into(),
                        reason: format!("the default backend is already set by {by}"),
                    }),
                    None => default = Some((be, meaning.policy.clone(), me.clone())),
                },
                Err(r) => v.refusals.push(r),
            }
        }
        for (ri, rule) in spec.rules.as_deref().unwrap_or_default().iter().enumerate() {
            let host = match rule.host.as_deref() {
                None | Some("") => HostMatch::Any,
                Some(h) => match parse_host(h) {
                    Ok(h) => h,
                    Err(reason) => {
                        v.refusals.push(Refusal { field: format!("spec.rules[{ri}].host"), reason });
                        continue;
                    }
                },
            };
            let Some(http) = &rule.http else { continue };
            for (pi, p) in http.paths.iter().enumerate() {
                let field = format!("spec.rules[{ri}].http.paths[{pi}]");
                let kind = match p.path_type.as_str() {
                    "Exact" => PathKind::Exact,
                    "Prefix" | "ImplementationSpecific" => PathKind::Prefix,
                    other => {
                        v.refusals.push(Refusal {
                            field: format!("{field}.pathType"),
                            reason: format!("{other:?} is not Exact, Prefix or ImplementationSpecific"),
                        });
                        continue;
                    }
                };
                let path = match parse_path(kind, p.path.as_deref()) {
                    Ok(p) => p,
                    Err(reason) => {
                        v.refusals.push(Refusal { field: format!("{field}.path"), reason });
                        continue;
                    }
                };
                let key = (host.clone(), path.clone(), kind);
                if let Some((_, _, by)) = routes.get(&key) {
                    if *by != me {
                        v.refusals.push(Refusal {
                            field: format!("{field}.path"),
                            reason: format!("{kind:?} {path} on this host is already routed by {by}"),
                        });
                    }
                    continue;
                }
                match ctx.backend(&ns, &p.backend, &format!("{field}.backend"), opts, &mut v) {
                    Ok(be) => {
                        routes.insert(key, (be, meaning.policy.clone(), me.clone()));
                    }
                    Err(r) => v.refusals.push(r),
                }
            }
        }
        for (ti, tls) in spec.tls.as_deref().unwrap_or_default().iter().enumerate() {
            let field = format!("spec.tls[{ti}].secretName");
            let Some(name) = tls.secret_name.as_deref() else { continue };
            // The name becomes a file name under certs/: a Secret's name (a DNS subdomain) only.
            if !crate::template::is_section_name(name) || name.len() > 253 || !crate::template::is_section_name(&ns) {
                let shown: String = name.chars().take(64).collect();
                v.refusals.push(Refusal { field, reason: format!("{shown:?} is not a Secret name") });
                continue;
            }
            match tls_pem(input, &ns, name) {
                Ok(pem) => {
                    let path = format!("certs/{ns}_{name}.pem");
                    let c = certs.entry(path.clone()).or_insert_with(|| Cert {
                        path,
                        hosts: vec![],
                        source: ObjectRef { kind: "Secret".into(), namespace: ns.clone(), name: name.into() },
                        pem,
                    });
                    c.hosts.extend(tls.hosts.clone().unwrap_or_default());
                    c.hosts.sort();
                    c.hosts.dedup();
                }
                Err(reason) => v.refusals.push(Refusal { field, reason }),
            }
        }
        verdicts.push(v);
    }
    verdicts.sort_by(|a, b| a.object.cmp(&b.object));

    // Rules, in a deterministic order: by host, then path.
    let mut model = Model::default();
    // Policy ids by content, so a route added or removed never renumbers a policy.
    let policy_ids: BTreeMap<&Policy, String> = routes
        .values()
        .map(|(_, p, _)| p)
        .chain(default.iter().map(|(_, p, _)| p))
        .filter(|p| !p.is_empty())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p, format!("p{}", i + 1)))
        .collect();
    let policy_of = |p: &Policy| policy_ids.get(p).cloned();
    let mut hosts: BTreeMap<HostMatch, Vec<PathEntry>> = BTreeMap::new();
    for (i, ((host, path, kind), (backend, policy, source))) in routes.iter().enumerate() {
        let id = format!("r{}", i + 1);
        model.rules.push(Rule {
            id: id.clone(),
            backend: backend.clone(),
            policy: policy_of(policy),
            source: source.clone(),
        });
        hosts.entry(host.clone()).or_default().push(PathEntry { kind: *kind, path: path.clone(), rule: id });
    }
    if let Some((backend, policy, source)) = &default {
        model.rules.push(Rule {
            id: "default".into(),
            backend: backend.clone(),
            policy: policy_of(policy),
            source: source.clone(),
        });
        model.default_rule = Some("default".into());
    }
    model.policies = policy_ids.iter().map(|(p, id)| PolicyEntry { id: id.clone(), policy: (*p).clone() }).collect();
    for (i, (host, mut paths)) in hosts.into_iter().enumerate() {
        paths.sort_by(|a, b| b.path.len().cmp(&a.path.len()).then(a.kind.cmp(&b.kind)).then(a.path.cmp(&b.path)));
        model.hosts.push(HostTable { host, id: format!("h{}", i + 1), paths, port: None });
    }
    let mut slot_map = SlotMap::default();
    let prev = &input.previous_slots;
    let active: BTreeSet<String> = ctx.backends.keys().cloned().collect();
    slot_map.retired = slots::retired(prev, &active, slots::RETIRED_KEPT);
    // Retired backends keep their section with every slot parked: their last route going (and
    // one coming back) is then a change of servers and maps, not of sections.
    let retired = slot_map.retired.iter().map(|n| (n.clone(), Vec::new()));
    let all: BTreeMap<String, Vec<Endpoint>> = ctx.backends.into_iter().chain(retired).collect();
    for (name, eps) in all {
        let (servers, s) = slots::plan(&eps, prev.backends.get(&name), input.settings.min_slots);
        slot_map.backends.insert(name.clone(), s);
        let options = ctx.options.remove(&name).map(|(o, _)| o).unwrap_or_default();
        model.backends.push(Backend { name, servers, options });
    }
    model.certs = certs.into_values().collect();
    let st = &input.settings;
    model.health = st.health_port.map(|p| SocketAddr::new(st.bind_address, p));
    model.frontends.push(Frontend {
        name: "http".into(),
        binds: vec![Bind { address: st.bind_address, port: st.http_port, tls: false, certs: vec![] }],
    });
    if !model.certs.is_empty() {
        model.frontends.push(Frontend {
            name: "https".into(),
            binds: vec![Bind { address: st.bind_address, port: st.https_port, tls: true, certs: vec![] }],
        });
    }
    (model, verdicts, slot_map)
}

/// The PEM bundle (chain, then key) of a `kubernetes.io/tls` Secret, or why not.
fn tls_pem(input: &IngressInput, ns: &str, name: &str) -> Result<Vec<u8>, String> {
    secret_pem(&input.secrets, ns, name)
}

/// The PEM bundle (chain, then key) of the `kubernetes.io/tls` Secret `ns/name` among `secrets`, or why not.
pub(crate) fn secret_pem(secrets: &[Secret], ns: &str, name: &str) -> Result<Vec<u8>, String> {
    let Some(s) = secrets
        .iter()
        .find(|s| s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name))
    else {
        return Err(format!("Secret {ns}/{name} does not exist"));
    };
    let data = s.data.clone().unwrap_or_default();
    let get = |k: &str| -> Result<Vec<u8>, String> {
        let v = data.get(k).map(|b| b.0.clone()).ok_or_else(|| format!("Secret {ns}/{name} has no {k}"))?;
        if !String::from_utf8_lossy(&v).contains("-----BEGIN ") {
            return Err(format!("Secret {ns}/{name}: {k} is not PEM"));
        }
        Ok(v)
    };
    let mut pem = get("tls.crt")?;
    if !pem.ends_with(b"\n") {
        pem.push(b'\n');
    }
    pem.extend(get("tls.key")?);
    Ok(pem)
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

    pub(crate) fn input(yaml: &str) -> IngressInput {
        let f: Fixture = serde_saphyr::from_str(yaml).unwrap();
        IngressInput {
            class: class(),
            ingresses: f.ingresses,
            services: f.services,
            endpoint_slices: f.endpoint_slices,
            secrets: f.secrets,
            previous_slots: SlotMap::default(),
            settings: Settings { min_slots: 2, ..Settings::default() },
            allowed: Allowed::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::input;
    use super::*;

    const BASIC: &str = include_str!("../tests/fixtures/basic.yaml");

    fn verdict<'a>(v: &'a [Verdict], name: &str) -> &'a Verdict {
        v.iter().find(|v| v.object.name == name).unwrap()
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
        assert!(young.refusals[1].reason.contains("Ingress shop/old"), "{young:?}");
        assert!(young.refusals[3].reason.contains("does not exist"));
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

    const ANNOTATIONS: &str = include_str!("../tests/fixtures/annotations.yaml");

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
        assert_eq!(open.warnings[0].field, "metadata.annotations[nginx.ingress.kubernetes.io/enable-cors]");
        // Snippets are off: refused in that Ingress's verdict, the others serve.
        let snippet = v("snippet");
        assert!(snippet.refusals[0].reason.contains("snippet annotations are off"), "{snippet:?}");
        // The later Ingress naming `web` with other timeouts is refused that path.
        let same = v("same-backend");
        assert!(same.refusals[0].reason.contains("set up differently by Ingress shop/guarded"), "{same:?}");
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
        assert_eq!(policy_of("older.example.com").redirect.unwrap().code, 308);
    }

    #[test]
    fn a_route_added_or_removed_keeps_policy_ids_and_the_config() {
        let base = input(ANNOTATIONS);
        let render = |i: &IngressInput| crate::render(i, &Default::default()).unwrap();
        let before = render(&base);
        let mut more = base.clone();
        let mut extra = more.ingresses.iter().find(|i| i.metadata.name.as_deref() == Some("open")).unwrap().clone();
        extra.metadata.name = Some("open-2".into());
        extra.metadata.creation_timestamp = None;
        let rule = &mut extra.spec.as_mut().unwrap().rules.as_mut().unwrap()[0];
        rule.host = Some("another.example.com".into());
        more.ingresses.push(extra);
        let after = render(&more);
        assert_eq!(
            String::from_utf8_lossy(&before.files["haproxy.cfg"]),
            String::from_utf8_lossy(&after.files["haproxy.cfg"]),
            "a route with an existing policy changes maps only"
        );
        assert_ne!(before.files["maps/policies.map"], after.files["maps/policies.map"]);
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
        let refs = tls_secret_refs(&i.class, &i.ingresses);
        assert_eq!(refs.into_iter().collect::<Vec<_>>(), [("shop".to_string(), "nowhere".to_string())]);
        let mut other = i.class.clone();
        other.metadata.name = Some("nginx".into());
        assert!(tls_secret_refs(&other, &i.ingresses).is_empty(), "the nginx Ingress has no tls and is not ours");
    }

    #[test]
    fn a_backend_name_haproxy_cannot_name_is_refused() {
        let mut i = input(BASIC);
        // Only the apiserver keeps names lowercase; a manifest read offline may not.
        i.services[1].metadata.name = Some("Api".into());
        for ing in &mut i.ingresses {
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
        assert!(old.refusals[0].reason.contains("not a backend name"), "{old:?}");
        assert!(model.backends.iter().all(|b| crate::template::is_section_name(&b.name)));
    }

    #[test]
    fn slots_stay_across_renders() {
        let mut i = input(BASIC);
        let (_, _, s1) = translate_ingress(&i);
        // 10.0.0.1 goes away, two new endpoints come.
        i.previous_slots = s1.clone();
        let eps = &mut i.endpoint_slices[0].endpoints;
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
        let rules = i.ingresses[0].spec.as_mut().unwrap().rules.as_mut().unwrap();
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
        let prefix = String::from_utf8(a.files["maps/paths_prefix.map"].clone()).unwrap();
        assert!(prefix.starts_with("h1/exact/") || prefix.starts_with("h1/cart/"), "{prefix}");
        assert!(prefix.contains("h1/api/ "), "{prefix}");
        let exact = String::from_utf8(a.files["maps/paths_exact.map"].clone()).unwrap();
        assert!(exact.contains("h1/api "), "{exact}");
        let hosts = String::from_utf8(a.files["maps/hosts.map"].clone()).unwrap();
        assert_eq!(hosts, "shop.example.com h1\n");
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
