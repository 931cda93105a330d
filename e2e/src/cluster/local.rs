//! The local backend: the local control plane, `LocalPods` and two controller processes.
//!
//! Owns starting the whole stack for one namespace (CRD, credentials Secret, pods, controllers
//! with short Lease timings), and the kills a kubelet or a Deployment would do. Every process
//! is stopped on drop, also during a panic. It must never bind outside 127.0.0.0/8.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::{eventually, Cluster, ClusterError, Result};
use crate::bins::{workspace_root, HaproxyBin};
use crate::k8s::{Container, ControlPlane, LocalPods, LocalPodsOpts};
use crate::net::{free_port, http_get};
use crate::pod::{sibling_bin, AgentClient};

/// The agents' credentials in the local backend.
pub const USER: &str = "haptic";
/// The agents' password in the local backend.
pub const PASSWORD: &str = "e2e-local-secret";

/// The controller binary: `HAPTIC_CONTROLLER_BIN`, else next to the running executable.
pub fn controller_bin() -> PathBuf {
    sibling_bin("haptic-controller", "HAPTIC_CONTROLLER_BIN").unwrap_or_else(|| {
        panic!("haptic-controller not found next to the test executable: `cargo build -p haptic-controller` or set HAPTIC_CONTROLLER_BIN")
    })
}

/// One `haptic-controller run --kubernetes` process, killed on drop.
#[derive(Debug)]
struct ControllerProc {
    identity: String,
    child: Option<Child>,
    log: PathBuf,
}

impl ControllerProc {
    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(raw) = i32::try_from(c.id()) {
                let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
            }
            let _ = c.wait();
        }
    }
}

impl Drop for ControllerProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The whole stack on loopback.
pub struct LocalCluster {
    // Drop order: controllers, then pods, then the control plane, then the directory.
    controllers: Vec<ControllerProc>,
    pods: LocalPods,
    cp: ControlPlane,
    client: Client,
    ns: String,
    fe: u16,
    bin: HaproxyBin,
    next_controller: usize,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster").field("namespace", &self.ns).finish_non_exhaustive()
    }
}

impl LocalCluster {
    /// Starts the control plane, applies the CRD, creates the namespace, the credentials Secret,
    /// `pods` HAProxy pods of `bin`, and two controller replicas.
    pub async fn start(bin: &HaproxyBin, pods: usize) -> Result<Self> {
        let cp = ControlPlane::start().await.map_err(|e| ClusterError::of("start the control plane", e))?;
        let client = cp.client().await.map_err(|e| ClusterError::of("client", e))?;
        let crd_path = workspace_root().join("charts/haptic/crds/haproxyconfig.yaml");
        let text = std::fs::read_to_string(&crd_path).map_err(|e| ClusterError::of("read the CRD", e))?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).map_err(|e| ClusterError::of("parse the CRD", e))?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &crd).await.map_err(|e| ClusterError::of("create the CRD", e))?;
        eventually("the CRD to be established", Duration::from_secs(30), || {
            let crds = crds.clone();
            async move {
                let c = crds.get("haproxyconfigs.haptic.dev").await.ok()?;
                c.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
            }
        })
        .await?;
        let ns = "haptic".to_string();
        let nsobj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &nsobj)
            .await
            .map_err(|e| ClusterError::of("create the namespace", e))?;
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "haptic-agent-credentials"},
                            "stringData": {"username": USER, "password": PASSWORD}});
        Api::<Secret>::namespaced(client.clone(), &ns)
            .patch("haptic-agent-credentials", &PatchParams::apply("haptic-e2e").force(), &Patch::Apply(&secret))
            .await
            .map_err(|e| ClusterError::of("create the Secret", e))?;
        let mut opts = LocalPodsOpts::new(&ns, bin.clone(), USER, PASSWORD);
        opts.pod.min_reload_interval = "2s".into();
        let mut local = LocalPods::new(client.clone(), opts);
        local.create(pods).await.map_err(|e| ClusterError::of("create the pods", e))?;
        let dir = tempfile::tempdir().map_err(|e| ClusterError::of("temp dir", e))?;
        let mut c = LocalCluster {
            controllers: Vec::new(),
            pods: local,
            cp,
            client,
            ns,
            fe: free_port(),
            bin: bin.clone(),
            next_controller: 0,
            dir,
        };
        c.start_controller()?;
        c.start_controller()?;
        Ok(c)
    }

    fn start_controller(&mut self) -> Result<()> {
        let identity = format!("ctl-{}", self.next_controller);
        self.next_controller += 1;
        let log = self.dir.path().join(format!("{identity}.log"));
        let out = std::fs::File::create(&log).map_err(|e| ClusterError::of("controller log", e))?;
        let err = out.try_clone().map_err(|e| ClusterError::of("controller log", e))?;
        let child = Command::new(controller_bin())
            .args(["run", "--kubernetes", "--namespace", &self.ns, "--config", super::CONFIG, "--identity", &identity])
            .args(["--admin-listen", "127.0.0.1:0", "--settle", "50ms"])
            .args(["--lease-duration", "4s", "--renew-deadline", "3s", "--retry-period", "500ms"])
            .arg("--haproxy-bin")
            .arg(&self.bin.path)
            .env("KUBECONFIG", self.cp.kubeconfig())
            .env("RUST_LOG", "info,kube=warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| ClusterError::of("spawn haptic-controller", e))?;
        self.controllers.push(ControllerProc { identity, child: Some(child), log });
        Ok(())
    }

    /// The frontend port every pod binds on its own IP.
    pub fn frontend_port(&self) -> u16 {
        self.fe
    }

    /// The agent port (the resource's `spec.agent.port`).
    pub fn agent_port(&self) -> u16 {
        self.pods.agent_port()
    }

    /// The kubeconfig of the control plane.
    pub fn kubeconfig(&self) -> &Path {
        self.cp.kubeconfig()
    }

    /// Every controller's log (for failures).
    pub fn controller_logs(&self) -> String {
        self.controllers
            .iter()
            .map(|c| format!("--- {} ---\n{}\n", c.identity, std::fs::read_to_string(&c.log).unwrap_or_default()))
            .collect()
    }

    fn agent(&self, pod: &str) -> Result<AgentClient> {
        let url = self.pods.agent_url(pod).ok_or_else(|| ClusterError(format!("no pod {pod}")))?;
        let addr: SocketAddr =
            url.trim_start_matches("http://").parse().map_err(|e| ClusterError::of("agent url", e))?;
        Ok(AgentClient { addr, auth: Some((USER.into(), PASSWORD.into())) })
    }
}

impl Cluster for LocalCluster {
    fn client(&self) -> Client {
        self.client.clone()
    }

    fn namespace(&self) -> &str {
        &self.ns
    }

    fn bind_line(&self) -> String {
        format!("bind \"${{POD_IP}}:{}\"", self.fe)
    }

    async fn haproxy_pods(&self) -> Result<Vec<String>> {
        Ok(self.pods.names())
    }

    async fn scale_haproxy(&mut self, n: usize) -> Result<()> {
        let names = self.pods.names();
        if n > names.len() {
            self.pods.create(n - names.len()).await.map_err(|e| ClusterError::of("scale up", e))?;
        }
        for name in names.iter().rev().take(names.len().saturating_sub(n)) {
            self.pods.delete(name).await.map_err(|e| ClusterError::of("scale down", e))?;
        }
        Ok(())
    }

    async fn replace_all_haproxy(&mut self) -> Result<()> {
        for name in self.pods.names() {
            self.pods.replace(&name).await.map_err(|e| ClusterError::of("replace a pod", e))?;
        }
        Ok(())
    }

    async fn get(&self, pod: &str, path: &str) -> Result<(u16, String)> {
        let ip = self.pods.ip(pod).ok_or_else(|| ClusterError(format!("no pod {pod}")))?;
        http_get(SocketAddr::from((ip, self.fe)), path)
            .await
            .map_err(|e| ClusterError::of(&format!("GET {path} via {pod}"), e))
    }

    async fn agent_state(&self, pod: &str) -> Result<Value> {
        let (code, body) = self.agent(pod)?.get("/v1/state").await.map_err(|e| ClusterError::of("GET /v1/state", e))?;
        if code != 200 {
            return Err(ClusterError(format!("GET /v1/state of {pod}: {code} {body}")));
        }
        serde_json::from_str(&body).map_err(|e| ClusterError::of("decode /v1/state", e))
    }

    async fn restart_agent(&mut self, pod: &str) -> Result<()> {
        self.pods.kill_container(pod, Container::Agent).await.map_err(|e| ClusterError::of("kill the agent", e))?;
        self.pods.restart_container(pod, Container::Agent).await.map_err(|e| ClusterError::of("restart the agent", e))
    }

    async fn kill_haproxy_worker(&mut self, pod: &str) -> Result<()> {
        let p = self.pods.pod(pod).ok_or_else(|| ClusterError(format!("no pod {pod}")))?;
        let worker = p.haproxy().worker_pid().await.map_err(|e| ClusterError::of("worker pid", e))?;
        let raw = i32::try_from(worker).map_err(|e| ClusterError::of("pid", e))?;
        kill(Pid::from_raw(raw), Signal::SIGKILL).map_err(|e| ClusterError::of("kill the worker", e))?;
        // The master exits once its only worker died: the container is gone; the kubelet
        // stand-in records that and starts it again, as a kubelet would.
        let hap = self.pods.pod(pod).ok_or_else(|| ClusterError(format!("no pod {pod}")))?;
        let _ = eventually("the HAProxy master to exit", Duration::from_secs(10), || async {
            (!hap.haproxy_running()).then_some(())
        })
        .await;
        self.pods.kill_container(pod, Container::Haproxy).await.map_err(|e| ClusterError::of("record the exit", e))?;
        self.pods.restart_container(pod, Container::Haproxy).await.map_err(|e| ClusterError::of("restart HAProxy", e))
    }

    async fn edit_file_in_pod(&self, pod: &str, path: &str, content: &str) -> Result<()> {
        let p = self.pods.pod(pod).ok_or_else(|| ClusterError(format!("no pod {pod}")))?;
        let target = p.root().join("current").join(path);
        std::fs::write(&target, content).map_err(|e| ClusterError::of(&format!("write {}", target.display()), e))
    }

    async fn kill_leader(&mut self) -> Result<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        let lease = leases.get("haptic-edge").await.map_err(|e| ClusterError::of("get the Lease", e))?;
        let holder =
            lease.spec.and_then(|s| s.holder_identity).ok_or_else(|| ClusterError("nobody holds the Lease".into()))?;
        let i = self
            .controllers
            .iter()
            .position(|c| c.identity == holder)
            .ok_or_else(|| ClusterError(format!("the holder {holder} is not one of this cluster's controllers")))?;
        let mut dead = self.controllers.remove(i);
        dead.kill9();
        // A Deployment would start a replacement replica.
        self.start_controller()?;
        Ok(holder)
    }
}
