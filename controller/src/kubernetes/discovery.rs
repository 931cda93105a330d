//! Discovery and admission of HAProxy pods (BRIEF §7.3, seed 004).
//!
//! Owns the pure rules ([`candidate`]: which pods may be probed, and why others are rejected;
//! [`selector_matches`]; the admission cache key) and the shell that watches the namespace's
//! pods, probes candidates with `GET /v1/state` and the Secret's credentials (at most 16 at
//! once), and publishes the admitted set as endpoints. Pod readiness is never consulted: a pod
//! turns Ready only after its first apply. An unchanged pod costs no probe on the next pass. A
//! rotated Secret reaches the agent client and re-admits every pod. It must never deploy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::crd::AgentSpec;
use super::render::Snapshot;
use crate::client::{AgentClient, Credentials};
use crate::metrics::Metrics;
use crate::seams::Endpoint;

/// How many probes run at once.
pub const MAX_PROBES: usize = 16;
/// How often rejected and unreachable pods are looked at again without a pod event.
pub const REPROBE: Duration = Duration::from_secs(3);

/// Why a pod is not a deployment target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reject {
    /// No IP yet, being deleted, or finished.
    NotScheduled,
    /// The agent container is missing or not `running`.
    AgentContainerNotRunning,
    /// The agent did not answer `/v1/state` with the credentials.
    AgentUnreachable,
}

impl Reject {
    /// The metric label (`None`: not counted, the pod simply is not there yet).
    pub fn metric(self) -> Option<&'static str> {
        match self {
            Reject::NotScheduled => None,
            Reject::AgentContainerNotRunning => Some("agent_container_not_running"),
            Reject::AgentUnreachable => Some("agent_unreachable"),
        }
    }
}

/// A pod worth probing, and the key under which its admission is cached.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Candidate {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Pod IP.
    pub ip: String,
    /// The agent container's restart count.
    pub restarts: i32,
    /// The agent container's id.
    pub container_id: String,
    /// `http://<ip>:<port>`.
    pub url: String,
}

/// Whether `labels` match `sel` (`matchLabels` and `matchExpressions`).
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let ml = sel.match_labels.clone().unwrap_or_default();
    if ml.iter().any(|(k, v)| labels.get(k) != Some(v)) {
        return false;
    }
    sel.match_expressions.clone().unwrap_or_default().iter().all(|e| {
        let vals = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| vals.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !vals.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    })
}

/// The pure admission rule before the probe: an IP, not deleting, the agent container running.
pub fn candidate(pod: &Pod, agent: &AgentSpec) -> Result<Candidate, Reject> {
    let meta = &pod.metadata;
    let status = pod.status.as_ref().ok_or(Reject::NotScheduled)?;
    let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty()).ok_or(Reject::NotScheduled)?;
    if meta.deletion_timestamp.is_some() || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return Err(Reject::NotScheduled);
    }
    let cs = status
        .container_statuses
        .as_ref()
        .and_then(|v| v.iter().find(|c| c.name == agent.container))
        .ok_or(Reject::AgentContainerNotRunning)?;
    if cs.state.as_ref().and_then(|s| s.running.as_ref()).is_none() {
        return Err(Reject::AgentContainerNotRunning);
    }
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.clone() };
    Ok(Candidate {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        ip,
        restarts: cs.restart_count,
        container_id: cs.container_id.clone().unwrap_or_default(),
        url: format!("http://{host}:{}", agent.port),
    })
}

/// Credentials from the agent Secret's `username` and `password` keys.
pub fn secret_credentials(s: &Secret) -> Result<Credentials, String> {
    let name = s.metadata.name.clone().unwrap_or_default();
    let data = s.data.clone().unwrap_or_default();
    let get = |k: &str| -> Result<String, String> {
        let v = data.get(k).ok_or_else(|| format!("Secret {name} has no key {k:?}"))?;
        let t = String::from_utf8(v.0.clone()).map_err(|_| format!("Secret {name}: {k} is not UTF-8"))?;
        let t = t.trim_end_matches(['\r', '\n']).to_string();
        if t.is_empty() {
            return Err(format!("Secret {name}: {k} is empty"));
        }
        Ok(t)
    };
    Ok(Credentials { user: get("username")?, password: get("password")? })
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

/// The pure read of [`PodFacts`] from a pod object.
pub fn pod_facts(pod: &Pod) -> PodFacts {
    let status = pod.status.as_ref();
    let ready = status.and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let not_ready_reason = ready.filter(|c| c.status != "True").map(|c| {
        let reason = c.reason.clone().unwrap_or_else(|| "NotReady".into());
        match c.message.as_deref() {
            Some(m) if !m.is_empty() => format!("{reason}: {m}"),
            _ => reason,
        }
    });
    PodFacts {
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        ready: ready.map(|c| c.status == "True"),
        not_ready_reason,
        restarts: status
            .and_then(|s| s.container_statuses.as_ref())
            .map_or(0, |v| v.iter().map(|c| c.restart_count).sum()),
    }
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

/// Watches pods and the credentials Secret, admits pods, publishes [`Discovered`].
pub fn discover(
    client: Client,
    namespace: &str,
    snapshots: watch::Receiver<Snapshot>,
    secrets: Store<Secret>,
    agents: AgentClient,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> watch::Receiver<Discovered> {
    let (writer_reader, writer) = reflector::store::<Pod>();
    let pods_store: Store<Pod> = writer_reader;
    let stream =
        reflector::reflector(writer, watcher(Api::<Pod>::namespaced(client, namespace), watcher::Config::default()))
            .map(|r| r.map(|_| ()).map_err(|e| e.to_string()))
            .boxed();
    let (tx, rx) = watch::channel(Discovered::default());
    let namespace = namespace.to_string();
    tokio::spawn(async move {
        let mut stream = stream;
        let mut snapshots = snapshots;
        let mut admitted: BTreeSet<Candidate> = BTreeSet::new();
        let mut rejected: BTreeMap<String, (Option<Candidate>, Reject)> = BTreeMap::new();
        let mut creds: Option<Credentials> = None;
        let mut tick = tokio::time::interval(REPROBE);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = stream.next() => match ev {
                    None => return,
                    Some(Err(e)) => { warn!("watching pods: {e}"); continue; }
                    Some(Ok(())) => {}
                },
                r = snapshots.changed() => if r.is_err() { return },
                _ = tick.tick() => {}
            }
            if futures::FutureExt::now_or_never(pods_store.wait_until_ready()).is_none() {
                continue;
            }
            let Some(config) = snapshots.borrow().config.clone() else {
                let _ = tx.send_if_modified(|d| std::mem::take(d) != Discovered::default());
                continue;
            };
            let agent = config.spec.agent.clone();
            // Credentials: a rotation re-admits every pod with the new ones.
            let secret_ref =
                kube::runtime::reflector::ObjectRef::new(&agent.credentials_secret_ref.name).within(&namespace);
            let found = secrets.get(&secret_ref);
            let (new_creds, creds_err) = match found.as_deref().map(secret_credentials) {
                Some(Ok(c)) => (Some(c), None),
                Some(Err(e)) => (None, Some(e)),
                None => (None, Some(format!("Secret {} not found", agent.credentials_secret_ref.name))),
            };
            if new_creds != creds {
                if let Some(c) = &new_creds {
                    info!(secret = %agent.credentials_secret_ref.name, "agent credentials loaded");
                    agents.set_credentials(c.clone());
                }
                creds = new_creds;
                admitted.clear();
            }
            let Some(_) = creds else {
                let d = Discovered { credentials_error: creds_err, ..Discovered::default() };
                let _ = tx.send_if_modified(|cur| {
                    if *cur != d {
                        *cur = d;
                        true
                    } else {
                        false
                    }
                });
                continue;
            };
            // Candidates among the selected pods.
            let mut now_candidates = BTreeSet::new();
            let mut seen_names = BTreeSet::new();
            let mut facts = BTreeMap::new();
            for pod in pods_store.state() {
                let labels = pod.metadata.labels.clone().unwrap_or_default();
                if !selector_matches(&config.spec.pod_selector, &labels) {
                    continue;
                }
                let name = pod.metadata.name.clone().unwrap_or_default();
                seen_names.insert(name.clone());
                facts.insert(name.clone(), pod_facts(&pod));
                match candidate(&pod, &agent) {
                    Ok(c) => {
                        now_candidates.insert(c);
                    }
                    Err(r) => note_rejection(&metrics, &mut rejected, &name, None, r),
                }
            }
            admitted.retain(|c| now_candidates.contains(c));
            rejected.retain(|n, _| seen_names.contains(n));
            let to_probe: Vec<Candidate> = now_candidates.iter().filter(|c| !admitted.contains(c)).cloned().collect();
            let results: Vec<(Candidate, Result<(), String>)> = futures::stream::iter(to_probe)
                .map(|c| {
                    let agents = agents.clone();
                    async move {
                        let ep = Endpoint { name: c.name.clone(), url: c.url.clone() };
                        let r = agents.state(&ep, false).await.map(|_| ()).map_err(|e| e.to_string());
                        (c, r)
                    }
                })
                .buffer_unordered(MAX_PROBES)
                .collect()
                .await;
            for (c, r) in results {
                match r {
                    Ok(()) => {
                        info!(pod = %c.name, url = %c.url, "admitted HAProxy pod");
                        rejected.remove(&c.name);
                        admitted.insert(c);
                    }
                    Err(e) => {
                        if rejected.get(&c.name).map(|(k, _)| k.as_ref()) != Some(Some(&c)) {
                            warn!(pod = %c.name, "agent_unreachable: {e}");
                        }
                        let name = c.name.clone();
                        note_rejection(&metrics, &mut rejected, &name, Some(c), Reject::AgentUnreachable);
                    }
                }
            }
            let d = Discovered {
                endpoints: admitted.iter().map(|c| Endpoint { name: c.name.clone(), url: c.url.clone() }).collect(),
                pods: admitted
                    .iter()
                    .map(|c| {
                        let info = PodInfo {
                            uid: c.uid.clone(),
                            ip: c.ip.clone(),
                            facts: facts.remove(&c.name).unwrap_or_default(),
                        };
                        (c.name.clone(), info)
                    })
                    .collect(),
                credentials_error: None,
            };
            let _ = tx.send_if_modified(|cur| {
                if *cur != d {
                    *cur = d;
                    true
                } else {
                    false
                }
            });
        }
    });
    rx
}

/// Records a rejection; the metric counts each distinct (pod incarnation, reason) once.
fn note_rejection(
    metrics: &Metrics,
    rejected: &mut BTreeMap<String, (Option<Candidate>, Reject)>,
    name: &str,
    key: Option<Candidate>,
    r: Reject,
) {
    let entry = (key, r);
    if rejected.get(name) == Some(&entry) {
        return;
    }
    if let Some(label) = r.metric() {
        metrics.pod_rejected(label);
        if r == Reject::AgentContainerNotRunning {
            info!(pod = %name, "agent_container_not_running: not a deployment target");
        }
    }
    rejected.insert(name.to_string(), entry);
}

/// An [`crate::seams::EndpointSource`] over the published [`Discovered`] sets.
#[derive(Debug)]
pub struct FeedEndpoints {
    rx: watch::Receiver<Discovered>,
    first: bool,
}

impl FeedEndpoints {
    /// A source reading `rx`: the current set at once, then each change.
    pub fn new(rx: watch::Receiver<Discovered>) -> Self {
        Self { rx, first: true }
    }
}

impl crate::seams::EndpointSource for FeedEndpoints {
    fn next(&mut self) -> futures::future::BoxFuture<'_, Option<Vec<Endpoint>>> {
        Box::pin(async move {
            if !std::mem::take(&mut self.first) {
                self.rx.changed().await.ok()?;
            }
            Some(self.rx.borrow_and_update().endpoints.clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pod_facts_read_node_readiness_and_restarts() {
        let p = pod(json!({
            "metadata": {"name": "h-1"},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "NodeNotReady",
                                       "message": "node is not reporting"}],
                       "containerStatuses": [
                {"name": "agent", "image": "i", "imageID": "", "ready": true, "restartCount": 1},
                {"name": "haproxy", "image": "i", "imageID": "", "ready": false, "restartCount": 2}]}
        }));
        let f = pod_facts(&p);
        assert_eq!(f.node.as_deref(), Some("n1"));
        assert_eq!(f.ready, Some(false));
        assert_eq!(f.not_ready_reason.as_deref(), Some("NodeNotReady: node is not reporting"));
        assert_eq!(f.restarts, 3);
        let ready = pod(json!({"metadata": {"name": "h-2"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
        assert_eq!(pod_facts(&ready), PodFacts { ready: Some(true), ..PodFacts::default() });
        assert_eq!(pod_facts(&pod(json!({"metadata": {"name": "h-3"}}))), PodFacts::default());
    }

    #[test]
    fn only_pods_with_an_ip_and_a_running_agent_are_candidates() {
        let agent = AgentSpec::default();
        let running = pod(json!({
            "metadata": {"name": "h-1", "namespace": "ns", "uid": "u1"},
            "status": {"podIP": "10.0.0.5", "phase": "Running", "containerStatuses": [
                {"name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 2,
                 "containerID": "c://1", "state": {"running": {}}}]}
        }));
        let c = candidate(&running, &agent).unwrap();
        assert_eq!((c.url.as_str(), c.restarts, c.container_id.as_str()), ("http://10.0.0.5:9080", 2, "c://1"));
        // Readiness is never consulted (ready: false above).
        let waiting = pod(json!({
            "metadata": {"name": "h-2"},
            "status": {"podIP": "10.0.0.6", "containerStatuses": [
                {"name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        }));
        assert_eq!(candidate(&waiting, &agent), Err(Reject::AgentContainerNotRunning));
        let no_agent =
            pod(json!({"metadata": {"name": "h-3"}, "status": {"podIP": "10.0.0.7", "containerStatuses": []}}));
        assert_eq!(candidate(&no_agent, &agent), Err(Reject::AgentContainerNotRunning));
        let pending = pod(json!({"metadata": {"name": "h-4"}, "status": {"phase": "Pending"}}));
        assert_eq!(candidate(&pending, &agent), Err(Reject::NotScheduled));
        let v6 = pod(json!({"metadata": {"name": "h-5"}, "status": {"podIP": "fd00::1", "containerStatuses": [
            {"name": "agent", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}}));
        assert_eq!(candidate(&v6, &agent).unwrap().url, "http://[fd00::1]:9080");
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels =
            BTreeMap::from([("app".to_string(), "haproxy".to_string()), ("tier".to_string(), "edge".to_string())]);
        let sel: LabelSelector = serde_json::from_value(json!({"matchLabels": {"app": "haproxy"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["edge", "int"]}]}))
        .unwrap();
        assert!(selector_matches(&sel, &labels));
        let other: LabelSelector = serde_json::from_value(json!({"matchLabels": {"app": "nginx"}})).unwrap();
        assert!(!selector_matches(&other, &labels));
        let absent: LabelSelector =
            serde_json::from_value(json!({"matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]}))
                .unwrap();
        assert!(selector_matches(&absent, &labels));
    }

    #[test]
    fn credentials_come_from_username_and_password() {
        let mut s = Secret::default();
        s.metadata.name = Some("creds".into());
        s.data = Some(BTreeMap::from([
            ("username".to_string(), k8s_openapi::ByteString(b"haptic".to_vec())),
            ("password".to_string(), k8s_openapi::ByteString(b"pw\n".to_vec())),
        ]));
        assert_eq!(secret_credentials(&s).unwrap(), Credentials { user: "haptic".into(), password: "pw".into() });
        s.data.as_mut().unwrap().remove("password");
        assert!(secret_credentials(&s).unwrap_err().contains("no key \"password\""));
    }
}
