//! Assembling a running controller from the three seams and its settings.
//!
//! Owns wiring: status board, metrics, agent client, deployer, gate checker, scheduler driver
//! and admin server, over any seams. It must never name a mode: each mode's start-up
//! ([`crate::standalone::start`], [`crate::kubernetes::run`]) picks its seams and calls
//! [`start`] or [`start_with`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::admin::{self, AdminState};
use crate::agent_tls::AgentTrust;
use crate::client::{AgentClient, Credentials};

use crate::deployer::{Deployer, DeployerConfig};
use crate::error::Error;
use crate::gate::{Checker, GateMode, Latch};
use crate::metrics::Metrics;
use crate::scheduler::{Driver, Tuning};
use crate::seams::{BundleSource, EndpointSource, FenceHolder};
use crate::status::{ControllerStatus, FleetStatus, GateStatus, StatusBoard};

/// Settings shared by every mode.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the admin server listens.
    pub admin_listen: SocketAddr,
    /// The agents' credentials.
    pub credentials: Credentials,
    /// The HAProxy binary the gate runs.
    pub haproxy_bin: PathBuf,
    /// Idle time before drift repair.
    pub drift_interval: Duration,
    /// Safety net for one deployment.
    pub deployment_timeout: Duration,
    /// Bound of one pod's apply flow.
    pub sync_timeout: Duration,
    /// Pods applied to at once.
    pub max_parallel: usize,
    /// The gate latch's resting mode.
    pub gate: GateMode,
    /// The environment the gate's `haproxy -c` gets besides a fixed `PATH`
    /// ([`crate::gate::named_env`] of `--gate-env`).
    pub gate_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// The PEM CA bundle that signed the agents' TLS certificates (`https://` agents).
    pub agent_ca_file: Option<PathBuf>,
    /// The DNS name every agent's certificate must carry, whatever address its URL names
    /// (`None`: the URL's host). Kubernetes mode with TLS sets it: pod IPs change.
    pub agent_tls_server_name: Option<String>,
}

impl Settings {
    /// The part of the settings a running loop can take on.
    pub fn tuning(&self) -> Tuning {
        Tuning {
            deployment_timeout: self.deployment_timeout,
            drift_interval: self.drift_interval,
            sync_timeout: self.sync_timeout,
            max_parallel: self.max_parallel,
            gate: self.gate,
        }
    }
}

/// A running controller.
#[derive(Debug)]
pub struct Running {
    admin_addr: SocketAddr,
    board: Arc<StatusBoard>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Assembles a running controller from its parts (for other modes' wiring).
    pub(crate) fn from_parts(
        admin_addr: SocketAddr,
        board: Arc<StatusBoard>,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    ) -> Self {
        Self { admin_addr, board, metrics, shutdown, tasks }
    }

    /// The admin server's bound address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The current status.
    pub fn status(&self) -> FleetStatus {
        self.board.snapshot()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// A token that stops the controller when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops everything and waits for it (`haptic_leader` becomes 0: nothing deploys).
    pub async fn stop(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        self.metrics.leader.set(0);
    }

    /// Waits until the controller stops (after its shutdown token is cancelled).
    pub async fn wait(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Parts a controller shares across restarts of its deployment loop (Kubernetes mode runs one
/// loop per leadership term over the same client, metrics and status board).
#[derive(Debug, Clone)]
pub struct Shared {
    /// The agents' client (its credentials can be rotated).
    pub client: AgentClient,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// The status board.
    pub board: Arc<StatusBoard>,
}

impl Shared {
    /// Fresh parts for `settings`, with the status naming `identity` at `epoch`.
    pub fn new(settings: &Settings, identity: String, epoch: u64) -> Result<Self, Error> {
        let trust = if settings.agent_ca_file.is_some() || settings.agent_tls_server_name.is_some() {
            let t = AgentTrust::new(settings.agent_tls_server_name.as_deref())?;
            if let Some(p) = &settings.agent_ca_file {
                let pem = std::fs::read(p)
                    .map_err(|e| Error::Client(format!("read --agent-ca-file {}: {e}", p.display())))?;
                t.set_ca(&pem)?;
            }
            Some(t)
        } else {
            None
        };
        Ok(Self {
            client: AgentClient::with_trust(settings.credentials.clone(), settings.sync_timeout, trust)?,
            metrics: Arc::new(Metrics::new()),
            board: Arc::new(StatusBoard::new(
                GateStatus::from_latch(&Latch::new(settings.gate), None),
                ControllerStatus { identity, epoch, ..Default::default() },
            )),
        })
    }
}

/// Starts a controller over any seams, with its admin server on `settings.admin_listen`.
pub async fn start(
    settings: Settings,
    renders: Box<dyn BundleSource>,
    endpoints: Box<dyn EndpointSource>,
    fence: Arc<dyn FenceHolder>,
) -> Result<Running, Error> {
    let shared = Shared::new(&settings, fence.identity(), fence.epoch())?;
    let listener = tokio::net::TcpListener::bind(settings.admin_listen)
        .await
        .map_err(|e| Error::flag("--admin-listen")(Error::io(settings.admin_listen.to_string(), e)))?;
    let (_fixed, tuning) = tokio::sync::watch::channel(settings.tuning());
    start_with(settings, renders, endpoints, fence, shared, Some(listener), tuning).await
}

/// Starts the deployment loop over any seams and shared parts; serves the admin API on
/// `admin` when given (without one, [`Running::admin_addr`] is `0.0.0.0:0`). The loop starts
/// with the current `tuning` and takes on each change of it while it runs.
pub async fn start_with(
    settings: Settings,
    renders: Box<dyn BundleSource>,
    endpoints: Box<dyn EndpointSource>,
    fence: Arc<dyn FenceHolder>,
    shared: Shared,
    admin: Option<tokio::net::TcpListener>,
    tuning: tokio::sync::watch::Receiver<Tuning>,
) -> Result<Running, Error> {
    let now = *tuning.borrow();
    let Shared { client, metrics, board } = shared;
    board.controller(|c| {
        c.identity = fence.identity();
        c.epoch = fence.epoch();
    });
    let deployer = Arc::new(Deployer::new(
        client,
        fence.clone(),
        board.clone(),
        metrics.clone(),
        DeployerConfig { max_parallel: now.max_parallel, sync_timeout: now.sync_timeout },
    ));
    let checker =
        Checker::new(settings.haproxy_bin.clone(), Duration::from_secs(60)).with_env(settings.gate_env.clone());
    tracing::info!(
        landlock = haptic_sandbox::landlock_active(),
        gate_env = settings.gate_env.len(),
        "haproxy -c runs contained: cleared environment (a fixed PATH and the --gate-env variables), the render as \
         working directory, bounded time and output{}",
        if haptic_sandbox::landlock_active() { ", nothing readable outside the render (Landlock)" } else { "" }
    );
    let shutdown = CancellationToken::new();
    let mut tasks = Vec::new();
    let mut admin_addr = SocketAddr::from(([0, 0, 0, 0], 0));
    if let Some(listener) = admin {
        admin_addr = listener.local_addr().map_err(|e| Error::io("admin listener", e))?;
        let state = AdminState { board: board.clone(), metrics: metrics.clone() };
        let sd = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = admin::serve(listener, state, async move { sd.cancelled().await }).await {
                tracing::error!("admin server failed: {e}");
            }
        }));
    }
    let driver = Driver::new(now.into(), deployer, checker, board.clone(), metrics.clone());
    let sd = shutdown.clone();
    // This replica deploys from here until `stop`: it is the leader (standalone mode: always).
    metrics.leader.set(1);
    tasks.push(tokio::spawn(async move { driver.run(renders, endpoints, tuning, sd).await }));
    info!(admin = %admin_addr, identity = %fence.identity(), epoch = fence.epoch(), "controller started");
    Ok(Running { admin_addr, board, metrics, shutdown, tasks })
}
