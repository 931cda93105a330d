//! Shared helpers for the controller's integration tests: a fleet of real pods (HAProxy plus the
//! agent binary Cargo builds for these tests, via `haptic_e2e::pod`), render directories, an in-process standalone
//! controller, and polling with deadlines (never sleeps as synchronisation).
#![allow(dead_code)]

pub mod kube;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use haptic_controller::app::{Running, Settings};
use haptic_controller::bundle::{load_dir, Bundle};
use haptic_controller::client::{AgentClient, Credentials};
use haptic_controller::gate::GateMode;
use haptic_controller::seams::Endpoint;
use haptic_controller::standalone::{start_standalone, StandaloneSettings};
use haptic_controller::status::FleetStatus;
use haptic_e2e::pod::{Pod, PodOpts};
use haptic_e2e::HaproxyBin;
use haptic_protocol::{PlanId, StateResponse};

pub const USER: &str = "haptic";
pub const PASSWORD: &str = "fleet-secret";

/// How long any awaited condition may take.
pub const DEADLINE: Duration = Duration::from_secs(40);

/// Three (or n) pods sharing one set of credentials.
pub struct Fleet {
    pub pods: Vec<Pod>,
    pub bin: HaproxyBin,
    pub dir: tempfile::TempDir,
    pub creds_file: PathBuf,
    client: AgentClient,
}

/// The `haptic-agent` binary built from this checkout, never a possibly stale one next to the
/// test executable: `cargo test -p haptic-controller` does not build other packages' binaries,
/// so the first call per test process runs `cargo build -p haptic-agent --bin haptic-agent`
/// (the same cargo, profile and target dir; a no-op when it is up to date) and takes the path
/// Cargo reports. `HAPTIC_AGENT_BIN` overrides it (scripts/test.sh builds and sets it once).
pub fn agent_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("HAPTIC_AGENT_BIN") {
            return PathBuf::from(p);
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["build", "--quiet", "-p", "haptic-agent", "--bin", "haptic-agent", "--message-format=json"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run cargo build -p haptic-agent");
        assert!(out.status.success(), "cargo build -p haptic-agent failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "haptic-agent")
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .expect("cargo build reported no haptic-agent executable")
    })
    .clone()
}

impl Fleet {
    pub async fn start(bin: &HaproxyBin, n: usize, opts: PodOpts) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let creds_file = dir.path().join("credentials");
        std::fs::write(&creds_file, format!("{USER}:{PASSWORD}\n")).unwrap();
        let agent = tokio::task::spawn_blocking(agent_bin).await.unwrap();
        let opts = PodOpts { credentials: Some((USER.into(), PASSWORD.into())), agent_bin: Some(agent), ..opts };
        let starts = (0..n).map(|_| Pod::start(bin, opts.clone()));
        let pods: Vec<Pod> =
            futures::future::join_all(starts).await.into_iter().map(|p| p.expect("pod start")).collect();
        let client =
            AgentClient::new(Credentials { user: USER.into(), password: PASSWORD.into() }, Duration::from_secs(30))
                .unwrap();
        Fleet { pods, bin: bin.clone(), dir, creds_file, client }
    }

    pub fn urls(&self) -> Vec<String> {
        self.pods.iter().map(|p| p.url()).collect()
    }

    pub fn endpoint(&self, i: usize) -> Endpoint {
        let url = self.pods[i].url();
        Endpoint { name: url.trim_start_matches("http://").to_string(), url }
    }

    pub async fn state(&self, i: usize, verify: bool) -> StateResponse {
        self.client.state(&self.endpoint(i), verify).await.unwrap_or_else(|e| panic!("pod {i} state: {e}"))
    }

    pub async fn apply(&self, i: usize, req: &haptic_protocol::ApplyRequest) -> haptic_controller::client::ApplyAnswer {
        self.client.apply(&self.endpoint(i), req).await.unwrap_or_else(|e| panic!("pod {i} apply: {e}"))
    }

    pub async fn states(&self) -> Vec<StateResponse> {
        let mut out = Vec::new();
        for i in 0..self.pods.len() {
            out.push(self.state(i, false).await);
        }
        out
    }

    /// Worker pid and reload counter of every pod.
    pub async fn generations(&self) -> Vec<(Option<u32>, u64)> {
        self.states().await.iter().map(|s| (s.haproxy.worker_pid, s.haproxy.reloads)).collect()
    }

    pub fn logs(&self) -> String {
        self.pods.iter().enumerate().map(|(i, p)| format!("--- pod {i} agent log ---\n{}", p.agent_log())).collect()
    }
}

/// A render's files, written into a directory atomically per file (write `.tmp`, rename).
pub fn write_render(dir: &Path, files: &[(&str, String)]) -> Bundle {
    for (p, body) in files {
        let target = dir.join(p);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let tmp = target.with_file_name(format!("{}.tmp", target.file_name().unwrap().to_string_lossy()));
        std::fs::write(&tmp, body).unwrap();
        std::fs::rename(&tmp, &target).unwrap();
    }
    load_dir(dir).unwrap()
}

/// The test config: a frontend on `fe`, a map, and `be_app` with server slots.
#[derive(Debug, Clone)]
pub struct Cfg {
    pub fe: u16,
    pub timeout_client: u32,
    /// (port, weight, disabled)
    pub servers: Vec<(u16, u32, bool)>,
    pub broken: bool,
}

impl Cfg {
    pub fn new(fe: u16) -> Self {
        Cfg { fe, timeout_client: 5, servers: vec![(9001, 10, false), (9002, 10, true)], broken: false }
    }

    pub fn text(&self) -> String {
        let mut s = format!(
            "global\n    default-path config\n    stats timeout 30s\n\n\
             defaults\n    mode http\n    timeout connect 2s\n    timeout client {}s\n    timeout server 5s\n\n\
             frontend fe_main\n    bind 127.0.0.1:{}\n\
             \x20   http-request return status 200 content-type text/plain lf-string \"%[req.hdr(host),lower,map(maps/hosts.map,none)]\" if {{ path /route }}\n\
             \x20   default_backend be_app\n\n\
             backend be_app\n    balance roundrobin\n",
            self.timeout_client, self.fe
        );
        for (i, (port, weight, disabled)) in self.servers.iter().enumerate() {
            let d = if *disabled { " disabled" } else { "" };
            s.push_str(&format!("    server SRV_{} 127.0.0.1:{port} weight {weight}{d}\n", i + 1));
        }
        if self.broken {
            s.push_str("    balance no-such-algorithm\n");
        }
        s
    }

    pub fn files(&self, map: &str) -> Vec<(&'static str, String)> {
        vec![("haproxy.cfg", self.text()), ("maps/hosts.map", map.to_string()), ("files/notes.txt", "notes\n".into())]
    }
}

pub fn settings(
    fleet: &Fleet,
    config_dir: &Path,
    state_dir: &Path,
    identity: &str,
    drift: Duration,
) -> StandaloneSettings {
    StandaloneSettings {
        common: Settings {
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            credentials: Credentials::load(&fleet.creds_file).unwrap(),
            haproxy_bin: fleet.bin.path.clone(),
            drift_interval: drift,
            deployment_timeout: Duration::from_secs(30),
            sync_timeout: Duration::from_secs(20),
            max_parallel: 16,
            gate: GateMode::Optimistic,
            agent_ca_file: None,
            agent_tls_server_name: None,
            gate_env: Vec::new(),
        },
        config_dir: config_dir.to_path_buf(),
        agents: fleet.urls(),
        identity: Some(identity.to_string()),
        state_dir: Some(state_dir.to_path_buf()),
        settle: Duration::from_millis(50),
    }
}

/// A test's working directory: `render/` (created) for the render a controller reads, `state/`
/// for its state; removed on drop.
pub struct Work {
    dir: tempfile::TempDir,
}

impl Work {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("render")).unwrap();
        Work { dir }
    }

    /// The directory itself, for further files.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `render/`, the render directory (exists).
    pub fn cfg_dir(&self) -> PathBuf {
        self.path().join("render")
    }

    /// `state/`, the controller's state directory (created by the controller).
    pub fn state_dir(&self) -> PathBuf {
        self.path().join("state")
    }
}

pub async fn start(s: StandaloneSettings) -> Running {
    start_standalone(s).await.expect("controller start")
}

/// Polls `f` until it returns `Some`, or panics with `what` and the last status.
pub async fn wait_until<T>(
    what: &str,
    ctl: &Running,
    fleet: &Fleet,
    mut f: impl FnMut(&FleetStatus) -> Option<T>,
) -> T {
    let check = || {
        let got = f(&ctl.status()).ok_or_else(|| "not yet".to_string());
        async move { got }
    };
    haptic_e2e::wait::poll(what, DEADLINE, check).await.unwrap_or_else(|e| {
        panic!(
            "{e}\nstatus: {}\nmetrics:\n{}\n{}",
            serde_json::to_string_pretty(&ctl.status()).unwrap(),
            ctl.metrics().encode(),
            fleet.logs()
        )
    })
}

/// Waits until every pod runs `plan` (converged on it).
pub async fn converged(ctl: &Running, fleet: &Fleet, plan: PlanId) -> FleetStatus {
    let n = fleet.pods.len();
    wait_until(&format!("all pods converged on {}", plan.short()), ctl, fleet, |s| {
        (s.controller.target == Some(plan) && s.converged == n && s.total == n).then(|| s.clone())
    })
    .await
}

/// A metric's value from the text exposition (0 when absent).
pub fn metric(ctl: &Running, name_and_labels: &str) -> f64 {
    ctl.metrics()
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(name_and_labels).and_then(|rest| rest.strip_prefix(' ')).map(str::to_string))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

pub fn arc<T>(t: T) -> Arc<T> {
    Arc::new(t)
}
