//! Serving a GatewayClass, the leader's writes besides the fleet's own status: each Gateway's
//! Service in the fleet's namespace (selecting the fleet's pods, each listener port to its
//! bind port; Services of Gateways that are gone are deleted), and the status of the
//! GatewayClass, of every Gateway (addresses, conditions, listeners, attached ListenerSets), of every
//! ListenerSet attached to one of them (conditions, listeners), and of every HTTPRoute and
//! GRPCRoute, TLSRoute and TCPRoute with a parent among them (its `status.parents[]` entries with our controllerName),
//! and of every BackendTLSPolicy (its `status.ancestors[]` entries: the Gateways whose routes reach its Services).
//!
//! Owns turning the translator's decisions into API objects: the pure [`service`],
//! [`class_status`], [`gateway_status`], [`listener_set_status`] and [`route_parents`] (conditions keep their
//! `lastTransitionTime` while their status stays), and the loop that writes them with
//! server-side apply as field manager `haptic-controller` (a route's `parents` is an
//! atomic list, so it is read, the entries of other controllers kept, and written back). It
//! must never change a spec, nor decide anything the translator decides.

use std::collections::{BTreeMap, BTreeSet};

use haptic_render::gateway::{
    ClassStatus, Cond, GatewayOutcome, GatewayOutput, ListenerSetOutcome, ListenerStatus, ParentStatus, PolicyOutcome,
    RouteOutcome, GATEWAY_CONTROLLER,
};
use haptic_render::gateway_api::{
    BackendTlsPolicy, Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, RouteKind, TcpRoute, TlsRoute,
};
use haptic_render::ObjectRef;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::context::Context;
use super::crd::{GatewayServiceSpec, GatewayServiceType};
use super::status::FIELD_MANAGER;

/// The label on every Service made for a Gateway.
pub const SERVICE_LABEL: &str = "haptic.dev/gateway-service";
/// The annotation naming the Gateway (`namespace/name`) a Service is for.
pub const GATEWAY_ANNOTATION: &str = "haptic.dev/gateway";
/// The label on the Services that stand for Gateways in their own namespaces.
pub const ALIAS_LABEL: &str = "haptic.dev/gateway-alias";
/// The Gateway API's label naming the Gateway a generated object belongs to.
const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// The annotation naming the static address a Gateway's Service carries.
pub const ADDRESS_ANNOTATION: &str = "haptic.dev/static-address";

fn now() -> String {
    let f = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::now_utc().format(&f).unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// Conditions as API JSON, keeping an old condition's `lastTransitionTime` while its status
/// stays (`at` is the time of a transition).
pub fn conditions(new: &[Cond], old: &[Condition], at: &str) -> Vec<Value> {
    new.iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" };
            let since = old
                .iter()
                .find(|o| o.type_ == c.type_ && o.status == status)
                .and_then(|o| serde_json::to_value(&o.last_transition_time).ok())
                .unwrap_or_else(|| Value::String(at.to_string()));
            json!({
                "type": c.type_,
                "status": status,
                "reason": c.reason,
                "message": c.message.chars().take(1000).collect::<String>(),
                "observedGeneration": c.observed_generation,
                "lastTransitionTime": since,
            })
        })
        .collect()
}

/// The Service of one Gateway (none while it has no usable listener port), of the kind `kind`
/// says (`spec.render.gateway.service`).
pub fn service(
    g: &GatewayOutcome,
    namespace: &str,
    selector: &BTreeMap<String, String>,
    kind: &GatewayServiceSpec,
) -> Option<Value> {
    if g.service.ports.is_empty() {
        return None;
    }
    let mut labels = g.service.labels.clone();
    labels.insert(SERVICE_LABEL.into(), "true".into());
    labels.insert("app.kubernetes.io/managed-by".into(), "haptic".into());
    labels.insert(GATEWAY_NAME_LABEL.into(), g.object.name.clone());
    // The HAProxyConfig's annotations first: a Gateway's own (`spec.infrastructure`, within the
    // keys allowed) win, and ours last.
    let mut annotations = kind.annotations.clone();
    annotations.extend(g.service.annotations.clone());
    annotations.insert(GATEWAY_ANNOTATION.into(), format!("{}/{}", g.object.namespace, g.object.name));
    if let Some(ip) = g.service.address {
        annotations.insert(ADDRESS_ANNOTATION.into(), ip.to_string());
    }
    let ports: Vec<Value> = g
        .service
        .ports
        .iter()
        .map(|(port, bind)| json!({"name": format!("p{port}"), "port": port, "targetPort": bind, "protocol": "TCP"}))
        .collect();
    let mut spec = json!({"type": kind.type_.name(), "selector": selector, "ports": ports});
    if kind.type_ != GatewayServiceType::ClusterIP {
        if let Some(p) = kind.external_traffic_policy {
            spec["externalTrafficPolicy"] = json!(p);
        }
    }
    if kind.type_ == GatewayServiceType::LoadBalancer {
        if let Some(c) = &kind.load_balancer_class {
            spec["loadBalancerClass"] = json!(c);
        }
    }
    match g.service.address {
        Some(ip) if kind.type_ == GatewayServiceType::LoadBalancer => spec["loadBalancerIP"] = json!(ip.to_string()),
        // An apply that leaves the cluster IP out later keeps it: the API server keeps a
        // Service's allocated cluster IP when an update leaves it empty.
        Some(ip) => {
            spec["clusterIP"] = json!(ip.to_string());
            spec["clusterIPs"] = json!([ip.to_string()]);
        }
        None => {}
    }
    Some(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": g.service.name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": spec,
    }))
}

/// The Service that stands for Gateway `g` in its own namespace: an ExternalName alias of its
/// Service in the fleet's namespace `fleet` (cluster domain `domain`), so the Gateway has a name
/// where it lives. It carries the labels and annotations its Service gets (the keys
/// `spec.render.gateway.infrastructureKeys` allows) and the Gateway's name label, and the
/// Gateway owns it (it goes when the Gateway does). None without a Service or a Gateway UID.
pub fn alias(g: &GatewayOutcome, fleet: &str, domain: &str) -> Option<Value> {
    let uid = g.uid.as_ref()?;
    if g.service.ports.is_empty() {
        return None;
    }
    let mut labels = g.service.labels.clone();
    labels.insert(GATEWAY_NAME_LABEL.into(), g.object.name.clone());
    labels.insert(ALIAS_LABEL.into(), "true".into());
    labels.insert("app.kubernetes.io/managed-by".into(), "haptic".into());
    let mut annotations = g.service.annotations.clone();
    annotations.insert(GATEWAY_ANNOTATION.into(), format!("{}/{}", g.object.namespace, g.object.name));
    let ports: Vec<Value> = g
        .service
        .ports
        .iter()
        .map(|(port, _)| json!({"name": format!("p{port}"), "port": port, "protocol": "TCP"}))
        .collect();
    Some(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": haptic_render::gateway::alias_name(&g.object.name),
            "namespace": g.object.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                                 "name": g.object.name, "uid": uid}],
        },
        "spec": {"type": "ExternalName", "externalName": format!("{}.{fleet}.svc.{domain}", g.service.name), "ports": ports},
    }))
}

/// The cluster's DNS domain from a resolv.conf's search list (the entry after `svc.`), as a
/// pod's resolv.conf has it.
fn domain_from_resolv(resolv: &str) -> Option<String> {
    resolv
        .lines()
        .filter_map(|l| l.trim().strip_prefix("search"))
        .flat_map(str::split_whitespace)
        .find_map(|d| d.strip_prefix("svc.").map(|d| d.trim_end_matches('.').to_string()))
        .filter(|d| !d.is_empty())
}

/// The cluster's DNS domain: from this pod's `/etc/resolv.conf`, else `cluster.local`.
fn cluster_domain() -> &'static str {
    static DOMAIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DOMAIN.get_or_init(|| {
        std::fs::read_to_string("/etc/resolv.conf")
            .ok()
            .and_then(|r| domain_from_resolv(&r))
            .unwrap_or_else(|| "cluster.local".into())
    })
}

/// The GatewayClass's status patch.
pub fn class_status(c: &ClassStatus, old: &[Condition], at: &str) -> Value {
    let mut features: Vec<&str> = c.supported_features.clone();
    features.sort();
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": c.name},
        "status": {
            "conditions": conditions(&c.conditions, old, at),
            "supportedFeatures": features.iter().map(|f| json!({"name": f})).collect::<Vec<_>>(),
        },
    })
}

/// The conditions of a current status (`old`), or none.
fn old_conds(v: Option<&Value>) -> Vec<Condition> {
    v.and_then(|v| v.get("conditions")).and_then(|c| serde_json::from_value(c.clone()).ok()).unwrap_or_default()
}

/// `status.listeners` of a Gateway or ListenerSet, given its current status.
fn listener_entries(listeners: &[ListenerStatus], old: Option<&Value>, at: &str) -> Vec<Value> {
    let old_listener = |name: &str| {
        old.and_then(|o| o.get("listeners"))
            .and_then(Value::as_array)
            .and_then(|ls| ls.iter().find(|l| l.get("name").and_then(Value::as_str) == Some(name)))
    };
    listeners
        .iter()
        .map(|l| {
            json!({
                "name": l.name,
                "supportedKinds": l.supported_kinds,
                "attachedRoutes": l.attached_routes,
                "conditions": conditions(&l.conditions, &old_conds(old_listener(&l.name)), at),
            })
        })
        .collect()
}

/// A ListenerSet's status patch, given its current status.
pub fn listener_set_status(s: &ListenerSetOutcome, old: Option<&Value>, at: &str) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "ListenerSet",
        "metadata": {"name": s.object.name, "namespace": s.object.namespace},
        "status": {
            "conditions": conditions(&s.conditions, &old_conds(old), at),
            "listeners": listener_entries(&s.listeners, old, at),
        },
    })
}

/// A Gateway's status patch, given its current status (`attachedListenerSets` only while some
/// are: a cluster without the ListenerSet API has none, and may not know the field).
pub fn gateway_status(g: &GatewayOutcome, old: Option<&Value>, at: &str) -> Value {
    let listeners = listener_entries(&g.listeners, old, at);
    let addresses: Vec<Value> = g
        .addresses
        .iter()
        .map(|a| {
            let kind = if a.parse::<std::net::IpAddr>().is_ok() { "IPAddress" } else { "Hostname" };
            json!({"type": kind, "value": a})
        })
        .collect();
    let mut patch = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": g.object.name, "namespace": g.object.namespace},
        "status": {
            "addresses": addresses,
            "conditions": conditions(&g.conditions, &old_conds(old), at),
            "listeners": listeners,
        },
    });
    if g.attached_listener_sets > 0 {
        patch["status"]["attachedListenerSets"] = json!(g.attached_listener_sets);
    }
    patch
}

/// An HTTPRoute's `status.parents`: the entries of other controllers as they are, then ours.
pub fn route_parents(r: &RouteOutcome, old: &[Value], at: &str) -> Vec<Value> {
    entries(&r.parents, old, at, "parentRef", 32)
}

/// A BackendTLSPolicy's `status.ancestors`: the entries of other controllers as they are, then
/// ours (one per Gateway).
pub fn policy_ancestors(p: &PolicyOutcome, old: &[Value], at: &str) -> Vec<Value> {
    entries(&p.ancestors, old, at, "ancestorRef", 16)
}

/// Status entries keyed by `key` (`parentRef`, `ancestorRef`): the entries of other
/// controllers as they are, then ours; at most `max`.
fn entries(ours: &[ParentStatus], old: &[Value], at: &str, key: &str, max: usize) -> Vec<Value> {
    let mut out: Vec<Value> = old
        .iter()
        .filter(|p| p.get("controllerName").and_then(Value::as_str) != Some(GATEWAY_CONTROLLER))
        .cloned()
        .collect();
    for p in ours {
        let before: Vec<Condition> = old
            .iter()
            .find(|o| {
                o.get("controllerName").and_then(Value::as_str) == Some(GATEWAY_CONTROLLER)
                    && serde_json::from_value::<haptic_render::gateway_api::ParentReference>(
                        o.get(key).cloned().unwrap_or_default(),
                    )
                    .ok()
                    .as_ref()
                        == Some(&p.parent_ref)
            })
            .and_then(|o| serde_json::from_value(o.get("conditions").cloned().unwrap_or_default()).ok())
            .unwrap_or_default();
        out.push(json!({
            key: p.parent_ref,
            "controllerName": GATEWAY_CONTROLLER,
            "conditions": conditions(&p.conditions, &before, at),
        }));
    }
    out.truncate(max);
    out
}

/// What was written last (the translator's decisions, without times), per object.
#[derive(Debug, Default)]
struct Done {
    services: BTreeMap<String, Value>,
    /// Each alias applied, by (namespace, name).
    aliases: BTreeMap<(String, String), Value>,
    class: Option<ClassStatus>,
    gateways: BTreeMap<ObjectRef, GatewayOutcome>,
    listener_sets: BTreeMap<ObjectRef, ListenerSetOutcome>,
    routes: BTreeMap<ObjectRef, RouteOutcome>,
    policies: BTreeMap<ObjectRef, PolicyOutcome>,
}

/// Writes Gateway Services and statuses while `token` is not cancelled, after each published
/// render. A failed write is retried with the next published render.
pub async fn write_loop(ctx: Context, token: CancellationToken) {
    let mut snaps = ctx.snapshots.clone();
    let mut done = Done::default();
    loop {
        let (outcome, config) = {
            let s = snaps.borrow_and_update();
            (s.gateway.clone(), s.config.clone())
        };
        if let (Some(now), Some(config)) = (outcome, config) {
            let selector = config.spec.pod_selector.match_labels.clone().unwrap_or_default();
            let kind = config.spec.render.as_ref().map(|r| r.gateway.service.clone()).unwrap_or_default();
            write(&ctx, &now, (&selector, &kind), &mut done).await;
        }
        tokio::select! {
            _ = token.cancelled() => return,
            r = snaps.changed() => if r.is_err() { return },
        }
    }
}

async fn write(
    ctx: &Context,
    now: &GatewayOutput,
    (selector, kind): (&BTreeMap<String, String>, &GatewayServiceSpec),
    done: &mut Done,
) {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let at = now_string();
    // Services first: their addresses become the Gateways' addresses on the next render.
    write_services(ctx, now, (selector, kind), &params, done).await;
    write_classes(ctx, now, &params, &at, done).await;
    write_gateways(ctx, now, &params, &at, done).await;
    write_listener_sets(ctx, now, &params, &at, done).await;
    write_routes(ctx, now, &at, done).await;
    write_policies(ctx, now, &at, done).await;
}

/// Applies each Gateway's Service that changed, and deletes the Services of Gateways that are
/// gone.
async fn write_services(
    ctx: &Context,
    now: &GatewayOutput,
    (selector, kind): (&BTreeMap<String, String>, &GatewayServiceSpec),
    params: &PatchParams,
    done: &mut Done,
) {
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let mut wanted = BTreeSet::new();
    for g in &now.gateways {
        let Some(svc) = service(g, &ctx.namespace, selector, kind) else { continue };
        wanted.insert(g.service.name.clone());
        if done.services.get(&g.service.name) == Some(&svc) {
            continue;
        }
        if let Some(ip) = g.service.address.filter(|_| kind.type_ != GatewayServiceType::LoadBalancer) {
            if !carry_address(&services, &svc, ip, &g.object).await {
                continue;
            }
        }
        match services.patch(&g.service.name, params, &Patch::Apply(&svc)).await {
            Ok(_) => {
                done.services.insert(g.service.name.clone(), svc);
            }
            Err(e) => warn!("cannot apply Service {} for {}: {e}", g.service.name, g.object),
        }
    }
    for g in &now.gateways {
        write_alias(ctx, g, params, done).await;
    }
    match services.list(&ListParams::default().labels(&format!("{SERVICE_LABEL}=true"))).await {
        Ok(list) => {
            for s in list.items {
                let name = s.metadata.name.clone().unwrap_or_default();
                if !wanted.contains(&name) {
                    if let Err(e) = services.delete(&name, &DeleteParams::default()).await {
                        warn!("cannot delete the Service {name} of a Gateway that is gone: {e}");
                    }
                    done.services.remove(&name);
                }
            }
        }
        Err(e) => warn!("cannot list the Gateways' Services: {e}"),
    }
}

/// Applies Gateway `g`'s alias in its namespace when it changed, never over a Service that is
/// not that Gateway's alias (a tenant's own Service of the same name is left alone).
async fn write_alias(ctx: &Context, g: &GatewayOutcome, params: &PatchParams, done: &mut Done) {
    let Some(a) = alias(g, &ctx.namespace, cluster_domain()) else { return };
    let name = a["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let key = (g.object.namespace.clone(), name.clone());
    if done.aliases.get(&key) == Some(&a) {
        return;
    }
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &g.object.namespace);
    let ours = |s: &Service| {
        let labelled = s.metadata.labels.as_ref().and_then(|l| l.get(ALIAS_LABEL)).is_some_and(|v| v == "true");
        let owned = s.metadata.owner_references.iter().flatten().any(|o| Some(&o.uid) == g.uid.as_ref());
        labelled && owned
    };
    match api.get_opt(&name).await {
        Ok(Some(s)) if !ours(&s) => {
            warn!("Service {}/{name} is not the alias of {}: left alone, the Gateway gets no alias", key.0, g.object);
            return;
        }
        Ok(_) => {}
        Err(e) => {
            warn!("cannot read Service {}/{name} (alias of {}): {e}", key.0, g.object);
            return;
        }
    }
    match api.patch(&name, params, &Patch::Apply(&a)).await {
        Ok(_) => {
            done.aliases.insert(key, a);
        }
        Err(e) => warn!("cannot apply Service {}/{name}, the alias of {}: {e}", key.0, g.object),
    }
}

/// Makes room for the Service `svc` to carry the cluster IP `ip` its apply asks for (a
/// cluster IP never changes in place): when it exists with another one, and the API server
/// accepts `ip` for a Service (a dry-run create first, so a Service is never deleted for an
/// address it cannot get), it is deleted, for the apply to create it again. False when the
/// apply must not run, as the Service cannot carry `ip`.
async fn carry_address(services: &Api<Service>, svc: &Value, ip: std::net::IpAddr, gateway: &ObjectRef) -> bool {
    let name = svc["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let current = match services.get_opt(&name).await {
        Ok(Some(e)) => e.spec.and_then(|s| s.cluster_ip),
        Ok(None) => return true,
        Err(e) => {
            warn!("cannot read Service {name} of {gateway}: {e}");
            return false;
        }
    };
    if current.as_deref() == Some(ip.to_string().as_str()) {
        return true;
    }
    let Ok(mut probe) = serde_json::from_value::<Service>(svc.clone()) else { return false };
    probe.metadata.name = None;
    probe.metadata.generate_name = Some("haptic-address-check-".into());
    let dry = PostParams { dry_run: true, field_manager: Some(FIELD_MANAGER.into()) };
    if let Err(e) = services.create(&dry, &probe).await {
        warn!("{gateway} asks for address {ip}, which its Service {name} cannot carry: {e}");
        return false;
    }
    info!("recreating Service {name} of {gateway} with the static address {ip} (a cluster IP never changes in place)");
    if let Err(e) = services.delete(&name, &DeleteParams::default()).await {
        warn!("cannot delete Service {name} of {gateway} to give it address {ip}: {e}");
        return false;
    }
    true
}

/// Writes the status of every GatewayClass left unserved (each time), and of the served one
/// when it changed.
async fn write_classes(ctx: &Context, now: &GatewayOutput, params: &PatchParams, at: &str, done: &mut Done) {
    for c in &now.unserved {
        let api: Api<GatewayClass> = Api::all(ctx.client.clone());
        let old = api.get_status(&c.name).await.ok().and_then(|o| o.status).map(|s| s.conditions).unwrap_or_default();
        let mut patch = class_status(c, &old, at);
        patch["status"].as_object_mut().map(|o| o.remove("supportedFeatures"));
        if let Err(e) = api.patch_status(&c.name, params, &Patch::Apply(&patch)).await {
            warn!("cannot write the status of GatewayClass {}: {e}", c.name);
        }
    }
    if let Some(c) = &now.class {
        if done.class.as_ref() != Some(c) {
            let api: Api<GatewayClass> = Api::all(ctx.client.clone());
            let old =
                api.get_status(&c.name).await.ok().and_then(|o| o.status).map(|s| s.conditions).unwrap_or_default();
            match api.patch_status(&c.name, params, &Patch::Apply(&class_status(c, &old, at))).await {
                Ok(_) => done.class = Some(c.clone()),
                Err(e) => warn!("cannot write the status of GatewayClass {}: {e}", c.name),
            }
        }
    }
}

/// Writes the status of every Gateway whose outcome changed.
async fn write_gateways(ctx: &Context, now: &GatewayOutput, params: &PatchParams, at: &str, done: &mut Done) {
    let resource = ApiResource::erase::<Gateway>(&());
    for g in &now.gateways {
        if done.gateways.get(&g.object) == Some(g) {
            continue;
        }
        if apply_status(ctx, &resource, &g.object, params, |old| gateway_status(g, old, at)).await {
            done.gateways.insert(g.object.clone(), g.clone());
        }
    }
}

/// Reads the current status of `object` (of `resource`) and applies the status patch `patch`
/// makes of it; false (logged) when either fails.
async fn apply_status(
    ctx: &Context,
    resource: &ApiResource,
    object: &ObjectRef,
    params: &PatchParams,
    patch: impl FnOnce(Option<&Value>) -> Value,
) -> bool {
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &object.namespace, resource);
    let old = match api.get_status(&object.name).await {
        Ok(o) => o.data.get("status").cloned(),
        Err(e) => {
            warn!("cannot read {object}: {e}");
            return false;
        }
    };
    match api.patch_status(&object.name, params, &Patch::Apply(&patch(old.as_ref()))).await {
        Ok(_) => true,
        Err(e) => {
            warn!("cannot write the status of {object}: {e}");
            false
        }
    }
}

/// Writes the status of every ListenerSet whose outcome changed; one no longer attached to a
/// Gateway of the class loses what we wrote.
async fn write_listener_sets(ctx: &Context, now: &GatewayOutput, params: &PatchParams, at: &str, done: &mut Done) {
    let current: BTreeSet<&ObjectRef> = now.listener_sets.iter().map(|s| &s.object).collect();
    let gone: Vec<ObjectRef> = done.listener_sets.keys().filter(|o| !current.contains(o)).cloned().collect();
    let resource = ApiResource::erase::<ListenerSet>(&());
    for o in gone {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &o.namespace, &resource);
        let patch = json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "ListenerSet",
            "metadata": {"name": o.name, "namespace": o.namespace},
            "status": {},
        });
        match api.patch_status(&o.name, params, &Patch::Apply(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                warn!("cannot clear the status of {o}: {e}");
                continue;
            }
        }
        done.listener_sets.remove(&o);
    }
    for s in &now.listener_sets {
        if done.listener_sets.get(&s.object) == Some(s) {
            continue;
        }
        if apply_status(ctx, &resource, &s.object, params, |old| listener_set_status(s, old, at)).await {
            done.listener_sets.insert(s.object.clone(), s.clone());
        }
    }
}

/// The API of the routes of kind `kind` in `namespace` (`None` for a kind no listener takes).
fn route_api(ctx: &Context, kind: &str, namespace: &str) -> Option<Api<DynamicObject>> {
    let resource = match RouteKind::of(kind)? {
        RouteKind::Http => ApiResource::erase::<HttpRoute>(&()),
        RouteKind::Grpc => ApiResource::erase::<GrpcRoute>(&()),
        RouteKind::Tls => ApiResource::erase::<TlsRoute>(&()),
        RouteKind::Tcp => ApiResource::erase::<TcpRoute>(&()),
    };
    Some(Api::namespaced_with(ctx.client.clone(), namespace, &resource))
}

/// Writes our `status.parents[]` entries of every route whose outcome changed; routes that no
/// longer have a parent of ours lose our entries.
async fn write_routes(ctx: &Context, now: &GatewayOutput, at: &str, done: &mut Done) {
    use futures::StreamExt as _;
    let current: BTreeSet<&ObjectRef> = now.routes.iter().map(|r| &r.object).collect();
    let gone: Vec<ObjectRef> = done.routes.keys().filter(|o| !current.contains(o)).cloned().collect();
    let empty: Vec<RouteOutcome> =
        gone.iter().map(|o| RouteOutcome { object: o.clone(), uid: None, parents: vec![] }).collect();
    let mut writes = Vec::new();
    for r in now.routes.iter().chain(empty.iter()) {
        if done.routes.get(&r.object) != Some(r) {
            writes.push(async move { (r, write_route(ctx, r, at).await) });
        }
    }
    // Each write is a read and a patch: many routes at once (a burst of new routes) are
    // written several at a time, not one round trip after another.
    let wrote: Vec<(&RouteOutcome, Wrote)> =
        futures::stream::iter(writes).buffer_unordered(STATUS_WRITES_IN_FLIGHT).collect().await;
    for (r, w) in wrote {
        match w {
            Wrote::Written if r.parents.is_empty() => {
                done.routes.remove(&r.object);
            }
            Wrote::Written => {
                done.routes.insert(r.object.clone(), r.clone());
            }
            Wrote::Gone => {
                done.routes.remove(&r.object);
            }
            Wrote::Failed => {}
        }
    }
}

/// Status writes in flight at once.
const STATUS_WRITES_IN_FLIGHT: usize = 16;

/// What became of one status write.
enum Wrote {
    Written,
    /// The object is gone.
    Gone,
    /// Not written (logged); tried again with the next render.
    Failed,
}

/// Writes route `r`'s `status.parents`: ours replaced, other controllers' kept.
async fn write_route(ctx: &Context, r: &RouteOutcome, at: &str) -> Wrote {
    let Some(api) = route_api(ctx, &r.object.kind, &r.object.namespace) else { return Wrote::Failed };
    let old: Vec<Value> = match api.get_status(&r.object.name).await {
        Ok(o) => o.data.get("status").and_then(|s| s.get("parents")).and_then(Value::as_array).cloned(),
        Err(kube::Error::Api(e)) if e.code == 404 => return Wrote::Gone,
        Err(e) => {
            warn!("cannot read {}: {e}", r.object);
            return Wrote::Failed;
        }
    }
    .unwrap_or_default();
    let patch = json!({"status": {"parents": route_parents(r, &old, at)}});
    match api.patch_status(&r.object.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Wrote::Written,
        Err(e) => {
            warn!("cannot write the status of {}: {e}", r.object);
            Wrote::Failed
        }
    }
}

/// Writes our `status.ancestors[]` entries of every BackendTLSPolicy whose outcome changed;
/// policies that are gone from the render lose our entries.
async fn write_policies(ctx: &Context, now: &GatewayOutput, at: &str, done: &mut Done) {
    let current: BTreeSet<&ObjectRef> = now.policies.iter().map(|p| &p.object).collect();
    let gone: Vec<PolicyOutcome> = done
        .policies
        .keys()
        .filter(|o| !current.contains(o))
        .map(|o| PolicyOutcome { object: o.clone(), uid: None, ancestors: vec![] })
        .collect();
    let resource = ApiResource::erase::<BackendTlsPolicy>(&());
    for p in now.policies.iter().chain(gone.iter()) {
        if done.policies.get(&p.object) == Some(p) || (p.ancestors.is_empty() && !done.policies.contains_key(&p.object))
        {
            continue;
        }
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &p.object.namespace, &resource);
        let old: Vec<Value> = match api.get_status(&p.object.name).await {
            Ok(o) => o.data.get("status").and_then(|s| s.get("ancestors")).and_then(Value::as_array).cloned(),
            Err(kube::Error::Api(e)) if e.code == 404 => {
                done.policies.remove(&p.object);
                continue;
            }
            Err(e) => {
                warn!("cannot read {}: {e}", p.object);
                continue;
            }
        }
        .unwrap_or_default();
        let patch = json!({"status": {"ancestors": policy_ancestors(p, &old, at)}});
        match api.patch_status(&p.object.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) if p.ancestors.is_empty() => {
                done.policies.remove(&p.object);
            }
            Ok(_) => {
                done.policies.insert(p.object.clone(), p.clone());
            }
            Err(e) => warn!("cannot write the status of {}: {e}", p.object),
        }
    }
}

fn now_string() -> String {
    now()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::crd::TrafficPolicy;

    fn cond(type_: &'static str, status: bool) -> Cond {
        Cond { type_, status, reason: "Accepted", message: "m".into(), observed_generation: 2 }
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_stays() {
        let old: Vec<Condition> = serde_json::from_value(json!([
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Programmed", "status": "True", "reason": "Programmed", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]))
        .unwrap();
        let c = conditions(&[cond("Accepted", true), cond("Programmed", false)], &old, "2026-06-01T00:00:00Z");
        assert_eq!(c[0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(c[1]["lastTransitionTime"], "2026-06-01T00:00:00Z");
        assert_eq!(c[1]["status"], "False");
        assert_eq!(c[0]["observedGeneration"], 2);
    }

    #[test]
    fn route_parents_keep_other_controllers_entries() {
        let old = vec![
            json!({"parentRef": {"name": "theirs"}, "controllerName": "example.com/other", "conditions": []}),
            json!({"parentRef": {"name": "gone"}, "controllerName": GATEWAY_CONTROLLER, "conditions": []}),
        ];
        let r = RouteOutcome {
            object: ObjectRef { kind: "HTTPRoute".into(), namespace: "a".into(), name: "r".into() },
            uid: None,
            parents: vec![haptic_render::gateway::ParentStatus {
                parent_ref: haptic_render::gateway_api::ParentReference { name: "gw".into(), ..Default::default() },
                conditions: vec![cond("Accepted", true)],
            }],
        };
        let p = route_parents(&r, &old, "2026-06-01T00:00:00Z");
        assert_eq!(p.len(), 2);
        assert_eq!(p[0]["controllerName"], "example.com/other");
        assert_eq!(p[1]["parentRef"]["name"], "gw");
        assert_eq!(p[1]["controllerName"], GATEWAY_CONTROLLER);
    }

    #[test]
    fn policy_ancestors_are_keyed_by_ancestor_ref_and_keep_other_controllers_entries() {
        let gw = haptic_render::gateway_api::ParentReference {
            group: Some("gateway.networking.k8s.io".into()),
            kind: Some("Gateway".into()),
            namespace: Some("a".into()),
            name: "gw".into(),
            ..Default::default()
        };
        let old = vec![
            json!({"ancestorRef": {"name": "theirs"}, "controllerName": "example.com/other", "conditions": []}),
            json!({"ancestorRef": gw, "controllerName": GATEWAY_CONTROLLER, "conditions": [
                {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ]}),
        ];
        let p = PolicyOutcome {
            object: ObjectRef { kind: "BackendTLSPolicy".into(), namespace: "a".into(), name: "p".into() },
            uid: None,
            ancestors: vec![ParentStatus { parent_ref: gw, conditions: vec![cond("Accepted", true)] }],
        };
        let a = policy_ancestors(&p, &old, "2026-06-01T00:00:00Z");
        assert_eq!(a.len(), 2);
        assert_eq!(a[0]["controllerName"], "example.com/other");
        assert_eq!(a[1]["ancestorRef"]["kind"], "Gateway");
        assert_eq!(a[1].get("parentRef"), None);
        assert_eq!(a[1]["conditions"][0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
    }

    #[test]
    fn the_service_selects_the_fleet_and_maps_listener_ports() {
        let g = GatewayOutcome {
            object: ObjectRef { kind: "Gateway".into(), namespace: "a".into(), name: "gw".into() },
            uid: None,
            conditions: vec![],
            listeners: vec![],
            attached_listener_sets: 0,
            addresses: vec![],
            service: haptic_render::gateway::GatewayService {
                address: None,
                name: "gw-a-gw-0123456789".into(),
                ports: vec![(80, 20000), (443, 20001)],
                labels: BTreeMap::from([("team".to_string(), "blue".to_string())]),
                annotations: BTreeMap::new(),
            },
        };
        let sel = BTreeMap::from([("app".to_string(), "haproxy".to_string())]);
        let s = service(&g, "fleet", &sel, &GatewayServiceSpec::default()).unwrap();
        assert_eq!(s["spec"]["type"], "ClusterIP");
        assert_eq!(s["spec"].get("externalTrafficPolicy"), None);
        assert_eq!(s["spec"]["selector"]["app"], "haproxy");
        assert_eq!(s["spec"]["ports"][1]["port"], 443);
        assert_eq!(s["spec"]["ports"][1]["targetPort"], 20001);
        assert_eq!(s["metadata"]["labels"]["team"], "blue");
        assert_eq!(s["metadata"]["labels"][SERVICE_LABEL], "true");
        assert_eq!(s["metadata"]["annotations"][GATEWAY_ANNOTATION], "a/gw");
        let lb = GatewayServiceSpec {
            type_: GatewayServiceType::LoadBalancer,
            external_traffic_policy: Some(TrafficPolicy::Local),
            load_balancer_class: Some("example.com/lb".into()),
            annotations: BTreeMap::from([("lb.example.com/scheme".to_string(), "internet-facing".to_string())]),
        };
        let s = service(&g, "fleet", &sel, &lb).unwrap();
        assert_eq!(s["spec"]["type"], "LoadBalancer");
        assert_eq!(s["spec"]["externalTrafficPolicy"], "Local");
        assert_eq!(s["spec"]["loadBalancerClass"], "example.com/lb");
        assert_eq!(s["metadata"]["annotations"]["lb.example.com/scheme"], "internet-facing");
        assert_eq!(s["metadata"]["annotations"][GATEWAY_ANNOTATION], "a/gw");
        assert_eq!(s["spec"].get("loadBalancerIP"), None);
        assert_eq!(s["spec"].get("clusterIP"), None, "no address asked: the API server assigns one");

        let mut fixed = g.clone();
        fixed.service.address = Some("10.96.0.200".parse().unwrap());
        let s = service(&fixed, "fleet", &sel, &lb).unwrap();
        assert_eq!(s["spec"]["loadBalancerIP"], "10.96.0.200");
        assert_eq!(s["spec"].get("clusterIP"), None, "a LoadBalancer's cluster IP is not the Gateway's");
        let s = service(&fixed, "fleet", &sel, &GatewayServiceSpec::default()).unwrap();
        assert_eq!(s["spec"]["clusterIP"], "10.96.0.200");
        assert_eq!(s["spec"]["clusterIPs"], json!(["10.96.0.200"]));
        assert_eq!(s["metadata"]["annotations"][ADDRESS_ANNOTATION], "10.96.0.200");

        assert_eq!(alias(&g, "fleet", "cluster.local"), None, "no owner to delete it with");
        let mut owned = g.clone();
        owned.uid = Some("u-1".into());
        let a = alias(&owned, "fleet", "cluster.local").unwrap();
        assert_eq!(a["metadata"]["namespace"], "a");
        assert_eq!(a["metadata"]["name"], "gw-gateway");
        assert_eq!(a["metadata"]["labels"]["gateway.networking.k8s.io/gateway-name"], "gw");
        assert_eq!(a["metadata"]["labels"]["team"], "blue");
        assert_eq!(a["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(a["spec"]["externalName"], "gw-a-gw-0123456789.fleet.svc.cluster.local");
    }

    #[test]
    fn the_cluster_domain_comes_from_the_search_list() {
        let r = "nameserver 10.0.0.10\nsearch haptic.svc.example.corp svc.example.corp example.corp\noptions ndots:5\n";
        assert_eq!(domain_from_resolv(r).as_deref(), Some("example.corp"));
        assert_eq!(domain_from_resolv("nameserver 1.1.1.1\nsearch lan\n"), None);
    }

    #[test]
    fn listener_sets_get_their_status_and_gateways_count_them_only_when_some_attach() {
        let listener = ListenerStatus {
            name: "extra".into(),
            supported_kinds: vec![],
            attached_routes: 2,
            conditions: vec![cond("Programmed", true)],
        };
        let s = ListenerSetOutcome {
            object: ObjectRef { kind: "ListenerSet".into(), namespace: "t".into(), name: "ls".into() },
            uid: None,
            conditions: vec![cond("Accepted", true)],
            listeners: vec![listener],
        };
        let old = json!({"conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]});
        let p = listener_set_status(&s, Some(&old), "2026-06-01T00:00:00Z");
        assert_eq!(p["kind"], "ListenerSet");
        assert_eq!(p["metadata"]["namespace"], "t");
        assert_eq!(p["status"]["conditions"][0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(p["status"]["listeners"][0]["attachedRoutes"], 2);
        let mut g = GatewayOutcome {
            object: ObjectRef { kind: "Gateway".into(), namespace: "a".into(), name: "gw".into() },
            uid: None,
            conditions: vec![],
            listeners: vec![],
            attached_listener_sets: 0,
            addresses: vec![],
            service: haptic_render::gateway::GatewayService {
                address: None,
                name: "gw".into(),
                ports: vec![],
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
            },
        };
        assert_eq!(gateway_status(&g, None, "t")["status"].get("attachedListenerSets"), None);
        g.attached_listener_sets = 2;
        assert_eq!(gateway_status(&g, None, "t")["status"]["attachedListenerSets"], 2);
    }
}
