//! Leadership on a `coordination.k8s.io/v1` Lease, and the fence epoch it carries (the Lease's
//! `leaseTransitions`, raised in the same guarded write that acquires it).
//!
//! Owns the pure decision [`decide`] (acquire, renew, follow, lost, raise the epoch above a
//! floor) and the thin shell [`Elector`] that reads and writes the Lease with
//! resourceVersion-guarded replaces and publishes the current [`Term`]. The epoch is the Lease's
//! `leaseTransitions`, incremented in the same guarded write that acquires it; renewals keep it.
//! Expiry is judged on this replica's own clock: a record counts as alive until `duration` after
//! *we saw it change* (never by comparing another machine's timestamps). This module must never
//! deploy anything; the deployer asks it who holds the fence.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Timing of the election (client-go's defaults: 15 s / 10 s / 2 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a record stays valid after it last changed.
    pub duration: Duration,
    /// A leader that could not renew for this long stops deploying.
    pub renew_deadline: Duration,
    /// How often the Lease is read and renewed.
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What this replica last saw of the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `holderIdentity` (empty or absent: nobody).
    pub holder: Option<String>,
    /// `leaseTransitions`: the fence epoch of the holder's term.
    pub transitions: u64,
    /// The record's renew time as written (only used to notice that the record changed).
    pub renew_stamp: Option<String>,
    /// When this replica saw the record (holder, transitions, renew stamp) last change.
    pub changed_at: Instant,
}

/// This replica's own term, while it holds the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// The epoch of the term.
    pub epoch: u64,
    /// The last successful write (acquire or renew).
    pub renewed_at: Instant,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease exists: create it holding it, with `leaseTransitions = epoch`.
    Create {
        /// The epoch of the new term.
        epoch: u64,
    },
    /// Take the Lease (free or expired) with `leaseTransitions = epoch`.
    Acquire {
        /// The epoch of the new term.
        epoch: u64,
    },
    /// Renew our own record (same epoch).
    Renew,
    /// Lift our epoch to `epoch` in a guarded write (a pod had seen a higher one).
    Raise {
        /// The new epoch, above the floor.
        epoch: u64,
    },
    /// Another replica holds a valid Lease: do not deploy; look again later.
    Follow {
        /// Who holds it.
        holder: String,
    },
    /// We held it but could not renew within the renew deadline (or someone else holds it
    /// now): stop deploying at once.
    Lost {
        /// Why.
        why: String,
    },
}

/// The pure election step.
///
/// `me` is this replica's identity, `seen` the Lease as last read (`None`: it does not exist),
/// `holding` our current term, `floor` an epoch some pod has seen that our next term (or a
/// raise of the current one) must exceed.
pub fn decide(
    me: &str,
    seen: Option<&Observed>,
    holding: Option<Holding>,
    floor: u64,
    now: Instant,
    t: LeaseTiming,
) -> Decision {
    let next_epoch = |current: u64| current.max(floor) + 1;
    let Some(seen) = seen else {
        if holding.is_some() {
            return Decision::Lost { why: "the Lease was deleted".into() };
        }
        return Decision::Create { epoch: next_epoch(0) };
    };
    let holder = seen.holder.as_deref().filter(|h| !h.is_empty());
    match (holder, holding) {
        (Some(h), Some(mine)) if h == me => {
            if now.duration_since(mine.renewed_at) >= t.renew_deadline {
                Decision::Lost { why: format!("could not renew the Lease for {:?}", t.renew_deadline) }
            } else if seen.transitions != mine.epoch {
                Decision::Lost { why: format!("the Lease's epoch moved to {} under us", seen.transitions) }
            } else if floor >= mine.epoch {
                Decision::Raise { epoch: next_epoch(seen.transitions) }
            } else {
                Decision::Renew
            }
        }
        (Some(h), Some(_)) => Decision::Lost { why: format!("the Lease is held by {h}") },
        (Some(h), None) if h == me => {
            // Our identity but no term in this process (a restart with a fixed identity):
            // start a new term rather than reuse an epoch we did not persist.
            Decision::Acquire { epoch: next_epoch(seen.transitions) }
        }
        (Some(h), None) => {
            if now.duration_since(seen.changed_at) >= t.duration {
                Decision::Acquire { epoch: next_epoch(seen.transitions) }
            } else {
                Decision::Follow { holder: h.to_string() }
            }
        }
        (None, _) => Decision::Acquire { epoch: next_epoch(seen.transitions) },
    }
}

/// A term of leadership, as published by the [`Elector`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// The fence epoch (`leaseTransitions`).
    pub epoch: u64,
}

/// What the elector publishes: `Some(term)` while this replica leads.
pub type Leadership = watch::Receiver<Option<Term>>;

/// Who owns the Lease (the `HAProxyConfig` it elects for), read when the Lease is written.
pub type OwnerFn = Box<dyn Fn() -> Option<OwnerReference> + Send + Sync>;

/// The Lease shell: reads, decides, writes, publishes.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    tx: watch::Sender<Option<Term>>,
    raise_rx: mpsc::UnboundedReceiver<u64>,
    owner: Option<OwnerFn>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector").field("name", &self.name).field("identity", &self.identity).finish_non_exhaustive()
    }
}

/// Asks the elector to lift the epoch above a floor.
#[derive(Debug, Clone)]
pub struct RaiseHandle(mpsc::UnboundedSender<u64>);

impl RaiseHandle {
    /// Requests a term (or a raise of the current one) above `floor`.
    pub fn raise_above(&self, floor: u64) {
        let _ = self.0.send(floor);
    }
}

impl Elector {
    /// An elector for Lease `name` through `api` as `identity`.
    pub fn new(api: Api<Lease>, name: &str, identity: &str, timing: LeaseTiming) -> (Self, Leadership, RaiseHandle) {
        let (tx, rx) = watch::channel(None);
        let (raise_tx, raise_rx) = mpsc::unbounded_channel();
        let e = Self { api, name: name.to_string(), identity: identity.to_string(), timing, tx, raise_rx, owner: None };
        (e, rx, RaiseHandle(raise_tx))
    }

    /// Makes the Lease owned by what `owner` names (set when the Lease is created or taken over
    /// without an owner), so that deleting the `HAProxyConfig` garbage-collects its Lease.
    pub fn owned_by(mut self, owner: impl Fn() -> Option<OwnerReference> + Send + Sync + 'static) -> Self {
        self.owner = Some(Box::new(owner));
        self
    }

    fn owner_refs(&self, current: Option<Vec<OwnerReference>>) -> Option<Vec<OwnerReference>> {
        match (current, self.owner.as_ref().and_then(|f| f())) {
            (Some(refs), _) if !refs.is_empty() => Some(refs),
            (_, Some(o)) => Some(vec![o]),
            (cur, None) => cur,
        }
    }

    /// Runs until `shutdown`; on shutdown while leading, releases the Lease (holder cleared,
    /// epoch kept) so another replica takes over without waiting for expiry.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut seen: Option<Observed> = None;
        let mut holding: Option<Holding> = None;
        let mut floor = 0u64;
        loop {
            while let Ok(f) = self.raise_rx.try_recv() {
                floor = floor.max(f);
            }
            let now = Instant::now();
            match self.api.get_opt(&self.name).await {
                Ok(lease) => {
                    seen = lease.as_ref().map(|l| observe(l, seen.as_ref(), now));
                    let decision = decide(&self.identity, seen.as_ref(), holding, floor, now, self.timing);
                    holding = self.act(decision, lease, holding, now).await;
                }
                Err(e) => {
                    warn!(lease = %self.name, "cannot read the Lease: {e}");
                    if let Some(h) = holding {
                        if now.duration_since(h.renewed_at) >= self.timing.renew_deadline {
                            holding = self.lose("could not read the Lease within the renew deadline");
                        }
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.timing.retry_period) => {}
                Some(f) = self.raise_rx.recv() => { floor = floor.max(f); }
            }
        }
        if holding.is_some() {
            self.release().await;
        }
        let _ = self.tx.send(None);
    }

    async fn act(&self, d: Decision, lease: Option<Lease>, holding: Option<Holding>, now: Instant) -> Option<Holding> {
        match d {
            Decision::Follow { .. } => {
                if holding.is_some() {
                    return self.lose("another replica holds the Lease");
                }
                None
            }
            Decision::Lost { why } => self.lose(&why),
            Decision::Create { epoch } => {
                // With an owner to name, no owner (the HAProxyConfig not seen yet, or deleted:
                // `helm uninstall`) means nothing to lead: a Lease made now would outlive it.
                let owner = self.owner_refs(None);
                if self.owner.is_some() && owner.is_none() {
                    return None;
                }
                let l = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        owner_references: owner,
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.spec(epoch, true)),
                };
                match self.api.create(&PostParams::default(), &l).await {
                    Ok(_) => self.won(epoch, now),
                    Err(e) => {
                        info!(lease = %self.name, "lost the race to create the Lease: {e}");
                        None
                    }
                }
            }
            Decision::Acquire { epoch } | Decision::Raise { epoch } => {
                let Some(mut l) = lease else { return holding };
                l.spec = Some(self.spec(epoch, true));
                l.metadata.owner_references = self.owner_refs(l.metadata.owner_references.take());
                match self.api.replace(&self.name, &PostParams::default(), &l).await {
                    Ok(_) => self.won(epoch, now),
                    Err(e) => {
                        info!(lease = %self.name, "guarded Lease write for epoch {epoch} failed: {e}");
                        if holding.is_some() {
                            return self.lose(&format!("the guarded Lease write failed: {e}"));
                        }
                        None
                    }
                }
            }
            Decision::Renew => {
                let Some(mut l) = lease else { return holding };
                let epoch = holding.map_or(0, |h| h.epoch);
                let acquire_time = l.spec.as_ref().and_then(|s| s.acquire_time.clone());
                let mut spec = self.spec(epoch, false);
                spec.acquire_time = acquire_time;
                l.spec = Some(spec);
                // A Lease made before the HAProxyConfig was seen gets its owner on renewal.
                l.metadata.owner_references = self.owner_refs(l.metadata.owner_references.take());
                match self.api.replace(&self.name, &PostParams::default(), &l).await {
                    Ok(_) => Some(Holding { epoch, renewed_at: now }),
                    Err(e) => {
                        warn!(lease = %self.name, "renewal failed: {e}");
                        holding
                    }
                }
            }
        }
    }

    fn spec(&self, epoch: u64, acquire: bool) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.timing.duration.as_secs()).unwrap_or(i32::MAX)),
            lease_transitions: Some(i32::try_from(epoch).unwrap_or(i32::MAX)),
            acquire_time: acquire.then(|| now.clone()),
            renew_time: Some(now),
            ..LeaseSpec::default()
        }
    }

    fn won(&self, epoch: u64, now: Instant) -> Option<Holding> {
        info!(lease = %self.name, identity = %self.identity, epoch, "holding the Lease: leading with fence epoch {epoch}");
        let _ = self.tx.send(Some(Term { epoch }));
        Some(Holding { epoch, renewed_at: now })
    }

    fn lose(&self, why: &str) -> Option<Holding> {
        if self.tx.borrow().is_some() {
            warn!(lease = %self.name, identity = %self.identity, "STANDING DOWN: {why}");
        }
        let _ = self.tx.send(None);
        None
    }

    async fn release(&self) {
        let Ok(Some(mut l)) = self.api.get_opt(&self.name).await else { return };
        let Some(spec) = l.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self.api.replace(&self.name, &PostParams::default(), &l).await {
            Ok(_) => info!(lease = %self.name, "released the Lease"),
            Err(e) => warn!(lease = %self.name, "could not release the Lease: {e}"),
        }
    }
}

/// Turns a read Lease into an observation, keeping `changed_at` while the record is unchanged.
fn observe(l: &Lease, prev: Option<&Observed>, now: Instant) -> Observed {
    let spec = l.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let transitions = u64::try_from(spec.lease_transitions.unwrap_or(0)).unwrap_or(0);
    let renew_stamp = spec.renew_time.map(|t| t.0.to_string());
    let changed_at = match prev {
        Some(p) if p.holder == holder && p.transitions == transitions && p.renew_stamp == renew_stamp => p.changed_at,
        _ => now,
    };
    Observed { holder, transitions, renew_stamp, changed_at }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: LeaseTiming = LeaseTiming {
        duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
    };

    fn obs(holder: Option<&str>, transitions: u64, changed_at: Instant) -> Observed {
        Observed { holder: holder.map(String::from), transitions, renew_stamp: None, changed_at }
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_renew_expire_and_steal() {
        let t0 = Instant::now();
        // Nobody: create with epoch 1.
        assert_eq!(decide("a", None, None, 0, t0, T), Decision::Create { epoch: 1 });
        // a holds epoch 1; b follows until the record is older than the lease duration.
        let a_rec = obs(Some("a"), 1, t0);
        let a_term = Holding { epoch: 1, renewed_at: t0 };
        assert_eq!(decide("a", Some(&a_rec), Some(a_term), 0, t0, T), Decision::Renew);
        assert_eq!(decide("b", Some(&a_rec), None, 0, t0, T), Decision::Follow { holder: "a".into() });
        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(decide("b", Some(&a_rec), None, 0, Instant::now(), T), Decision::Follow { holder: "a".into() });
        // a could not renew for the renew deadline: a stops deploying before b may steal.
        assert!(matches!(decide("a", Some(&a_rec), Some(a_term), 0, Instant::now(), T), Decision::Lost { .. }));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(decide("b", Some(&a_rec), None, 0, Instant::now(), T), Decision::Acquire { epoch: 2 });
        // b took it: a, still thinking it leads, sees another holder and stops.
        let b_rec = obs(Some("b"), 2, Instant::now());
        assert!(matches!(decide("a", Some(&b_rec), Some(a_term), 0, Instant::now(), T), Decision::Lost { .. }));
        // A released Lease (no holder) is taken at once.
        assert_eq!(
            decide("c", Some(&obs(None, 2, Instant::now())), None, 0, Instant::now(), T),
            Decision::Acquire { epoch: 3 }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn raise_above_a_floor_and_deleted_lease() {
        let t0 = Instant::now();
        let rec = obs(Some("a"), 1, t0);
        let term = Holding { epoch: 1, renewed_at: t0 };
        // A pod saw epoch 7 (the Lease was deleted and recreated): lift above it.
        assert_eq!(decide("a", Some(&rec), Some(term), 7, t0, T), Decision::Raise { epoch: 8 });
        // A new term also starts above the floor.
        assert_eq!(decide("b", None, None, 7, t0, T), Decision::Create { epoch: 8 });
        assert_eq!(decide("b", Some(&obs(None, 3, t0)), None, 7, t0, T), Decision::Acquire { epoch: 8 });
        // The Lease vanished under a leader: lost.
        assert!(matches!(decide("a", None, Some(term), 0, t0, T), Decision::Lost { .. }));
        // Our own name on the Lease but no term in this process: a fresh term, never a reuse.
        assert_eq!(decide("a", Some(&rec), None, 0, t0, T), Decision::Acquire { epoch: 2 });
    }

    proptest! {
        /// Every new term's epoch exceeds both the Lease's epoch and the floor, and a replica
        /// that is not the holder never renews.
        #[test]
        fn epochs_only_grow(
            transitions in 0u64..1000, floor in 0u64..1000, age in 0u64..40, renewed in 0u64..40,
            holder in prop::option::of(prop::sample::select(vec!["a", "b", ""])),
            me in prop::sample::select(vec!["a", "b"]), leading in any::<bool>(),
        ) {
            let base = std::time::Instant::now();
            let now = Instant::from_std(base + Duration::from_secs(100));
            let rec = obs(holder, transitions, now - Duration::from_secs(age));
            let holding = leading.then(|| Holding { epoch: transitions, renewed_at: now - Duration::from_secs(renewed) });
            match decide(me, Some(&rec), holding, floor, now, T) {
                Decision::Create { epoch } | Decision::Acquire { epoch } | Decision::Raise { epoch } => {
                    prop_assert!(epoch > transitions && epoch > floor);
                }
                Decision::Renew => {
                    prop_assert_eq!(holder, Some(me));
                    prop_assert!(leading && renewed < 10);
                }
                Decision::Follow { holder: h } => {
                    prop_assert!(!leading);
                    prop_assert!(h != me && age < 15);
                }
                Decision::Lost { .. } => prop_assert!(leading),
            }
        }
    }
}
