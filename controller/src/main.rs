//! The `haptic-controller` command line: `run`, `status`, `render`, `validate`, `diff`, `migrate`, `crd`.
//!
//! Owns argument parsing (every flag also from `HAPTIC_CONTROLLER_<FLAG>`), logging setup,
//! signals and exit codes. It must never hold controller logic.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand, ValueEnum};
use haptic_controller::app::Settings;
use haptic_controller::bundle::load_dir;
use haptic_controller::client::Credentials;
use haptic_controller::diff::{diff, Baseline};
use haptic_controller::gate::{Checker, GateMode, Verdict};
use haptic_controller::kubernetes::lease::LeaseTiming;
use haptic_controller::kubernetes::run::{start_kubernetes, AgentTlsSettings, KubernetesSettings};
use haptic_controller::standalone::{start_standalone, StandaloneSettings};
use haptic_controller::status::{table, FleetStatus};
use haptic_controller::Error;

/// mimalloc rather than the system allocator: the render builds and drops many small strings and
/// maps per change, which glibc's allocator serves about a quarter slower (`bench --only
/// render_scale`). Version 2: it hands freed pages back within milliseconds where version 3 keeps
/// them a second, which at 10,000 paths left the controller 60 MiB larger (`endpoint_churn`).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        /// The admin endpoint (standalone mode).
        #[arg(long, env = "HAPTIC_CONTROLLER_ADMIN", default_value = "http://127.0.0.1:9180")]
        admin: String,
        /// Read the HAProxyConfig's status from Kubernetes (KUBECONFIG or in-cluster) instead.
        #[arg(long)]
        kubernetes: bool,
        /// The namespace of the HAProxyConfig (Kubernetes).
        #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
        namespace: String,
        /// The HAProxyConfig (Kubernetes).
        #[arg(long = "config", env = "HAPTIC_CONTROLLER_CONFIG", default_value = "haptic")]
        config_name: String,
        /// Output format.
        #[arg(long, env = "HAPTIC_CONTROLLER_OUTPUT", value_enum, default_value = "table")]
        output: TableOrJson,
    },
    /// Runs the gate over a render directory once (`default-path config` in `global`, then
    /// `haproxy -c`); exits 1 with HAProxy's words, 2 when it cannot run.
    Validate {
        /// The render directory.
        dir: PathBuf,
        /// The HAProxy binary.
        #[arg(long, env = "HAPTIC_CONTROLLER_HAPROXY_BIN", default_value = "haproxy")]
        haproxy_bin: PathBuf,
        /// Environment variables the check gets (names, comma-separated), as `run --gate-env`.
        #[arg(long, env = "HAPTIC_CONTROLLER_GATE_ENV", value_delimiter = ',')]
        gate_env: Vec<String>,
    },
    /// Renders a directory of YAML manifests (Ingresses and IngressClasses, or GatewayClasses,
    /// Gateways, HTTPRoutes, ReferenceGrants and Namespaces; Services, EndpointSlices, Secrets,
    /// ConfigMaps and one HAProxyConfig) as the controller would, and prints one verdict per
    /// served Ingress, Gateway or HTTPRoute; exits 1 when one is refused in part (the render is
    /// still written), 2 when nothing can be rendered.
    Render {
        /// The manifest directory (every `*.yaml` / `*.yml` below it).
        #[arg(long)]
        dir: PathBuf,
        /// Write the render here (absent or empty) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Shows, per Ingress, which of its ingress-nginx (and haptic.dev/) annotations haptic
    /// honours, which it does not, and the HAProxy rules they become: the gap before a switch.
    /// Exits 1 when an Ingress would be refused or an annotation is not supported.
    Migrate {
        /// Read the Ingresses of every `*.yaml` / `*.yml` below this directory.
        #[arg(long, conflicts_with = "kubernetes")]
        dir: Option<PathBuf>,
        /// Read every Ingress of the cluster (KUBECONFIG or in-cluster) instead.
        #[arg(long)]
        kubernetes: bool,
        /// Judge as a HAProxyConfig with `render.allowSnippetAnnotations: true` would.
        #[arg(long)]
        allow_snippet_annotations: bool,
        /// Output format.
        #[arg(long, env = "HAPTIC_CONTROLLER_OUTPUT", value_enum, default_value = "text")]
        output: TextOrJson,
    },
    /// Prints the `HAProxyConfig` CustomResourceDefinition (YAML) for `kubectl apply -f -`.
    Crd,
    /// Shows the mode, reasons (the lines each section gained or lost) and op batches that
    /// bring OLD_DIR to NEW_DIR.
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
#[command(group(clap::ArgGroup::new("mode").required(true).args(["standalone", "kubernetes"])))]
struct RunArgs {
    /// Standalone mode: a config directory and a list of agents, no Kubernetes.
    #[arg(long, env = "HAPTIC_CONTROLLER_STANDALONE", help_heading = "Mode (pick one)")]
    standalone: bool,
    /// Kubernetes mode: one HAProxyConfig resource, pod discovery, leader election on a Lease.
    #[arg(long, env = "HAPTIC_CONTROLLER_KUBERNETES", help_heading = "Mode (pick one)")]
    kubernetes: bool,
    /// The render directory to watch (haproxy.cfg plus aux files).
    #[arg(
        long,
        env = "HAPTIC_CONTROLLER_CONFIG_DIR",
        help_heading = "Standalone mode",
        required_if_eq("standalone", "true"),
        conflicts_with = "kubernetes"
    )]
    config_dir: Option<PathBuf>,
    /// An agent's base URL (repeat for every pod).
    #[arg(
        long = "agent",
        env = "HAPTIC_CONTROLLER_AGENT",
        value_delimiter = ',',
        help_heading = "Standalone mode",
        required_if_eq("standalone", "true"),
        conflicts_with = "kubernetes"
    )]
    agents: Vec<String>,
    /// The agents' credentials file (one line `user:password`).
    #[arg(
        long,
        env = "HAPTIC_CONTROLLER_CREDENTIALS_FILE",
        help_heading = "Standalone mode",
        required_if_eq("standalone", "true"),
        conflicts_with = "kubernetes"
    )]
    credentials_file: Option<PathBuf>,
    /// Where the fence epoch is persisted (default: `<config-dir>/../.haptic-controller-<name>`).
    #[arg(long, env = "HAPTIC_CONTROLLER_STATE_DIR", help_heading = "Standalone mode", conflicts_with = "kubernetes")]
    state_dir: Option<PathBuf>,
    /// Quiet window before a change is read (a half-written edit never deploys).
    #[arg(long, env = "HAPTIC_CONTROLLER_SETTLE", default_value = "300ms", value_parser = humantime::parse_duration)]
    settle: Duration,
    /// Quiet window before a burst of EndpointSlice changes only, or one lone change to a
    /// cluster object, is rendered (render mode; at most `--settle`): short, so a new endpoint or
    /// route serves soon.
    #[arg(
        long,
        env = "HAPTIC_CONTROLLER_ENDPOINT_SETTLE",
        help_heading = "Kubernetes mode",
        default_value = "50ms",
        value_parser = humantime::parse_duration
    )]
    endpoint_settle: Duration,
    /// The namespace of the HAProxyConfig, its ConfigMaps, Secrets, pods and Lease.
    #[arg(long, env = "POD_NAMESPACE", help_heading = "Kubernetes mode", required_if_eq("kubernetes", "true"))]
    namespace: Option<String>,
    /// The HAProxyConfig this controller serves.
    #[arg(
        long = "config",
        env = "HAPTIC_CONTROLLER_CONFIG",
        help_heading = "Kubernetes mode",
        required_if_eq("kubernetes", "true")
    )]
    config_name: Option<String>,
    /// The Lease that elects the leader (default: `haptic-<config>`).
    #[arg(long, env = "HAPTIC_CONTROLLER_LEASE_NAME", help_heading = "Kubernetes mode")]
    lease_name: Option<String>,
    /// How long a Lease record stays valid after it last changed.
    #[arg(long, env = "HAPTIC_CONTROLLER_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration,
          help_heading = "Kubernetes mode")]
    lease_duration: Duration,
    /// A leader that could not renew for this long stops deploying.
    #[arg(long, env = "HAPTIC_CONTROLLER_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration,
          help_heading = "Kubernetes mode")]
    renew_deadline: Duration,
    /// How often the Lease is read and renewed.
    #[arg(long, env = "HAPTIC_CONTROLLER_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration,
          help_heading = "Kubernetes mode")]
    retry_period: Duration,
    /// `POD_NAME` (the identity is `<pod name>-<random>`).
    #[arg(long, env = "POD_NAME", hide = true)]
    pod_name: Option<String>,
    /// The PEM CA bundle that signed the agents' TLS certificates; needed for `https://` agents.
    #[arg(long, env = "HAPTIC_CONTROLLER_AGENT_CA_FILE")]
    agent_ca_file: Option<PathBuf>,
    /// The DNS name every agent's certificate must carry, whatever address its URL names (pod
    /// IPs change; the chart uses `<release>-agent.<namespace>.svc`).
    #[arg(long, env = "HAPTIC_CONTROLLER_AGENT_TLS_SERVER_NAME")]
    agent_tls_server_name: Option<String>,
    /// Kubernetes mode: the agents serve TLS with the certificate of this Secret
    /// (`kubernetes.io/tls`), whose `ca.crt` the controller trusts, re-read while it runs.
    /// Needs --agent-tls-server-name.
    #[arg(
        long,
        env = "HAPTIC_CONTROLLER_AGENT_TLS_SECRET",
        help_heading = "Kubernetes mode",
        requires = "agent_tls_server_name"
    )]
    agent_tls_secret: Option<String>,
    /// Kubernetes mode: the controller makes and rotates the --agent-tls-secret itself (a CA in
    /// `<secret>-ca`, a serving certificate for --agent-tls-server-name); without it another
    /// issuer (cert-manager) writes that Secret.
    #[arg(
        long,
        env = "HAPTIC_CONTROLLER_AGENT_TLS_ISSUE",
        help_heading = "Kubernetes mode",
        requires = "agent_tls_secret"
    )]
    agent_tls_issue: bool,
    /// The admin server (`/status`, `/metrics`, `/healthz`).
    #[arg(long, env = "HAPTIC_CONTROLLER_ADMIN_LISTEN", default_value = "127.0.0.1:9180")]
    admin_listen: SocketAddr,
    /// The HAProxy binary the gate runs.
    #[arg(long, env = "HAPTIC_CONTROLLER_HAPROXY_BIN", default_value = "haproxy")]
    haproxy_bin: PathBuf,
    /// The fence holder identity (standalone default: `<hostname>-<random>`, persisted in the
    /// state dir; Kubernetes default: `<POD_NAME>-<random>`, new per start).
    #[arg(long, env = "HAPTIC_CONTROLLER_IDENTITY")]
    identity: Option<String>,
    /// Idle time after which the fleet is re-applied from verified state.
    #[arg(long, env = "HAPTIC_CONTROLLER_DRIFT_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    drift_interval: Duration,
    /// Safety net per wave of --max-parallel pods: a deployment running longer than this times
    /// ceil(pods / max-parallel) is cancelled and the latest render retried.
    #[arg(long, env = "HAPTIC_CONTROLLER_DEPLOYMENT_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    deployment_timeout: Duration,
    /// Bound of one pod's apply (every request, and the whole flow, exact retries of an apply
    /// whose answer was lost included), and of a scheduled reload's follow-up after it is due.
    #[arg(long, env = "HAPTIC_CONTROLLER_SYNC_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    sync_timeout: Duration,
    /// Pods applied to at once.
    #[arg(long, env = "HAPTIC_CONTROLLER_MAX_PARALLEL", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    max_parallel: u16,
    /// The gate latch's resting mode.
    #[arg(long, env = "HAPTIC_CONTROLLER_GATE", value_enum, default_value = "optimistic")]
    gate: GateMode,
    /// Environment variables of the controller that the gate's `haproxy -c` gets (names,
    /// comma-separated): those the config names (`bind "${ADDR}"`), with stand-in values. The
    /// check gets nothing else but a fixed `PATH`.
    #[arg(long, env = "HAPTIC_CONTROLLER_GATE_ENV", value_delimiter = ',')]
    gate_env: Vec<String>,
    /// Log format.
    #[arg(long, env = "HAPTIC_CONTROLLER_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Log level or filter (`error` … `trace`, or directives such as `info,haptic_controller=debug`);
    /// `RUST_LOG` overrides it.
    #[arg(long, env = "HAPTIC_CONTROLLER_LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    log_level: String,
}

/// The `--gate-env` variables from this process's environment, and the names it does not
/// have (the check then sees them unset, as HAProxy would).
fn gate_env(names: &[String]) -> (Vec<(std::ffi::OsString, std::ffi::OsString)>, Vec<String>) {
    haptic_controller::gate::named_env(names, |n| std::env::var_os(n))
}

fn parse_log_level(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("bad log level {s:?}: {e}"))
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty())
}

/// `RUST_LOG` when set, else `level`; JSON events carry `message` and their fields at the top
/// level, with the span's fields beside them.
fn init_logging(json: bool, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        b.json().flatten_event(true).with_span_list(false).init();
    } else {
        b.init();
    }
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
    init_logging(a.log_format == "json", &a.log_level);
    let (gate_env, missing) = gate_env(&a.gate_env);
    if !missing.is_empty() {
        tracing::warn!(
            ?missing,
            "--gate-env names variables the controller does not have; the gate's check sees them unset"
        );
    }
    let common = |credentials| Settings {
        admin_listen: a.admin_listen,
        credentials,
        haproxy_bin: a.haproxy_bin.clone(),
        drift_interval: a.drift_interval,
        deployment_timeout: a.deployment_timeout,
        sync_timeout: a.sync_timeout,
        max_parallel: usize::from(a.max_parallel),
        gate: a.gate,
        gate_env: gate_env.clone(),
        agent_ca_file: a.agent_ca_file.clone(),
        agent_tls_server_name: a.agent_tls_server_name.clone(),
    };
    let running = if a.kubernetes {
        let config = a.config_name.clone().context("--config names the HAProxyConfig to serve")?;
        let namespace = a.namespace.clone().context("--namespace (or POD_NAMESPACE) is needed")?;
        let identity = a.identity.clone().unwrap_or_else(|| {
            let base = a.pod_name.clone().unwrap_or_else(|| hostname().unwrap_or_else(|| "haptic-controller".into()));
            format!("{base}-{:08x}", rand::random::<u32>())
        });
        let client = kube::Client::try_default()
            .await
            .context("no Kubernetes client configuration (in-cluster service account or KUBECONFIG)")?;
        let settings = KubernetesSettings {
            common: common(Credentials { user: String::new(), password: String::new() }),
            lease_name: a.lease_name.clone().unwrap_or_else(|| format!("haptic-{config}")),
            namespace,
            config,
            identity,
            timing: LeaseTiming {
                duration: a.lease_duration,
                renew_deadline: a.renew_deadline,
                retry_period: a.retry_period,
            },
            settle: haptic_controller::kubernetes::settle::Settle { objects: a.settle, endpoints: a.endpoint_settle },
            agent_tls: a.agent_tls_secret.clone().map(|secret| AgentTlsSettings { secret, issue: a.agent_tls_issue }),
        };
        tracing::info!(namespace = %settings.namespace, config = %settings.config, lease = %settings.lease_name,
            identity = %settings.identity, "starting in Kubernetes mode");
        start_kubernetes(settings, client).await?
    } else {
        let (Some(config_dir), Some(credentials_file)) = (a.config_dir.clone(), a.credentials_file.clone()) else {
            bail!("standalone mode needs --config-dir, --agent and --credentials-file");
        };
        let credentials = Credentials::load(&credentials_file).map_err(Error::flag("--credentials-file"))?;
        if a.agent_tls_server_name.is_some() && a.agent_ca_file.is_none() {
            bail!("--agent-tls-server-name needs --agent-ca-file in standalone mode (the CA that signed the agents' certificates)");
        }
        if a.agent_ca_file.is_none() {
            if let Some(u) = a.agents.iter().find(|u| u.starts_with("https://")) {
                bail!(
                    "agent URL {u} is https://: pass --agent-ca-file with the CA that signed the agents' certificates"
                );
            }
        }
        let settings = StandaloneSettings {
            common: common(credentials),
            config_dir,
            agents: a.agents.clone(),
            identity: a.identity.clone(),
            state_dir: a.state_dir.clone(),
            settle: a.settle,
        };
        start_standalone(settings).await?
    };
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
        .map_err(reqwest::Error::without_url)
        .with_context(|| format!("--admin {admin}: GET {url}"))?;
    if !resp.status().is_success() {
        bail!("--admin {admin}: GET {url}: {}", resp.status());
    }
    let s: FleetStatus = resp.json().await.with_context(|| format!("GET {url}: undecodable status"))?;
    match output {
        TableOrJson::Table => emit(&table(&s)),
        TableOrJson::Json => emit(&format!("{}\n", serde_json::to_string_pretty(&s)?)),
    }
}

async fn status_kubernetes(namespace: &str, name: &str, output: TableOrJson) -> anyhow::Result<()> {
    use haptic_controller::kubernetes::crd::HAProxyConfig;
    let client = kube::Client::try_default()
        .await
        .context("no Kubernetes client configuration (in-cluster service account or KUBECONFIG)")?;
    let api: kube::Api<HAProxyConfig> = kube::Api::namespaced(client, namespace);
    let obj = api.get(name).await.with_context(|| format!("HAProxyConfig {namespace}/{name}"))?;
    let st = obj.status.unwrap_or_default();
    match output {
        TableOrJson::Table => emit(&table(&haptic_controller::kubernetes::status::to_fleet(&st))),
        TableOrJson::Json => emit(&format!("{}\n", serde_json::to_string_pretty(&st)?)),
    }
}

async fn validate(dir: PathBuf, bin: PathBuf, names: &[String]) -> anyhow::Result<ExitCode> {
    let render = load_dir(&dir)?;
    let (env, missing) = gate_env(names);
    if !missing.is_empty() {
        eprintln!("--gate-env: the environment has no {}; the check sees them unset", missing.join(", "));
    }
    let checker = Checker::new(bin, Duration::from_secs(60)).with_env(env);
    match checker.check(&render).await.map_err(Error::flag("--haproxy-bin"))? {
        Verdict::Pass => {
            emit(&format!("{}: valid (plan {})\n", dir.display(), render.plan_id()))?;
            Ok(ExitCode::SUCCESS)
        }
        Verdict::Refused(words) => {
            eprintln!("{}: refused by haproxy -c:\n{words}", dir.display());
            Ok(ExitCode::from(1))
        }
    }
}

fn render_cmd(dir: PathBuf, out: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    use haptic_controller::kubernetes::routes;
    let mut m = haptic_controller::manifests::load(&dir)?;
    for s in &m.skipped {
        eprintln!("note: skipped {s}");
    }
    let name = m.config.metadata.name.clone().unwrap_or_default();
    let spec = m.config.spec.clone();
    let fail = |e: haptic_controller::kubernetes::config_source::SpecError| {
        anyhow::anyhow!("HAProxyConfig {name}: {}: {}", e.reason, e.message)
    };
    let (files, verdicts) = match &spec.render {
        Some(r) if r.gateway_class_name.is_some() => {
            let class = r.gateway_class_name.clone().unwrap_or_default();
            if !m.objects.gateway_classes.iter().any(|c| c.metadata.name.as_deref() == Some(class.as_str())) {
                eprintln!(
                    "note: no GatewayClass {class} in {}: using the chart's (controller {})",
                    dir.display(),
                    haptic_render::gateway::GATEWAY_CONTROLLER
                );
                m.objects
                    .gateway_classes
                    .push(std::sync::Arc::new(haptic_controller::manifests::chart_gateway_class(&class)));
            }
            let namespace = m.config.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            let (r, _) =
                routes::render_gateway(&spec, &m, &m.objects, &Default::default(), &namespace, &Default::default())
                    .map_err(fail)?;
            (r.files, r.verdicts)
        }
        Some(r) => {
            let class = r.ingress_class_name.clone().unwrap_or_default();
            if !m.objects.classes.iter().any(|c| c.metadata.name.as_deref() == Some(class.as_str())) {
                eprintln!("note: no IngressClass {class} in {}: using the chart's (controller haptic.dev/ingress-controller, not the default class)", dir.display());
                m.objects.classes.push(std::sync::Arc::new(haptic_controller::manifests::chart_class(&class)));
            }
            let mut once = haptic_render::Incremental::new();
            let (none, slots) = (Default::default(), Default::default());
            let r =
                routes::render(&spec, &m, &m.objects, &slots, &none, &Default::default(), &mut once).map_err(fail)?;
            (r.files, r.verdicts)
        }
        None => (haptic_controller::kubernetes::config_source::build(&spec, &m).map_err(fail)?, Vec::new()),
    };
    let render =
        haptic_controller::bundle::Bundle::new(files).map_err(|why| anyhow::anyhow!("HAProxyConfig {name}: {why}"))?;
    let mut text = String::new();
    match &out {
        Some(o) => {
            let empty = match std::fs::read_dir(o) {
                Ok(mut rd) => rd.next().is_none(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                Err(e) => return Err(anyhow::Error::new(e).context(format!("--out {}", o.display()))),
            };
            if !empty {
                bail!("--out {}: not empty (a file of an earlier render would stay)", o.display());
            }
            std::fs::create_dir_all(o).with_context(|| format!("--out {}", o.display()))?;
            render.write_to(o)?;
        }
        None => {
            for (p, b) in render.files() {
                if p.as_str().starts_with("certs/") {
                    writeln!(text, "==> {p} <== ({} bytes, not shown: it holds a private key)", b.len())?;
                } else {
                    writeln!(text, "==> {p} <==\n{}", String::from_utf8_lossy(b))?;
                }
            }
        }
    }
    text.push_str(&routes::verdict_lines(&verdicts));
    writeln!(text, "plan {}", render.plan_id())?;
    emit(&text)?;
    Ok(if verdicts.iter().all(|v| v.accepted()) { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

async fn migrate_cmd(
    dir: Option<PathBuf>,
    kubernetes: bool,
    allow_snippet_annotations: bool,
    output: TextOrJson,
) -> anyhow::Result<ExitCode> {
    use haptic_render::annotations::{report, report_text, Allowed, Status};
    let ingresses: Vec<k8s_openapi::api::networking::v1::Ingress> = match (dir, kubernetes) {
        (Some(d), _) => haptic_controller::manifests::load_ingresses(&d)?.iter().map(|i| (**i).clone()).collect(),
        (None, true) => {
            let client = kube::Client::try_default()
                .await
                .context("no Kubernetes client configuration (in-cluster service account or KUBECONFIG)")?;
            let api: kube::Api<k8s_openapi::api::networking::v1::Ingress> = kube::Api::all(client);
            api.list(&Default::default()).await.context("list Ingresses")?.items
        }
        (None, false) => bail!("say where the Ingresses are: --dir DIR or --kubernetes"),
    };
    let allowed = Allowed { snippets: allow_snippet_annotations };
    let reports: Vec<_> = ingresses.iter().map(|i| report(i, allowed)).collect();
    match output {
        TextOrJson::Text => emit(&report_text(&reports))?,
        TextOrJson::Json => emit(&format!("{}\n", serde_json::to_string_pretty(&reports)?))?,
    }
    let gap = reports.iter().any(|r| !r.served || r.annotations.iter().any(|a| a.status == Status::NotSupported));
    Ok(if gap { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn diff_cmd(old: PathBuf, new: PathBuf, output: TextOrJson) -> anyhow::Result<()> {
    let o = load_dir(&old)?;
    let n = load_dir(&new)?;
    let d = diff(&Baseline::of_render(&o), &n);
    let mut out = String::new();
    match output {
        TextOrJson::Json => {
            let v = serde_json::json!({
                "old_plan": o.plan_id(), "new_plan": n.plan_id(),
                "mode": d.mode, "reasons": d.reasons, "causes": d.causes, "batches": d.batches,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        }
        TextOrJson::Text => {
            writeln!(out, "mode: {}", d.mode.map_or("none (identical)", |m| m.as_str()))?;
            if !d.causes.is_empty() {
                let causes: Vec<&str> = d.causes.iter().map(|c| c.as_str()).collect();
                writeln!(out, "reload for: {}", causes.join(", "))?;
            }
            for r in &d.reasons {
                writeln!(out, "  - {r}")?;
            }
            for (i, b) in d.batches.iter().enumerate() {
                writeln!(out, "batch {}:", i + 1)?;
                for op in b {
                    writeln!(out, "  {}", serde_json::to_string(op)?)?;
                }
            }
        }
    }
    emit(&out)
}

/// Writes a command's output to stdout. A reader that closed the pipe early (`| head -1`,
/// `| grep -m1`) is a normal end, as for every Unix tool: the rest is dropped and the exit is 0.
fn emit(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(anyhow::Error::new(e).context("writing to stdout")),
        _ => Ok(()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("haptic-controller: error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let res: anyhow::Result<ExitCode> = rt.block_on(async {
        match cli.command {
            Command::Run(a) => run(*a).await.map(|()| ExitCode::SUCCESS),
            Command::Status { kubernetes: true, namespace, config_name, output, .. } => {
                status_kubernetes(&namespace, &config_name, output).await.map(|()| ExitCode::SUCCESS)
            }
            Command::Status { admin, output, .. } => status(&admin, output).await.map(|()| ExitCode::SUCCESS),
            Command::Validate { dir, haproxy_bin, gate_env: names } => validate(dir, haproxy_bin, &names).await,
            Command::Render { dir, out } => render_cmd(dir, out),
            Command::Migrate { dir, kubernetes, allow_snippet_annotations, output } => {
                migrate_cmd(dir, kubernetes, allow_snippet_annotations, output).await
            }
            Command::Crd => emit(&haptic_controller::kubernetes::crd::crd_yaml()).map(|()| ExitCode::SUCCESS),
            Command::Diff { old_dir, new_dir, output } => {
                diff_cmd(old_dir, new_dir, output).map(|()| ExitCode::SUCCESS)
            }
        }
    });
    match res {
        Ok(code) => code,
        Err(e) => {
            // One line: what failed, then each cause once, joined by ": ".
            eprintln!("haptic-controller: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
