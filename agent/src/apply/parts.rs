//! The agent's live state outside the apply lock, in three owned parts: what it knows of its
//! HAProxy ([`HaproxyView`]), when the next reload may run ([`Pacing`]), and what it remembers
//! of the live tree to avoid re-reading it ([`TreeCache`]).
//!
//! Each part owns its locks; a lock is held only inside one method, never across an `await`
//! nor across another part's lock. They must never touch the disk, HAProxy or the persisted
//! record (that is the apply lock's, in [`super::Agent`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use haptic_haproxy::claim::{verify_runtime_claim_indexed, ChangedFile, ClaimError, IndexedCfg};
use haptic_protocol::{Capabilities, Digest, FileEntry, Op, PlanId};

use crate::pacer::{PaceDecision, Pacer};
use crate::reload::Probe;
use crate::tree::{Stamps, Tree};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the agent knows of its HAProxy.
#[derive(Debug, Default)]
pub(super) struct HaproxyView {
    /// The last probe (version, master and worker pids).
    probe: RwLock<Option<Probe>>,
    /// Why HAProxy is known to be gone (`None` while it runs or nothing is known).
    down: Mutex<Option<String>>,
    /// Since when the master CLI refuses connections.
    unreachable_since: Mutex<Option<Instant>>,
    /// Whether the worker holds runtime ops of applies that landed on top of a plan it does not
    /// run yet (during a pending reload): a failed reload must then reset the worker to the
    /// restored tree, or `running` would name a plan the worker runs with extra ops.
    ops_ahead: AtomicBool,
    /// `backend.add` left out of the capabilities whatever the version (`--runtime-backends false`).
    no_runtime_backends: bool,
}

impl HaproxyView {
    /// Nothing known yet; `runtime_backends` false leaves `backend.add` out of the capabilities.
    pub(super) fn new(runtime_backends: bool) -> Self {
        Self { no_runtime_backends: !runtime_backends, ..Self::default() }
    }

    /// The last probe.
    pub(super) fn probe(&self) -> Option<Probe> {
        self.probe.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// HAProxy's version, when probed.
    pub(super) fn version(&self) -> Option<(u32, u32, u32)> {
        self.probe.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(|p| p.version)
    }

    /// The master pid last seen.
    pub(super) fn master_pid(&self) -> Option<u32> {
        self.probe.read().unwrap_or_else(|e| e.into_inner()).as_ref().map(|p| p.master_pid)
    }

    /// Records a fresh probe; the master CLI answered, so it is not unreachable.
    pub(super) fn seen(&self, p: Probe) {
        *lock(&self.unreachable_since) = None;
        self.set_probe(p);
    }

    /// Records a fresh probe.
    pub(super) fn set_probe(&self, p: Probe) {
        *self.probe.write().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }

    /// How long the master CLI has refused connections, counting this look (`unreachable`);
    /// `None` (and the count reset) when it did not refuse.
    pub(super) fn unreachable_for(&self, unreachable: bool) -> Option<Duration> {
        let mut since = lock(&self.unreachable_since);
        if unreachable {
            Some(since.get_or_insert_with(Instant::now).elapsed())
        } else {
            *since = None;
            None
        }
    }

    /// What the agent can run over the runtime API of the probed HAProxy (nothing unprobed),
    /// without `backend.add` when runtime backends are turned off.
    pub(super) fn capabilities(&self) -> Capabilities {
        let mut caps = self.version().map(crate::runtime::capabilities).unwrap_or_default();
        if self.no_runtime_backends {
            caps.ops.retain(|k| k != haptic_protocol::OpKind::BackendAdd.as_str());
        }
        caps
    }

    /// Why HAProxy was last seen gone.
    pub(super) fn down_reason(&self) -> Option<String> {
        lock(&self.down).clone()
    }

    /// Records HAProxy gone; `true` when it was not known gone before.
    pub(super) fn mark_down(&self, why: &str) -> bool {
        lock(&self.down).replace(why.to_string()).is_none()
    }

    /// HAProxy is back.
    pub(super) fn clear_down(&self) {
        *lock(&self.down) = None;
    }

    /// Whether the worker holds runtime ops ahead of the plan it runs.
    pub(super) fn ops_ahead(&self) -> bool {
        self.ops_ahead.load(Ordering::SeqCst)
    }

    /// Sets [`HaproxyView::ops_ahead`].
    pub(super) fn set_ops_ahead(&self, ahead: bool) {
        self.ops_ahead.store(ahead, Ordering::SeqCst);
    }
}

/// When the next reload may run: the pacer's decisions on the clock, and the wake-up of the
/// background loop that runs scheduled reloads.
#[derive(Debug)]
pub(super) struct Pacing {
    pacer: Mutex<Pacer>,
    wake: tokio::sync::Notify,
}

impl Pacing {
    /// At most one reload per `min_interval`.
    pub(super) fn new(min_interval: Duration) -> Self {
        Self { pacer: Mutex::new(Pacer::new(min_interval)), wake: tokio::sync::Notify::new() }
    }

    /// A reload of `plan` is wanted: now, or scheduled (the loop is woken).
    pub(super) fn request(&self, plan: PlanId) -> PaceDecision {
        let decision = lock(&self.pacer).request(Instant::now(), plan);
        if matches!(decision, PaceDecision::Scheduled { .. }) {
            self.wake.notify_one();
        }
        decision
    }

    /// Schedules a reload of `plan` no sooner than `after` from now; returns when it is due.
    pub(super) fn schedule_after(&self, after: Duration, plan: PlanId) -> Duration {
        let now = Instant::now();
        let due_in = lock(&self.pacer).schedule(now, now + after, plan);
        self.wake.notify_one();
        due_in
    }

    /// The scheduled reload and how long until it is due.
    pub(super) fn due(&self) -> Option<(PlanId, Duration)> {
        lock(&self.pacer).due(Instant::now())
    }

    /// Takes the scheduled reload if it is due now.
    pub(super) fn take_due(&self) -> Option<PlanId> {
        lock(&self.pacer).take_due(Instant::now())
    }

    /// Drops the scheduled reload, if any.
    pub(super) fn cancel_pending(&self) {
        lock(&self.pacer).cancel_pending();
    }

    /// A reload starts now, outside the pacer's decision.
    pub(super) fn started(&self) {
        lock(&self.pacer).started(Instant::now());
    }

    /// The running reload ended.
    pub(super) fn finished(&self, ok: bool) {
        lock(&self.pacer).finished(Instant::now(), ok);
    }

    /// Waits until a reload is requested or scheduled.
    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }
}

/// What the agent remembers of the live tree: the stamps of the files it wrote or hashed (only
/// ever trusted for that one tree), and the last `haproxy.cfg` the runtime claim parsed.
#[derive(Debug, Default)]
pub(super) struct TreeCache {
    /// The tree id and its stamps. Empty after a start, so the first apply hashes what it carries.
    stamps: Mutex<(String, Stamps)>,
    /// The last parsed `haproxy.cfg`, by digest: the next runtime apply's old config is usually
    /// this one, so only the new one is parsed.
    parsed_cfg: Mutex<Option<(Digest, IndexedCfg)>>,
}

impl TreeCache {
    /// The stamps of tree `live` (none for any other tree).
    pub(super) fn stamps_of(&self, live: Option<&str>) -> Stamps {
        let st = lock(&self.stamps);
        if live == Some(st.0.as_str()) {
            st.1.clone()
        } else {
            Stamps::new()
        }
    }

    /// Tree `id` is live now, with these stamps.
    pub(super) fn set_stamps(&self, id: String, stamps: Stamps) {
        *lock(&self.stamps) = (id, stamps);
    }

    /// Re-reads the live tree's stamps after the agent linked or unlinked its files (which moves
    /// their ctime); stamps of any other tree are dropped.
    pub(super) fn refresh_stamps(&self, tree: &Tree) {
        let live = tree.live_id().ok().flatten();
        let mut st = lock(&self.stamps);
        if live.as_deref() == Some(st.0.as_str()) {
            let (id, stamps) = &mut *st;
            tree.refresh_stamps(id, stamps);
        } else {
            *st = (String::new(), Stamps::new());
        }
    }

    /// The runtime claim of an apply from the live `haproxy.cfg` to the staged one, compared
    /// through the parsed live config kept from the last claim when its digest (as the applied
    /// record holds it) is the live one, else parsed now; the staged config's parsed form is
    /// kept for the next claim.
    pub(super) fn runtime_claim(
        &self,
        live_files: &[FileEntry],
        old_cfg: &str,
        new_files: &[FileEntry],
        new_cfg: &str,
        changed: &[ChangedFile<'_>],
        ops: &[Op],
    ) -> Result<(), ClaimError> {
        let digest_of = |files: &[FileEntry]| files.iter().find(|f| f.path.is_haproxy_cfg()).map(|f| f.digest);
        let (old_d, new_d) = (digest_of(live_files), digest_of(new_files));
        let cached = lock(&self.parsed_cfg).take();
        let mut parsed = match cached {
            Some((d, c)) if Some(d) == old_d => c,
            _ => IndexedCfg::parse(old_cfg),
        };
        let (res, new) = verify_runtime_claim_indexed(&parsed, old_cfg, new_cfg, changed, ops);
        parsed.update(new);
        if let Some(d) = new_d {
            *lock(&self.parsed_cfg) = Some((d, parsed));
        }
        res
    }
}
