//! The cluster-wide reflectors of render mode: IngressClasses, Ingresses, Services and
//! EndpointSlices of every namespace, and exactly the TLS Secrets that served Ingresses name
//! (one watch per Secret, by name in its namespace).
//!
//! Owns starting them (only while the resource has `spec.render`, so a controller without it
//! needs no cluster-wide permission), whether their first lists have arrived, and the
//! [`Objects`] view of their stores. It must never render or decide anything: [`super::routes`]
//! does. Every reflector backs off on errors and drops managed fields.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::render::{ready, watch_into, Named};
use super::routes::Objects;

/// The reflectors, stopped when dropped.
pub struct ClusterWatch {
    client: Client,
    classes: Store<IngressClass>,
    ingresses: Store<Ingress>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    /// Keyed `namespace/name`.
    secrets: Named<Secret>,
    stop: CancellationToken,
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

fn all<K>(client: &Client, changes: &futures::channel::mpsc::UnboundedSender<()>, stop: &CancellationToken) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let what = format!("{} (all namespaces)", K::kind(&K::DynamicType::default()));
    watch_into(Api::all(client.clone()), watcher::Config::default(), what, changes.clone(), stop.clone())
}

impl ClusterWatch {
    /// Starts the four cluster-wide reflectors; each event is sent on `changes`.
    pub fn start(
        client: &Client,
        changes: &futures::channel::mpsc::UnboundedSender<()>,
        parent: &CancellationToken,
    ) -> Self {
        let stop = parent.child_token();
        ClusterWatch {
            client: client.clone(),
            classes: all(client, changes, &stop),
            ingresses: all(client, changes, &stop),
            services: all(client, changes, &stop),
            slices: all(client, changes, &stop),
            secrets: Named::default(),
            stop,
        }
    }

    /// Whether the four first lists have arrived.
    pub fn ready(&self) -> bool {
        ready(&self.classes) && ready(&self.ingresses) && ready(&self.services) && ready(&self.slices)
    }

    /// The objects, without Secrets.
    pub fn objects(&self) -> Objects {
        Objects {
            classes: self.classes.state(),
            ingresses: self.ingresses.state(),
            services: self.services.state(),
            endpoint_slices: self.slices.state(),
            secrets: Vec::new(),
        }
    }

    /// Watches exactly the Secrets `refs` (namespace, name) and stops the others; returns those
    /// that exist once every watch has its first list, `None` before.
    pub fn secrets(
        &self,
        refs: &BTreeSet<(String, String)>,
        changes: &futures::channel::mpsc::UnboundedSender<()>,
    ) -> Option<Vec<std::sync::Arc<Secret>>> {
        let key = |ns: &str, name: &str| format!("{ns}/{name}");
        let keys: BTreeSet<String> = refs.iter().map(|(ns, n)| key(ns, n)).collect();
        self.secrets.retain(&keys);
        self.secrets.ensure_each(
            refs.iter().map(|(ns, n)| (key(ns, n), Api::namespaced(self.client.clone(), ns), n.clone())),
            changes,
            &self.stop,
        );
        if !self.secrets.ready(&keys) {
            return None;
        }
        Some(refs.iter().filter_map(|(ns, n)| self.secrets.get_keyed(&key(ns, n), ns, n)).collect())
    }
}
