//! Follow-ups of scheduled reloads: which follow-up is current for each pod, and what one poll of
//! a pod's state means.
//!
//! A pod that ACKs with a scheduled (paced) reload is followed up in the background, outside the
//! deployment slot, so a newer render dispatches at once (the agent's pacer keeps only the latest
//! plan, so one reload picks up the latest). Owns the pure bookkeeping — [`Tickets`]: one current
//! follow-up per pod, a newer apply or follow-up supersedes the older —, the pure judgement of
//! one poll, [`judge`], and when to poll, [`poll_delay`]: first once the reload is due, then with
//! a doubling backoff (HAProxy 2.6's master CLI takes 10 connections, and every state read of a
//! pod may use one). It must never do I/O (the deployer polls and writes the status board) and
//! never decide when to deploy (the scheduler does).

use std::collections::HashMap;
use std::time::Duration;

use haptic_protocol::PlanId;

/// One follow-up's claim on a pod; stale once superseded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The pod followed up.
    pub pod: String,
    /// The plan its scheduled reload should bring into the worker.
    pub plan: PlanId,
    generation: u64,
}

/// The current follow-up of every pod.
#[derive(Debug, Default)]
pub struct Tickets {
    current: HashMap<String, (u64, PlanId)>,
    next: u64,
}

impl Tickets {
    /// Starts a follow-up of `pod` waiting for `plan` to run; any older one is superseded.
    pub fn issue(&mut self, pod: &str, plan: PlanId) -> Ticket {
        self.next += 1;
        self.current.insert(pod.to_string(), (self.next, plan));
        Ticket { pod: pod.to_string(), plan, generation: self.next }
    }

    /// A newer apply to `pod` begins: its follow-up (if any) is superseded.
    pub fn supersede(&mut self, pod: &str) {
        self.current.remove(pod);
    }

    /// Whether `t` is still the pod's current follow-up.
    pub fn is_current(&self, t: &Ticket) -> bool {
        self.current.get(&t.pod).is_some_and(|(g, _)| *g == t.generation)
    }

    /// Ends `t`; returns whether it was current (a superseded follow-up must not report).
    pub fn close(&mut self, t: &Ticket) -> bool {
        if self.is_current(t) {
            self.current.remove(&t.pod);
            true
        } else {
            false
        }
    }

    /// The plan a pod's current follow-up waits for.
    pub fn waiting_for(&self, pod: &str) -> Option<PlanId> {
        self.current.get(pod).map(|(_, p)| *p)
    }

    /// How many follow-ups are current.
    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// Whether no follow-up is current.
    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

/// What one poll of a followed-up pod means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The worker runs the plan: converged.
    Converged,
    /// Not yet; poll again.
    Wait,
    /// The pod will not run the plan through this reload: failed, with why.
    Failed(Failure),
}

/// Why a follow-up failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The pod's applied plan is no longer the one followed up (another writer, or a rollback).
    MovedAway(PlanId),
    /// Past the deadline, the plan applied but not running: the agent's last error, if any.
    NotRunning(PlanId, Option<String>),
    /// Past the deadline, the pod did not answer: why.
    Unreachable(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::MovedAway(p) => {
                write!(f, "the pod's applied plan moved away from {} before its reload ran", p.short())
            }
            Failure::NotRunning(_, Some(error)) => f.write_str(error),
            Failure::NotRunning(p, None) => {
                write!(f, "plan {} applied but not running by the follow-up deadline", p.short())
            }
            Failure::Unreachable(why) => f.write_str(why),
        }
    }
}

/// What the pod answered to one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poll {
    /// Its state: applied and running plans and its last error.
    State {
        /// The plan on disk.
        applied: Option<PlanId>,
        /// The plan the worker runs.
        running: Option<PlanId>,
        /// The agent's last error (e.g. HAProxy's words on a failed reload).
        last_error: Option<String>,
    },
    /// No answer, with why.
    Unreachable(String),
}

/// The first pause between polls after the reload was due; it doubles up to [`MAX_POLL_GAP`].
pub const FIRST_POLL_GAP: Duration = Duration::from_millis(100);
/// The longest pause between two polls of one pod.
pub const MAX_POLL_GAP: Duration = Duration::from_secs(1);

/// How long to wait before poll number `polls` (0 = the first) of a follow-up whose reload was
/// due `due_in` after it started: the first poll shortly after the reload is due (it cannot run
/// earlier), then [`FIRST_POLL_GAP`] doubling up to [`MAX_POLL_GAP`].
pub fn poll_delay(polls: u32, due_in: Duration) -> Duration {
    if polls == 0 {
        return due_in + FIRST_POLL_GAP;
    }
    FIRST_POLL_GAP.saturating_mul(1u32 << (polls - 1).min(16)).min(MAX_POLL_GAP)
}

/// Judges one poll for a follow-up waiting for `target`; `past_deadline` once the reload's due
/// time plus the sync timeout has passed.
pub fn judge(target: PlanId, poll: Poll, past_deadline: bool) -> Step {
    match poll {
        Poll::State { applied, .. } if applied != Some(target) => Step::Failed(Failure::MovedAway(target)),
        Poll::State { running, .. } if running == Some(target) => Step::Converged,
        Poll::State { last_error, .. } if past_deadline => Step::Failed(Failure::NotRunning(target, last_error)),
        Poll::Unreachable(why) if past_deadline => Step::Failed(Failure::Unreachable(why)),
        _ => Step::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_protocol::Digest;

    fn pid(s: &str) -> PlanId {
        PlanId(Digest::of(s.as_bytes()))
    }

    fn state(applied: &str, running: &str) -> Poll {
        Poll::State { applied: Some(pid(applied)), running: Some(pid(running)), last_error: None }
    }

    #[test]
    fn a_newer_follow_up_or_apply_supersedes_the_older() {
        let mut t = Tickets::default();
        let a = t.issue("p1", pid("a"));
        let other = t.issue("p2", pid("a"));
        assert!(t.is_current(&a) && t.is_current(&other));
        let b = t.issue("p1", pid("b"));
        assert!(!t.is_current(&a), "superseded by a newer follow-up of the same pod");
        assert!(t.is_current(&b) && t.is_current(&other), "other pods are untouched");
        assert_eq!(t.waiting_for("p1"), Some(pid("b")));
        assert!(!t.close(&a), "a superseded follow-up does not report");
        t.supersede("p1");
        assert!(!t.is_current(&b), "superseded by a newer apply");
        assert_eq!(t.waiting_for("p1"), None);
        assert!(t.close(&other) && !t.close(&other), "closes once");
        assert!(t.is_empty());
    }

    #[test]
    fn the_same_plan_again_is_a_new_generation() {
        let mut t = Tickets::default();
        let a = t.issue("p1", pid("a"));
        let a2 = t.issue("p1", pid("a"));
        assert_ne!(a, a2);
        assert!(!t.is_current(&a) && t.is_current(&a2));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn polls_start_when_the_reload_is_due_and_back_off() {
        let due = Duration::from_millis(1800);
        assert_eq!(poll_delay(0, due), Duration::from_millis(1900));
        let gaps: Vec<u128> = (1..8).map(|n| poll_delay(n, due).as_millis()).collect();
        assert_eq!(gaps, vec![100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(poll_delay(u32::MAX, due), MAX_POLL_GAP, "no overflow");
    }

    #[test]
    fn judging_polls() {
        let t = pid("t");
        assert_eq!(judge(t, state("t", "o"), false), Step::Wait);
        assert_eq!(judge(t, state("t", "t"), false), Step::Converged);
        assert_eq!(judge(t, state("t", "t"), true), Step::Converged, "converged wins over the deadline");
        assert_eq!(judge(t, state("n", "o"), false), Step::Failed(Failure::MovedAway(t)));
        assert_eq!(judge(t, state("t", "o"), true), Step::Failed(Failure::NotRunning(t, None)));
        let failed = Poll::State { applied: Some(t), running: Some(pid("o")), last_error: Some("[ALERT] x".into()) };
        let alert = Failure::NotRunning(t, Some("[ALERT] x".into()));
        assert_eq!(judge(t, failed, true), Step::Failed(alert.clone()));
        assert_eq!(alert.to_string(), "[ALERT] x", "HAProxy's words when it had any");
        assert_eq!(judge(t, Poll::Unreachable("refused".into()), false), Step::Wait);
        assert_eq!(
            judge(t, Poll::Unreachable("refused".into()), true),
            Step::Failed(Failure::Unreachable("refused".into()))
        );
    }
}
