//! Two namespaces on a real cluster: a victim's Ingress serving under bounded load while an
//! attacker, whose only rights are a Role for Ingresses and Secrets in its own namespace
//! (impersonated: `Impersonate-User`), applies its objects one by one: the victim's host and path
//! claimed again, a more specific path under it, a canary of weight 100 on it, `ssl-passthrough`
//! on it, a wildcard over it, a regex path built to cross a host boundary, a regex that
//! backtracks without bound, snippets that leave their section (a `\v` before `global`) or write
//! a map, and a TLS Secret whose key does not match its certificate. The chart runs with snippet
//! annotations allowed, so the snippet rules themselves are what refuse.
//!
//! Judged: 0 failed victim requests and 0 answered by the attacker's pod; each object meant to
//! take the victim's traffic or run something refused with a Warning Event on it; the attacker's
//! wildcard and regex path serve the attacker's own hosts only; no HAProxy container restarted.
//!
//! Owns the step [`TENANT_STEPS`]. It must never send traffic anywhere but the HAProxy Service,
//! nor leave its objects behind on success: it ends with both namespaces deleted and the release
//! back on the scenarios' ConfigMap.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch};
use kube::Client;
use serde_json::{json, Value};

use super::real::{pod_ready, restarts, RealCluster, NAMESPACE};
use super::real_hostile::user_client;
use super::real_steps::{apply_params, ensure, install_reading_config_map};
use super::scenarios::Selection;
use super::{eventually, status, wait_converged, wait_converged_on_spec, Cluster, ClusterError, Result};

/// The step's name for `HAPTIC_E2E_STEPS`.
pub const TENANT_STEPS: [&str; 1] = ["tenants"];

const VICTIM: &str = "tenant-victim";
const ATTACKER: &str = "tenant-attacker";
/// The attacker, impersonated.
const USER: &str = "tenant-attacker-dev";
const CLASS: &str = "haptic";
const HOST: &str = "victim.example";
const ANNOTATION: &str = "nginx.ingress.kubernetes.io/";

/// Runs the step if `selection` wants it, then puts the release back on the scenarios' ConfigMap.
pub async fn run_tenants(c: &mut RealCluster, selection: &Selection) -> Result<()> {
    if !TENANT_STEPS.iter().any(|s| selection.wants(s)) {
        return Ok(());
    }
    let client = c.client();
    c.install(&["ingress.enabled=true", "ingress.allowSnippetAnnotations=true"])?;
    wait_converged_on_spec(&client, NAMESPACE, 2, None).await?;
    let result = attacks_under_load(c).await;
    let cleaned = clean_up(c).await;
    result?;
    cleaned?;
    let rendered = status(&client, NAMESPACE).await?["planId"].clone();
    install_reading_config_map(c).await?;
    wait_converged_on_spec(&client, NAMESPACE, 2, Some(&rendered)).await?;
    println!("ok real tenants: both namespaces deleted; the release is back on the scenarios' ConfigMap");
    Ok(())
}

/// An Ingress of class [`CLASS`] in `ns` routing `host` `paths` (path, pathType) to `svc`, with
/// `annotations` (keys without the ingress-nginx prefix) and `tls` (a Secret name).
pub(super) fn ingress(ns: &str, name: &str, host: &str, paths: &[(&str, &str)], annotations: &[(&str, &str)]) -> Value {
    let a: serde_json::Map<String, Value> =
        annotations.iter().map(|(k, v)| (format!("{ANNOTATION}{k}"), Value::from(*v))).collect();
    let svc = format!("{ns}-web");
    let paths: Vec<Value> = paths
        .iter()
        .map(|(p, t)| json!({"path": p, "pathType": t, "backend": {"service": {"name": svc, "port": {"number": 80}}}}))
        .collect();
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
           "metadata": {"name": name, "namespace": ns, "annotations": a},
           "spec": {"ingressClassName": CLASS, "rules": [{"host": host, "http": {"paths": paths}}]}})
}

async fn apply<K>(client: &Client, ns: &str, obj: &Value) -> Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    Api::<K>::namespaced(client.clone(), ns)
        .patch(&name, &apply_params(), &Patch::Apply(obj))
        .await
        .map_err(|e| ClusterError::of(&format!("apply {} {ns}/{name}", obj["kind"]), e))?;
    Ok(())
}

/// The namespace `ns` with a backend Deployment and Service `<ns>-web` whose busybox httpd
/// answers `ns` on every path it has (`/`, `/admin/`, `/admin/x/`, `/account/`), Ready.
pub(super) async fn namespace_with_web(c: &RealCluster, ns: &str) -> Result<()> {
    let client = c.client();
    let n = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    Api::<Namespace>::all(client.clone())
        .patch(ns, &apply_params(), &Patch::Apply(&n))
        .await
        .map_err(|e| ClusterError::of(&format!("apply the namespace {ns}"), e))?;
    let web = format!("{ns}-web");
    let labels = json!({"app.kubernetes.io/name": web});
    let script = format!(
        "for d in /www /www/admin /www/admin/x /www/account; do mkdir -p $d; echo {ns} > $d/index.html; done; exec httpd -f -p 8000 -h /www"
    );
    let dep = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": web, "namespace": ns},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{
                "name": "httpd", "image": "localhost/haptic-e2e-web:1", "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "ports": [{"name": "http", "containerPort": 8000}],
                "readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}]}}}
    });
    apply::<Deployment>(&client, ns, &dep).await?;
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": web, "namespace": ns},
                     "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}});
    apply::<Service>(&client, ns, &svc).await?;
    eventually(&format!("the pod of {web} Ready"), Duration::from_secs(180), || async {
        let lp = ListParams::default().labels(&format!("app.kubernetes.io/name={web}"));
        let pods = Api::<Pod>::namespaced(c.client(), ns).list(&lp).await.ok()?.items;
        (pods.len() == 1 && pods.iter().all(pod_ready)).then_some(())
    })
    .await
}

/// The attacker's Role (Ingresses and Secrets in its namespace, nothing else) and its binding.
async fn attacker_rights(client: &Client) -> Result<()> {
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "routes-writer", "namespace": ATTACKER},
        "rules": [{"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch"]},
                  {"apiGroups": [""], "resources": ["secrets"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch"]}]});
    apply::<Role>(client, ATTACKER, &role).await?;
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "routes-writer", "namespace": ATTACKER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "routes-writer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]});
    apply::<RoleBinding>(client, ATTACKER, &binding).await
}

/// Every HAProxy pod's container restarts, by pod.
async fn haproxy_restarts(c: &RealCluster) -> Result<BTreeMap<String, i32>> {
    let pods = c.pods("app.kubernetes.io/component=haproxy").await?;
    Ok(pods.iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), restarts(p, "haproxy"))).collect())
}

/// What the victim's load saw.
#[derive(Debug, Default)]
struct Seen {
    ok: u64,
    /// Each answered by the attacker's pod: the path, and the step under way.
    attacker: Vec<String>,
    /// Each failed: the path, the step under way and what came back.
    failed: Vec<String>,
}

/// The step of the attack under way, for the load's record of what went wrong when.
type Step = Arc<std::sync::Mutex<String>>;

fn step_now(step: &Step) -> String {
    step.lock().map(|s| s.clone()).unwrap_or_default()
}

fn set_step(step: &Step, now: &str) {
    if let Ok(mut s) = step.lock() {
        *s = now.to_string();
    }
}

/// Sequential requests for the victim's `/`, `/admin/`, `/account/` and `//admin/` through the Service until `stop` (at
/// most 20,000 requests or 15 minutes).
fn victim_load(c: &RealCluster, svc: String, stop: Arc<AtomicBool>, step: Step) -> tokio::task::JoinHandle<Seen> {
    let c = c.clone();
    tokio::spawn(async move {
        let mut seen = Seen::default();
        let deadline = Instant::now() + Duration::from_secs(900);
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && i < 20_000 {
            let path = ["/", "/admin/", "/account/", "//admin/"][(i % 4) as usize];
            i += 1;
            match c.service_get(&svc, HOST, path).await {
                Ok((200, b)) if b.trim() == VICTIM => seen.ok += 1,
                Ok((200, b)) if b.trim() == ATTACKER => {
                    seen.attacker.push(format!("{path} during {}", step_now(&step)))
                }
                other => seen.failed.push(format!("{path} during {}: {other:?}", step_now(&step))),
            }
        }
        seen
    })
}

/// Waits for a Warning Event on the attacker's Ingress `name` (a render, its gate and the
/// leader's status pass come first; 180 s leaves a loaded machine room); returns its note.
async fn refused(c: &RealCluster, name: &str) -> Result<String> {
    let api: Api<Event> = Api::namespaced(c.client(), ATTACKER);
    eventually(&format!("a Warning Event on Ingress {ATTACKER}/{name}"), Duration::from_secs(180), || async {
        api.list(&ListParams::default()).await.ok()?.items.into_iter().find_map(|e| {
            let on = e
                .regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("Ingress") && r.name.as_deref() == Some(name));
            (on && e.type_.as_deref() == Some("Warning")).then(|| e.note.clone().unwrap_or_default())
        })
    })
    .await
}

/// Waits until `host` + `path` answers 200 with the body `who`.
async fn served_by(c: &RealCluster, svc: &str, host: &str, path: &str, who: &str) -> Result<()> {
    eventually(&format!("{host}{path} answered by {who}"), Duration::from_secs(90), || async {
        matches!(c.service_get(svc, host, path).await, Ok((200, b)) if b.trim() == who).then_some(())
    })
    .await
}

/// The attacker's Ingresses meant to take the victim's traffic or run something: each must be
/// refused. (name, host, paths, annotations.)
type Attack =
    (&'static str, &'static str, &'static [(&'static str, &'static str)], &'static [(&'static str, &'static str)]);
const REFUSED: &[Attack] = &[
    ("same-path", HOST, &[("/", "Prefix")], &[]),
    ("deeper-path", HOST, &[("/admin/x", "Prefix")], &[]),
    ("canary", HOST, &[("/", "Prefix")], &[("canary", "true"), ("canary-weight", "100")]),
    ("passthrough", HOST, &[("/", "Prefix")], &[("ssl-passthrough", "true")]),
    ("redos", "redos.attacker.example", &[("/a*a*a*a*[0-9]", "ImplementationSpecific")], &[("use-regex", "true")]),
    (
        "snippet-global",
        "snippet.attacker.example",
        &[("/", "Prefix")],
        &[("configuration-snippet", "\u{b}global\n\u{b}stats socket ipv4@0.0.0.0:9999 level admin")],
    ),
    (
        "snippet-map",
        "map.attacker.example",
        &[("/", "Prefix")],
        &[("configuration-snippet", "http-request set-map(maps/hosts.map) victim.example h1")],
    ),
];

async fn attacks_under_load(c: &RealCluster) -> Result<()> {
    let svc = c.service_ip().await?;
    let admin = c.client();
    namespace_with_web(c, VICTIM).await?;
    let without_victim = status(&admin, NAMESPACE).await?["planId"].clone();
    apply::<Ingress>(&admin, VICTIM, &ingress(VICTIM, "site", HOST, &[("/", "Prefix"), ("/admin", "Prefix")], &[]))
        .await?;
    namespace_with_web(c, ATTACKER).await?;
    attacker_rights(&admin).await?;
    served_by(c, &svc, HOST, "/admin/", VICTIM).await?;
    // One pod answering through the Service is not every pod: the load starts once every pod
    // runs a plan newer than the one before the victim's Ingress.
    wait_converged(&admin, NAMESPACE, 2, Some(&without_victim)).await?;
    let before = haproxy_restarts(c).await?;
    let user = user_client(USER).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let step = Step::default();
    let load = victim_load(c, svc.clone(), stop.clone(), step.clone());
    let result = apply_attacks(c, &user, &svc, &step).await;
    stop.store(true, Ordering::Relaxed);
    let seen = load.await.map_err(|e| ClusterError::of("the victim's load", e))?;
    let notes = result?;
    let after = haproxy_restarts(c).await?;
    ensure(before == after, || format!("HAProxy containers restarted: {before:?} -> {after:?}"))?;
    ensure(seen.failed.is_empty() && seen.attacker.is_empty() && seen.ok > 0, || {
        format!(
            "victim load: {} ok, {} answered by the attacker {:?}, {} failed: {:?}",
            seen.ok,
            seen.attacker.len(),
            &seen.attacker[..seen.attacker.len().min(10)],
            seen.failed.len(),
            &seen.failed[..seen.failed.len().min(10)]
        )
    })?;
    for (name, note) in &notes {
        println!("   {ATTACKER}/{name} refused: {note}");
    }
    println!(
        "ok real tenants: {} attacker objects refused with Warning Events, a wildcard and a boundary-crossing regex serve only the attacker's hosts; the victim's load: {} requests, 0 failed, 0 answered by the attacker; no HAProxy container restarted",
        notes.len(),
        seen.ok
    );
    Ok(())
}

/// Applies every attack in turn, each judged before the next; returns the refusals' notes.
async fn apply_attacks(c: &RealCluster, user: &Client, svc: &str, step: &Step) -> Result<Vec<(String, String)>> {
    let mut notes = Vec::new();
    for (name, host, paths, annotations) in REFUSED {
        set_step(step, name);
        apply::<Ingress>(user, ATTACKER, &ingress(ATTACKER, name, host, paths, annotations)).await?;
        notes.push((name.to_string(), refused(c, name).await?));
    }
    // A Secret whose key belongs to another certificate, named by a TLS Ingress of the attacker's.
    set_step(step, "bad-pair");
    let secret = mismatched_tls_secret()?;
    apply::<Secret>(user, ATTACKER, &secret).await?;
    let mut tls = ingress(ATTACKER, "bad-pair", "tls.attacker.example", &[("/", "Prefix")], &[]);
    tls["spec"]["tls"] = json!([{"hosts": ["tls.attacker.example"], "secretName": "bad-pair"}]);
    apply::<Ingress>(user, ATTACKER, &tls).await?;
    notes.push(("bad-pair".into(), refused(c, "bad-pair").await?));
    // Accepted for the attacker's own names, never for the victim's.
    set_step(step, "wildcard");
    let wild = ingress(ATTACKER, "wildcard", "*.example", &[("/", "Prefix")], &[]);
    apply::<Ingress>(user, ATTACKER, &wild).await?;
    served_by(c, svc, "other.example", "/", ATTACKER).await?;
    set_step(step, "regex");
    let regex = ingress(
        ATTACKER,
        "regex",
        "r.attacker.example",
        &[("/?[0-9]*/account", "ImplementationSpecific")],
        &[("use-regex", "true")],
    );
    apply::<Ingress>(user, ATTACKER, &regex).await?;
    served_by(c, svc, "r.attacker.example", "/account/", ATTACKER).await?;
    served_by(c, svc, HOST, "/admin/", VICTIM).await?;
    Ok(notes)
}

/// A `kubernetes.io/tls` Secret `bad-pair` whose key is not the certificate's (two fresh
/// self-signed pairs from openssl, crossed).
fn mismatched_tls_secret() -> Result<Value> {
    let dir = tempfile::tempdir().map_err(|e| ClusterError::of("a temp dir", e))?;
    let mut pem = Vec::new();
    for name in ["a", "b"] {
        let (crt, key) = (dir.path().join(format!("{name}.crt")), dir.path().join(format!("{name}.key")));
        let out = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=tls.attacker.example", "-days", "1"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&crt)
            .output()
            .map_err(|e| ClusterError::of("openssl", e))?;
        ensure(out.status.success(), || String::from_utf8_lossy(&out.stderr).into_owned())?;
        pem.push((std::fs::read(&crt).unwrap_or_default(), std::fs::read(&key).unwrap_or_default()));
    }
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
              "metadata": {"name": "bad-pair", "namespace": ATTACKER},
              "stringData": {"tls.crt": text(&pem[0].0), "tls.key": text(&pem[1].1)}}))
}

/// Deletes both namespaces and waits until they are gone.
async fn clean_up(c: &RealCluster) -> Result<()> {
    delete_namespaces(c, &[ATTACKER, VICTIM]).await
}

/// Deletes the namespaces `names` and waits until they are gone.
pub(super) async fn delete_namespaces(c: &RealCluster, names: &[&str]) -> Result<()> {
    let nss: Api<Namespace> = Api::all(c.client());
    for ns in names {
        let _ = nss.delete(ns, &DeleteParams::default()).await;
    }
    for ns in names {
        eventually(&format!("the namespace {ns} gone"), Duration::from_secs(180), || async {
            matches!(nss.get_opt(ns).await, Ok(None)).then_some(())
        })
        .await?;
    }
    Ok(())
}
