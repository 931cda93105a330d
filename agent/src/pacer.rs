//! Reload pacing: the pure decision of *when* a reload may start (`--min-reload-interval`).
//!
//! This module owns the rules: at most one reload start per `min_interval` (measured start to
//! start); a request inside the interval is scheduled for the end of the interval; later requests
//! replace the scheduled plan (coalescing, so a burst costs one reload of the latest plan); reloads
//! never overlap (a request while one runs is scheduled behind it).
//!
//! It must stay pure: no I/O, no clock reads, no tokio. Every method takes `now` from the caller,
//! which makes it deterministic and property-testable. It never runs a reload itself.
//!
//! Protocol: [`Pacer::request`] answering [`PaceDecision::ReloadNow`] and [`Pacer::take_due`]
//! answering `Some` both *count as the reload's start* (so nothing can slip in between the decision
//! and the reload); the caller then reloads and calls [`Pacer::finished`]. [`Pacer::started`] records
//! a reload the caller starts on its own (e.g. a rollback); calling it again after `ReloadNow` is
//! harmless.

use std::time::{Duration, Instant};

use haptic_protocol::PlanId;

/// What to do with a request for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaceDecision {
    /// Reload now; the pacer already counts this reload as started at the request's `now`.
    ReloadNow,
    /// The reload is scheduled; it becomes due in `due_in`.
    Scheduled {
        /// Time until the scheduled reload is due (zero when only a running reload holds it back).
        due_in: Duration,
        /// The previously scheduled plan this request replaced (coalesced), if any.
        replaced: Option<PlanId>,
    },
}

/// The pacing state machine.
#[derive(Debug, Clone)]
pub struct Pacer {
    min_interval: Duration,
    last_start: Option<Instant>,
    running: bool,
    pending: Option<(PlanId, Instant)>,
}

impl Pacer {
    /// A pacer allowing one reload start per `min_interval`.
    pub fn new(min_interval: Duration) -> Self {
        Self { min_interval, last_start: None, running: false, pending: None }
    }

    /// The configured minimum interval between reload starts.
    pub fn min_interval(&self) -> Duration {
        self.min_interval
    }

    /// Whether a reload is running (started and not yet finished).
    pub fn running(&self) -> bool {
        self.running
    }

    /// The earliest instant the next reload may start, by the interval alone.
    fn earliest(&self, now: Instant) -> Instant {
        match self.last_start {
            Some(t) => (t + self.min_interval).max(now),
            None => now,
        }
    }

    /// An apply needs a reload of `plan`: reload now, or schedule it (replacing any scheduled plan).
    pub fn request(&mut self, now: Instant, plan: PlanId) -> PaceDecision {
        if let Some((old, due_at)) = self.pending {
            self.pending = Some((plan, due_at));
            return PaceDecision::Scheduled { due_in: due_at.saturating_duration_since(now), replaced: Some(old) };
        }
        let earliest = self.earliest(now);
        if !self.running && earliest <= now {
            self.mark_started(now);
            return PaceDecision::ReloadNow;
        }
        self.pending = Some((plan, earliest));
        PaceDecision::Scheduled { due_in: earliest.saturating_duration_since(now), replaced: None }
    }

    /// Schedules a reload of `plan` no earlier than `not_before` nor than the interval allows,
    /// never "now" for the caller: the background loop runs it. Returns the time until it is due.
    pub fn schedule(&mut self, now: Instant, not_before: Instant, plan: PlanId) -> Duration {
        let due_at = self.pending.map(|(_, d)| d).unwrap_or_else(|| self.earliest(now)).max(not_before);
        self.pending = Some((plan, due_at));
        due_at.saturating_duration_since(now)
    }

    /// The scheduled reload, if any, and the time until it is due (zero once due, even while a
    /// running reload still holds it back).
    pub fn due(&self, now: Instant) -> Option<(PlanId, Duration)> {
        self.pending.map(|(plan, due_at)| (plan, due_at.saturating_duration_since(now)))
    }

    /// The scheduled plan whose time has come, consumed and counted as started at `now`; `None`
    /// when nothing is scheduled, it is not yet due, or a reload is still running.
    pub fn take_due(&mut self, now: Instant) -> Option<PlanId> {
        match self.pending {
            Some((plan, due_at)) if !self.running && now >= due_at && self.earliest(now) <= now => {
                self.pending = None;
                self.mark_started(now);
                Some(plan)
            }
            _ => None,
        }
    }

    /// Records that a reload started at `now` (one the caller began on its own, e.g. a rollback).
    pub fn started(&mut self, now: Instant) {
        self.mark_started(now);
    }

    fn mark_started(&mut self, now: Instant) {
        self.running = true;
        self.last_start = Some(self.last_start.map_or(now, |t| t.max(now)));
    }

    /// Records that the running reload finished (`ok` = verified). A scheduled plan stays scheduled.
    pub fn finished(&mut self, _now: Instant, _ok: bool) {
        self.running = false;
    }

    /// The scheduled plan, if any.
    pub fn pending(&self) -> Option<PlanId> {
        self.pending.map(|(plan, _)| plan)
    }

    /// Drops the scheduled plan (e.g. a reload the caller ran anyway already loaded the latest tree).
    pub fn cancel_pending(&mut self) -> Option<PlanId> {
        self.pending.take().map(|(plan, _)| plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_protocol::Digest;
    use proptest::prelude::*;

    fn plan(n: u32) -> PlanId {
        PlanId(Digest::of(&n.to_le_bytes()))
    }

    const MIN: Duration = Duration::from_secs(2);

    #[test]
    fn first_request_reloads_now_then_schedules_until_interval_end() {
        let t0 = Instant::now();
        let mut p = Pacer::new(MIN);
        assert_eq!(p.request(t0, plan(1)), PaceDecision::ReloadNow);
        assert!(p.running());
        p.finished(t0 + Duration::from_millis(100), true);
        let d = p.request(t0 + Duration::from_millis(500), plan(2));
        assert_eq!(d, PaceDecision::Scheduled { due_in: Duration::from_millis(1500), replaced: None });
        assert_eq!(p.pending(), Some(plan(2)));
        assert_eq!(p.due(t0 + Duration::from_millis(600)), Some((plan(2), Duration::from_millis(1400))));
        assert_eq!(p.take_due(t0 + Duration::from_millis(1999)), None);
        assert_eq!(p.take_due(t0 + MIN), Some(plan(2)));
        assert_eq!(p.pending(), None);
        assert!(p.running());
    }

    #[test]
    fn later_requests_replace_the_scheduled_plan() {
        let t0 = Instant::now();
        let mut p = Pacer::new(MIN);
        assert_eq!(p.request(t0, plan(1)), PaceDecision::ReloadNow);
        p.finished(t0, true);
        assert!(matches!(p.request(t0 + Duration::from_millis(10), plan(2)), PaceDecision::Scheduled { .. }));
        let d = p.request(t0 + Duration::from_millis(20), plan(3));
        assert_eq!(d, PaceDecision::Scheduled { due_in: Duration::from_millis(1980), replaced: Some(plan(2)) });
        assert_eq!(p.take_due(t0 + MIN), Some(plan(3)));
    }

    #[test]
    fn requests_while_running_wait_for_it() {
        let t0 = Instant::now();
        let mut p = Pacer::new(Duration::from_millis(100));
        assert_eq!(p.request(t0, plan(1)), PaceDecision::ReloadNow);
        // The interval has passed but the reload still runs: scheduled, due at once.
        let d = p.request(t0 + Duration::from_millis(300), plan(2));
        assert_eq!(d, PaceDecision::Scheduled { due_in: Duration::ZERO, replaced: None });
        assert_eq!(p.take_due(t0 + Duration::from_millis(400)), None, "never overlaps");
        p.finished(t0 + Duration::from_millis(500), false);
        assert_eq!(p.take_due(t0 + Duration::from_millis(500)), Some(plan(2)));
    }

    #[test]
    fn started_counts_toward_the_interval() {
        let t0 = Instant::now();
        let mut p = Pacer::new(MIN);
        p.started(t0);
        p.finished(t0, true);
        assert!(matches!(p.request(t0 + Duration::from_secs(1), plan(1)), PaceDecision::Scheduled { .. }));
        assert_eq!(p.cancel_pending(), Some(plan(1)));
        assert_eq!(p.request(t0 + MIN, plan(2)), PaceDecision::ReloadNow);
        // Calling started() after ReloadNow (as a caller may) changes nothing harmful.
        p.started(t0 + MIN);
        p.finished(t0 + MIN, true);
        assert!(!p.running());
    }

    #[derive(Debug, Clone)]
    enum Ev {
        /// Advance the clock, then request a reload of a fresh plan.
        Request(u64),
        /// Advance the clock only (lets scheduled reloads come due and running ones finish).
        Wait(u64),
    }

    fn ev() -> impl Strategy<Value = Ev> {
        prop_oneof![(0u64..3000).prop_map(Ev::Request), (0u64..3000).prop_map(Ev::Wait)]
    }

    proptest! {
        /// For any request times and reload durations: starts are ≥ min_interval apart, reloads
        /// never overlap, and the last requested plan is eventually reloaded, after its request.
        #[test]
        fn paced_coalesced_and_never_lost(
            events in prop::collection::vec(ev(), 1..60),
            min_ms in 1u64..2500,
            reload_ms in 0u64..1500,
        ) {
            let min = Duration::from_millis(min_ms);
            let reload = Duration::from_millis(reload_ms);
            let t0 = Instant::now();
            let mut now = t0;
            let mut p = Pacer::new(min);
            // (start, end, plan) of every reload.
            let mut reloads: Vec<(Instant, Instant, PlanId)> = Vec::new();
            let mut running_until: Option<Instant> = None;
            let mut last_req: Option<(Instant, PlanId)> = None;
            let mut next_plan = 0u32;

            // The driver: finish the running reload when its time comes, start due ones.
            let drive = |p: &mut Pacer, now: Instant, running_until: &mut Option<Instant>,
                         reloads: &mut Vec<(Instant, Instant, PlanId)>| {
                if let Some(end) = *running_until {
                    if now >= end {
                        p.finished(end, true);
                        *running_until = None;
                    }
                }
                if running_until.is_none() {
                    if let Some(plan) = p.take_due(now) {
                        *running_until = Some(now + reload);
                        reloads.push((now, now + reload, plan));
                    }
                }
            };

            for e in events {
                let (dt, req) = match e { Ev::Request(d) => (d, true), Ev::Wait(d) => (d, false) };
                // Step time in small increments so the driver reacts like a timer would.
                let target = now + Duration::from_millis(dt);
                while now < target {
                    now = (now + Duration::from_millis(50)).min(target);
                    drive(&mut p, now, &mut running_until, &mut reloads);
                }
                if req {
                    next_plan += 1;
                    let pl = plan(next_plan);
                    last_req = Some((now, pl));
                    match p.request(now, pl) {
                        PaceDecision::ReloadNow => {
                            prop_assert!(running_until.is_none(), "ReloadNow while a reload runs");
                            running_until = Some(now + reload);
                            reloads.push((now, now + reload, pl));
                        }
                        PaceDecision::Scheduled { .. } => prop_assert_eq!(p.pending(), Some(pl)),
                    }
                }
            }
            // Let everything settle.
            let settle = now + min * 3 + reload * 3 + Duration::from_millis(100);
            while now < settle {
                now += Duration::from_millis(50);
                drive(&mut p, now, &mut running_until, &mut reloads);
            }
            prop_assert_eq!(p.pending(), None);
            for w in reloads.windows(2) {
                prop_assert!(w[1].0 >= w[0].0 + min, "starts too close: {:?}", w[1].0 - w[0].0);
                prop_assert!(w[1].0 >= w[0].1, "overlapping reloads");
            }
            if let Some((at, pl)) = last_req {
                let last = reloads.last().expect("a request was made, so a reload ran");
                prop_assert_eq!(last.2, pl, "the last reload is of the last requested plan");
                prop_assert!(last.0 >= at);
            }
        }
    }
}
