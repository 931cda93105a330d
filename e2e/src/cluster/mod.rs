//! The e2e suite's view of a Kubernetes cluster running haptic: one small [`Cluster`] trait,
//! two backends.
//!
//! - [`local::LocalCluster`] (default): the local control plane (`ControlPlane`), HAProxy pods
//!   run by the kubelet stand-in (`LocalPods`) and two `haptic-controller run --kubernetes`
//!   processes, all on loopback.
//! - [`real::RealCluster`]: a real cluster reached through a kubeconfig, our images loaded, the
//!   chart installed by helm: made by `scripts/cluster.sh` on this machine
//!   (`HAPTIC_E2E_CLUSTER=real`) or by kind (`HAPTIC_E2E_CLUSTER=kind`, `scripts/e2e-kind.sh`).
//!   [`real_scenarios`] adds what only a real cluster can show, [`real_ingress`] render mode there.
//!
//! Scenarios (`e2e/tests/scenarios.rs`) call only the trait and the helpers here, which talk to
//! the apiserver like a user would (ConfigMap, Secret, `HAProxyConfig` as plain JSON: this
//! crate never links the controller). Nothing here may reach beyond 127.0.0.0/8 on the local
//! backend.

pub mod local;
pub mod real;
pub mod real_gateway;
pub mod real_hostile;
pub mod real_ingress;
pub mod real_scenarios;
pub mod real_scope;
pub mod real_steps;
pub mod real_tenants;
pub mod real_tls;
pub mod real_websocket;
pub mod scenarios;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;
use serde_json::{json, Value};

/// The name of the `HAProxyConfig` every scenario drives.
pub const CONFIG: &str = "edge";
/// The ConfigMap holding `haproxy.cfg` and `hosts.map`.
pub const CONFIG_MAP: &str = "edge-cfg";

/// What went wrong talking to a cluster.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClusterError(pub String);

impl ClusterError {
    /// Wraps any displayable error with what was being done.
    pub fn of(what: &str, e: impl std::fmt::Display) -> Self {
        ClusterError(format!("{what}: {e}"))
    }
}

/// A result of a cluster operation.
pub type Result<T> = std::result::Result<T, ClusterError>;

/// A cluster running haptic, as the scenarios see it.
#[allow(async_fn_in_trait)]
pub trait Cluster {
    /// A client with rights to the test namespace.
    fn client(&self) -> Client;
    /// The namespace of the HAProxy pods, the controller and the resource.
    fn namespace(&self) -> &str;
    /// The HAProxy frontend's `bind` line for the scenarios' configs (each backend knows where
    /// its pods can listen).
    fn bind_line(&self) -> String;
    /// A `frontend` answering `/healthz` and `/ready` where the pods' probes need one.
    fn health_frontend(&self) -> Option<String> {
        None
    }
    /// The HAProxy pods' names, sorted.
    async fn haproxy_pods(&self) -> Result<Vec<String>>;
    /// Sets the number of HAProxy pods and waits until that many exist (not converged).
    async fn scale_haproxy(&mut self, n: usize) -> Result<()>;
    /// Replaces every HAProxy pod (a rolling update of the Deployment on a real cluster).
    async fn replace_all_haproxy(&mut self) -> Result<()>;
    /// `GET path` through one pod's frontend → `(status, body)`.
    async fn get(&self, pod: &str, path: &str) -> Result<(u16, String)>;
    /// The pod agent's `GET /v1/state` (as JSON).
    async fn agent_state(&self, pod: &str) -> Result<Value>;
    /// Kills the agent container; the kubelet (or its stand-in) restarts it.
    async fn restart_agent(&mut self, pod: &str) -> Result<()>;
    /// Kills HAProxy's worker process (the master exits with it); the container restarts.
    async fn kill_haproxy_worker(&mut self, pod: &str) -> Result<()>;
    /// Overwrites a file in the pod's live config tree behind the agent's back.
    async fn edit_file_in_pod(&self, pod: &str, path: &str, content: &str) -> Result<()>;
    /// Kills the controller replica holding the Lease; returns its identity.
    async fn kill_leader(&mut self) -> Result<String>;
}

/// The scenarios' config: a frontend answering `/hello` with `body`, a map routed on `/route`,
/// and `be_app` with one server slot per port in `servers`.
pub fn config_text(bind: &str, body: &str, servers: &[u16], timeout_client: u32) -> String {
    let mut s = format!(
        "global\n    default-path config\n\n\
         defaults\n    mode http\n    timeout connect 2s\n    timeout client {timeout_client}s\n    timeout server 5s\n\n\
         frontend fe_main\n    {bind}\n\
         \x20   http-request return status 200 content-type text/plain string \"{body}\" if {{ path /hello }}\n\
         \x20   http-request return status 200 content-type text/plain lf-string \"%[req.hdr(host),lower,map(maps/hosts.map,none)]\" if {{ path /route }}\n\
         \x20   default_backend be_app\n\n\
         backend be_app\n    balance roundrobin\n"
    );
    for (i, p) in servers.iter().enumerate() {
        s.push_str(&format!("    server s{} 127.0.0.1:{p} weight 10\n", i + 1));
    }
    s
}

/// Writes the ConfigMap (server-side apply).
pub async fn put_config_map(client: &Client, ns: &str, cfg: &str, map: &str) -> Result<()> {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIG_MAP},
                    "data": {"haproxy.cfg": cfg, "hosts.map": map}});
    api.patch(CONFIG_MAP, &PatchParams::apply("haptic-e2e").force(), &Patch::Apply(&cm))
        .await
        .map_err(|e| ClusterError::of("apply the ConfigMap", e))?;
    Ok(())
}

fn hapc_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("haptic.dev", "v1alpha1", "HAProxyConfig");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, "haproxyconfigs"))
}

/// Creates or updates the `HAProxyConfig` (server-side apply) with the scenarios' spec. An
/// existing resource (the chart's, on a real cluster) keeps its `podSelector` and `agent`.
pub async fn put_haproxy_config(client: &Client, ns: &str, agent_port: u16, drift: &str) -> Result<()> {
    let api = hapc_api(client, ns);
    let exists = api.get_opt(CONFIG).await.map_err(|e| ClusterError::of("get the HAProxyConfig", e))?.is_some();
    let mut spec = json!({
        "configFrom": {"configMapKeyRef": {"name": CONFIG_MAP, "key": "haproxy.cfg"}},
        "files": [{"path": "maps/hosts.map", "configMapKeyRef": {"name": CONFIG_MAP, "key": "hosts.map"}}],
        "controller": {"driftPreventionInterval": drift},
    });
    if !exists {
        spec["podSelector"] = json!({"matchLabels": {"app.kubernetes.io/name": "haproxy"}});
        spec["agent"] = json!({"port": agent_port});
    }
    let obj = json!({"apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig", "metadata": {"name": CONFIG}, "spec": spec});
    api.patch(CONFIG, &PatchParams::apply("haptic-e2e").force(), &Patch::Apply(&obj))
        .await
        .map_err(|e| ClusterError::of("apply the HAProxyConfig", e))?;
    Ok(())
}

/// The `HAProxyConfig`'s status (`null` before the first write).
pub async fn status(client: &Client, ns: &str) -> Result<Value> {
    let obj = hapc_api(client, ns).get(CONFIG).await.map_err(|e| ClusterError::of("get the HAProxyConfig", e))?;
    Ok(obj.data.get("status").cloned().unwrap_or(Value::Null))
}

/// A condition of the status by type.
pub fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// The status as the table `haptic-controller status` prints (for the demo and failures).
pub fn status_table(s: &Value) -> String {
    let pods = s["deployedToPods"].as_array().cloned().unwrap_or_default();
    let w = pods.iter().filter_map(|p| p["pod"].as_str()).map(str::len).max().unwrap_or(0).max(18);
    let mut out =
        format!("{:<w$} PHASE           APPLIED       RUNNING       MODE      READY  REASON / ERROR\n", "POD");
    let short = |v: &Value| -> String {
        v.as_str().map(|t| t.trim_start_matches("sha256:").chars().take(12).collect()).unwrap_or_else(|| "-".into())
    };
    for p in pods {
        let why = p["lastError"]
            .as_str()
            .map(String::from)
            .or_else(|| p["reasons"].as_array().and_then(|r| r.first()).and_then(|r| r.as_str()).map(String::from))
            .unwrap_or_default();
        // `ready` is the pod's Ready condition (real clusters; absent on the kubelet stand-in).
        let ready = match p["ready"].as_bool() {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        let why = match p["notReadyReason"].as_str() {
            Some(r) if p["ready"] == false => format!("not Ready: {r}; {why}"),
            _ => why,
        };
        out.push_str(&format!(
            "{:<w$} {:<15} {:<13} {:<13} {:<9} {:<6} {}\n",
            p["pod"].as_str().unwrap_or("?"),
            p["phase"].as_str().unwrap_or("?"),
            short(&p["appliedPlan"]),
            short(&p["runningPlan"]),
            p["mode"].as_str().unwrap_or("-"),
            ready,
            why.lines().next().unwrap_or("")
        ));
    }
    let cond = |t: &str| {
        condition(s, t)
            .map(|c| format!("{}={} ({})", t, c["status"].as_str().unwrap_or("?"), c["reason"].as_str().unwrap_or("")))
    };
    out.push_str(&format!(
        "fleet: {} converged on {}   gate: {}   leader: {} (epoch {})\n{}   {}\n",
        s["convergedText"].as_str().unwrap_or("-"),
        short(&s["planId"]),
        s["gate"]["state"].as_str().unwrap_or("-"),
        s["leader"]["identity"].as_str().unwrap_or("-"),
        s["leader"]["epoch"],
        cond("Validated").unwrap_or_default(),
        cond("Converged").unwrap_or_default(),
    ));
    out
}

/// Polls `check` until it returns `Some`, or fails with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let check = || {
        let next = check();
        async move { next.await.ok_or_else(|| "not yet".to_string()) }
    };
    crate::wait::poll(what, timeout, check).await.map_err(ClusterError)
}

/// Whether the status `s` shows every one of `n` pods converged (`Converged=True`) on a plan
/// other than `not` (when given).
pub fn converged_on(s: &Value, n: usize, not: Option<&Value>) -> bool {
    condition(s, "Converged").is_some_and(|c| c["status"] == "True")
        && s["converged"] == n
        && s["total"] == n
        && not.is_none_or(|p| &s["planId"] != p)
}

/// Waits until every one of `n` pods runs a plan other than `not` (when given), with
/// `Converged=True`; returns the status.
pub async fn wait_converged(client: &Client, ns: &str, n: usize, not: Option<&Value>) -> Result<Value> {
    let check = || async move {
        match status(client, ns).await {
            Ok(s) if converged_on(&s, n, not) => Ok(s),
            Ok(s) => Err(format!("status:\n{}", status_table(&s))),
            Err(e) => Err(e.to_string()),
        }
    };
    crate::wait::poll(&format!("{n} pods converged"), Duration::from_secs(90), check).await.map_err(ClusterError)
}

/// [`wait_converged`], and the status written for the spec as it is now (`observedGeneration`
/// is the object's `generation`): after a change of the spec (another config source), a status
/// the controller wrote for the previous spec, on a render of the previous source, never passes.
pub async fn wait_converged_on_spec(client: &Client, ns: &str, n: usize, not: Option<&Value>) -> Result<Value> {
    let check = || async move {
        let obj = hapc_api(client, ns).get(CONFIG).await.map_err(|e| format!("get the HAProxyConfig: {e}"))?;
        let s = obj.data.get("status").cloned().unwrap_or(Value::Null);
        let (generation, observed) = (obj.metadata.generation, s["observedGeneration"].as_i64());
        if generation.is_none() || observed != generation {
            return Err(format!("status for generation {observed:?}, the spec is at {generation:?}"));
        }
        if converged_on(&s, n, not) {
            Ok(s)
        } else {
            Err(format!("status:\n{}", status_table(&s)))
        }
    };
    crate::wait::poll(&format!("{n} pods converged on the current spec"), Duration::from_secs(90), check)
        .await
        .map_err(ClusterError)
}

/// Waits until every one of `n` pods is converged and the status lists exactly pods that exist
/// now (each entry's `uid` is its pod's, and no pod is being deleted): after pods are replaced
/// under the same names, a status written before the replacement lists the old ones as
/// converged. Returns the status.
pub async fn wait_converged_on_current_pods(client: &Client, ns: &str, n: usize) -> Result<Value> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let check = || {
        let pods = pods.clone();
        async move {
            let s = status(client, ns).await.map_err(|e| e.to_string())?;
            if !converged_on(&s, n, None) {
                return Err(format!("status:\n{}", status_table(&s)));
            }
            for entry in s["deployedToPods"].as_array().into_iter().flatten() {
                let name = entry["pod"].as_str().unwrap_or_default();
                let live = pods.get_opt(name).await.map_err(|e| e.to_string())?;
                let current = live.as_ref().is_some_and(|p| {
                    p.metadata.uid.as_deref() == entry["uid"].as_str() && p.metadata.deletion_timestamp.is_none()
                });
                if !current {
                    return Err(format!("the status still lists pod {name} uid {} (gone or replaced)", entry["uid"]));
                }
            }
            Ok(s)
        }
    };
    crate::wait::poll(&format!("{n} current pods converged"), Duration::from_secs(90), check)
        .await
        .map_err(ClusterError)
}

/// Worker pid per pod from the agents' state.
pub async fn worker_pids<C: Cluster>(c: &C) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for p in c.haproxy_pods().await? {
        let st = c.agent_state(&p).await?;
        out.insert(p, st["haproxy"]["worker_pid"].as_u64().unwrap_or(0));
    }
    Ok(out)
}
