//! Render mode: a spec with `spec.render`, plus the cluster's objects and the previous slot
//! map, to a file set, per-object verdicts and the slot map of this render.
//!
//! Owns the pure [`render`] (the class check, the settings and templates from `spec.render`,
//! the call into `haptic-render` through the caller's [`Incremental`], the spec's extra
//! `files`), the inputs of `haptic-render` as the stores' own `Arc`s (no object copied), the
//! choice of the previous slot map ([`SlotHistory`]: the slots of the newest render a pod has
//! applied) and the offline summary of verdicts. One value here is not a function of its
//! inputs: without `spec.render.defaultCertificate`, the default certificate is one generated
//! once per process. It must never talk to the apiserver, and never decide a route itself:
//! route semantics live in `haptic-render`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use haptic_protocol::{PlanId, RelPath};
use haptic_render::annotations::Allowed;
use haptic_render::edge::{AccessLog, DefaultCertificate, Edge, Forwarded, Hsts, Timeouts};
use haptic_render::gateway::{admits, GatewayInput, GatewayOutput, GatewaySettings, GATEWAY_CONTROLLER};
use haptic_render::gateway_api::{
    BackendTlsPolicy, Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant, TcpRoute, TlsRoute,
};
use haptic_render::ingress::{Incremental, IngressInput, Settings, INGRESS_CONTROLLER};
use haptic_render::narrow::Exclusion;
use haptic_render::{SlotMap, Templates, Verdict};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass, IngressLoadBalancerIngress};

use super::config_source::{add_files, config_map_key, Lookup, SpecError};
use super::crd::{AccessLogSpec, HAProxyConfigSpec, RenderSpec};

/// The cluster's objects render mode reads (all namespaces; Secrets only those Ingresses name).
#[derive(Debug, Clone, Default)]
pub struct Objects {
    /// IngressClasses.
    pub classes: Vec<Arc<IngressClass>>,
    /// Ingresses.
    pub ingresses: Vec<Arc<Ingress>>,
    /// Services.
    pub services: Vec<Arc<Service>>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// The TLS Secrets that Ingresses (or Gateway listeners) name.
    pub secrets: Vec<Arc<Secret>>,
    /// GatewayClasses (serving a GatewayClass).
    pub gateway_classes: Vec<Arc<GatewayClass>>,
    /// Gateways.
    pub gateways: Vec<Arc<Gateway>>,
    /// ListenerSets (none when the cluster has no ListenerSet API).
    pub listener_sets: Vec<Arc<ListenerSet>>,
    /// HTTPRoutes.
    pub routes: Vec<Arc<HttpRoute>>,
    /// GRPCRoutes (none when the cluster has no GRPCRoute API).
    pub grpc_routes: Vec<Arc<GrpcRoute>>,
    /// TLSRoutes (none when the cluster has no TLSRoute API).
    pub tls_routes: Vec<Arc<TlsRoute>>,
    /// TCPRoutes (none when the cluster has no TCPRoute API).
    pub tcp_routes: Vec<Arc<TcpRoute>>,
    /// BackendTLSPolicies (none when the cluster has no BackendTLSPolicy API).
    pub backend_tls_policies: Vec<Arc<BackendTlsPolicy>>,
    /// The ConfigMaps BackendTLSPolicies name (their CA certificates).
    pub config_maps: Vec<Arc<ConfigMap>>,
    /// ReferenceGrants.
    pub grants: Vec<Arc<ReferenceGrant>>,
    /// Namespaces.
    pub namespaces: Vec<Arc<Namespace>>,
}

/// A render-mode render: the files, one verdict per served Ingress, and the slots to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// `haproxy.cfg`, maps, certificates and the spec's extra files.
    pub files: BTreeMap<RelPath, Vec<u8>>,
    /// One verdict per served Ingress, sorted.
    pub verdicts: Vec<Verdict>,
    /// The slot map of this render.
    pub slots: SlotMap,
    /// When each served certificate expires.
    pub certificates: Vec<haptic_render::CertExpiry>,
}

/// The IngressClass `spec.render.ingressClassName` names, checked to be ours.
pub fn class<'a>(r: &RenderSpec, objects: &'a Objects) -> Result<&'a IngressClass, SpecError> {
    named_class(
        ("ingressClassName", "IngressClass", INGRESS_CONTROLLER),
        r.ingress_class_name.as_deref(),
        &objects.classes,
        |c: &IngressClass| c.metadata.name.as_deref(),
        |c| c.spec.as_ref().and_then(|s| s.controller.as_deref()).unwrap_or_default(),
    )
}

/// The class `name` (from `spec.render.<field>`) among `classes`, checked to exist and to name
/// `ours` as its controller: the one rule for IngressClasses and GatewayClasses.
fn named_class<'a, T>(
    (field, kind, ours): (&str, &str, &str),
    name: Option<&str>,
    classes: &'a [Arc<T>],
    name_of: impl Fn(&T) -> Option<&str>,
    controller_of: impl Fn(&T) -> &str,
) -> Result<&'a T, SpecError> {
    let name =
        name.ok_or_else(|| SpecError::invalid(format!("spec.render.{field}"), format!("spec.render needs {field}")))?;
    let c = classes.iter().find(|c| name_of(c) == Some(name)).map(|c| &**c).ok_or_else(|| {
        SpecError::missing(format!("spec.render.{field}"), format!("spec.render.{field}: {kind} {name} not found"))
    })?;
    let controller = controller_of(c);
    if controller != ours {
        return Err(SpecError::invalid(
            format!("spec.render.{field}"),
            format!("spec.render.{field}: {kind} {name} names the controller {controller:?}, not {ours}"),
        ));
    }
    Ok(c)
}

/// The translator's settings from `spec.render` (its default certificate's Secret from `l`).
pub fn settings(r: &RenderSpec, l: &dyn Lookup) -> Result<Settings, SpecError> {
    let bind_address = r.bind_address.parse().map_err(|e| {
        SpecError::invalid(
            "spec.render.bindAddress",
            format!("spec.render.bindAddress: {:?} is not an IP address ({e})", r.bind_address),
        )
    })?;
    Ok(Settings {
        bind_address,
        http_port: r.http_port,
        https_port: r.https_port,
        min_slots: usize::from(r.server_slots),
        health_port: r.health_port,
        paths: r.path_normalization.into(),
        edge: edge(r, bind_address, default_certificate(r, l)?)?,
    })
}

/// The Secret `spec.render.defaultCertificate` names, checked and re-encoded; else
/// [`generated_certificate`].
fn default_certificate(r: &RenderSpec, l: &dyn Lookup) -> Result<DefaultCertificate, SpecError> {
    const FIELD: &str = "spec.render.defaultCertificate";
    let Some(name) = r.default_certificate.as_ref().map(|n| n.name.as_str()) else {
        return Ok(generated_certificate().clone());
    };
    let s = l.secret(name).ok_or_else(|| SpecError::missing(FIELD, format!("{FIELD}: Secret {name} not found")))?;
    let data = s.data.clone().unwrap_or_default();
    let part = |k: &'static str| {
        data.get(k)
            .map(|b| b.0.clone())
            .ok_or_else(|| SpecError::invalid(FIELD, format!("{FIELD}: Secret {name} has no {k}")))
    };
    let file = haptic_render::pem::certified(&part("tls.crt")?, &part("tls.key")?)
        .map_err(|e| SpecError::invalid(FIELD, format!("{FIELD}: Secret {name}: {e}")))?;
    Ok(DefaultCertificate { pem: file.pem, not_after: file.not_after })
}

/// A self-signed certificate (`CN=haptic default`, for the name `haptic-default.invalid`)
/// generated once per process: the default certificate without `spec.render.defaultCertificate`.
/// A new leader generates its own, so its first render changes the certificate (a reload).
fn generated_certificate() -> &'static DefaultCertificate {
    static GENERATED: std::sync::OnceLock<DefaultCertificate> = std::sync::OnceLock::new();
    GENERATED.get_or_init(|| {
        let made = (|| {
            let mut params = rcgen::CertificateParams::new(vec!["haptic-default.invalid".to_string()])?;
            params.distinguished_name.push(rcgen::DnType::CommonName, "haptic default");
            let key = rcgen::KeyPair::generate()?;
            let cert = params.self_signed(&key)?;
            Ok::<_, rcgen::Error>((cert.pem(), key.serialize_pem()))
        })();
        // rcgen fails only on parameters, and these are fixed: a failure is a bug.
        let (crt, key) = made.expect("a self-signed certificate from fixed parameters");
        let file = haptic_render::pem::certified(crt.as_bytes(), key.as_bytes())
            .expect("rcgen's certificate and key pass the PEM checks");
        tracing::info!(
            "no spec.render.defaultCertificate: serving a generated self-signed default certificate (CN=haptic default)"
        );
        DefaultCertificate { pem: file.pem, not_after: file.not_after }
    })
}

/// The edge settings from `spec.render`, serving `default`; the stats frontend binds
/// `bind_address`.
fn edge(r: &RenderSpec, bind_address: std::net::IpAddr, default: DefaultCertificate) -> Result<Edge, SpecError> {
    let field = "spec.render.forwardedHeaders.trustedProxies";
    let trusted = r
        .forwarded_headers
        .trusted_proxies
        .iter()
        .map(|t| {
            t.parse::<ipnet::IpNet>().or_else(|_| t.parse::<std::net::IpAddr>().map(ipnet::IpNet::from)).map_err(|e| {
                SpecError::invalid(field, format!("{field}: {t:?} is neither a CIDR nor an address ({e})"))
            })
        })
        .collect::<Result<_, _>>()?;
    let t = &r.timeouts;
    Ok(Edge {
        default_certificate: Some(default),
        access_log: match r.access_log {
            AccessLogSpec::Http => AccessLog::Http,
            AccessLogSpec::Json => AccessLog::Json,
            AccessLogSpec::Off => AccessLog::Off,
        },
        forwarded: Forwarded { enabled: r.forwarded_headers.enabled, trusted },
        proxy_protocol: r.proxy_protocol,
        timeouts: Timeouts {
            connect: t.connect_seconds,
            client: t.client_seconds,
            server: t.server_seconds,
            tunnel: t.tunnel_seconds,
            http_request: t.http_request_seconds,
        },
        hsts: r.hsts.map(|h| Hsts {
            max_age: h.max_age_seconds,
            include_subdomains: h.include_sub_domains,
            preload: h.preload,
        }),
        stats: r.stats_port.map(|p| std::net::SocketAddr::new(bind_address, p)),
        drain_seconds: r.drain_seconds,
    })
}

/// The template and snippets from `spec.render` (the template from its ConfigMap).
pub fn templates(r: &RenderSpec, l: &dyn Lookup) -> Result<Templates, SpecError> {
    let main = match &r.template {
        None => None,
        Some(t) => {
            let k = &t.config_map_key_ref;
            let bytes = config_map_key(l, &k.name, &k.key, "spec.render.template.configMapKeyRef")?;
            Some(String::from_utf8(bytes).map_err(|_| {
                SpecError::invalid(
                    "spec.render.template",
                    format!("spec.render.template: ConfigMap {} key {:?} is not UTF-8", k.name, k.key),
                )
            })?)
        }
    };
    let s = &r.snippets;
    let get = |v: &Option<String>| v.clone().unwrap_or_default();
    let snippets = haptic_render::Snippets {
        global: get(&s.global),
        defaults: get(&s.defaults),
        frontend: get(&s.frontend),
        backend: get(&s.backend),
    };
    Ok(Templates { main, snippets })
}

/// The TLS Secrets (namespace, name) the served Ingresses name (none while the class is not
/// usable).
pub fn secret_refs(r: &RenderSpec, objects: &Objects) -> BTreeSet<(String, String)> {
    match class(r, objects) {
        Ok(c) => haptic_render::ingress::tls_secret_refs(c, objects.ingresses.iter().map(|i| i.as_ref())),
        Err(_) => BTreeSet::new(),
    }
}

/// The allowed snippets the served Ingresses bring, each to be checked alone with `haproxy -c`
/// before a render (none while snippets are off or the class is not usable).
pub fn snippet_checks(r: &RenderSpec, objects: &Objects) -> Vec<haptic_render::SnippetCheck> {
    if !r.allow_snippet_annotations {
        return Vec::new();
    }
    let Ok(class) = class(r, objects) else { return Vec::new() };
    let input = IngressInput {
        class: class.clone(),
        ingresses: objects.ingresses.clone(),
        allowed: Allowed { snippets: true },
        ..Default::default()
    };
    haptic_render::snippet_checks(&input)
}

/// Renders a spec with `spec.render` (pure): the class, then the translator and templates, then
/// the spec's extra `files` (which must not collide with a rendered path). `refused_snippets`:
/// the allowed snippets `haproxy -c` refused alone (see [`snippet_checks`]), with its words;
/// `excluded`: objects left out, with why (see [`super::narrowing`]). `incremental` keeps the
/// last translation, so a render after an EndpointSlice change redoes only the endpoints.
pub fn render(
    spec: &HAProxyConfigSpec,
    l: &dyn Lookup,
    objects: &Objects,
    previous: &SlotMap,
    refused_snippets: &BTreeMap<String, String>,
    excluded: &BTreeMap<haptic_render::ObjectRef, Exclusion>,
    incremental: &mut Incremental,
) -> Result<Routed, SpecError> {
    let r = spec.render.as_ref().ok_or_else(|| SpecError::invalid("spec.render", "spec.render is not set".into()))?;
    let class = class(r, objects)?.clone();
    let input = IngressInput {
        class,
        ingresses: objects.ingresses.clone(),
        services: objects.services.clone(),
        endpoint_slices: objects.endpoint_slices.clone(),
        secrets: objects.secrets.clone(),
        previous_slots: previous.clone(),
        settings: settings(r, l)?,
        allowed: Allowed { snippets: r.allow_snippet_annotations },
        refused_snippets: refused_snippets.clone(),
        excluded: excluded.clone(),
        sharing: r.ingress.host_sharing.into(),
    };
    let out = incremental
        .render(&input, &templates(r, l)?)
        .map_err(|e| SpecError::invalid("spec.render", format!("spec.render: {e}")))?;
    let mut files = BTreeMap::new();
    for (p, b) in out.files {
        let path =
            RelPath::new(&p).map_err(|e| SpecError::invalid("spec.render", format!("rendered path {p:?}: {e}")))?;
        files.insert(path, b);
    }
    add_files(spec, l, &mut files)?;
    Ok(Routed { files, verdicts: out.verdicts, slots: out.slots, certificates: out.certificates })
}

/// The first bind port a Gateway listener port gets (each (Gateway, port) its own, kept).
pub const GATEWAY_FIRST_BIND_PORT: u16 = 20000;

/// The GatewayClass `spec.render.gatewayClassName` names, checked to exist and be ours.
pub fn gateway_class<'a>(r: &RenderSpec, objects: &'a Objects) -> Result<&'a GatewayClass, SpecError> {
    named_class(
        ("gatewayClassName", "GatewayClass", GATEWAY_CONTROLLER),
        r.gateway_class_name.as_deref(),
        &objects.gateway_classes,
        |c: &GatewayClass| c.metadata.name.as_deref(),
        |c| c.spec.controller_name.as_str(),
    )
}

/// The Secrets (namespace, name) that the served class's Gateways name (their listeners'
/// certificates and their client certificate for backends), and that the listeners of the
/// ListenerSets one of them admits name (a ListenerSet its Gateway does not admit makes no Secret
/// read).
pub fn gateway_secret_refs(r: &RenderSpec, objects: &Objects) -> BTreeSet<(String, String)> {
    let Some(class) = r.gateway_class_name.as_deref() else { return BTreeSet::new() };
    let served: Vec<&Gateway> =
        objects.gateways.iter().map(|g| &**g).filter(|g| g.spec.gateway_class_name == class).collect();
    let sets = objects.listener_sets.iter().filter(|s| {
        let p = &s.spec.parent_ref;
        let lns = s.metadata.namespace.as_deref().unwrap_or_default();
        let pns = p.namespace.as_deref().unwrap_or(lns);
        p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
            && served.iter().any(|g| {
                g.metadata.namespace.as_deref() == Some(pns)
                    && g.metadata.name.as_deref() == Some(&p.name)
                    && admits(g, lns, &objects.namespaces)
            })
    });
    let mut out = BTreeSet::new();
    let own = served.iter().map(|g| {
        let backend =
            g.spec.tls.as_ref().and_then(|t| t.backend.as_ref()).and_then(|b| b.client_certificate_ref.as_ref());
        (&g.metadata, &g.spec.listeners, backend)
    });
    for (meta, listeners, backend) in own.chain(sets.map(|s| (&s.metadata, &s.spec.listeners, None))) {
        let ns = meta.namespace.clone().unwrap_or_default();
        let certs = listeners.iter().flat_map(|l| l.tls.iter().flat_map(|t| t.certificate_refs.iter()));
        for c in certs.chain(backend) {
            if c.group.as_deref().unwrap_or("").is_empty() && c.kind.as_deref().unwrap_or("Secret") == "Secret" {
                out.insert((c.namespace.clone().unwrap_or_else(|| ns.clone()), c.name.clone()));
            }
        }
    }
    out
}

/// The ConfigMaps (namespace, name) the BackendTLSPolicies and the served Gateways' client
/// certificate validation name as CA certificates.
pub fn config_map_refs(r: &RenderSpec, objects: &Objects) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let class = r.gateway_class_name.as_deref();
    for g in objects.gateways.iter().filter(|g| Some(g.spec.gateway_class_name.as_str()) == class) {
        let gns = g.metadata.namespace.clone().unwrap_or_default();
        let Some(f) = g.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else { continue };
        let validations =
            f.default.iter().chain(f.per_port.iter().map(|p| &p.tls)).filter_map(|t| t.validation.as_ref());
        for r in validations.flat_map(|v| &v.ca_certificate_refs) {
            if r.group.is_empty() && r.kind == "ConfigMap" {
                out.insert((r.namespace.clone().unwrap_or_else(|| gns.clone()), r.name.clone()));
            }
        }
    }
    for p in &objects.backend_tls_policies {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        for r in &p.spec.validation.ca_certificate_refs {
            if r.group.is_empty() && r.kind == "ConfigMap" {
                out.insert((ns.clone(), r.name.clone()));
            }
        }
    }
    out
}

/// Renders a spec with `spec.render.gatewayClassName` (pure): the class, the translator and
/// templates, the spec's extra `files`; the statuses come back beside the render. `namespace`
/// is the fleet's (where each Gateway's Service lives).
pub fn render_gateway(
    spec: &HAProxyConfigSpec,
    l: &dyn Lookup,
    objects: &Objects,
    previous: &SlotMap,
    namespace: &str,
    excluded: &BTreeMap<haptic_render::ObjectRef, Exclusion>,
) -> Result<(Routed, GatewayOutput), SpecError> {
    let r = spec.render.as_ref().ok_or_else(|| SpecError::invalid("spec.render", "spec.render is not set".into()))?;
    let class = gateway_class(r, objects)?;
    let s = settings(r, l)?;
    let input = GatewayInput {
        class_name: class.metadata.name.clone().unwrap_or_default(),
        classes: objects.gateway_classes.clone(),
        gateways: objects.gateways.clone(),
        listener_sets: objects.listener_sets.clone(),
        routes: objects.routes.clone(),
        grpc_routes: objects.grpc_routes.clone(),
        tls_routes: objects.tls_routes.clone(),
        tcp_routes: objects.tcp_routes.clone(),
        grants: objects.grants.clone(),
        namespaces: objects.namespaces.clone(),
        services: objects.services.clone(),
        endpoint_slices: objects.endpoint_slices.clone(),
        secrets: objects.secrets.clone(),
        backend_tls_policies: objects.backend_tls_policies.clone(),
        config_maps: objects.config_maps.clone(),
        previous_slots: previous.clone(),
        settings: GatewaySettings {
            bind_address: s.bind_address,
            first_bind_port: GATEWAY_FIRST_BIND_PORT,
            min_slots: s.min_slots,
            health_port: s.health_port,
            namespace: namespace.to_string(),
            paths: s.paths,
            edge: s.edge.clone(),
            infrastructure_keys: r.gateway.infrastructure_keys.clone(),
            host_sharing: r.gateway.host_sharing.into(),
        },
        excluded: excluded.clone(),
    };
    let (out, status) = haptic_render::render_gateway(&input, &templates(r, l)?)
        .map_err(|e| SpecError::invalid("spec.render", format!("spec.render: {e}")))?;
    let mut files = BTreeMap::new();
    for (p, b) in out.files {
        let path =
            RelPath::new(&p).map_err(|e| SpecError::invalid("spec.render", format!("rendered path {p:?}: {e}")))?;
        files.insert(path, b);
    }
    add_files(spec, l, &mut files)?;
    Ok((Routed { files, verdicts: out.verdicts, slots: out.slots, certificates: out.certificates }, status))
}

/// The slot maps of recent renders, newest last, so the next render keeps every endpoint in the
/// slot the fleet has it in.
#[derive(Debug, Default)]
pub struct SlotHistory {
    recent: VecDeque<(PlanId, SlotMap)>,
}

/// How many renders' slot maps are kept at most.
pub const SLOT_HISTORY: usize = 32;

/// How many of the newest renders' slot maps are kept whether or not a pod has applied them (a
/// render being deployed); older ones only while a pod has applied them. At thousands of
/// backends one slot map is about a megabyte.
pub const SLOT_HISTORY_NEWEST: usize = 2;

impl SlotHistory {
    /// Records the slots of a published render; of the older ones, keeps the newest
    /// [`SLOT_HISTORY_NEWEST`] and those of plans in `applied` (at most [`SLOT_HISTORY`] in all).
    pub fn record(&mut self, plan: PlanId, slots: SlotMap, applied: &BTreeSet<PlanId>) {
        self.recent.retain(|(p, _)| *p != plan);
        self.recent.push_back((plan, slots));
        let newest = self.recent.len().saturating_sub(SLOT_HISTORY_NEWEST);
        let mut i = 0;
        self.recent.retain(|(p, _)| {
            i += 1;
            i > newest || applied.contains(p)
        });
        while self.recent.len() > SLOT_HISTORY {
            self.recent.pop_front();
        }
    }

    /// The slots of the newest recorded render some pod has applied (`applied`), else of the
    /// newest render, else none.
    pub fn previous(&self, applied: &BTreeSet<PlanId>) -> SlotMap {
        self.recent
            .iter()
            .rev()
            .find(|(p, _)| applied.contains(p))
            .or_else(|| self.recent.back())
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }
}

/// What the Ingress status writer needs of a render: each served Ingress's verdict (and UID,
/// for its Events) and the address of the Service in front of the fleet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IngressOutcome {
    /// One per served Ingress, sorted by object.
    pub served: Vec<Served>,
    /// `status.loadBalancer.ingress` of every served Ingress; `None` without a publish Service
    /// (nothing is written then).
    pub load_balancer: Option<Vec<IngressLoadBalancerIngress>>,
    /// When each served certificate expires.
    pub certificates: Vec<haptic_render::CertExpiry>,
}

/// One served Ingress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Its verdict.
    pub verdict: Verdict,
    /// Its UID.
    pub uid: Option<String>,
}

/// The outcome of a render: verdicts with UIDs, and the publish Service's address (from the
/// Service in `namespace`) when `spec.render.publishService` is set and that Service has one.
pub fn outcome(r: &RenderSpec, namespace: &str, objects: &Objects, verdicts: &[Verdict]) -> IngressOutcome {
    let served = verdicts
        .iter()
        .map(|v| Served {
            verdict: v.clone(),
            uid: objects
                .ingresses
                .iter()
                .find(|i| {
                    i.metadata.namespace.as_deref() == Some(v.object.namespace.as_str())
                        && i.metadata.name.as_deref() == Some(v.object.name.as_str())
                })
                .and_then(|i| i.metadata.uid.clone()),
        })
        .collect();
    // A publish Service that is missing or has no address yet writes nothing: a served
    // Ingress keeps the address it has rather than losing it.
    let load_balancer = r.publish_service.as_ref().and_then(|p| {
        objects
            .services
            .iter()
            .find(|s| s.metadata.namespace.as_deref() == Some(namespace) && s.metadata.name.as_deref() == Some(&p.name))
            .map(|s| service_address(s))
            .filter(|a| !a.is_empty())
    });
    IngressOutcome { served, load_balancer, certificates: Vec::new() }
}

/// The addresses a Service answers on, as an Ingress's `status.loadBalancer.ingress`: a
/// LoadBalancer's assigned IPs and hostnames, else its external IPs, else (not a LoadBalancer)
/// its cluster IP (none for a headless Service).
pub fn service_address(s: &Service) -> Vec<IngressLoadBalancerIngress> {
    let lb = |ip: Option<String>, hostname: Option<String>| IngressLoadBalancerIngress { ip, hostname, ports: None };
    let spec = s.spec.clone().unwrap_or_default();
    if spec.type_.as_deref() == Some("LoadBalancer") {
        let assigned: Vec<_> = s
            .status
            .as_ref()
            .and_then(|st| st.load_balancer.as_ref())
            .and_then(|l| l.ingress.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|i| lb(i.ip, i.hostname))
            .collect();
        if !assigned.is_empty() {
            return assigned;
        }
    }
    if let Some(ext) = spec.external_ips.filter(|e| !e.is_empty()) {
        return ext.into_iter().map(|ip| lb(Some(ip), None)).collect();
    }
    // A LoadBalancer whose provider assigned nothing yet: no address (its cluster IP is not
    // where outside clients reach it, and external-dns would publish it).
    if spec.type_.as_deref() == Some("LoadBalancer") {
        return Vec::new();
    }
    match spec.cluster_ip.filter(|ip| !ip.is_empty() && ip != "None") {
        Some(ip) => vec![lb(Some(ip), None)],
        None => Vec::new(),
    }
}

/// One line per verdict: `accepted Ingress ns/name`, `refused Ingress ns/name: field: why` per
/// refusal, and `warning …` per warning.
pub fn verdict_lines(verdicts: &[Verdict]) -> String {
    let mut out = String::new();
    for v in verdicts {
        if v.accepted() {
            out.push_str(&format!("accepted {}\n", v.object));
        }
        for r in &v.refusals {
            out.push_str(&format!("refused {}: {}: {}\n", v.object, r.field, r.message));
        }
        for w in &v.warnings {
            out.push_str(&format!("warning {}: {}: {}\n", v.object, w.field, w.message));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_protocol::Digest;

    fn slots(n: usize) -> SlotMap {
        let mut s = SlotMap::default();
        s.backends.insert(format!("b{n}"), Default::default());
        s
    }

    #[test]
    fn the_previous_slots_are_the_newest_applied_render() {
        let (a, b, c) = (PlanId(Digest::of(b"a")), PlanId(Digest::of(b"b")), PlanId(Digest::of(b"c")));
        let mut h = SlotHistory::default();
        assert_eq!(h.previous(&BTreeSet::new()), SlotMap::default());
        let applied = BTreeSet::from([a]);
        h.record(a, slots(1), &BTreeSet::new());
        h.record(b, slots(2), &applied);
        h.record(c, slots(3), &applied);
        assert_eq!(h.previous(&BTreeSet::from([a, b])), slots(2));
        assert_eq!(h.previous(&BTreeSet::new()), slots(3), "nothing applied yet: the newest render");
        for i in 0..SLOT_HISTORY {
            h.record(PlanId(Digest::of(format!("x{i}").as_bytes())), slots(9), &BTreeSet::new());
        }
        assert_eq!(h.previous(&applied), slots(9), "a is forgotten once no pod has applied it");
    }

    #[test]
    fn the_slot_history_keeps_the_newest_and_the_renders_pods_have_applied() {
        let plans: Vec<PlanId> = (0..10).map(|i| PlanId(Digest::of(format!("p{i}").as_bytes()))).collect();
        let mut h = SlotHistory::default();
        let held = BTreeSet::from([plans[3]]);
        for (i, p) in plans.iter().enumerate() {
            h.record(*p, slots(i), &held);
        }
        let kept: Vec<PlanId> = h.recent.iter().map(|(p, _)| *p).collect();
        assert_eq!(kept, [plans[3], plans[8], plans[9]]);
        assert_eq!(h.previous(&held), slots(3), "a pod still runs plan 3: its slots");
    }

    #[test]
    fn the_service_address_prefers_the_load_balancer() {
        let svc = |v: serde_json::Value| -> Service { serde_json::from_value(v).unwrap() };
        let ips = |v: Vec<IngressLoadBalancerIngress>| -> Vec<String> {
            v.into_iter().map(|i| i.ip.or(i.hostname).unwrap_or_default()).collect()
        };
        let cluster = svc(serde_json::json!({"spec": {"type": "ClusterIP", "clusterIP": "10.96.0.5"}}));
        assert_eq!(ips(service_address(&cluster)), ["10.96.0.5"]);
        let pending = svc(serde_json::json!({"spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.6"}}));
        assert!(service_address(&pending).is_empty(), "no address assigned yet: never the cluster IP");
        let lb = svc(serde_json::json!({"spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.6"},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"hostname": "lb.example.com"}]}}}));
        assert_eq!(ips(service_address(&lb)), ["203.0.113.7", "lb.example.com"]);
        let headless = svc(serde_json::json!({"spec": {"clusterIP": "None"}}));
        assert!(service_address(&headless).is_empty());
        let ext = svc(serde_json::json!({"spec": {"clusterIP": "10.96.0.7", "externalIPs": ["198.51.100.1"]}}));
        assert_eq!(ips(service_address(&ext)), ["198.51.100.1"]);
    }

    #[test]
    fn a_publish_service_without_an_address_writes_none() {
        let r: RenderSpec = serde_json::from_value(serde_json::json!({"publishService": {"name": "front"}})).unwrap();
        let svc = |ip: &str| -> Arc<Service> {
            Arc::new(
                serde_json::from_value(
                    serde_json::json!({"metadata": {"name": "front", "namespace": "ns"}, "spec": {"clusterIP": ip}}),
                )
                .unwrap(),
            )
        };
        let mut o = Objects::default();
        // Not (yet) seen, or headless: nothing to write, so the address an Ingress has stays.
        assert_eq!(outcome(&r, "ns", &o, &[]).load_balancer, None);
        o.services = vec![svc("None")];
        assert_eq!(outcome(&r, "ns", &o, &[]).load_balancer, None);
        o.services = vec![svc("10.96.0.9")];
        let lb = outcome(&r, "ns", &o, &[]).load_balancer.unwrap();
        assert_eq!(lb[0].ip.as_deref(), Some("10.96.0.9"));
        assert_eq!(outcome(&r, "other", &o, &[]).load_balancer, None, "the Service of another namespace");
    }

    #[test]
    fn a_gateways_secrets_are_its_listeners_and_its_backend_certificate() {
        let r: RenderSpec = serde_json::from_value(serde_json::json!({"gatewayClassName": "haptic"})).unwrap();
        let gw = |class: &str| -> Arc<haptic_render::gateway_api::Gateway> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "gw", "namespace": "shop"},
                    "spec": {"gatewayClassName": class,
                             "listeners": [{"name": "s", "port": 443, "protocol": "HTTPS",
                                            "tls": {"certificateRefs": [{"name": "site"}]}}],
                             "tls": {"backend": {"clientCertificateRef": {"name": "client", "namespace": "pki"}}}},
                }))
                .unwrap(),
            )
        };
        let o = Objects { gateways: vec![gw("haptic"), gw("other")], ..Default::default() };
        let want: BTreeSet<(String, String)> =
            [("pki".to_string(), "client".to_string()), ("shop".to_string(), "site".to_string())].into();
        assert_eq!(gateway_secret_refs(&r, &o), want);
    }

    fn class_named(name: &str, controller: &str) -> Arc<IngressClass> {
        let mut c = IngressClass::default();
        c.metadata.name = Some(name.into());
        c.spec = Some(k8s_openapi::api::networking::v1::IngressClassSpec {
            controller: Some(controller.into()),
            ..Default::default()
        });
        Arc::new(c)
    }

    #[test]
    fn the_class_must_exist_and_be_ours() {
        let r: RenderSpec = serde_json::from_value(serde_json::json!({"ingressClassName": "haptic"})).unwrap();
        let mut o = Objects::default();
        assert_eq!(class(&r, &o).unwrap_err().reason, "MissingReference");
        o.classes.push(class_named("haptic", "k8s.io/ingress-nginx"));
        let e = class(&r, &o).unwrap_err();
        assert_eq!((e.reason, e.field.as_str()), ("InvalidSpec", "spec.render.ingressClassName"), "{e:?}");
        o.classes[0] = class_named("haptic", INGRESS_CONTROLLER);
        assert!(class(&r, &o).is_ok());
        let bad: RenderSpec =
            serde_json::from_value(serde_json::json!({"ingressClassName": "haptic", "bindAddress": "any"})).unwrap();
        assert_eq!(settings(&bad, &NoObjects).unwrap_err().field, "spec.render.bindAddress");
        assert_eq!(settings(&r, &NoObjects).unwrap().min_slots, 8);
    }

    /// A namespace with no ConfigMap or Secret.
    struct NoObjects;

    impl Lookup for NoObjects {
        fn config_map(&self, _: &str) -> Option<Arc<k8s_openapi::api::core::v1::ConfigMap>> {
            None
        }
        fn secret(&self, _: &str) -> Option<Arc<Secret>> {
            None
        }
    }

    #[test]
    fn the_default_certificate_is_the_named_secret_or_one_generated_once() {
        let r: RenderSpec = serde_json::from_value(serde_json::json!({"ingressClassName": "haptic"})).unwrap();
        let (a, b) = (settings(&r, &NoObjects).unwrap(), settings(&r, &NoObjects).unwrap());
        let generated = a.edge.default_certificate.expect("a generated one");
        assert!(!generated.pem.is_empty());
        assert_eq!(Some(generated), b.edge.default_certificate, "the same one for the process's life");
        let named: RenderSpec = serde_json::from_value(
            serde_json::json!({"ingressClassName": "haptic", "defaultCertificate": {"name": "edge-tls"}}),
        )
        .unwrap();
        let e = settings(&named, &NoObjects).unwrap_err();
        assert_eq!((e.reason, e.field.as_str()), ("MissingReference", "spec.render.defaultCertificate"), "{e:?}");
    }

    #[test]
    fn secrets_are_read_for_the_listener_sets_a_served_gateway_admits_only() {
        let r: RenderSpec = serde_json::from_value(serde_json::json!({"gatewayClassName": "haptic"})).unwrap();
        let gw: Gateway = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gw", "namespace": "edge"},
            "spec": {"gatewayClassName": "haptic", "allowedListeners": {"namespaces": {"from": "Same"}},
                "listeners": [{"name": "https", "port": 443, "protocol": "HTTPS",
                    "tls": {"certificateRefs": [{"name": "own"}]}}]},
        }))
        .unwrap();
        let set = |ns: &str, secret: &str| -> Arc<ListenerSet> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "ls", "namespace": ns},
                    "spec": {"parentRef": {"name": "gw", "namespace": "edge"},
                        "listeners": [{"name": "s", "port": 443, "protocol": "HTTPS",
                            "tls": {"certificateRefs": [{"name": secret, "namespace": "certs"}]}}]},
                }))
                .unwrap(),
            )
        };
        let o = Objects {
            gateways: vec![Arc::new(gw)],
            listener_sets: vec![set("edge", "admitted"), set("tenant", "refused")],
            ..Default::default()
        };
        let refs = gateway_secret_refs(&r, &o);
        let want: BTreeSet<(String, String)> =
            [("edge", "own"), ("certs", "admitted")].iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        assert_eq!(refs, want);
    }
}
