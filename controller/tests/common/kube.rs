//! Kubernetes-mode test helpers: the real control plane with the CRD, namespaces, the agents'
//! credentials Secret, `haptic-controller run --kubernetes` as a process (killed on drop), the
//! HAProxyConfig's status and the pods' worker pids.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use haptic_controller::kubernetes::crd::HAProxyConfig;
use haptic_e2e::k8s::{ControlPlane, LocalPods, LocalPodsOpts};
use haptic_e2e::net::http_request;
use haptic_e2e::{free_port, http_get, HaproxyBin};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::json;

/// LocalPods options whose agents are the binary Cargo built for these tests.
pub fn local_opts(ns: &str, bin: &HaproxyBin) -> LocalPodsOpts {
    let mut o = LocalPodsOpts::new(ns, bin.clone(), USER, PASSWORD);
    o.pod.agent_bin = Some(super::agent_bin());
    // A rotated credentials file is seen quickly, and the replaced credential is refused at
    // once (so a converged pod proves which credential the controller used).
    o.pod.extra_args.extend(["--credentials-poll", "200ms", "--credentials-grace", "0s"].map(String::from));
    o
}

pub const DEADLINE: Duration = Duration::from_secs(60);
pub const USER: &str = "haptic";
pub const PASSWORD: &str = "k8s-secret-pw";

/// A `haptic-controller run --kubernetes` process, killed (process group) on drop.
pub struct Controller {
    child: Option<Child>,
    log: PathBuf,
    /// The identity.
    pub identity: String,
    /// The admin address.
    pub admin: SocketAddr,
}

impl Controller {
    pub fn start(cp: &ControlPlane, ns: &str, bin: &HaproxyBin, identity: &str, dir: &Path) -> Controller {
        Self::start_with(cp, ns, bin, identity, dir, &[])
    }

    /// [`Self::start`] with `extra` flags.
    pub fn start_with(
        cp: &ControlPlane,
        ns: &str,
        bin: &HaproxyBin,
        identity: &str,
        dir: &Path,
        extra: &[&str],
    ) -> Controller {
        Self::start_as(cp.kubeconfig(), ns, bin, identity, dir, extra)
    }

    /// [`Self::start_with`] with the credentials of `kubeconfig` instead of the admin's.
    pub fn start_as(
        kubeconfig: &Path,
        ns: &str,
        bin: &HaproxyBin,
        identity: &str,
        dir: &Path,
        extra: &[&str],
    ) -> Controller {
        let log = dir.join(format!("controller-{identity}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let child = Command::new(env!("CARGO_BIN_EXE_haptic-controller"))
            .args(["run", "--kubernetes", "--namespace", ns, "--config", "edge", "--identity", identity])
            .args(["--admin-listen", &admin.to_string(), "--settle", "50ms"])
            .args(["--lease-duration", "4s", "--renew-deadline", "3s", "--retry-period", "500ms"])
            .args(["--drift-interval", "600s"])
            .args(extra)
            .arg("--haproxy-bin")
            .arg(&bin.path)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap();
        Controller { child: Some(child), log, identity: identity.into(), admin }
    }

    /// The value of a metric line (`name{labels}`) on the controller's `/metrics`, 0 if absent.
    pub async fn metric(&self, line: &str) -> f64 {
        let Ok((200, text)) = http_get(self.admin, "/metrics").await else { return 0.0 };
        text.lines().find_map(|l| l.strip_prefix(line).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = killpg(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.wait();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("--- log of controller {} ---\n{}", self.identity, self.log());
        }
    }
}

pub async fn apply_crd(client: &Client) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/haptic/crds/haproxyconfig.yaml");
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.create(&PostParams::default(), &crd).await.unwrap();
    eventually("the HAProxyConfig CRD to be established", || {
        let api = api.clone();
        async move {
            let c = api.get("haproxyconfigs.haptic.dev").await.ok()?;
            c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        }
    })
    .await;
}

pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    haptic_e2e::cluster::eventually(what, DEADLINE, check).await.unwrap_or_else(|e| panic!("{e}"))
}

pub async fn put_secret(client: &Client, ns: &str, password: &str) {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "haptic-agent-credentials"},
                   "stringData": {"username": USER, "password": password}});
    api.patch("haptic-agent-credentials", &PatchParams::apply("haptic-test").force(), &Patch::Apply(&s)).await.unwrap();
}

pub async fn status_of(api: &Api<HAProxyConfig>) -> serde_json::Value {
    let obj = api.get("edge").await.unwrap();
    serde_json::to_value(obj.status).unwrap()
}

pub fn condition<'a>(status: &'a serde_json::Value, type_: &str) -> Option<&'a serde_json::Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// Waits until `Converged=True` on `plan` (if given) for `n` pods; returns the status.
pub async fn converged(api: &Api<HAProxyConfig>, n: u64, not_plan: Option<&str>) -> serde_json::Value {
    eventually(&format!("{n} pods converged"), || async {
        let s = status_of(api).await;
        let ok = condition(&s, "Converged").is_some_and(|c| c["status"] == "True")
            && s["converged"] == n
            && s["total"] == n
            && not_plan.is_none_or(|p| s["planId"] != p);
        ok.then_some(s)
    })
    .await
}

pub async fn worker_pids(pods: &LocalPods) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for n in pods.names() {
        out.insert(n.clone(), pods.pod(&n).unwrap().haproxy().worker_pid().await.unwrap());
    }
    out
}

pub struct Env {
    pub cp: ControlPlane,
    pub client: Client,
    pub dir: tempfile::TempDir,
}

pub async fn env() -> Env {
    env_of(ControlPlane::start().await).await
}

/// [`env`] with the apiserver's audit log on.
pub async fn env_audited() -> Env {
    env_of(ControlPlane::start_audited().await).await
}

async fn env_of(cp: Result<ControlPlane, haptic_e2e::k8s::ControlPlaneError>) -> Env {
    let cp = cp.unwrap_or_else(|e| panic!("control plane: {e}"));
    let client = cp.client().await.unwrap();
    apply_crd(&client).await;
    Env { cp, client, dir: tempfile::tempdir().unwrap() }
}

pub async fn namespace(client: &Client, ns: &str) {
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &obj).await.unwrap();
}

/// The object's status was written with server-side apply by the field manager
/// `haptic-controller`.
pub fn assert_status_applied(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    let managed = meta.managed_fields.clone().unwrap_or_default();
    assert!(
        managed.iter().any(|m| m.manager.as_deref() == Some("haptic-controller")
            && m.operation.as_deref() == Some("Apply")
            && m.subresource.as_deref() == Some("status")),
        "{managed:?}"
    );
}

/// Applies `v` (any kind the apiserver knows) by server-side apply as `haptic-test`.
pub async fn apply(client: &Client, v: serde_json::Value) {
    let kind = v["kind"].as_str().unwrap().to_string();
    let name = v["metadata"]["name"].as_str().unwrap().to_string();
    let ns = v["metadata"]["namespace"].as_str().map(String::from);
    let (group, version) = match v["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, ver)) => (g.to_string(), ver.to_string()),
        None => (String::new(), v["apiVersion"].as_str().unwrap().to_string()),
    };
    let gvk = kube::api::GroupVersionKind::gvk(&group, &version, &kind);
    let (ar, _) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let api: Api<kube::api::DynamicObject> = match &ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.patch(&name, &PatchParams::apply("haptic-test").force(), &Patch::Apply(&v)).await.unwrap();
}

/// The status of `GET path` with `Host: host` on every pod's frontend.
pub async fn codes(pods: &LocalPods, fe: u16, host: &str, path: &str) -> Vec<u16> {
    let mut out = Vec::new();
    for n in pods.names() {
        let addr = SocketAddr::from((pods.ip(&n).unwrap(), fe));
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        out.push(http_request(addr, &req).await.map_or(0, |(c, _)| c));
    }
    out
}

/// Waits until every pod answers `host` `path` with `code`.
pub async fn answers(pods: &LocalPods, fe: u16, host: &str, path: &str, code: u16) {
    eventually(&format!("{host}{path} → {code} on every pod"), || async {
        codes(pods, fe, host, path).await.iter().all(|c| *c == code).then_some(())
    })
    .await;
}

/// Waits for the fleet to converge on a plan other than `plan`, every pod by `runtime` with
/// its worker unchanged from `pids`; returns the new plan.
pub async fn runtime_change(api: &Api<HAProxyConfig>, pods: &LocalPods, plan: &str, what: &str) -> String {
    let before = worker_pids(pods).await;
    let s = converged(api, 2, Some(plan)).await;
    for p in s["deployedToPods"].as_array().unwrap() {
        assert_eq!(p["mode"], "runtime", "{what}: {p}");
    }
    assert_eq!(worker_pids(pods).await, before, "{what} must not reload");
    s["planId"].as_str().unwrap().to_string()
}

/// Waits for a change that adds a backend section: a [`runtime_change`] on HAProxy 3.4
/// (`backend.add`), a reload on every pod before 3.4; returns the new plan.
#[allow(dead_code)]
pub async fn new_backend_change(
    api: &Api<HAProxyConfig>,
    pods: &LocalPods,
    plan: &str,
    what: &str,
    bin: &HaproxyBin,
) -> String {
    if bin.version >= (3, 4, 0) {
        return runtime_change(api, pods, plan, what).await;
    }
    let s = converged(api, 2, Some(plan)).await;
    for p in s["deployedToPods"].as_array().unwrap() {
        assert_eq!(p["mode"], "reload", "{what} on {}: {p}", bin.label());
    }
    s["planId"].as_str().unwrap().to_string()
}

/// The chart's RBAC for release `edge` in `fleet`, rendered with `values` and applied, and a
/// kubeconfig of its controller's ServiceAccount: returns the account's name and that file.
pub async fn chart_rbac(e: &Env, values: &[&str]) -> (String, PathBuf) {
    let chart = haptic_e2e::tools::render_chart("edge", "fleet", values);
    let rbac = ["ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"];
    for o in chart.iter().filter(|o| rbac.contains(&o["kind"].as_str().unwrap_or_default())) {
        apply(&e.client, o.clone()).await;
    }
    let sa = chart
        .iter()
        .filter(|o| o["kind"] == "ServiceAccount")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .find(|n| n.ends_with("-controller"))
        .expect("the controller's ServiceAccount")
        .to_string();
    let kubeconfig = e.cp.kubeconfig_for("fleet", &sa).await.unwrap();
    (sa, kubeconfig)
}

/// What the ServiceAccount `fleet/sa` asked the apiserver, from its audit log, after checking
/// that it watched `(namespace, resource)` `watched` (the log has its watches), was never refused
/// and asked nothing of the namespace `outside`.
pub fn audited_as(e: &Env, sa: &str, watched: (&str, &str), outside: &str) -> Vec<haptic_e2e::k8s::AuditEntry> {
    let user = format!("system:serviceaccount:fleet:{sa}");
    let asked: Vec<_> = e.cp.audit().into_iter().filter(|a| a.user == user).collect();
    let (ns, resource) = watched;
    assert!(
        asked.iter().any(|a| a.namespace() == Some(ns) && a.verb == "watch" && a.uri.contains(&format!("/{resource}"))),
        "the audit log has the controller's watch of {resource} in {ns}: {asked:#?}"
    );
    let refused: Vec<_> = asked.iter().filter(|a| a.code == 403).collect();
    assert!(refused.is_empty(), "the chart's Roles grant everything the scoped controller asks: {refused:#?}");
    let third: Vec<_> = asked.iter().filter(|a| a.namespace() == Some(outside)).collect();
    assert!(third.is_empty(), "nothing asked of the namespace {outside}: {third:#?}");
    asked
}

/// Whether `uri`, outside every namespace, is API discovery or a read of one of the
/// cluster-scoped `kinds` (group, resource; the core group is "").
pub fn cluster_read(uri: &str, kinds: &[(&str, &str)]) -> bool {
    let path = uri.split('?').next().unwrap_or_default();
    let words: Vec<&str> = path.split('/').filter(|w| !w.is_empty()).collect();
    let resource = match words.as_slice() {
        ["api"] | ["apis"] | ["version"] | ["api", _] | ["apis", _, _] => return true,
        ["api", "v1", resource, ..] => ("", *resource),
        ["apis", group, _, resource, ..] => (*group, *resource),
        _ => return false,
    };
    kinds.contains(&resource)
}
