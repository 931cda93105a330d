//! A local fleet for the controller cases: pods (`haptic_e2e::pod::Pod`s sharing one set of
//! credentials, each HAProxy given its own frontend port through its environment so one render
//! serves every pod), a standalone `haptic-controller` over a config directory, and tiny HTTP
//! upstreams on loopback addresses. Everything runs in its own process group and is killed on drop; the controller logs
//! to a file in the fleet's temp dir. It must never link the agent or controller crates: it spawns their
//! binaries.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use haptic_e2e::pod::{Pod, PodOpts};
use haptic_e2e::{free_port, HaproxyBin};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::agent_api::AgentApi;
use crate::error::{BenchError, Result};

/// The environment variable each pod's HAProxy reads its frontend port from.
pub const PORT_ENV: &str = "HAPTIC_BENCH_PORT";
/// The fleet's shared credentials.
pub const USER: &str = "bench";
/// The fleet's shared password.
pub const PASSWORD: &str = "bench-fleet-secret";
/// The controllers' `--settle` window (the product default is 300 ms).
pub const SETTLE: &str = "2ms";
/// How often the bench reads the `/status` of a controller that cannot be waited on.
const POLL: Duration = Duration::from_millis(1);

/// A child in its own process group: SIGTERM, then SIGKILL, on drop.
#[derive(Debug)]
pub struct Group {
    child: Child,
}

impl Group {
    fn spawn(cmd: &mut Command, what: &str) -> Result<Self> {
        let child = cmd.process_group(0).spawn().map_err(BenchError::io(format!("spawn {what}")))?;
        Ok(Self { child })
    }

    /// The leader's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let Ok(raw) = i32::try_from(self.child.id()) else { return };
        let _ = killpg(Pid::from_raw(raw), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn log_file(path: &Path) -> Result<(Stdio, Stdio)> {
    let f = File::create(path).map_err(BenchError::io(format!("create {}", path.display())))?;
    let g = f.try_clone().map_err(BenchError::io("dup log"))?;
    Ok((Stdio::from(f), Stdio::from(g)))
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A workspace binary (`haptic-agent`, `haptic-controller`) built from this checkout: the path
/// in `env` when set; else, when the bench runs under Cargo (`cargo run`), the binary Cargo
/// builds for it now with the bench's profile (a no-op when up to date), never a possibly stale
/// one left in `target/`; else the one next to the bench.
pub fn sibling_bin(name: &str, env: &str) -> Result<PathBuf> {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    if std::env::var_os(env).is_none() {
        if let Some(cargo) = std::env::var_os("CARGO") {
            let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, p)) = built.iter().find(|(n, _)| n == name) {
                return Ok(p.clone());
            }
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "--quiet", "-p", name, "--bin", name, "--message-format=json"]);
            if !cfg!(debug_assertions) {
                cmd.arg("--release");
            }
            let out = cmd
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .stderr(Stdio::inherit())
                .output()
                .map_err(BenchError::io(format!("cargo build -p {name}")))?;
            let path = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
                .find_map(|m| m["executable"].as_str().map(PathBuf::from));
            match path {
                Some(p) if out.status.success() => {
                    built.push((name.to_string(), p.clone()));
                    return Ok(p);
                }
                _ => return Err(BenchError::Unexpected(format!("cargo build -p {name} --bin {name} failed"))),
            }
        }
    }
    haptic_e2e::pod::sibling_bin(name, env).ok_or_else(|| {
        BenchError::Unexpected(format!(
            "{name} not found next to the bench (run the bench with `cargo run`, build it with `cargo build \
             --release -p haptic-agent -p haptic-controller` into the same target dir, or set {env})"
        ))
    })
}

/// One fleet pod: a [`Pod`] with the fleet's credentials and its own frontend port.
#[derive(Debug)]
pub struct FleetPod {
    /// Its frontend port (127.0.0.1).
    pub port: u16,
    /// The agent's base URL.
    pub url: String,
    /// The agent's API.
    pub api: AgentApi,
    pod: Pod,
}

impl FleetPod {
    /// Starts HAProxy on a bootstrap tree and the agent, with the frontend port in [`PORT_ENV`].
    pub async fn start(bin: &HaproxyBin, interval: &str) -> Result<Self> {
        let agent = sibling_bin("haptic-agent", "HAPTIC_AGENT_BIN")?;
        let port = free_port();
        let opts = PodOpts {
            agent_bin: Some(agent),
            min_reload_interval: interval.into(),
            credentials: Some((USER.into(), PASSWORD.into())),
            env: vec![(PORT_ENV.into(), port.to_string())],
            ..PodOpts::default()
        };
        let pod = Pod::start(bin, opts).await?;
        let url = pod.url();
        let api = AgentApi::new(&url, USER, PASSWORD)?;
        Ok(Self { port, url, api, pod })
    }

    /// The agent's pid.
    pub fn agent_pid(&self) -> Option<u32> {
        self.pod.agent_pid()
    }

    /// The pod's processes: the agent, HAProxy's master and every worker seen so far.
    pub fn pids(&self) -> Vec<u32> {
        self.agent_pid().into_iter().chain(self.pod.haproxy().known_pids()).collect()
    }

    /// A worker command through the master CLI (`@1 cmd`).
    pub async fn worker_cmd(&self, cmd: &str) -> Result<String> {
        Ok(self.pod.haproxy().worker_cmd(cmd).await?)
    }

    /// The master's reload counter.
    pub async fn reloads(&self) -> Result<u32> {
        Ok(self.pod.haproxy().show_proc().await?.master_reloads())
    }
}

/// A standalone controller over a config directory.
#[derive(Debug)]
pub struct Controller {
    group: Group,
    /// `http://127.0.0.1:<admin port>`.
    pub admin: String,
    /// Its log file.
    pub log: PathBuf,
    http: reqwest::Client,
}

/// The parts of `GET /status` the bench reads.
#[derive(Debug, Clone, Default)]
pub struct FleetView {
    /// Pods running the target.
    pub converged: usize,
    /// Pods known.
    pub total: usize,
    /// The target plan id text.
    pub target: Option<String>,
    /// Pods whose applied plan is the target (converged or not: a reload may be pending).
    pub applied: usize,
}

impl Controller {
    /// Starts `haptic-controller run --standalone` over `config_dir` and `agents`.
    pub async fn start(
        bin: &HaproxyBin,
        dir: &Path,
        config_dir: &Path,
        creds: &Path,
        agents: &[String],
    ) -> Result<Self> {
        let ctl = sibling_bin("haptic-controller", "HAPTIC_CONTROLLER_BIN")?;
        let mut cmd = Command::new(ctl);
        cmd.args(["run", "--standalone", "--config-dir"])
            .arg(config_dir)
            .arg(format!("--agent={}", agents.join(",")))
            .arg("--credentials-file")
            .arg(creds)
            .arg("--state-dir")
            .arg(dir.join("controller-state"))
            .arg(format!("--gate-env={PORT_ENV}"))
            .env(PORT_ENV, free_port().to_string());
        Self::spawn(cmd, bin, dir, Some(SETTLE))
    }

    /// Starts `haptic-controller run --kubernetes` for the `HAProxyConfig` `config` in `namespace`.
    pub fn start_kubernetes(
        bin: &HaproxyBin,
        dir: &Path,
        kubeconfig: &Path,
        namespace: &str,
        config: &str,
    ) -> Result<Self> {
        Self::spawn(Self::kubernetes(kubeconfig, namespace, config)?, bin, dir, Some(SETTLE))
    }

    /// [`Controller::start_kubernetes`] for the `HAProxyConfig` `edge`, at the product's default
    /// settle windows (`--settle`, `--endpoint-settle`) rather than [`SETTLE`].
    pub fn start_kubernetes_with_default_settle(
        bin: &HaproxyBin,
        dir: &Path,
        kubeconfig: &Path,
        namespace: &str,
    ) -> Result<Self> {
        Self::spawn(Self::kubernetes(kubeconfig, namespace, "edge")?, bin, dir, None)
    }

    /// `haptic-controller run --kubernetes` for `config` in `namespace`, through `kubeconfig`.
    fn kubernetes(kubeconfig: &Path, namespace: &str, config: &str) -> Result<Command> {
        let ctl = sibling_bin("haptic-controller", "HAPTIC_CONTROLLER_BIN")?;
        let mut cmd = Command::new(ctl);
        cmd.args(["run", "--kubernetes", "--namespace", namespace, "--config", config])
            .args(["--lease-duration", "15s", "--renew-deadline", "10s", "--retry-period", "2s"])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info,kube=warn");
        Ok(cmd)
    }

    /// The settings both modes share: admin address, identity, settle window `settle` (the
    /// bench writes every render atomically, so a short window loses nothing; `None`: the
    /// product's default), drift repair out of the way.
    fn spawn(mut cmd: Command, bin: &HaproxyBin, dir: &Path, settle: Option<&str>) -> Result<Self> {
        let admin_addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join("controller.log");
        let (o, e) = log_file(&log)?;
        cmd.args(["--admin-listen", &admin_addr, "--identity", "bench-controller"])
            .args(settle.map(|s| ["--settle", s]).into_iter().flatten())
            .args(["--drift-interval", "600s", "--max-parallel", "16"])
            .arg("--haproxy-bin")
            .arg(&bin.path)
            .stdin(Stdio::null())
            .stdout(o)
            .stderr(e);
        let group = Group::spawn(&mut cmd, "haptic-controller")?;
        let http =
            reqwest::Client::builder().timeout(Duration::from_secs(10)).build().map_err(BenchError::http("client"))?;
        Ok(Self { group, admin: format!("http://{admin_addr}"), log, http })
    }

    /// The controller's pid.
    pub fn pid(&self) -> u32 {
        self.group.pid()
    }

    /// Reads `GET /status`.
    pub async fn view(&self) -> Result<FleetView> {
        Ok(self.view_after(None).await?.0)
    }

    /// Reads `GET /status`; with `after`, the controller answers once its status board moved
    /// past that version (or after a second). Returns the view and its version.
    async fn view_after(&self, after: Option<u64>) -> Result<(FleetView, Option<u64>)> {
        let url = match after {
            Some(v) => format!("{}/status?after={v}&wait_ms=1000", self.admin),
            None => format!("{}/status", self.admin),
        };
        let resp = self.http.get(url).send().await.map_err(BenchError::http("GET /status"))?;
        let version = resp.headers().get("x-status-version").and_then(|v| v.to_str().ok()?.parse().ok());
        let v: serde_json::Value = resp.json().await.map_err(BenchError::http("decode /status"))?;
        let target = v["controller"]["target"].as_str().map(str::to_string);
        let applied = v["pods"]
            .as_array()
            .map(|ps| ps.iter().filter(|p| target.is_some() && p["applied"].as_str() == target.as_deref()).count())
            .unwrap_or(0);
        let view = FleetView {
            converged: v["converged"].as_u64().unwrap_or(0) as usize,
            total: v["total"].as_u64().unwrap_or(0) as usize,
            target,
            applied,
        };
        Ok((view, version))
    }

    /// Waits (on `/status?after=`, no polling) until all `pods` run `plan`; returns when that
    /// was first seen.
    pub async fn wait_converged(&mut self, plan: &str, pods: usize, timeout: Duration) -> Result<Instant> {
        self.wait_until(pods, timeout, plan, |v| v.target.as_deref() == Some(plan) && v.converged == pods).await
    }

    /// Polls until all `pods` have *applied* `plan` (a paced reload may still be pending).
    pub async fn wait_applied(&mut self, plan: &str, pods: usize, timeout: Duration) -> Result<Instant> {
        self.wait_until(pods, timeout, plan, |v| v.target.as_deref() == Some(plan) && v.applied == pods).await
    }

    /// Polls until all `pods` run a target other than `old` (a render the bench cannot name in
    /// advance, e.g. one made by the Kubernetes controller); returns when, and the new target.
    pub async fn wait_converged_off(
        &mut self,
        old: Option<&str>,
        pods: usize,
        timeout: Duration,
    ) -> Result<(Instant, String)> {
        let at = self
            .wait_until(pods, timeout, "a new target", |v| {
                v.target.is_some() && v.target.as_deref() != old && v.converged == pods
            })
            .await?;
        let target = self.view().await?.target.unwrap_or_default();
        Ok((at, target))
    }

    async fn wait_until(
        &mut self,
        pods: usize,
        timeout: Duration,
        what: &str,
        done: impl Fn(&FleetView) -> bool,
    ) -> Result<Instant> {
        let plan = what;
        let deadline = Instant::now() + timeout;
        let mut last = FleetView::default();
        let mut seen: Option<u64> = None;
        loop {
            match self.view_after(seen).await {
                Ok((v, version)) => {
                    if v.total == pods && done(&v) {
                        return Ok(Instant::now());
                    }
                    last = v;
                    // A controller without versions is polled every millisecond instead.
                    match version {
                        Some(n) => seen = Some(n),
                        None => tokio::time::sleep(POLL).await,
                    }
                }
                Err(_) => tokio::time::sleep(POLL).await,
            }
            if self.group.exited() {
                return Err(BenchError::Unexpected(format!("controller exited: {}", tail(&self.log, 30))));
            }
            if Instant::now() > deadline {
                return Err(BenchError::Timeout(format!(
                    "fleet not converged on {plan} within {timeout:?}: {}/{} converged, target {:?}; controller log:\n{}",
                    last.converged,
                    last.total,
                    last.target,
                    tail(&self.log, 15)
                )));
            }
        }
    }
}

/// A tiny HTTP upstream on a loopback address answering `200 ok` (or its own body) to every request
/// (`Connection: close`), counting the requests it answered.
#[derive(Debug)]
pub struct Upstream {
    /// Its port.
    pub port: u16,
    hits: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Binds a free port on 127.0.0.1 and serves.
    pub async fn start() -> Result<Self> {
        Self::start_on(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Binds `addr`, which must be a loopback address, and serves.
    pub async fn start_on(addr: std::net::SocketAddr) -> Result<Self> {
        Self::start_answering(addr, "ok").await
    }

    /// [`Upstream::start_on`], answering `body` instead of `ok` (so a client tells upstreams apart).
    pub async fn start_answering(addr: std::net::SocketAddr, body: &'static str) -> Result<Self> {
        if !addr.ip().is_loopback() {
            return Err(BenchError::Unexpected(format!("an upstream on {addr}: only loopback addresses")));
        }
        let l = tokio::net::TcpListener::bind(addr).await.map_err(BenchError::io(format!("bind upstream {addr}")))?;
        let port = l.local_addr().map_err(BenchError::io("upstream addr"))?.port();
        let hits = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut got = Vec::new();
                    let read = async {
                        loop {
                            let n = s.read(&mut buf).await?;
                            if n == 0 {
                                break;
                            }
                            got.extend_from_slice(&buf[..n]);
                            if got.windows(4).any(|w| w == b"\r\n\r\n") || got.len() > 65536 {
                                break;
                            }
                        }
                        Ok::<_, std::io::Error>(())
                    };
                    if tokio::time::timeout(Duration::from_secs(10), read).await.is_ok() {
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = s.write_all(answer.as_bytes()).await;
                        let _ = s.shutdown().await;
                    }
                });
            }
        });
        Ok(Self { port, hits, task })
    }

    /// How many requests it has answered.
    pub fn hits(&self) -> u64 {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}
