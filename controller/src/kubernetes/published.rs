//! What the watchers publish to every task of Kubernetes mode: the resource's render
//! ([`Snapshot`], from [`super::feed`]) and the admitted pods ([`Discovered`], from
//! [`super::discovery`]).
//!
//! Owns these values only. It must never watch, render or decide anything.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::config_source::SpecError;
use super::crd::HAProxyConfig;
use super::routes::IngressOutcome;
use crate::bundle::Bundle;
use crate::seams::Endpoint;

/// What the resource watcher publishes.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The resource (absent: not created yet or deleted).
    pub config: Option<Arc<HAProxyConfig>>,
    /// The bundle of the current spec, or why there is none.
    pub bundle: Option<Result<Arc<Bundle>, SpecError>>,
    /// In render mode, the served Ingresses' verdicts and the fleet's address.
    pub ingress: Option<Arc<IngressOutcome>>,
    /// Serving a GatewayClass: every status decided (the Model left out).
    pub gateway: Option<Arc<haptic_render::gateway::GatewayOutput>>,
}

/// What discovery publishes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovered {
    /// Admitted pods as endpoints (named by pod name), sorted.
    pub endpoints: Vec<Endpoint>,
    /// Pod facts by name.
    pub pods: BTreeMap<String, PodInfo>,
    /// Whether the credentials Secret was usable.
    pub credentials_error: Option<String>,
}

/// What discovery knows about an admitted pod (for status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// UID.
    pub uid: String,
    /// IP.
    pub ip: String,
    /// What the status shows of the pod besides its agent's answer.
    pub facts: PodFacts,
}

/// What Kubernetes says of a pod, for the status (never for admission).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// The node it runs on.
    pub node: Option<String>,
    /// Its `Ready` condition (`None`: not reported yet).
    pub ready: Option<bool>,
    /// The condition's reason and message when not Ready.
    pub not_ready_reason: Option<String>,
    /// Restarts of all its containers.
    pub restarts: i32,
}
