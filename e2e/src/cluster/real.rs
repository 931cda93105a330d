//! The real-cluster backend: a Kubernetes cluster reached through a kubeconfig, with both haptic
//! images loaded into its nodes and `charts/haptic` installed by helm (by this backend).
//!
//! Two providers make such a cluster, and differ only in how a node is reached:
//! - [`Provider::Local`] (`HAPTIC_E2E_CLUSTER=real`): `scripts/cluster.sh` on this machine
//!   (kubelet + containerd nodes in network namespaces). The host reaches pod IPs and ClusterIPs
//!   directly; node commands go through `scripts/cluster.sh ctr N` and `stop-node N`, and the
//!   pods' volumes are under `target/cluster/run/nodeN/kubelet`.
//! - [`Provider::Kind`] (`HAPTIC_E2E_CLUSTER=kind`, `scripts/e2e-kind.sh`): kind's nodes are
//!   Docker containers; requests to pods go through the API's port-forward, Service traffic and
//!   node commands through `docker exec <node>`.
//!
//! Owns installing, upgrading and uninstalling the release (`helm`, the values file the
//! provider's script wrote: `HAPTIC_E2E_VALUES`), finding the chart's objects, traffic and agent
//! checks, and container kills through the node's `ctr`. It must never change the cluster
//! beyond the release's namespace, except the CRD that helm installs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{eventually, Cluster, ClusterError, Result};
use crate::bins::workspace_root;
use crate::net::{http_request, http_request_within, parse_http_response};
use crate::pod::base64;

/// The helm release, and the prefix of the chart's object names.
pub const RELEASE: &str = "haptic";
/// The release's namespace.
pub const NAMESPACE: &str = "haptic";
/// The HAProxy Deployment and Service.
pub const HAPROXY: &str = "haptic-haproxy";
/// The controller Deployment.
pub const CONTROLLER: &str = "haptic-controller";
/// The agents' credentials Secret.
pub const CREDENTIALS: &str = "haptic-agent-credentials";
/// The agents' serving Secret (`tls.crt`, `tls.key`, `ca.crt`), which the controller issues.
pub const AGENT_TLS: &str = "haptic-agent-tls";
/// The DNS name in every agent's certificate (the chart's `<fullname>-agent.<namespace>.svc`).
pub const AGENT_TLS_NAME: &str = "haptic-agent.haptic.svc";
/// The Lease of the `HAProxyConfig` the scenarios drive.
pub const LEASE: &str = "haptic-edge";
/// HAProxy's traffic port in the pods (the chart's `haproxy.ports.http`) and its health port.
pub const HTTP_PORT: u16 = 8080;
/// The health port of the chart (`/healthz`, `/ready`).
pub const HEALTH_PORT: u16 = 8404;
/// The agents' port (the chart's `agent.port`).
pub const AGENT_PORT: u16 = 9080;
/// The Service's port.
pub const SERVICE_PORT: u16 = 80;
/// Log lines per controller replica in [`RealCluster::diagnostics`].
const DIAGNOSTIC_LOG_LINES: i64 = 60;

/// How the cluster's nodes are reached.
#[derive(Debug, Clone)]
pub enum Provider {
    /// `scripts/cluster.sh` on this machine.
    Local {
        /// The script.
        script: PathBuf,
        /// Its state directory (`target/cluster`).
        state: PathBuf,
    },
    /// kind: nodes are Docker containers named like the nodes.
    Kind,
}

/// A real cluster with haptic's images loaded.
#[derive(Clone)]
pub struct RealCluster {
    client: Client,
    provider: Provider,
    helm: PathBuf,
    values: PathBuf,
    /// The kubeconfig helm is given (`None`: helm reads `KUBECONFIG` itself).
    kubeconfig: Option<PathBuf>,
}

impl std::fmt::Debug for RealCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealCluster").field("provider", &self.provider).finish_non_exhaustive()
    }
}

/// A command's standard output, or its failure with what it wrote (stdin closed).
pub(super) fn run(cmd: &mut Command) -> Result<String> {
    let what = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| ClusterError::of(&what, e))?;
    if !out.status.success() {
        return Err(ClusterError(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The restart count of `container` in `p`.
pub fn restarts(p: &Pod, container: &str) -> i32 {
    container_status(p, container).map_or(0, |c| c.restart_count)
}

fn container_status<'a>(p: &'a Pod, container: &str) -> Option<&'a k8s_openapi::api::core::v1::ContainerStatus> {
    p.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == container)
}

/// Whether the pod's `Ready` condition is `True`.
pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl RealCluster {
    /// Connects through `KUBECONFIG`. `HAPTIC_E2E_VALUES` names the values file the provider's
    /// script wrote (images, pull policy); `HAPTIC_HELM` the helm binary (default `helm`).
    pub async fn connect(provider: Provider) -> Result<Self> {
        let client = Client::try_default().await.map_err(|e| ClusterError::of("kubeconfig", e))?;
        let values = std::env::var_os("HAPTIC_E2E_VALUES").map(PathBuf::from).ok_or_else(|| {
            ClusterError("HAPTIC_E2E_VALUES is not set (the chart values for the loaded images)".into())
        })?;
        let helm = std::env::var_os("HAPTIC_HELM").map_or_else(|| PathBuf::from("helm"), PathBuf::from);
        Ok(Self { client, provider, helm, values, kubeconfig: None })
    }

    /// Connects through the kubeconfig file `kubeconfig`, with the chart values file `values` and
    /// the helm binary `helm` (for callers that are not the test, e.g. the bench).
    pub async fn connect_with(
        provider: Provider,
        kubeconfig: &std::path::Path,
        values: PathBuf,
        helm: PathBuf,
    ) -> Result<Self> {
        let kc =
            kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| ClusterError::of("read the kubeconfig", e))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| ClusterError::of("kubeconfig", e))?;
        let client = Client::try_from(config).map_err(|e| ClusterError::of("client", e))?;
        Ok(Self { client, provider, helm, values, kubeconfig: Some(kubeconfig.to_path_buf()) })
    }

    /// The provider for `scripts/cluster.sh` in this workspace.
    pub fn local_provider() -> Provider {
        let root = workspace_root();
        Provider::Local { script: root.join("scripts/cluster.sh"), state: root.join("target/cluster") }
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// Whether the host reaches pod IPs and ClusterIPs.
    fn routed(&self) -> bool {
        matches!(self.provider, Provider::Local { .. })
    }

    /// Whether the host reaches the Service's ClusterIP directly (this machine's cluster), or
    /// only through a node (kind).
    pub fn is_routed(&self) -> bool {
        self.routed()
    }

    /// The host's own address on the nodes' network, which pods reach (this machine's cluster:
    /// `scripts/cluster.sh` gives the host 10.99.0.1, where the apiserver listens); `None` on
    /// kind.
    pub fn host_address(&self) -> Option<std::net::IpAddr> {
        self.routed().then_some(std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 99, 0, 1)))
    }

    fn helm(&self) -> Command {
        let mut c = Command::new(&self.helm);
        c.args(["--namespace", NAMESPACE]);
        if let Some(k) = &self.kubeconfig {
            c.arg("--kubeconfig").arg(k);
        }
        c
    }

    /// `helm upgrade --install` of the chart with the provider's values plus `set` (`key=value`),
    /// waiting for the rollout.
    pub fn install(&self, set: &[&str]) -> Result<()> {
        let chart = workspace_root().join("charts/haptic");
        let mut c = self.helm();
        c.args(["upgrade", "--install", RELEASE]).arg(&chart).args(["--create-namespace", "--wait", "--timeout", "5m"]);
        c.arg("--values").arg(&self.values);
        for s in set {
            c.args(["--set", s]);
        }
        run(&mut c).map(|_| ())
    }

    /// `helm uninstall`, waiting for the objects to go.
    pub fn uninstall(&self) -> Result<()> {
        run(self.helm().args(["uninstall", RELEASE, "--wait", "--timeout", "3m"])).map(|_| ())
    }

    /// A command on `node`: `ctr -n k8s.io ARGS` there.
    fn ctr(&self, node: &str, args: &[&str]) -> Result<String> {
        match &self.provider {
            Provider::Local { script, .. } => {
                let n = node_index(node)?;
                run(Command::new(script).arg("ctr").arg(n.to_string()).args(args))
            }
            Provider::Kind => run(Command::new("docker").args(["exec", node, "ctr", "-n", "k8s.io"]).args(args)),
        }
    }

    /// Stops `node`'s kubelet and containerd (its containers keep running, the node stops
    /// reporting).
    pub fn stop_node(&self, node: &str) -> Result<()> {
        match &self.provider {
            Provider::Local { script, .. } => {
                run(Command::new(script).arg("stop-node").arg(node_index(node)?.to_string())).map(|_| ())
            }
            // `stop`, not `kill`: kind's units restart a killed kubelet or containerd after 1 s
            // (Restart=always); containerd's KillMode=process leaves the containers' shims running.
            Provider::Kind => {
                run(Command::new("docker").args(["exec", node, "systemctl", "stop", "kubelet", "containerd"]))
                    .map(|_| ())
            }
        }
    }

    /// The HAProxy Service's ClusterIP.
    pub async fn service_ip(&self) -> Result<String> {
        let svc: Service = Api::namespaced(self.client.clone(), NAMESPACE)
            .get(HAPROXY)
            .await
            .map_err(|e| ClusterError::of("get the HAProxy Service", e))?;
        svc.spec.and_then(|s| s.cluster_ip).ok_or_else(|| ClusterError("the HAProxy Service has no ClusterIP".into()))
    }

    /// `GET path` (with `Host: host`) through the HAProxy Service, from the host (kind: from a
    /// node); 5 s timeout.
    pub async fn service_get(&self, ip: &str, host: &str, path: &str) -> Result<(u16, String)> {
        self.service_get_within(ip, host, path, Duration::from_secs(5)).await
    }

    /// [`RealCluster::service_get`] with its own timeout.
    pub async fn service_get_within(&self, ip: &str, host: &str, path: &str, t: Duration) -> Result<(u16, String)> {
        if self.routed() {
            let addr: SocketAddr =
                format!("{ip}:{SERVICE_PORT}").parse().map_err(|e| ClusterError::of("Service address", e))?;
            let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
            return http_request_within(addr, &req, t).await.map_err(|e| ClusterError::of("Service request", e));
        }
        let node = self.nodes().await?.into_iter().next().ok_or_else(|| ClusterError("no node".into()))?;
        let out = run(Command::new("docker").args([
            "exec",
            &node,
            "curl",
            "-s",
            "-i",
            "--max-time",
            &t.as_secs().max(1).to_string(),
            "-H",
            &format!("Host: {host}"),
            &format!("http://{ip}:{SERVICE_PORT}{path}"),
        ]))?;
        parse_http_response(out.as_bytes()).map_err(|e| ClusterError::of("Service response", e))
    }

    /// The cluster's node names, sorted.
    pub async fn nodes(&self) -> Result<Vec<String>> {
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let mut names: Vec<String> = api
            .list(&ListParams::default())
            .await
            .map_err(|e| ClusterError::of("list nodes", e))?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// A pod of the release's namespace.
    pub async fn pod(&self, name: &str) -> Result<Pod> {
        self.pods_api().get(name).await.map_err(|e| ClusterError::of(&format!("get pod {name}"), e))
    }

    /// The pods matching `selector` (not being deleted), sorted by name.
    pub async fn pods(&self, selector: &str) -> Result<Vec<Pod>> {
        let list = self
            .pods_api()
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|e| ClusterError::of("list pods", e))?;
        let mut pods: Vec<Pod> = list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// What a failed step prints besides its own message: the HAProxyConfig's status table and
    /// conditions, and the last lines each controller replica logged.
    pub async fn diagnostics(&self) -> String {
        let mut out = match super::status(&self.client, NAMESPACE).await {
            Ok(s) => format!("HAProxyConfig status:\n{}conditions: {}\n", super::status_table(&s), s["conditions"]),
            Err(e) => format!("HAProxyConfig status: {e}\n"),
        };
        let selector = "app.kubernetes.io/name=haptic,app.kubernetes.io/component=controller";
        for p in self.pods(selector).await.unwrap_or_default() {
            let name = p.metadata.name.unwrap_or_default();
            let lp = LogParams { tail_lines: Some(DIAGNOSTIC_LOG_LINES), ..LogParams::default() };
            match self.pods_api().logs(&name, &lp).await {
                Ok(log) => out.push_str(&format!("the last {DIAGNOSTIC_LOG_LINES} lines of {name}'s log:\n{log}\n")),
                Err(e) => out.push_str(&format!("{name}'s log: {e}\n")),
            }
        }
        out
    }

    /// How the agents are reached: over TLS when the HAProxy pods' agents serve it (the chart's
    /// default), trusting only the `ca.crt` of their serving Secret and verifying the fixed name
    /// [`AGENT_TLS_NAME`], as the controller does.
    pub async fn agent_tls(&self) -> Result<Option<tokio_rustls::TlsConnector>> {
        let dep = Api::<Deployment>::namespaced(self.client.clone(), NAMESPACE)
            .get(HAPROXY)
            .await
            .map_err(|e| ClusterError::of("get the HAProxy Deployment", e))?;
        let tls = dep
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.into_iter().find(|c| c.name == "agent"))
            .and_then(|c| c.command)
            .is_some_and(|argv| argv.iter().any(|a| a.starts_with("--tls-cert-file")));
        if !tls {
            return Ok(None);
        }
        let s: Secret = Api::namespaced(self.client.clone(), NAMESPACE)
            .get(AGENT_TLS)
            .await
            .map_err(|e| ClusterError::of("get the agents' TLS Secret", e))?;
        let pem = s.data.unwrap_or_default().get("ca.crt").map(|v| v.0.clone()).unwrap_or_default();
        connector(&pem).map(Some)
    }

    /// One raw HTTP/1.1 request to the agent port of `pod`, over TLS when the agents serve it.
    async fn to_agent(&self, pod: &str, req: String) -> Result<(u16, String)> {
        match self.agent_tls().await? {
            Some(tls) => self.to_pod_over(pod, AGENT_PORT, req, Some(tls)).await,
            None => self.to_pod(pod, AGENT_PORT, req).await,
        }
    }

    /// One raw HTTP/1.1 request to `port` of `pod`: straight to the pod IP where the host is
    /// routed there, else through the API's port-forward.
    pub async fn to_pod(&self, pod: &str, port: u16, req: String) -> Result<(u16, String)> {
        self.to_pod_over(pod, port, req, None).await
    }

    /// [`Self::to_pod`], inside TLS when `tls` is given.
    async fn to_pod_over(
        &self,
        pod: &str,
        port: u16,
        req: String,
        tls: Option<tokio_rustls::TlsConnector>,
    ) -> Result<(u16, String)> {
        if let Some(tls) = tls {
            let buf = if self.routed() {
                let addr = self.pod_addr(pod, port).await?;
                let tcp = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| ClusterError::of(&format!("{pod}:{port}"), e))?;
                exchange_tls(&tls, tcp, &req).await.map_err(|e| ClusterError::of(&format!("{pod}:{port} (TLS)"), e))?
            } else {
                let mut pf =
                    self.pods_api().portforward(pod, &[port]).await.map_err(|e| ClusterError::of("port-forward", e))?;
                let stream = pf.take_stream(port).ok_or_else(|| ClusterError("port-forward gave no stream".into()))?;
                let buf = exchange_tls(&tls, stream, &req)
                    .await
                    .map_err(|e| ClusterError::of(&format!("{pod}:{port} (TLS, port-forward)"), e))?;
                let _ = pf.join().await;
                buf
            };
            return parse_http_response(&buf).map_err(|e| ClusterError::of("agent response", e));
        }
        if self.routed() {
            let addr = self.pod_addr(pod, port).await?;
            return http_request(addr, &req).await.map_err(|e| ClusterError::of(&format!("{pod}:{port}"), e));
        }
        let mut pf =
            self.pods_api().portforward(pod, &[port]).await.map_err(|e| ClusterError::of("port-forward", e))?;
        let mut stream = pf.take_stream(port).ok_or_else(|| ClusterError("port-forward gave no stream".into()))?;
        let io = async {
            stream.write_all(req.as_bytes()).await?;
            let mut buf = Vec::new();
            stream.read_to_end(&mut buf).await?;
            Ok::<_, std::io::Error>(buf)
        };
        let buf = tokio::time::timeout(Duration::from_secs(20), io)
            .await
            .map_err(|_| ClusterError("port-forward request timed out".into()))?
            .map_err(|e| ClusterError::of("port-forward I/O", e))?;
        drop(stream);
        let _ = pf.join().await;
        parse_http_response(&buf).map_err(|e| ClusterError::of("port-forward response", e))
    }

    async fn pod_addr(&self, pod: &str, port: u16) -> Result<SocketAddr> {
        let ip = self
            .pod(pod)
            .await?
            .status
            .and_then(|s| s.pod_ip)
            .ok_or_else(|| ClusterError(format!("pod {pod} has no IP")))?;
        format!("{ip}:{port}").parse().map_err(|e| ClusterError::of("pod address", e))
    }

    /// The agents' credential (`username`, `password` of the credentials Secret).
    pub async fn credentials(&self) -> Result<(String, String)> {
        let s: Secret = Api::namespaced(self.client.clone(), NAMESPACE)
            .get(CREDENTIALS)
            .await
            .map_err(|e| ClusterError::of("get the credentials Secret", e))?;
        let d = s.data.unwrap_or_default();
        let get = |k: &str| d.get(k).map(|v| String::from_utf8_lossy(&v.0).trim().to_string()).unwrap_or_default();
        Ok((get("username"), get("password")))
    }

    /// The text of `pod`'s agent `GET /metrics`.
    pub async fn agent_metrics(&self, pod: &str) -> Result<String> {
        let (u, p) = self.credentials().await?;
        let auth = base64(format!("{u}:{p}").as_bytes());
        let req = format!(
            "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n"
        );
        match self.to_agent(pod, req).await? {
            (200, body) => Ok(body),
            (code, body) => Err(ClusterError(format!("GET /metrics of {pod}: {code} {body}"))),
        }
    }

    /// Kills `container` of `pod` on its node (`ctr tasks kill -s SIGKILL`, as a crash) and waits
    /// until the kubelet has restarted it.
    pub async fn kill_container(&self, pod: &str, container: &str) -> Result<()> {
        let p = self.pod(pod).await?;
        let node =
            p.spec.as_ref().and_then(|s| s.node_name.clone()).ok_or_else(|| ClusterError("not scheduled".into()))?;
        let before = restarts(&p, container);
        let id = container_status(&p, container)
            .and_then(|c| c.container_id.clone())
            .and_then(|id| id.split_once("://").map(|(_, id)| id.to_string()))
            .ok_or_else(|| ClusterError(format!("{pod}: no container id for {container}")))?;
        self.ctr(&node, &["tasks", "kill", "--signal", "SIGKILL", &id])?;
        eventually(&format!("{container} of {pod} to restart"), Duration::from_secs(120), || async {
            let p = self.pod(pod).await.ok()?;
            (restarts(&p, container) > before && container_status(&p, container)?.state.as_ref()?.running.is_some())
                .then_some(())
        })
        .await
    }

    /// The HAProxy pods' names.
    /// The addresses of the HAProxy pods not terminating.
    pub async fn haproxy_pod_ips(&self) -> Result<std::collections::BTreeSet<String>> {
        Ok(self
            .pods("app.kubernetes.io/name=haptic,app.kubernetes.io/component=haproxy")
            .await?
            .into_iter()
            .filter_map(|p| p.status?.pod_ip)
            .collect())
    }

    async fn haproxy_pod_names(&self) -> Result<Vec<String>> {
        Ok(self
            .pods("app.kubernetes.io/name=haptic,app.kubernetes.io/component=haproxy")
            .await?
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect())
    }
}

/// A TLS connector trusting only the PEM bundle `ca`.
pub fn connector(ca: &[u8]) -> Result<tokio_rustls::TlsConnector> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca) {
        roots.add(c.map_err(|e| ClusterError::of("agent CA", e))?).map_err(|e| ClusterError::of("agent CA", e))?;
    }
    if roots.is_empty() {
        return Err(ClusterError("the agents' TLS Secret has no ca.crt".into()));
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClusterError::of("TLS", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg)))
}

/// Sends `req` inside TLS over `io` (verifying [`AGENT_TLS_NAME`]) and reads the answer to the
/// end (a peer closing without close_notify ends it too), bounded by 20 s.
pub async fn exchange_tls<S>(tls: &tokio_rustls::TlsConnector, io: S, req: &str) -> std::io::Result<Vec<u8>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let name = rustls_pki_types::ServerName::try_from(AGENT_TLS_NAME)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let io = async {
        let mut s = tls.connect(name, io).await?;
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        match s.read_to_end(&mut buf).await {
            Ok(_) => Ok(buf),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty() => Ok(buf),
            Err(e) => Err(e),
        }
    };
    tokio::time::timeout(Duration::from_secs(20), io)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS request timed out"))?
}

/// `haptic-node1` → 1 (`scripts/cluster.sh` names its nodes so).
fn node_index(node: &str) -> Result<u32> {
    node.strip_prefix("haptic-node")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| ClusterError(format!("{node} is not a scripts/cluster.sh node")))
}

impl Cluster for RealCluster {
    fn client(&self) -> Client {
        self.client.clone()
    }

    fn namespace(&self) -> &str {
        NAMESPACE
    }

    fn bind_line(&self) -> String {
        format!("bind :{HTTP_PORT}")
    }

    fn health_frontend(&self) -> Option<String> {
        Some(format!(
            "frontend health\n    bind :{HEALTH_PORT}\n\
             \x20   http-request return status 200 content-type text/plain string \"ok\" if {{ path /healthz }}\n\
             \x20   http-request return status 200 content-type text/plain string \"ready\" if {{ path /ready }}\n"
        ))
    }

    async fn haproxy_pods(&self) -> Result<Vec<String>> {
        self.haproxy_pod_names().await
    }

    async fn scale_haproxy(&mut self, n: usize) -> Result<()> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), NAMESPACE);
        let patch = json!({"spec": {"replicas": n}});
        api.patch_scale(HAPROXY, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| ClusterError::of("scale the HAProxy Deployment", e))?;
        eventually(&format!("{n} HAProxy pods"), Duration::from_secs(180), || async {
            (self.haproxy_pods().await.ok()?.len() == n).then_some(())
        })
        .await
    }

    async fn replace_all_haproxy(&mut self) -> Result<()> {
        // What `kubectl rollout restart` does: a changed pod-template annotation.
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), NAMESPACE);
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": at.to_string()}}}}});
        let old = self.haproxy_pods().await?;
        api.patch(HAPROXY, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| ClusterError::of("restart the HAProxy Deployment", e))?;
        eventually("the rollout to replace every pod", Duration::from_secs(300), || async {
            let now = self.haproxy_pods().await.ok()?;
            (now.len() == old.len() && now.iter().all(|n| !old.contains(n))).then_some(())
        })
        .await
    }

    async fn get(&self, pod: &str, path: &str) -> Result<(u16, String)> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        self.to_pod(pod, HTTP_PORT, req).await
    }

    async fn agent_state(&self, pod: &str) -> Result<Value> {
        let (u, p) = self.credentials().await?;
        let auth = base64(format!("{u}:{p}").as_bytes());
        let req = format!(
            "GET /v1/state HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n"
        );
        let (code, body) = self.to_agent(pod, req).await?;
        if code != 200 {
            return Err(ClusterError(format!("GET /v1/state of {pod}: {code} {body}")));
        }
        serde_json::from_str(&body).map_err(|e| ClusterError::of("decode /v1/state", e))
    }

    async fn restart_agent(&mut self, pod: &str) -> Result<()> {
        self.kill_container(pod, "agent").await
    }

    async fn kill_haproxy_worker(&mut self, pod: &str) -> Result<()> {
        self.kill_container(pod, "haproxy").await
    }

    async fn edit_file_in_pod(&self, pod: &str, path: &str, content: &str) -> Result<()> {
        let p = self.pod(pod).await?;
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let node = p.spec.and_then(|s| s.node_name).ok_or_else(|| ClusterError("pod not scheduled".into()))?;
        let rel = format!("pods/{uid}/volumes/kubernetes.io~empty-dir/config/current/{path}");
        match &self.provider {
            Provider::Local { state, .. } => {
                let file = state.join(format!("run/node{}/kubelet", node_index(&node)?)).join(rel);
                std::fs::write(&file, content).map_err(|e| ClusterError::of(&file.display().to_string(), e))
            }
            Provider::Kind => {
                let script = format!("printf '%s' \"$1\" > /var/lib/kubelet/{rel}");
                run(Command::new("docker").args(["exec", &node, "sh", "-c", &script, "sh", content])).map(|_| ())
            }
        }
    }

    async fn kill_leader(&mut self) -> Result<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NAMESPACE);
        let lease = leases.get(LEASE).await.map_err(|e| ClusterError::of("get the Lease", e))?;
        let holder =
            lease.spec.and_then(|s| s.holder_identity).ok_or_else(|| ClusterError("nobody holds the Lease".into()))?;
        let pod = self
            .pods("app.kubernetes.io/name=haptic,app.kubernetes.io/component=controller")
            .await?
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .find(|name| holder.rsplit_once('-').is_some_and(|(p, _)| p == name))
            .ok_or_else(|| ClusterError(format!("no controller pod matches the Lease holder {holder}")))?;
        self.pods_api()
            .delete(&pod, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
            .await
            .map_err(|e| ClusterError::of(&format!("delete the leader pod {pod}"), e))?;
        Ok(holder)
    }
}

/// Pod name → node name for `pods`.
pub fn nodes_of(pods: &[Pod]) -> BTreeMap<String, String> {
    pods.iter().filter_map(|p| Some((p.metadata.name.clone()?, p.spec.as_ref()?.node_name.clone()?))).collect()
}
