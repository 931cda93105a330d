//! Fences: the token that lets an agent refuse stale writers.
//!
//! Owns [`Fence`] and the pure accept/retry/stale decision. It must never do I/O; persisting the
//! high-water mark is the agent's job.

use serde::{Deserialize, Serialize};

use crate::plan::PlanId;

/// A writer's token: the leadership epoch, the apply sequence within it, and who holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fence {
    /// The leadership term; a new term always has a higher epoch.
    pub epoch: u64,
    /// The apply sequence within the term; strictly increasing.
    pub seq: u64,
    /// The identity of the writer that owns this epoch.
    pub holder: String,
}

impl std::fmt::Display for Fence {
    /// `epoch/seq/holder`, the form logs and conflict messages use.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.epoch, self.seq, self.holder)
    }
}

/// The longest `holder` accepted, in bytes (a DNS name's limit; holders are identities).
pub const MAX_HOLDER_BYTES: usize = 253;

/// What an agent does with an incoming fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceDecision {
    /// The fence is newer than anything seen: accept and raise the high-water mark.
    Accept,
    /// The exact retry of the last accepted apply (same fence, same plan): answer the same ACK.
    ExactRetry,
    /// The fence is not newer than the high-water mark: refuse with `stale_epoch`.
    Stale,
}

/// Decides an incoming `(fence, plan)` against the high-water mark `seen` and the last accepted
/// `(fence, plan)`.
///
/// A fence is newer when its epoch is higher, or the epoch is equal, the holder is the same and
/// the seq is higher. One epoch belongs to one holder: the same epoch from another holder is stale.
pub fn decide(
    seen: Option<&Fence>,
    last_accepted: Option<(&Fence, &PlanId)>,
    incoming: &Fence,
    incoming_plan: &PlanId,
) -> FenceDecision {
    if let Some((f, p)) = last_accepted {
        if f == incoming && p == incoming_plan {
            return FenceDecision::ExactRetry;
        }
    }
    match seen {
        None => FenceDecision::Accept,
        Some(seen) if is_newer(incoming, seen) => FenceDecision::Accept,
        Some(_) => FenceDecision::Stale,
    }
}

/// Whether `a` is strictly newer than `b` under the fence order.
pub fn is_newer(a: &Fence, b: &Fence) -> bool {
    a.epoch > b.epoch || (a.epoch == b.epoch && a.holder == b.holder && a.seq > b.seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;

    fn f(epoch: u64, seq: u64, holder: &str) -> Fence {
        Fence { epoch, seq, holder: holder.into() }
    }

    #[test]
    fn display_is_epoch_seq_holder() {
        assert_eq!(f(5, 17, "ctl-0").to_string(), "5/17/ctl-0");
    }

    #[test]
    fn table() {
        let p1 = PlanId(Digest::of(b"1"));
        let p2 = PlanId(Digest::of(b"2"));
        let seen = f(5, 17, "a");
        let last = (&seen, &p1);
        assert_eq!(decide(None, None, &f(0, 0, "a"), &p1), FenceDecision::Accept);
        assert_eq!(decide(Some(&seen), Some(last), &f(5, 17, "a"), &p1), FenceDecision::ExactRetry);
        assert_eq!(decide(Some(&seen), Some(last), &f(5, 17, "a"), &p2), FenceDecision::Stale);
        assert_eq!(decide(Some(&seen), Some(last), &f(5, 16, "a"), &p2), FenceDecision::Stale);
        assert_eq!(decide(Some(&seen), Some(last), &f(4, 99, "a"), &p2), FenceDecision::Stale);
        assert_eq!(decide(Some(&seen), Some(last), &f(5, 18, "b"), &p2), FenceDecision::Stale);
        assert_eq!(decide(Some(&seen), Some(last), &f(5, 18, "a"), &p2), FenceDecision::Accept);
        assert_eq!(decide(Some(&seen), Some(last), &f(6, 0, "b"), &p2), FenceDecision::Accept);
    }
}
