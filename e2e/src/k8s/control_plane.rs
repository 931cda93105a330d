//! A real Kubernetes control plane for tests: `etcd` + `kube-apiserver` on free loopback ports.
//!
//! Owns finding the binaries `scripts/install-k8s.sh` installs, starting both processes in a
//! temporary directory (token auth, a generated service-account key, etcd without fsync), waiting
//! for `/readyz`, writing a kubeconfig, handing out `kube::Client`s, and tearing every process
//! down (process groups, SIGTERM then SIGKILL) on drop, also during a panic. It must never
//! reach anything but 127.0.0.1, and never leave a process or a directory behind.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::bins::workspace_root;
use crate::net::free_port;
use crate::pids::group_members;

/// How long the apiserver may take to answer `/readyz` 200 (envtest waits 20 s; a loaded
/// 2-core machine needs more).
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// How long a process gets between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// What went wrong starting or using the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// A binary `scripts/install-k8s.sh` installs is missing.
    #[error("{what} not found at {path}: run scripts/install-k8s.sh (or set {env})")]
    Missing {
        /// Which binary.
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// The variable that overrides the path.
        env: &'static str,
    },
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A process exited or never became ready.
    #[error("{0}")]
    Start(String),
    /// The kube client could not be built.
    #[error("kube client: {0}")]
    Kube(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ControlPlaneError {
    let what = what.into();
    move |source| ControlPlaneError::Io { what, source }
}

/// The Kubernetes version the tools module (`e2e/k8s-tools/go.mod`) builds, e.g. `1.34.4`.
pub fn k8s_version() -> Option<String> {
    let gomod = std::fs::read_to_string(workspace_root().join("e2e/k8s-tools/go.mod")).ok()?;
    gomod.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("k8s.io/kubernetes v")?;
        Some(rest.split_whitespace().next()?.to_string())
    })
}

/// The `kube-apiserver` binary: `HAPTIC_KUBE_APISERVER`, else `target/k8s/v<version>/kube-apiserver`.
pub fn apiserver_bin() -> Result<PathBuf, ControlPlaneError> {
    let path = std::env::var_os("HAPTIC_KUBE_APISERVER").map(PathBuf::from).unwrap_or_else(|| {
        let v = k8s_version().unwrap_or_else(|| "unknown".into());
        workspace_root().join(format!("target/k8s/v{v}/kube-apiserver"))
    });
    existing(path, "kube-apiserver", "HAPTIC_KUBE_APISERVER")
}

/// The `etcd` binary: `HAPTIC_ETCD`, else `target/k8s/etcd/etcd`.
pub fn etcd_bin() -> Result<PathBuf, ControlPlaneError> {
    let path = std::env::var_os("HAPTIC_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/k8s/etcd/etcd"));
    existing(path, "etcd", "HAPTIC_ETCD")
}

fn existing(path: PathBuf, what: &'static str, env: &'static str) -> Result<PathBuf, ControlPlaneError> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(ControlPlaneError::Missing { what, path, env })
    }
}

/// One child process in its own process group, its output in a log file.
#[derive(Debug)]
struct GroupProc {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl GroupProc {
    fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> Result<Self, ControlPlaneError> {
        let out = File::create(&log).map_err(io_err(format!("create {}", log.display())))?;
        let err = out.try_clone().map_err(io_err("clone log handle"))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(io_err(format!("spawn {name}")))?;
        Ok(Self { name, child: Some(child), log })
    }

    /// The process's exit status, if it already exited.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM to the group, SIGKILL after [`TERM_GRACE`], reaps the leader. Idempotent.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let leader = child.id();
        let Ok(raw) = i32::try_from(leader) else {
            return;
        };
        let gone = |c: &mut Child| !matches!(c.try_wait(), Ok(None)) && group_members(leader).is_empty();
        let _ = killpg(Pid::from_raw(raw), Signal::SIGTERM);
        let deadline = Instant::now() + TERM_GRACE;
        while !gone(&mut child) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !gone(&mut child) {
            let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

impl Drop for GroupProc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One request in the apiserver's audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Who asked, e.g. `system:serviceaccount:fleet:edge-haptic-controller`.
    pub user: String,
    /// `list`, `watch`, `get`, `create`, `patch`, ...
    pub verb: String,
    /// The request's path and query.
    pub uri: String,
    /// The answer's HTTP status.
    pub code: u16,
}

impl AuditEntry {
    /// The namespace in the URI's path (`…/namespaces/<ns>/…`, or the Namespace object
    /// `/api/v1/namespaces/<ns>` itself), if any.
    pub fn namespace(&self) -> Option<&str> {
        let path = self.uri.split('?').next().unwrap_or_default();
        let mut words = path.split('/');
        words.find(|w| *w == "namespaces")?;
        words.next().filter(|w| !w.is_empty())
    }
}

/// A running etcd + kube-apiserver pair on 127.0.0.1, stopped on drop.
#[derive(Debug)]
pub struct ControlPlane {
    // Field order is drop order: the apiserver stops before etcd, the directory goes last.
    apiserver: GroupProc,
    etcd: GroupProc,
    url: String,
    token: String,
    kubeconfig: PathBuf,
    kubeconfig_text: String,
    version: String,
    startup: Duration,
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Starts etcd and the apiserver on free loopback ports and waits until `/readyz` is 200.
    pub async fn start() -> Result<Self, ControlPlaneError> {
        Self::launch(false).await
    }

    /// [`Self::start`] with the apiserver's audit log on: every request's user, verb, URI and
    /// answer, read back with [`Self::audit`].
    pub async fn start_audited() -> Result<Self, ControlPlaneError> {
        Self::launch(true).await
    }

    async fn launch(audit: bool) -> Result<Self, ControlPlaneError> {
        let t0 = Instant::now();
        let apiserver_path = apiserver_bin()?;
        let etcd_path = etcd_bin()?;
        let dir = tempfile::Builder::new().prefix("haptic-k8s-").tempdir().map_err(io_err("create temp dir"))?;
        let d = dir.path();

        let etcd_port = free_port();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let mut etcd = GroupProc::spawn("etcd", etcd_command(&etcd_path, d, &etcd_url), d.join("etcd.log"))?;

        // One RSA key signs and verifies service-account tokens; one static admin token.
        let sa_key = signing_key(d)?;
        let token = format!("haptic-admin-{:016x}", rand_u64());
        std::fs::write(d.join("tokens.csv"), format!("{token},admin,admin,system:masters\n"))
            .map_err(io_err("write token file"))?;

        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let mut cmd = apiserver_command(&apiserver_path, d, &etcd_url, port, &sa_key);
        if audit {
            // Metadata level: who asked what of which URI, and the answer's code; no bodies.
            let policy =
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n";
            std::fs::write(d.join("audit-policy.yaml"), policy).map_err(io_err("write the audit policy"))?;
            cmd.arg(format!("--audit-policy-file={}", d.join("audit-policy.yaml").display()))
                .arg(format!("--audit-log-path={}", d.join("audit.log").display()));
        }
        // etcd must accept connections before the apiserver's storage checks start the clock.
        wait_tcp(etcd_port, &mut etcd).await?;

        let kubeconfig_text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: haptic-test\n  cluster:\n    server: {url}\n    \
             insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {token}\n\
             contexts:\n- name: haptic-test\n  context:\n    cluster: haptic-test\n    user: admin\n    \
             namespace: default\ncurrent-context: haptic-test\n"
        );
        let kubeconfig = d.join("kubeconfig");
        std::fs::write(&kubeconfig, &kubeconfig_text).map_err(io_err("write kubeconfig"))?;

        let apiserver = GroupProc::spawn("kube-apiserver", cmd, d.join("apiserver.log"))?;
        let mut cp = Self {
            apiserver,
            etcd,
            url,
            token,
            kubeconfig,
            kubeconfig_text,
            version: String::new(),
            startup: Duration::ZERO,
            dir,
        };
        let client = cp.client().await?;
        cp.wait_ready(&client).await?;
        cp.version = client.apiserver_version().await.map_err(|e| ControlPlaneError::Kube(e.to_string()))?.git_version;
        cp.startup = t0.elapsed();
        Ok(cp)
    }

    /// Polls `/readyz` until it says `ok`; fails when etcd or the apiserver exits, or after
    /// [`READY_DEADLINE`].
    async fn wait_ready(&mut self, client: &Client) -> Result<(), ControlPlaneError> {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            for p in [&mut self.etcd, &mut self.apiserver] {
                if let Some(st) = p.exited() {
                    return Err(ControlPlaneError::Start(format!("{} exited ({st}):\n{}", p.name, p.log_tail())));
                }
            }
            let req =
                http::Request::get("/readyz").body(Vec::new()).map_err(|e| ControlPlaneError::Kube(e.to_string()));
            if let Ok(body) = client.request_text(req?).await {
                if body.trim() == "ok" {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(ControlPlaneError::Start(format!(
                    "kube-apiserver not ready after {READY_DEADLINE:?}:\n{}",
                    self.apiserver.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A client with the admin token (system:masters).
    pub async fn client(&self) -> Result<Client, ControlPlaneError> {
        let kc = Kubeconfig::from_yaml(&self.kubeconfig_text).map_err(|e| ControlPlaneError::Kube(e.to_string()))?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| ControlPlaneError::Kube(e.to_string()))?;
        Client::try_from(config).map_err(|e| ControlPlaneError::Kube(e.to_string()))
    }

    /// The kubeconfig file (admin token, `insecure-skip-tls-verify`): `KUBECONFIG` for processes.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin bearer token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A kubeconfig file authenticating as the ServiceAccount `namespace/name` (a token from the
    /// TokenRequest API, valid for an hour): what a pod of that ServiceAccount may do, RBAC and
    /// nothing else.
    pub async fn kubeconfig_for(&self, namespace: &str, name: &str) -> Result<PathBuf, ControlPlaneError> {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let client = self.client().await?;
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(client, namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() },
            ..Default::default()
        };
        let answer = api
            .create_token_request(name, &Default::default(), &req)
            .await
            .map_err(|e| ControlPlaneError::Kube(format!("TokenRequest for {namespace}/{name}: {e}")))?;
        let token = answer.status.map(|s| s.token).unwrap_or_default();
        let admin = format!("token: {}", self.token);
        let text = self.kubeconfig_text.replacen(&admin, &format!("token: {token}"), 1);
        let path = self.dir.path().join(format!("kubeconfig-{namespace}-{name}"));
        std::fs::write(&path, text).map_err(io_err("write a ServiceAccount's kubeconfig"))?;
        Ok(path)
    }

    /// The audit log so far ([`Self::start_audited`]; empty otherwise), one entry per request
    /// the apiserver answered; a watch, long-running, also once when its answer started.
    pub fn audit(&self) -> Vec<AuditEntry> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["stage"] == "ResponseComplete" || e["stage"] == "ResponseStarted")
            .map(|e| AuditEntry {
                user: e["user"]["username"].as_str().unwrap_or_default().to_string(),
                verb: e["verb"].as_str().unwrap_or_default().to_string(),
                uri: e["requestURI"].as_str().unwrap_or_default().to_string(),
                code: e["responseStatus"]["code"].as_u64().unwrap_or_default() as u16,
            })
            .collect()
    }

    /// The apiserver's `/version` `gitVersion`, e.g. `v1.34.4`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// From the start of [`Self::start`] to `/readyz` 200.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// The temp dir holding the data, certs, logs and kubeconfig.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The apiserver's log so far (last 30 lines).
    pub fn apiserver_log_tail(&self) -> String {
        self.apiserver.log_tail()
    }

    /// The pids of etcd and the apiserver (for leak checks).
    pub fn pids(&self) -> Vec<u32> {
        [self.etcd.pid(), self.apiserver.pid()].into_iter().flatten().collect()
    }

    /// Stops both processes now (also done on drop).
    pub fn stop(&mut self) {
        self.apiserver.stop();
        self.etcd.stop();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until `127.0.0.1:port` accepts TCP connections, or the process exits, or 30 s pass.
async fn wait_tcp(port: u16, proc: &mut GroupProc) -> Result<(), ControlPlaneError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(());
        }
        if let Some(st) = proc.exited() {
            return Err(ControlPlaneError::Start(format!("{} exited ({st}):\n{}", proc.name, proc.log_tail())));
        }
        if Instant::now() >= deadline {
            return Err(ControlPlaneError::Start(format!("{} not listening:\n{}", proc.name, proc.log_tail())));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 64 bits from the kernel's random source (std only), for tokens that differ per run.
pub(crate) fn rand_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if let Ok(mut f) = File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    u64::from_le_bytes(b) ^ u64::from(std::process::id())
}

/// etcd for one test control plane: loopback only, no fsync (test data), peer port picked by the
/// kernel, data under `dir`.
fn etcd_command(etcd: &Path, dir: &Path, url: &str) -> Command {
    let mut cmd = Command::new(etcd);
    cmd.arg("--data-dir")
        .arg(dir.join("etcd"))
        .args(["--name", "haptic-test", "--listen-client-urls", url, "--advertise-client-urls", url])
        .args(["--listen-peer-urls", "http://127.0.0.1:0", "--initial-advertise-peer-urls", "http://127.0.0.1:0"])
        .args(["--unsafe-no-fsync", "--log-level", "warn"]);
    cmd
}

/// A fresh RSA key (`openssl genrsa`) in `dir/sa.key` for service-account tokens.
fn signing_key(dir: &Path) -> Result<PathBuf, ControlPlaneError> {
    let sa_key = dir.join("sa.key");
    let out = Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(&sa_key)
        .arg("2048")
        .output()
        .map_err(io_err("run openssl genrsa (is openssl installed?)"))?;
    if !out.status.success() {
        return Err(ControlPlaneError::Start(format!(
            "openssl genrsa failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(sa_key)
}

/// kube-apiserver on `127.0.0.1:port` over etcd at `etcd_url`: RBAC, a static admin token file,
/// service-account tokens signed with `sa_key`, no endpoint reconciler.
fn apiserver_command(apiserver: &Path, dir: &Path, etcd_url: &str, port: u16, sa_key: &Path) -> Command {
    let url = format!("https://127.0.0.1:{port}");
    let mut cmd = Command::new(apiserver);
    cmd.arg(format!("--etcd-servers={etcd_url}"))
        .arg(format!("--cert-dir={}", dir.join("certs").display()))
        .arg(format!("--secure-port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--advertise-address=127.0.0.1")
        .arg("--authorization-mode=RBAC")
        .arg("--service-cluster-ip-range=10.0.0.0/24")
        .arg("--allow-privileged=true")
        .arg("--disable-admission-plugins=ServiceAccount")
        .arg(format!("--service-account-issuer={url}/"))
        .arg(format!("--service-account-key-file={}", sa_key.display()))
        .arg(format!("--service-account-signing-key-file={}", sa_key.display()))
        .arg(format!("--token-auth-file={}", dir.join("tokens.csv").display()))
        .arg("--endpoint-reconciler-type=none")
        .arg("--v=1");
    cmd
}

#[cfg(test)]
mod tests {
    use super::AuditEntry;

    fn entry(uri: &str) -> AuditEntry {
        AuditEntry { user: "u".into(), verb: "list".into(), uri: uri.into(), code: 200 }
    }

    #[test]
    fn an_audit_entry_names_the_namespace_of_its_path() {
        assert_eq!(entry("/api/v1/namespaces/team-a/secrets?fieldSelector=x").namespace(), Some("team-a"));
        assert_eq!(entry("/apis/networking.k8s.io/v1/namespaces/b/ingresses/x/status").namespace(), Some("b"));
        assert_eq!(entry("/api/v1/namespaces/other").namespace(), Some("other"));
        assert_eq!(entry("/api/v1/namespaces?watch=true").namespace(), None);
        assert_eq!(entry("/api/v1/secrets?limit=500").namespace(), None);
        assert_eq!(entry("/apis/networking.k8s.io/v1/ingressclasses").namespace(), None);
    }
}
