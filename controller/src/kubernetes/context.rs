//! What every Kubernetes-mode task shares: the client, the namespace, the names, the reflector
//! stores, the feeds (published renders and admitted pods) and the Events recorder.
//!
//! Owns [`Context`] and [`Names`] only. It must never start a task or decide anything: the
//! watchers ([`super::feed`], [`super::discovery`]), the status writer and the terms loop
//! ([`super::run`]) each take a `Context`.

use std::sync::Arc;

use kube::runtime::events::Recorder;
use kube::{Api, Client};
use tokio::sync::watch;

use super::config_source::Stores;
use super::crd::HAProxyConfig;
use super::published::{Discovered, Snapshot};

/// The names this replica works with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The `HAProxyConfig`.
    pub config: String,
    /// The Lease.
    pub lease: String,
    /// This replica (Lease holder, fence holder, Event reporter instance).
    pub identity: String,
}

/// The parts of Kubernetes mode, cheap to clone.
#[derive(Clone)]
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The namespace of the resource, its ConfigMaps, Secrets, pods and Lease.
    pub namespace: String,
    /// The names.
    pub names: Arc<Names>,
    /// The reflector stores of what a render references.
    pub stores: Stores,
    /// The published renders (the resource and its render, or why there is none).
    pub snapshots: watch::Receiver<Snapshot>,
    /// The admitted pods.
    pub discovered: watch::Receiver<Discovered>,
    /// Publishes Events on the resource (and on Ingresses in render mode).
    pub recorder: Recorder,
    /// The status board (render mode reads which plans the pods have applied).
    pub board: Arc<crate::status::StatusBoard>,
    /// The HAProxy binary the gate runs (render mode also checks allowed snippets with it).
    pub haproxy_bin: std::path::PathBuf,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("namespace", &self.namespace).field("names", &self.names).finish()
    }
}

impl Context {
    /// The `HAProxyConfig` API of the namespace.
    pub fn configs(&self) -> Api<HAProxyConfig> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// An API of any namespaced kind in the namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}
