//! The scheduler: decides which render is deployed next, and when.
//!
//! Owns the pure [`Core`] state machine — one deployment in flight, a single latest-wins pending
//! slot, deploying only a gated (or, while optimistic, not yet refused) render and only with at
//! least one endpoint, reverting to the last good render on a refusal, retrying the latest after
//! a deployment timeout, and drift repair after an idle interval (sooner, with backoff, while
//! pods are left failed) — and the async [`Driver`]
//! that feeds it (render source, endpoint source, gate checks, deployment completions, the ends
//! of background follow-ups, timers). A deployment is in flight until every pod has ACKed or
//! failed; scheduled reloads are followed up outside it (see [`crate::followup`]), and the next
//! render dispatches as soon as it ends — unless every pod of the deployment that just ended has
//! a paced reload scheduled: the agent's pacer folds whatever plan is latest at the due time
//! into that one reload, so applies before then are wasted. The core then holds the pending slot
//! (renders keep coalescing, latest wins) until a lead before the earliest due reload
//! ([`hold_for`]), so the latest render still reaches every pod before its reload. Only renders
//! that need a reload wait there: a runtime or file_only render goes out at once even while held
//! ([`needs_reload`]: the agents never hold back a runtime or file_only apply either).
//! It must never talk to pods itself (the deployer does) and never let a refused render become
//! the target.

use std::sync::Arc;
use std::time::Duration;

use haptic_protocol::PlanId;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::deployer::{DeployKind, Deployer, DeploymentReport, DeploymentResult, FollowUpEnd};
use crate::gate::{Checker, GateMode, Latch, Verdict};
use crate::metrics::Metrics;
use crate::render::Render;
use crate::seams::{Endpoint, EndpointSource, RenderEvent, RenderSource};
use crate::status::{GateStatus, StatusBoard};

/// What the scheduler reacts to.
#[derive(Debug, Clone)]
pub enum Input {
    /// The render source produced a render, or content that is not one.
    Render(RenderEvent),
    /// The gate judged a render.
    Verdict(Arc<Render>, Verdict),
    /// The endpoint set changed.
    Endpoints(Vec<Endpoint>),
    /// A deployment ended: its report, or `None` when the deployment timeout cancelled it.
    Finished(u64, Option<DeploymentReport>),
    /// The fleet has been idle for the drift interval.
    DriftDue,
    /// A background follow-up of a scheduled reload ended.
    FollowUpEnded(FollowUpEnd),
    /// The hold asked for by [`Action::Hold`] with this token is over.
    HoldOver(u64),
}

/// What the scheduler asks for.
#[derive(Debug, Clone)]
pub enum Action {
    /// Run the gate over a render.
    Check(Arc<Render>),
    /// Start a deployment.
    Deploy {
        /// Its id.
        id: u64,
        /// The render.
        render: Arc<Render>,
        /// The endpoints.
        endpoints: Vec<Endpoint>,
        /// Why.
        kind: DeployKind,
    },
    /// Hold the pending slot for `wait`, then feed [`Input::HoldOver`] with `token`.
    Hold {
        /// Identifies this hold.
        token: u64,
        /// How long.
        wait: Duration,
    },
}

/// The least time before a scheduled reload is due that a held render is dispatched.
pub const MIN_LEAD: Duration = Duration::from_millis(150);

/// How long to hold the pending slot after `report`: only when every pod ended with a paced
/// reload scheduled, until a lead (the larger of [`MIN_LEAD`] and twice the deployment's
/// duration, so the next apply round ends before the reload starts) before the earliest is due.
pub fn hold_for(report: &DeploymentReport) -> Option<Duration> {
    let due = report.reloads_due_in?;
    let lead = MIN_LEAD.max(report.duration * 2);
    due.checked_sub(lead).filter(|d| !d.is_zero())
}

/// The deployment in flight.
#[derive(Debug, Clone)]
struct InFlight {
    id: u64,
    render: Arc<Render>,
    kind: DeployKind,
}

/// The scheduler's pure state.
#[derive(Debug)]
pub struct Core {
    latch: Latch,
    latest: Option<Arc<Render>>,
    last_good: Option<Arc<Render>>,
    target: Option<Arc<Render>>,
    checking: bool,
    check_pending: Option<Arc<Render>>,
    endpoints: Vec<Endpoint>,
    in_flight: Option<InFlight>,
    pending: Option<(Arc<Render>, DeployKind)>,
    next_id: u64,
    stood_down: bool,
    render_error: Option<String>,
    held: Option<u64>,
}

impl Core {
    /// A core with the latch resting in `mode`.
    pub fn new(mode: GateMode) -> Self {
        Core {
            latch: Latch::new(mode),
            latest: None,
            last_good: None,
            target: None,
            checking: false,
            check_pending: None,
            endpoints: Vec::new(),
            in_flight: None,
            pending: None,
            next_id: 1,
            stood_down: false,
            render_error: None,
            held: None,
        }
    }

    /// The latch.
    pub fn latch(&self) -> &Latch {
        &self.latch
    }

    /// The render the fleet should run (the last one dispatched).
    pub fn target(&self) -> Option<PlanId> {
        self.target.as_ref().map(|r| r.plan_id())
    }

    /// The id of the deployment in flight.
    pub fn in_flight(&self) -> Option<u64> {
        self.in_flight.as_ref().map(|f| f.id)
    }

    /// The plan waiting in the pending slot.
    pub fn pending(&self) -> Option<PlanId> {
        self.pending.as_ref().map(|(r, _)| r.plan_id())
    }

    /// Why the source's content is not a render, if it is not.
    pub fn render_error(&self) -> Option<&str> {
        self.render_error.as_deref()
    }

    /// Whether the pending slot is held until the fleet's scheduled reloads come near.
    pub fn held(&self) -> bool {
        self.held.is_some()
    }

    /// Whether the controller stood down.
    pub fn stood_down(&self) -> bool {
        self.stood_down
    }

    /// Feeds one input; returns what to do.
    pub fn on(&mut self, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        match input {
            Input::Render(Err(why)) => self.render_error = Some(why),
            Input::Render(Ok(r)) => {
                self.render_error = None;
                self.latest = Some(r.clone());
                if self.checking {
                    self.check_pending = Some(r.clone());
                } else {
                    self.checking = true;
                    out.push(Action::Check(r.clone()));
                }
                if self.latch.dispatch_before_verdict() {
                    self.enqueue(r, DeployKind::Normal, &mut out);
                }
            }
            Input::Verdict(r, v) => {
                self.checking = false;
                let plan = r.plan_id();
                self.latch.on_verdict(plan, &v);
                let is_latest = self.latest.as_ref().map(|l| l.plan_id()) == Some(plan);
                match v {
                    Verdict::Pass => {
                        self.last_good = Some(r.clone());
                        let dispatched = self.target() == Some(plan)
                            || self.pending() == Some(plan)
                            || self.in_flight.as_ref().is_some_and(|f| f.render.plan_id() == plan);
                        if is_latest && !dispatched {
                            self.enqueue(r, DeployKind::Normal, &mut out);
                        }
                    }
                    Verdict::Refused(_) => {
                        let took_it = self.target() == Some(plan)
                            || self.in_flight.as_ref().is_some_and(|f| f.render.plan_id() == plan);
                        if self.pending() == Some(plan) {
                            self.pending = None;
                        }
                        if took_it {
                            // Revert the pods that took it to the last good render.
                            if let Some(good) = self.last_good.clone() {
                                self.enqueue(good, DeployKind::Normal, &mut out);
                            }
                        }
                    }
                }
                if let Some(next) = self.check_pending.take() {
                    self.checking = true;
                    out.push(Action::Check(next));
                }
            }
            Input::Endpoints(eps) => {
                // New pods may need the render now: no hold.
                self.held = None;
                self.endpoints = eps;
                if self.pending.is_some() {
                    self.try_start(&mut out);
                } else if let Some(t) = self.target.clone() {
                    self.enqueue(t, DeployKind::Normal, &mut out);
                }
            }
            Input::Finished(id, report) => {
                let Some(InFlight { id: fid, render, kind }) = self.in_flight.take() else { return out };
                if fid != id {
                    self.in_flight = Some(InFlight { id: fid, render, kind });
                    return out;
                }
                match report {
                    None => {
                        // Timed out: retry the latest (the pending slot, else the same render).
                        if self.pending.is_none() {
                            self.pending = Some((render, kind));
                        }
                    }
                    Some(rep) if rep.stood_down().is_some() => {
                        self.stood_down = true;
                        self.pending = None;
                    }
                    Some(rep) => {
                        if let Some(wait) = hold_for(&rep) {
                            self.held = Some(id);
                            out.push(Action::Hold { token: id, wait });
                        }
                    }
                }
                self.try_start(&mut out);
            }
            Input::DriftDue => {
                if self.in_flight.is_none() && self.pending.is_none() {
                    if let Some(t) = self.target.clone() {
                        self.enqueue(t, DeployKind::Drift, &mut out);
                    }
                }
            }
            // A converged pod needs nothing; a failed follow-up is retried by the driver's
            // backoff timer (a drift pass), like a deployment that left pods failed.
            Input::FollowUpEnded(_) => {}
            Input::HoldOver(token) => {
                if self.held == Some(token) {
                    self.held = None;
                    self.try_start(&mut out);
                }
            }
        }
        out
    }

    fn enqueue(&mut self, r: Arc<Render>, kind: DeployKind, out: &mut Vec<Action>) {
        if self.stood_down {
            return;
        }
        self.pending = Some((r, kind));
        self.try_start(out);
    }

    fn try_start(&mut self, out: &mut Vec<Action>) {
        if self.in_flight.is_some() || self.endpoints.is_empty() || self.stood_down {
            return;
        }
        if self.held.is_some() && self.pending_needs_reload() {
            return;
        }
        let Some((render, kind)) = self.pending.take() else { return };
        let id = self.next_id;
        self.next_id += 1;
        self.in_flight = Some(InFlight { id, render: render.clone(), kind });
        self.target = Some(render.clone());
        out.push(Action::Deploy { id, render, endpoints: self.endpoints.clone(), kind });
    }
}

impl Core {
    /// Whether the pending render needs a reload on top of the target (the plan the held pods
    /// applied). Only such renders wait for the pods' reload slot: runtime and file_only renders
    /// are never held back (the agents apply them at once), they land in the tree the scheduled
    /// reload will load.
    fn pending_needs_reload(&self) -> bool {
        let Some((pending, _)) = &self.pending else { return false };
        let Some(target) = &self.target else { return true };
        needs_reload(target, pending)
    }
}

/// Whether bringing a fleet from `from` to `to` needs a reload (pure; capability-independent:
/// a pod whose agent cannot run the ops gets a reload anyway, and holding it is then harmless).
pub fn needs_reload(from: &Render, to: &Render) -> bool {
    crate::diff::diff(&crate::diff::Baseline::of_render(from), to).mode == Some(haptic_protocol::Mode::Reload)
}

/// How long a deployment to `pods` pods may run before the safety net cancels it: the
/// deployment timeout once per wave of at most `max_parallel` pods (`--deployment-timeout` is
/// per wave, so it does not fire routinely on a fleet much larger than `--max-parallel`).
pub fn deployment_deadline(per_wave: Duration, pods: usize, max_parallel: usize) -> Duration {
    let waves = pods.div_ceil(max_parallel.max(1)).max(1);
    per_wave.saturating_mul(u32::try_from(waves).unwrap_or(u32::MAX))
}

/// Timers of the driver.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// Safety net for one wave of a deployment (see [`deployment_deadline`]).
    pub deployment_timeout: Duration,
    /// Pods applied to at once (the deployer's `max_parallel`).
    pub max_parallel: usize,
    /// Idle time before a drift repair.
    pub drift_interval: Duration,
}

/// Feeds the core from the seams, the gate and the deployer, and runs its actions.
pub struct Driver {
    core: Core,
    deployer: Arc<Deployer>,
    checker: Checker,
    board: Arc<StatusBoard>,
    metrics: Arc<Metrics>,
    cfg: DriverConfig,
    retry: Option<Duration>,
}

/// The first retry delay after a deployment that left pods failed; it doubles up to the drift
/// interval and resets on success.
const FIRST_RETRY: Duration = Duration::from_secs(1);

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("core", &self.core).field("cfg", &self.cfg).finish()
    }
}

impl Driver {
    /// A driver.
    pub fn new(
        mode: GateMode,
        deployer: Arc<Deployer>,
        checker: Checker,
        board: Arc<StatusBoard>,
        metrics: Arc<Metrics>,
        cfg: DriverConfig,
    ) -> Self {
        Driver { core: Core::new(mode), deployer, checker, board, metrics, cfg, retry: None }
    }

    /// Runs until `shutdown`.
    pub async fn run(
        mut self,
        mut renders: Box<dyn RenderSource>,
        mut endpoints: Box<dyn EndpointSource>,
        shutdown: CancellationToken,
    ) {
        let (in_tx, mut in_rx) = mpsc::unbounded_channel::<Input>();
        // The sources run in their own tasks, so a half-finished wait is never cancelled.
        let tx = in_tx.clone();
        let render_task = tokio::spawn(async move {
            while let Some(ev) = renders.next().await {
                if let Err(why) = &ev {
                    warn!("the render source holds no valid render: {why}");
                }
                if tx.send(Input::Render(ev)).is_err() {
                    break;
                }
            }
        });
        let tx = in_tx.clone();
        let endpoint_task = tokio::spawn(async move {
            while let Some(eps) = endpoints.next().await {
                if tx.send(Input::Endpoints(eps)).is_err() {
                    break;
                }
            }
        });
        let tx = in_tx.clone();
        let mut follow_ups = self.deployer.follow_up_events();
        let follow_up_task = tokio::spawn(async move {
            while let Some(end) = follow_ups.recv().await {
                if tx.send(Input::FollowUpEnded(end)).is_err() {
                    break;
                }
            }
        });

        let mut running: Option<(u64, tokio::task::JoinHandle<()>, Instant)> = None;
        let mut drift_at: Option<Instant> = None;
        let mut hold: Option<(u64, Instant)> = None;
        loop {
            let deploy_deadline = running.as_ref().map(|(_, _, d)| *d);
            let input = tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(i) = in_rx.recv() => i,
                _ = sleep_until_opt(deploy_deadline) => {
                    let Some((id, handle, _)) = running.take() else { continue };
                    handle.abort();
                    error!(id, per_wave = ?self.cfg.deployment_timeout, "deployment timed out; cancelled it and retrying the latest render");
                    self.deployer.forget_pods();
                    Input::Finished(id, None)
                }
                _ = sleep_until_opt(drift_at) => {
                    drift_at = None;
                    Input::DriftDue
                }
                _ = sleep_until_opt(hold.map(|(_, at)| at)) => {
                    let Some((token, _)) = hold.take() else { continue };
                    Input::HoldOver(token)
                }
            };
            let actions = self.observe_and_feed(input, &mut running, &mut drift_at);
            for a in actions {
                match a {
                    Action::Check(r) => {
                        let checker = self.checker.clone();
                        let tx = in_tx.clone();
                        tokio::spawn(async move {
                            let v = checker.verdict(&r).await;
                            let _ = tx.send(Input::Verdict(r, v));
                        });
                    }
                    Action::Deploy { id, render, endpoints, kind } => {
                        let pods = endpoints.len();
                        info!(id, plan = %render.plan_id().short(), pods, ?kind, "deployment started");
                        let deployer = self.deployer.clone();
                        let tx = in_tx.clone();
                        let handle = tokio::spawn(async move {
                            let report = deployer.deploy(render, endpoints, kind).await;
                            let _ = tx.send(Input::Finished(id, Some(report)));
                        });
                        let limit = deployment_deadline(self.cfg.deployment_timeout, pods, self.cfg.max_parallel);
                        running = Some((id, handle, Instant::now() + limit));
                    }
                    Action::Hold { token, wait } => {
                        info!(
                            ?wait,
                            "every pod has a paced reload scheduled; holding newer renders until shortly before it"
                        );
                        hold = Some((token, Instant::now() + wait));
                    }
                }
            }
            self.publish();
        }
        render_task.abort();
        endpoint_task.abort();
        follow_up_task.abort();
        self.deployer.stop_follow_ups();
        if let Some((_, h, _)) = running {
            h.abort();
        }
    }

    fn observe_and_feed(
        &mut self,
        input: Input,
        running: &mut Option<(u64, tokio::task::JoinHandle<()>, Instant)>,
        drift_at: &mut Option<Instant>,
    ) -> Vec<Action> {
        match &input {
            Input::Verdict(r, Verdict::Refused(out)) => {
                self.metrics.gate_rejections.inc();
                let first = out.lines().find(|l| l.contains("ALERT")).unwrap_or(out.as_str());
                warn!(plan = %r.plan_id().short(), "the gate refused the render: {first}");
            }
            Input::Verdict(r, Verdict::Pass) => info!(plan = %r.plan_id().short(), "the gate passed the render"),
            Input::Endpoints(eps) => {
                let list: Vec<(String, String)> = eps.iter().map(|e| (e.name.clone(), e.url.clone())).collect();
                self.board.set_endpoints(&list);
                self.deployer.refresh_gauges();
            }
            Input::Finished(id, report) => {
                if running.as_ref().is_some_and(|(rid, _, _)| rid == id) {
                    *running = None;
                }
                if self.core.in_flight() == Some(*id) {
                    let result = report.as_ref().map_or(DeploymentResult::Timeout, |r| r.result());
                    self.metrics.deployment(result.as_str());
                    info!(id, %result, "deployment finished");
                    self.board.controller(|c| {
                        c.deployments += 1;
                        c.last_deployment = Some(result);
                    });
                    // Idle fleets get a drift pass after the interval; pods left failed get a
                    // (verified) retry sooner, with a doubling backoff.
                    let wait = if result.left_pods_behind() {
                        let next = self.retry.map_or(FIRST_RETRY, |d| d * 2).min(self.cfg.drift_interval);
                        self.retry = Some(next);
                        warn!(retry_in = ?next, "some pods are not on the target; retrying");
                        next
                    } else {
                        // Pods whose paced reload is still followed up have not shown success yet.
                        let reloads_pending = report.as_ref().is_some_and(|r| {
                            r.pods.iter().any(|(_, o)| matches!(o, crate::deployer::PodOutcome::ReloadPending(_)))
                        });
                        if !reloads_pending {
                            self.retry = None;
                        }
                        self.cfg.drift_interval
                    };
                    *drift_at = Some(Instant::now() + wait);
                }
            }
            Input::FollowUpEnded(end) if !end.converged && self.core.target() == Some(end.plan) => {
                // A pod's paced reload did not bring the target into its worker: retry it
                // (verified), with the same doubling backoff as a deployment that left pods failed.
                let next = self.retry.map_or(FIRST_RETRY, |d| d * 2).min(self.cfg.drift_interval);
                self.retry = Some(next);
                warn!(pod = %end.pod, retry_in = ?next, "a scheduled reload did not converge; retrying");
                if self.core.in_flight().is_none() {
                    *drift_at = Some(drift_at.map_or(Instant::now() + next, |at| at.min(Instant::now() + next)));
                }
            }
            Input::FollowUpEnded(end) if end.converged && self.deployer.follow_ups_running() == 0 => {
                // Every scheduled reload ran: the backoff starts afresh.
                self.retry = None;
            }
            Input::DriftDue => {
                if self.core.in_flight().is_some() {
                    *drift_at = Some(Instant::now() + self.cfg.drift_interval);
                } else {
                    info!("re-applying the target from verified state (drift repair or retry)");
                }
            }
            _ => {}
        }
        self.core.on(input)
    }

    fn publish(&self) {
        let latch = self.core.latch();
        self.metrics.gate_pinned.set(i64::from(latch.pinned));
        let render_error = self.core.render_error().map(str::to_string);
        self.board.gate(|g| *g = GateStatus::from_latch(latch, render_error));
        let target = self.core.target();
        self.board.controller(|c| c.target = target);
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => futures::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deployer::PodOutcome;
    use haptic_protocol::Mode;

    fn r(n: u32) -> Arc<Render> {
        let cfg = format!("global\n  maxconn {n}\n");
        Arc::new(Render::from_texts([("haproxy.cfg", cfg.as_str())]).unwrap())
    }

    fn eps() -> Vec<Endpoint> {
        vec![Endpoint { name: "p1".into(), url: "http://p1".into() }]
    }

    fn deploys(a: &[Action]) -> Vec<(u64, PlanId, DeployKind)> {
        a.iter()
            .filter_map(|a| match a {
                Action::Deploy { id, render, kind, .. } => Some((*id, render.plan_id(), *kind)),
                _ => None,
            })
            .collect()
    }

    fn checks(a: &[Action]) -> Vec<PlanId> {
        a.iter()
            .filter_map(|a| match a {
                Action::Check(r) => Some(r.plan_id()),
                _ => None,
            })
            .collect()
    }

    fn ok(plan: PlanId) -> Option<DeploymentReport> {
        Some(DeploymentReport {
            plan,
            pods: vec![("p1".into(), PodOutcome::Unchanged)],
            duration: Duration::ZERO,
            reloads_due_in: None,
        })
    }

    #[test]
    fn waits_for_endpoints_then_deploys_latest_wins() {
        let mut c = Core::new(GateMode::Optimistic);
        let a = c.on(Input::Render(Ok(r(1))));
        assert_eq!(checks(&a), vec![r(1).plan_id()]);
        assert!(deploys(&a).is_empty(), "no endpoints yet");
        let a = c.on(Input::Endpoints(eps()));
        assert_eq!(deploys(&a), vec![(1, r(1).plan_id(), DeployKind::Normal)]);
        // While deployment 1 runs, renders 2..=5 coalesce into the pending slot.
        for n in 2..=5 {
            assert!(deploys(&c.on(Input::Render(Ok(r(n))))).is_empty());
        }
        assert_eq!(c.pending(), Some(r(5).plan_id()));
        let a = c.on(Input::Finished(1, ok(r(1).plan_id())));
        assert_eq!(deploys(&a), vec![(2, r(5).plan_id(), DeployKind::Normal)]);
        assert_eq!(c.target(), Some(r(5).plan_id()));
        // A stale completion id changes nothing.
        assert!(c.on(Input::Finished(1, ok(r(1).plan_id()))).is_empty());
        assert_eq!(c.in_flight(), Some(2));
    }

    #[test]
    fn scheduled_reloads_free_the_slot_and_newer_renders_dispatch_at_once() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(Input::Endpoints(eps()));
        let a = c.on(Input::Render(Ok(r(1))));
        assert_eq!(deploys(&a), vec![(1, r(1).plan_id(), DeployKind::Normal)]);
        // While the apply round of deployment 1 runs, renders coalesce (latest wins).
        for n in 2..=4 {
            assert!(deploys(&c.on(Input::Render(Ok(r(n))))).is_empty());
        }
        // Every pod ACKed with a scheduled reload: the deployment is over, its reloads are
        // followed up in the background, and the pending render goes out at once.
        let pending = Some(DeploymentReport {
            plan: r(1).plan_id(),
            pods: vec![("p1".into(), PodOutcome::ReloadPending(Mode::Reload))],
            duration: Duration::ZERO,
            reloads_due_in: None,
        });
        let a = c.on(Input::Finished(1, pending));
        assert_eq!(deploys(&a), vec![(2, r(4).plan_id(), DeployKind::Normal)]);
        // With nothing pending, the next render dispatches the moment it arrives.
        let rep = Some(DeploymentReport {
            plan: r(4).plan_id(),
            pods: vec![("p1".into(), PodOutcome::ReloadPending(Mode::Reload))],
            duration: Duration::ZERO,
            reloads_due_in: None,
        });
        assert!(deploys(&c.on(Input::Finished(2, rep))).is_empty());
        let a = c.on(Input::Render(Ok(r(5))));
        assert_eq!(deploys(&a), vec![(3, r(5).plan_id(), DeployKind::Normal)]);
        // The end of a superseded plan's follow-up changes nothing in the core.
        let end = FollowUpEnd { pod: "p1".into(), plan: r(4).plan_id(), converged: false };
        assert!(c.on(Input::FollowUpEnded(end)).is_empty());
        assert_eq!((c.in_flight(), c.target()), (Some(3), Some(r(5).plan_id())));
    }

    fn pending_report(plan: PlanId, duration_ms: u64, due_ms: Option<u64>) -> DeploymentReport {
        DeploymentReport {
            plan,
            pods: vec![("p1".into(), PodOutcome::ReloadPending(Mode::Reload))],
            duration: Duration::from_millis(duration_ms),
            reloads_due_in: due_ms.map(Duration::from_millis),
        }
    }

    fn holds(a: &[Action]) -> Vec<(u64, Duration)> {
        a.iter()
            .filter_map(|a| match a {
                Action::Hold { token, wait } => Some((*token, *wait)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn hold_only_while_every_pod_waits_for_a_reload_far_enough_away() {
        let p = r(1).plan_id();
        assert_eq!(hold_for(&pending_report(p, 50, None)), None, "some pod has no scheduled reload");
        assert_eq!(hold_for(&pending_report(p, 50, Some(1500))), Some(Duration::from_millis(1350)), "MIN_LEAD");
        assert_eq!(hold_for(&pending_report(p, 400, Some(1500))), Some(Duration::from_millis(700)), "2 x duration");
        assert_eq!(hold_for(&pending_report(p, 400, Some(800))), None, "due within the lead: dispatch at once");
        assert_eq!(hold_for(&pending_report(p, 50, Some(150))), None);
    }

    #[test]
    fn renders_coalesce_while_held_and_the_latest_goes_out_before_the_reload() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(Input::Endpoints(eps()));
        c.on(Input::Render(Ok(r(1))));
        let a = c.on(Input::Finished(1, Some(pending_report(r(1).plan_id(), 50, Some(1500)))));
        assert_eq!(holds(&a), vec![(1, Duration::from_millis(1350))]);
        assert!(c.held());
        for n in 2..=6 {
            assert!(deploys(&c.on(Input::Render(Ok(r(n))))).is_empty(), "held: render {n} coalesces");
        }
        assert_eq!(c.pending(), Some(r(6).plan_id()));
        assert!(c.on(Input::HoldOver(7)).is_empty(), "a stale hold token changes nothing");
        let a = c.on(Input::HoldOver(1));
        assert_eq!(deploys(&a), vec![(2, r(6).plan_id(), DeployKind::Normal)]);
        // Due within the lead: no hold, the next render goes out at once.
        let a = c.on(Input::Finished(2, Some(pending_report(r(6).plan_id(), 50, Some(120)))));
        assert!(holds(&a).is_empty() && !c.held());
        assert_eq!(deploys(&c.on(Input::Render(Ok(r(7))))), vec![(3, r(7).plan_id(), DeployKind::Normal)]);
        // New endpoints end a hold: new pods need the render now.
        c.on(Input::Finished(3, Some(pending_report(r(7).plan_id(), 50, Some(1900)))));
        c.on(Input::Render(Ok(r(8))));
        assert!(c.held());
        let mut two = eps();
        two.push(Endpoint { name: "p2".into(), url: "http://p2".into() });
        let a = c.on(Input::Endpoints(two));
        assert_eq!(deploys(&a), vec![(4, r(8).plan_id(), DeployKind::Normal)]);
        assert!(c.on(Input::HoldOver(3)).is_empty(), "the ended hold's timer changes nothing");
    }

    /// A render with a frontend timeout (a reload to change) and one server slot (runtime).
    fn slot(timeout: u32, port: u16) -> Arc<Render> {
        let cfg = format!(
            "global\n  default-path config\ndefaults\n  mode http\n  timeout client {timeout}s\n\
             backend be\n  server s1 127.0.0.1:{port} weight 10\n"
        );
        Arc::new(Render::from_texts([("haproxy.cfg", cfg.as_str())]).unwrap())
    }

    #[test]
    fn runtime_renders_are_never_held_behind_the_pods_reload_slot() {
        assert!(needs_reload(&slot(5, 1), &slot(6, 1)));
        assert!(!needs_reload(&slot(5, 1), &slot(5, 2)));
        let mut c = Core::new(GateMode::Optimistic);
        c.on(Input::Endpoints(eps()));
        c.on(Input::Render(Ok(slot(5, 1))));
        // A frontend change: every pod schedules its paced reload 5 s out; the slot is held.
        c.on(Input::Finished(1, ok(slot(5, 1).plan_id())));
        assert_eq!(deploys(&c.on(Input::Render(Ok(slot(6, 1))))), vec![(2, slot(6, 1).plan_id(), DeployKind::Normal)]);
        let a = c.on(Input::Finished(2, Some(pending_report(slot(6, 1).plan_id(), 50, Some(5000)))));
        assert_eq!(holds(&a), vec![(2, Duration::from_millis(4850))]);
        // An endpoint change on top of the scheduled plan goes out at once, held or not.
        let a = c.on(Input::Render(Ok(slot(6, 2))));
        assert_eq!(deploys(&a), vec![(3, slot(6, 2).plan_id(), DeployKind::Normal)], "runtime render held back");
        let a = c.on(Input::Finished(3, Some(pending_report(slot(6, 2).plan_id(), 50, Some(4800)))));
        assert_eq!(holds(&a), vec![(3, Duration::from_millis(4650))]);
        // A render that needs a reload waits for the slot; an endpoint change after it, on top of
        // it, still needs that reload (latest wins), so it waits too.
        assert!(deploys(&c.on(Input::Render(Ok(slot(7, 2))))).is_empty(), "a reload render waits");
        assert!(deploys(&c.on(Input::Render(Ok(slot(7, 3))))).is_empty());
        assert_eq!(c.pending(), Some(slot(7, 3).plan_id()));
        // The latest is runtime-only against the target again (its reload change was undone): out at once.
        let a = c.on(Input::Render(Ok(slot(6, 4))));
        assert_eq!(deploys(&a), vec![(4, slot(6, 4).plan_id(), DeployKind::Normal)]);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Render(u32, u16),
        FinishScheduled,
        FinishConverged,
        HoldOver,
    }

    fn any_step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (5u32..8, 1u16..4).prop_map(|(t, p)| Step::Render(t, p)),
            Just(Step::FinishScheduled),
            Just(Step::FinishConverged),
            Just(Step::HoldOver),
        ]
    }

    proptest::proptest! {
        /// Whatever renders arrive and however deployments end, a render waits in the pending
        /// slot only behind a deployment in flight, or held while it needs a reload on top of the
        /// target: a runtime render is never held.
        #[test]
        fn only_renders_needing_a_reload_wait_for_the_slot(steps in proptest::collection::vec(any_step(), 1..40)) {
            let mut c = Core::new(GateMode::Optimistic);
            c.on(Input::Endpoints(eps()));
            let mut renders = std::collections::HashMap::new();
            let mut hold_token = None;
            for step in steps {
                let actions = match step {
                    Step::Render(t, p) => {
                        let r = slot(t, p);
                        renders.insert(r.plan_id(), r.clone());
                        c.on(Input::Render(Ok(r)))
                    }
                    Step::FinishScheduled | Step::FinishConverged => match c.in_flight() {
                        Some(id) => {
                            let plan = c.target().unwrap();
                            let due = matches!(step, Step::FinishScheduled).then_some(5000);
                            c.on(Input::Finished(id, Some(pending_report(plan, 50, due))))
                        }
                        None => vec![],
                    },
                    Step::HoldOver => match hold_token {
                        Some(t) => c.on(Input::HoldOver(t)),
                        None => vec![],
                    },
                };
                if let Some((t, _)) = holds(&actions).last() {
                    hold_token = Some(*t);
                }
                if let (None, Some(pending)) = (c.in_flight(), c.pending()) {
                    let target = &renders[&c.target().unwrap()];
                    proptest::prop_assert!(c.held(), "a render waits with nothing in flight and no hold");
                    proptest::prop_assert!(needs_reload(target, &renders[&pending]), "a runtime render was held");
                }
            }
        }
    }

    #[test]
    fn the_deployment_timeout_scales_with_the_waves() {
        let t = Duration::from_secs(30);
        assert_eq!(deployment_deadline(t, 1, 16), t);
        assert_eq!(deployment_deadline(t, 16, 16), t);
        assert_eq!(deployment_deadline(t, 17, 16), t * 2);
        assert_eq!(deployment_deadline(t, 100, 16), t * 7);
        assert_eq!(deployment_deadline(t, 3, 1), t * 3);
        assert_eq!(deployment_deadline(t, 0, 16), t, "never zero");
        assert_eq!(deployment_deadline(t, 5, 0), t * 5, "max_parallel 0 counts as 1");
    }

    #[test]
    fn gate_checks_one_at_a_time_latest_wins() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(Input::Render(Ok(r(1))));
        assert!(checks(&c.on(Input::Render(Ok(r(2))))).is_empty());
        c.on(Input::Render(Ok(r(3))));
        let a = c.on(Input::Verdict(r(1), Verdict::Pass));
        assert_eq!(checks(&a), vec![r(3).plan_id()]);
    }

    #[test]
    fn pessimistic_holds_until_pass() {
        let mut c = Core::new(GateMode::Pessimistic);
        c.on(Input::Endpoints(eps()));
        assert!(deploys(&c.on(Input::Render(Ok(r(1))))).is_empty());
        let a = c.on(Input::Verdict(r(1), Verdict::Pass));
        assert_eq!(deploys(&a), vec![(1, r(1).plan_id(), DeployKind::Normal)]);
        // A refused render never deploys; the target stays the last good.
        c.on(Input::Finished(1, ok(r(1).plan_id())));
        c.on(Input::Render(Ok(r(2))));
        let a = c.on(Input::Verdict(r(2), Verdict::Refused("bad".into())));
        assert!(deploys(&a).is_empty());
        assert_eq!(c.target(), Some(r(1).plan_id()));
    }

    #[test]
    fn optimistic_refusal_reverts_and_pins_until_a_pass() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(Input::Endpoints(eps()));
        c.on(Input::Render(Ok(r(1))));
        c.on(Input::Verdict(r(1), Verdict::Pass));
        c.on(Input::Finished(1, ok(r(1).plan_id())));
        // Bad render 2 dispatches at once (optimistic), then the gate refuses it.
        let a = c.on(Input::Render(Ok(r(2))));
        assert_eq!(deploys(&a), vec![(2, r(2).plan_id(), DeployKind::Normal)]);
        let a = c.on(Input::Verdict(r(2), Verdict::Refused("bad".into())));
        assert!(deploys(&a).is_empty(), "deployment 2 still in flight");
        assert!(c.latch().pinned);
        assert_eq!(c.pending(), Some(r(1).plan_id()), "revert queued");
        let a = c.on(Input::Finished(2, ok(r(2).plan_id())));
        assert_eq!(deploys(&a), vec![(3, r(1).plan_id(), DeployKind::Normal)]);
        c.on(Input::Finished(3, ok(r(1).plan_id())));
        // Pinned: the next render waits for its verdict, then deploys.
        assert!(deploys(&c.on(Input::Render(Ok(r(3))))).is_empty());
        let a = c.on(Input::Verdict(r(3), Verdict::Pass));
        assert_eq!(deploys(&a), vec![(4, r(3).plan_id(), DeployKind::Normal)]);
        assert!(!c.latch().pinned);
    }

    #[test]
    fn refused_while_pending_is_dropped() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(Input::Endpoints(eps()));
        c.on(Input::Render(Ok(r(1))));
        c.on(Input::Render(Ok(r(2))));
        assert_eq!(c.pending(), Some(r(2).plan_id()));
        c.on(Input::Verdict(r(1), Verdict::Pass));
        c.on(Input::Verdict(r(2), Verdict::Refused("bad".into())));
        assert_eq!(c.pending(), None);
        let a = c.on(Input::Finished(1, ok(r(1).plan_id())));
        assert!(deploys(&a).is_empty());
        assert_eq!(c.target(), Some(r(1).plan_id()));
    }

    #[test]
    fn timeout_retries_the_latest_and_drift_redeploys_when_idle() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(Input::Endpoints(eps()));
        c.on(Input::Render(Ok(r(1))));
        let a = c.on(Input::Finished(1, None));
        assert_eq!(deploys(&a), vec![(2, r(1).plan_id(), DeployKind::Normal)]);
        c.on(Input::Render(Ok(r(2))));
        let a = c.on(Input::Finished(2, None));
        assert_eq!(deploys(&a), vec![(3, r(2).plan_id(), DeployKind::Normal)], "the latest, not the timed-out one");
        assert!(deploys(&c.on(Input::DriftDue)).is_empty(), "busy");
        c.on(Input::Finished(3, ok(r(2).plan_id())));
        let a = c.on(Input::DriftDue);
        assert_eq!(deploys(&a), vec![(4, r(2).plan_id(), DeployKind::Drift)]);
    }

    #[test]
    fn stands_down_for_good() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(Input::Endpoints(eps()));
        c.on(Input::Render(Ok(r(1))));
        let rep = DeploymentReport {
            plan: r(1).plan_id(),
            pods: vec![("p1".into(), PodOutcome::StoodDown("other holder".into()))],
            duration: Duration::ZERO,
            reloads_due_in: None,
        };
        c.on(Input::Finished(1, Some(rep)));
        assert!(c.stood_down());
        assert!(deploys(&c.on(Input::Render(Ok(r(2))))).is_empty());
        assert!(deploys(&c.on(Input::DriftDue)).is_empty());
    }

    #[test]
    fn render_errors_keep_the_last_render() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(Input::Endpoints(eps()));
        c.on(Input::Render(Ok(r(1))));
        c.on(Input::Render(Err("no haproxy.cfg".into())));
        assert_eq!(c.render_error(), Some("no haproxy.cfg"));
        assert_eq!(c.target(), Some(r(1).plan_id()));
    }
}
