//! Swapping a checked tree in, recording it, and landing it: runtime ops, nothing (file_only),
//! or a paced reload.
//!
//! Owns the one durable write that must precede the swap (the intent), the swap itself, and what
//! `running` becomes. It must never stage or check trees (see [`super::stage`]) nor speak HTTP.

use std::path::Path;

use haptic_protocol::api::{Nack, ReloadStatus};
use haptic_protocol::{ApplyRequest, Mode, Op, PlanId};
use tracing::warn;

use super::stage::Staged;
use super::{blocking, now_rfc3339, Agent, Refusal};
use crate::error::AgentError;
use crate::store::{AppliedRecord, GoodRecord, Persisted};

impl Agent {
    /// Persists the intent, waits for the staged tree's fsyncs, swaps `current` and records the
    /// plan as applied. Returns the previously applied plan.
    pub(super) async fn swap_and_record(
        &self,
        p: &mut Persisted,
        req: &ApplyRequest,
        staged: &mut Staged,
        mode: Mode,
    ) -> Result<Option<PlanId>, Refusal> {
        let mut files = req.files.clone();
        files.sort_by(|a, b| a.path.as_str().as_bytes().cmp(b.path.as_str().as_bytes()));
        let record = AppliedRecord {
            plan_id: req.plan_id,
            blob: req.blob.clone(),
            mode,
            at: now_rfc3339(),
            files,
            tree: staged.id.clone(),
        };
        // The intent is on disk before `current` moves: after the swap, recovery trusts `current`
        // plus this intent, so the applied record is persisted with the ACK (before it is answered).
        // The same write carries a runtime apply's raised fence (see `admit`).
        p.intent = Some(record.clone());
        let saved = blocking(|| self.store.save(p));
        let synced = (&mut staged.syncing)
            .await
            .map_err(|e| AgentError::Tree(format!("fsync task failed: {e}")))
            .and_then(|r| r);
        if let Err(e) = saved.and(synced) {
            p.intent = None;
            let _ = blocking(|| self.tree.remove(&staged.id));
            return Err(e.into());
        }
        blocking(|| self.tree.swap(&staged.id))?;
        self.cache.set_stamps(staged.id.clone(), std::mem::take(&mut staged.stamps));
        let prev = p.applied.replace(record).map(|a| a.plan_id);
        p.intent = None;
        self.publish(p);
        self.metrics.tree(req.files.len(), req.files.iter().map(|f| f.size).sum());
        self.gc(p);
        Ok(prev)
    }

    /// Lands the swapped-in plan; returns the mode it really landed with and the reload, if any.
    /// A failed runtime op falls back to a reload of the (checked) tree: at once, or, while a
    /// reload is pending (the worker runs an older plan), with that paced reload.
    pub(super) async fn land(
        &self,
        p: &mut Persisted,
        staged: &Staged,
        mode: Mode,
        prev: Option<PlanId>,
        ops: &[Op],
        reasons: &mut Vec<String>,
    ) -> Result<(Mode, Option<ReloadStatus>), Refusal> {
        let running_was_prev = p.running.is_some() && p.running == prev || (p.running.is_none() && prev.is_none());
        // The tree is written and checked; with HAProxy gone there is nothing to tell it, and it
        // starts on this tree when its container restarts.
        if let Some(why) = self.gone_now().await {
            self.mark_down(p, &why);
            return Err(Refusal::Unavailable(why));
        }
        match mode {
            Mode::FileOnly => {
                self.advance_running(p, running_was_prev);
                self.metrics.reloads_avoided.inc();
                Ok((Mode::FileOnly, None))
            }
            Mode::Runtime => match self.run_ops(&staged.dir, ops).await {
                Ok(()) => {
                    if !running_was_prev && !ops.is_empty() {
                        // The worker runs an older plan plus these ops until the pending reload
                        // lands; if it fails, the worker is reset to the restored tree.
                        self.haproxy.set_ops_ahead(true);
                    }
                    self.advance_running(p, running_was_prev);
                    self.metrics.reloads_avoided.inc();
                    Ok((Mode::Runtime, None))
                }
                Err(why) => {
                    warn!("runtime op failed, reloading from the tree: {why}");
                    reasons.push(format!("runtime op failed, reloading from the tree: {why}"));
                    if let Some(a) = p.applied.as_mut() {
                        a.mode = Mode::Reload;
                    }
                    self.save(p)?;
                    if let Err(e) = self.cfg.check_tree(&staged.dir).await {
                        // The tree is not loadable: put the last good tree back and reset the
                        // worker's runtime state to it.
                        self.restore_last_good(p, &e.output)?;
                        self.pacing.started();
                        let _ = self.reload_once(p).await;
                        return Err(Refusal::Nack(Box::new(Nack {
                            error: "haproxy -c refused the config after a runtime op failed".into(),
                            rejected: true,
                            haproxy_output: e.output,
                            reason: format!("runtime op failed ({why}) and the tree does not pass haproxy -c"),
                        })));
                    }
                    if running_was_prev {
                        // At once, not paced: the worker holds the ops that landed before the failure.
                        return Ok((Mode::Reload, Some(self.reload_now(p, reasons).await?)));
                    }
                    // A reload is pending: the worker runs an older plan, which may lack what the
                    // ops address (a backend the pending plan adds). That reload loads this tree,
                    // still paced; until it lands the worker runs ahead of its config.
                    reasons.push("a reload is pending: this plan lands with it".into());
                    self.haproxy.set_ops_ahead(true);
                    Ok((Mode::Reload, Some(self.reload_paced(p, reasons).await?)))
                }
            },
            // decide_mode never keeps an unknown mode: it is a checked reload.
            Mode::Reload | Mode::Unknown => Ok((Mode::Reload, Some(self.reload_paced(p, reasons).await?))),
        }
    }

    pub(super) async fn run_ops(&self, tree_dir: &Path, ops: &[Op]) -> Result<(), String> {
        let Some(version) = self.version().await else {
            return Err("HAProxy version unknown".into());
        };
        match crate::runtime::run_ops(&self.cli, version, tree_dir, ops).await {
            Ok(_) => {
                for op in ops {
                    self.metrics.op(op.kind_name(), "ok");
                }
                Ok(())
            }
            Err(e) => {
                for op in ops.iter().take(e.index) {
                    self.metrics.op(op.kind_name(), "ok");
                }
                self.metrics.op(&e.kind, "failed");
                Err(e.to_string())
            }
        }
    }

    /// running := applied when the worker ran the previous applied plan (runtime/file_only land
    /// on top of it); the applied tree becomes the last good one.
    pub(super) fn advance_running(&self, p: &mut Persisted, running_was_prev: bool) {
        if running_was_prev {
            if let Some(a) = p.applied.clone() {
                p.running = Some(a.plan_id);
                p.last_good = Some(GoodRecord { tree: a.tree.clone(), applied: Some(a) });
            }
        }
    }
}
