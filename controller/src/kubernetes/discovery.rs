//! Discovery and admission of HAProxy pods.
//!
//! Owns the pure rules ([`candidate`]: which pods may be probed, and why others are rejected;
//! matching by kube's `Selector` (`spec.podSelector`); [`Admission`]: the admission cache keyed on the pod's incarnation, and
//! which rejections are new) and the shell that watches the pods the `podSelector` selects (a
//! label-selector watch: no other pod is cached), probes candidates with `GET /v1/state` and the
//! Secret's credentials (at most 16 at once), and publishes the admitted set as endpoints. Pod readiness is never consulted: a pod
//! turns Ready only after its first apply. An unchanged pod costs no probe on the next pass. A
//! rotated Secret reaches the agent client and re-admits every pod. It must never deploy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::context::Context;
use super::crd::{pod_selector, AgentSpec};
use super::published::{Discovered, PodFacts, PodInfo};
use crate::agent_tls::agent_url;
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
    /// `http://<ip>:<port>`, or `https://` when the agents serve TLS.
    pub url: String,
}

/// The pure admission rule before the probe: an IP, not deleting, the agent container running;
/// the URL is `https://` when `tls`.
pub fn candidate(pod: &Pod, agent: &AgentSpec, tls: bool) -> Result<Candidate, Reject> {
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
    let url = agent_url(tls, &ip, agent.port);
    Ok(Candidate {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        ip,
        restarts: cs.restart_count,
        container_id: cs.container_id.clone().unwrap_or_default(),
        url,
    })
}

/// Why the agent Secret gives no credentials: the Secret and the key at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialsError {
    /// The key is missing.
    Missing(String, &'static str),
    /// The key's value is not UTF-8.
    NotUtf8(String, &'static str),
    /// The key's value is empty (after line ends are trimmed).
    Empty(String, &'static str),
}

impl std::fmt::Display for CredentialsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialsError::Missing(name, k) => write!(f, "Secret {name} has no key {k:?}"),
            CredentialsError::NotUtf8(name, k) => write!(f, "Secret {name}: {k} is not UTF-8"),
            CredentialsError::Empty(name, k) => write!(f, "Secret {name}: {k} is empty"),
        }
    }
}

/// Credentials from the agent Secret's `username` and `password` keys.
pub fn secret_credentials(s: &Secret) -> Result<Credentials, CredentialsError> {
    let name = s.metadata.name.clone().unwrap_or_default();
    let data = s.data.clone().unwrap_or_default();
    let get = |k: &'static str| -> Result<String, CredentialsError> {
        let v = data.get(k).ok_or_else(|| CredentialsError::Missing(name.clone(), k))?;
        let t = String::from_utf8(v.0.clone()).map_err(|_| CredentialsError::NotUtf8(name.clone(), k))?;
        let t = t.trim_end_matches(['\r', '\n']).to_string();
        if t.is_empty() {
            return Err(CredentialsError::Empty(name.clone(), k));
        }
        Ok(t)
    };
    Ok(Credentials { user: get("username")?, password: get("password")? })
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

/// A pod newly rejected (counted once per pod incarnation and reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The pod.
    pub pod: String,
    /// Why.
    pub reason: Reject,
    /// The probe's error, for an unreachable agent.
    pub error: Option<String>,
}

/// The pure admission state between passes: the admitted candidates (an unchanged pod is not
/// probed again) and the last rejection of each pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admission {
    /// Whether the agents serve TLS (their URLs are `https://`).
    pub tls: bool,
    admitted: BTreeSet<Candidate>,
    rejected: BTreeMap<String, (Option<Candidate>, Reject)>,
}

/// One pass over the selected pods, before the probes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Candidates not admitted yet: probe each with `GET /v1/state`.
    pub to_probe: Vec<Candidate>,
    /// Pods rejected before any probe for the first time in this incarnation.
    pub rejections: Vec<Rejection>,
    facts: BTreeMap<String, PodFacts>,
}

impl Admission {
    /// Forgets every admission (rotated credentials: every pod is probed again).
    pub fn forget_admitted(&mut self) {
        self.admitted.clear();
    }

    /// Sorts the pods `selector` matches into candidates and rejections, drops what is gone,
    /// and says which candidates need a probe (pure).
    pub fn pass(&mut self, pods: &[Arc<Pod>], selector: &Selector, agent: &AgentSpec) -> Pass {
        let mut now_candidates = BTreeSet::new();
        let mut seen_names = BTreeSet::new();
        let mut pass = Pass::default();
        for pod in pods {
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            if !selector.matches(&labels) {
                continue;
            }
            let name = pod.metadata.name.clone().unwrap_or_default();
            seen_names.insert(name.clone());
            pass.facts.insert(name.clone(), pod_facts(pod));
            match candidate(pod, agent, self.tls) {
                Ok(c) => {
                    now_candidates.insert(c);
                }
                Err(reason) => {
                    if self.note(&name, None, reason) {
                        pass.rejections.push(Rejection { pod: name, reason, error: None });
                    }
                }
            }
        }
        self.admitted.retain(|c| now_candidates.contains(c));
        self.rejected.retain(|n, _| seen_names.contains(n));
        pass.to_probe = now_candidates.iter().filter(|c| !self.admitted.contains(c)).cloned().collect();
        pass
    }

    /// Records the probes' results of `pass`; returns what to publish and the pods newly found
    /// unreachable (pure).
    pub fn settle(&mut self, pass: Pass, probes: Vec<(Candidate, Result<(), String>)>) -> (Discovered, Vec<Rejection>) {
        let mut newly = Vec::new();
        for (c, r) in probes {
            match r {
                Ok(()) => {
                    self.rejected.remove(&c.name);
                    self.admitted.insert(c);
                }
                Err(e) => {
                    let name = c.name.clone();
                    if self.note(&name, Some(c), Reject::AgentUnreachable) {
                        newly.push(Rejection { pod: name, reason: Reject::AgentUnreachable, error: Some(e) });
                    }
                }
            }
        }
        let mut facts = pass.facts;
        let d = Discovered {
            endpoints: self.admitted.iter().map(|c| Endpoint { name: c.name.clone(), url: c.url.clone() }).collect(),
            pods: self
                .admitted
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
        (d, newly)
    }

    /// Whether `name` is admitted right now.
    pub fn is_admitted(&self, name: &str) -> bool {
        self.admitted.iter().any(|c| c.name == name)
    }

    /// Records a rejection; `true` when it is new for this pod incarnation and reason.
    fn note(&mut self, name: &str, key: Option<Candidate>, r: Reject) -> bool {
        let entry = (key, r);
        if self.rejected.get(name) == Some(&entry) {
            return false;
        }
        self.rejected.insert(name.to_string(), entry);
        true
    }
}

/// The pods of the namespace that `selector` selects, watched into a store of their own
/// (the apiserver filters by the label selector; nothing else is listed or cached).
struct PodWatch {
    selector: String,
    store: Store<Pod>,
    stream: futures::stream::BoxStream<'static, Result<(), String>>,
}

impl PodWatch {
    fn start(ctx: &Context, selector: &Selector) -> Self {
        let (store, writer) = reflector::store::<Pod>();
        let cfg = watcher::Config::default().labels_from(selector);
        let stream = watcher(ctx.api::<Pod>(), cfg)
            .default_backoff()
            .reflect(writer)
            .map(|r| r.map(|_| ()).map_err(|e| e.to_string()))
            .boxed();
        PodWatch { selector: selector.to_string(), store, stream }
    }
}

async fn next_pod_event(w: &mut Option<PodWatch>) -> Option<Result<(), String>> {
    match w {
        Some(w) => w.stream.next().await,
        None => futures::future::pending().await,
    }
}

/// Watches the pods the resource's `podSelector` selects, reads the credentials Secret from the
/// context's stores, admits pods and publishes [`Discovered`] on `tx`, until `shutdown`.
pub async fn discover(
    ctx: Context,
    agents: AgentClient,
    metrics: Arc<Metrics>,
    tx: watch::Sender<Discovered>,
    shutdown: CancellationToken,
) {
    let mut snapshots = ctx.snapshots.clone();
    let mut pods: Option<PodWatch> = None;
    let mut admission = Admission { tls: agents.trust().is_some(), ..Admission::default() };
    let mut creds: Option<Credentials> = None;
    let mut tick = tokio::time::interval(REPROBE);
    let publish = |d: Discovered| {
        let _ = tx.send_if_modified(|cur| {
            if *cur != d {
                *cur = d;
                true
            } else {
                false
            }
        });
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = next_pod_event(&mut pods) => match ev {
                None => return,
                Some(Err(e)) => { warn!("watching pods: {e}"); continue; }
                Some(Ok(())) => {}
            },
            r = snapshots.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
        }
        let Some(config) = snapshots.borrow_and_update().config.clone() else {
            pods = None;
            publish(Discovered::default());
            continue;
        };
        // The pod watch follows the selector: a changed selector is a new watch.
        // A selector Kubernetes cannot evaluate selects nothing (the render is `InvalidSpec`).
        let selector = match pod_selector(&config.spec.pod_selector) {
            Ok(s) => s,
            Err(e) => {
                if pods.take().is_some() {
                    warn!("{e}: watching no pods");
                }
                publish(Discovered::default());
                continue;
            }
        };
        if pods.as_ref().map(|w| w.selector.as_str()) != Some(selector.to_string().as_str()) {
            info!(%selector, "watching the pods the podSelector selects");
            pods = Some(PodWatch::start(&ctx, &selector));
            continue;
        }
        let Some(watch) = pods.as_ref() else { continue };
        if futures::FutureExt::now_or_never(watch.store.wait_until_ready()).is_none() {
            continue;
        }
        let agent = config.spec.agent.clone();
        // Credentials: a rotation re-admits every pod with the new ones.
        let secret = &agent.credentials_secret_ref.name;
        let (new_creds, creds_err) =
            match ctx.stores.secrets.get(&ctx.namespace, secret).as_deref().map(secret_credentials) {
                Some(Ok(c)) => (Some(c), None),
                Some(Err(e)) => (None, Some(e.to_string())),
                None => (None, Some(format!("Secret {secret} not found"))),
            };
        if new_creds != creds {
            if let Some(c) = &new_creds {
                info!(%secret, "agent credentials loaded");
                agents.set_credentials(c.clone());
            }
            creds = new_creds;
            admission.forget_admitted();
        }
        if creds.is_none() {
            publish(Discovered { credentials_error: creds_err, ..Discovered::default() });
            continue;
        }
        let pass = admission.pass(&watch.store.state(), &selector, &agent);
        for r in &pass.rejections {
            count(&metrics, r);
        }
        let probes: Vec<(Candidate, Result<(), String>)> = futures::stream::iter(pass.to_probe.clone())
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
        let (d, newly) = admission.settle(pass, probes);
        for r in &newly {
            warn!(pod = %r.pod, "agent_unreachable: {}", r.error.as_deref().unwrap_or_default());
            count(&metrics, r);
        }
        for e in &d.endpoints {
            if !tx.borrow().pods.contains_key(&e.name) {
                info!(pod = %e.name, url = %e.url, "admitted HAProxy pod");
            }
        }
        publish(d);
    }
}

/// Counts a new rejection in `haptic_haproxy_pods_rejected_total`.
fn count(metrics: &Metrics, r: &Rejection) {
    if let Some(label) = r.reason.metric() {
        metrics.pod_rejected(label);
        if r.reason == Reject::AgentContainerNotRunning {
            info!(pod = %r.pod, "agent_container_not_running: not a deployment target");
        }
    }
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
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
        let c = candidate(&running, &agent, false).unwrap();
        assert_eq!((c.url.as_str(), c.restarts, c.container_id.as_str()), ("http://10.0.0.5:9080", 2, "c://1"));
        // Readiness is never consulted (ready: false above).
        let waiting = pod(json!({
            "metadata": {"name": "h-2"},
            "status": {"podIP": "10.0.0.6", "containerStatuses": [
                {"name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        }));
        assert_eq!(candidate(&waiting, &agent, false), Err(Reject::AgentContainerNotRunning));
        let no_agent =
            pod(json!({"metadata": {"name": "h-3"}, "status": {"podIP": "10.0.0.7", "containerStatuses": []}}));
        assert_eq!(candidate(&no_agent, &agent, false), Err(Reject::AgentContainerNotRunning));
        let pending = pod(json!({"metadata": {"name": "h-4"}, "status": {"phase": "Pending"}}));
        assert_eq!(candidate(&pending, &agent, false), Err(Reject::NotScheduled));
        let v6 = pod(json!({"metadata": {"name": "h-5"}, "status": {"podIP": "fd00::1", "containerStatuses": [
            {"name": "agent", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}}));
        assert_eq!(candidate(&v6, &agent, false).unwrap().url, "http://[fd00::1]:9080");
        assert_eq!(candidate(&v6, &agent, true).unwrap().url, "https://[fd00::1]:9080");
    }

    fn running_pod(name: &str, uid: &str, ip: &str) -> Arc<Pod> {
        Arc::new(pod(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": {"app": "haproxy"}},
            "status": {"podIP": ip, "containerStatuses": [
                {"name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"running": {}}}]}
        })))
    }

    #[test]
    fn admission_probes_each_pod_incarnation_once_and_counts_rejections_once() {
        let agent = AgentSpec::default();
        let sel: LabelSelector = serde_json::from_value(json!({"matchLabels": {"app": "haproxy"}})).unwrap();
        let sel = pod_selector(&sel).unwrap();
        let waiting = Arc::new(pod(json!({
            "metadata": {"name": "h-w", "labels": {"app": "haproxy"}},
            "status": {"podIP": "10.0.0.9", "containerStatuses": [
                {"name": "agent", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"waiting": {}}}]}
        })));
        let other = Arc::new(pod(json!({"metadata": {"name": "nginx", "labels": {"app": "nginx"}}})));
        let mut pods = vec![running_pod("h-1", "u1", "10.0.0.1"), running_pod("h-2", "u2", "10.0.0.2"), waiting, other];
        let mut a = Admission::default();
        let pass = a.pass(&pods, &sel, &agent);
        let names = |p: &Pass| p.to_probe.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&pass), ["h-1", "h-2"], "the unselected pod is not looked at");
        assert_eq!(pass.rejections.len(), 1);
        assert_eq!(pass.rejections[0].reason, Reject::AgentContainerNotRunning);
        let probes: Vec<_> = pass
            .to_probe
            .iter()
            .map(|c| (c.clone(), if c.name == "h-1" { Ok(()) } else { Err("refused".to_string()) }))
            .collect();
        let (d, newly) = a.settle(pass, probes);
        assert_eq!(d.endpoints.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["h-1"]);
        assert_eq!(d.pods["h-1"].uid, "u1");
        assert_eq!(
            newly.iter().map(|r| (r.pod.as_str(), r.reason)).collect::<Vec<_>>(),
            [("h-2", Reject::AgentUnreachable)]
        );
        // The next pass: the admitted pod costs no probe; the rejections are not new.
        let pass = a.pass(&pods, &sel, &agent);
        assert_eq!(names(&pass), ["h-2"]);
        assert!(pass.rejections.is_empty());
        let again: Vec<_> = pass.to_probe.iter().map(|c| (c.clone(), Err("refused".to_string()))).collect();
        let (_, newly) = a.settle(pass, again);
        assert!(newly.is_empty(), "the same incarnation is counted once");
        // Replaced (new UID): probed again. Deleted: gone from the admitted set.
        pods[0] = running_pod("h-1", "u1b", "10.0.0.1");
        pods.remove(1);
        let pass = a.pass(&pods, &sel, &agent);
        assert_eq!(names(&pass), ["h-1"]);
        let probes: Vec<_> = pass.to_probe.iter().map(|c| (c.clone(), Ok(()))).collect();
        let (d, _) = a.settle(pass, probes);
        assert_eq!(d.pods["h-1"].uid, "u1b");
        assert!(a.is_admitted("h-1") && !a.is_admitted("h-2"));
        // Rotated credentials: every pod is probed again.
        a.forget_admitted();
        assert_eq!(names(&a.pass(&pods, &sel, &agent)), ["h-1"]);
    }

    #[test]
    fn admission_matches_pods_by_labels_and_expressions() {
        let agent = AgentSpec::default();
        let labelled = |name: &str, uid: &str, tier: Option<&str>| {
            let mut p = (*running_pod(name, uid, "10.0.0.1")).clone();
            if let Some(t) = tier {
                p.metadata.labels.get_or_insert_default().insert("tier".into(), t.into());
            }
            Arc::new(p)
        };
        let pods = vec![
            labelled("edge", "u1", Some("edge")),
            labelled("int", "u2", Some("int")),
            labelled("bare", "u3", None),
        ];
        let pass = |sel: serde_json::Value| {
            let sel = pod_selector(&serde_json::from_value(sel).unwrap()).unwrap();
            let pass = Admission::default().pass(&pods, &sel, &agent);
            pass.to_probe.iter().map(|c| c.name.clone()).collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>()
        };
        assert_eq!(
            pass(json!({"matchLabels": {"app": "haproxy"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["edge", "x"]}]})),
            ["edge"]
        );
        assert_eq!(pass(json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]})), ["bare"]);
        assert_eq!(
            pass(json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["edge"]}]})),
            ["bare", "int"]
        );
        assert!(pass(json!({"matchLabels": {"app": "nginx"}})).is_empty());
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
        assert_eq!(secret_credentials(&s), Err(CredentialsError::Missing("creds".into(), "password")));
        s.data.as_mut().unwrap().insert("password".into(), k8s_openapi::ByteString(b"\n".to_vec()));
        assert_eq!(secret_credentials(&s), Err(CredentialsError::Empty("creds".into(), "password")));
        s.data.as_mut().unwrap().insert("username".into(), k8s_openapi::ByteString(vec![0xff]));
        assert_eq!(secret_credentials(&s), Err(CredentialsError::NotUtf8("creds".into(), "username")));
    }
}
