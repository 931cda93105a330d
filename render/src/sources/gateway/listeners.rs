//! The Gateways' side of a render: each (Gateway, listener port)'s bind port, each listener
//! validated (protocol, hostname, route kinds, conflicts on its port, certificate references)
//! with its status, each Gateway's Service, addresses and conditions, and the binds and host
//! tables the usable listeners open.
//!
//! Owns listener and Gateway conditions and bind port stability (kept from the previous render,
//! else the Gateway Service's target port, else the lowest free one). The listeners of the
//! ListenerSets a Gateway admits are validated here too, as the ListenerSet's (its namespace for
//! references), and bind on their Gateway's ports ([`super::listener_sets`] decides which and their
//! conflicts). It must never look at HTTPRoutes: the routes attached to a listener are counted
//! where routes attach.

use std::collections::{BTreeMap, BTreeSet};

use haptic_haproxy::names::is_section_name;

use super::addresses::{self, Requested};
use super::api::*;
use super::ca_refs::{self, CaRef, Referrer};
use super::{
    cond, gateway_host, granted, infrastructure, port_key, service_name, stable_id, Attached, Carries, Cond,
    GatewayInput, GatewayOutcome, GatewayService, Gateways, ListenerStatus, Lst,
};
use crate::model::{Cert, ClientVerify, ObjectRef, TlsListener};
use crate::sources::common::{obj, secret_pem};

/// Each (Gateway, listener port)'s bind port, by [`port_key`]: kept from the previous render,
/// else the Gateway Service's target port, else the lowest free one.
/// The ports of the admitted ListenerSets' listeners (`extra`: Gateway index, port) count as
/// their Gateway's.
pub(super) fn bind_ports(input: &GatewayInput, gws: &[&Gateway], extra: &[(usize, i32)]) -> BTreeMap<String, u16> {
    let st = &input.settings;
    let prev_ports = &input.previous_slots.bind_ports;
    let mut used: BTreeSet<u16> = BTreeSet::new();
    let mut bind_ports: BTreeMap<String, u16> = BTreeMap::new();
    let wanted: Vec<(String, &Gateway, u16)> = gws
        .iter()
        .enumerate()
        .flat_map(|(gi, g)| {
            let own = g.spec.listeners.iter().map(|l| l.port);
            let sets = extra.iter().filter(move |(i, _)| *i == gi).map(|(_, p)| *p);
            let ports: BTreeSet<u16> = own.chain(sets).filter_map(|p| u16::try_from(p).ok()).collect();
            ports.into_iter().map(move |p| (port_key(g, p), *g, p))
        })
        .collect();
    for (key, g, p) in &wanted {
        let from_svc = || {
            let name =
                service_name(g.metadata.namespace.as_deref().unwrap_or(""), g.metadata.name.as_deref().unwrap_or(""));
            let svc = input.services.iter().find(|s| {
                s.metadata.namespace.as_deref() == Some(st.namespace.as_str())
                    && s.metadata.name.as_deref() == Some(&name)
            })?;
            svc.spec.as_ref()?.ports.as_ref()?.iter().find(|sp| sp.port == i32::from(*p)).and_then(|sp| {
                match &sp.target_port {
                    Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(t)) => u16::try_from(*t).ok(),
                    _ => None,
                }
            })
        };
        if let Some(b) = prev_ports.get(key).copied().or_else(from_svc) {
            if b >= st.first_bind_port && used.insert(b) {
                bind_ports.insert(key.clone(), b);
            }
        }
    }
    let mut next = st.first_bind_port;
    for (key, _, _) in &wanted {
        if bind_ports.contains_key(key) {
            continue;
        }
        while used.contains(&next) || Some(next) == st.health_port {
            next = next.saturating_add(1);
        }
        used.insert(next);
        bind_ports.insert(key.clone(), next);
    }
    bind_ports
}

/// Gateway `g`'s listeners validated (their certificates into `certs`) and its outcome.
pub(super) fn gateway(
    input: &GatewayInput,
    g: &Gateway,
    bind_ports: &BTreeMap<String, u16>,
    certs: &mut BTreeMap<String, Cert>,
) -> (Vec<Lst>, GatewayOutcome) {
    let gns = g.metadata.namespace.clone().unwrap_or_default();
    let gen = g.metadata.generation.unwrap_or(0);
    let mut ls = Vec::new();
    let mut statuses = Vec::new();
    // Port → protocols, and (port, hostname) counts, for conflicts.
    let mut protos: BTreeMap<i32, BTreeSet<&str>> = BTreeMap::new();
    let mut hosts: BTreeMap<(i32, Option<&str>), usize> = BTreeMap::new();
    for l in &g.spec.listeners {
        protos.entry(l.port).or_default().insert(l.protocol.as_str());
        *hosts.entry((l.port, l.hostname.as_deref())).or_default() += 1;
    }
    for l in &g.spec.listeners {
        let conflict = if protos[&l.port].len() > 1 {
            Some("ProtocolConflict")
        } else if hosts[&(l.port, l.hostname.as_deref())] > 1 {
            Some("HostnameConflict")
        } else {
            None
        };
        let clients = client_validation(g, l.port);
        let name = g.metadata.name.as_deref().unwrap_or_default();
        let owner = Owner { kind: "Gateway", namespace: &gns, generation: gen, name };
        let (lst, status) = listener(input, &owner, l, (conflict, clients), certs);
        ls.push(lst);
        statuses.push(status);
    }
    let outcome = outcome(input, g, &ls, statuses, bind_ports);
    (ls, outcome)
}

/// The client certificate validation of Gateway `g`'s listener port `port`, for its listeners
/// and those of its ListenerSets (they share the port's bind).
pub(super) fn client_validation(g: &Gateway, port: i32) -> Option<ClientValidation<'_>> {
    let gns = g.metadata.namespace.clone().unwrap_or_default();
    frontend_validation(g, port).map(|rules| ClientValidation {
        rules,
        ca_path: client_ca_path(&gns, g, port),
        gateway: obj("Gateway", &g.metadata),
    })
}

/// The object whose listener is validated: a Gateway, or a ListenerSet (its references are
/// granted to ListenerSets of its namespace).
pub(super) struct Owner<'a> {
    /// `Gateway` or `ListenerSet`.
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its generation.
    pub generation: i64,
    /// Its name.
    pub name: &'a str,
}

/// The client certificate validation of Gateway `g`'s listener port `port`: its own
/// (`perPort`), else the default.
fn frontend_validation(g: &Gateway, port: i32) -> Option<&FrontendTlsValidation> {
    let f = g.spec.tls.as_ref()?.frontend.as_ref()?;
    match f.per_port.iter().find(|p| p.port == port) {
        Some(p) => p.tls.validation.as_ref(),
        None => f.default.as_ref()?.validation.as_ref(),
    }
}

/// Where the CA file of Gateway `g`'s port `port` goes.
fn client_ca_path(gns: &str, g: &Gateway, port: i32) -> String {
    let name = g.metadata.name.as_deref().unwrap_or_default();
    format!("certs/clientca_{}.pem", stable_id("", &[gns, name, &port.to_string()]))
}

/// Whether Gateway `g` lets clients without a valid certificate through on some port
/// (`AllowInsecureFallback`).
fn insecure_fallback(g: &Gateway) -> bool {
    let Some(f) = g.spec.tls.as_ref().and_then(|t| t.frontend.as_ref()) else { return false };
    f.default
        .iter()
        .chain(f.per_port.iter().map(|p| &p.tls))
        .filter_map(|t| t.validation.as_ref())
        .any(|v| v.mode.as_deref() == Some("AllowInsecureFallback"))
}

/// The client certificate validation of one listener port: the Gateway's rules, where its CA
/// file goes, and the Gateway (the file's source).
pub(super) struct ClientValidation<'g> {
    rules: &'g FrontendTlsValidation,
    ca_path: String,
    gateway: ObjectRef,
}

/// The client certificate check an HTTPS listener gets from its port's validation `v` (its
/// Gateway's, the references resolved from the Gateway's namespace): the CA bundle of the references that resolve, with the first
/// problem of the others (ResolvedRefs); or, when none resolves, why the listener cannot be
/// accepted.
fn client_check(input: &GatewayInput, v: ClientValidation<'_>) -> Result<ClientCheck, (&'static str, String)> {
    let (validation, path) = (v.rules, v.ca_path);
    let gns = v.gateway.namespace.as_str();
    let refs = validation.ca_certificate_refs.iter().map(|r| CaRef {
        group: &r.group,
        kind: &r.kind,
        namespace: r.namespace.as_deref(),
        name: &r.name,
    });
    let from = Referrer { kind: "Gateway", namespace: gns, kind_reason: "InvalidCACertificateKind" };
    let at = "spec.tls.frontend.validation.caCertificateRefs";
    let found = ca_refs::resolve(refs, at, &from, (&input.config_maps, &input.grants));
    if found.pems.is_empty() {
        return Err(found.problem.unwrap_or(("InvalidCACertificateRef", format!("{at}: none"))));
    }
    let required = validation.mode.as_deref() != Some("AllowInsecureFallback");
    let verify = ClientVerify { ca_file: path.clone(), required };
    Ok(ClientCheck { verify, ca: ca_refs::bundle(found.pems, path, v.gateway), problem: found.problem })
}

/// A listener's client certificate check: how, its CA file, and the first CA reference that
/// did not resolve, if one did not.
struct ClientCheck {
    verify: ClientVerify,
    ca: Cert,
    problem: Option<(&'static str, String)>,
}

/// Listener `l` of `owner`, validated (with the listener `conflict` its port has, and the client
/// certificate validation of its port), and its status.
pub(super) fn listener(
    input: &GatewayInput,
    owner: &Owner<'_>,
    l: &Listener,
    (conflict, validation): (Option<&'static str>, Option<ClientValidation<'_>>),
    certs: &mut BTreeMap<String, Cert>,
) -> (Lst, ListenerStatus) {
    let gen = owner.generation;
    let mut conds = Vec::new();
    let mode = l.tls.as_ref().and_then(|t| t.mode.clone()).unwrap_or_default();
    // A TLS listener terminates TLS (with its certificates) or passes it through.
    let terminate = l.protocol == ProtocolType::Tls && mode == TlsMode::Terminate;
    let carries = match l.protocol {
        ProtocolType::Tcp => Carries::Tcp,
        ProtocolType::Tls => Carries::Sni,
        _ => Carries::Http,
    };
    let supported =
        matches!(l.protocol, ProtocolType::Http | ProtocolType::Https | ProtocolType::Tcp | ProtocolType::Tls);
    let port = u16::try_from(l.port).unwrap_or(0);
    let hostname = match l.hostname.as_deref() {
        None | Some("") => Ok(None),
        Some(h) => gateway_host(h).map(Some),
    };
    let (kinds, bad_kind) = route_kinds(l, supported, carries);
    let (mut resolved, lcerts) = if l.protocol == ProtocolType::Https || terminate {
        listener_certs(input, owner, l, certs)
    } else {
        (Ok(()), Vec::new())
    };
    if bad_kind && resolved.is_ok() {
        let served = match carries {
            Carries::Http => "HTTPRoute and GRPCRoute",
            Carries::Sni => "TLSRoute",
            Carries::Tcp => "TCPRoute",
        };
        resolved = Err(("InvalidRouteKinds", format!("only {served} (gateway.networking.k8s.io) are served here")));
    }
    // Clients' certificates, on HTTPS listeners: a CA that does not resolve at all keeps the
    // listener from serving (never unchecked); one of several only shows in ResolvedRefs.
    let clients = match validation.filter(|_| l.protocol == ProtocolType::Https) {
        None => Ok(None),
        Some(v) => client_check(input, v).map(|c| {
            if let (Some(p), Ok(())) = (c.problem, &resolved) {
                resolved = Err(p);
            }
            Some((c.verify, c.ca))
        }),
    };
    if let (Err(p), Ok(())) = (&clients, &resolved) {
        resolved = Err(p.clone());
    }
    let accepted = supported && hostname.is_ok() && port != 0 && clients.is_ok();
    let (areason, amsg) = if !supported {
        ("UnsupportedProtocol", format!("protocol {} is not supported", l.protocol))
    } else if let Err(e) = &hostname {
        ("UnsupportedValue", e.clone())
    } else if let Err((_, m)) = &clients {
        ("NoValidCACertificate", format!("no CA certificate to check clients with: {m}"))
    } else {
        ("Accepted", "accepted".to_string())
    };
    conds.push(cond("Accepted", accepted, areason, amsg, gen));
    match conflict {
        Some(r) => conds.push(cond("Conflicted", true, r, "another listener shares this port", gen)),
        None => conds.push(cond("Conflicted", false, "NoConflicts", "no conflicts", gen)),
    }
    match &resolved {
        Ok(()) => conds.push(cond("ResolvedRefs", true, "ResolvedRefs", "resolved", gen)),
        Err((r, m)) => conds.push(cond("ResolvedRefs", false, r, m.clone(), gen)),
    }
    let programmed = accepted && conflict.is_none() && resolved.is_ok();
    conds.push(if programmed {
        cond("Programmed", true, "Programmed", "programmed", gen)
    } else {
        cond("Programmed", false, "Invalid", "not programmed", gen)
    });
    let sel = l.allowed_routes.as_ref().and_then(|a| a.namespaces.clone()).unwrap_or_default();
    let lst = Lst {
        name: l.name.clone(),
        port,
        https: l.protocol == ProtocolType::Https,
        hostname: hostname.clone().ok().flatten(),
        usable: accepted && conflict.is_none(),
        carries,
        terminate,
        kinds: kinds.clone(),
        from: sel.from.unwrap_or_default(),
        selector: sel.selector,
        certs: if programmed { lcerts } else { vec![] },
        clients: clients.ok().flatten(),
        set: (owner.kind == "ListenerSet").then(|| format!("{}/{}", owner.namespace, owner.name)),
    };
    let supported_kinds = kinds.into_iter().map(group_kind).collect();
    let status = ListenerStatus { name: l.name.clone(), supported_kinds, attached_routes: 0, conditions: conds };
    (lst, status)
}

/// `kind` as a listener status lists it.
fn group_kind(kind: RouteKind) -> RouteGroupKind {
    RouteGroupKind { group: Some(GROUP.into()), kind: kind.name().into() }
}

/// The route kinds listener `l` takes (by what it `carries`), and whether it names one it
/// cannot take.
fn route_kinds(l: &Listener, supported: bool, carries: Carries) -> (Vec<RouteKind>, bool) {
    let fits = |k: &RouteKind| carries.takes(*k);
    let mut kinds = Vec::new();
    let mut bad_kind = false;
    match l.allowed_routes.as_ref().and_then(|a| a.kinds.as_ref()) {
        Some(ks) => {
            for k in ks {
                match RouteKind::of(&k.kind).filter(|k2| k.group.as_deref().unwrap_or(GROUP) == GROUP && fits(k2)) {
                    Some(kind) => kinds.push(kind),
                    None => bad_kind = true,
                }
            }
        }
        None if supported => kinds.extend(RouteKind::ALL.into_iter().filter(fits)),
        None => {}
    }
    kinds.dedup();
    (kinds, bad_kind)
}

/// The certificates of HTTPS listener `l` (into `certs`, as they resolve) and its
/// certificate files, or the reason of the first reference that does not resolve.
fn listener_certs(
    input: &GatewayInput,
    owner: &Owner<'_>,
    l: &Listener,
    certs: &mut BTreeMap<String, Cert>,
) -> (Result<(), (&'static str, String)>, Vec<String>) {
    let (kind, gns) = (owner.kind, owner.namespace);
    let mut resolved: Result<(), (&'static str, String)> = Ok(());
    let mut lcerts = Vec::new();
    let tls = l.tls.clone().unwrap_or_default();
    if tls.mode.unwrap_or_default() != TlsMode::Terminate {
        resolved = Err(("InvalidCertificateRef", format!("only TLS mode Terminate is supported on {}", l.protocol)));
    } else if tls.certificate_refs.is_empty() {
        resolved = Err(("InvalidCertificateRef", "no certificateRefs".into()));
    }
    for r in &tls.certificate_refs {
        if resolved.is_err() {
            break;
        }
        match secret_cert(input, (kind, gns), r, "InvalidCertificateRef") {
            Ok(c) => {
                lcerts.push(c.path.clone());
                certs.entry(c.path.clone()).or_insert(c);
            }
            Err(e) => resolved = Err(e),
        }
    }
    (resolved, lcerts)
}

/// The certificate Secret `r` names for a `kind` (Gateway, ListenerSet) of namespace `gns`, or why
/// it does not resolve (`RefNotPermitted` without a ReferenceGrant from that kind there, else the
/// reason `invalid`).
fn secret_cert(
    input: &GatewayInput,
    (kind, gns): (&str, &str),
    r: &SecretObjectReference,
    invalid: &'static str,
) -> Result<Cert, (&'static str, String)> {
    let rns = r.namespace.clone().unwrap_or_else(|| gns.to_string());
    if !r.group.as_deref().unwrap_or("").is_empty() || r.kind.as_deref().unwrap_or("Secret") != "Secret" {
        return Err((invalid, format!("{:?} is not a Secret", r.kind)));
    }
    if rns != gns && !granted(&input.grants, kind, gns, "Secret", &rns, &r.name) {
        return Err((
            "RefNotPermitted",
            format!("no ReferenceGrant in {rns} lets {kind}s of {gns} use Secret {}", r.name),
        ));
    }
    if !is_section_name(&r.name) || !is_section_name(&rns) {
        return Err((invalid, "not a Secret name".into()));
    }
    let source = ObjectRef { kind: "Secret".into(), namespace: rns.clone(), name: r.name.clone() };
    let file = match input.excluded.get(&source) {
        Some(why) => Err(format!("Secret {rns}/{} is left out: {why}", r.name)),
        None => secret_pem(&input.secrets, &rns, &r.name).map_err(|w| w.message),
    };
    let file = file.map_err(|why| (invalid, why))?;
    let path = format!("certs/{rns}_{}.pem", r.name);
    Ok(Cert { path, hosts: vec![], source, pem: file.pem, not_after: file.not_after })
}

/// The client certificate Gateway `g` presents to backends (`spec.tls.backend`), with its
/// `ResolvedRefs` condition: False when the reference does not resolve, and then backends
/// get no certificate from it.
pub(super) fn backend_client_cert(input: &GatewayInput, g: &Gateway) -> (Option<Cert>, Cond) {
    let gns = g.metadata.namespace.clone().unwrap_or_default();
    let gen = g.metadata.generation.unwrap_or(0);
    let r = g.spec.tls.as_ref().and_then(|t| t.backend.as_ref()).and_then(|b| b.client_certificate_ref.as_ref());
    let Some(r) = r else {
        return (None, cond("ResolvedRefs", true, "ResolvedRefs", "resolved", gen));
    };
    match secret_cert(input, ("Gateway", &gns), r, "InvalidClientCertificateRef") {
        Ok(mut c) => {
            // Its own file: a listener's certificate files are served to clients.
            c.path = format!("certs/backendclient_{}_{}.pem", c.source.namespace, c.source.name);
            (Some(c), cond("ResolvedRefs", true, "ResolvedRefs", "resolved", gen))
        }
        Err((reason, why)) => {
            (None, cond("ResolvedRefs", false, reason, format!("spec.tls.backend.clientCertificateRef: {why}"), gen))
        }
    }
}

/// Gateway `g`'s outcome: its Service (the usable listeners' ports, the `spec.infrastructure`
/// keys allowed), its addresses (the Service's cluster IP) and its conditions.
fn outcome(
    input: &GatewayInput,
    g: &Gateway,
    ls: &[Lst],
    statuses: Vec<ListenerStatus>,
    bind_ports: &BTreeMap<String, u16>,
) -> GatewayOutcome {
    let st = &input.settings;
    let gns = g.metadata.namespace.clone().unwrap_or_default();
    let gen = g.metadata.generation.unwrap_or(0);
    let name = g.metadata.name.clone().unwrap_or_default();
    let mut svc_ports = Vec::new();
    let mut seen = BTreeSet::new();
    for l in ls.iter().filter(|l| l.usable) {
        if seen.insert(l.port) {
            svc_ports.push((l.port, bind_ports[&port_key(g, l.port)]));
        }
    }
    let (labels, annotations, refused_keys) = infrastructure(g.spec.infrastructure.as_ref(), &st.infrastructure_keys);
    let wanted = addresses::requested(&g.spec.addresses);
    let address = wanted.for_service();
    let service = GatewayService { name: service_name(&gns, &name), ports: svc_ports, labels, annotations, address };
    let on_service: Vec<String> = input
        .services
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(st.namespace.as_str())
                && s.metadata.name.as_deref() == Some(service.name.as_str())
        })
        .map(|s| service_addresses(s))
        .unwrap_or_default();
    let (addresses, programmed) = address_conditions(&wanted, on_service, &service.name, gen);
    let mut conds = Vec::new();
    let parameters = g.spec.infrastructure.as_ref().and_then(|i| i.parameters_ref.as_ref());
    match (&wanted, parameters) {
        (Requested::Unsupported(why), _) => conds.push(cond("Accepted", false, "UnsupportedAddress", why.clone(), gen)),
        (_, Some(p)) => {
            let m = format!(
                "spec.infrastructure.parametersRef: haptic reads no parameters ({}/{} {:?} is not a kind it supports)",
                p.group, p.kind, p.name
            );
            conds.push(cond("Accepted", false, "InvalidParameters", m, gen));
        }
        _ => conds.push(accepted(&statuses, &refused_keys, gen)),
    }
    conds.push(programmed);
    if insecure_fallback(g) {
        let m = "a port lets clients without a valid certificate through (AllowInsecureFallback)";
        conds.push(cond("InsecureFrontendValidationMode", true, "ConfigurationChanged", m, gen));
    }
    GatewayOutcome {
        object: obj("Gateway", &g.metadata),
        uid: g.metadata.uid.clone(),
        conditions: conds,
        listeners: statuses,
        attached_listener_sets: 0,
        addresses,
        service,
    }
}

/// A Gateway's `status.addresses` and its Programmed condition: the addresses its Service
/// has, or of the requested ones those the Service carries (Programmed only when it carries
/// every one).
fn address_conditions(wanted: &Requested, on_service: Vec<String>, service: &str, gen: i64) -> (Vec<String>, Cond) {
    match wanted {
        Requested::Unsupported(why) => (vec![], cond("Programmed", false, "AddressNotUsable", why.clone(), gen)),
        Requested::Ips(ips) => {
            let (carried, not) = addresses::carried(ips, &on_service);
            if not.is_empty() {
                (carried, cond("Programmed", true, "Programmed", "programmed", gen))
            } else {
                let m = format!(
                    "Service {service} does not carry {} (it carries the first address asked for, when the API server \
                     accepts it: within the cluster's Service range and not taken)",
                    not.join(", ")
                );
                (carried, cond("Programmed", false, "AddressNotUsable", m, gen))
            }
        }
        Requested::Any if on_service.is_empty() => {
            let m = format!("Service {service} has no address yet (a LoadBalancer's is assigned by its provider)");
            (vec![], cond("Programmed", false, "AddressNotAssigned", m, gen))
        }
        Requested::Any => (on_service, cond("Programmed", true, "Programmed", "programmed", gen)),
    }
}

/// A Gateway's Accepted condition, by how many of its listeners are accepted, naming the
/// `spec.infrastructure` keys left off its Service.
fn accepted(statuses: &[ListenerStatus], refused_keys: &[String], gen: i64) -> Cond {
    let accepted = |l: &ListenerStatus| l.conditions.iter().any(|c| c.type_ == "Accepted" && c.status);
    let n = statuses.iter().filter(|l| accepted(l)).count();
    // Keys the HAProxyConfig does not allow are left off the Service; the Gateway
    // serves, and says so.
    let left_out = if refused_keys.is_empty() {
        String::new()
    } else {
        format!(
            "; left off its Service, as the HAProxyConfig's spec.render.gateway.infrastructureKeys does not allow them: {}",
            refused_keys.join(", ")
        )
    };
    if n == statuses.len() {
        cond("Accepted", true, "Accepted", format!("accepted{left_out}"), gen)
    } else if n > 0 {
        cond("Accepted", true, "ListenersNotValid", format!("some listeners are not valid{left_out}"), gen)
    } else {
        cond("Accepted", false, "ListenersNotValid", format!("no listener is valid{left_out}"), gen)
    }
}

/// The bind ports and host tables the usable listeners open: each bind port's listener port,
/// HTTPS binds with their certificates, TLS listeners by stable id, HTTP binds, TLS Passthrough
/// and TCP binds, and a table for
/// every listener hostname so its requests never reach a less specific listener's routes.
pub(super) fn binds(gw: &Gateways<'_>, acc: &mut Attached) {
    let own = gw.gws.iter().enumerate().flat_map(|(gi, g)| gw.listeners[gi].iter().map(move |l| (*g, l)));
    let sets = gw.sets.iter().flat_map(|s| s.listeners.iter().map(move |l| (gw.gws[s.gi], l)));
    for (g, l) in own.chain(sets) {
        {
            if !l.usable {
                continue;
            }
            let b = gw.bind_ports[&port_key(g, l.port)];
            acc.ports.insert(b, l.port);
            if l.carries == Carries::Sni {
                acc.sni_binds.insert(b);
                if l.terminate {
                    acc.tls_terminate.entry(b).or_default().extend(l.certs.clone());
                    if let Some(h) = &l.hostname {
                        acc.terminated.insert((b, h.clone()));
                    }
                }
            } else if l.carries == Carries::Tcp {
                acc.tcp_binds.insert(b);
            } else if l.https {
                if !l.certs.is_empty() {
                    acc.https_binds.entry(b).or_default().extend(l.certs.clone());
                }
                if let Some((verify, cert)) = &l.clients {
                    acc.clients.insert(b, verify.clone());
                    acc.client_cas.insert(cert.path.clone(), cert.clone());
                }
                let gid = port_key(g, l.port);
                acc.tls_listeners.push(TlsListener {
                    port: b,
                    host: l.hostname.clone(),
                    id: match &l.set {
                        None => stable_id("l", &[&gid, &l.name]),
                        Some(set) => stable_id("l", &[&gid, set, &l.name]),
                    },
                });
            } else {
                acc.http_binds.insert(b);
            }
            if let Some(h) = &l.hostname {
                acc.tables.entry((b, h.clone())).or_default();
            }
        }
    }
}

/// Where clients reach a Gateway's Service: a LoadBalancer's assigned addresses (none while
/// its provider has assigned none: never its cluster IP, which no outside client reaches), else
/// its cluster IP.
fn service_addresses(s: &k8s_openapi::api::core::v1::Service) -> Vec<String> {
    let spec = s.spec.as_ref();
    if spec.and_then(|sp| sp.type_.as_deref()) == Some("LoadBalancer") {
        return s
            .status
            .as_ref()
            .and_then(|st| st.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
            .filter(|a| !a.is_empty())
            .collect();
    }
    spec.and_then(|sp| sp.cluster_ip.clone()).filter(|ip| !ip.is_empty() && ip != "None").into_iter().collect()
}

#[cfg(test)]
mod address_tests {
    use super::service_addresses;

    #[test]
    fn a_load_balancer_publishes_only_its_assigned_addresses() {
        let svc = |v: serde_json::Value| -> k8s_openapi::api::core::v1::Service { serde_json::from_value(v).unwrap() };
        let cluster = svc(serde_json::json!({"spec": {"type": "ClusterIP", "clusterIP": "10.96.0.5"}}));
        assert_eq!(service_addresses(&cluster), ["10.96.0.5"]);
        let pending = svc(serde_json::json!({"spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.6"}}));
        assert!(service_addresses(&pending).is_empty(), "never the cluster IP of a LoadBalancer");
        let lb = svc(serde_json::json!({"spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.6"},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"hostname": "lb.example.com"}]}}}));
        assert_eq!(service_addresses(&lb), ["203.0.113.7", "lb.example.com"]);
    }
}
