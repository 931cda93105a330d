//! The real-cluster steps of the control channel's security: TLS and credential rotation.
//!
//! - `tls-refused`: a pod the `podSelector` selects whose agent serves a certificate for the
//!   right name from another CA (made here with openssl) is refused by the controller, which
//!   logs why (the verifier's `UnknownIssuer`); it never joins the fleet, which stays converged.
//! - `credentials-rotation`: the credentials Secret is rotated while a bounded load runs through
//!   the HAProxy Service; every agent takes on the new credential without a restart, the
//!   controller deploys a new plan to every pod meanwhile, no pod leaves the fleet, no container
//!   restarts, and no request fails.
//!
//! Owns these two steps and the objects they make (a Secret and a pod, removed whatever the
//! outcome). It must never change the cluster beyond the release's namespace.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, LogParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::real::{restarts, RealCluster, CREDENTIALS, HAPROXY, NAMESPACE};
use super::real_steps::{ensure, ok, start_load};
use super::scenarios::Selection;
use super::{eventually, put_config_map, status, status_table, wait_converged, Cluster, ClusterError, Result};

/// The pod serving a certificate of another CA, and its Secret.
const ROGUE: &str = "haptic-rogue";
const ROGUE_TLS: &str = "haptic-rogue-tls";

/// Runs the steps `selection` wants (the release installed, the fleet converged on 2 pods).
pub async fn run_tls_steps(c: &mut RealCluster, selection: &Selection) -> Result<()> {
    if selection.wants("tls-refused") {
        let r = tls_refused(c).await;
        let cleanup = remove_rogue(c).await;
        r?;
        cleanup?;
        ok("tls-refused: an agent serving a certificate of another CA was refused by the controller (UnknownIssuer) and never joined the fleet");
    }
    if selection.wants("credentials-rotation") {
        credentials_rotation(c).await?;
    }
    Ok(())
}

async fn tls_refused(c: &mut RealCluster) -> Result<()> {
    let client = c.client();
    ensure(c.agent_tls().await?.is_some(), || "the agents do not serve TLS (agent.tls.enabled is the default)".into())?;
    let before = wait_converged(&client, NAMESPACE, 2, None).await?;

    // A certificate for the agents' own name, from a CA the controller does not trust.
    let pki = tempfile::tempdir().map_err(|e| ClusterError::of("tempdir", e))?;
    crate::tls::make_ca_for(pki.path(), "rogue", &format!("DNS:{}", super::real::AGENT_TLS_NAME));
    let read = |f: &str| std::fs::read_to_string(pki.path().join(f)).map_err(|e| ClusterError::of(f, e));
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": ROGUE_TLS},
                        "type": "kubernetes.io/tls", "stringData": {"tls.crt": read("rogue.pem")?, "tls.key": read("rogue.key")?}});
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .patch(ROGUE_TLS, &PatchParams::apply("haptic-e2e").force(), &Patch::Apply(&secret))
        .await
        .map_err(|e| ClusterError::of("apply the rogue TLS Secret", e))?;

    // A pod like the chart's HAProxy pods (the podSelector selects it), with that certificate.
    let dep = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(HAPROXY)
        .await
        .map_err(|e| ClusterError::of("get the HAProxy Deployment", e))?;
    let template = dep.spec.map(|s| s.template).ok_or_else(|| ClusterError("no pod template".into()))?;
    let mut spec = template.spec.ok_or_else(|| ClusterError("no pod spec".into()))?;
    let vol = spec
        .volumes
        .iter_mut()
        .flatten()
        .find(|v| v.name == "agent-tls")
        .and_then(|v| v.secret.as_mut())
        .ok_or_else(|| ClusterError("the HAProxy pods have no agent-tls volume".into()))?;
    vol.secret_name = Some(ROGUE_TLS.into());
    let mut labels = template.metadata.and_then(|m| m.labels).unwrap_or_default();
    labels.insert("haptic-e2e/rogue".into(), "true".into());
    let mut pod = Pod { spec: Some(spec), ..Pod::default() };
    pod.metadata.name = Some(ROGUE.into());
    pod.metadata.labels = Some(labels);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.create(&PostParams::default(), &pod).await.map_err(|e| ClusterError::of("create the rogue pod", e))?;
    eventually("the rogue pod's agent to run", Duration::from_secs(120), || async {
        let p = pods.get(ROGUE).await.ok()?;
        let s = p.status?.container_statuses?;
        s.iter().find(|c| c.name == "agent")?.state.as_ref()?.running.as_ref().map(|_| ())
    })
    .await?;

    // The controller refuses it and says why, in every replica's log (each one admits pods).
    let controllers = c.pods("app.kubernetes.io/name=haptic,app.kubernetes.io/component=controller").await?;
    let names: Vec<String> = controllers.into_iter().filter_map(|p| p.metadata.name).collect();
    let line = eventually("the controller to log the refusal of the rogue agent", Duration::from_secs(90), || async {
        let mut found = None;
        for n in &names {
            let lp = LogParams { since_seconds: Some(600), ..LogParams::default() };
            let log = pods.logs(n, &lp).await.ok()?;
            found = Some(log.lines().find(|l| l.contains(ROGUE) && l.contains("UnknownIssuer"))?.to_string());
        }
        found
    })
    .await?;
    println!("   {}", line.trim());
    // The host, trusting the agents' CA, is refused by it too; the fleet is the same two pods.
    ensure(c.agent_state(ROGUE).await.is_err(), || "the rogue certificate chains to the agents' CA".into())?;
    let s = status(&client, NAMESPACE).await?;
    let in_fleet = s["deployedToPods"].as_array().is_some_and(|p| p.iter().any(|p| p["pod"] == ROGUE));
    ensure(!in_fleet, || format!("the rogue pod joined the fleet\n{}", status_table(&s)))?;
    let after = wait_converged(&client, NAMESPACE, 2, None).await?;
    ensure(after["planId"] == before["planId"], || format!("the plan changed\n{}", status_table(&after)))?;
    Ok(())
}

async fn remove_rogue(c: &RealCluster) -> Result<()> {
    let client = c.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let dp = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    if pods.get_opt(ROGUE).await.map_err(|e| ClusterError::of("get the rogue pod", e))?.is_some() {
        pods.delete(ROGUE, &dp).await.map_err(|e| ClusterError::of("delete the rogue pod", e))?;
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    if secrets.get_opt(ROGUE_TLS).await.map_err(|e| ClusterError::of("get the rogue Secret", e))?.is_some() {
        secrets.delete(ROGUE_TLS, &dp).await.map_err(|e| ClusterError::of("delete the rogue Secret", e))?;
    }
    eventually("the rogue pod to go", Duration::from_secs(120), || async {
        pods.get_opt(ROGUE).await.ok()?.is_none().then_some(())
    })
    .await
}

/// Restart counts of both containers of every HAProxy pod, by pod.
async fn restart_counts(c: &RealCluster) -> Result<BTreeMap<String, (i32, i32)>> {
    Ok(c.pods("app.kubernetes.io/name=haptic,app.kubernetes.io/component=haproxy")
        .await?
        .iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, (restarts(p, "haproxy"), restarts(p, "agent")))))
        .collect())
}

async fn credentials_rotation(c: &mut RealCluster) -> Result<()> {
    let client = c.client();
    let before = wait_converged(&client, NAMESPACE, 2, None).await?;
    let pods_before = restart_counts(c).await?;
    let (user, old) = c.credentials().await?;
    let new = format!(
        "rotated{:x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
    );
    let svc = c.service_ip().await?;
    let stop = Arc::new(AtomicBool::new(false));
    // Bounds above what the step needs (the kubelet's refresh of the mounted Secret takes up to
    // a couple of minutes): the load must still run when the step ends.
    let load = start_load(c, svc, stop.clone(), (300_000, Duration::from_secs(420)));
    let fleet_min = AtomicUsize::new(usize::MAX);
    let result = async {
        // Rotate the Secret (what an operator or a secret manager does).
        let patch = json!({"stringData": {"username": user, "password": new, "credentials": format!("{user}:{new}")}});
        Api::<Secret>::namespaced(client.clone(), NAMESPACE)
            .patch(CREDENTIALS, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| ClusterError::of("rotate the credentials Secret", e))?;
        ensure(c.credentials().await?.1 == new, || "the Secret was not rotated".into())?;
        // Every agent takes on the new credential (the kubelet refreshes the mounted Secret, the
        // agent re-reads it); the fleet is sampled meanwhile.
        eventually("every agent to accept the rotated credential", Duration::from_secs(240), || async {
            let s = status(&client, NAMESPACE).await.ok()?;
            fleet_min.fetch_min(s["deployedToPods"].as_array().map_or(0, Vec::len), Ordering::Relaxed);
            for p in c.haproxy_pods().await.ok()? {
                c.agent_state(&p).await.ok()?;
            }
            Some(())
        })
        .await?;
        // The controller still deploys to every pod: a new plan reaches both.
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
        let cm = cms.get("edge-cfg").await.map_err(|e| ClusterError::of("get the ConfigMap", e))?;
        let data = cm.data.unwrap_or_default();
        let cfg = format!("{}\n# credentials rotated\n", data.get("haproxy.cfg").cloned().unwrap_or_default());
        put_config_map(&client, NAMESPACE, &cfg, data.get("hosts.map").map_or("", String::as_str)).await?;
        wait_converged(&client, NAMESPACE, 2, Some(&before["planId"])).await
    }
    .await;
    let loaded_throughout = !load.is_finished();
    stop.store(true, Ordering::Relaxed);
    let (ok_n, failed) = load.await.map_err(|e| ClusterError::of("the load task", e))?;
    let after = result?;
    ensure(old != new, || "the credential did not change".into())?;
    ensure(loaded_throughout, || format!("the load reached its bound ({ok_n} requests) before the step ended"))?;
    ensure(failed.is_empty() && ok_n > 0, || {
        format!("{ok_n} requests ok, {} failed: {:?}", failed.len(), &failed[..failed.len().min(10)])
    })?;
    let fleet_min = fleet_min.into_inner();
    ensure(fleet_min >= 2, || format!("a pod left the fleet during the rotation (down to {fleet_min} pods)"))?;
    let pods_after = restart_counts(c).await?;
    ensure(pods_after == pods_before, || {
        format!("pods or restarts changed during the rotation: {pods_before:?} -> {pods_after:?}")
    })?;
    ok(&format!(
        "credentials-rotation: Secret rotated under load, every agent took it on without a restart, plan {} on 2/2; {ok_n} requests, 0 failed",
        after["planId"]
    ));
    Ok(())
}
