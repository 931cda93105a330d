//! Render mode on a real cluster: the chart installed with `ingress.enabled=true`, Ingresses,
//! Services and EndpointSlices made by Kubernetes itself, traffic through the HAProxy Service.
//!
//! Owns the Ingress steps ([`INGRESS_STEPS`]): an echo backend scaled 2 → 16 → 1 and rolled under
//! bounded load (0 failed requests, 0 reloads, growth past the slots by `server.add`), two
//! Ingresses on one host, TLS by SNI, a missing backend Service (503 and a Warning Event), and a
//! refused Ingress that does not stop one created after it. Every step prints how many changes
//! (applies per pod, by mode) and reloads it cost; the scale step also prints `kubectl scale` →
//! first and last new pod answering. It must never assert on timing, send traffic anywhere but
//! the HAProxy Service, nor leave its objects behind on success: it ends with the release back
//! on the scenarios' ConfigMap.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{json, Value};

use super::real::{pod_ready, run, RealCluster, NAMESPACE};
use super::real_steps::{apply_params, ensure, install_reading_config_map};
use super::real_websocket::{EchoServer, Exchanged, Open};
use super::scenarios::Selection;
use super::{eventually, status, status_table, wait_converged, wait_converged_on_spec, Cluster, ClusterError, Result};
use crate::pod::base64;

/// The Ingress steps' names for `HAPTIC_E2E_STEPS`, in run order.
pub const INGRESS_STEPS: [&str; 7] = [
    "ingress-scale",
    "ingress-drain",
    "ingress-hosts",
    "ingress-tls",
    "ingress-edge",
    "ingress-missing",
    "ingress-refused",
];

/// The chart's IngressClass (`ingress.className`).
const CLASS: &str = "haptic";
/// The echo backend: busybox httpd answering its pod name on `/`, `a <pod>` on `/a/`, `b <pod>`
/// on `/b/`; it sleeps in preStop so a stopping pod serves until the endpoints drop it.
const ECHO: &str = "echo";
/// A second Service over the same pods (a second backend).
const ECHO2: &str = "echo2";
const ECHO_HOST: &str = "echo.example";
/// HAProxy's TLS port on the HAProxy Service (the chart's `haproxy.service.ports.https`).
const HTTPS_PORT: u16 = 443;
/// HAProxy's exporter on the HAProxy pods (the chart's `haproxy.metricsPort`, port `metrics`).
const METRICS_PORT: u16 = 8405;
/// How many server slots a backend has (the chart's `ingress.serverSlots`).
const SLOTS: usize = 8;

fn ok(step: &str) {
    println!("ok real ingress: {step}");
}

/// Runs the Ingress steps `selection` wants on `c` (the release installed and converged), then
/// puts the release back on the scenarios' ConfigMap.
pub async fn run_ingress(c: &mut RealCluster, selection: &Selection) -> Result<()> {
    if !INGRESS_STEPS.iter().any(|s| selection.wants(s)) {
        return Ok(());
    }
    let client = c.client();
    c.install(&["ingress.enabled=true", &format!("ingress.serverSlots={SLOTS}")])?;
    // The render of the IngressClass (the steps below wait on what it serves).
    wait_converged_on_spec(&client, NAMESPACE, 2, None).await?;
    let svc = c.service_ip().await?;
    echo_backend(c, 2).await?;
    let plan = current_plan(c).await?;
    put_ingress(c, &ingress(ECHO, ECHO_HOST, &[("/", "Prefix", ECHO, json!({"number": 80}))])).await?;
    answered(c, &svc, ECHO_HOST, "/", |b| b.starts_with("echo-")).await?;
    wait_converged(&client, NAMESPACE, 2, Some(&plan)).await?;
    wait_load_balancer(c, ECHO, &svc).await?;
    ok("chart upgraded with ingress.enabled=true; an echo Deployment + Service + Ingress answers 200 through the HAProxy Service, status.loadBalancer is its ClusterIP");

    if selection.wants("ingress-scale") {
        scale_under_load(c, &svc).await?;
    }
    if selection.wants("ingress-drain") {
        drain_on_rollout(c, &svc).await?;
    }
    if selection.wants("ingress-hosts") {
        two_on_one_host(c, &svc).await?;
    }
    if selection.wants("ingress-tls") {
        tls_by_sni(c, &svc).await?;
    }
    if selection.wants("ingress-edge") {
        edge_defaults(c, &svc).await?;
    }
    if selection.wants("ingress-missing") {
        missing_service(c, &svc).await?;
    }
    if selection.wants("ingress-refused") {
        refused_then_another(c, &svc).await?;
    }
    // Every Ingress still served kept its address through all of the above.
    let ings: Api<Ingress> = Api::namespaced(client.clone(), NAMESPACE);
    for i in ings.list(&ListParams::default()).await.map_err(|e| ClusterError::of("list Ingresses", e))?.items {
        let name = i.metadata.name.clone().unwrap_or_default();
        ensure(load_balancer_ip(&i).as_deref() == Some(svc.as_str()), || {
            format!("Ingress {name}: status.loadBalancer is {:?}, not {svc}", i.status)
        })?;
    }
    clean_up(c).await?;
    let rendered = status(&client, NAMESPACE).await?["planId"].clone();
    install_reading_config_map(c).await?;
    // Renders of the deletions made before the switch are written for the previous spec.
    wait_converged_on_spec(&client, NAMESPACE, 2, Some(&rendered)).await?;
    ok("objects deleted; the release is back on the scenarios' ConfigMap");
    Ok(())
}

/// An Ingress of class [`CLASS`] named `name` with one rule for `host` and `paths` (path,
/// pathType, Service, port as `{"number": N}` or `{"name": N}`).
fn ingress(name: &str, host: &str, paths: &[(&str, &str, &str, Value)]) -> Value {
    let paths: Vec<Value> = paths
        .iter()
        .map(|(path, kind, svc, port)| {
            json!({"path": path, "pathType": kind, "backend": {"service": {"name": svc, "port": port}}})
        })
        .collect();
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name},
           "spec": {"ingressClassName": CLASS, "rules": [{"host": host, "http": {"paths": paths}}]}})
}

async fn put_ingress(c: &RealCluster, obj: &Value) -> Result<()> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    Api::<Ingress>::namespaced(c.client(), NAMESPACE)
        .patch(&name, &apply_params(), &Patch::Apply(obj))
        .await
        .map_err(|e| ClusterError::of(&format!("apply Ingress {name}"), e))?;
    Ok(())
}

async fn delete_ingress(c: &RealCluster, name: &str) -> Result<()> {
    Api::<Ingress>::namespaced(c.client(), NAMESPACE)
        .delete(name, &DeleteParams::default())
        .await
        .map_err(|e| ClusterError::of(&format!("delete Ingress {name}"), e))?;
    Ok(())
}

/// The echo Deployment with `replicas` pods, and the Services [`ECHO`] and [`ECHO2`] over it;
/// waits until every pod is Ready.
async fn echo_backend(c: &RealCluster, replicas: usize) -> Result<()> {
    web(c, ECHO, replicas, &[ECHO, ECHO2]).await
}

/// A Deployment `app` of `replicas` busybox httpd pods (labelled `app.kubernetes.io/name=app`)
/// answering their pod name on `/`, `a <pod>` on `/a/`, `b <pod>` on `/b/`, `slow <pod>` on
/// `/cgi-bin/slow` after 10 s and the `X-Forwarded-*` headers it got on `/cgi-bin/headers` (CGI
/// scripts), sleeping in preStop
/// so a stopping pod serves until the endpoints drop it; the Services `services` over them (port
/// 80); waits until every pod is Ready.
pub(super) async fn web(c: &RealCluster, app: &str, replicas: usize, services: &[&str]) -> Result<()> {
    let client = c.client();
    let labels = json!({"app.kubernetes.io/name": app});
    let script = "h=$(hostname); mkdir -p /www/a /www/b /www/cgi-bin; echo \"$h\" > /www/index.html; \
                  echo \"a $h\" > /www/a/index.html; echo \"b $h\" > /www/b/index.html; \
                  printf '#!/bin/sh\\nsleep 10\\nprintf \"Content-Type: text/plain\\\\r\\\\n\\\\r\\\\nslow %%s\\\\n\" \"$(hostname)\"\\n' \
                    > /www/cgi-bin/slow; chmod 755 /www/cgi-bin/slow; \
                  printf '#!/bin/sh\nprintf \"Content-Type: text/plain\\\\r\\\\n\\\\r\\\\nxff=%%s proto=%%s host=%%s port=%%s\\\\n\" \
                    \"$HTTP_X_FORWARDED_FOR\" \"$HTTP_X_FORWARDED_PROTO\" \"$HTTP_X_FORWARDED_HOST\" \"$HTTP_X_FORWARDED_PORT\"\n' \
                    > /www/cgi-bin/headers; chmod 755 /www/cgi-bin/headers; exec httpd -f -p 8000 -h /www";
    let dep = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"terminationGracePeriodSeconds": 30, "containers": [{
                "name": "httpd", "image": "localhost/haptic-e2e-web:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "ports": [{"name": "http", "containerPort": 8000}],
                "lifecycle": {"preStop": {"exec": {"command": ["/bin/sleep", "5"]}}},
                "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}}}
    });
    Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .patch(app, &apply_params(), &Patch::Apply(&dep))
        .await
        .map_err(|e| ClusterError::of(&format!("apply the Deployment {app}"), e))?;
    for name in services {
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                         "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}});
        Api::<Service>::namespaced(client.clone(), NAMESPACE)
            .patch(name, &apply_params(), &Patch::Apply(&svc))
            .await
            .map_err(|e| ClusterError::of(&format!("apply the Service {name}"), e))?;
    }
    settled(c, app, replicas, &BTreeSet::new()).await.map(|_| ())
}

/// Every pod of `app`, terminating ones included.
async fn app_pods(c: &RealCluster, app: &str) -> Result<Vec<Pod>> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/name={app}"));
    Ok(Api::<Pod>::namespaced(c.client(), NAMESPACE)
        .list(&lp)
        .await
        .map_err(|e| ClusterError::of(&format!("list the pods of {app}"), e))?
        .items)
}

/// Waits until exactly `n` pods of `app` exist (none terminating, none of `gone`), all Ready;
/// returns their names.
async fn settled(c: &RealCluster, app: &str, n: usize, gone: &BTreeSet<String>) -> Result<BTreeSet<String>> {
    eventually(&format!("{n} {app} pods Ready and none terminating"), Duration::from_secs(240), || async {
        let pods = app_pods(c, app).await.ok()?;
        let settled = pods.len() == n
            && pods.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && pod_ready(p)
                    && !gone.contains(p.metadata.name.as_deref().unwrap_or_default())
            });
        settled.then(|| pods.into_iter().filter_map(|p| p.metadata.name).collect())
    })
    .await
}

/// Waits until `GET path` with `Host: host` through the Service answers 200 with a body `want`
/// accepts; returns the body.
pub(super) async fn answered(
    c: &RealCluster,
    svc: &str,
    host: &str,
    path: &str,
    want: impl Fn(&str) -> bool,
) -> Result<String> {
    let what = format!("200 for {host}{path} through the HAProxy Service");
    eventually(&what, Duration::from_secs(90), || async {
        match c.service_get(svc, host, path).await {
            Ok((200, b)) if want(b.trim()) => Some(b.trim().to_string()),
            _ => None,
        }
    })
    .await
}

/// Waits until `GET path` with `Host: host` answers `code`.
pub(super) async fn answers_code(c: &RealCluster, svc: &str, host: &str, path: &str, code: u16) -> Result<()> {
    eventually(&format!("{code} for {host}{path}"), Duration::from_secs(90), || async {
        matches!(c.service_get(svc, host, path).await, Ok((got, _)) if got == code).then_some(())
    })
    .await
}

pub(super) fn load_balancer_ip(i: &Ingress) -> Option<String> {
    i.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.ip.clone()
}

async fn wait_load_balancer(c: &RealCluster, name: &str, ip: &str) -> Result<()> {
    let api: Api<Ingress> = Api::namespaced(c.client(), NAMESPACE);
    eventually(&format!("Ingress {name}'s status.loadBalancer to be {ip}"), Duration::from_secs(60), || async {
        (load_balancer_ip(&api.get(name).await.ok()?).as_deref() == Some(ip)).then_some(())
    })
    .await
}

/// Waits for a Warning Event with `reason` on Ingress `name` whose note contains `needle`;
/// returns the note.
async fn warning_event(c: &RealCluster, name: &str, reason: &str, needle: &str) -> Result<String> {
    let api: Api<Event> = Api::namespaced(c.client(), NAMESPACE);
    eventually(&format!("a Warning {reason} Event on Ingress {name}"), Duration::from_secs(60), || async {
        api.list(&ListParams::default()).await.ok()?.items.into_iter().find_map(|e| {
            let on = e
                .regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("Ingress") && r.name.as_deref() == Some(name));
            let note = e.note.clone().unwrap_or_default();
            (on && e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some(reason)
                && note.contains(needle))
            .then_some(note)
        })
    })
    .await
}

/// One agent's counters: `haptic_agent_reloads_total` (all results), applies by mode, runtime
/// ops by kind, and the worker pid.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentCounters {
    /// HAProxy's worker pid (from `/v1/state`).
    pub worker: u64,
    /// `haptic_agent_reloads_total`, summed over its results.
    pub reloads: f64,
    /// `haptic_agent_applies_total` by mode (`runtime`, `reload`, `file_only`…), results summed.
    pub applies: BTreeMap<String, f64>,
    /// `haptic_agent_runtime_ops_total` by op, results summed.
    pub ops: BTreeMap<String, f64>,
    /// `haptic_agent_reload_coalesced_total`: scheduled reloads a newer plan replaced.
    pub coalesced: f64,
}

/// The value of every sample of `metric` in the Prometheus text `text`, keyed by the value of its
/// label `label` (samples without it are keyed by ""); values of one key are summed.
pub fn samples_by(text: &str, metric: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let Ok(v) = value.parse::<f64>() else { continue };
        if name != metric {
            continue;
        }
        let key = labels
            .trim_end_matches('}')
            .split(',')
            .find_map(|kv| {
                kv.split_once('=').filter(|(k, _)| *k == label).map(|(_, v)| v.trim_matches('"').to_string())
            })
            .unwrap_or_default();
        *out.entry(key).or_insert(0.0) += v;
    }
    out
}

/// The counters of every HAProxy pod's agent, read while the fleet is at rest: converged, every
/// agent running the status's plan, none with a reload pending.
pub(super) async fn counters(c: &RealCluster) -> Result<BTreeMap<String, AgentCounters>> {
    let client = c.client();
    eventually("every agent's counters with the fleet at rest", Duration::from_secs(90), || async {
        let s = status(&client, NAMESPACE).await.ok()?;
        let pods = c.haproxy_pods().await.ok()?;
        if !super::converged_on(&s, pods.len(), None) {
            return None;
        }
        let mut out = BTreeMap::new();
        for pod in pods {
            let text = c.agent_metrics(&pod).await.ok()?;
            if samples_by(&text, "haptic_agent_pending_reload", "").values().any(|v| *v != 0.0) {
                return None;
            }
            let st = c.agent_state(&pod).await.ok()?;
            if st["running"]["plan_id"] != s["planId"] {
                return None;
            }
            out.insert(
                pod,
                AgentCounters {
                    worker: st["haproxy"]["worker_pid"].as_u64()?,
                    reloads: samples_by(&text, "haptic_agent_reloads_total", "result").values().sum(),
                    applies: samples_by(&text, "haptic_agent_applies_total", "mode"),
                    ops: samples_by(&text, "haptic_agent_runtime_ops_total", "op"),
                    coalesced: samples_by(&text, "haptic_agent_reload_coalesced_total", "").values().sum(),
                },
            );
        }
        Some(out)
    })
    .await
}

/// What a scenario cost, per HAProxy pod: reloads, worker changes, applies by mode, ops by kind.
#[derive(Debug, Clone, Default)]
pub(super) struct Cost {
    /// Pod → reloads during the scenario.
    reloads: BTreeMap<String, f64>,
    /// Pods whose worker pid changed.
    new_workers: Vec<String>,
    /// Applies by mode, the most any one pod took.
    applies: BTreeMap<String, f64>,
    /// Runtime ops by kind, summed over the pods.
    pub(super) ops: BTreeMap<String, f64>,
    /// Scheduled reloads a newer plan replaced, summed over the pods.
    coalesced: f64,
}

impl Cost {
    pub(super) fn of(
        before: &BTreeMap<String, AgentCounters>,
        after: &BTreeMap<String, AgentCounters>,
    ) -> Result<Self> {
        ensure(before.keys().eq(after.keys()), || {
            format!("the HAProxy pods changed during the scenario: {:?} -> {:?}", before.keys(), after.keys())
        })?;
        let mut cost = Cost::default();
        for (pod, a) in after {
            let b = &before[pod];
            cost.reloads.insert(pod.clone(), a.reloads - b.reloads);
            if a.worker != b.worker {
                cost.new_workers.push(pod.clone());
            }
            for (mode, v) in &a.applies {
                let d = v - b.applies.get(mode).copied().unwrap_or(0.0);
                let e = cost.applies.entry(mode.clone()).or_insert(0.0);
                *e = e.max(d);
            }
            cost.coalesced += a.coalesced - b.coalesced;
            for (op, v) in &a.ops {
                *cost.ops.entry(op.clone()).or_insert(0.0) += v - b.ops.get(op).copied().unwrap_or(0.0);
            }
        }
        Ok(cost)
    }

    pub(super) fn line(&self) -> String {
        let fmt = |m: &BTreeMap<String, f64>| {
            m.iter().filter(|(_, v)| **v != 0.0).map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
        };
        format!(
            "changes per pod: {} (applies: {}); reloads per pod: {:?} (scheduled ones replaced by a newer plan: {}); runtime ops over the fleet: {}",
            self.applies.values().sum::<f64>(),
            fmt(&self.applies),
            self.reloads.values().collect::<Vec<_>>(),
            self.coalesced,
            fmt(&self.ops)
        )
    }

    /// Fails unless every pod took exactly `n` reloads (and a new worker exactly when `n > 0`).
    pub(super) fn expect_reloads(&self, what: &str, n: f64) -> Result<()> {
        let all = self.reloads.values().all(|r| *r == n);
        let workers = if n == 0.0 { self.new_workers.is_empty() } else { self.new_workers.len() == self.reloads.len() };
        ensure(all && workers, || {
            format!("{what}: expected {n} reloads per pod; {}; new workers on {:?}", self.line(), self.new_workers)
        })
    }
}

/// Who answered the load, and when first and last.
#[derive(Debug, Default)]
struct Seen {
    /// Body (the echo pod's name) → (first, last) time it answered.
    by: BTreeMap<String, (Instant, Instant)>,
    ok: u64,
    failed: Vec<String>,
}

/// Sequential requests for `host` to `ip` (port 80) until `stop`, at most 400 000 or 600 s;
/// `Seen::failed` gets every answer that was not a 200.
fn start_load(
    c: &RealCluster,
    ip: String,
    host: &'static str,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
) -> tokio::task::JoinHandle<bool> {
    let c = c.clone();
    tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut n = 0u32;
        while !stop.load(Ordering::Relaxed) {
            if n >= 400_000 || Instant::now() >= deadline {
                return false;
            }
            n += 1;
            let got = c.service_get(&ip, host, "/").await;
            let now = Instant::now();
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            match got {
                Ok((200, body)) => {
                    s.ok += 1;
                    let e = s.by.entry(body.trim().to_string()).or_insert((now, now));
                    e.1 = now;
                }
                other => s.failed.push(format!("{other:?}")),
            }
        }
        true
    })
}

/// The host of the drain step's Ingress.
const DRAIN_HOST: &str = "drain.example";
/// Slow requests in flight when the HAProxy pods are replaced.
const SLOW_REQUESTS: usize = 5;
/// Websockets open when the HAProxy pods are replaced.
const WEBSOCKETS: usize = 20;
/// The websockets' echo Service.
const WS: &str = "ws";
/// Messages each websocket still exchanges once the old pods are terminating: 10 s, past the
/// chart's 5 s preStop sleep and into HAProxy's soft stop.
const WS_AFTER_STOP: usize = 50;

/// `GET path` for `host` through the Service at `ip`, answered in a task: on this machine's
/// cluster the request is on the wire (connected, written) when this returns.
async fn sent(
    c: &RealCluster,
    ip: &str,
    host: &str,
    path: &str,
) -> Result<tokio::task::JoinHandle<Result<(u16, String)>>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let Ok(addr) = format!("{ip}:{}", super::real::SERVICE_PORT).parse::<SocketAddr>() else {
        return Err(ClusterError(format!("{ip} is not an address")));
    };
    if !c.is_routed() {
        let (c, ip, host, path) = (c.clone(), ip.to_string(), host.to_string(), path.to_string());
        return Ok(tokio::spawn(async move { c.service_get_within(&ip, &host, &path, Duration::from_secs(60)).await }));
    }
    let mut s =
        tokio::net::TcpStream::connect(addr).await.map_err(|e| ClusterError::of("connect to the Service", e))?;
    s.write_all(req.as_bytes()).await.map_err(|e| ClusterError::of("send a slow request", e))?;
    Ok(tokio::spawn(async move {
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map_err(|e| ClusterError::of("read a slow answer", e))?;
        crate::net::parse_http_response(&buf).map_err(|e| ClusterError::of("a slow answer", e))
    }))
}

/// A rollout restart of the HAProxy pods while bounded sequential requests,
/// [`SLOW_REQUESTS`] requests the echo backend answers after 10 s and [`WEBSOCKETS`] websockets
/// exchanging a message every 200 ms run through the Service: a stopping HAProxy leaves the
/// Service first, then stops softly (the image's SIGUSR1) and finishes what it has, so every
/// request is answered 200, no slow one is cut, and every websocket goes on through the pod it
/// started on (an old one) after that pod began terminating, then closes cleanly.
async fn drain_on_rollout(c: &mut RealCluster, svc: &str) -> Result<()> {
    let ws_server = match c.host_address() {
        Some(ip) => Some(EchoServer::start(ip).await?),
        None => None,
    };
    let mut paths = vec![("/cgi-bin/", "Prefix", ECHO, json!({"number": 80}))];
    if let Some(server) = &ws_server {
        server.publish(c, WS).await?;
        paths.push(("/ws", "Prefix", WS, json!({"number": 80})));
    }
    put_ingress(c, &ingress("drain", DRAIN_HOST, &paths)).await?;
    // The first answer takes the script's 10 s: each try waits up to 30 s for its own.
    eventually("200 for the slow path through the HAProxy Service", Duration::from_secs(120), || async {
        let t = sent(c, svc, DRAIN_HOST, "/cgi-bin/slow").await.ok()?;
        match tokio::time::timeout(Duration::from_secs(30), t).await {
            Ok(Ok(Ok((200, b)))) if b.trim().starts_with("slow echo-") => Some(()),
            _ => None,
        }
    })
    .await?;
    let old_ips: BTreeSet<String> = c.haproxy_pod_ips().await?;
    let sockets = open_websockets(svc, ws_server.is_some()).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let load = start_load(c, svc.to_string(), ECHO_HOST, stop.clone(), seen.clone());
    let mut slow = Vec::new();
    for _ in 0..SLOW_REQUESTS {
        slow.push(sent(c, svc, DRAIN_HOST, "/cgi-bin/slow").await?);
    }
    let ws_stop = Arc::new(AtomicBool::new(false));
    let ws: Vec<_> = sockets.into_iter().map(|s| tokio::spawn(s.exchange(ws_stop.clone(), WS_AFTER_STOP))).collect();
    let restarted = c.replace_all_haproxy().await;
    // Every old pod is terminating now: the websockets go on into its soft stop, then close.
    ws_stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for t in slow {
        answers.push(t.await.map_err(|e| ClusterError::of("a slow request's task", e))?);
    }
    let mut exchanged = Vec::new();
    for t in ws {
        exchanged.push(t.await.map_err(|e| ClusterError::of("a websocket's task", e))?);
    }
    stop.store(true, Ordering::Relaxed);
    let bounded = load.await.map_err(|e| ClusterError::of("the load task", e))?;
    restarted?;
    let cut: Vec<String> = answers
        .iter()
        .filter(|a| !matches!(a, Ok((200, b)) if b.trim().starts_with("slow echo-")))
        .map(|a| format!("{a:?}"))
        .collect();
    ensure(cut.is_empty(), || format!("slow requests cut by the rollout: {cut:?}"))?;
    let messages = websockets_kept(&exchanged, &old_ips)?;
    let (ok_n, failed) = {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        (s.ok, s.failed.clone())
    };
    ensure(bounded && failed.is_empty() && ok_n > 0, || {
        format!("{ok_n} requests ok, {} failed: {:?}", failed.len(), &failed[..failed.len().min(10)])
    })?;
    delete_ingress(c, "drain").await?;
    let ws_line = match ws_server {
        Some(_) => format!(
            ", and {WEBSOCKETS} websockets ({messages} messages, every one echoed) each kept through its old pod's termination and closed cleanly"
        ),
        None => ", no websockets (kind: the host's address is not on the nodes' network)".into(),
    };
    ok(&format!(
        "ingress-drain: a rollout restart of the HAProxy pods under load: {ok_n} requests and {SLOW_REQUESTS} requests of 10 s through the Service, every one answered 200, none cut{ws_line}"
    ));
    Ok(())
}

/// [`WEBSOCKETS`] websockets to the drain host's `/ws` through the Service at `svc`, each with
/// its first message echoed; none when `enabled` is false.
async fn open_websockets(svc: &str, enabled: bool) -> Result<Vec<Open>> {
    if !enabled {
        return Ok(Vec::new());
    }
    // The first waits for the Ingress path to be served.
    let first = eventually("a websocket through the HAProxy Service", Duration::from_secs(90), || async {
        Open::new(svc, DRAIN_HOST, "/ws").await.ok()
    })
    .await?;
    let mut open = vec![first];
    for _ in 1..WEBSOCKETS {
        open.push(Open::new(svc, DRAIN_HOST, "/ws").await?);
    }
    Ok(open)
}

/// Every websocket exchanged all its messages through one of the pods replaced (`old_ips`);
/// returns the messages in all.
fn websockets_kept(exchanged: &[Result<Exchanged>], old_ips: &BTreeSet<String>) -> Result<usize> {
    let wrong: Vec<String> = exchanged
        .iter()
        .filter(|e| !matches!(e, Ok(x) if old_ips.contains(&x.pod_ip) && x.messages >= WS_AFTER_STOP))
        .map(|e| format!("{e:?}"))
        .collect();
    ensure(wrong.is_empty(), || format!("websockets cut or moved by the rollout (old pods {old_ips:?}): {wrong:?}"))?;
    Ok(exchanged.iter().filter_map(|e| e.as_ref().ok()).map(|x| x.messages + 1).sum())
}

async fn scale(c: &RealCluster, app: &str, n: usize) -> Result<()> {
    Api::<Deployment>::namespaced(c.client(), NAMESPACE)
        .patch_scale(app, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": n}})))
        .await
        .map_err(|e| ClusterError::of(&format!("scale the Deployment {app}"), e))?;
    Ok(())
}

/// What `kubectl rollout restart` does: a changed pod-template annotation.
async fn restart(c: &RealCluster, app: &str) -> Result<()> {
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": at.to_string()}}}}});
    Api::<Deployment>::namespaced(c.client(), NAMESPACE)
        .patch(app, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| ClusterError::of(&format!("restart the Deployment {app}"), e))?;
    Ok(())
}

/// The changes [`scale_under_load`] makes, in order: a name and the echo pods after it.
const SCALE_CHANGES: [(&str, usize); 3] = [("scale 2 -> 16", 16), ("scale 16 -> 1", 1), (RESTART, 1)];

/// The change that is a rollout restart, not a scale.
pub(super) const RESTART: &str = "rollout restart";

/// When each pod of Service `service` was first seen ready in one of its EndpointSlices: the
/// host's clock, by a watch that runs until the returned task is aborted.
fn watch_ready_endpoints(
    c: &RealCluster,
    service: &str,
) -> (tokio::task::JoinHandle<()>, Arc<Mutex<BTreeMap<String, Instant>>>) {
    use futures::StreamExt;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::runtime::{watcher, WatchStreamExt};
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let api = Api::<EndpointSlice>::namespaced(c.client(), NAMESPACE);
    let cfg = watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
    let into = seen.clone();
    let task = tokio::spawn(async move {
        let mut slices = watcher(api, cfg).default_backoff().applied_objects().boxed();
        while let Some(ev) = slices.next().await {
            let Ok(slice) = ev else { continue };
            let now = Instant::now();
            let mut seen = into.lock().unwrap_or_else(|e| e.into_inner());
            for e in &slice.endpoints {
                let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
                if let (true, Some(pod)) = (ready, e.target_ref.as_ref().and_then(|t| t.name.clone())) {
                    seen.entry(pod).or_insert(now);
                }
            }
        }
    });
    (task, seen)
}

/// What [`changes_under_load`] saw (it prints a line per change): the requests answered, and the
/// cost of all the changes together.
pub(super) struct UnderLoad {
    pub(super) ok: u64,
    pub(super) cost: Cost,
}

/// Makes each of `changes` (a scale of Deployment `app` to the count, or [`RESTART`]) under a
/// sequential load for `host` through `ip`, each once the last has settled (the pods as asked,
/// each current pod answered after the change, the fleet converged). Fails on any failed
/// request. Each change's line says how many new pods it brought, when the first and last
/// answered, and how long after its endpoint turned ready in the EndpointSlice of Service `app`
/// each new pod answered.
pub(super) async fn changes_under_load(
    c: &RealCluster,
    ip: &str,
    host: &'static str,
    app: &str,
    changes: &[(&str, usize)],
) -> Result<UnderLoad> {
    let client = c.client();
    let before = counters(c).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let load = start_load(c, ip.to_string(), host, stop.clone(), seen.clone());
    let (endpoints_watch, ready_at) = watch_ready_endpoints(c, app);
    let pods = c.haproxy_pods().await?.len();
    let made = async {
        let mut lines = Vec::new();
        for (change, n) in changes.iter().copied() {
            let at_start = counters(c).await?;
            let old: BTreeSet<String> = c
                .pods(&format!("app.kubernetes.io/name={app}"))
                .await?
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
            let plan = current_plan(c).await?;
            let t0 = Instant::now();
            if change == RESTART {
                restart(c, app).await?;
            } else {
                scale(c, app, n).await?;
            }
            // A rollout replaces every pod; a scale keeps the pods that stay.
            let keep = if change == RESTART { BTreeSet::new() } else { old.clone() };
            let now = settled(c, app, n, &old.difference(&keep).cloned().collect()).await?;
            // Each current pod answered after the change, and the fleet runs the render of it.
            eventually(&format!("every {app} pod to answer after `{change}`"), Duration::from_secs(120), || async {
                let s = seen.lock().unwrap_or_else(|e| e.into_inner());
                now.iter().all(|p| s.by.get(p).is_some_and(|(_, last)| *last > t0)).then_some(())
            })
            .await?;
            wait_converged(&client, NAMESPACE, pods, Some(&plan)).await?;
            let cost = Cost::of(&at_start, &counters(c).await?)?;
            let fresh: BTreeSet<String> = now.difference(&old).cloned().collect();
            let firsts: BTreeMap<String, Instant> = {
                let s = seen.lock().unwrap_or_else(|e| e.into_inner());
                fresh.iter().filter_map(|p| Some((p.clone(), s.by.get(p)?.0))).collect()
            };
            let after = |i: &Instant| i.duration_since(t0).as_secs_f64();
            let mut line = format!("`{change}`: {} new pod(s)", fresh.len());
            if let (Some(first), Some(last)) = (firsts.values().min(), firsts.values().max()) {
                // Each new pod: from its endpoint first seen ready to its first answer (the
                // sequential load reaches a new server within one round over the backend).
                let ready_at = ready_at.lock().unwrap_or_else(|e| e.into_inner());
                let mut since_ready: Vec<f64> = firsts
                    .iter()
                    .filter_map(|(p, f)| Some(f.saturating_duration_since(*ready_at.get(p)?).as_secs_f64()))
                    .collect();
                since_ready.sort_by(f64::total_cmp);
                let (Some(median), Some(most)) = (since_ready.get(since_ready.len() / 2), since_ready.last()) else {
                    return Err(ClusterError(format!("`{change}`: no new pod was seen ready in an EndpointSlice")));
                };
                line.push_str(&format!(
                    "; first answered {:.1} s, last {:.1} s after the change; from ready in the EndpointSlice to answering: median {:.2} s, at most {:.2} s",
                    after(first),
                    after(last),
                    median,
                    most
                ));
            }
            lines.push(format!("{line}; {}", cost.line()));
        }
        Ok::<_, ClusterError>(lines)
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    endpoints_watch.abort();
    let finished = load.await.map_err(|e| ClusterError::of("the load task", e))?;
    let lines = made?;
    ensure(finished, || "the load hit its bound (400 000 requests or 600 s) before the changes settled".into())?;
    let (ok_n, failed) = {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        (s.ok, s.failed.clone())
    };
    ensure(failed.is_empty() && ok_n > 0, || {
        format!("{ok_n} requests ok, {} failed: {:?}", failed.len(), &failed[..failed.len().min(10)])
    })?;
    let cost = Cost::of(&before, &counters(c).await?)?;
    for l in &lines {
        println!("   {l}");
    }
    println!("   in all: {}", cost.line());
    Ok(UnderLoad { ok: ok_n, cost })
}

/// Scale 2 → 16 → 1 and a rollout restart under load: 0 failed requests, 0 reloads; the growth
/// past [`SLOTS`] is `server.add`.
async fn scale_under_load(c: &mut RealCluster, svc: &str) -> Result<()> {
    let UnderLoad { ok: ok_n, cost, .. } = changes_under_load(c, svc, ECHO_HOST, ECHO, &SCALE_CHANGES).await?;
    cost.expect_reloads("scale 2 -> 16 -> 1 and a rollout restart", 0.0)?;
    ensure(cost.ops.get("server.add").copied().unwrap_or(0.0) > 0.0, || {
        format!("16 endpoints in {SLOTS} slots grew without server.add: {}", cost.line())
    })?;
    wait_load_balancer(c, ECHO, svc).await?;
    ok(&format!(
        "echo scaled 2 -> 16 -> 1 and rolled under load: {ok_n} requests, 0 failed, 0 reloads, worker pids unchanged, growth past {SLOTS} slots by server.add"
    ));
    Ok(())
}

/// Two Ingresses on one host, both paths served; a path added and removed is runtime; the first
/// use of a Service (a new backend) and the removal of its last path cost what they cost.
async fn two_on_one_host(c: &mut RealCluster, svc: &str) -> Result<()> {
    let host = "shared.example";
    let before = counters(c).await?;
    let plan = current_plan(c).await?;
    put_ingress(c, &ingress("shared-a", host, &[("/a", "Prefix", ECHO, json!({"number": 80}))])).await?;
    put_ingress(c, &ingress("shared-b", host, &[("/b", "Prefix", ECHO, json!({"name": "http"}))])).await?;
    answered(c, svc, host, "/a/", |b| b.starts_with("a echo-")).await?;
    answered(c, svc, host, "/b/", |b| b.starts_with("b echo-")).await?;
    answers_code(c, svc, host, "/c/", 404).await?;
    wait_load_balancer(c, "shared-a", svc).await?;
    wait_load_balancer(c, "shared-b", svc).await?;
    delete_ingress(c, "shared-b").await?;
    answers_code(c, svc, host, "/b/", 404).await?;
    answered(c, svc, host, "/a/", |b| b.starts_with("a echo-")).await?;
    wait_converged(&c.client(), NAMESPACE, 2, Some(&plan)).await?;
    let cost = Cost::of(&before, &counters(c).await?)?;
    println!("   two Ingresses on {host} (/a by port number, /b by port name), then /b removed: {}", cost.line());
    cost.expect_reloads("two Ingresses on one host over an existing backend, then one removed", 0.0)?;

    // A path to another Service: a new backend, added at runtime by the image's HAProxy 3.4
    // (`backend.add`). Then its last path goes. All under load on another host.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let load = start_load(c, svc.to_string(), ECHO_HOST, stop.clone(), seen.clone());
    let changes = async {
        let before = counters(c).await?;
        let plan = current_plan(c).await?;
        put_ingress(c, &ingress("other", "other.example", &[("/", "Prefix", ECHO2, json!({"number": 80}))])).await?;
        answered(c, svc, "other.example", "/", |b| b.starts_with("echo-")).await?;
        wait_converged(&c.client(), NAMESPACE, 2, Some(&plan)).await?;
        let added = Cost::of(&before, &counters(c).await?)?;
        println!("   a path to a second Service (its first use): {}", added.line());
        let before = counters(c).await?;
        let plan = current_plan(c).await?;
        delete_ingress(c, "other").await?;
        answers_code(c, svc, "other.example", "/", 404).await?;
        wait_converged(&c.client(), NAMESPACE, 2, Some(&plan)).await?;
        let removed = Cost::of(&before, &counters(c).await?)?;
        println!("   the last path to that Service removed: {}", removed.line());
        Ok::<_, ClusterError>((added, removed))
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    let finished = load.await.map_err(|e| ClusterError::of("the load task", e))?;
    let (added, removed) = changes?;
    let (ok_n, failed) = {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        (s.ok, s.failed.clone())
    };
    ensure(finished && ok_n > 0 && failed.is_empty(), || {
        format!("load on {ECHO_HOST} while a Service came and went: {ok_n} ok, {} failed: {failed:?}", failed.len())
    })?;
    added.expect_reloads("the first path to a second Service (HAProxy 3.4: backend.add)", 0.0)?;
    ensure(added.ops.get("backend.add").copied().unwrap_or(0.0) >= 2.0, || {
        format!("a new Service's backend on 2 pods without backend.add: {}", added.line())
    })?;
    removed.expect_reloads("the last path to a Service removed", 0.0)?;
    ok(&format!(
        "two Ingresses on one host both served (0 reloads over an existing backend); a new Service's first path 0 reloads (backend.add), its removal 0; {ok_n} requests on {ECHO_HOST} meanwhile, 0 failed"
    ));
    Ok(())
}

/// The plan the status names now (changes wait until the fleet converged on another one).
pub(super) async fn current_plan(c: &RealCluster) -> Result<Value> {
    Ok(status(&c.client(), NAMESPACE).await?["planId"].clone())
}

/// A TLS Ingress for two hosts, each with its own certificate from a test CA: each served by SNI
/// on the Service's HTTPS port with the certificate for its name.
async fn tls_by_sni(c: &mut RealCluster, svc: &str) -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| ClusterError::of("temp dir", e))?;
    let hosts = ["secure-a.example", "secure-b.example"];
    crate::tls::make_ca(dir.path(), "unused");
    let secrets: Api<Secret> = Api::namespaced(c.client(), NAMESPACE);
    for (i, h) in hosts.iter().enumerate() {
        let name = format!("tls-{i}");
        crate::tls::make_host_cert(dir.path(), &name, h);
        let read = |f: String| std::fs::read(dir.path().join(f)).map_err(|e| ClusterError::of("read a test cert", e));
        let obj = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "kubernetes.io/tls",
                         "data": {"tls.crt": base64(&read(format!("{name}.pem"))?), "tls.key": base64(&read(format!("{name}.key"))?)}});
        secrets
            .patch(&name, &apply_params(), &Patch::Apply(&obj))
            .await
            .map_err(|e| ClusterError::of("apply a TLS Secret", e))?;
    }
    let before = counters(c).await?;
    let rules: Vec<Value> = hosts
        .iter()
        .map(|h| {
            json!({"host": h, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                   "backend": {"service": {"name": ECHO, "port": {"number": 80}}}}]}})
        })
        .collect();
    let obj = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "secure"},
        "spec": {"ingressClassName": CLASS, "rules": rules,
                 "tls": [{"hosts": [hosts[0]], "secretName": "tls-0"}, {"hosts": [hosts[1]], "secretName": "tls-1"}]}});
    let plan = current_plan(c).await?;
    put_ingress(c, &obj).await?;
    let ca = std::fs::read(dir.path().join("ca.pem")).map_err(|e| ClusterError::of("read the CA", e))?;
    let ca = reqwest::Certificate::from_pem(&ca).map_err(|e| ClusterError::of("the CA", e))?;
    let ip: std::net::IpAddr = svc.parse().map_err(|e| ClusterError::of("the Service IP", e))?;
    for h in hosts {
        let client = reqwest::Client::builder()
            .tls_backend_rustls()
            .tls_certs_only([ca.clone()])
            .resolve(h, SocketAddr::new(ip, HTTPS_PORT))
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| ClusterError::of("a TLS client", e))?;
        let url = format!("https://{h}/");
        // Verified against the test CA for the name `h`: HAProxy chose that host's certificate.
        eventually(&format!("200 over TLS for {h} (SNI {h})"), Duration::from_secs(90), || async {
            let r = client.get(&url).send().await.ok()?;
            let code = r.status().as_u16();
            let body = r.text().await.ok()?;
            (code == 200 && body.trim().starts_with("echo-")).then_some(())
        })
        .await?;
    }
    wait_converged(&c.client(), NAMESPACE, 2, Some(&plan)).await?;
    wait_load_balancer(c, "secure", svc).await?;
    let cost = Cost::of(&before, &counters(c).await?)?;
    println!("   a TLS Ingress with two hosts and two certificates (the first TLS Ingress): {}", cost.line());
    ok("a TLS Ingress: each host served by SNI with its own certificate (verified against the test CA)");
    if c.is_routed() {
        tls_edge_defaults(c, svc, hosts[0], &dir.path().join("ca.pem")).await?;
    }
    Ok(())
}

/// Render mode's TLS defaults, from the host (the Service is routed here; curl and openssl are
/// the clients): h2 offered by ALPN and answered over h2, `X-Forwarded-Proto: https` at the
/// backend, `http://` to a TLS host redirected to `https://` with 308, and an unknown SNI answered
/// with the default certificate, never a tenant's.
async fn tls_edge_defaults(c: &RealCluster, svc: &str, host: &str, ca: &std::path::Path) -> Result<()> {
    let resolve = format!("{host}:{HTTPS_PORT}:{svc}");
    let curl = |extra: &[&str], path: &str| {
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "--cacert"]).arg(ca).args(["--resolve", &resolve]).args(extra);
        run(cmd.arg(format!("https://{host}{path}")))
    };
    let version = curl(&["--http2", "-o", "/dev/null", "-w", "%{http_version}"], "/")?;
    ensure(version == "2", || format!("an h2 request over TLS was answered over HTTP/{version}"))?;
    let headers = curl(&[], "/cgi-bin/headers")?;
    ensure(headers.contains("proto=https "), || format!("the backend got {headers:?} over TLS"))?;
    let (code, _) = c.service_get(svc, host, "/").await?;
    ensure(code == 308, || format!("http:// to the TLS host {host} answered {code}, not a 308 redirect"))?;
    let mut s_client = std::process::Command::new("openssl");
    s_client.args(["s_client", "-connect", &format!("{svc}:{HTTPS_PORT}"), "-servername", "unknown.example"]);
    let seen = run(&mut s_client)?;
    let subject = seen.lines().find(|l| l.starts_with("subject=")).unwrap_or_default().to_string();
    ensure(!subject.is_empty() && !subject.contains("secure-"), || {
        format!("an unknown SNI was answered with {subject:?}, not the default certificate")
    })?;
    ok(&format!(
        "TLS defaults: h2 by ALPN, X-Forwarded-Proto https at the backend, http:// redirected with 308, an unknown SNI gets the default certificate ({subject})"
    ));
    Ok(())
}

/// `GET path` for [`ECHO_HOST`] through the Service at `svc`, with a forged `X-Forwarded-For`
/// where the host reaches the Service (else through a node, without one).
async fn forged_get(c: &RealCluster, svc: &str, path: &str) -> Result<(u16, String)> {
    if !c.is_routed() {
        return c.service_get(svc, ECHO_HOST, path).await;
    }
    let addr: SocketAddr =
        format!("{svc}:{}", super::real::SERVICE_PORT).parse().map_err(|e| ClusterError::of("the Service", e))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {ECHO_HOST}\r\nX-Forwarded-For: {FORGED_CLIENT}\r\nConnection: close\r\n\r\n"
    );
    crate::net::http_request_within(addr, &req, Duration::from_secs(30))
        .await
        .map_err(|e| ClusterError::of("a request with a forged X-Forwarded-For", e))
}

/// Requests sent by [`edge_defaults`], each logged once.
const LOGGED_REQUESTS: usize = 10;

/// A forged `X-Forwarded-For` the edge step's client sends: never passed on.
const FORGED_CLIENT: &str = "203.0.113.66";

/// Render mode's HTTP defaults through the HAProxy Service: the backend is told, in
/// `X-Forwarded-For`, the address HAProxy's client connected from (the one its access log names;
/// off the cluster that is kube-proxy's, which masquerades traffic to a ClusterIP), never one the
/// client forged, with the scheme, host and port the client used; HAProxy's access log on its
/// standard output has one line per request; and every port the chart's PodMonitor names answers
/// `/metrics` on every HAProxy pod.
async fn edge_defaults(c: &RealCluster, svc: &str) -> Result<()> {
    let tag = format!("edge{}", std::process::id());
    let want = format!("proto=http host={ECHO_HOST} port={}", super::real::SERVICE_PORT);
    let mut told = Vec::new();
    for i in 0..LOGGED_REQUESTS {
        let path = format!("/cgi-bin/headers?{tag}-{i}");
        let (code, body) = forged_get(c, svc, &path).await?;
        let xff = body.strip_prefix("xff=").and_then(|b| b.split(' ').next()).unwrap_or_default().to_string();
        let one_address = xff.parse::<std::net::IpAddr>().is_ok() && xff != FORGED_CLIENT;
        ensure(code == 200 && one_address && body.contains(&want), || {
            format!("request {i}: {code} {body:?} (wanted one address, not the forged {FORGED_CLIENT}, and {want})")
        })?;
        told.push(xff);
    }
    let pods = c.haproxy_pods().await?;
    let logs: Api<Pod> = Api::namespaced(c.client(), NAMESPACE);
    eventually("one access-log line per request", Duration::from_secs(60), || async {
        let mut text = String::new();
        for p in &pods {
            let lp = kube::api::LogParams { container: Some("haproxy".into()), ..Default::default() };
            text.push_str(&logs.logs(p, &lp).await.ok()?);
        }
        // One line per request, naming the client address the backend was told.
        let logged = |(i, xff): (usize, &String)| {
            let lines: Vec<&str> = text.lines().filter(|l| l.contains(&format!("?{tag}-{i} "))).collect();
            lines.len() == 1 && lines[0].starts_with(&format!("{xff}:"))
        };
        told.iter().enumerate().all(logged).then_some(())
    })
    .await?;
    for p in &pods {
        let get = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".to_string();
        let (code, body) = c.to_pod(p, METRICS_PORT, get).await?;
        ensure(code == 200 && body.contains("haproxy_process_"), || {
            format!("{p}: port metrics ({METRICS_PORT}) answered {code}")
        })?;
        let agent = c.agent_metrics(p).await?;
        ensure(agent.contains("haptic_agent_"), || format!("{p}: port agent's /metrics has no haptic_agent_ series"))?;
    }
    ok(&format!(
        "HTTP defaults: on {LOGGED_REQUESTS} requests X-Forwarded-For is the client address HAProxy saw ({}), not the forged one, with -Proto, -Host, -Port as the client asked; one access-log line each, naming that address; the PodMonitor's ports (metrics, agent) answer on {} pods",
        told.first().map(String::as_str).unwrap_or_default(),
        pods.len()
    ));
    Ok(())
}

/// An Ingress whose backend Service does not exist answers 503 and gets a Warning Event.
async fn missing_service(c: &mut RealCluster, svc: &str) -> Result<()> {
    let before = counters(c).await?;
    let plan = current_plan(c).await?;
    put_ingress(
        c,
        &ingress("missing", "missing.example", &[("/", "Prefix", "no-such-service", json!({"number": 80}))]),
    )
    .await?;
    answers_code(c, svc, "missing.example", "/", 503).await?;
    let note = warning_event(c, "missing", "IngressWarning", "no-such-service").await?;
    // Everything else keeps serving.
    answered(c, svc, ECHO_HOST, "/", |b| b.starts_with("echo-")).await?;
    wait_converged(&c.client(), NAMESPACE, 2, Some(&plan)).await?;
    wait_load_balancer(c, "missing", svc).await?;
    let cost = Cost::of(&before, &counters(c).await?)?;
    println!("   an Ingress to a missing Service: {}", cost.line());
    ok(&format!("an Ingress to a missing Service answers 503; Warning IngressWarning: {note}"));
    Ok(())
}

/// An Ingress naming a port its Service lacks is refused (404 for its host, a Warning Event); an
/// Ingress created after it is served.
async fn refused_then_another(c: &mut RealCluster, svc: &str) -> Result<()> {
    let before = counters(c).await?;
    let plan = current_plan(c).await?;
    put_ingress(c, &ingress("refused", "refused.example", &[("/", "Prefix", ECHO, json!({"number": 9999}))])).await?;
    let note = warning_event(c, "refused", "IngressRefused", "9999").await?;
    answers_code(c, svc, "refused.example", "/", 404).await?;
    put_ingress(c, &ingress("after", "after.example", &[("/", "Prefix", ECHO, json!({"number": 80}))])).await?;
    answered(c, svc, "after.example", "/", |b| b.starts_with("echo-")).await?;
    answers_code(c, svc, "refused.example", "/", 404).await?;
    wait_converged(&c.client(), NAMESPACE, 2, Some(&plan)).await?;
    wait_load_balancer(c, "after", svc).await?;
    let cost = Cost::of(&before, &counters(c).await?)?;
    println!("   a refused Ingress, then another one: {}", cost.line());
    cost.expect_reloads("a refused Ingress and a new host over an existing backend", 0.0)?;
    ok(&format!("a refused Ingress (Warning IngressRefused: {note}) does not stop one created after it (200)"));
    Ok(())
}

async fn clean_up(c: &RealCluster) -> Result<()> {
    let client = c.client();
    let dp = DeleteParams::default();
    let lp = ListParams::default();
    let ings: Api<Ingress> = Api::namespaced(client.clone(), NAMESPACE);
    for i in ings.list(&lp).await.map_err(|e| ClusterError::of("list Ingresses", e))?.items {
        let _ = ings.delete(i.metadata.name.as_deref().unwrap_or_default(), &dp).await;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    for name in ["tls-0", "tls-1"] {
        let _ = secrets.delete(name, &dp).await;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    for name in [ECHO, ECHO2, WS] {
        let _ = services.delete(name, &dp).await;
    }
    let _ = Api::<EndpointSlice>::namespaced(client.clone(), NAMESPACE).delete(WS, &dp).await;
    let _ = Api::<Deployment>::namespaced(client.clone(), NAMESPACE).delete(ECHO, &dp).await;
    let s = status(&client, NAMESPACE).await?;
    println!("   after the Ingress steps:\n{}", status_table(&s));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_summed_by_one_label() {
        let text = "# HELP x\n\
                    haptic_agent_applies_total{mode=\"runtime\",result=\"ok\"} 3\n\
                    haptic_agent_applies_total{mode=\"runtime\",result=\"failed\"} 1\n\
                    haptic_agent_applies_total{mode=\"reload\",result=\"ok\"} 2\n\
                    haptic_agent_applies_total_other{mode=\"reload\"} 9\n\
                    haptic_agent_pending_reload 0\n";
        let by = samples_by(text, "haptic_agent_applies_total", "mode");
        assert_eq!(by, BTreeMap::from([("reload".to_string(), 2.0), ("runtime".to_string(), 4.0)]));
        assert_eq!(samples_by(text, "haptic_agent_pending_reload", ""), BTreeMap::from([(String::new(), 0.0)]));
    }
}
