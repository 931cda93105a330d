//! One pod's apply attempts within a deployment: the pure decision of what to do after each
//! answer to `POST /v1/apply`.
//!
//! Owns [`next`], a state machine in the style of [`crate::followup::judge`]: an ACK or a NACK
//! ends the attempts; a transport error is retried with the *same* request (same fence and plan:
//! the agent answers the exact retry of an apply that landed with its ACK again, and processes
//! one that never arrived), a bounded number of times, before the pod is failed; the 409 answers
//! are answered as follows: `stale_epoch` asks the fence holder to reclaim (or stand down),
//! `prev_mismatch` re-reads the pod and re-diffs once and then sends the complete state,
//! `unknown_baseline` sends the complete state, `missing_parts` resends exactly the files named
//! (and forgets the pod's file list when it named only files already sent). Every pod gets at
//! most [`MAX_APPLIES`] applies. It must never do I/O, read a clock or touch the status board;
//! the deployer carries out what it decides.

use std::collections::BTreeSet;

use haptic_protocol::{ConflictKind, Fence, RelPath};

/// The most applies one pod gets in one deployment (conflict answers and retries included).
pub const MAX_APPLIES: usize = 6;
/// How often a transport error is retried with the same request before the pod is failed.
pub const MAX_TRANSPORT_RETRIES: usize = 2;

/// What the agent answered to one apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 200 ACK.
    Ack,
    /// 422 NACK: HAProxy refused the plan.
    Nack,
    /// 409 conflict.
    Conflict {
        /// Which conflict.
        kind: ConflictKind,
        /// The fence the agent has seen.
        fence: Option<Fence>,
        /// For `missing_parts`: the paths named.
        missing: Vec<RelPath>,
    },
    /// No answer, or one that says nothing about the apply (connection refused or reset, a
    /// timeout, a 5xx, an undecodable body), with why: the apply may or may not have landed.
    Transport(String),
    /// The agent refused the request itself (4xx: malformed, credentials, too large), with
    /// why: sending it again changes nothing.
    Refused(String),
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// The pod ACKed: done.
    Acked,
    /// HAProxy refused the plan: done, the pod keeps its previous plan.
    Rejected,
    /// Send the very same request again (same fence, same plan, same parts).
    ExactRetry,
    /// Ask the fence holder to lift this controller's epoch above `seen`, then send the same
    /// plan with a new fence; if the holder refuses, stand down.
    Reclaim {
        /// The fence the pod has seen.
        seen: Fence,
    },
    /// Re-read the pod's state (verified) and diff again against what it holds.
    Rediff,
    /// Send the complete state and a reload, with this reason.
    CompleteState(String),
    /// Send the same plan again, with these files sent in full.
    Resend {
        /// Every path to send in full from now on (the ones named so far).
        extra: BTreeSet<RelPath>,
        /// Whether the pod's file list is stale (it named only files already sent): send every
        /// file in full.
        forget_pod_files: bool,
    },
    /// Give up on this pod in this deployment, with why.
    Fail(String),
}

/// The attempts made so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attempts {
    applies: usize,
    transport_retries: usize,
    rediffed: bool,
    extra: BTreeSet<RelPath>,
}

impl Attempts {
    /// Attempts that start with these files sent in full (drift repair rewrites them).
    pub fn with_extra(extra: BTreeSet<RelPath>) -> Self {
        Attempts { extra, ..Default::default() }
    }

    /// The paths sent in full whatever the pod holds.
    pub fn extra(&self) -> &BTreeSet<RelPath> {
        &self.extra
    }

    /// How many applies were sent.
    pub fn applies(&self) -> usize {
        self.applies
    }

    /// How many transport errors were retried.
    pub fn transport_retries(&self) -> usize {
        self.transport_retries
    }
}

/// Decides what follows `answer` to the apply just sent, and records it in `state`.
pub fn next(state: &mut Attempts, answer: Answer) -> Next {
    state.applies += 1;
    let next = match answer {
        Answer::Ack => return Next::Acked,
        Answer::Nack => return Next::Rejected,
        Answer::Refused(why) => return Next::Fail(why),
        Answer::Transport(why) if state.transport_retries >= MAX_TRANSPORT_RETRIES => {
            return Next::Fail(format!("no answer to {} tries of the same apply: {why}", state.transport_retries + 1))
        }
        Answer::Transport(_) => {
            state.transport_retries += 1;
            Next::ExactRetry
        }
        Answer::Conflict { kind: ConflictKind::StaleEpoch, fence: None, .. } => {
            return Next::Fail("stale_epoch without the fence the pod has seen".into())
        }
        Answer::Conflict { kind: ConflictKind::StaleEpoch, fence: Some(seen), .. } => Next::Reclaim { seen },
        Answer::Conflict { kind: ConflictKind::PrevMismatch, .. } if !state.rediffed => {
            state.rediffed = true;
            Next::Rediff
        }
        Answer::Conflict { kind: ConflictKind::PrevMismatch, .. } => {
            Next::CompleteState("the pod's plan changed again while re-diffing: complete state and a reload".into())
        }
        Answer::Conflict { kind: ConflictKind::UnknownBaseline, .. } => {
            Next::CompleteState("the agent has no applied plan: complete state and a reload".into())
        }
        Answer::Conflict { kind: ConflictKind::Unknown, .. } => Next::CompleteState(
            "the agent answered a conflict this controller does not know: complete state and a reload".into(),
        ),
        Answer::Conflict { kind: ConflictKind::MissingParts, missing, .. } => {
            // Everything named was already sent: the pod's file list is stale.
            let forget_pod_files = missing.is_empty() || missing.iter().all(|m| state.extra.contains(m));
            state.extra.extend(missing);
            Next::Resend { extra: state.extra.clone(), forget_pod_files }
        }
    };
    if state.applies >= MAX_APPLIES {
        return Next::Fail(format!("no ACK after {MAX_APPLIES} applies"));
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn conflict(kind: ConflictKind) -> Answer {
        Answer::Conflict { kind, fence: Some(Fence { epoch: 3, seq: 9, holder: "other".into() }), missing: vec![] }
    }

    fn missing(paths: &[&str]) -> Answer {
        Answer::Conflict {
            kind: ConflictKind::MissingParts,
            fence: None,
            missing: paths.iter().map(|p| RelPath::new(*p).unwrap()).collect(),
        }
    }

    #[test]
    fn ack_and_nack_end_the_attempts() {
        assert_eq!(next(&mut Attempts::default(), Answer::Ack), Next::Acked);
        assert_eq!(next(&mut Attempts::default(), Answer::Nack), Next::Rejected);
    }

    #[test]
    fn transport_errors_are_retried_exactly_then_fail() {
        let mut s = Attempts::default();
        assert_eq!(next(&mut s, Answer::Transport("reset".into())), Next::ExactRetry);
        assert_eq!(next(&mut s, Answer::Transport("reset".into())), Next::ExactRetry);
        match next(&mut s, Answer::Transport("connection refused".into())) {
            Next::Fail(why) => assert_eq!(why, "no answer to 3 tries of the same apply: connection refused"),
            other => panic!("{other:?}"),
        }
        // A request the agent refused itself is not sent again.
        let mut s = Attempts::default();
        assert_eq!(
            next(&mut s, Answer::Refused("401: wrong credentials".into())),
            Next::Fail("401: wrong credentials".into())
        );
        // The exact retry of a landed apply is answered with its ACK.
        let mut s = Attempts::default();
        assert_eq!(next(&mut s, Answer::Transport("reset".into())), Next::ExactRetry);
        assert_eq!(next(&mut s, Answer::Ack), Next::Acked);
    }

    #[test]
    fn prev_mismatch_rediffs_once_then_sends_the_complete_state() {
        let mut s = Attempts::default();
        assert_eq!(next(&mut s, conflict(ConflictKind::PrevMismatch)), Next::Rediff);
        assert!(
            matches!(next(&mut s, conflict(ConflictKind::PrevMismatch)), Next::CompleteState(w) if w.contains("again"))
        );
        // A third one (the pod keeps changing under a complete state cannot happen: no baseline)
        // still never loops: the apply budget ends it.
        assert!(matches!(next(&mut s, conflict(ConflictKind::PrevMismatch)), Next::CompleteState(_)));
    }

    #[test]
    fn a_conflict_kind_from_a_newer_minor_sends_the_complete_state() {
        let mut s = Attempts::default();
        assert!(
            matches!(next(&mut s, conflict(ConflictKind::Unknown)), Next::CompleteState(w) if w.contains("does not know"))
        );
    }

    #[test]
    fn unknown_baseline_sends_the_complete_state() {
        let mut s = Attempts::default();
        assert!(
            matches!(next(&mut s, conflict(ConflictKind::UnknownBaseline)), Next::CompleteState(w) if w.contains("no applied plan"))
        );
    }

    #[test]
    fn stale_epoch_reclaims_with_the_fence_seen() {
        let mut s = Attempts::default();
        assert_eq!(
            next(&mut s, conflict(ConflictKind::StaleEpoch)),
            Next::Reclaim { seen: Fence { epoch: 3, seq: 9, holder: "other".into() } }
        );
        let no_fence = Answer::Conflict { kind: ConflictKind::StaleEpoch, fence: None, missing: vec![] };
        assert!(matches!(next(&mut s, no_fence), Next::Fail(_)));
    }

    #[test]
    fn missing_parts_resends_exactly_those_then_everything() {
        let mut s = Attempts::default();
        let a: BTreeSet<RelPath> = [RelPath::new("maps/a.map").unwrap()].into();
        assert_eq!(next(&mut s, missing(&["maps/a.map"])), Next::Resend { extra: a.clone(), forget_pod_files: false });
        // Named again although sent: the pod's file list is stale.
        assert_eq!(next(&mut s, missing(&["maps/a.map"])), Next::Resend { extra: a, forget_pod_files: true });
        let mut d = Attempts::with_extra([RelPath::new("maps/b.map").unwrap()].into());
        assert!(matches!(next(&mut d, missing(&["maps/b.map"])), Next::Resend { forget_pod_files: true, .. }));
    }

    fn any_answer() -> impl Strategy<Value = Answer> {
        prop_oneof![
            Just(Answer::Ack),
            Just(Answer::Nack),
            Just(Answer::Transport("x".into())),
            Just(Answer::Refused("400".into())),
            Just(conflict(ConflictKind::StaleEpoch)),
            Just(conflict(ConflictKind::PrevMismatch)),
            Just(conflict(ConflictKind::UnknownBaseline)),
            Just(missing(&["maps/a.map"])),
            Just(missing(&[])),
        ]
    }

    proptest! {
        /// Whatever pods answer, a pod's attempts end (ACK, NACK or failed) within the budget,
        /// re-diff at most once and retry a transport error at most twice.
        #[test]
        fn attempts_always_end_within_the_budget(answers in proptest::collection::vec(any_answer(), 1..20)) {
            let mut s = Attempts::default();
            let mut rediffs = 0;
            let mut ended = false;
            for a in answers {
                match next(&mut s, a) {
                    Next::Acked | Next::Rejected | Next::Fail(_) => { ended = true; break; }
                    Next::Rediff => rediffs += 1,
                    _ => {}
                }
                prop_assert!(s.applies() < MAX_APPLIES);
            }
            prop_assert!(ended || s.applies() < MAX_APPLIES);
            prop_assert!(rediffs <= 1);
            prop_assert!(s.transport_retries() <= MAX_TRANSPORT_RETRIES);
        }
    }
}
