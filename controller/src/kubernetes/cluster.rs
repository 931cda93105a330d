//! The reflectors of render mode: IngressClasses, Ingresses, Services and EndpointSlices of
//! every namespace in [`Scope`] (or, serving a GatewayClass, GatewayClasses, Gateways,
//! HTTPRoutes, ListenerSets, GRPCRoutes, TLSRoutes, TCPRoutes and BackendTLSPolicies where the cluster serves
//! them, ReferenceGrants and Namespaces instead of the Ingress kinds), and exactly the TLS
//! Secrets that served Ingresses or listeners name and the ConfigMaps BackendTLSPolicies name
//! (one watch per object, by name in its namespace).
//!
//! Owns starting them (only while the resource has `spec.render`, so a controller without it
//! needs no cluster-wide permission; one watch per namespace and kind when the scope lists
//! namespaces, so none lists a namespaced kind cluster-wide), whether their first lists have
//! arrived, and the [`Objects`] view of their stores. It must never render or decide anything:
//! [`super::routes`] does. Every reflector backs off on errors and drops managed fields.

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use haptic_render::gateway_api::{
    BackendTlsPolicy, Gateway, GatewayClass, GrpcRoute, HttpRoute, ListenerSet, ReferenceGrant, TcpRoute, TlsRoute,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::routes::Objects;
use super::scope::Scope;
use super::settle::Change;
use super::watch::{ready, watch_into, watch_specs_into, Changes, Named};

/// The reflectors, stopped when dropped.
pub struct ClusterWatch {
    client: Client,
    scope: Scope,
    classes: Option<Store<IngressClass>>,
    ingresses: Option<Stores<Ingress>>,
    gateway: Option<GatewayStores>,
    services: Stores<Service>,
    slices: Stores<EndpointSlice>,
    /// Keyed `namespace/name`.
    secrets: Named<Secret>,
    /// The ConfigMaps BackendTLSPolicies name, keyed `namespace/name`.
    config_maps: Named<ConfigMap>,
    stop: CancellationToken,
}

/// The Gateway API reflectors.
struct GatewayStores {
    classes: Store<GatewayClass>,
    gateways: Stores<Gateway>,
    routes: Stores<HttpRoute>,
    listener_sets: IfServed<ListenerSet>,
    grpc_routes: IfServed<GrpcRoute>,
    tls_routes: IfServed<TlsRoute>,
    tcp_routes: IfServed<TcpRoute>,
    backend_tls_policies: IfServed<BackendTlsPolicy>,
    grants: Stores<ReferenceGrant>,
    namespaces: Store<Namespace>,
}

impl std::fmt::Debug for ClusterWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterWatch").field("secrets", &self.secrets).finish()
    }
}

impl Drop for ClusterWatch {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A namespaced kind a reflector can watch.
trait Namespaced:
    kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Namespaced for K where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// The stores of one namespaced kind: one watch of every namespace, or one per namespace of
/// the [`Scope`].
struct Stores<K: kube::Resource + 'static>(Vec<Store<K>>)
where
    K::DynamicType: std::hash::Hash + Eq;

impl<K: kube::Resource + Clone + 'static> Stores<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn state(&self) -> Vec<Arc<K>> {
        self.0.iter().flat_map(Store::state).collect()
    }

    fn ready(&self) -> bool {
        self.0.iter().all(ready)
    }
}

/// The APIs of a namespaced kind the scope reads, each with what logs call its watch.
fn apis<K>(client: &Client, scope: &Scope) -> Vec<(Api<K>, String)>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    match scope {
        Scope::All => vec![(Api::all(client.clone()), format!("{kind} (all namespaces)"))],
        Scope::Only(ns) => {
            ns.iter().map(|n| (Api::namespaced(client.clone(), n), format!("{kind} (namespace {n})"))).collect()
        }
    }
}

/// Every `K` of a cluster-scoped kind.
fn cluster_wide<K>(client: &Client, kind: Change, changes: &Changes, stop: &CancellationToken) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let what = K::kind(&K::DynamicType::default()).into_owned();
    watch_into(Api::all(client.clone()), watcher::Config::default(), what, kind, changes.clone(), stop.clone())
}

/// Every `K` (namespaced) the scope reads.
fn in_scope<K>(client: &Client, scope: &Scope, kind: Change, changes: &Changes, stop: &CancellationToken) -> Stores<K>
where
    K: Namespaced,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let watch = |(api, what)| watch_into(api, watcher::Config::default(), what, kind, changes.clone(), stop.clone());
    Stores(apis(client, scope).into_iter().map(watch).collect())
}

/// [`in_scope`] for a kind whose status haptic writes and the render never reads: an event that
/// changed only an object's status is not a change ([`watch_specs_into`]).
fn specs<K>(client: &Client, scope: &Scope, changes: &Changes, stop: &CancellationToken) -> Stores<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let watch = |(api, what)| {
        watch_specs_into(api, watcher::Config::default(), what, Change::Cluster, changes.clone(), stop.clone())
    };
    Stores(apis(client, scope).into_iter().map(watch).collect())
}

/// The store of a kind the cluster may not serve (a CRD not installed): unset until discovery
/// answers, then the store, or `None` when the API does not serve the kind (none are read).
type IfServed<K> = Arc<OnceLock<Option<Stores<K>>>>;

/// How long to wait before asking discovery again after it failed.
const DISCOVERY_RETRY: Duration = Duration::from_secs(2);

/// Watches every `K` once discovery says the cluster serves it (each a kind whose status haptic
/// writes: [`specs`]); a change is sent on `changes` when that is known either way.
fn if_served<K>(client: &Client, scope: &Scope, changes: &Changes, stop: &CancellationToken) -> IfServed<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let slot: IfServed<K> = Arc::default();
    let (out, client, changes, stop) = (slot.clone(), client.clone(), changes.clone(), stop.clone());
    let scope = scope.clone();
    tokio::spawn(async move {
        let dt = K::DynamicType::default();
        let (gv, plural, kind) = (K::api_version(&dt).into_owned(), K::plural(&dt).into_owned(), K::kind(&dt));
        let served = loop {
            match client.list_api_group_resources(&gv).await {
                Ok(list) => break list.resources.iter().any(|r| r.name == plural),
                Err(kube::Error::Api(e)) if e.code == 404 => break false,
                Err(e) => warn!("cannot tell whether the cluster serves {kind}: {e}; asking again"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(DISCOVERY_RETRY) => {}
            }
        };
        if !served {
            info!("the cluster does not serve {kind} ({gv}): none are read");
        }
        let _ = out.set(served.then(|| specs::<K>(&client, &scope, &changes, &stop)));
        let _ = changes.unbounded_send(Change::Objects);
    });
    slot
}

impl ClusterWatch {
    /// Starts the reflectors of `scope` (the Gateway API ones when `gateway`, else the
    /// Ingress ones); each event is sent on `changes` (an EndpointSlice's as
    /// [`Change::Endpoints`], every other one as [`Change::Cluster`]).
    pub fn start(client: &Client, changes: &Changes, parent: &CancellationToken, gateway: bool, scope: Scope) -> Self {
        let stop = parent.child_token();
        info!("render mode reads {}", scope.describe());
        let sc = &scope;
        let gw = gateway.then(|| GatewayStores {
            classes: cluster_wide(client, Change::Cluster, changes, &stop),
            gateways: specs(client, sc, changes, &stop),
            routes: specs(client, sc, changes, &stop),
            listener_sets: if_served(client, sc, changes, &stop),
            grpc_routes: if_served(client, sc, changes, &stop),
            tls_routes: if_served(client, sc, changes, &stop),
            tcp_routes: if_served(client, sc, changes, &stop),
            backend_tls_policies: if_served(client, sc, changes, &stop),
            grants: in_scope(client, sc, Change::Cluster, changes, &stop),
            namespaces: cluster_wide(client, Change::Cluster, changes, &stop),
        });
        ClusterWatch {
            client: client.clone(),
            classes: (!gateway).then(|| cluster_wide(client, Change::Cluster, changes, &stop)),
            ingresses: (!gateway).then(|| specs(client, sc, changes, &stop)),
            gateway: gw,
            services: in_scope(client, sc, Change::Cluster, changes, &stop),
            slices: in_scope(client, sc, Change::Endpoints, changes, &stop),
            secrets: Named::default(),
            config_maps: Named::default(),
            stop,
            scope,
        }
    }

    /// Whether every first list has arrived.
    pub fn ready(&self) -> bool {
        let gw = self.gateway.as_ref().is_none_or(|g| {
            let grpc = g.grpc_routes.get().is_some_and(|s| s.as_ref().is_none_or(Stores::ready));
            let tls = g.tls_routes.get().is_some_and(|s| s.as_ref().is_none_or(Stores::ready));
            let tcp = g.tcp_routes.get().is_some_and(|s| s.as_ref().is_none_or(Stores::ready));
            let btls = g.backend_tls_policies.get().is_some_and(|s| s.as_ref().is_none_or(Stores::ready));
            let sets = g.listener_sets.get().is_some_and(|s| s.as_ref().is_none_or(Stores::ready));
            ready(&g.classes)
                && g.gateways.ready()
                && g.routes.ready()
                && grpc
                && tls
                && tcp
                && btls
                && sets
                && g.grants.ready()
                && ready(&g.namespaces)
        });
        self.classes.as_ref().is_none_or(ready)
            && self.ingresses.as_ref().is_none_or(Stores::ready)
            && gw
            && self.services.ready()
            && self.slices.ready()
    }

    /// The namespaces it reads.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Whether this watch serves a GatewayClass.
    pub fn is_gateway(&self) -> bool {
        self.gateway.is_some()
    }

    /// The objects, without Secrets.
    pub fn objects(&self) -> Objects {
        let g = self.gateway.as_ref();
        Objects {
            classes: self.classes.as_ref().map(Store::state).unwrap_or_default(),
            ingresses: self.ingresses.as_ref().map(Stores::state).unwrap_or_default(),
            services: self.services.state(),
            endpoint_slices: self.slices.state(),
            secrets: Vec::new(),
            gateway_classes: g.map(|g| g.classes.state()).unwrap_or_default(),
            gateways: g.map(|g| g.gateways.state()).unwrap_or_default(),
            routes: g.map(|g| g.routes.state()).unwrap_or_default(),
            listener_sets: g.and_then(|g| g.listener_sets.get()?.as_ref().map(Stores::state)).unwrap_or_default(),
            grpc_routes: g.and_then(|g| g.grpc_routes.get()?.as_ref().map(Stores::state)).unwrap_or_default(),
            tls_routes: g.and_then(|g| g.tls_routes.get()?.as_ref().map(Stores::state)).unwrap_or_default(),
            tcp_routes: g.and_then(|g| g.tcp_routes.get()?.as_ref().map(Stores::state)).unwrap_or_default(),
            backend_tls_policies: g
                .and_then(|g| g.backend_tls_policies.get()?.as_ref().map(Stores::state))
                .unwrap_or_default(),
            config_maps: Vec::new(),
            grants: g.map(|g| g.grants.state()).unwrap_or_default(),
            namespaces: g.map(|g| g.namespaces.state()).unwrap_or_default(),
        }
    }

    /// Watches exactly the Secrets `refs` (namespace, name) the scope admits and stops the
    /// others; returns those that exist once every watch has its first list, `None` before.
    pub fn secrets(&self, refs: &BTreeSet<(String, String)>, changes: &Changes) -> Option<Vec<std::sync::Arc<Secret>>> {
        exactly(&self.client, &self.secrets, &self.scope.admitted(refs), changes, &self.stop)
    }

    /// Watches exactly the ConfigMaps `refs` (namespace, name) the scope admits and stops the
    /// others; returns those that exist once every watch has its first list, `None` before.
    pub fn config_maps(
        &self,
        refs: &BTreeSet<(String, String)>,
        changes: &Changes,
    ) -> Option<Vec<std::sync::Arc<ConfigMap>>> {
        exactly(&self.client, &self.config_maps, &self.scope.admitted(refs), changes, &self.stop)
    }
}

/// Watches exactly the objects `refs` (namespace, name) of `named` and stops the others;
/// returns those that exist once every watch has its first list, `None` before.
fn exactly<K>(
    client: &Client,
    named: &Named<K>,
    refs: &BTreeSet<(String, String)>,
    changes: &Changes,
    stop: &CancellationToken,
) -> Option<Vec<std::sync::Arc<K>>>
where
    K: Namespaced,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let key = |ns: &str, name: &str| format!("{ns}/{name}");
    let keys: BTreeSet<String> = refs.iter().map(|(ns, n)| key(ns, n)).collect();
    named.retain(&keys);
    named.ensure_each(
        refs.iter().map(|(ns, n)| (key(ns, n), Api::namespaced(client.clone(), ns), n.clone())),
        changes,
        stop,
    );
    if !named.ready(&keys) {
        return None;
    }
    Some(refs.iter().filter_map(|(ns, n)| named.get_keyed(&key(ns, n), ns, n)).collect())
}
