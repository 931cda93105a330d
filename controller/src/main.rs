//! The `haptic-controller` command line: `run`, `status`, `validate`, `diff`.
//!
//! Owns argument parsing (every flag also from `HAPTIC_CONTROLLER_<FLAG>`), logging setup,
//! signals and exit codes. It must never hold controller logic.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand, ValueEnum};
use haptic_controller::app::{self, Settings, StandaloneSettings};
use haptic_controller::client::Credentials;
use haptic_controller::diff::{diff, Baseline};
use haptic_controller::gate::{Checker, GateMode, Verdict};
use haptic_controller::render::load_dir;
use haptic_controller::status::{table, FleetStatus};

#[derive(Debug, Parser)]
#[command(name = "haptic-controller", version, about = "Gets HAProxy configuration onto a fleet of HAProxy pods")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TableOrJson {
    Table,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TextOrJson {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the controller.
    Run(Box<RunArgs>),
    /// Prints one row per pod from a running controller's admin endpoint.
    Status {
        /// The admin endpoint.
        #[arg(long, env = "HAPTIC_CONTROLLER_ADMIN", default_value = "http://127.0.0.1:9180")]
        admin: String,
        /// Output format.
        #[arg(long, env = "HAPTIC_CONTROLLER_OUTPUT", value_enum, default_value = "table")]
        output: TableOrJson,
    },
    /// Runs the gate (`haproxy -c`) over a render directory once; exits 1 with HAProxy's words.
    Validate {
        /// The render directory.
        dir: PathBuf,
        /// The HAProxy binary.
        #[arg(long, env = "HAPTIC_CONTROLLER_HAPROXY_BIN", default_value = "haproxy")]
        haproxy_bin: PathBuf,
    },
    /// Shows the mode, reasons and op batches that bring OLD_DIR to NEW_DIR.
    Diff {
        /// The baseline render directory.
        old_dir: PathBuf,
        /// The desired render directory.
        new_dir: PathBuf,
        /// Output format.
        #[arg(long, env = "HAPTIC_CONTROLLER_OUTPUT", value_enum, default_value = "text")]
        output: TextOrJson,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Standalone mode: a config directory and a list of agents, no Kubernetes.
    #[arg(long, env = "HAPTIC_CONTROLLER_STANDALONE")]
    standalone: bool,
    /// The render directory to watch (haproxy.cfg plus aux files).
    #[arg(long, env = "HAPTIC_CONTROLLER_CONFIG_DIR")]
    config_dir: PathBuf,
    /// An agent's base URL (repeat for every pod).
    #[arg(long = "agent", env = "HAPTIC_CONTROLLER_AGENT", value_delimiter = ',', required = true)]
    agents: Vec<String>,
    /// The agents' credentials file (one line `user:password`).
    #[arg(long, env = "HAPTIC_CONTROLLER_CREDENTIALS_FILE")]
    credentials_file: PathBuf,
    /// The PEM CA bundle that signed the agents' TLS certificates; needed for `https://` agents.
    #[arg(long, env = "HAPTIC_CONTROLLER_AGENT_CA_FILE")]
    agent_ca_file: Option<PathBuf>,
    /// The admin server (`/status`, `/metrics`, `/healthz`).
    #[arg(long, env = "HAPTIC_CONTROLLER_ADMIN_LISTEN", default_value = "127.0.0.1:9180")]
    admin_listen: SocketAddr,
    /// The HAProxy binary the gate runs.
    #[arg(long, env = "HAPTIC_CONTROLLER_HAPROXY_BIN", default_value = "haproxy")]
    haproxy_bin: PathBuf,
    /// The fence holder identity (default: `<hostname>-<random>`, persisted in the state dir).
    #[arg(long, env = "HAPTIC_CONTROLLER_IDENTITY")]
    identity: Option<String>,
    /// Where the fence epoch is persisted (default: `<config-dir>/../.haptic-controller-<name>`).
    #[arg(long, env = "HAPTIC_CONTROLLER_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Idle time after which the fleet is re-applied from verified state.
    #[arg(long, env = "HAPTIC_CONTROLLER_DRIFT_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    drift_interval: Duration,
    /// Safety net: a deployment running longer is cancelled and the latest render retried.
    #[arg(long, env = "HAPTIC_CONTROLLER_DEPLOYMENT_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    deployment_timeout: Duration,
    /// Bound of one pod's apply (every request, and the whole flow).
    #[arg(long, env = "HAPTIC_CONTROLLER_SYNC_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    sync_timeout: Duration,
    /// Pods applied to at once.
    #[arg(long, env = "HAPTIC_CONTROLLER_MAX_PARALLEL", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    max_parallel: u16,
    /// The gate latch's resting mode.
    #[arg(long, env = "HAPTIC_CONTROLLER_GATE", value_enum, default_value = "optimistic")]
    gate: GateMode,
    /// Quiet window before a config-dir change is read (a half-written edit never deploys).
    #[arg(long, env = "HAPTIC_CONTROLLER_SETTLE", default_value = "300ms", value_parser = humantime::parse_duration)]
    settle: Duration,
    /// Log format.
    #[arg(long, env = "HAPTIC_CONTROLLER_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        b.json().init();
    } else {
        b.init();
    }
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
    init_logging(a.log_format == "json");
    if !a.standalone {
        bail!("only standalone mode is available in this build: pass --standalone");
    }
    let credentials = Credentials::load(&a.credentials_file)?;
    if a.agent_ca_file.is_none() {
        if let Some(u) = a.agents.iter().find(|u| u.starts_with("https://")) {
            bail!("agent URL {u} is https://: pass --agent-ca-file with the CA that signed the agents' certificates");
        }
    }
    let settings = StandaloneSettings {
        common: Settings {
            admin_listen: a.admin_listen,
            credentials,
            haproxy_bin: a.haproxy_bin,
            drift_interval: a.drift_interval,
            deployment_timeout: a.deployment_timeout,
            sync_timeout: a.sync_timeout,
            max_parallel: usize::from(a.max_parallel),
            gate: a.gate,
            agent_ca_file: a.agent_ca_file,
        },
        config_dir: a.config_dir,
        agents: a.agents,
        identity: a.identity,
        state_dir: a.state_dir,
        settle: a.settle,
    };
    let running = app::start_standalone(settings).await?;
    let token = running.shutdown_token();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => futures::future::pending::<()>().await } } => {}
        }
        tracing::info!("shutting down");
        token.cancel();
    });
    running.wait().await;
    Ok(())
}

async fn status(admin: &str, output: TableOrJson) -> anyhow::Result<()> {
    let url = format!("{}/status", admin.trim_end_matches('/'));
    let resp = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    if !resp.status().is_success() {
        bail!("GET {url}: {}", resp.status());
    }
    let s: FleetStatus = resp.json().await.with_context(|| format!("GET {url}: undecodable status"))?;
    match output {
        TableOrJson::Table => print!("{}", table(&s)),
        TableOrJson::Json => println!("{}", serde_json::to_string_pretty(&s)?),
    }
    Ok(())
}

async fn validate(dir: PathBuf, bin: PathBuf) -> anyhow::Result<ExitCode> {
    let render = load_dir(&dir)?;
    let checker = Checker::new(bin, Duration::from_secs(60));
    match checker.check(&render).await? {
        Verdict::Pass => {
            println!("{}: valid (plan {})", dir.display(), render.plan_id());
            Ok(ExitCode::SUCCESS)
        }
        Verdict::Refused(words) => {
            eprintln!("{}: refused by haproxy -c:\n{words}", dir.display());
            Ok(ExitCode::from(1))
        }
    }
}

fn diff_cmd(old: PathBuf, new: PathBuf, output: TextOrJson) -> anyhow::Result<()> {
    let o = load_dir(&old)?;
    let n = load_dir(&new)?;
    let d = diff(&Baseline::of_render(&o), &n);
    match output {
        TextOrJson::Json => {
            let v = serde_json::json!({
                "old_plan": o.plan_id(), "new_plan": n.plan_id(),
                "mode": d.mode, "reasons": d.reasons, "batches": d.batches,
            });
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        TextOrJson::Text => {
            println!("mode: {}", d.mode.map_or("none (identical)", |m| m.as_str()));
            for r in &d.reasons {
                println!("  - {r}");
            }
            for (i, b) in d.batches.iter().enumerate() {
                println!("batch {}:", i + 1);
                for op in b {
                    println!("  {}", serde_json::to_string(op)?);
                }
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("haptic-controller: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let res: anyhow::Result<ExitCode> = rt.block_on(async {
        match cli.command {
            Command::Run(a) => run(*a).await.map(|()| ExitCode::SUCCESS),
            Command::Status { admin, output } => status(&admin, output).await.map(|()| ExitCode::SUCCESS),
            Command::Validate { dir, haproxy_bin } => validate(dir, haproxy_bin).await,
            Command::Diff { old_dir, new_dir, output } => {
                diff_cmd(old_dir, new_dir, output).map(|()| ExitCode::SUCCESS)
            }
        }
    });
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("haptic-controller: {e:#}");
            ExitCode::from(2)
        }
    }
}
