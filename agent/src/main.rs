//! The `haptic-agent` binary: `init` and `run`.
//!
//! Owns process setup only: flags, logging, signals, binding the listener and wiring the
//! library together. It must never hold apply logic of its own.
#![forbid(unsafe_code)]

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser as _;
use haptic_agent::api::Limits;
use haptic_agent::config::{Cli, Command, LogFormat, RunArgs};
use haptic_agent::credentials::CredentialSet;
use haptic_agent::metrics::Metrics;
use haptic_agent::{Agent, AgentConfig, AppState, Credentials};
use tokio::signal::unix::{signal, SignalKind};
use tracing::info;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Init(a) => {
            init_logging(LogFormat::Text, "info");
            let wrote = haptic_agent::init::init(&a.root, &a.health_bind)
                .with_context(|| format!("init {}", a.root.display()))?;
            if wrote {
                info!(root = %a.root.display(), health_bind = %a.health_bind, "bootstrap tree written");
            } else {
                info!(root = %a.root.display(), "already initialised: nothing to do");
            }
            Ok(())
        }
        Command::Run(a) => {
            let a = *a;
            init_logging(a.log_format, &a.log_level);
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(run(a))
        }
    }
}

/// `RUST_LOG` when set, else `level`; JSON events carry `message` and their fields at the top
/// level (what log pipelines index), with the span's fields beside them.
fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().flatten_event(true).with_span_list(false).init(),
    }
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
    let credentials = Credentials::from_file(&a.credentials_file)?;
    let serving = match (&a.tls_cert_file, &a.tls_key_file) {
        (Some(c), Some(k)) => Some(haptic_agent::tls::ServingCert::open(c, k)?),
        _ => None,
    };
    let tls = serving.as_ref().map(|s| s.acceptor()).transpose()?;
    let tls_watch = serving.as_ref().map(|s| s.spawn_watch(a.tls_poll));
    let metrics = Arc::new(Metrics::new());
    let cfg = AgentConfig {
        root: a.root.clone(),
        master_socket: a.master_socket.clone(),
        haproxy_bin: a.haproxy_bin.clone(),
        min_reload_interval: a.min_reload_interval,
        reload_timeout: a.reload_timeout,
        pod: a.pod_name.clone().unwrap_or_else(|| a.root.display().to_string()),
        bind_precheck: a.bind_precheck,
        runtime_backends: a.runtime_backends,
        check_exec: a.check_exec_path.clone(),
        check_env: haptic_agent::check::haproxy_env(std::env::vars_os()),
        path_policy: haptic_haproxy::paths::PathPolicy {
            allowed: a.allow_path.clone(),
            socket_dir: a
                .socket_dir
                .clone()
                .or_else(|| a.master_socket.parent().map(std::path::Path::to_path_buf))
                .map(|d| d.display().to_string()),
        },
    };
    let agent = Agent::open(cfg, metrics).with_context(|| format!("open {}", a.root.display()))?;
    let background = agent.spawn_background();
    let listener = tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("bind {}", a.listen))?;
    info!(listen = %listener.local_addr()?, root = %a.root.display(), tls = tls.is_some(), "haptic-agent serving");
    info!(
        landlock = haptic_sandbox::landlock_active(),
        "haproxy -c runs contained (Landlock: nothing readable outside the tree and --allow-path)"
    );
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // The image's stop signal (HAProxy's soft stop, which the pod's containers share).
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let (draining, drain_wait) = (agent.clone(), a.drain_wait);
    let shutdown = async move {
        let sig = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = usr1.recv() => "SIGUSR1",
        };
        info!(signal = sig, "stopping: finishing the apply in flight, refusing new ones");
        draining.stop_applies().await;
        if !drain_wait.is_zero() {
            info!(limit = ?drain_wait, "waiting for HAProxy to drain its connections and exit");
            let gone = draining.wait_haproxy_gone(drain_wait).await;
            info!(haproxy_stopped = gone, "done waiting for HAProxy");
        }
    };
    let limits = Limits {
        max_body: a.max_body,
        header_timeout: a.header_timeout,
        idle_timeout: a.idle_timeout,
        body_timeout: a.body_timeout,
        body_stall_timeout: a.body_stall_timeout,
        max_connections: a.max_connections,
    };
    let credentials = CredentialSet::from(credentials);
    let watch = credentials.spawn_watch(a.credentials_file.clone(), a.credentials_poll, a.credentials_grace);
    let state = AppState::new(agent.clone(), credentials, limits);
    haptic_agent::api::serve_tls(listener, state, tls, shutdown).await?;
    agent.quiesce().await;
    background.abort();
    watch.abort();
    if let Some(w) = tls_watch {
        w.abort();
    }
    info!("bye");
    Ok(())
}
