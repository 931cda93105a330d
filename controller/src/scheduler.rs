//! The scheduler: decides which render is deployed next, and when.
//!
//! Owns the pure [`Core`] state machine — one deployment in flight, a single latest-wins pending
//! slot, deploying only a gated (or, while optimistic, not yet refused) render and only with at
//! least one endpoint, reverting to the last good render on a refusal, retrying the latest after
//! a deployment timeout, and drift repair after an idle interval (sooner, with backoff, while
//! pods are left failed), with every timer those need (the deployment deadline, the drift and
//! retry timer, the hold) asked for as [`Action::Arm`] at explicit instants — and the async
//! [`Driver`], a small executor that feeds it (render source, endpoint source, gate checks,
//! deployment completions, the ends of background follow-ups, fired timers, new [`Tuning`]) and
//! carries out its actions. A deployment is in flight until every pod has ACKed or
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
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::bundle::Bundle;
use crate::deployer::{DeployKind, Deployer, DeployerConfig, DeploymentReport, FollowUpEnd, PodOutcome};
use crate::gate::{Checker, GateMode, Latch, Verdict};
use crate::metrics::Metrics;
use crate::seams::{BundleEvent, BundleSource, Endpoint, EndpointSource};
use crate::status::{DeploymentResult, GateStatus, StatusBoard};

/// The settings a running deployment loop takes on without a restart (Kubernetes mode: the
/// resource's `spec.controller`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Safety net for one deployment (per wave of `max_parallel` pods).
    pub deployment_timeout: Duration,
    /// Idle time before drift repair.
    pub drift_interval: Duration,
    /// Bound of one pod's apply flow.
    pub sync_timeout: Duration,
    /// Pods applied to at once.
    pub max_parallel: usize,
    /// The gate latch's resting mode.
    pub gate: GateMode,
}

/// A timer the core asks for. At most one of each kind is armed: arming one replaces the armed
/// one of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    /// The deployment with this id passes its deadline.
    Deadline(u64),
    /// A drift pass (or the retry of pods left off the target) is due.
    Drift,
    /// The hold with this token is over.
    Hold(u64),
}

/// What the scheduler reacts to.
#[derive(Debug, Clone)]
pub enum Input {
    /// The render source produced a render, or content that is not one.
    Bundle(BundleEvent),
    /// The gate judged a render.
    Verdict(Arc<Bundle>, Verdict),
    /// The endpoint set changed.
    Endpoints(Vec<Endpoint>),
    /// A deployment's task ended with its report.
    Finished(u64, DeploymentReport),
    /// A background follow-up of a scheduled reload ended.
    FollowUpEnded {
        /// How it ended.
        end: FollowUpEnd,
        /// How many follow-ups were still running when it ended.
        still_running: usize,
    },
    /// A timer armed by [`Action::Arm`] fired.
    Fired(Timer),
    /// New settings (gate mode and timers; they apply from the next decision on).
    Tuning(Timing),
}

/// What the scheduler asks for.
#[derive(Debug, Clone)]
pub enum Action {
    /// Run the gate over a render.
    Check(Arc<Bundle>),
    /// Start a deployment.
    Deploy {
        /// Its id.
        id: u64,
        /// The render.
        render: Arc<Bundle>,
        /// The endpoints.
        endpoints: Vec<Endpoint>,
        /// Why.
        kind: DeployKind,
    },
    /// Cancel the deployment in flight (its deadline passed); it counts as ended.
    Cancel {
        /// Its id.
        id: u64,
    },
    /// The deployment in flight ended (recorded in metrics and status).
    Ended {
        /// Its id.
        id: u64,
        /// How.
        result: DeploymentResult,
    },
    /// Feed [`Input::Fired`] with `timer` at `at` (replacing an armed timer of its kind).
    Arm {
        /// Which.
        timer: Timer,
        /// When.
        at: Instant,
        /// Why, for the log.
        why: Wake,
    },
    /// Forget the armed timer of this kind.
    Disarm(Timer),
}

/// Why a timer is armed (for the log only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The deployment safety net.
    Deadline,
    /// The next drift pass of an idle fleet.
    Drift,
    /// Pods were left off the target: a verified retry, with backoff.
    Retry,
    /// Every pod has a paced reload scheduled: newer renders wait until shortly before it.
    Hold,
}

/// The least time before a scheduled reload is due that a held render is dispatched.
pub const MIN_LEAD: Duration = Duration::from_millis(150);

/// The first retry delay after a deployment that left pods failed; it doubles up to the drift
/// interval and resets on success.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);

/// How long to hold the pending slot after `report`: only when every pod ended with a paced
/// reload scheduled, until a lead (the larger of [`MIN_LEAD`] and twice the deployment's
/// duration, so the next apply round ends before the reload starts) before the earliest is due.
pub fn hold_for(report: &DeploymentReport) -> Option<Duration> {
    let due = report.reloads_due_in?;
    let lead = MIN_LEAD.max(report.duration * 2);
    due.checked_sub(lead).filter(|d| !d.is_zero())
}

/// The core's timing and gate settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The gate latch's resting mode.
    pub gate: GateMode,
    /// Safety net for one wave of a deployment (see [`deployment_deadline`]).
    pub deployment_timeout: Duration,
    /// Pods applied to at once (the deployer's `max_parallel`).
    pub max_parallel: usize,
    /// Idle time before a drift repair.
    pub drift_interval: Duration,
}

impl Timing {
    /// The defaults of `run` (`--deployment-timeout 30s`, `--max-parallel 16`,
    /// `--drift-interval 60s`) with the latch resting in `gate`.
    pub fn new(gate: GateMode) -> Self {
        Timing {
            gate,
            deployment_timeout: Duration::from_secs(30),
            max_parallel: 16,
            drift_interval: Duration::from_secs(60),
        }
    }
}

impl From<Tuning> for Timing {
    fn from(t: Tuning) -> Self {
        Timing {
            gate: t.gate,
            deployment_timeout: t.deployment_timeout,
            max_parallel: t.max_parallel,
            drift_interval: t.drift_interval,
        }
    }
}

/// The deployment in flight.
#[derive(Debug, Clone)]
struct InFlight {
    id: u64,
    render: Arc<Bundle>,
    kind: DeployKind,
}

/// The scheduler's pure state.
#[derive(Debug)]
pub struct Core {
    timing: Timing,
    now: Instant,
    latch: Latch,
    latest: Option<Arc<Bundle>>,
    last_good: Option<Arc<Bundle>>,
    target: Option<Arc<Bundle>>,
    checking: bool,
    check_pending: Option<Arc<Bundle>>,
    endpoints: Vec<Endpoint>,
    in_flight: Option<InFlight>,
    pending: Option<(Arc<Bundle>, DeployKind)>,
    next_id: u64,
    stood_down: bool,
    render_error: Option<String>,
    held: Option<u64>,
    retry: Option<Duration>,
    drift_at: Option<Instant>,
}

impl Core {
    /// A core with the latch resting in `mode` and the default timing.
    pub fn new(mode: GateMode) -> Self {
        Self::with_timing(Timing::new(mode))
    }

    /// A core with these settings.
    pub fn with_timing(timing: Timing) -> Self {
        Core {
            timing,
            now: Instant::now(),
            latch: Latch::new(timing.gate),
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
            retry: None,
            drift_at: None,
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

    /// The current retry delay (pods left off the target), if one is running.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Feeds one input at `now`; returns what to do.
    pub fn on(&mut self, now: Instant, input: Input) -> Vec<Action> {
        self.now = now;
        let mut out = Vec::new();
        match input {
            Input::Bundle(Err(why)) => self.render_error = Some(why),
            Input::Bundle(Ok(r)) => self.on_render(r, &mut out),
            Input::Verdict(r, v) => self.on_verdict(r, v, &mut out),
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
                if self.in_flight() == Some(id) {
                    out.push(Action::Disarm(Timer::Deadline(id)));
                    self.finish(id, Some(report), &mut out);
                }
            }
            Input::Fired(Timer::Deadline(id)) => {
                if self.in_flight() == Some(id) {
                    out.push(Action::Cancel { id });
                    self.finish(id, None, &mut out);
                }
            }
            Input::Fired(Timer::Drift) => {
                self.drift_at = None;
                if self.in_flight.is_some() {
                    // Busy: the deployment in flight ends with a new timer; until then, a
                    // drift pass stays an interval away.
                    self.arm_drift(self.timing.drift_interval, Wake::Drift, &mut out);
                } else if self.pending.is_none() {
                    if let Some(t) = self.target.clone() {
                        self.enqueue(t, DeployKind::Drift, &mut out);
                    }
                }
            }
            Input::Fired(Timer::Hold(token)) => {
                if self.held == Some(token) {
                    self.held = None;
                    self.try_start(&mut out);
                }
            }
            Input::FollowUpEnded { end, still_running } => self.on_follow_up_end(&end, still_running, &mut out),
            Input::Tuning(t) => {
                self.timing = t;
                self.latch.mode = t.gate;
            }
        }
        out
    }

    /// A new render: checked by the gate (one check at a time, the latest waiting), and
    /// dispatched at once while the latch lets renders go before their verdict.
    fn on_render(&mut self, r: Arc<Bundle>, out: &mut Vec<Action>) {
        self.render_error = None;
        self.latest = Some(r.clone());
        if self.checking {
            self.check_pending = Some(r.clone());
        } else {
            self.checking = true;
            out.push(Action::Check(r.clone()));
        }
        if self.latch.dispatch_before_verdict() {
            self.enqueue(r, DeployKind::Normal, out);
        }
    }

    /// The gate's verdict on a render: a pass dispatches it if it is still the latest; a
    /// refusal reverts the pods that took it to the last good render.
    fn on_verdict(&mut self, r: Arc<Bundle>, v: Verdict, out: &mut Vec<Action>) {
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
                    self.enqueue(r, DeployKind::Normal, out);
                }
            }
            Verdict::Refused(_) => {
                let took_it =
                    self.target() == Some(plan) || self.in_flight.as_ref().is_some_and(|f| f.render.plan_id() == plan);
                if self.pending() == Some(plan) {
                    self.pending = None;
                }
                if took_it {
                    // Revert the pods that took it to the last good render.
                    if let Some(good) = self.last_good.clone() {
                        self.enqueue(good, DeployKind::Normal, out);
                    }
                }
            }
        }
        if let Some(next) = self.check_pending.take() {
            self.checking = true;
            out.push(Action::Check(next));
        }
    }

    /// A background follow-up ended: one that left the pod off the target retries it sooner;
    /// the last one ending converged starts the backoff afresh.
    fn on_follow_up_end(&mut self, end: &FollowUpEnd, still_running: usize, out: &mut Vec<Action>) {
        if !end.converged && self.target() == Some(end.plan) {
            // A pod's paced reload did not bring the target into its worker: retry it
            // (verified), with the same doubling backoff as a deployment that left pods
            // failed (sooner than an armed drift pass, never later).
            let next = self.next_retry();
            if self.in_flight.is_none() {
                let at = self.now + next;
                if self.drift_at.is_none_or(|d| at < d) {
                    self.arm_drift(next, Wake::Retry, out);
                }
            }
        } else if end.converged && still_running == 0 {
            // Every scheduled reload ran: the backoff starts afresh.
            self.retry = None;
        }
    }

    /// The deployment in flight ended: with its report, or cancelled at its deadline.
    fn finish(&mut self, id: u64, report: Option<DeploymentReport>, out: &mut Vec<Action>) {
        let Some(InFlight { render, kind, .. }) = self.in_flight.take() else { return };
        let result = report.as_ref().map_or(DeploymentResult::Timeout, |r| r.result());
        out.push(Action::Ended { id, result });
        // Idle fleets get a drift pass after the interval; pods left failed get a (verified)
        // retry sooner, with a doubling backoff.
        if result.left_pods_behind() {
            let next = self.next_retry();
            self.arm_drift(next, Wake::Retry, out);
        } else {
            // Pods whose paced reload is still followed up have not shown success yet.
            let reloads_pending = report
                .as_ref()
                .is_some_and(|r| r.pods.iter().any(|(_, o)| matches!(o, PodOutcome::ReloadPending { .. })));
            if !reloads_pending {
                self.retry = None;
            }
            self.arm_drift(self.timing.drift_interval, Wake::Drift, out);
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
                    out.push(Action::Arm { timer: Timer::Hold(id), at: self.now + wait, why: Wake::Hold });
                }
            }
        }
        self.try_start(out);
    }

    /// Doubles the retry delay (from [`FIRST_RETRY`], at most the drift interval).
    fn next_retry(&mut self) -> Duration {
        let next = self.retry.map_or(FIRST_RETRY, |d| d * 2).min(self.timing.drift_interval);
        self.retry = Some(next);
        next
    }

    fn arm_drift(&mut self, after: Duration, why: Wake, out: &mut Vec<Action>) {
        let at = self.now + after;
        self.drift_at = Some(at);
        out.push(Action::Arm { timer: Timer::Drift, at, why });
    }

    fn enqueue(&mut self, r: Arc<Bundle>, kind: DeployKind, out: &mut Vec<Action>) {
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
        let limit = deployment_deadline(self.timing.deployment_timeout, self.endpoints.len(), self.timing.max_parallel);
        out.push(Action::Deploy { id, render, endpoints: self.endpoints.clone(), kind });
        out.push(Action::Arm { timer: Timer::Deadline(id), at: self.now + limit, why: Wake::Deadline });
    }

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
pub fn needs_reload(from: &Bundle, to: &Bundle) -> bool {
    crate::diff::diff(&crate::diff::Baseline::of_render(from), to).mode == Some(haptic_protocol::Mode::Reload)
}

/// How long a deployment to `pods` pods may run before the safety net cancels it: the
/// deployment timeout once per wave of at most `max_parallel` pods (`--deployment-timeout` is
/// per wave, so it does not fire routinely on a fleet much larger than `--max-parallel`).
pub fn deployment_deadline(per_wave: Duration, pods: usize, max_parallel: usize) -> Duration {
    let waves = pods.div_ceil(max_parallel.max(1)).max(1);
    per_wave.saturating_mul(u32::try_from(waves).unwrap_or(u32::MAX))
}

/// The armed timers of the driver: one slot per kind.
#[derive(Debug, Default)]
struct Timers {
    deadline: Option<(u64, Instant)>,
    drift: Option<Instant>,
    hold: Option<(u64, Instant)>,
}

impl Timers {
    fn arm(&mut self, timer: Timer, at: Instant) {
        match timer {
            Timer::Deadline(id) => self.deadline = Some((id, at)),
            Timer::Drift => self.drift = Some(at),
            Timer::Hold(token) => self.hold = Some((token, at)),
        }
    }

    fn disarm(&mut self, timer: Timer) {
        match timer {
            Timer::Deadline(_) => self.deadline = None,
            Timer::Drift => self.drift = None,
            Timer::Hold(_) => self.hold = None,
        }
    }

    /// The earliest armed timer and its instant.
    fn next(&self) -> Option<(Timer, Instant)> {
        let all = [
            self.deadline.map(|(id, at)| (Timer::Deadline(id), at)),
            self.drift.map(|at| (Timer::Drift, at)),
            self.hold.map(|(t, at)| (Timer::Hold(t), at)),
        ];
        all.into_iter().flatten().min_by_key(|(_, at)| *at)
    }
}

/// What the driver's loop carries out actions on: the core's input channel, the deployment
/// task in flight and the armed timers.
struct Execution {
    in_tx: mpsc::UnboundedSender<Input>,
    running: Option<(u64, tokio::task::JoinHandle<()>)>,
    timers: Timers,
}

/// Feeds the core from the seams, the gate, the deployer and its timers, and carries out the
/// core's actions.
pub struct Driver {
    core: Core,
    deployer: Arc<Deployer>,
    checker: Checker,
    board: Arc<StatusBoard>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("core", &self.core).finish()
    }
}

impl Driver {
    /// A driver.
    pub fn new(
        timing: Timing,
        deployer: Arc<Deployer>,
        checker: Checker,
        board: Arc<StatusBoard>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Driver { core: Core::with_timing(timing), deployer, checker, board, metrics }
    }

    /// Runs until `shutdown`, taking on each change of `tuning`.
    pub async fn run(
        mut self,
        renders: Box<dyn BundleSource>,
        endpoints: Box<dyn EndpointSource>,
        mut tuning: watch::Receiver<Tuning>,
        shutdown: CancellationToken,
    ) {
        let (in_tx, mut in_rx) = mpsc::unbounded_channel::<Input>();
        let feeds = self.spawn_feeds(renders, endpoints, &in_tx);
        let mut exec = Execution { in_tx, running: None, timers: Timers::default() };
        let mut tuning_open = true;
        loop {
            let next = exec.timers.next();
            let input = tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(i) = in_rx.recv() => i,
                _ = sleep_until_opt(next.map(|(_, at)| at)) => {
                    let Some((timer, _)) = next else { continue };
                    exec.timers.disarm(timer);
                    Input::Fired(timer)
                }
                r = tuning.changed(), if tuning_open => {
                    if r.is_err() {
                        tuning_open = false;
                        continue;
                    }
                    let t = *tuning.borrow_and_update();
                    info!(?t, "new settings for the running deployment loop");
                    self.deployer.retune(DeployerConfig { max_parallel: t.max_parallel, sync_timeout: t.sync_timeout });
                    Input::Tuning(t.into())
                }
            };
            self.observe(&input);
            for a in self.core.on(Instant::now(), input) {
                self.carry_out(a, &mut exec);
            }
            self.publish();
        }
        for task in feeds {
            task.abort();
        }
        self.deployer.stop_follow_ups();
        if let Some((_, h)) = exec.running {
            h.abort();
        }
    }

    /// Starts the tasks that feed the core: the render source, the endpoint source and the
    /// ends of background follow-ups. The sources run in their own tasks, so a half-finished
    /// wait is never cancelled.
    fn spawn_feeds(
        &self,
        mut renders: Box<dyn BundleSource>,
        mut endpoints: Box<dyn EndpointSource>,
        in_tx: &mpsc::UnboundedSender<Input>,
    ) -> [tokio::task::JoinHandle<()>; 3] {
        let tx = in_tx.clone();
        let render_task = tokio::spawn(async move {
            while let Some(ev) = renders.next().await {
                if let Err(why) = &ev {
                    warn!("the render source holds no valid render: {why}");
                }
                if tx.send(Input::Bundle(ev)).is_err() {
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
        let deployer = self.deployer.clone();
        let follow_up_task = tokio::spawn(async move {
            while let Some(end) = follow_ups.recv().await {
                let still_running = deployer.follow_ups_running();
                if tx.send(Input::FollowUpEnded { end, still_running }).is_err() {
                    break;
                }
            }
        });
        [render_task, endpoint_task, follow_up_task]
    }

    /// Carries out one action of the core.
    fn carry_out(&self, a: Action, exec: &mut Execution) {
        match a {
            Action::Check(r) => {
                let checker = self.checker.clone();
                let tx = exec.in_tx.clone();
                tokio::spawn(async move {
                    let v = checker.verdict(&r).await;
                    let _ = tx.send(Input::Verdict(r, v));
                });
            }
            Action::Deploy { id, render, endpoints, kind } => {
                let pods = endpoints.len();
                info!(id, plan = %render.plan_id().short(), pods, ?kind, "deployment started");
                let deployer = self.deployer.clone();
                let tx = exec.in_tx.clone();
                let handle = tokio::spawn(async move {
                    let report = deployer.deploy(render, endpoints, kind).await;
                    let _ = tx.send(Input::Finished(id, report));
                });
                exec.running = Some((id, handle));
            }
            Action::Cancel { id } => {
                if let Some((rid, handle)) = exec.running.take() {
                    if rid == id {
                        handle.abort();
                    } else {
                        exec.running = Some((rid, handle));
                    }
                }
                error!(id, "deployment timed out; cancelled it and retrying the latest render");
                self.deployer.forget_pods();
            }
            Action::Ended { id, result } => {
                if exec.running.as_ref().is_some_and(|(rid, _)| *rid == id) {
                    exec.running = None;
                }
                self.metrics.deployment(result.as_str());
                info!(id, %result, "deployment finished");
                self.board.controller(|c| {
                    c.deployments += 1;
                    c.last_deployment = Some(result);
                });
            }
            Action::Arm { timer, at, why } => {
                let wait = at.saturating_duration_since(Instant::now());
                match why {
                    Wake::Retry => warn!(retry_in = ?wait, "some pods are not on the target; retrying"),
                    Wake::Hold => info!(
                        ?wait,
                        "every pod has a paced reload scheduled; holding newer renders until shortly before it"
                    ),
                    Wake::Drift | Wake::Deadline => {}
                }
                exec.timers.arm(timer, at);
            }
            Action::Disarm(timer) => exec.timers.disarm(timer),
        }
    }

    /// Logs, metrics and status of what comes in (the core decides nothing here).
    fn observe(&self, input: &Input) {
        match input {
            Input::Verdict(r, Verdict::Refused(why)) => {
                self.metrics.gate_rejections.inc();
                let out = why.to_string();
                let first = out.lines().find(|l| l.contains("ALERT")).unwrap_or(out.as_str());
                warn!(plan = %r.plan_id().short(), "the gate refused the render: {first}");
            }
            Input::Verdict(r, Verdict::Pass) => info!(plan = %r.plan_id().short(), "the gate passed the render"),
            Input::Endpoints(eps) => {
                let list: Vec<(String, String)> = eps.iter().map(|e| (e.name.clone(), e.url.clone())).collect();
                self.board.set_endpoints(&list);
                self.deployer.refresh_gauges();
            }
            Input::FollowUpEnded { end, .. } if !end.converged && self.core.target() == Some(end.plan) => {
                warn!(pod = %end.pod, "a scheduled reload did not converge; retrying");
            }
            Input::Fired(Timer::Drift) if self.core.in_flight().is_none() => {
                info!("re-applying the target from verified state (drift repair or retry)");
            }
            _ => {}
        }
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
    use crate::gate::Refused;
    use haptic_protocol::Mode;

    fn r(n: u32) -> Arc<Bundle> {
        let cfg = format!("global\n  maxconn {n}\n");
        Arc::new(Bundle::from_texts([("haproxy.cfg", cfg.as_str())]).unwrap())
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

    fn ok(plan: PlanId) -> DeploymentReport {
        DeploymentReport {
            plan,
            pods: vec![("p1".into(), PodOutcome::Unchanged)],
            duration: Duration::ZERO,
            reloads_due_in: None,
        }
    }

    /// The one instant the pure tests feed the core (timers are asked for relative to it).
    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    #[test]
    fn waits_for_endpoints_then_deploys_latest_wins() {
        let mut c = Core::new(GateMode::Optimistic);
        let a = c.on(t0(), Input::Bundle(Ok(r(1))));
        assert_eq!(checks(&a), vec![r(1).plan_id()]);
        assert!(deploys(&a).is_empty(), "no endpoints yet");
        let a = c.on(t0(), Input::Endpoints(eps()));
        assert_eq!(deploys(&a), vec![(1, r(1).plan_id(), DeployKind::Normal)]);
        // While deployment 1 runs, renders 2..=5 coalesce into the pending slot.
        for n in 2..=5 {
            assert!(deploys(&c.on(t0(), Input::Bundle(Ok(r(n))))).is_empty());
        }
        assert_eq!(c.pending(), Some(r(5).plan_id()));
        let a = c.on(t0(), Input::Finished(1, ok(r(1).plan_id())));
        assert_eq!(deploys(&a), vec![(2, r(5).plan_id(), DeployKind::Normal)]);
        assert_eq!(c.target(), Some(r(5).plan_id()));
        // A stale completion id changes nothing.
        assert!(c.on(t0(), Input::Finished(1, ok(r(1).plan_id()))).is_empty());
        assert_eq!(c.in_flight(), Some(2));
    }

    #[test]
    fn scheduled_reloads_free_the_slot_and_newer_renders_dispatch_at_once() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(t0(), Input::Endpoints(eps()));
        let a = c.on(t0(), Input::Bundle(Ok(r(1))));
        assert_eq!(deploys(&a), vec![(1, r(1).plan_id(), DeployKind::Normal)]);
        // While the apply round of deployment 1 runs, renders coalesce (latest wins).
        for n in 2..=4 {
            assert!(deploys(&c.on(t0(), Input::Bundle(Ok(r(n))))).is_empty());
        }
        // Every pod ACKed with a scheduled reload: the deployment is over, its reloads are
        // followed up in the background, and the pending render goes out at once.
        let pending = DeploymentReport {
            plan: r(1).plan_id(),
            pods: vec![("p1".into(), PodOutcome::ReloadPending { mode: Mode::Reload, due_in_ms: 0 })],
            duration: Duration::ZERO,
            reloads_due_in: None,
        };
        let a = c.on(t0(), Input::Finished(1, pending));
        assert_eq!(deploys(&a), vec![(2, r(4).plan_id(), DeployKind::Normal)]);
        // With nothing pending, the next render dispatches the moment it arrives.
        let rep = DeploymentReport {
            plan: r(4).plan_id(),
            pods: vec![("p1".into(), PodOutcome::ReloadPending { mode: Mode::Reload, due_in_ms: 0 })],
            duration: Duration::ZERO,
            reloads_due_in: None,
        };
        assert!(deploys(&c.on(t0(), Input::Finished(2, rep))).is_empty());
        let a = c.on(t0(), Input::Bundle(Ok(r(5))));
        assert_eq!(deploys(&a), vec![(3, r(5).plan_id(), DeployKind::Normal)]);
        // The end of a superseded plan's follow-up changes nothing in the core.
        let end = FollowUpEnd { pod: "p1".into(), plan: r(4).plan_id(), converged: false };
        assert!(c.on(t0(), Input::FollowUpEnded { end, still_running: 0 }).is_empty());
        assert_eq!((c.in_flight(), c.target()), (Some(3), Some(r(5).plan_id())));
    }

    fn pending_report(plan: PlanId, duration_ms: u64, due_ms: Option<u64>) -> DeploymentReport {
        DeploymentReport {
            plan,
            pods: vec![("p1".into(), PodOutcome::ReloadPending { mode: Mode::Reload, due_in_ms: 0 })],
            duration: Duration::from_millis(duration_ms),
            reloads_due_in: due_ms.map(Duration::from_millis),
        }
    }

    fn holds(a: &[Action]) -> Vec<(u64, Duration)> {
        a.iter()
            .filter_map(|a| match a {
                Action::Arm { timer: Timer::Hold(token), at, .. } => Some((*token, *at - t0())),
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
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(r(1))));
        let a = c.on(t0(), Input::Finished(1, pending_report(r(1).plan_id(), 50, Some(1500))));
        assert_eq!(holds(&a), vec![(1, Duration::from_millis(1350))]);
        assert!(c.held());
        for n in 2..=6 {
            assert!(deploys(&c.on(t0(), Input::Bundle(Ok(r(n))))).is_empty(), "held: render {n} coalesces");
        }
        assert_eq!(c.pending(), Some(r(6).plan_id()));
        assert!(c.on(t0(), Input::Fired(Timer::Hold(7))).is_empty(), "a stale hold token changes nothing");
        let a = c.on(t0(), Input::Fired(Timer::Hold(1)));
        assert_eq!(deploys(&a), vec![(2, r(6).plan_id(), DeployKind::Normal)]);
        // Due within the lead: no hold, the next render goes out at once.
        let a = c.on(t0(), Input::Finished(2, pending_report(r(6).plan_id(), 50, Some(120))));
        assert!(holds(&a).is_empty() && !c.held());
        assert_eq!(deploys(&c.on(t0(), Input::Bundle(Ok(r(7))))), vec![(3, r(7).plan_id(), DeployKind::Normal)]);
        // New endpoints end a hold: new pods need the render now.
        c.on(t0(), Input::Finished(3, pending_report(r(7).plan_id(), 50, Some(1900))));
        c.on(t0(), Input::Bundle(Ok(r(8))));
        assert!(c.held());
        let mut two = eps();
        two.push(Endpoint { name: "p2".into(), url: "http://p2".into() });
        let a = c.on(t0(), Input::Endpoints(two));
        assert_eq!(deploys(&a), vec![(4, r(8).plan_id(), DeployKind::Normal)]);
        assert!(c.on(t0(), Input::Fired(Timer::Hold(3))).is_empty(), "the ended hold's timer changes nothing");
    }

    /// A render with a frontend timeout (a reload to change) and one server slot (runtime).
    fn slot(timeout: u32, port: u16) -> Arc<Bundle> {
        let cfg = format!(
            "global\n  default-path config\ndefaults\n  mode http\n  timeout client {timeout}s\n\
             backend be\n  server s1 127.0.0.1:{port} weight 10\n"
        );
        Arc::new(Bundle::from_texts([("haproxy.cfg", cfg.as_str())]).unwrap())
    }

    #[test]
    fn runtime_renders_are_never_held_behind_the_pods_reload_slot() {
        assert!(needs_reload(&slot(5, 1), &slot(6, 1)));
        assert!(!needs_reload(&slot(5, 1), &slot(5, 2)));
        let mut c = Core::new(GateMode::Optimistic);
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(slot(5, 1))));
        // A frontend change: every pod schedules its paced reload 5 s out; the slot is held.
        c.on(t0(), Input::Finished(1, ok(slot(5, 1).plan_id())));
        assert_eq!(
            deploys(&c.on(t0(), Input::Bundle(Ok(slot(6, 1))))),
            vec![(2, slot(6, 1).plan_id(), DeployKind::Normal)]
        );
        let a = c.on(t0(), Input::Finished(2, pending_report(slot(6, 1).plan_id(), 50, Some(5000))));
        assert_eq!(holds(&a), vec![(2, Duration::from_millis(4850))]);
        // An endpoint change on top of the scheduled plan goes out at once, held or not.
        let a = c.on(t0(), Input::Bundle(Ok(slot(6, 2))));
        assert_eq!(deploys(&a), vec![(3, slot(6, 2).plan_id(), DeployKind::Normal)], "runtime render held back");
        let a = c.on(t0(), Input::Finished(3, pending_report(slot(6, 2).plan_id(), 50, Some(4800))));
        assert_eq!(holds(&a), vec![(3, Duration::from_millis(4650))]);
        // A render that needs a reload waits for the slot; an endpoint change after it, on top of
        // it, still needs that reload (latest wins), so it waits too.
        assert!(deploys(&c.on(t0(), Input::Bundle(Ok(slot(7, 2))))).is_empty(), "a reload render waits");
        assert!(deploys(&c.on(t0(), Input::Bundle(Ok(slot(7, 3))))).is_empty());
        assert_eq!(c.pending(), Some(slot(7, 3).plan_id()));
        // The latest is runtime-only against the target again (its reload change was undone): out at once.
        let a = c.on(t0(), Input::Bundle(Ok(slot(6, 4))));
        assert_eq!(deploys(&a), vec![(4, slot(6, 4).plan_id(), DeployKind::Normal)]);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Bundle(u32, u16),
        FinishScheduled,
        FinishConverged,
        HoldOver,
    }

    fn any_step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (5u32..8, 1u16..4).prop_map(|(t, p)| Step::Bundle(t, p)),
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
            c.on(t0(), Input::Endpoints(eps()));
            let mut renders = std::collections::HashMap::new();
            let mut hold_token = None;
            for step in steps {
                let actions = match step {
                    Step::Bundle(t, p) => {
                        let r = slot(t, p);
                        renders.insert(r.plan_id(), r.clone());
                        c.on(t0(), Input::Bundle(Ok(r)))
                    }
                    Step::FinishScheduled | Step::FinishConverged => match c.in_flight() {
                        Some(id) => {
                            let plan = c.target().unwrap();
                            let due = matches!(step, Step::FinishScheduled).then_some(5000);
                            c.on(t0(), Input::Finished(id, pending_report(plan, 50, due)))
                        }
                        None => vec![],
                    },
                    Step::HoldOver => match hold_token {
                        Some(t) => c.on(t0(), Input::Fired(Timer::Hold(t))),
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
        c.on(t0(), Input::Bundle(Ok(r(1))));
        assert!(checks(&c.on(t0(), Input::Bundle(Ok(r(2))))).is_empty());
        c.on(t0(), Input::Bundle(Ok(r(3))));
        let a = c.on(t0(), Input::Verdict(r(1), Verdict::Pass));
        assert_eq!(checks(&a), vec![r(3).plan_id()]);
    }

    #[test]
    fn pessimistic_holds_until_pass() {
        let mut c = Core::new(GateMode::Pessimistic);
        c.on(t0(), Input::Endpoints(eps()));
        assert!(deploys(&c.on(t0(), Input::Bundle(Ok(r(1))))).is_empty());
        let a = c.on(t0(), Input::Verdict(r(1), Verdict::Pass));
        assert_eq!(deploys(&a), vec![(1, r(1).plan_id(), DeployKind::Normal)]);
        // A refused render never deploys; the target stays the last good.
        c.on(t0(), Input::Finished(1, ok(r(1).plan_id())));
        c.on(t0(), Input::Bundle(Ok(r(2))));
        let a = c.on(t0(), Input::Verdict(r(2), Verdict::Refused(Refused::Haproxy("bad".into()))));
        assert!(deploys(&a).is_empty());
        assert_eq!(c.target(), Some(r(1).plan_id()));
    }

    #[test]
    fn optimistic_refusal_reverts_and_pins_until_a_pass() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(r(1))));
        c.on(t0(), Input::Verdict(r(1), Verdict::Pass));
        c.on(t0(), Input::Finished(1, ok(r(1).plan_id())));
        // Bad render 2 dispatches at once (optimistic), then the gate refuses it.
        let a = c.on(t0(), Input::Bundle(Ok(r(2))));
        assert_eq!(deploys(&a), vec![(2, r(2).plan_id(), DeployKind::Normal)]);
        let a = c.on(t0(), Input::Verdict(r(2), Verdict::Refused(Refused::Haproxy("bad".into()))));
        assert!(deploys(&a).is_empty(), "deployment 2 still in flight");
        assert!(c.latch().pinned);
        assert_eq!(c.pending(), Some(r(1).plan_id()), "revert queued");
        let a = c.on(t0(), Input::Finished(2, ok(r(2).plan_id())));
        assert_eq!(deploys(&a), vec![(3, r(1).plan_id(), DeployKind::Normal)]);
        c.on(t0(), Input::Finished(3, ok(r(1).plan_id())));
        // Pinned: the next render waits for its verdict, then deploys.
        assert!(deploys(&c.on(t0(), Input::Bundle(Ok(r(3))))).is_empty());
        let a = c.on(t0(), Input::Verdict(r(3), Verdict::Pass));
        assert_eq!(deploys(&a), vec![(4, r(3).plan_id(), DeployKind::Normal)]);
        assert!(!c.latch().pinned);
    }

    #[test]
    fn refused_while_pending_is_dropped() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(r(1))));
        c.on(t0(), Input::Bundle(Ok(r(2))));
        assert_eq!(c.pending(), Some(r(2).plan_id()));
        c.on(t0(), Input::Verdict(r(1), Verdict::Pass));
        c.on(t0(), Input::Verdict(r(2), Verdict::Refused(Refused::Haproxy("bad".into()))));
        assert_eq!(c.pending(), None);
        let a = c.on(t0(), Input::Finished(1, ok(r(1).plan_id())));
        assert!(deploys(&a).is_empty());
        assert_eq!(c.target(), Some(r(1).plan_id()));
    }

    #[test]
    fn timeout_retries_the_latest_and_drift_redeploys_when_idle() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(r(1))));
        let a = c.on(t0(), Input::Fired(Timer::Deadline(1)));
        assert_eq!(deploys(&a), vec![(2, r(1).plan_id(), DeployKind::Normal)]);
        c.on(t0(), Input::Bundle(Ok(r(2))));
        let a = c.on(t0(), Input::Fired(Timer::Deadline(2)));
        assert_eq!(deploys(&a), vec![(3, r(2).plan_id(), DeployKind::Normal)], "the latest, not the timed-out one");
        assert!(deploys(&c.on(t0(), Input::Fired(Timer::Drift))).is_empty(), "busy");
        c.on(t0(), Input::Finished(3, ok(r(2).plan_id())));
        let a = c.on(t0(), Input::Fired(Timer::Drift));
        assert_eq!(deploys(&a), vec![(4, r(2).plan_id(), DeployKind::Drift)]);
    }

    #[test]
    fn stands_down_for_good() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(r(1))));
        let rep = DeploymentReport {
            plan: r(1).plan_id(),
            pods: vec![("p1".into(), PodOutcome::StoodDown("other holder".into()))],
            duration: Duration::ZERO,
            reloads_due_in: None,
        };
        c.on(t0(), Input::Finished(1, rep));
        assert!(c.stood_down());
        assert!(deploys(&c.on(t0(), Input::Bundle(Ok(r(2))))).is_empty());
        assert!(deploys(&c.on(t0(), Input::Fired(Timer::Drift))).is_empty());
    }

    #[test]
    fn render_errors_keep_the_last_render() {
        let mut c = Core::new(GateMode::Optimistic);
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(r(1))));
        c.on(t0(), Input::Bundle(Err("no haproxy.cfg".into())));
        assert_eq!(c.render_error(), Some("no haproxy.cfg"));
        assert_eq!(c.target(), Some(r(1).plan_id()));
    }
    fn arms(a: &[Action]) -> Vec<(Timer, Duration, Wake)> {
        a.iter()
            .filter_map(|a| match a {
                Action::Arm { timer, at, why } => Some((*timer, *at - t0(), *why)),
                _ => None,
            })
            .collect()
    }

    fn ended(a: &[Action]) -> Vec<(u64, DeploymentResult)> {
        a.iter()
            .filter_map(|a| match a {
                Action::Ended { id, result } => Some((*id, *result)),
                _ => None,
            })
            .collect()
    }

    fn report(plan: PlanId, outcomes: Vec<PodOutcome>) -> DeploymentReport {
        DeploymentReport {
            plan,
            pods: outcomes.into_iter().enumerate().map(|(i, o)| (format!("p{i}"), o)).collect(),
            duration: Duration::ZERO,
            reloads_due_in: None,
        }
    }

    fn timing() -> Timing {
        Timing {
            gate: GateMode::Optimistic,
            deployment_timeout: Duration::from_secs(30),
            max_parallel: 2,
            drift_interval: Duration::from_secs(10),
        }
    }

    #[test]
    fn every_deployment_arms_its_deadline_and_a_passed_deadline_cancels_and_retries() {
        let mut c = Core::with_timing(timing());
        let mut three = eps();
        three.push(Endpoint { name: "p2".into(), url: "http://p2".into() });
        three.push(Endpoint { name: "p3".into(), url: "http://p3".into() });
        c.on(t0(), Input::Endpoints(three));
        let a = c.on(t0(), Input::Bundle(Ok(r(1))));
        // Three pods at two at once: two waves of 30 s.
        assert_eq!(arms(&a), vec![(Timer::Deadline(1), Duration::from_secs(60), Wake::Deadline)]);
        let a = c.on(t0(), Input::Fired(Timer::Deadline(1)));
        assert!(matches!(a.first(), Some(Action::Cancel { id: 1 })), "{a:?}");
        assert_eq!(ended(&a), vec![(1, DeploymentResult::Timeout)]);
        assert_eq!(deploys(&a), vec![(2, r(1).plan_id(), DeployKind::Normal)]);
        assert!(arms(&a).contains(&(Timer::Deadline(2), Duration::from_secs(60), Wake::Deadline)));
        // A report ending the deployment disarms its deadline; a stale deadline does nothing.
        let a = c.on(t0(), Input::Finished(2, ok(r(1).plan_id())));
        assert!(a.iter().any(|a| matches!(a, Action::Disarm(Timer::Deadline(2)))), "{a:?}");
        assert!(c.on(t0(), Input::Fired(Timer::Deadline(2))).is_empty());
        assert!(c.on(t0(), Input::Finished(1, ok(r(1).plan_id()))).is_empty(), "the cancelled one's late report");
    }

    #[test]
    fn pods_left_behind_are_retried_with_a_doubling_backoff_capped_at_the_drift_interval() {
        let mut c = Core::with_timing(timing());
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(r(1))));
        let failed = || report(r(1).plan_id(), vec![PodOutcome::Failed("down".into())]);
        let mut waits = Vec::new();
        for id in 1..=6 {
            let a = c.on(t0(), Input::Finished(id, failed()));
            assert_eq!(ended(&a), vec![(id, DeploymentResult::Failed)]);
            let drift: Vec<_> = arms(&a).into_iter().filter(|(t, _, _)| *t == Timer::Drift).collect();
            assert_eq!(drift.len(), 1, "{a:?}");
            assert_eq!(drift[0].2, Wake::Retry);
            waits.push(drift[0].1.as_secs());
            // The retry: a verified (drift) pass of the target.
            let a = c.on(t0(), Input::Fired(Timer::Drift));
            assert_eq!(deploys(&a), vec![(id + 1, r(1).plan_id(), DeployKind::Drift)]);
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 10, 10]);
        // Success resets the backoff: the next pass is a drift interval away.
        let a = c.on(t0(), Input::Finished(7, ok(r(1).plan_id())));
        assert!(arms(&a).contains(&(Timer::Drift, Duration::from_secs(10), Wake::Drift)));
        assert_eq!(c.retry(), None);
        c.on(t0(), Input::Fired(Timer::Drift));
        let a = c.on(t0(), Input::Finished(8, failed()));
        assert!(arms(&a).contains(&(Timer::Drift, Duration::from_secs(1), Wake::Retry)), "{a:?}");
    }

    #[test]
    fn a_failed_follow_up_brings_the_retry_forward_and_a_busy_drift_pass_waits() {
        let mut c = Core::with_timing(timing());
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(r(1))));
        let pending = report(r(1).plan_id(), vec![PodOutcome::ReloadPending { mode: Mode::Reload, due_in_ms: 0 }]);
        let a = c.on(t0(), Input::Finished(1, pending));
        assert!(arms(&a).contains(&(Timer::Drift, Duration::from_secs(10), Wake::Drift)));
        // The pod's paced reload did not converge: a retry in 1 s, sooner than the drift pass.
        let end = FollowUpEnd { pod: "p1".into(), plan: r(1).plan_id(), converged: false };
        let a = c.on(t0(), Input::FollowUpEnded { end: end.clone(), still_running: 0 });
        assert_eq!(arms(&a), vec![(Timer::Drift, Duration::from_secs(1), Wake::Retry)]);
        // A second failure doubles the backoff, but never pushes an earlier pass back.
        assert!(arms(&c.on(t0(), Input::FollowUpEnded { end, still_running: 0 })).is_empty());
        assert_eq!(c.retry(), Some(Duration::from_secs(2)));
        // A converged follow-up with none left resets the backoff.
        let done = FollowUpEnd { pod: "p1".into(), plan: r(1).plan_id(), converged: true };
        c.on(t0(), Input::FollowUpEnded { end: done, still_running: 0 });
        assert_eq!(c.retry(), None);
        // A drift timer firing while a deployment runs waits another interval.
        c.on(t0(), Input::Bundle(Ok(r(2))));
        assert_eq!(c.in_flight(), Some(2));
        let a = c.on(t0(), Input::Fired(Timer::Drift));
        assert!(deploys(&a).is_empty());
        assert_eq!(arms(&a), vec![(Timer::Drift, Duration::from_secs(10), Wake::Drift)]);
    }

    #[test]
    fn new_tuning_applies_to_the_next_decisions() {
        let mut c = Core::with_timing(timing());
        c.on(t0(), Input::Endpoints(eps()));
        c.on(t0(), Input::Bundle(Ok(r(1))));
        c.on(t0(), Input::Finished(1, ok(r(1).plan_id())));
        let pessimistic =
            Timing { gate: GateMode::Pessimistic, deployment_timeout: Duration::from_secs(5), ..timing() };
        assert!(c.on(t0(), Input::Tuning(pessimistic)).is_empty());
        assert_eq!(c.latch().mode, GateMode::Pessimistic);
        // Pessimistic now: the render waits for its verdict; the new deadline applies.
        assert!(deploys(&c.on(t0(), Input::Bundle(Ok(r(2))))).is_empty());
        let a = c.on(t0(), Input::Verdict(r(2), Verdict::Pass));
        assert_eq!(deploys(&a), vec![(2, r(2).plan_id(), DeployKind::Normal)]);
        assert!(arms(&a).contains(&(Timer::Deadline(2), Duration::from_secs(5), Wake::Deadline)));
    }
}

/// The driver on paused time: the core's deadline timer fires through the driver, which
/// cancels the deployment stuck on an agent that accepts connections and never answers (a real
/// socket on 127.0.0.1) and starts the retry.
#[cfg(test)]
mod driver_tests {
    use super::*;
    use crate::client::{AgentClient, Credentials};
    use crate::status::ControllerStatus;
    use futures::future::BoxFuture;
    use haptic_protocol::Fence;

    /// Waits for `go`, then yields `render` once.
    struct AfterEndpoints(Option<tokio::sync::oneshot::Receiver<()>>, Option<Arc<Bundle>>);
    impl BundleSource for AfterEndpoints {
        fn next(&mut self) -> BoxFuture<'_, Option<BundleEvent>> {
            Box::pin(async move {
                if let Some(go) = self.0.take() {
                    let _ = go.await;
                }
                match self.1.take() {
                    Some(r) => Some(Ok(r)),
                    None => futures::future::pending().await,
                }
            })
        }
    }

    /// Yields its endpoints, then (once they were sent on) releases the render source, so the
    /// endpoints are fed first.
    struct Endpoints(Option<Vec<Endpoint>>, Option<tokio::sync::oneshot::Sender<()>>);
    impl EndpointSource for Endpoints {
        fn next(&mut self) -> BoxFuture<'_, Option<Vec<Endpoint>>> {
            Box::pin(async move {
                if let Some(eps) = self.0.take() {
                    return Some(eps);
                }
                if let Some(go) = self.1.take() {
                    let _ = go.send(());
                }
                futures::future::pending().await
            })
        }
    }

    #[derive(Debug, Default)]
    struct Holder(std::sync::atomic::AtomicU64);
    impl crate::seams::FenceHolder for Holder {
        fn identity(&self) -> String {
            "test".into()
        }
        fn epoch(&self) -> u64 {
            1
        }
        fn next_fence(&self) -> Option<Fence> {
            let seq = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            Some(Fence { epoch: 1, seq, holder: "test".into() })
        }
        fn reclaim(&self, _seen: &Fence) -> BoxFuture<'_, Result<(), String>> {
            Box::pin(async { Err("no".to_string()) })
        }
        fn stood_down(&self) -> Option<String> {
            None
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deployment_past_its_deadline_is_cancelled_and_retried() {
        // An agent that accepts and never answers.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (conn_tx, mut conns) = mpsc::unbounded_channel();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
                let _ = conn_tx.send(());
            }
        });
        let board = Arc::new(StatusBoard::new(
            GateStatus::from_latch(&Latch::new(GateMode::Optimistic), None),
            ControllerStatus::default(),
        ));
        let metrics = Arc::new(Metrics::new());
        let sync = Duration::from_secs(600);
        let client = AgentClient::new(Credentials { user: "u".into(), password: "p".into() }, sync).unwrap();
        let deployer = Arc::new(Deployer::new(
            client,
            Arc::new(Holder::default()),
            board.clone(),
            metrics.clone(),
            DeployerConfig { max_parallel: 1, sync_timeout: sync },
        ));
        // No `default-path config`: the gate refuses it without running HAProxy. Optimistic, it
        // is dispatched before the verdict, and the refusal has no last good render to revert to.
        let render = Arc::new(Bundle::from_texts([("haproxy.cfg", "global\n")]).unwrap());
        let timing = Timing { deployment_timeout: Duration::from_secs(5), ..Timing::new(GateMode::Optimistic) };
        let checker = Checker::new("/nonexistent/haproxy", sync);
        let driver = Driver::new(timing, deployer, checker, board.clone(), metrics);
        let (go_tx, go_rx) = tokio::sync::oneshot::channel();
        let eps = vec![Endpoint { name: "p1".into(), url: format!("http://{addr}") }];
        let (_keep, tuning) = watch::channel(Tuning {
            deployment_timeout: timing.deployment_timeout,
            drift_interval: timing.drift_interval,
            sync_timeout: sync,
            max_parallel: 1,
            gate: GateMode::Optimistic,
        });
        let stop = CancellationToken::new();
        let run = tokio::spawn(driver.run(
            Box::new(AfterEndpoints(Some(go_rx), Some(render))),
            Box::new(Endpoints(Some(eps), Some(go_tx))),
            tuning,
            stop.clone(),
        ));
        // The first deployment's state read reaches the silent agent; at the deadline the
        // driver cancels it (a timeout) and the retry connects again.
        conns.recv().await.unwrap();
        conns.recv().await.unwrap();
        let c = board.snapshot().controller;
        assert_eq!((c.deployments, c.last_deployment), (1, Some(DeploymentResult::Timeout)), "{c:?}");
        stop.cancel();
        run.await.unwrap();
        silent.abort();
    }
}
