//! One running HAProxy master-worker process: start, master CLI, verified reloads, teardown.
//!
//! HAProxy runs as `haproxy -W -db -S <dir>/master.sock,level,admin -f <cfg>` in its own process
//! group, with stdout and stderr captured continuously. Dropping a [`Haproxy`] kills the whole group
//! (SIGTERM, then SIGKILL after a deadline), so nothing survives a panicking test.

use std::collections::BTreeSet;
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use haptic_haproxy::cli::{
    parse_reload_reply, parse_show_info, parse_show_proc, CliParseError, ReloadReply, ShowInfo, ShowProc,
};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::bins::HaproxyBin;
use crate::pids::{group_members, pid_alive};

/// Interval between polls while waiting for HAProxy.
const POLL: Duration = Duration::from_millis(20);
/// Timeout of an ordinary master CLI command.
const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// Timeout of a `reload` command on ≥ 2.7 (the reply arrives when the reload finishes).
const RELOAD_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a reload may take before verification gives up.
const RELOAD_DEADLINE: Duration = Duration::from_secs(30);
/// How long startup may take.
const START_DEADLINE: Duration = Duration::from_secs(15);
/// How long SIGTERM may take before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// An I/O operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Waiting for HAProxy exceeded its deadline.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A CLI reply could not be parsed.
    #[error(transparent)]
    Parse(#[from] CliParseError),
    /// The master process exited; the text is its captured output.
    #[error("haproxy master exited:\n{0}")]
    MasterGone(String),
    /// HAProxy answered something the harness did not expect.
    #[error("unexpected: {0}")]
    Unexpected(String),
}

/// How a verified reload ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// A new worker serves; `logs` are the startup logs (≥ 2.7) or the captured output (2.6).
    Reloaded {
        /// The worker serving before the reload.
        old_worker: u32,
        /// The worker serving now.
        new_worker: u32,
        /// Startup logs or captured output of the reload.
        logs: String,
    },
    /// The reload failed and `worker` (the old one) still serves; `text` holds HAProxy's `[ALERT]`s.
    Failed {
        /// The worker still serving.
        worker: u32,
        /// HAProxy's explanation (`Success=0` logs or the master's stderr).
        text: String,
    },
}

/// How to start a [`Haproxy`].
#[derive(Debug, Clone)]
pub struct HaproxyOpts {
    /// Working directory; the master socket is `<dir>/master.sock`.
    pub dir: PathBuf,
    /// The config file; a relative path is relative to `dir`.
    pub cfg: PathBuf,
    /// Extra command-line arguments, appended after `-f <cfg>`.
    pub extra_args: Vec<String>,
    /// Extra environment variables (a config can read them as `"${NAME}"`).
    pub env: Vec<(String, String)>,
}

impl HaproxyOpts {
    /// Options for `<dir>/haproxy.cfg` with no extra arguments.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), cfg: PathBuf::from("haproxy.cfg"), extra_args: Vec::new(), env: Vec::new() }
    }

    /// The absolute path of the config file.
    pub fn cfg_path(&self) -> PathBuf {
        self.dir.join(&self.cfg)
    }
}

/// A running HAProxy master-worker process group, killed on drop.
#[derive(Debug)]
pub struct Haproxy {
    bin: HaproxyBin,
    opts: HaproxyOpts,
    sock: PathBuf,
    child: Option<Child>,
    master_pid: u32,
    output: Arc<Mutex<String>>,
    seen_pids: Mutex<BTreeSet<u32>>,
}

/// Copies everything from `r` into `buf` until EOF.
fn pump(mut r: impl Read + Send + 'static, buf: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&chunk[..n]);
                    buf.lock().unwrap_or_else(|e| e.into_inner()).push_str(&text);
                }
            }
        }
    });
}

/// Sends one command line to a CLI socket, half-closes, and reads the reply until EOF.
pub async fn cli_cmd(sock: &Path, cmd: &str, timeout: Duration) -> Result<String, HarnessError> {
    let io_err = |source| HarnessError::Io { what: format!("CLI {} `{cmd}`", sock.display()), source };
    let fut = async {
        let mut s = UnixStream::connect(sock).await?;
        s.write_all(format!("{cmd}\n").as_bytes()).await?;
        s.shutdown().await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| HarnessError::Timeout(format!("CLI `{cmd}` on {}", sock.display())))?
        .map_err(io_err)
}

impl Haproxy {
    /// Starts HAProxy in master-worker mode and waits until the master CLI lists a worker.
    pub async fn start(bin: &HaproxyBin, opts: HaproxyOpts) -> Result<Self, HarnessError> {
        let sock = opts.dir.join("master.sock");
        let _ = std::fs::remove_file(&sock);
        let mut cmd = Command::new(&bin.path);
        cmd.arg("-W")
            .arg("-db")
            .arg("-S")
            .arg(format!("{},level,admin", sock.display()))
            .arg("-f")
            .arg(opts.cfg_path())
            .args(&opts.extra_args)
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&opts.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child =
            cmd.spawn().map_err(|source| HarnessError::Io { what: format!("spawn {}", bin.path.display()), source })?;
        let output = Arc::new(Mutex::new(String::new()));
        if let Some(out) = child.stdout.take() {
            pump(out, output.clone());
        }
        if let Some(err) = child.stderr.take() {
            pump(err, output.clone());
        }
        let master_pid = child.id();
        let mut hap = Self {
            bin: bin.clone(),
            opts,
            sock,
            child: Some(child),
            master_pid,
            output,
            seen_pids: Mutex::new(BTreeSet::from([master_pid])),
        };
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(child) = hap.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(HarnessError::MasterGone(format!("{status}\n{}", hap.stderr_text())));
                }
            }
            // HAProxy 3.2 and 3.4 list the worker in `show proc` before `@1` reaches it ("Can't
            // find the target PID"): started means the worker answers too.
            if let Ok(p) = hap.show_proc().await {
                if p.serving_worker().is_some() && hap.worker_pid().await.is_ok() {
                    return Ok(hap);
                }
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout(format!(
                    "{} did not start within {START_DEADLINE:?}:\n{}",
                    hap.bin.label(),
                    hap.stderr_text()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The binary this process runs.
    pub fn bin(&self) -> &HaproxyBin {
        &self.bin
    }

    /// The options it was started with.
    pub fn opts(&self) -> &HaproxyOpts {
        &self.opts
    }

    /// The master CLI socket path.
    pub fn master_socket(&self) -> &Path {
        &self.sock
    }

    /// The absolute path of the config file.
    pub fn cfg_path(&self) -> PathBuf {
        self.opts.cfg_path()
    }

    /// Everything HAProxy wrote to stdout and stderr so far (the master's `[ALERT]`s go there).
    pub fn stderr_text(&self) -> String {
        self.output.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The length of the captured output, to read only what comes after with [`Self::output_since`].
    pub fn output_len(&self) -> usize {
        self.output.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The captured output after byte offset `from`.
    pub fn output_since(&self, from: usize) -> String {
        let out = self.output.lock().unwrap_or_else(|e| e.into_inner());
        out.get(from..).unwrap_or_default().to_string()
    }

    /// The master's pid (stable across reloads: the master re-execs).
    pub fn master_pid(&self) -> u32 {
        self.master_pid
    }

    /// Every master and worker pid this harness has seen (for [`crate::assert_no_stray`]).
    pub fn known_pids(&self) -> Vec<u32> {
        self.seen_pids.lock().unwrap_or_else(|e| e.into_inner()).iter().copied().collect()
    }

    /// Sends `cmd` to the master CLI and returns the reply (5 s timeout).
    pub async fn master_cmd(&self, cmd: &str) -> Result<String, HarnessError> {
        cli_cmd(&self.sock, cmd, CMD_TIMEOUT).await
    }

    /// Sends `cmd` to the master CLI with a custom timeout.
    pub async fn master_cmd_timeout(&self, cmd: &str, timeout: Duration) -> Result<String, HarnessError> {
        cli_cmd(&self.sock, cmd, timeout).await
    }

    /// Sends `cmd` to the current worker through the master (`@1 cmd`).
    pub async fn worker_cmd(&self, cmd: &str) -> Result<String, HarnessError> {
        self.master_cmd(&format!("@1 {cmd}")).await
    }

    /// Runs and parses `show proc`, remembering every pid it lists.
    pub async fn show_proc(&self) -> Result<ShowProc, HarnessError> {
        let text = self.master_cmd("show proc").await?;
        let p = parse_show_proc(&text)?;
        let mut seen = self.seen_pids.lock().unwrap_or_else(|e| e.into_inner());
        seen.insert(p.master_pid());
        seen.extend(p.all_worker_pids());
        Ok(p)
    }

    /// Runs and parses `@1 show info` (the current worker's info).
    pub async fn show_info(&self) -> Result<ShowInfo, HarnessError> {
        Ok(parse_show_info(&self.worker_cmd("show info").await?))
    }

    /// The pid of the current worker, from `@1 show info`.
    pub async fn worker_pid(&self) -> Result<u32, HarnessError> {
        let info = self.show_info().await?;
        let pid = info.pid().ok_or_else(|| HarnessError::Unexpected(format!("no Pid in show info: {info:?}")))?;
        self.seen_pids.lock().unwrap_or_else(|e| e.into_inner()).insert(pid);
        Ok(pid)
    }

    /// Whether the master process is still alive.
    pub fn master_alive(&self) -> bool {
        pid_alive(self.master_pid)
    }

    /// Reloads through the master CLI and verifies the result on every version.
    ///
    /// ≥ 2.7 uses the `Success=1|0` reply; 2.6 (empty reply) compares `show proc` before and after,
    /// treating refused, reset and missing sockets as "still reloading". Either way a success is
    /// confirmed by a new worker pid in `show proc` and `@1 show info`.
    pub async fn reload_verified(&self) -> Result<ReloadOutcome, HarnessError> {
        let before = self.show_proc().await?;
        let old_worker = before
            .serving_worker()
            .map(|w| w.pid)
            .ok_or_else(|| HarnessError::Unexpected("no worker before reload".into()))?;
        let reloads_before = before.master_reloads();
        let out_from = self.output_len();
        let deadline = Instant::now() + RELOAD_DEADLINE;
        loop {
            let reply = match self.master_cmd_timeout("reload", RELOAD_TIMEOUT).await {
                Ok(text) => parse_reload_reply(&text),
                // 2.6 may reset the connection while it re-execs: verify by `show proc`.
                Err(_) => ReloadReply::NoStatus,
            };
            match reply {
                ReloadReply::Success { logs } => {
                    let new_worker = self.wait_new_worker(old_worker, deadline).await?;
                    return Ok(ReloadOutcome::Reloaded { old_worker, new_worker, logs });
                }
                ReloadReply::Failure { logs } => {
                    return Ok(ReloadOutcome::Failed {
                        worker: self.serving_after_failure(old_worker).await?,
                        text: logs,
                    });
                }
                ReloadReply::InProgress => {
                    if Instant::now() >= deadline {
                        return Err(HarnessError::Timeout("another reload stayed in progress".into()));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                ReloadReply::NoStatus | ReloadReply::Unrecognized(_) => {
                    return self.verify_by_show_proc(old_worker, reloads_before, out_from, deadline).await;
                }
            }
        }
    }

    /// The 2.6 verification: poll `show proc` until the master's reload counter moves.
    async fn verify_by_show_proc(
        &self,
        old_worker: u32,
        reloads_before: u32,
        out_from: usize,
        deadline: Instant,
    ) -> Result<ReloadOutcome, HarnessError> {
        loop {
            if !self.master_alive() {
                return Err(HarnessError::MasterGone(self.stderr_text()));
            }
            // Refused, reset, ENOENT and timeouts all mean "still reloading".
            if let Ok(p) = self.show_proc().await {
                if p.master_reloads() > reloads_before {
                    if p.failed_reloads > 0 {
                        let text = self.wait_output(out_from, "Loading failure!").await;
                        let worker = p.serving_worker().map_or(old_worker, |w| w.pid);
                        return Ok(ReloadOutcome::Failed { worker, text });
                    }
                    if p.current_worker().is_some_and(|w| w.pid != old_worker) {
                        let new_worker = self.wait_new_worker(old_worker, deadline).await?;
                        return Ok(ReloadOutcome::Reloaded {
                            old_worker,
                            new_worker,
                            logs: self.output_since(out_from),
                        });
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout(format!(
                    "reload not settled within {RELOAD_DEADLINE:?}:\n{}",
                    self.output_since(out_from)
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Polls until `show proc` and `@1 show info` agree on a current worker other than `old`.
    async fn wait_new_worker(&self, old: u32, deadline: Instant) -> Result<u32, HarnessError> {
        loop {
            if let Ok(p) = self.show_proc().await {
                if let Some(w) = p.current_worker().filter(|w| w.pid != old) {
                    if let Ok(info) = self.show_info().await {
                        if info.pid() == Some(w.pid) && info.stopping() == Some(false) {
                            return Ok(w.pid);
                        }
                    }
                }
            }
            if !self.master_alive() {
                return Err(HarnessError::MasterGone(self.stderr_text()));
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout(format!("no new worker (old {old}) within {RELOAD_DEADLINE:?}")));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// After a failed reload: the worker `@1` reaches (expected to be `old`).
    async fn serving_after_failure(&self, old: u32) -> Result<u32, HarnessError> {
        match self.worker_pid().await {
            Ok(pid) => Ok(pid),
            Err(_) => Ok(self.show_proc().await?.serving_worker().map_or(old, |w| w.pid)),
        }
    }

    /// Waits (≤ 2 s) for `needle` in the output after `from` and returns that output.
    async fn wait_output(&self, from: usize, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let text = self.output_since(from);
            if text.contains(needle) || Instant::now() >= deadline {
                return text;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Kills the whole process group (SIGTERM, then SIGKILL after 5 s) and reaps the master.
    ///
    /// Idempotent and blocking (briefly); also run by `Drop`. Returns every pid seen.
    pub fn kill(&mut self) -> Vec<u32> {
        let pids = self.known_pids();
        let Some(mut child) = self.child.take() else {
            return pids;
        };
        let Ok(raw) = i32::try_from(self.master_pid) else {
            return pids;
        };
        let pgid = Pid::from_raw(raw);
        let group_gone = |child: &mut Child| {
            let master_done = !matches!(child.try_wait(), Ok(None));
            master_done && group_members(self.master_pid).is_empty() && pids.iter().all(|p| !pid_alive(*p))
        };
        let _ = killpg(pgid, Signal::SIGTERM);
        let deadline = Instant::now() + TERM_GRACE;
        while !group_gone(&mut child) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !group_gone(&mut child) {
            let _ = killpg(pgid, Signal::SIGKILL);
            for p in &pids {
                if let Ok(raw) = i32::try_from(*p) {
                    let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
                }
            }
            let _ = child.wait();
        }
        pids
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        self.kill();
    }
}
