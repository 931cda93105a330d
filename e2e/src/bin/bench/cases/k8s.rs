//! `k8s_runtime`: an endpoint change in a ConfigMap → every pod converged, through a real
//! `haptic-controller run --kubernetes` on the local control plane (`haptic_e2e::k8s`: etcd +
//! kube-apiserver on loopback, pods run by the kubelet stand-in), against the standalone
//! `fleet_runtime` of the same run plus one watch event's delay, which is measured here too (the
//! bench's own watch on the same ConfigMap: patch sent → event received). It must never talk
//! to anything but 127.0.0.1, and it spawns the controller binary (never links it).

use std::time::{Duration, Instant};

use futures::StreamExt;
use haptic_e2e::free_port;
use haptic_e2e::k8s::{ControlPlane, LocalPods, LocalPodsOpts};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::GroupVersionKind;
use kube::Client;
use serde_json::json;

use super::Ctx;
use crate::error::{BenchError, Result};
use crate::fleet_kit::{sibling_bin, Controller, SETTLE};
use crate::floor::parse_server_addr;
use crate::proc_mem::{mib, rss};
use crate::report::Row;
use crate::stats::Samples;

pub(super) const NS: &str = "bench";
pub(super) const USER: &str = "bench";
pub(super) const PASSWORD: &str = "bench-k8s-secret";
/// Servers of `be_app` the changes move.
const SERVERS: usize = 10;
/// Backends in the config (the same size as the standalone fleet's).
const BACKENDS: usize = 20;

pub(super) fn kerr(what: &str) -> impl FnOnce(kube::Error) -> BenchError + '_ {
    move |e| BenchError::Kubernetes(format!("{what}: {e}"))
}

/// The config every pod loads: its frontend on `${POD_IP}:fe`, `be_0/s<k>` on `ports[k]`.
fn cfg_text(fe: u16, ports: &[u16]) -> String {
    let mut out = format!(
        "global\n    default-path config\n\n\
         defaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\n\
         frontend fe_main\n    bind \"${{POD_IP}}:{fe}\"\n    default_backend be_0\n"
    );
    for b in 0..BACKENDS {
        out.push_str(&format!("\nbackend be_{b}\n    balance roundrobin\n"));
        for (s, port) in ports.iter().enumerate().take(SERVERS) {
            let port = if b == 0 { *port } else { 9 };
            out.push_str(&format!("    server s{s} 127.0.0.1:{port} weight 100\n"));
        }
    }
    out
}

async fn put_cfg(client: &Client, text: String) -> Result<String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "edge-cfg"},
                    "data": {"haproxy.cfg": text}});
    let got = api
        .patch("edge-cfg", &PatchParams::apply("haptic-bench").force(), &Patch::Apply(&cm))
        .await
        .map_err(kerr("patch ConfigMap"))?;
    Ok(got.metadata.resource_version.unwrap_or_default())
}

/// The HAProxyConfig CRD, the namespace [`NS`] and the agents' credentials Secret.
pub(super) async fn setup(client: &Client) -> Result<()> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/haptic/crds/haproxyconfig.yaml");
    let text = std::fs::read_to_string(path).map_err(BenchError::io(format!("read {path}")))?;
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&text).map_err(|e| BenchError::Kubernetes(format!("parse the CRD: {e}")))?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.map_err(kerr("create the CRD"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = crds.get("haproxyconfigs.haptic.dev").await.map_err(kerr("get the CRD"))?;
        let ok = c
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
        if ok {
            break;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Timeout("the HAProxyConfig CRD was not established".into()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NS}})).map_err(|e| BenchError::Unexpected(e.to_string()))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map_err(kerr("create namespace"))?;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "haptic-agent-credentials"},
                        "stringData": {"username": USER, "password": PASSWORD}});
    Api::<Secret>::namespaced(client.clone(), NS)
        .patch("haptic-agent-credentials", &PatchParams::apply("haptic-bench").force(), &Patch::Apply(&secret))
        .await
        .map_err(kerr("put the Secret"))?;
    Ok(())
}

/// The local control plane with [`setup`] done and `ctx.pods` pods run by the kubelet stand-in
/// (agents built from this checkout, a 2 s minimum reload interval). Dropped in reverse order
/// (pods before the control plane), everything stops.
pub(super) async fn local_fleet(ctx: &Ctx) -> Result<(ControlPlane, Client, LocalPods)> {
    let cp = ControlPlane::start().await.map_err(|e| BenchError::Kubernetes(format!("control plane: {e}")))?;
    let client = cp.client().await.map_err(|e| BenchError::Kubernetes(e.to_string()))?;
    setup(&client).await?;
    let mut opts = LocalPodsOpts::new(NS, ctx.bin.clone(), USER, PASSWORD);
    opts.pod.agent_bin = Some(sibling_bin("haptic-agent", "HAPTIC_AGENT_BIN")?);
    opts.pod.min_reload_interval = "2s".into();
    let mut pods = LocalPods::new(client.clone(), opts);
    pods.create(ctx.pods).await.map_err(|e| BenchError::Kubernetes(format!("local pods: {e}")))?;
    Ok((cp, client, pods))
}

/// The bench's own watch on some objects: when each new resourceVersion (an object added or
/// modified) arrived. The watching task ends when this is dropped.
pub(super) struct VersionWatch {
    rx: tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    task: tokio::task::JoinHandle<()>,
}

impl VersionWatch {
    /// Watches the objects of `api` matching the field selector `fields` (none when empty)
    /// from resourceVersion `from`.
    pub(super) async fn start<K>(api: &Api<K>, fields: &str, from: &str) -> Result<Self>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let mut wp = WatchParams::default().timeout(290);
        if !fields.is_empty() {
            wp = wp.fields(fields);
        }
        let stream = api.watch(&wp, from).await.map_err(kerr("watch"))?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                if let Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) = ev {
                    let _ = tx.send((o.meta().resource_version.clone().unwrap_or_default(), Instant::now()));
                }
            }
        });
        Ok(Self { rx, task })
    }

    /// When resourceVersion `rv` arrived (events before it are passed over); `None` when no
    /// event brings it within 5 s.
    pub(super) async fn seen(&mut self, rv: &str) -> Option<Instant> {
        while let Ok(Some((v, at))) = tokio::time::timeout(Duration::from_secs(5), self.rx.recv()).await {
            if v == rv {
                return Some(at);
            }
        }
        None
    }
}

impl Drop for VersionWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn create_config(client: &Client, agent_port: u16) -> Result<()> {
    let gvk = GroupVersionKind::gvk("haptic.dev", "v1alpha1", "HAProxyConfig");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "haproxyconfigs");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig",
        "metadata": {"name": "edge", "namespace": NS},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
            "configFrom": {"configMapKeyRef": {"name": "edge-cfg", "key": "haproxy.cfg"}},
            "agent": {"port": agent_port},
            "controller": {"maxParallel": 16},
        },
    }))
    .map_err(|e| BenchError::Unexpected(e.to_string()))?;
    api.create(&PostParams::default(), &obj).await.map_err(kerr("create the HAProxyConfig"))?;
    Ok(())
}

/// Runs `k8s_runtime` with `standalone` (the same run's `fleet_runtime` p50 in ms) as the base.
pub async fn run(ctx: &Ctx, standalone: Option<f64>) -> Result<Vec<Row>> {
    let (cp, client, pods) = local_fleet(ctx).await?;
    let n = ctx.pods;
    let fe = free_port();
    let (up_a, up_b) = (free_port(), free_port());
    let mut ports = vec![up_a; SERVERS];
    put_cfg(&client, cfg_text(fe, &ports)).await?;
    create_config(&client, pods.agent_port()).await?;
    let tmp = tempfile::Builder::new().prefix("haptic-bench-k8s-").tempdir().map_err(BenchError::io("tempdir"))?;
    let mut ctl = Controller::start_kubernetes(&ctx.bin, tmp.path(), cp.kubeconfig(), NS, "edge")?;
    let (_, mut target) = ctl.wait_converged_off(None, n, Duration::from_secs(120)).await?;

    // The bench's own watch on the ConfigMap: when each new resourceVersion arrives.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let current =
        cms.get("edge-cfg").await.map_err(kerr("get ConfigMap"))?.metadata.resource_version.unwrap_or_default();
    let mut watcher = VersionWatch::start(&cms, "metadata.name=edge-cfg", &current).await?;

    let (mut h, mut watch, mut wrong) = (Samples::new(), Samples::new(), Vec::new());
    for i in 0..ctx.warmup() + ctx.reps() {
        let k = i % SERVERS;
        ports[k] = if ports[k] == up_a { up_b } else { up_a };
        let t = Instant::now();
        let rv = put_cfg(&client, cfg_text(fe, &ports)).await?;
        let (done, new_target) = ctl.wait_converged_off(Some(&target), n, Duration::from_secs(60)).await?;
        let took = done - t;
        target = new_target;
        // The watch event for this version (it has arrived: the controller saw it too).
        let seen = watcher.seen(&rv).await;
        for name in pods.names() {
            let Some(pod) = pods.pod(&name) else { continue };
            match pod.haproxy().worker_cmd("show servers state be_0").await {
                Ok(text) if parse_server_addr(&text, &format!("s{k}")) == Some(("127.0.0.1".into(), ports[k])) => {}
                Ok(_) => wrong.push(format!("change {i}: {name} does not serve be_0/s{k} on port {}", ports[k])),
                Err(e) => wrong.push(format!("change {i}: {name}: {e}")),
            }
        }
        if i >= ctx.warmup() {
            h.push_ms(took);
            match seen {
                Some(at) => watch.push_ms(at.saturating_duration_since(t)),
                None => wrong.push(format!("change {i}: the bench's watch never saw resourceVersion {rv}")),
            }
        }
    }
    drop(watcher);
    drop(ctl);
    let mut rows = Vec::new();
    let base = standalone.map(|s| s + watch.p50().unwrap_or(0.0));
    let mut r = Row::repeated("k8s_runtime", &format!("{n} pods"), &ctx.label, &h, None, "ms").verified(&wrong);
    if let Some(b) = base {
        r = r.with_floor(b).goal_ratio(1.5);
    }
    r.add_note(format!(
        "ConfigMap patch -> every pod converged (controller --settle {SETTLE}); floor: standalone fleet_runtime p50 {} + watch delay p50 {:.2} ms",
        standalone.map_or("(not run)".to_string(), |s| format!("{s:.2} ms")),
        watch.p50().unwrap_or(0.0)
    ));
    rows.push(r);
    let mut r = Row::repeated("k8s_runtime", "watch event delay", &ctx.label, &watch, None, "ms");
    r.add_note("the bench's own watch on the ConfigMap: patch sent -> its Modified event received");
    rows.push(r);
    drop(pods);
    drop(cp);
    Ok(rows)
}

/// Each pod's HAProxy resident memory (master + current worker), MiB.
pub(super) async fn haproxy_mib(pods: &LocalPods) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for n in pods.names() {
        let Some(pod) = pods.pod(&n) else { continue };
        let h = pod.haproxy();
        let worker = h.show_info().await?.pid();
        out.push(mib([Some(h.master_pid()), worker].into_iter().flatten().filter_map(rss).sum()));
    }
    Ok(out)
}

/// MiB figures to one decimal, for a note.
pub(super) fn rounded(v: &[f64]) -> Vec<f64> {
    v.iter().map(|m| (m * 10.0).round() / 10.0).collect()
}
