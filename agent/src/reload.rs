//! HAProxy facts and the verified reload, for HAProxy 2.6 and ≥ 2.7.
//!
//! This module owns two questions: "which HAProxy is this, and who serves?" ([`probe`]) and "did
//! this reload really land?" ([`reload_verified`]). On ≥ 2.7 the master CLI `reload` answers
//! `Success=1|0` with the startup logs; on 2.6 it answers nothing and the outcome is read from
//! `show proc` (the master's reload counter, its `[failed: N]` counter and a new worker pid that
//! answers `@1 show info`). Either way a success is confirmed by a new worker that answers.
//!
//! It must never send signals (the master CLI `reload` is the one way in), never run two reloads at once
//! (callers serialize; the pacer decides when), and never touch the config tree.

use std::time::{Duration, Instant};

use haptic_haproxy::cli::command::{RELOAD, SHOW_PROC, SHOW_VERSION, WORKER_SHOW_INFO};
use haptic_haproxy::cli::{
    parse_reload_reply, parse_show_info, parse_show_proc, parse_version, CliParseError, ReloadReply, ShowProc,
};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

use crate::master::{CliError, MasterCli};

/// Interval between `show proc` polls while a reload settles.
const POLL: Duration = Duration::from_millis(20);
/// Per-call timeout of a poll while the master may be busy re-executing.
const POLL_CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a reload may leave `show proc` without a current worker before it counts as failed.
const NO_WORKER_GRACE: Duration = Duration::from_millis(500);
/// Back-off after "Another reload is still in progress." (3.1+).
const IN_PROGRESS_BACKOFF: Duration = Duration::from_millis(100);
/// How long the master CLI may stay unreachable during a reload before a master whose pid cannot
/// be seen from here (another pid namespace) counts as gone. Longer than a port-conflict reload
/// (≈ 2.3 s), during which 2.6 refuses connections. A master whose pid is visible is never
/// presumed gone while it lives: a CPU-starved master can stay silent for longer than any fixed
/// silence, so it gets the whole reload timeout and then counts as [`ReloadError::Timeout`]. That
/// is also what a live but hung master gets (after a worker died at start-up, exit-on-failure has
/// been seen to leave the master waiting forever on an old worker stopped by a stray SIGTTOU, with
/// its CLI closed, on 2.6 and 3.0).
const GONE_AFTER_UNREACHABLE: Duration = Duration::from_secs(5);

/// HAProxy's version, and who serves right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// `(major, minor, patch)` from `show version`.
    pub version: (u32, u32, u32),
    /// The version as printed, e.g. `2.6.12-1+deb12u4`.
    pub version_string: String,
    /// The master's pid (stable across reloads).
    pub master_pid: u32,
    /// The serving worker's pid, if any.
    pub worker_pid: Option<u32>,
    /// The master's reload counter (successes and failures).
    pub reloads: u64,
}

/// A verified reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadOk {
    /// The worker that served before.
    pub old_worker: Option<u32>,
    /// The new worker, which answered `@1 show info` with its own pid.
    pub new_worker: u32,
    /// From sending `reload` to the confirmation.
    pub took: Duration,
    /// The startup logs HAProxy printed (≥ 2.7; empty on 2.6).
    pub logs: String,
}

/// Why a reload did not land (or could not be verified).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// HAProxy refused the new config; the old worker keeps serving. `output` is HAProxy's words.
    #[error("reload failed: {output}")]
    Failed {
        /// HAProxy's `[ALERT]` lines (≥ 2.7) or what 2.6 lets us see.
        output: String,
    },
    /// The reload did not settle within the reload timeout.
    #[error("reload not verified within the reload timeout")]
    Timeout,
    /// The master process is gone, or its CLI stopped answering for good during the reload (e.g. a
    /// worker failed after the fork and exit-on-failure took everything down: a total outage).
    #[error("HAProxy master is gone (its CLI stopped answering during the reload)")]
    MasterGone,
    /// The master took the reload but no worker serves: the new worker died at start-up (e.g. a
    /// `chroot` that passes `-c` but fails) and the old one is stopping. `show_proc` is the evidence.
    #[error("reload left no current worker (the new worker died at start-up); show proc:\n{show_proc}")]
    NoWorker {
        /// The master's `show proc` reply.
        show_proc: String,
    },
    /// The master CLI failed outside a reload (e.g. before it, when reading the state).
    #[error(transparent)]
    Cli(#[from] CliError),
    /// A reply could not be read.
    #[error("unreadable HAProxy reply: {0}")]
    Parse(#[from] CliParseError),
    /// HAProxy answered something this agent does not understand.
    #[error("unexpected HAProxy reply: {0}")]
    Unexpected(String),
}

/// Reads HAProxy's version and current processes (`show version`, `show proc`).
pub async fn probe(cli: &MasterCli) -> Result<Probe, ReloadError> {
    let text = cli.master(SHOW_VERSION).await?;
    let version = parse_version(&text)?;
    let version_string = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_string();
    let proc = show_proc(cli, cli.timeout()).await?;
    Ok(Probe {
        version,
        version_string,
        master_pid: proc.master_pid(),
        worker_pid: proc.serving_worker().map(|w| w.pid),
        reloads: u64::from(proc.master_reloads()),
    })
}

async fn show_proc(cli: &MasterCli, timeout: Duration) -> Result<ShowProc, ReloadError> {
    Ok(parse_show_proc(&cli.master_timeout(SHOW_PROC, timeout).await?)?)
}

/// Whether the master process can be seen from here, and if so whether it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Liveness {
    Alive,
    Dead,
    /// `kill(pid, 0)` never saw it (another pid namespace, e.g. a pod without shared namespaces).
    Unknown,
}

/// Whether the process `pid` is alive as seen from here: `Some(false)` when it is gone (or a
/// zombie), `None` when it cannot be seen (another pid namespace).
pub fn pid_alive(pid: u32) -> Option<bool> {
    match pid_state(pid) {
        Liveness::Alive => Some(true),
        Liveness::Dead => Some(false),
        Liveness::Unknown => None,
    }
}

/// Watches the master pid; only trusts ESRCH when the pid was visible at the start.
#[derive(Debug)]
struct MasterWatch {
    pid: u32,
    visible: bool,
}

impl MasterWatch {
    fn new(pid: u32) -> Self {
        let visible = pid_state(pid) == Liveness::Alive;
        Self { pid, visible }
    }

    fn state(&self) -> Liveness {
        if !self.visible {
            return Liveness::Unknown;
        }
        pid_state(self.pid)
    }
}

/// `kill(pid, 0)`, counting a zombie (exited, not reaped) as dead.
fn pid_state(pid: u32) -> Liveness {
    let Ok(raw) = i32::try_from(pid) else {
        return Liveness::Unknown;
    };
    match kill(Pid::from_raw(raw), None) {
        Err(Errno::ESRCH) => Liveness::Dead,
        Ok(()) => {
            // A zombie still answers kill(); /proc tells. Missing /proc: trust kill().
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Ok(stat) => match stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()) {
                    Some("Z" | "X") => Liveness::Dead,
                    _ => Liveness::Alive,
                },
                Err(_) => Liveness::Alive,
            }
        }
        // EPERM: it exists but is not ours.
        Err(_) => Liveness::Alive,
    }
}

/// Tracks how long the master has been unreachable, to tell "busy reloading" from "gone".
#[derive(Debug)]
struct Unreachable {
    since: Option<Instant>,
}

impl Unreachable {
    fn new() -> Self {
        Self { since: None }
    }

    fn reachable(&mut self) {
        self.since = None;
    }

    /// Records a failed call; `Err(MasterGone)` once the master is known gone (its visible pid
    /// died), or presumed gone (its pid cannot be seen and it has been silent for
    /// [`GONE_AFTER_UNREACHABLE`]). A visible, living master is waited for until the deadline.
    fn failed(&mut self, now: Instant, watch: &MasterWatch) -> Result<(), ReloadError> {
        let since = *self.since.get_or_insert(now);
        let alive = match watch.state() {
            Liveness::Alive => Some(true),
            Liveness::Dead => Some(false),
            Liveness::Unknown => None,
        };
        if presumed_gone(Some(now.duration_since(since)), alive) {
            return Err(ReloadError::MasterGone);
        }
        Ok(())
    }
}

/// The one "HAProxy is gone" rule, for reloads and health checks alike. Pure:
/// `unreachable_for` = how long the master CLI could not be reached (`None`: it answered or timed
/// out), `master_alive` = what the master's pid says (`None`: no pid known, or not visible from
/// here). A visible pid decides; without one, a silence of [`GONE_AFTER_UNREACHABLE`] does.
pub(crate) fn presumed_gone(unreachable_for: Option<Duration>, master_alive: Option<bool>) -> bool {
    match (unreachable_for, master_alive) {
        (None, _) | (Some(_), Some(true)) => false,
        (Some(_), Some(false)) => true,
        (Some(d), None) => d >= GONE_AFTER_UNREACHABLE,
    }
}

/// Reloads HAProxy through the master CLI and verifies that a new worker serves.
///
/// `version` selects the protocol: ≥ 2.7 reads `Success=1|0` (retrying "Another reload is still in
/// progress." until the deadline), 2.6 compares `show proc` before and after. `timeout` bounds the
/// whole operation. On [`ReloadError::Failed`] the old worker still serves.
pub async fn reload_verified(
    cli: &MasterCli,
    version: (u32, u32, u32),
    timeout: Duration,
) -> Result<ReloadOk, ReloadError> {
    let started = Instant::now();
    let deadline = started + timeout;
    let before = show_proc(cli, cli.timeout().min(timeout)).await?;
    let old_worker = before.serving_worker().map(|w| w.pid);
    let watch = MasterWatch::new(before.master_pid());
    let reloads_before = before.master_reloads();

    if version >= (2, 7, 0) {
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ReloadError::Timeout);
            }
            match cli.master_timeout(RELOAD, remaining).await {
                Ok(text) => match parse_reload_reply(&text) {
                    ReloadReply::Success { logs } => {
                        let new_worker = await_new_worker(cli, old_worker, None, &watch, deadline).await?;
                        return Ok(ReloadOk { old_worker, new_worker, took: started.elapsed(), logs });
                    }
                    ReloadReply::Failure { logs } => {
                        let output = if logs.trim().is_empty() { "Success=0".to_string() } else { logs };
                        return Err(ReloadError::Failed { output });
                    }
                    ReloadReply::InProgress => {
                        tracing::debug!("another reload is in progress; retrying");
                        tokio::time::sleep(IN_PROGRESS_BACKOFF.min(remaining)).await;
                    }
                    // No status (3.2.0 bug) or an unknown reply: fall back to the 2.6 check.
                    ReloadReply::NoStatus | ReloadReply::Unrecognized(_) => break,
                },
                Err(CliError::Timeout) => return Err(ReloadError::Timeout),
                Err(e) if e.is_unreachable() => {
                    // The reload may or may not have been sent; `show proc` tells.
                    tracing::debug!(error = %e, "reload reply lost; verifying with show proc");
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
    } else {
        send_reload_2_6(cli, &watch, deadline).await?;
    }
    let new_worker = await_new_worker(cli, old_worker, Some(reloads_before), &watch, deadline).await?;
    Ok(ReloadOk { old_worker, new_worker, took: started.elapsed(), logs: String::new() })
}

/// Sends `reload` on 2.6, where the reply is empty (or the connection is reset by the re-exec).
async fn send_reload_2_6(cli: &MasterCli, watch: &MasterWatch, deadline: Instant) -> Result<(), ReloadError> {
    let mut unreachable = Unreachable::new();
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ReloadError::Timeout);
        }
        match cli.master_timeout(RELOAD, remaining.min(POLL_CALL_TIMEOUT)).await {
            Ok(_) => return Ok(()),
            // Connected and wrote: the re-exec may reset us; the reload is under way.
            Err(CliError::Io(_)) | Err(CliError::Timeout) => return Ok(()),
            Err(e @ CliError::Connect(..)) => {
                tracing::debug!(error = %e, "master not accepting; retrying reload");
                unreachable.failed(Instant::now(), watch)?;
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `show proc` until a current worker other than `old_worker` answers `@1 show info`.
///
/// With `reloads_before` (the 2.6 verification), it first waits for the master's reload counter
/// to move and reads `[failed: N]`. A reload that leaves no current worker for
/// [`NO_WORKER_GRACE`] (the new worker died at start-up) is [`ReloadError::NoWorker`].
async fn await_new_worker(
    cli: &MasterCli,
    old_worker: Option<u32>,
    reloads_before: Option<u32>,
    watch: &MasterWatch,
    deadline: Instant,
) -> Result<u32, ReloadError> {
    let mut unreachable = Unreachable::new();
    let mut no_worker_since: Option<Instant> = None;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ReloadError::Timeout);
        }
        match cli.master_timeout(SHOW_PROC, remaining.min(POLL_CALL_TIMEOUT)).await {
            // A cut-short reply while the master re-executes: still reloading.
            Ok(text) if parse_show_proc(&text).is_err() => {
                tracing::trace!(reply = %text, "unreadable show proc while reloading");
                unreachable.failed(Instant::now(), watch)?;
            }
            Ok(text) => {
                unreachable.reachable();
                let p = parse_show_proc(&text)?;
                let moved = reloads_before.is_none_or(|r| p.master_reloads() > r);
                if moved && reloads_before.is_some() && p.failed_reloads > 0 {
                    return Err(ReloadError::Failed { output: failed_2_6_text(p.failed_reloads) });
                }
                match p.current_worker() {
                    None if moved => {
                        let now = Instant::now();
                        if now.duration_since(*no_worker_since.get_or_insert(now)) >= NO_WORKER_GRACE {
                            return Err(ReloadError::NoWorker { show_proc: text.trim_end().to_string() });
                        }
                    }
                    None => {}
                    Some(w) => {
                        no_worker_since = None;
                        if moved && Some(w.pid) != old_worker && worker_answers(cli, w.pid, remaining).await {
                            return Ok(w.pid);
                        }
                    }
                }
            }
            // Refused, reset, ENOENT and per-call timeouts all mean "still reloading".
            Err(e) => {
                tracing::trace!(error = %e, "master busy");
                unreachable.failed(Instant::now(), watch)?;
            }
        }
        if watch.state() == Liveness::Dead {
            return Err(ReloadError::MasterGone);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What 2.6 lets the agent say about a failed reload (its reasons go to the master's stderr only).
fn failed_2_6_text(failed: u32) -> String {
    format!(
        "reload failed ([failed: {failed}] in show proc); HAProxy 2.6 prints the reason only on the \
         master's stderr: run haproxy -c for details (a config that passes -c may hold a port in use)"
    )
}

/// Whether `@1 show info` is answered by `pid`, not stopping.
async fn worker_answers(cli: &MasterCli, pid: u32, remaining: Duration) -> bool {
    match cli.master_timeout(WORKER_SHOW_INFO, remaining.min(POLL_CALL_TIMEOUT)).await {
        Ok(text) => {
            let info = parse_show_info(&text);
            info.pid() == Some(pid) && info.stopping() != Some(true)
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_pid_is_alive_and_watchable() {
        assert_eq!(pid_state(std::process::id()), Liveness::Alive);
        assert_eq!(pid_state(u32::MAX), Liveness::Unknown);
        let w = MasterWatch::new(std::process::id());
        assert_eq!(w.state(), Liveness::Alive);
    }

    #[test]
    fn unreachable_master_is_gone_only_after_a_long_silence() {
        // A pid that does not exist here: as in a pod without a shared pid namespace.
        let w = MasterWatch { pid: 999_999_999, visible: false };
        let mut u = Unreachable::new();
        let t0 = Instant::now();
        assert!(u.failed(t0, &w).is_ok());
        assert!(u.failed(t0 + Duration::from_secs(3), &w).is_ok(), "a port conflict takes ≈2.3 s");
        assert!(matches!(u.failed(t0 + GONE_AFTER_UNREACHABLE, &w), Err(ReloadError::MasterGone)));
        u.reachable();
        assert!(u.failed(t0 + GONE_AFTER_UNREACHABLE * 2, &w).is_ok());
        // A master whose pid is visible and alive is never presumed gone, however long it is
        // silent (CPU-starved, or hung): the reload's deadline decides.
        let me = MasterWatch::new(std::process::id());
        let mut u = Unreachable::new();
        assert!(u.failed(t0, &me).is_ok());
        assert!(u.failed(t0 + GONE_AFTER_UNREACHABLE * 100, &me).is_ok());
    }

    #[test]
    fn gone_needs_an_unreachable_cli_and_no_live_master() {
        let ms = |n| Some(Duration::from_millis(n));
        assert!(presumed_gone(ms(0), Some(false)), "the master pid is gone");
        assert!(!presumed_gone(ms(60_000), Some(true)), "a live master refusing connections is reloading");
        assert!(!presumed_gone(None, Some(false)), "a CLI that answered (or timed out) is not gone");
        assert!(!presumed_gone(ms(2_300), None), "no pid to check: a re-exec may refuse for ≈2.3 s");
        assert!(presumed_gone(ms(5_000), None), "no pid to check: a long silence is gone");
    }

    #[test]
    fn visible_master_that_died_is_gone_at_once() {
        // `cat` lives until its stdin closes: visible first, then dead on our signal.
        let mut child = std::process::Command::new("cat").stdin(std::process::Stdio::piped()).spawn().unwrap();
        let pid = child.id();
        let w = MasterWatch::new(pid);
        assert!(w.visible);
        assert!(Unreachable::new().failed(Instant::now(), &w).is_ok());
        drop(child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while w.state() == Liveness::Alive {
            assert!(Instant::now() < deadline, "cat did not exit");
            std::thread::yield_now();
        }
        assert_eq!(w.state(), Liveness::Dead);
        assert!(matches!(Unreachable::new().failed(Instant::now(), &w), Err(ReloadError::MasterGone)));
        child.wait().unwrap();
    }

    #[test]
    fn failed_text_for_2_6_is_clear() {
        let t = failed_2_6_text(1);
        assert!(t.contains("[failed: 1]") && t.contains("haproxy -c"), "{t}");
    }
}
