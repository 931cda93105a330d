//! Contained runs of `haproxy -c`: the one place the controller's gate, its per-snippet check and
//! the agent's check start HAProxy over text a namespace user may have written.
//!
//! Owns how such a run is started and bounded: a cleared environment (a fixed `PATH` and only the
//! variables the caller names in [`Run::env`]), the render's directory as working directory,
//! stdin from `/dev/null`, a deadline, a cap on the output read (then the process is killed), and, where the kernel has Landlock, a filesystem
//! domain in which the process can read only the render, the HAProxy binary's directory, the
//! system's shared libraries and the few `/etc` files name resolution reads ([`readable_paths`]).
//! It also owns a small content-keyed verdict cache ([`Lru`]). It must never interpret HAProxy's
//! words (that is `haptic_haproxy::check_output`), never write into the render, and never
//! restrict a thread it did not start: the Landlock domain is entered by a dedicated thread that
//! ends with the run, and the child inherits it.

mod landlock_domain;
mod lru;

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use landlock_domain::Access;
pub use lru::Lru;

/// The `PATH` the contained process gets (whatever [`Run::env`] says).
pub const FIXED_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The most output read by default (stdout and stderr together); past it the process is killed.
pub const DEFAULT_MAX_OUTPUT: usize = 64 * 1024;

/// Why a contained run could not happen at all.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The binary is not an absolute path and is not on `PATH`.
    #[error("cannot find {0} on PATH")]
    NotFound(String),
    /// Spawning or waiting failed.
    #[error("cannot run {bin}: {source}")]
    Spawn {
        /// The binary.
        bin: String,
        /// The error.
        source: std::io::Error,
    },
    /// The Landlock domain could not be built although the kernel has Landlock.
    #[error("cannot build the Landlock domain: {0}")]
    Landlock(String),
    /// The run's thread failed.
    #[error("the check thread failed: {0}")]
    Thread(String),
}

/// One contained run.
#[derive(Debug, Clone)]
pub struct Run {
    /// The HAProxy binary (absolute, or looked up on the caller's `PATH`).
    pub bin: PathBuf,
    /// The working directory: the render, readable.
    pub dir: PathBuf,
    /// The arguments (for a check: `-c -f haproxy.cfg`).
    pub args: Vec<OsString>,
    /// Directories or files besides the render that the process may read (e.g. the CA bundles
    /// the path rules allow).
    pub extra_read: Vec<PathBuf>,
    /// Directories besides the binary's whose programs the process may run (the real binary
    /// behind a wrapper script).
    pub extra_exec: Vec<PathBuf>,
    /// The deadline; past it the process is killed.
    pub timeout: Duration,
    /// The most output read; past it the process is killed.
    pub max_output: usize,
    /// Environment variables the process gets besides [`FIXED_PATH`] (a `PATH` here is
    /// overridden): a config may name variables (`bind "${ADDR}"`), and a check must see the
    /// values the HAProxy that will load it sees. Empty by default.
    pub env: Vec<(OsString, OsString)>,
}

impl Run {
    /// `bin -c -f <cfg>` in `dir`, with the default bounds and `timeout`.
    pub fn check(bin: impl Into<PathBuf>, dir: impl Into<PathBuf>, cfg: &str, timeout: Duration) -> Self {
        Run {
            bin: bin.into(),
            dir: dir.into(),
            args: vec!["-c".into(), "-f".into(), cfg.into()],
            extra_read: Vec::new(),
            extra_exec: Vec::new(),
            timeout,
            max_output: DEFAULT_MAX_OUTPUT,
            env: Vec::new(),
        }
    }
}

/// How a contained run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The process exited (or died of a signal it did not get from us).
    Exited(ExitStatus),
    /// Killed at the deadline.
    TimedOut(Duration),
    /// Killed after writing more than the output cap.
    TooMuchOutput(usize),
}

/// What a contained run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// How it ended.
    pub end: End,
    /// stdout and stderr interleaved as written, at most the cap (lossy UTF-8).
    pub output: String,
    /// Whether the Landlock domain was in force.
    pub contained: bool,
}

impl Outcome {
    /// The exit code, when the process exited by itself.
    pub fn code(&self) -> Option<i32> {
        match &self.end {
            End::Exited(s) => s.code(),
            _ => None,
        }
    }
}

/// Whether this kernel enforces Landlock for our runs (probed once, on a throwaway thread; a
/// warning is logged once when it does not).
pub fn landlock_active() -> bool {
    static ACTIVE: OnceLock<bool> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let active = std::thread::spawn(landlock_domain::probe).join().unwrap_or(false);
        if !active {
            tracing::warn!(
                "Landlock is not enforced by this kernel: haproxy -c runs with a cleared environment, \
                 bounded time and output, but can read files outside the render"
            );
        }
        active
    })
}

/// The paths a contained run of `bin` over `dir` may read (and, for the binary's directory,
/// `exec` and the system's library and program directories, execute). The order is the order
/// the rules are added.
pub fn readable_paths(bin: &Path, dir: &Path, read: &[PathBuf], exec: &[PathBuf]) -> Vec<(PathBuf, Access)> {
    landlock_domain::rules(bin, dir, read, exec)
}

/// Runs `run` contained and waits for it (blocking: call from a blocking context).
pub fn run(run: Run) -> Result<Outcome, SandboxError> {
    let bin = resolve(&run.bin)?;
    let contain = landlock_active();
    std::thread::Builder::new()
        .name("haproxy-check".into())
        .spawn(move || run_here(&bin, &run, contain))
        .map_err(|e| SandboxError::Thread(e.to_string()))?
        .join()
        .map_err(|_| SandboxError::Thread("panicked".into()))?
}

/// On the dedicated thread: enters the domain, spawns, bounds. The thread ends with the run.
fn run_here(bin: &Path, run: &Run, contain: bool) -> Result<Outcome, SandboxError> {
    let contained = if contain {
        landlock_domain::enter(&landlock_domain::rules(bin, &run.dir, &run.extra_read, &run.extra_exec))
            .map_err(SandboxError::Landlock)?
    } else {
        false
    };
    let spawn_err = |source| SandboxError::Spawn { bin: bin.display().to_string(), source };
    let (reader, writer) = std::io::pipe().map_err(spawn_err)?;
    let mut cmd = Command::new(bin);
    cmd.args(&run.args)
        .current_dir(&run.dir)
        .env_clear()
        .envs(run.env.iter().map(|(k, v)| (k, v)))
        .env("PATH", FIXED_PATH)
        .stdin(Stdio::null())
        .stdout(writer.try_clone().map_err(spawn_err)?)
        .stderr(writer);
    let mut child = cmd.spawn().map_err(spawn_err)?;
    // The command holds the pipe's write ends: dropped, the reader sees EOF when the child ends.
    drop(cmd);
    let over = Arc::new(AtomicBool::new(false));
    let collector = {
        let (over, max) = (over.clone(), run.max_output);
        std::thread::spawn(move || read_capped(reader, max, &over))
    };
    let started = Instant::now();
    let end = loop {
        if let Some(status) = child.try_wait().map_err(spawn_err)? {
            // Cut off by the cap, the process may have died of the closed pipe first.
            break if over.load(Ordering::Relaxed) { End::TooMuchOutput(run.max_output) } else { End::Exited(status) };
        }
        let late = started.elapsed() >= run.timeout;
        if late || over.load(Ordering::Relaxed) {
            let _ = child.kill();
            let _ = child.wait();
            break if late { End::TimedOut(run.timeout) } else { End::TooMuchOutput(run.max_output) };
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let bytes = collector.join().map_err(|_| SandboxError::Thread("output reader panicked".into()))?;
    Ok(Outcome { end, output: String::from_utf8_lossy(&bytes).into_owned(), contained })
}

/// Reads at most `max` bytes; sets `over` when more came (the reader then stops).
fn read_capped(mut r: impl Read, max: usize, over: &AtomicBool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = max - out.len();
                out.extend_from_slice(&buf[..n.min(room)]);
                if n > room {
                    over.store(true, Ordering::Relaxed);
                    return out;
                }
            }
        }
    }
}

/// `bin` as an absolute path: as given when it has a `/`, else the first match on the caller's
/// `PATH` (the child's `PATH` is fixed, and the Landlock rules need the binary's directory).
fn resolve(bin: &Path) -> Result<PathBuf, SandboxError> {
    if bin.components().count() > 1 || bin.is_absolute() {
        return Ok(std::path::absolute(bin).unwrap_or_else(|_| bin.to_path_buf()));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
        .ok_or_else(|| SandboxError::NotFound(bin.display().to_string()))
}
