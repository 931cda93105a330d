//! The agent's durable record under `ROOT/.state`: fence high-water mark, last accepted apply
//! and its ACK, the applied record (with its file index and tree id), the swap intent, the
//! last-good tree, the running plan and the last error.
//!
//! Owns the record's shape, atomic fsynced writes (temp file, fsync, rename, fsync dir) and the
//! pure fence and baseline rules applied to it. A write may be *deferred* ([`Store::save_deferred`]):
//! it is made durable in the background and renamed into place only once fsynced, and every later
//! write waits for it first, so `.state` only ever moves forward, each version whole. It must never
//! touch the config tree or HAProxy.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use haptic_protocol::api::{Ack, ConflictKind};
use haptic_protocol::{Fence, FenceDecision, FileEntry, Mode, PlanId};
use serde::{Deserialize, Serialize};

use crate::error::{AgentError, IoContext};
use crate::tree::{sync_dir, write_file};

/// The state directory, relative to the root.
pub const STATE_DIR: &str = ".state";
const STATE_FILE: &str = "state.json";

/// One plan as it lies on disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppliedRecord {
    /// The plan.
    pub plan_id: PlanId,
    /// The controller's opaque blob.
    #[serde(default)]
    pub blob: serde_json::Value,
    /// The mode it landed with.
    pub mode: Mode,
    /// When (RFC 3339).
    pub at: String,
    /// Every file of the tree.
    pub files: Vec<FileEntry>,
    /// The tree id under `.trees`.
    pub tree: String,
}

/// The tree HAProxy is known to load (restored after a failed reload).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoodRecord {
    /// The tree id.
    pub tree: String,
    /// Its applied record (`None` for the bootstrap tree).
    pub applied: Option<AppliedRecord>,
}

/// The last accepted `(fence, plan)` and, once it landed, its ACK.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastAccepted {
    /// The fence.
    pub fence: Fence,
    /// The plan.
    pub plan_id: PlanId,
    /// The ACK it got; `None` while in flight or after a refusal (a retry is then processed again).
    pub ack: Option<Ack>,
}

/// Everything the agent persists.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    /// The fence high-water mark.
    pub fence: Option<Fence>,
    /// The last accepted apply.
    pub last_accepted: Option<LastAccepted>,
    /// The plan on disk (`current`).
    pub applied: Option<AppliedRecord>,
    /// A tree about to be swapped in: if `current` points to it after a crash, it is the applied one.
    pub intent: Option<AppliedRecord>,
    /// The tree HAProxy's running config came from.
    pub last_good: Option<GoodRecord>,
    /// The plan HAProxy's worker runs.
    pub running: Option<PlanId>,
    /// The last failure, in HAProxy's words.
    pub last_error: Option<String>,
    /// HAProxy's warnings about the applied config (from its check), kept after a success.
    #[serde(default)]
    pub last_warnings: Vec<String>,
}

/// What the fence rules say about an incoming apply (pure result of [`fence_step`]).
#[derive(Debug, Clone, PartialEq)]
pub enum FenceStep {
    /// Refuse: `stale_epoch`.
    Stale,
    /// The exact retry of an apply that landed: answer this ACK again.
    Replay(Ack),
    /// Process it; `raise` says whether the high-water mark must be persisted first.
    Proceed {
        /// Whether the fence is new (persist it before anything else).
        raise: bool,
    },
}

/// Applies the fence rules (`stale_epoch` below the seen epoch, or at it with a seq not above
/// the seen one, except the exact retry of the last accepted apply) to the persisted record. Pure.
pub fn fence_step(p: &Persisted, incoming: &Fence, plan: &PlanId) -> FenceStep {
    let last = p.last_accepted.as_ref().map(|l| (&l.fence, &l.plan_id));
    match haptic_protocol::fence::decide(p.fence.as_ref(), last, incoming, plan) {
        FenceDecision::Stale => FenceStep::Stale,
        FenceDecision::Accept => FenceStep::Proceed { raise: true },
        FenceDecision::ExactRetry => match p.last_accepted.as_ref().and_then(|l| l.ack.clone()) {
            Some(ack) => FenceStep::Replay(ack),
            None => FenceStep::Proceed { raise: false },
        },
    }
}

/// Checks a request's baseline against the applied plan (`None` = complete state). Pure.
pub fn baseline_check(applied: Option<&PlanId>, baseline: Option<&PlanId>) -> Result<(), ConflictKind> {
    match (baseline, applied) {
        (None, _) => Ok(()),
        (Some(_), None) => Err(ConflictKind::UnknownBaseline),
        (Some(b), Some(a)) if a == b => Ok(()),
        (Some(_), Some(_)) => Err(ConflictKind::PrevMismatch),
    }
}

/// A deferred write in flight (joined before any later write, and when the store is dropped).
#[derive(Debug, Default)]
struct InFlight(std::sync::Mutex<Option<std::thread::JoinHandle<Result<(), AgentError>>>>);

impl InFlight {
    /// Waits for the deferred write, if any; its error (already logged) is returned once.
    fn join(&self) -> Result<(), AgentError> {
        let handle = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        match handle.map(std::thread::JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err(AgentError::State { path: STATE_DIR.into(), why: "state writer panicked".into() }),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

/// Reads and writes [`Persisted`] under `ROOT/.state`.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    in_flight: std::sync::Arc<InFlight>,
}

impl Store {
    /// The store of `root` (nothing is touched).
    pub fn new(root: &Path) -> Self {
        Self { dir: root.join(STATE_DIR), in_flight: std::sync::Arc::default() }
    }

    /// `ROOT/.state`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Loads the record; a missing file is an empty record, a corrupt one an error.
    pub fn load(&self) -> Result<Persisted, AgentError> {
        let path = self.dir.join(STATE_FILE);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| AgentError::State { path: path.display().to_string(), why: e.to_string() }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Persisted::default()),
            Err(e) => Err(AgentError::io("read", &path, e)),
        }
    }

    /// Writes the record atomically and durably (after any deferred write, which it waits for;
    /// that one's failure is not this write's: this write replaces the whole record anyway).
    pub fn save(&self, p: &Persisted) -> Result<(), AgentError> {
        if let Err(e) = self.in_flight.join() {
            tracing::warn!("an earlier deferred state write failed ({e}); writing the record again");
        }
        write_record(&self.dir, p)
    }

    /// Writes the record atomically and durably in the background and returns at once: the
    /// record becomes `.state` only once it is fsynced (until then `.state` holds the previous
    /// record, whole). For records a crash may lose without harm: the ACK's record after the
    /// swap, which recovery rebuilds from `current` plus the intent persisted before the swap
    /// (only `running` and the stored ACK are newer, and losing them costs a converging reload
    /// or a re-processed retry, never a wrong state). Any later write waits for it.
    pub fn save_deferred(&self, p: &Persisted) {
        let mut slot = self.in_flight.0.lock().unwrap_or_else(|e| e.into_inner());
        let previous = slot.take();
        let (dir, record) = (self.dir.clone(), p.clone());
        let spawned = std::thread::Builder::new().name("state-writer".into()).spawn(move || {
            if let Some(h) = previous {
                let _ = h.join();
            }
            let res = write_record(&dir, &record);
            if let Err(e) = &res {
                tracing::error!("deferred state write failed: {e}");
            }
            res
        });
        match spawned {
            Ok(h) => *slot = Some(h),
            Err(e) => {
                drop(slot);
                tracing::warn!("cannot start the state writer ({e}): writing the record now");
                if let Err(e) = self.save(p) {
                    tracing::error!("state write failed: {e}");
                }
            }
        }
    }

    /// Waits until every deferred write is on disk.
    pub fn flush(&self) -> Result<(), AgentError> {
        self.in_flight.join()
    }
}

/// Temp file, fsync, rename over `state.json`, fsync of the directory.
fn write_record(dir: &Path, p: &Persisted) -> Result<(), AgentError> {
    fs::create_dir_all(dir).ctx("create", dir)?;
    let bytes = serde_json::to_vec_pretty(p)
        .map_err(|e| AgentError::State { path: dir.display().to_string(), why: e.to_string() })?;
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    let _ = fs::remove_file(&tmp);
    write_file(&tmp, &bytes, true)?;
    let path = dir.join(STATE_FILE);
    fs::rename(&tmp, &path).ctx("rename", &path)?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_protocol::Digest;
    use proptest::prelude::*;

    fn f(epoch: u64, seq: u64) -> Fence {
        Fence { epoch, seq, holder: "a".into() }
    }
    fn plan(n: u8) -> PlanId {
        PlanId(Digest::of(&[n]))
    }
    fn ack(p: PlanId) -> Ack {
        Ack { applied: p, running: Some(p), mode: Mode::Reload, reasons: vec![], reload: None }
    }

    #[test]
    fn fence_rules() {
        let mut p = Persisted::default();
        assert_eq!(fence_step(&p, &f(1, 1), &plan(1)), FenceStep::Proceed { raise: true });
        p.fence = Some(f(5, 17));
        p.last_accepted = Some(LastAccepted { fence: f(5, 17), plan_id: plan(1), ack: None });
        // An exact retry of an apply that did not land is processed again, without raising.
        assert_eq!(fence_step(&p, &f(5, 17), &plan(1)), FenceStep::Proceed { raise: false });
        p.last_accepted.as_mut().unwrap().ack = Some(ack(plan(1)));
        assert_eq!(fence_step(&p, &f(5, 17), &plan(1)), FenceStep::Replay(ack(plan(1))));
        assert_eq!(fence_step(&p, &f(5, 17), &plan(2)), FenceStep::Stale);
        assert_eq!(fence_step(&p, &f(5, 16), &plan(2)), FenceStep::Stale);
        assert_eq!(fence_step(&p, &f(4, 100), &plan(2)), FenceStep::Stale);
        assert_eq!(fence_step(&p, &f(5, 18), &plan(2)), FenceStep::Proceed { raise: true });
        assert_eq!(fence_step(&p, &f(6, 0), &plan(2)), FenceStep::Proceed { raise: true });
    }

    #[test]
    fn baselines() {
        assert_eq!(baseline_check(None, None), Ok(()));
        assert_eq!(baseline_check(Some(&plan(1)), None), Ok(()));
        assert_eq!(baseline_check(None, Some(&plan(1))), Err(ConflictKind::UnknownBaseline));
        assert_eq!(baseline_check(Some(&plan(1)), Some(&plan(2))), Err(ConflictKind::PrevMismatch));
        assert_eq!(baseline_check(Some(&plan(1)), Some(&plan(1))), Ok(()));
    }

    proptest! {
        #[test]
        fn accepted_fences_only_rise(steps in proptest::collection::vec((0u64..4, 0u64..4, 0u8..3), 1..40)) {
            let mut p = Persisted::default();
            for (e, s, pl) in steps {
                let inc = f(e, s);
                match fence_step(&p, &inc, &plan(pl)) {
                    FenceStep::Proceed { raise: true } => {
                        if let Some(seen) = &p.fence {
                            prop_assert!(haptic_protocol::fence::is_newer(&inc, seen));
                        }
                        p.fence = Some(inc.clone());
                        p.last_accepted = Some(LastAccepted { fence: inc, plan_id: plan(pl), ack: Some(ack(plan(pl))) });
                    }
                    FenceStep::Replay(a) => prop_assert_eq!(a.applied, plan(pl)),
                    FenceStep::Proceed { raise: false } => prop_assert!(false, "every accepted apply landed"),
                    FenceStep::Stale => {}
                }
            }
        }
    }

    #[test]
    fn save_load_roundtrip() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Store::new(tmp.path());
        assert_eq!(s.load().unwrap(), Persisted::default());
        let p = Persisted { fence: Some(f(3, 4)), running: Some(plan(9)), ..Default::default() };
        s.save(&p).unwrap();
        s.save(&p).unwrap();
        assert_eq!(s.load().unwrap(), p);
    }
}
