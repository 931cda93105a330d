//! What the real-cluster step files share: the release installed on the scenarios' ConfigMap,
//! a check that fails the step with its message, the "ok real" line, the apply parameters,
//! and a bounded load through the HAProxy Service.
//!
//! Owns nothing of a step's own judgement. It must never import a step file (each step file
//! imports it, so none of them import each other through it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::real::{RealCluster, NAMESPACE};
use super::{put_config_map, Cluster, ClusterError, Result};

/// `--set`s that make the chart's `HAProxyConfig` read the scenarios' ConfigMap.
pub(super) const FROM_CONFIG_MAP: [&str; 5] = [
    "config.configFrom.configMapKeyRef.name=edge-cfg",
    "config.configFrom.configMapKeyRef.key=haproxy.cfg",
    "config.files[0].path=maps/hosts.map",
    "config.files[0].configMapKeyRef.name=edge-cfg",
    "config.files[0].configMapKeyRef.key=hosts.map",
];

/// Installs (or upgrades) the release with its `HAProxyConfig` reading the scenarios' ConfigMap,
/// writing a first one (the chart's example: a frontend on the HTTP port that answers by itself,
/// and the health frontend) when there is none yet.
pub async fn install_reading_config_map(c: &RealCluster) -> Result<()> {
    let client = c.client();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(NAMESPACE, &PatchParams::apply("haptic-e2e"), &Patch::Apply(&ns))
        .await
        .map_err(|e| ClusterError::of("create the namespace", e))?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    if cms.get_opt("edge-cfg").await.map_err(|e| ClusterError::of("get the ConfigMap", e))?.is_none() {
        let cfg = format!(
            "global\n    default-path config\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\n\
             frontend fe_main\n    {}\n    http-request return status 200 content-type text/plain string \"hello from haptic\"\n\n{}",
            c.bind_line(),
            c.health_frontend().unwrap_or_default()
        );
        put_config_map(&client, NAMESPACE, &cfg, "").await?;
    }
    c.install(&FROM_CONFIG_MAP)
}

pub fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(ClusterError(what()))
    }
}

pub fn ok(step: &str) {
    println!("ok real: {step}");
}

/// Server-side apply as the e2e suite's field manager, taking over fields.
pub fn apply_params() -> PatchParams {
    PatchParams::apply("haptic-e2e").force()
}

/// Bounded load through the Service until `stop` (at most `max` requests or `within`); returns
/// (successes, failures).
pub fn start_load(
    c: &RealCluster,
    svc: String,
    stop: Arc<AtomicBool>,
    (max, within): (u64, Duration),
) -> tokio::task::JoinHandle<(u64, Vec<String>)> {
    let c = c.clone();
    tokio::spawn(async move {
        let (mut ok, mut failed) = (0u64, Vec::new());
        let deadline = Instant::now() + within;
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && ok + (failed.len() as u64) < max {
            match c.service_get(&svc, "load", "/hello").await {
                Ok((200, _)) => ok += 1,
                other => failed.push(format!("{other:?}")),
            }
        }
        (ok, failed)
    })
}
