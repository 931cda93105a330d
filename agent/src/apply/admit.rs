//! Admitting an apply: the fence rules and the baseline, before anything is staged.
//!
//! Owns raising the fence high-water mark and persisting it (check the fence, persist the new
//! high-water mark, only then stage; written and fsynced before it is published), so
//! neither a crash nor a slow `haproxy -c` can leave
//! `/v1/state` or `.state` showing an older fence than the one the agent enforces. A `runtime`
//! apply's raised fence is instead written with its intent record (one write before the swap,
//! [`super::land`]) and shown only then; a refusal writes it before it is answered. It must never
//! touch the tree nor HAProxy.

use haptic_protocol::api::ConflictKind;
use haptic_protocol::{Ack, ApplyRequest, Mode};
use tracing::info;

use super::{conflict, Agent, Refusal};
use crate::store::{baseline_check, fence_step, FenceStep, LastAccepted, Persisted};

impl Agent {
    /// Fence, then baseline. `Ok(Some(ack))`: the exact retry of an apply that landed.
    pub(super) fn admit(&self, p: &mut Persisted, req: &ApplyRequest) -> Result<Option<Ack>, Refusal> {
        match fence_step(p, &req.fence, &req.plan_id) {
            FenceStep::Stale => {
                let seen = p.fence.clone();
                return Err(conflict(
                    ConflictKind::StaleEpoch,
                    p,
                    vec![],
                    format!(
                        "stale fence {}: the agent has seen {}",
                        req.fence,
                        seen.map(|f| f.to_string()).unwrap_or_default()
                    ),
                ));
            }
            FenceStep::Replay(ack) => {
                info!("exact retry: answering the same ACK");
                return Ok(Some(ack));
            }
            FenceStep::Proceed { raise: false } => {}
            FenceStep::Proceed { raise: true } => {
                let before = (p.fence.clone(), p.last_accepted.clone());
                p.fence = Some(req.fence.clone());
                p.last_accepted = Some(LastAccepted { fence: req.fence.clone(), plan_id: req.plan_id, ack: None });
                if req.mode == Mode::Runtime {
                    // Enforced from now on (the apply lock is held), written with the intent
                    // record before the swap, and not shown before it is written: every
                    // publication of the record follows a write of it, and a refusal writes it
                    // before it is answered. A crash before that write loses a fence that
                    // nothing has shown nor acted on.
                    return self.baseline(p, req);
                }
                // Durable before `/v1/state` shows it: a fence shown and then lost to a crash
                // would let an older writer back in. (Overlapping this write with staging, as
                // round 2 of the performance work did, published the fence before it was on disk;
                // `agent/tests/fence_order.rs` caught it.)
                if let Err(e) = self.save(p) {
                    // Not durable: not raised either.
                    (p.fence, p.last_accepted) = before;
                    return Err(e.into());
                }
            }
        }
        self.baseline(p, req)
    }

    /// The baseline rule, after the fence's.
    fn baseline(&self, p: &Persisted, req: &ApplyRequest) -> Result<Option<Ack>, Refusal> {
        if let Err(kind) = baseline_check(p.applied.as_ref().map(|a| &a.plan_id), req.baseline.as_ref()) {
            let msg = match kind {
                ConflictKind::UnknownBaseline => "the agent has no applied plan: send the complete state".to_string(),
                _ => format!(
                    "baseline {} is not the applied plan {}",
                    req.baseline.map(|b| b.to_string()).unwrap_or_default(),
                    p.applied.as_ref().map(|a| a.plan_id.to_string()).unwrap_or_default()
                ),
            };
            return Err(conflict(kind, p, vec![], msg));
        }
        Ok(None)
    }
}
