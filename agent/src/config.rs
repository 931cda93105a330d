//! Command-line flags of `haptic-agent` (each also readable from `HAPTIC_AGENT_<FLAG>`).
//!
//! Owns parsing and defaults of `init` and `run` flags, including human sizes (`256MiB`) and
//! durations (`2s`). It must never touch the disk, sockets or HAProxy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// `haptic-agent`: the sidecar that owns an HAProxy pod's config tree.
#[derive(Debug, Parser)]
#[command(name = "haptic-agent", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a bootstrap tree HAProxy can start on (does nothing on an initialised root).
    Init(InitArgs),
    /// Serve `/v1/state`, `/v1/apply`, `/healthz`, `/readyz` and `/metrics`.
    Run(Box<RunArgs>),
}

/// Flags of `haptic-agent init`.
#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// The config tree root (`ROOT/current -> .trees/<id>`).
    #[arg(long, env = "HAPTIC_AGENT_ROOT")]
    pub root: PathBuf,
    /// Where the bootstrap config answers `/healthz` 200 and `/ready` 503 (`:8404` = all addresses).
    #[arg(long, env = "HAPTIC_AGENT_HEALTH_BIND", default_value = ":8404")]
    pub health_bind: String,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Flags of `haptic-agent run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The HTTP listen address, e.g. `0.0.0.0:8080`.
    #[arg(long, env = "HAPTIC_AGENT_LISTEN")]
    pub listen: SocketAddr,
    /// The config tree root.
    #[arg(long, env = "HAPTIC_AGENT_ROOT")]
    pub root: PathBuf,
    /// HAProxy's master CLI socket.
    #[arg(long, env = "HAPTIC_AGENT_MASTER_SOCKET")]
    pub master_socket: PathBuf,
    /// The pod's own HAProxy binary (used for `haproxy -c`).
    #[arg(long, env = "HAPTIC_AGENT_HAPROXY_BIN")]
    pub haproxy_bin: PathBuf,
    /// A file with one line `user:password` for HTTP Basic auth on `/v1/*`.
    #[arg(long, env = "HAPTIC_AGENT_CREDENTIALS_FILE")]
    pub credentials_file: PathBuf,
    /// How often the credentials file is re-read; a changed credential is used without a restart.
    #[arg(long, env = "HAPTIC_AGENT_CREDENTIALS_POLL", default_value = "2s", value_parser = parse_duration)]
    pub credentials_poll: Duration,
    /// How long the replaced credential is still accepted after a rotation (`0s`: not at all).
    #[arg(long, env = "HAPTIC_AGENT_CREDENTIALS_GRACE", default_value = "5m", value_parser = parse_duration)]
    pub credentials_grace: Duration,
    /// At most one reload per this interval.
    #[arg(long, env = "HAPTIC_AGENT_MIN_RELOAD_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub min_reload_interval: Duration,
    /// How long a reload may take to be verified.
    #[arg(long, env = "HAPTIC_AGENT_RELOAD_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub reload_timeout: Duration,
    /// The largest accepted request body.
    #[arg(long, env = "HAPTIC_AGENT_MAX_BODY", default_value = "256MiB", value_parser = parse_size)]
    pub max_body: usize,
    /// How long a request's headers may take to arrive, counted from when the connection waits
    /// for the request.
    #[arg(long, env = "HAPTIC_AGENT_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request (bounded by
    /// `--header-timeout` too: HTTP/1 waits for a request by reading its headers).
    #[arg(long, env = "HAPTIC_AGENT_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// How long a whole request body may take to arrive.
    #[arg(long, env = "HAPTIC_AGENT_BODY_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub body_timeout: Duration,
    /// How long a request body may go without a new byte before the request is answered 408
    /// and its connection closed (a stalled client never holds a connection slot for the whole
    /// `--body-timeout`).
    #[arg(long, env = "HAPTIC_AGENT_BODY_STALL_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub body_stall_timeout: Duration,
    /// The most HTTP connections served at once; more are closed as soon as they are accepted.
    #[arg(long, env = "HAPTIC_AGENT_MAX_CONNECTIONS", default_value_t = 64)]
    pub max_connections: usize,
    /// An absolute path prefix the config may make HAProxy read outside the tree (repeatable).
    #[arg(long = "allow-path", env = "HAPTIC_AGENT_ALLOW_PATH", value_delimiter = ',',
          default_values_t = ["/etc/ssl/certs".to_string(), "/usr/share/ca-certificates".to_string()])]
    pub allow_path: Vec<String>,
    /// A directory besides the HAProxy binary's whose programs the contained `haproxy -c` may
    /// run (repeatable; for a wrapper script around the real binary).
    #[arg(long = "check-exec-path", env = "HAPTIC_AGENT_CHECK_EXEC_PATH", value_delimiter = ',')]
    pub check_exec_path: Vec<PathBuf>,
    /// The directory sockets of the config (`stats socket`, unix `bind`) must live under
    /// (default: the master socket's directory).
    #[arg(long, env = "HAPTIC_AGENT_SOCKET_DIR")]
    pub socket_dir: Option<PathBuf>,
    /// Serve HTTPS with this PEM certificate chain (leaf first); needs `--tls-key-file`.
    #[arg(long, env = "HAPTIC_AGENT_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The PEM private key of `--tls-cert-file`.
    #[arg(long, env = "HAPTIC_AGENT_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// How often the TLS files are re-read; a changed certificate is served without a restart.
    #[arg(long, env = "HAPTIC_AGENT_TLS_POLL", default_value = "5s", value_parser = parse_duration)]
    pub tls_poll: Duration,
    /// Log format.
    #[arg(long, env = "HAPTIC_AGENT_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Log level or filter (`error`, `warn`, `info`, `debug`, `trace`, or directives such as
    /// `info,haptic_agent=debug`); `RUST_LOG` overrides it.
    #[arg(long, env = "HAPTIC_AGENT_LOG_LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub log_level: String,
    /// On SIGTERM, SIGUSR1 or SIGINT: refuse further applies and keep serving `/v1/state` and
    /// `/metrics` until HAProxy's master stops answering (it exits once its draining workers
    /// are gone), for at most this long; 0 stops at once.
    #[arg(long, env = "HAPTIC_AGENT_DRAIN_WAIT", default_value = "0s", value_parser = parse_duration)]
    pub drain_wait: Duration,
    /// The pod's name for logs (defaults to the root path).
    #[arg(long, env = "HAPTIC_AGENT_POD_NAME")]
    pub pod_name: Option<String>,
    /// Refuse (422) a reload whose new TCP bind ports are already held by another socket, instead
    /// of letting HAProxy pause its listeners for ~2 s of bind retries and fail.
    #[arg(long, env = "HAPTIC_AGENT_BIND_PRECHECK", default_value_t = true, action = clap::ArgAction::Set)]
    pub bind_precheck: bool,
    /// Add backends at runtime where HAProxy can (3.4: `add backend`, which HAProxy marks
    /// experimental); `false` leaves `backend.add` out of the capabilities, so a new backend
    /// reloads as before 3.4.
    #[arg(long, env = "HAPTIC_AGENT_RUNTIME_BACKENDS", default_value_t = true, action = clap::ArgAction::Set)]
    pub runtime_backends: bool,
}

/// A log filter `tracing_subscriber::EnvFilter` accepts.
pub fn parse_log_level(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("bad log level {s:?}: {e}"))
}

/// Parses a human duration such as `2s`, `500ms` or `1m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("bad duration {s:?}: {e}"))
}

/// Parses a byte size such as `1024`, `64KiB`, `256MiB`, `1GiB`, `10MB` or `1k`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}: expected a number and an optional unit"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" | "ki" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" | "mi" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" | "gi" => 1 << 30,
        other => return Err(format!("bad size {s:?}: unknown unit {other:?}")),
    };
    n.checked_mul(mult).and_then(|v| usize::try_from(v).ok()).ok_or_else(|| format!("size {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256MiB").unwrap(), 256 << 20);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("64KiB").unwrap(), 65536);
        assert_eq!(parse_size("1k").unwrap(), 1000);
        assert!(parse_size("x").is_err());
        assert!(parse_size("12 parsecs").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("150ms").unwrap(), Duration::from_millis(150));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn run_flags_parse() {
        let cli = Cli::try_parse_from([
            "haptic-agent",
            "run",
            "--listen",
            "127.0.0.1:0",
            "--root",
            "/r",
            "--master-socket",
            "/m.sock",
            "--haproxy-bin",
            "/usr/sbin/haproxy",
            "--credentials-file",
            "/c",
            "--max-body",
            "1KiB",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else { panic!("not run") };
        let r = *r;
        assert_eq!(r.max_body, 1024);
        assert_eq!(r.min_reload_interval, Duration::from_secs(2));
        assert_eq!(r.reload_timeout, Duration::from_secs(10));
        assert_eq!(r.log_format, LogFormat::Text);
        assert_eq!(
            (r.header_timeout, r.idle_timeout, r.body_timeout),
            (Duration::from_secs(10), Duration::from_secs(60), Duration::from_secs(120))
        );
        assert_eq!(r.max_connections, 64);
        assert_eq!((r.credentials_poll, r.credentials_grace), (Duration::from_secs(2), Duration::from_secs(300)));
        assert_eq!(r.log_level, "info");
        assert!(parse_log_level("info,haptic_agent=debug").is_ok());
        assert!(parse_log_level("haptic_agent=loud").is_err());
        assert_eq!(r.allow_path, ["/etc/ssl/certs", "/usr/share/ca-certificates"]);
    }
}
