//! A namespace user's hostile Ingress on a real cluster: the chart installed with
//! `ingress.enabled=true`; in a namespace of its own, a user whose only rights are a Role for
//! Ingresses there (impersonated: `Impersonate-User`) applies a good Ingress beside two hostile
//! ones (a `configuration-snippet` loading Lua, a `rewrite-target` carrying a line break and a
//! directive). The good one serves 200; each hostile one gets a Warning Event naming its
//! annotation and its host answers 404; no HAProxy pod reloads (reload counters and worker pids
//! unchanged).
//!
//! Owns the step [`HOSTILE_STEPS`]. It must never send traffic anywhere but the HAProxy Service,
//! nor leave its objects behind on success: it ends with its namespace deleted and the release
//! back on the scenarios' ConfigMap.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PostParams};
use kube::Client;
use serde_json::{json, Value};

use super::real::{pod_ready, RealCluster, NAMESPACE};
use super::real_ingress::samples_by;
use super::real_steps::{apply_params, ensure, install_reading_config_map};
use super::scenarios::Selection;
use super::{converged_on, eventually, status, wait_converged, wait_converged_on_spec, Cluster, ClusterError, Result};

/// The step's name for `HAPTIC_E2E_STEPS`.
pub const HOSTILE_STEPS: [&str; 1] = ["ingress-hostile"];

/// The namespace the user may write Ingresses in (and nothing else).
const TENANT: &str = "hostile-tenant";
/// The user, impersonated.
const USER: &str = "tenant-dev";
/// The chart's IngressClass (`ingress.className`).
const CLASS: &str = "haptic";
/// The tenant's backend: busybox httpd answering `tenant` on `/`.
const WEB: &str = "tenant-web";
const ANNOTATION: &str = "nginx.ingress.kubernetes.io/";

/// Runs the step if `selection` wants it (the release installed and converged), then puts the
/// release back on the scenarios' ConfigMap.
pub async fn run_hostile(c: &mut RealCluster, selection: &Selection) -> Result<()> {
    if !HOSTILE_STEPS.iter().any(|s| selection.wants(s)) {
        return Ok(());
    }
    let client = c.client();
    c.install(&["ingress.enabled=true"])?;
    // The render of the IngressClass (the steps below wait on what it serves).
    wait_converged_on_spec(&client, NAMESPACE, 2, None).await?;
    let result = hostile_next_to_good(c).await;
    let cleaned = clean_up(c).await;
    result?;
    cleaned?;
    let rendered = status(&client, NAMESPACE).await?["planId"].clone();
    install_reading_config_map(c).await?;
    wait_converged_on_spec(&client, NAMESPACE, 2, Some(&rendered)).await?;
    println!("ok real ingress: the tenant's namespace deleted; the release is back on the scenarios' ConfigMap");
    Ok(())
}

/// An Ingress of class [`CLASS`] in [`TENANT`] for `host` → [`WEB`], with `annotations`.
fn ingress(name: &str, host: &str, annotations: &[(&str, &str)]) -> Value {
    let a: serde_json::Map<String, Value> =
        annotations.iter().map(|(k, v)| (format!("{ANNOTATION}{k}"), Value::from(*v))).collect();
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
           "metadata": {"name": name, "namespace": TENANT, "annotations": a},
           "spec": {"ingressClassName": CLASS, "rules": [{"host": host, "http": {"paths": [
               {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": WEB, "port": {"number": 80}}}}]}}]}})
}

async fn put_ingress(client: &Client, obj: &Value) -> Result<()> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    Api::<Ingress>::namespaced(client.clone(), TENANT)
        .patch(&name, &apply_params(), &Patch::Apply(obj))
        .await
        .map_err(|e| ClusterError::of(&format!("apply Ingress {TENANT}/{name}"), e))?;
    Ok(())
}

/// A client acting as `user` (the kubeconfig's credentials, impersonating), in the group every
/// authenticated user is in.
pub(super) async fn user_client(user: &str) -> Result<Client> {
    let mut cfg = kube::Config::infer().await.map_err(|e| ClusterError::of("kubeconfig", e))?;
    cfg.auth_info.impersonate = Some(user.into());
    cfg.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
    Client::try_from(cfg).map_err(|e| ClusterError::of("the user's client", e))
}

/// The namespace, the user's Role (Ingresses there, nothing else) and its binding, and the
/// tenant's backend Deployment and Service (Ready).
async fn tenant(c: &RealCluster) -> Result<()> {
    let client = c.client();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}});
    Api::<Namespace>::all(client.clone())
        .patch(TENANT, &apply_params(), &Patch::Apply(&ns))
        .await
        .map_err(|e| ClusterError::of("apply the tenant's namespace", e))?;
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "ingress-writer", "namespace": TENANT},
        "rules": [{"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch"]}]});
    Api::<Role>::namespaced(client.clone(), TENANT)
        .patch("ingress-writer", &apply_params(), &Patch::Apply(&role))
        .await
        .map_err(|e| ClusterError::of("apply the tenant's Role", e))?;
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "ingress-writer", "namespace": TENANT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ingress-writer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]});
    Api::<RoleBinding>::namespaced(client.clone(), TENANT)
        .patch("ingress-writer", &apply_params(), &Patch::Apply(&binding))
        .await
        .map_err(|e| ClusterError::of("apply the tenant's RoleBinding", e))?;
    let labels = json!({"app.kubernetes.io/name": WEB});
    let dep = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": WEB, "namespace": TENANT},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{
                "name": "httpd", "image": "localhost/haptic-e2e-web:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "mkdir -p /www; echo tenant > /www/index.html; exec httpd -f -p 8000 -h /www"],
                "ports": [{"name": "http", "containerPort": 8000}],
                "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}}}
    });
    Api::<Deployment>::namespaced(client.clone(), TENANT)
        .patch(WEB, &apply_params(), &Patch::Apply(&dep))
        .await
        .map_err(|e| ClusterError::of("apply the tenant's Deployment", e))?;
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": WEB, "namespace": TENANT},
                     "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}});
    Api::<Service>::namespaced(client.clone(), TENANT)
        .patch(WEB, &apply_params(), &Patch::Apply(&svc))
        .await
        .map_err(|e| ClusterError::of("apply the tenant's Service", e))?;
    eventually("the tenant's backend pod Ready", Duration::from_secs(180), || async {
        let lp = ListParams::default().labels(&format!("app.kubernetes.io/name={WEB}"));
        let pods = c.client();
        let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(pods, TENANT).list(&lp).await.ok()?.items;
        (pods.len() == 1 && pods.iter().all(pod_ready)).then_some(())
    })
    .await
}

/// Each HAProxy pod's (worker pid, `haptic_agent_reloads_total`), read with the fleet at rest:
/// converged, every agent on the status's plan, no reload pending.
async fn reloads(c: &RealCluster) -> Result<BTreeMap<String, (u64, f64)>> {
    let client = c.client();
    eventually("every agent's reload counter with the fleet at rest", Duration::from_secs(90), || async {
        let s = status(&client, NAMESPACE).await.ok()?;
        let pods = c.haproxy_pods().await.ok()?;
        if !converged_on(&s, pods.len(), None) {
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
            let reloads = samples_by(&text, "haptic_agent_reloads_total", "result").values().sum();
            out.insert(pod, (st["haproxy"]["worker_pid"].as_u64()?, reloads));
        }
        Some(out)
    })
    .await
}

/// Waits until `GET /` with `Host: host` through the Service answers `code` (and, for 200, the
/// tenant's body).
async fn answers(c: &RealCluster, svc: &str, host: &str, code: u16) -> Result<()> {
    eventually(&format!("{code} for {host}/ through the HAProxy Service"), Duration::from_secs(90), || async {
        match c.service_get(svc, host, "/").await {
            Ok((got, body)) if got == code && (code != 200 || body.trim() == "tenant") => Some(()),
            _ => None,
        }
    })
    .await
}

/// Waits for a Warning `IngressRefused` Event on the tenant's Ingress `name` whose note names
/// `annotation`; returns the note.
async fn refused_event(c: &RealCluster, name: &str, annotation: &str) -> Result<String> {
    let api: Api<Event> = Api::namespaced(c.client(), TENANT);
    let needle = format!("{ANNOTATION}{annotation}");
    eventually(
        &format!("a Warning IngressRefused Event on {TENANT}/{name} naming {needle}"),
        Duration::from_secs(60),
        || async {
            api.list(&ListParams::default()).await.ok()?.items.into_iter().find_map(|e| {
                let on = e
                    .regarding
                    .as_ref()
                    .is_some_and(|r| r.kind.as_deref() == Some("Ingress") && r.name.as_deref() == Some(name));
                let note = e.note.clone().unwrap_or_default();
                (on && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("IngressRefused")
                    && note.contains(&needle))
                .then_some(note)
            })
        },
    )
    .await
}

async fn hostile_next_to_good(c: &RealCluster) -> Result<()> {
    let svc = c.service_ip().await?;
    tenant(c).await?;
    let user = user_client(USER).await?;
    // The user has the Role's rights and no others.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}});
    let cm: ConfigMap = serde_json::from_value(cm).map_err(|e| ClusterError::of("a ConfigMap", e))?;
    for ns in [TENANT, NAMESPACE] {
        match Api::<ConfigMap>::namespaced(user.clone(), ns).create(&PostParams::default(), &cm).await {
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            other => return Err(ClusterError(format!("{USER} creating a ConfigMap in {ns}: {other:?}, not 403"))),
        }
    }
    // The tenant's backend is in the render (a first Ingress, the admin's), so what follows adds
    // no backend.
    put_ingress(&c.client(), &ingress("tenant-first", "first.tenant.example", &[])).await?;
    answers(c, &svc, "first.tenant.example", 200).await?;
    let before = reloads(c).await?;
    let plan = status(&c.client(), NAMESPACE).await?["planId"].clone();

    // The user's three Ingresses.
    let hostile = [
        ("hostile-snippet", "snippet.tenant.example", "configuration-snippet", "lua-load /tmp/x.lua\n"),
        ("hostile-rewrite", "rewrite.tenant.example", "rewrite-target", "/x\n    lua-load /tmp/x.lua\n#%[env(HOME)]"),
    ];
    for (name, host, key, value) in hostile {
        put_ingress(&user, &ingress(name, host, &[(key, value)])).await?;
    }
    put_ingress(&user, &ingress("tenant-good", "good.tenant.example", &[])).await?;
    answers(c, &svc, "good.tenant.example", 200).await?;
    answers(c, &svc, "first.tenant.example", 200).await?;
    let mut notes = Vec::new();
    for (name, host, key, _) in hostile {
        notes.push(refused_event(c, name, key).await?);
        answers(c, &svc, host, 404).await?;
    }
    wait_converged(&c.client(), NAMESPACE, 2, Some(&plan)).await?;
    let after = reloads(c).await?;
    ensure(before.keys().eq(after.keys()), || format!("the HAProxy pods changed: {before:?} -> {after:?}"))?;
    for (pod, (worker, n)) in &after {
        let (w0, n0) = before[pod];
        ensure(*worker == w0 && *n == n0, || {
            format!("{pod}: worker pid {w0} -> {worker}, haptic_agent_reloads_total {n0} -> {n}")
        })?;
    }
    for n in &notes {
        println!("   Warning IngressRefused: {n}");
    }
    println!(
        "ok real ingress: a namespace user's Ingresses (a Role for Ingresses in {TENANT} only): the good one serves 200; configuration-snippet with lua-load and a rewrite-target with a line break are refused (Warning Events naming them, 404 for their hosts); 0 reloads, worker pids unchanged on {} pods",
        after.len()
    );
    Ok(())
}

/// Deletes the tenant's namespace and waits until it is gone.
async fn clean_up(c: &RealCluster) -> Result<()> {
    let nss: Api<Namespace> = Api::all(c.client());
    let _ = nss.delete(TENANT, &DeleteParams::default()).await;
    eventually(&format!("the namespace {TENANT} gone"), Duration::from_secs(180), || async {
        matches!(nss.get_opt(TENANT).await, Ok(None)).then_some(())
    })
    .await
}
