//! The scenarios only a real cluster can show (chart, images, kubelet, Services, RBAC, nodes),
//! around the shared ones of [`super::scenarios`]. They run on [`RealCluster`] in this order:
//! install from nothing, the shared scenarios, a HAProxy container killed on its node,
//! readiness under load (scale 2 → 4, rollout restart), RBAC, helm upgrade, helm uninstall, a
//! second install, render mode's Ingress steps ([`super::real_ingress`]), and two nodes (one node's kubelet and containerd stopped; last, since the
//! node stays down until `scripts/cluster.sh down`).
//!
//! Traffic goes only to the HAProxy Service's ClusterIP and to pod IPs, from the host, in
//! bounded loops. Nothing here asserts on timing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

use super::real::{nodes_of, pod_ready, RealCluster, AGENT_PORT, AGENT_TLS, CONTROLLER, HAPROXY, LEASE, NAMESPACE};
use super::real_steps::{ensure, install_reading_config_map, ok, start_load, FROM_CONFIG_MAP};
use super::scenarios::{run_selected, step_names, Selection};
use super::{eventually, put_config_map, status, status_table, wait_converged, Cluster, ClusterError, Result};

/// The tests' web backend (busybox httpd), and what it answers.
const WEB: &str = "web";
const WEB_BODY: &str = "hello from the web backend";

/// The real-cluster steps' names for `HAPTIC_E2E_STEPS`, in run order (after the shared ones).
pub const REAL_STEPS: [&str; 8] = [
    "container-kill",
    "readiness",
    "rbac",
    "helm-upgrade",
    "reinstall",
    "tls-refused",
    "credentials-rotation",
    "two-nodes",
];

/// Every step name a real-cluster run knows: the shared steps', then [`REAL_STEPS`] and the
/// Ingress steps (which run before `two-nodes`).
pub fn real_step_names() -> Vec<&'static str> {
    step_names()
        .into_iter()
        .chain(REAL_STEPS)
        .chain(super::real_ingress::INGRESS_STEPS)
        .chain(super::real_hostile::HOSTILE_STEPS)
        .chain(super::real_tenants::TENANT_STEPS)
        .chain(super::real_scope::SCOPE_STEPS)
        .collect()
}

/// Runs the scenarios `selection` wants on `c` (images loaded, no release installed yet, or one
/// left by an earlier run, which is uninstalled first). Installing from nothing and the shared
/// scenarios' first deploy run always: every other step needs them.
pub async fn run_real(c: &mut RealCluster, selection: &Selection) -> Result<()> {
    let client = c.client();
    if Api::<Deployment>::namespaced(client.clone(), NAMESPACE).get_opt(HAPROXY).await.ok().flatten().is_some() {
        println!("a release is installed: uninstalling it first");
        c.uninstall()?;
    }

    // 1. Install from nothing.
    install_from_nothing(c).await?;
    ok("install from nothing: Lease taken, pods Ready, Converged 2/2, 200 from the web backend through the Service");

    // 2. The shared scenarios.
    install_reading_config_map(c).await?;
    run_selected(c, 2, AGENT_PORT, false, selection).await?;
    ok("the selected shared scenarios");

    // 3. The HAProxy container killed on its node: restarted, back on the plan, shown in the status.
    if selection.wants("container-kill") {
        haproxy_container_killed(c).await?;
        ok("HAProxy container killed with the node's ctr: restarted on the current plan, the status shows the restart");
    }

    // 4. Readiness under load.
    if selection.wants("readiness") {
        readiness_under_load(c).await?;
    }

    // 5. RBAC: exactly the chart's.
    if selection.wants("rbac") {
        rbac(c).await?;
        ok("RBAC: the controller's ServiceAccount can do what it needs and nothing more");
    }

    // 6. helm upgrade of a dataplane value.
    if selection.wants("helm-upgrade") {
        helm_upgrade(c).await?;
        ok("helm upgrade: minDeploymentInterval 3s reached every agent, the fleet converged");
    }

    // 7. helm uninstall, then install again.
    if selection.wants("reinstall") {
        helm_uninstall(c).await?;
        ok("helm uninstall: nothing of the release is left but the CRD");
        install_reading_config_map(c).await?;
        wait_converged(&client, NAMESPACE, 2, None).await?;
        ok("installed again");
    }

    // 8. TLS on the control channel and credential rotation under load.
    super::real_tls::run_tls_steps(c, selection).await?;
    // 9. Render mode: the Ingress steps.
    super::real_ingress::run_ingress(c, selection).await?;
    super::real_hostile::run_hostile(c, selection).await?;
    super::real_tenants::run_tenants(c, selection).await?;
    super::real_scope::run_scope(c, selection).await?;

    // 10. Two nodes.
    if selection.wants("two-nodes") {
        two_nodes(c).await?;
    }
    Ok(())
}

async fn install_from_nothing(c: &mut RealCluster) -> Result<()> {
    let client = c.client();
    c.install(&[])?;
    // A controller took the Lease.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let holder = eventually("a controller to take the Lease", Duration::from_secs(60), || async {
        leases.get(LEASE).await.ok()?.spec?.holder_identity.filter(|h| h.starts_with(CONTROLLER))
    })
    .await?;
    // The HAProxy pods are Ready (helm --wait waited for it: Ready needs a plan from the controller).
    let pods = c.pods("app.kubernetes.io/component=haproxy").await?;
    ensure(pods.len() == 2 && pods.iter().all(pod_ready), || format!("{} HAProxy pods, not all Ready", pods.len()))?;
    let s = wait_converged(&client, NAMESPACE, 2, None).await?;
    ensure(s["convergedText"] == "2/2", || status_table(&s))?;
    println!("   Lease holder {holder}\n{}", status_table(&s));

    // A backend Deployment and Service, and a config routing to it.
    let web_ip = web_backend(c).await?;
    let cfg = format!(
        "global\n    default-path config\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\n\
         frontend fe_main\n    {bind}\n    default_backend be_web\n\n\
         backend be_web\n    server web {web_ip}:80\n\n{health}",
        bind = c.bind_line(),
        health = c.health_frontend().unwrap_or_default()
    );
    put_config_map(&client, NAMESPACE, &cfg, "").await?;
    let chart_plan = s["planId"].clone();
    c.install(&FROM_CONFIG_MAP)?;
    // Every pod on the ConfigMap's plan (a rollout's new pods may first converge on the chart's).
    wait_converged(&client, NAMESPACE, 2, Some(&chart_plan)).await?;
    let svc = c.service_ip().await?;
    eventually("200 from the web backend through the HAProxy Service", Duration::from_secs(90), || async {
        matches!(c.service_get(&svc, "web", "/").await, Ok((200, b)) if b.trim() == WEB_BODY).then_some(())
    })
    .await?;
    for _ in 0..20 {
        let got = c.service_get(&svc, "web", "/").await?;
        ensure(got.0 == 200 && got.1.trim() == WEB_BODY, || format!("through the Service: {got:?}"))?;
    }
    Ok(())
}

/// Creates the web backend (2 busybox httpd pods and a Service); returns its ClusterIP.
async fn web_backend(c: &RealCluster) -> Result<String> {
    let client = c.client();
    let labels = json!({"app.kubernetes.io/name": WEB});
    let dep = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": WEB, "labels": labels},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{
                "name": "httpd", "image": "localhost/haptic-e2e-web:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", format!("echo '{WEB_BODY}' > /www/index.html && exec httpd -f -p 8000 -h /www")],
                "ports": [{"containerPort": 8000}],
                "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}}}
    });
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": WEB},
                     "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8000}]}});
    let pp = PatchParams::apply("haptic-e2e").force();
    Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .patch(WEB, &pp, &Patch::Apply(&dep))
        .await
        .map_err(|e| ClusterError::of("apply the web Deployment", e))?;
    let s = Api::<Service>::namespaced(client.clone(), NAMESPACE)
        .patch(WEB, &pp, &Patch::Apply(&svc))
        .await
        .map_err(|e| ClusterError::of("apply the web Service", e))?;
    eventually("2 web pods Ready", Duration::from_secs(120), || async {
        let pods = c.pods(&format!("app.kubernetes.io/name={WEB}")).await.ok()?;
        (pods.len() == 2 && pods.iter().all(pod_ready)).then_some(())
    })
    .await?;
    s.spec.and_then(|s| s.cluster_ip).ok_or_else(|| ClusterError("the web Service has no ClusterIP".into()))
}

fn pod_status<'a>(s: &'a Value, pod: &str) -> Option<&'a Value> {
    s["deployedToPods"].as_array()?.iter().find(|p| p["pod"] == pod)
}

async fn haproxy_container_killed(c: &mut RealCluster) -> Result<()> {
    let client = c.client();
    let pod = c.haproxy_pods().await?[0].clone();
    let before = status(&client, NAMESPACE).await?;
    let restarts = pod_status(&before, &pod).and_then(|p| p["restarts"].as_i64()).unwrap_or(0);
    c.kill_container(&pod, "haproxy").await?;
    let s = eventually("the status to show the restart", Duration::from_secs(90), || async {
        let s = status(&client, NAMESPACE).await.ok()?;
        let p = pod_status(&s, &pod)?;
        (p["restarts"].as_i64()? > restarts && p["phase"] == "converged" && p["ready"] == true).then_some(s)
    })
    .await?;
    let st = c.agent_state(&pod).await?;
    ensure(st["running"]["plan_id"] == s["planId"], || {
        format!("{pod} runs {} after the restart\n{}", st["running"], status_table(&s))
    })?;
    ensure(c.get(&pod, "/hello").await?.0 == 200, || format!("{pod} does not serve after the restart"))?;
    Ok(())
}

async fn readiness_under_load(c: &mut RealCluster) -> Result<()> {
    let client = c.client();
    let svc = c.service_ip().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(c, svc, stop.clone(), (30_000, Duration::from_secs(240)));
    let result = async {
        c.scale_haproxy(4).await?;
        wait_converged(&client, NAMESPACE, 4, None).await?;
        eventually("4 Ready HAProxy pods", Duration::from_secs(120), || async {
            let pods = c.pods("app.kubernetes.io/component=haproxy").await.ok()?;
            (pods.len() == 4 && pods.iter().all(pod_ready)).then_some(())
        })
        .await?;
        c.replace_all_haproxy().await?;
        wait_converged(&client, NAMESPACE, 4, None).await?;
        c.scale_haproxy(2).await?;
        wait_converged(&client, NAMESPACE, 2, None).await
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    let (ok_n, failed) = load.await.map_err(|e| ClusterError::of("the load task", e))?;
    result?;
    ensure(failed.is_empty() && ok_n > 0, || {
        format!("{ok_n} requests ok, {} failed: {:?}", failed.len(), &failed[..failed.len().min(10)])
    })?;
    ok(&format!(
        "readiness: scale 2 -> 4 and a rollout restart under load: {ok_n} requests through the Service, 0 failed"
    ));
    Ok(())
}

async fn can(c: &RealCluster, verb: &str, group: &str, resource: &str, sub: &str, ns: Option<&str>) -> Result<bool> {
    let user = format!("system:serviceaccount:{NAMESPACE}:{CONTROLLER}");
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{NAMESPACE}"), "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "subresource": sub,
                                        "namespace": ns.unwrap_or("")}}
    }))
    .map_err(|e| ClusterError::of("SubjectAccessReview", e))?;
    let api: Api<SubjectAccessReview> = Api::all(c.client());
    let r =
        api.create(&PostParams::default(), &review).await.map_err(|e| ClusterError::of("SubjectAccessReview", e))?;
    Ok(r.status.is_some_and(|s| s.allowed))
}

async fn rbac(c: &RealCluster) -> Result<()> {
    let ns = Some(NAMESPACE);
    let allowed = [
        ("watch", "", "pods", ""),
        ("list", "", "secrets", ""),
        ("update", "coordination.k8s.io", "leases", ""),
        ("patch", "haptic.dev", "haproxyconfigs", "status"),
        ("create", "events.k8s.io", "events", ""),
    ];
    for (verb, group, res, sub) in allowed {
        ensure(can(c, verb, group, res, sub, ns).await?, || format!("the controller may not {verb} {res}/{sub}"))?;
    }
    let denied = [
        ("list", "", "pods", "", Some("default")),
        ("get", "", "secrets", "", None),
        ("delete", "", "pods", "", ns),
        ("update", "haptic.dev", "haproxyconfigs", "", ns),
        ("patch", "apps", "deployments", "", ns),
        ("create", "rbac.authorization.k8s.io", "rolebindings", "", ns),
        ("list", "", "nodes", "", None),
    ];
    for (verb, group, res, sub, where_) in denied {
        ensure(!can(c, verb, group, res, sub, where_).await?, || {
            format!("the controller may {verb} {res} in {where_:?}: more than the chart's RBAC")
        })?;
    }
    Ok(())
}

async fn helm_upgrade(c: &mut RealCluster) -> Result<()> {
    let client = c.client();
    let mut set: Vec<&str> = FROM_CONFIG_MAP.to_vec();
    set.push("config.dataplane.minDeploymentInterval=3s");
    let before: BTreeSet<String> = c.haproxy_pods().await?.into_iter().collect();
    c.install(&set)?;
    let flag = "--min-reload-interval=3s";
    eventually("every HAProxy pod's agent to run with the new value", Duration::from_secs(240), || async {
        let pods = c.pods("app.kubernetes.io/component=haproxy").await.ok()?;
        let all = pods.len() == 2
            && pods.iter().all(|p| {
                pod_ready(p)
                    && !before.contains(p.metadata.name.as_deref().unwrap_or_default())
                    && p.spec.as_ref().is_some_and(|s| {
                        s.containers.iter().any(|c| {
                            c.name == "agent" && c.command.as_ref().is_some_and(|a| a.iter().any(|x| x == flag))
                        })
                    })
            });
        all.then_some(())
    })
    .await?;
    wait_converged(&client, NAMESPACE, 2, None).await?;
    // Back to the defaults for what follows.
    c.install(&FROM_CONFIG_MAP)?;
    wait_converged(&client, NAMESPACE, 2, None).await?;
    Ok(())
}

async fn helm_uninstall(c: &mut RealCluster) -> Result<()> {
    let client = c.client();
    c.uninstall()?;
    // The scenarios' own ConfigMap is the test's, not the release's.
    let _ = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE).delete("edge-cfg", &DeleteParams::default()).await;
    let sel = ListParams::default().labels("app.kubernetes.io/instance=haptic");
    let left: std::cell::RefCell<BTreeMap<String, usize>> = Default::default();
    let kinds: [(&str, &str, &str, &str); 13] = [
        ("", "v1", "Pod", "pods"),
        ("", "v1", "Service", "services"),
        ("", "v1", "Secret", "secrets"),
        ("", "v1", "ConfigMap", "configmaps"),
        ("", "v1", "ServiceAccount", "serviceaccounts"),
        ("apps", "v1", "Deployment", "deployments"),
        ("apps", "v1", "ReplicaSet", "replicasets"),
        ("rbac.authorization.k8s.io", "v1", "Role", "roles"),
        ("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings"),
        ("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets"),
        ("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies"),
        ("coordination.k8s.io", "v1", "Lease", "leases"),
        ("haptic.dev", "v1alpha1", "HAProxyConfig", "haproxyconfigs"),
    ];
    let s = eventually("the release's objects to be gone", Duration::from_secs(120), || async {
        let mut found = BTreeMap::new();
        for (g, v, k, plural) in kinds {
            let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, k), plural);
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &ar);
            // Everything labelled with the release; HAProxyConfigs and Leases whatever their labels.
            let lp = if matches!(k, "HAProxyConfig" | "Lease") { ListParams::default() } else { sel.clone() };
            let n = api.list(&lp).await.ok()?.items.len();
            if n > 0 {
                found.insert(k.to_string(), n);
            }
        }
        // Helm's own release records.
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NAMESPACE);
        let releases = secrets.list(&ListParams::default().labels("owner=helm,name=haptic")).await.ok()?.items.len();
        if releases > 0 {
            found.insert("helm release Secret".to_string(), releases);
        }
        // The agents' TLS Secrets the controller made (owned by the HAProxyConfig).
        for n in [AGENT_TLS.to_string(), format!("{AGENT_TLS}-ca")] {
            if secrets.get_opt(&n).await.ok()?.is_some() {
                found.insert(format!("Secret {n}"), 1);
            }
        }
        let done = found.is_empty();
        *left.borrow_mut() = found;
        done.then_some(())
    })
    .await;
    s.map_err(|e| ClusterError(format!("{e}: left {:?}", left.borrow())))?;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    ensure(crds.get_opt("haproxyconfigs.haptic.dev").await.ok().flatten().is_some(), || {
        "helm uninstall removed the CRD (Helm keeps CRDs from crds/)".into()
    })?;
    Ok(())
}

async fn two_nodes(c: &mut RealCluster) -> Result<()> {
    let client = c.client();
    let nodes = c.nodes().await?;
    if nodes.len() < 2 {
        println!("skip real: two nodes (the cluster has {} node)", nodes.len());
        return Ok(());
    }
    let pods = c.pods("app.kubernetes.io/component=haproxy").await?;
    let placed = nodes_of(&pods);
    let used: BTreeSet<&String> = placed.values().collect();
    ensure(used.len() == 2, || format!("the HAProxy pods did not spread over the nodes: {placed:?}"))?;
    // The last node that runs a HAProxy pod (not the first: on scripts/cluster.sh the host's
    // route to ClusterIPs goes through node 0).
    let victim_node = used.iter().next_back().map(|n| n.to_string()).unwrap_or_default();
    let (victims, keepers): (Vec<String>, Vec<String>) = placed.keys().cloned().partition(|p| placed[p] == victim_node);
    c.stop_node(&victim_node)?;
    // The status says what Kubernetes says: that node's pods are no longer Ready.
    let s =
        eventually(&format!("the status to show {victim_node}'s pods not Ready"), Duration::from_secs(120), || async {
            let s = status(&client, NAMESPACE).await.ok()?;
            let down = victims.iter().all(|p| pod_status(&s, p).is_some_and(|x| x["ready"] == false));
            let up = keepers
                .iter()
                .all(|p| pod_status(&s, p).is_some_and(|x| x["ready"] == true && x["phase"] == "converged"));
            (down && up).then_some(s)
        })
        .await?;
    println!("   after stopping {victim_node}:\n{}", status_table(&s));
    for p in &victims {
        let why = pod_status(&s, p).map(|x| x["notReadyReason"].to_string()).unwrap_or_default();
        println!("   {p}: not Ready: {why}");
    }
    // The other node keeps serving through the Service (once the endpoints dropped the pods).
    let svc = c.service_ip().await?;
    eventually("the Service to answer from the remaining node", Duration::from_secs(60), || async {
        matches!(c.service_get(&svc, "x", "/hello").await, Ok((200, _))).then_some(())
    })
    .await?;
    let mut failed = Vec::new();
    for _ in 0..200 {
        match c.service_get(&svc, "x", "/hello").await {
            Ok((200, _)) => {}
            other => failed.push(format!("{other:?}")),
        }
    }
    ensure(failed.is_empty(), || format!("with {victim_node} down, {} of 200 failed: {failed:?}", failed.len()))?;
    for p in &keepers {
        ensure(c.get(p, "/hello").await?.0 == 200, || format!("{p} on the remaining node does not serve"))?;
    }
    ok(&format!(
        "two nodes: {victim_node} stopped, its pods shown not Ready, 200/200 through the Service from the other node"
    ));
    Ok(())
}
