//! Reloads: the paced background loop, one verified reload, and restoring the last good tree.
//!
//! Owns converging after a start, running scheduled reloads when they come due, the paced
//! reload an apply asks for, and the rollback after a failed reload (with HAProxy's words in
//! `last_error`). It must never accept an apply nor parse HAProxy's replies (see
//! [`crate::reload`]).

use std::time::{Duration, Instant};

use haptic_protocol::api::{Nack, ReloadState, ReloadStatus};
use tracing::{info, warn, Instrument};

use super::{blocking, Agent, Refusal};
use crate::error::AgentError;
use crate::pacer::PaceDecision;
use crate::reload::{probe, reload_verified, ReloadError};
use crate::store::{GoodRecord, Persisted};

/// Why [`Agent::run_reload`] did not land.
#[derive(Debug)]
pub(super) enum ReloadFail {
    /// HAProxy refused it (its words); the last good tree is live again.
    Refused(String),
    /// HAProxy is not running: nothing was reloaded, the tree stays.
    Unavailable(String),
    /// The reload was not verified within the reload timeout. HAProxy may still be reading the
    /// tree, so it stays live; `running` is unknown until the verifying reload scheduled in
    /// `due_in` lands (or fails, and only then is the last good tree restored).
    Unverified {
        /// Why, for the ACK's reasons.
        why: String,
        /// When the verifying reload is due.
        due_in: Duration,
    },
}

impl Agent {
    /// After a start, or when HAProxy is back, a running plan that is not the applied one is
    /// reloaded (paced).
    pub(super) async fn converge(&self) {
        let mut inner = self.inner.lock().await;
        let Some(applied) = inner.p.applied.as_ref().map(|a| a.plan_id) else { return };
        if inner.p.running == Some(applied) {
            return;
        }
        info!(root = %self.cfg.root.display(), plan = %applied.short(), "running plan unknown or behind: reloading");
        // A scheduled reload wakes the reload loop.
        if let PaceDecision::ReloadNow = self.pacing.request(applied) {
            let _ = self.run_reload(&mut inner.p).await;
        }
    }

    /// Runs scheduled reloads when they come due (forever).
    pub(super) async fn reload_loop(&self) {
        loop {
            let due = self.pacing.due();
            self.metrics.pending_reload.set(i64::from(due.is_some()));
            match due {
                None => self.pacing.woken().await,
                Some((_, d)) if !d.is_zero() => {
                    tokio::select! {
                        _ = tokio::time::sleep(d) => {}
                        _ = self.pacing.woken() => {}
                    }
                }
                Some(_) => {
                    let mut inner = self.inner.lock().await;
                    let taken = self.pacing.take_due();
                    if taken.is_some() {
                        self.metrics.pending_reload.set(0);
                        let plan = inner.p.applied.as_ref().map(|a| a.plan_id);
                        let span = tracing::info_span!("paced_reload", pod = %self.cfg.pod, plan = %plan.map(|p| p.short()).unwrap_or_default());
                        let _ = self.run_reload(&mut inner.p).instrument(span).await;
                    } else {
                        drop(inner);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }
    }

    /// Reloads at once, outside the pacing (after a failed runtime op the worker holds part of a
    /// batch: it must not keep it until the interval ends). A pending reload is taken over: this
    /// one loads the latest tree.
    pub(super) async fn reload_now(
        &self,
        p: &mut Persisted,
        reasons: &mut Vec<String>,
    ) -> Result<ReloadStatus, Refusal> {
        self.pacing.cancel_pending();
        self.pacing.started();
        self.metrics.pending_reload.set(0);
        reload_answer(self.run_reload(p).await, reasons)
    }

    /// Asks the pacer; reloads now or schedules.
    pub(super) async fn reload_paced(
        &self,
        p: &mut Persisted,
        reasons: &mut Vec<String>,
    ) -> Result<ReloadStatus, Refusal> {
        let plan = p.applied.as_ref().map(|a| a.plan_id).ok_or_else(|| Refusal::Internal("nothing applied".into()))?;
        match self.pacing.request(plan) {
            PaceDecision::ReloadNow => reload_answer(self.run_reload(p).await, reasons),
            PaceDecision::Scheduled { due_in, replaced } => {
                if replaced.is_some() {
                    self.metrics.reload_coalesced.inc();
                }
                self.metrics.pending_reload.set(1);
                Ok(ReloadStatus {
                    state: ReloadState::Scheduled,
                    due_in_ms: Some(u64::try_from(due_in.as_millis()).unwrap_or(u64::MAX)),
                })
            }
        }
    }

    /// Runs one verified reload of the live tree (the pacer already counts it as started).
    /// Success: running := applied. Failure: the last good tree is restored and HAProxy's words
    /// are recorded in `last_error` and returned. HAProxy gone, or a master CLI that never took
    /// the reload: nothing is restored (HAProxy did not read anything).
    pub(super) async fn run_reload(&self, p: &mut Persisted) -> Result<(), ReloadFail> {
        // A master still re-executing (e.g. for a reload begun before this agent started)
        // refuses connections for a moment: wait for it, within the reload timeout.
        let deadline = Instant::now() + self.cfg.reload_timeout;
        while !self.cli.ping().await {
            if let Some(why) = self.gone_now().await {
                self.mark_down(p, &why);
                return Err(ReloadFail::Unavailable(why));
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let res = self.reload_once(p).await;
        match res {
            Ok(()) => Ok(()),
            Err(e @ ReloadError::Cli(_)) => {
                // The reload was never sent (the master CLI failed before it): nothing to undo.
                let why = format!("reload not sent: {e}");
                warn!(root = %self.cfg.root.display(), "{why}");
                p.last_error = Some(why.clone());
                if let Err(err) = self.save(p) {
                    warn!("recording the failure failed: {err}");
                }
                Err(ReloadFail::Unavailable(why))
            }
            Err(ReloadError::Timeout) => {
                // HAProxy may still be reading the tree (a 2.6 re-exec, a slow start): swapping
                // the last good tree back under it could make it load a mix of both. The tree
                // stays; a reload verified later tells what runs.
                let why = format!(
                    "reload not verified within {:?}: the tree stays live (HAProxy may still be reading it) \
                     and the running plan is unknown until a verifying reload lands",
                    self.cfg.reload_timeout
                );
                warn!(root = %self.cfg.root.display(), "{why}");
                p.running = None;
                p.last_error = Some(why.clone());
                let due_in = match p.applied.as_ref().map(|a| a.plan_id) {
                    Some(plan) => self.pacing.schedule_after(self.cfg.reload_timeout, plan),
                    None => Duration::ZERO,
                };
                self.metrics.pending_reload.set(1);
                if let Err(err) = self.save(p) {
                    warn!("recording the timeout failed: {err}");
                }
                Err(ReloadFail::Unverified { why, due_in })
            }
            Err(e) => {
                let output = match &e {
                    ReloadError::Failed { output } => self.explain_failure(output.clone()).await,
                    other => other.to_string(),
                };
                warn!(root = %self.cfg.root.display(), "reload failed, restoring the last good tree: {output}");
                // HAProxy's state is unknown, or its worker holds runtime ops of applies that are
                // being rolled back: the worker is reset to the restored tree, and until that
                // reload is verified nothing claims to know what it runs.
                let reset = !matches!(e, ReloadError::Failed { .. }) || self.haproxy.ops_ahead();
                if reset {
                    p.running = None;
                }
                if let Err(err) = self.restore_last_good(p, &output) {
                    warn!("restoring the last good tree failed: {err}");
                }
                if reset {
                    self.pacing.started();
                    if self.reload_once(p).await.is_err() {
                        warn!("reloading back to the last good tree failed too: the running plan is unknown");
                    }
                }
                Err(ReloadFail::Refused(output))
            }
        }
    }

    /// HAProxy's words for a failed reload. ≥ 2.7 answers them on the master CLI. 2.6 prints
    /// them only on the master's stderr, which the agent cannot read (another container): it
    /// reports `[failed: N]`, then what it can re-obtain from HAProxy itself, `haproxy -c` of the
    /// refused tree (the same parser, so a config error reads the same), and names any new bind
    /// address held by another socket (the one failure `-c` cannot see), each labelled as such.
    async fn explain_failure(&self, output: String) -> String {
        let Some(v) = self.version().await else { return output };
        if v >= (2, 7, 0) {
            return output;
        }
        let mut text = output;
        let Ok(Some(live)) = self.tree.live_dir() else { return text };
        match self.cfg.check_tree(&live).await {
            Err(e) => text.push_str(&format!("\nhaproxy -c of the refused tree:\n{}", e.output)),
            Ok(_) => text.push_str("\nhaproxy -c of the refused tree: passed"),
        }
        let good_cfg = {
            let lg = self.snapshot.read().unwrap_or_else(|e| e.into_inner()).last_good.clone();
            lg.and_then(|g| std::fs::read_to_string(self.tree.dir_of(&g.tree).join("haproxy.cfg")).ok())
        };
        let new_cfg = std::fs::read_to_string(live.join("haproxy.cfg")).unwrap_or_default();
        if let Err(e) = crate::check::precheck_binds(good_cfg.as_deref().unwrap_or_default(), &new_cfg) {
            text.push_str(&format!("\nbind pre-check of the refused tree:\n{}", e.output));
        }
        text
    }

    /// One verified reload; records success (running, last good) or failure metrics.
    pub(super) async fn reload_once(&self, p: &mut Persisted) -> Result<(), ReloadError> {
        let started = Instant::now();
        let res = match self.version().await {
            Some(v) => reload_verified(&self.cli, v, self.cfg.reload_timeout).await,
            None => Err(ReloadError::Unexpected("HAProxy version unknown (master CLI unreachable)".into())),
        };
        self.pacing.finished(res.is_ok());
        let secs = started.elapsed().as_secs_f64();
        match &res {
            Ok(ok) => {
                // The new worker runs the tree alone: no runtime op is ahead of it any more.
                self.haproxy.set_ops_ahead(false);
                self.metrics.reload("ok", secs);
                info!(old = ?ok.old_worker, new = ok.new_worker, took_ms = ok.took.as_millis() as u64, "reload verified");
                p.running = p.applied.as_ref().map(|a| a.plan_id);
                p.last_good = match &p.applied {
                    Some(a) => Some(GoodRecord { tree: a.tree.clone(), applied: Some(a.clone()) }),
                    None => self.tree.live_id().ok().flatten().map(|tree| GoodRecord { tree, applied: None }),
                };
                if let Err(e) = self.save(p) {
                    warn!("recording the reload failed: {e}");
                }
                self.gc(p);
                if let Ok(pr) = probe(&self.cli).await {
                    self.haproxy.set_probe(pr);
                }
            }
            Err(e) => {
                let label = if matches!(e, ReloadError::Timeout) { "timeout" } else { "failed" };
                self.metrics.reload(label, secs);
            }
        }
        res.map(|_| ())
    }

    /// Swaps the last good tree back in and makes it the applied record.
    pub(super) fn restore_last_good(&self, p: &mut Persisted, why: &str) -> Result<(), AgentError> {
        p.last_error = Some(why.to_string());
        if let Some(lg) = p.last_good.clone() {
            if self.tree.dir_of(&lg.tree).is_dir() {
                blocking(|| self.tree.swap(&lg.tree))?;
                p.applied = lg.applied.clone();
                if let Some(a) = &lg.applied {
                    self.metrics.tree(a.files.len(), a.files.iter().map(|f| f.size).sum());
                }
            }
        }
        self.pacing.cancel_pending();
        self.metrics.pending_reload.set(0);
        self.save(p)?;
        self.gc(p);
        Ok(())
    }

    /// Keeps only the live tree and the last good one.
    pub(super) fn gc(&self, p: &Persisted) {
        let live = self.tree.live_id().ok().flatten();
        let mut keep: Vec<&str> = Vec::new();
        if let Some(l) = live.as_deref() {
            keep.push(l);
        }
        if let Some(g) = p.last_good.as_ref() {
            keep.push(&g.tree);
        }
        blocking(|| {
            if let Err(e) = self.tree.gc(&keep) {
                warn!("removing old trees failed: {e}");
            }
            self.refresh_stamps();
        });
    }

    /// Re-reads the live tree's stamps after the agent linked or unlinked its files (which moves
    /// their ctime); stamps of any other tree are dropped.
    pub(super) fn refresh_stamps(&self) {
        self.cache.refresh_stamps(&self.tree);
    }
}

/// The answer to an apply whose reload ran now: done, HAProxy unavailable, or HAProxy's refusal.
fn reload_answer(r: Result<(), ReloadFail>, reasons: &mut Vec<String>) -> Result<ReloadStatus, Refusal> {
    match r {
        Ok(()) => Ok(ReloadStatus { state: ReloadState::Done, due_in_ms: None }),
        Err(ReloadFail::Unavailable(why)) => Err(Refusal::Unavailable(why)),
        // Landed on disk, not yet verified: followed up like a scheduled reload.
        Err(ReloadFail::Unverified { why, due_in }) => {
            reasons.push(why);
            Ok(ReloadStatus {
                state: ReloadState::Scheduled,
                due_in_ms: Some(u64::try_from(due_in.as_millis()).unwrap_or(u64::MAX)),
            })
        }
        Err(ReloadFail::Refused(output)) => Err(Refusal::Nack(Box::new(Nack {
            error: "HAProxy refused the reload; the last good tree is live again".into(),
            rejected: true,
            haproxy_output: output,
            reason: "reload failed".into(),
        }))),
    }
}
