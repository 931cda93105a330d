//! The deployer: brings every pod of one deployment to a render through fenced applies.
//!
//! Owns, per pod (≤ `max_parallel` at once, each bounded by the sync timeout): knowing the pod
//! (its last state read or ACK), resolving its baseline (plan cache first, else the pod's blob),
//! the diff and the encoded request (each made once for the pods that need the same), the apply
//! and carrying out what [`crate::attempt::next`] decides after each answer (an exact retry after
//! a transport error; `prev_mismatch` re-reads and re-diffs once,
//! `unknown_baseline` sends the complete state, `missing_parts` resends exactly those,
//! `stale_epoch` asks the fence holder to reclaim or stands down), NACK handling (HAProxy's
//! words into status; the pod's baseline — what the controller believed it holds — is dropped,
//! so the next deployment re-reads the pod), and the follow-up of scheduled reloads. A deployment
//! ends when every pod has ACKed (its reload done or scheduled), failed, or stood down; a pod with
//! a scheduled reload is then followed up in the background, outside the deployment slot
//! ([`crate::followup`]: one poller per pod, backing off, until it runs the render or the deadline passes, counting as
//! neither converged nor failed until then, superseded by a newer apply to the pod), so a newer
//! render dispatches at once and the agent's pacer folds it into the same reload. It must never
//! decide when to deploy (the scheduler does) and never send an apply without a fence from the
//! [`FenceHolder`].

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use futures::StreamExt;
use haptic_protocol::api::{EncodedApply, Part};
use haptic_protocol::{
    Ack, ApiVersion, ApplyRequest, Capabilities, Fence, FileEntry, Mode, PlanId, RelPath, StateResponse,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn, Instrument};

use crate::attempt::{next, Answer, Attempts, Next};
use crate::blob;
use crate::bundle::Bundle;
use crate::client::{AgentClient, ApplyAnswer, CallError};
use crate::diff::{complete_state, plan, Baseline, PlanDiff, ReloadCause};
use crate::followup::{judge, poll_delay, Poll, Step, Ticket, Tickets};
use crate::metrics::{ConflictLabel, Metrics};
use crate::seams::{Endpoint, FenceHolder};
use crate::status::{DeploymentResult, Phase, StatusBoard};

/// How many of the newest baselines the plan cache keeps whoever holds them. Each holds its
/// config's text and, once diffed, its parsed index (at 10,000 Ingress paths about 2 and 5 MiB):
/// keeping the last 32 renders held about 20 MiB more at that size (`endpoint_churn`).
const PLAN_CACHE_NEWEST: usize = 2;
/// How many baselines the plan cache keeps at most: the newest, then those a pod is known to
/// hold. A pod holding a plan no longer cached has its baseline decoded from the blob its state
/// carries, which above 512 KiB of config holds no config text (so a complete state and a reload).
const PLAN_CACHE: usize = 32;
/// The pause before an exact retry of an apply that got no answer (times the retry number).
const TRANSPORT_RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// Why a deployment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeployKind {
    /// A new render, new endpoints, or a retry.
    Normal,
    /// Drift repair: every pod's state is read with `?verify=1`.
    Drift,
}

/// What happened to one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOutcome {
    /// It already held and ran the render.
    Unchanged,
    /// It ACKed and runs the render.
    Converged(Mode),
    /// It ACKed; a paced reload is scheduled and followed up in the background.
    ReloadPending {
        /// The mode of the apply.
        mode: Mode,
        /// How long after the answer the reload is due (0: due now, or not said).
        due_in_ms: u64,
    },
    /// HAProxy refused the render (NACK), in its words.
    Rejected(String),
    /// It could not be brought to the render.
    Failed(String),
    /// This controller stood down.
    StoodDown(String),
}

impl PodOutcome {
    fn is_ok(&self) -> bool {
        matches!(self, PodOutcome::Unchanged | PodOutcome::Converged(_) | PodOutcome::ReloadPending { .. })
    }
}

/// One finished deployment.
#[derive(Debug, Clone)]
pub struct DeploymentReport {
    /// The plan deployed.
    pub plan: PlanId,
    /// Every pod's outcome.
    pub pods: Vec<(String, PodOutcome)>,
    /// How long it took.
    pub duration: Duration,
    /// When every pod ended with a paced reload scheduled: how long after the deployment's end
    /// the earliest of those reloads is due (else `None`).
    pub reloads_due_in: Option<Duration>,
}

impl DeploymentReport {
    /// How it ended (never [`DeploymentResult::Timeout`]: a timed-out deployment has no report).
    pub fn result(&self) -> DeploymentResult {
        if self.pods.iter().any(|(_, o)| matches!(o, PodOutcome::StoodDown(_))) {
            DeploymentResult::StoodDown
        } else if self.pods.iter().all(|(_, o)| o.is_ok()) {
            DeploymentResult::Success
        } else if self.pods.iter().any(|(_, o)| o.is_ok()) {
            DeploymentResult::Partial
        } else {
            DeploymentResult::Failed
        }
    }

    /// Whether the controller stood down during it.
    pub fn stood_down(&self) -> Option<&str> {
        self.pods.iter().find_map(|(_, o)| match o {
            PodOutcome::StoodDown(w) => Some(w.as_str()),
            _ => None,
        })
    }
}

/// How a background follow-up of a scheduled reload ended (superseded ones never report).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowUpEnd {
    /// The pod.
    pub pod: String,
    /// The plan its reload was to bring into the worker.
    pub plan: PlanId,
    /// Whether the pod runs it now (else it failed, and the board says why).
    pub converged: bool,
}

/// What the deployer knows of a pod between deployments: its last state read, advanced by ACKs.
#[derive(Debug, Clone)]
struct Known {
    applied: Option<PlanId>,
    blob: Arc<serde_json::Value>,
    files: Vec<FileEntry>,
    api: ApiVersion,
    caps: Capabilities,
}

impl Known {
    fn of(s: &StateResponse) -> Self {
        Known {
            applied: s.applied.as_ref().map(|a| a.plan_id),
            blob: Arc::new(s.applied.as_ref().map(|a| a.blob.clone()).unwrap_or_default()),
            files: s.files.clone(),
            api: s.api,
            caps: s.capabilities.clone(),
        }
    }
}

/// A small LRU of baselines by plan id.
#[derive(Debug, Default)]
struct PlanCache {
    entries: VecDeque<Arc<Baseline>>,
}

impl PlanCache {
    fn get(&mut self, id: PlanId) -> Option<Arc<Baseline>> {
        let i = self.entries.iter().position(|b| b.plan_id == id)?;
        let b = self.entries.remove(i)?;
        self.entries.push_front(b.clone());
        Some(b)
    }

    /// Adds `b` as the most recently used; keeps the [`PLAN_CACHE_NEWEST`] most recently used
    /// and, after them, those whose plan a pod is known to hold (`held`).
    fn insert(&mut self, b: Arc<Baseline>, held: &HashSet<PlanId>) {
        self.entries.retain(|e| e.plan_id != b.plan_id);
        self.entries.push_front(b);
        let mut position = 0;
        self.entries.retain(|e| {
            position += 1;
            position <= PLAN_CACHE_NEWEST || held.contains(&e.plan_id)
        });
        self.entries.truncate(PLAN_CACHE);
    }
}

/// What a pod's diff depends on: pods with equal keys share one diff within a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct DiffKey {
    /// The baseline's plan (none: complete state).
    baseline: Option<PlanId>,
    /// Whether the baseline carries its `haproxy.cfg` text (a runtime diff needs it).
    baseline_has_cfg: bool,
    /// The agent's API major version.
    api_major: u32,
    /// Whether the agent runs runtime batches.
    runtime_batches: bool,
    /// The op kinds the agent runs, sorted.
    ops: Vec<String>,
}

/// What the pods of one deployment share: one diff per [`DiffKey`], one encoded request per
/// [`RequestKey`], and the render's blob, each computed by the first pod that needs it.
#[derive(Debug, Default)]
struct Shared {
    diffs: Mutex<HashMap<DiffKey, Arc<OnceLock<Arc<PlanDiff>>>>>,
    requests: Mutex<HashMap<RequestKey, Arc<OnceLock<Composed>>>>,
    blob: OnceLock<Arc<serde_json::Value>>,
}

/// A request composed for the pods that share it, or why it could not be encoded.
type Composed = Result<Arc<SharedRequest>, String>;

/// What a request without its fence depends on within a deployment: the shared diff it carries
/// and the files sent whole.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RequestKey {
    diff: DiffKey,
    parts: Vec<RelPath>,
}

/// A pod's diff, and its key when pods with the same key share it (a drift repair or a complete
/// state after a refusal is the pod's own).
#[derive(Debug, Clone)]
struct PodDiff {
    diff: Arc<PlanDiff>,
    key: Option<DiffKey>,
}

impl PodDiff {
    fn own(diff: PlanDiff) -> Self {
        Self { diff: Arc::new(diff), key: None }
    }
}

/// An apply request without its fence: the fields the deployer reads back after the answer, and
/// its JSON encoded once for every pod that sends it.
#[derive(Debug)]
struct SharedRequest {
    mode: Mode,
    /// What a reload is for (the diff's causes; empty unless `mode` is reload).
    causes: BTreeSet<ReloadCause>,
    files: Vec<FileEntry>,
    blob: Arc<serde_json::Value>,
    encoded: EncodedApply,
}

/// One pod's apply: its own fence and the body with that fence.
#[derive(Debug)]
struct PodRequest {
    fence: Fence,
    shared: Arc<SharedRequest>,
    body: Bytes,
}

/// Why no request could be made for a pod.
enum NoRequest {
    /// The fence holder gives no fence: this controller stood down.
    StoodDown,
    /// The request did not encode.
    Encode(String),
}

/// Settings of the deployer.
#[derive(Debug, Clone)]
pub struct DeployerConfig {
    /// Pods applied to at once.
    pub max_parallel: usize,
    /// Bound of one pod's whole apply flow, and of each follow-up after the reload is due.
    pub sync_timeout: Duration,
}

/// The deployer.
pub struct Deployer {
    client: AgentClient,
    fence: Arc<dyn FenceHolder>,
    board: Arc<StatusBoard>,
    metrics: Arc<Metrics>,
    cfg: Mutex<DeployerConfig>,
    cache: Mutex<PlanCache>,
    known: Mutex<HashMap<String, Known>>,
    follow_ups: Mutex<Tickets>,
    pollers: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    follow_up_events: Mutex<Option<mpsc::UnboundedSender<FollowUpEnd>>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Deployer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployer").field("cfg", &self.config()).finish()
    }
}

/// The request a diff makes of a render, without its fence, encoded once; `parts` are sent whole.
fn compose(render: &Bundle, pd: &PlanDiff, parts: &[RelPath], shared: &Shared) -> Composed {
    let blob = shared.blob.get_or_init(|| Arc::new(blob::encode(render))).clone();
    let req = ApplyRequest {
        // Every pod's copy gets its own fence; this one is left out of the encoding.
        fence: Fence { epoch: 0, seq: 0, holder: String::new() },
        baseline: pd.baseline,
        plan_id: render.plan_id(),
        mode: pd.mode.unwrap_or(Mode::FileOnly),
        reasons: pd.reasons.clone(),
        files: render.manifest().to_vec(),
        parts: parts.iter().map(|p| (p.clone(), Part::from_bytes(render.bytes(p).unwrap_or_default()))).collect(),
        batches: pd.batches.clone(),
        blob: (*blob).clone(),
    };
    let encoded = EncodedApply::new(&req).map_err(|e| format!("encoding the apply: {e}"))?;
    Ok(Arc::new(SharedRequest { mode: req.mode, causes: pd.causes.clone(), files: req.files, blob, encoded }))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// Paths whose digest on the pod differs from the render's (or that only one side has).
fn differing(pod: &[FileEntry], render: &Bundle) -> BTreeSet<RelPath> {
    haptic_protocol::changed_paths(pod, render.manifest()).into_iter().cloned().collect()
}

/// What an ACKed apply reloaded for: the diff's causes when it asked for the reload, the agent's
/// fallback when it asked for none; nothing when it landed without one.
fn landed_reload_causes(asked: Mode, causes: &BTreeSet<ReloadCause>, landed: Mode) -> BTreeSet<ReloadCause> {
    match (asked, landed) {
        (Mode::Reload, Mode::Reload) => causes.clone(),
        (Mode::Runtime | Mode::FileOnly, Mode::Reload) => BTreeSet::from([ReloadCause::AgentFallback]),
        // Landed without a reload, or in a mode this controller does not know.
        _ => BTreeSet::new(),
    }
}

/// The diff that rewrites the files that drifted on a pod holding the target plan.
fn drift_repair(drifted: &BTreeSet<RelPath>, target: PlanId) -> PlanDiff {
    let list: Vec<String> = drifted.iter().map(|p| p.to_string()).collect();
    PlanDiff {
        mode: Some(Mode::FileOnly),
        reasons: vec![format!("drift: {} changed behind the controller's back; rewritten", list.join(", "))],
        causes: BTreeSet::new(),
        batches: Vec::new(),
        baseline: Some(target),
        skew: None,
    }
}

impl Deployer {
    /// A deployer.
    pub fn new(
        client: AgentClient,
        fence: Arc<dyn FenceHolder>,
        board: Arc<StatusBoard>,
        metrics: Arc<Metrics>,
        cfg: DeployerConfig,
    ) -> Self {
        Deployer {
            client,
            fence,
            board,
            metrics,
            cfg: Mutex::new(cfg),
            cache: Mutex::default(),
            known: Mutex::default(),
            follow_ups: Mutex::default(),
            pollers: Mutex::default(),
            follow_up_events: Mutex::default(),
            stop: CancellationToken::new(),
        }
    }

    /// The settings the next deployment uses.
    pub fn config(&self) -> DeployerConfig {
        lock(&self.cfg).clone()
    }

    /// Replaces the settings: deployments and follow-ups started from now on use them.
    pub fn retune(&self, cfg: DeployerConfig) {
        *lock(&self.cfg) = cfg;
    }

    /// Where the ends of background follow-ups are reported from now on (replacing any earlier
    /// receiver).
    pub fn follow_up_events(&self) -> mpsc::UnboundedReceiver<FollowUpEnd> {
        let (tx, rx) = mpsc::unbounded_channel();
        *lock(&self.follow_up_events) = Some(tx);
        rx
    }

    /// Stops every background follow-up (the controller is stopping).
    pub fn stop_follow_ups(&self) {
        self.stop.cancel();
    }

    /// How many pods have a background follow-up running.
    pub fn follow_ups_running(&self) -> usize {
        lock(&self.follow_ups).len()
    }

    /// Remembers a render as a baseline (so pods that ACK it never need their blob decoded).
    pub fn remember(&self, r: &Bundle) {
        let held = self.held_plans();
        lock(&self.cache).insert(Arc::new(Baseline::of_render(r)), &held);
    }

    /// Forgets what it knew of pods (e.g. after a cancelled deployment): the next deployment
    /// reads their state again.
    pub fn forget_pods(&self) {
        lock(&self.known).clear();
    }

    /// Applies `render` to every endpoint and reports each pod's outcome once every pod has
    /// ACKed or failed; scheduled reloads are followed up in the background.
    pub async fn deploy(
        self: &Arc<Self>,
        render: Arc<Bundle>,
        endpoints: Vec<Endpoint>,
        kind: DeployKind,
    ) -> DeploymentReport {
        let started = Instant::now();
        let cfg = self.config();
        self.remember(&render);
        let shared = Arc::new(Shared::default());
        let pods: Vec<(String, PodOutcome, Option<Instant>)> = futures::stream::iter(endpoints)
            .map(|ep| {
                let me = self.clone();
                let render = render.clone();
                let shared = shared.clone();
                async move {
                    // This apply supersedes the pod's older follow-up: whatever it waited for,
                    // the pod is about to hold a newer plan.
                    me.stop_poller(&ep.name);
                    let fut = me.deploy_pod(&ep, &render, kind, &shared);
                    let outcome = match tokio::time::timeout(cfg.sync_timeout, fut).await {
                        Ok(o) => o,
                        Err(_) => {
                            lock(&me.known).remove(&ep.name);
                            me.fail(&ep, format!("no answer within the sync timeout ({:?})", cfg.sync_timeout))
                        }
                    };
                    // A scheduled reload is followed up outside the deployment slot, so a newer
                    // render reaches the pod before its paced reload runs.
                    let mut due_at = None;
                    if let PodOutcome::ReloadPending { mode, due_in_ms } = outcome {
                        due_at = Some(Instant::now() + Duration::from_millis(due_in_ms));
                        me.spawn_follow_up(ep.clone(), render.plan_id(), mode, due_in_ms, cfg.sync_timeout);
                    }
                    (ep.name.clone(), outcome, due_at)
                }
            })
            .buffer_unordered(cfg.max_parallel.max(1))
            .collect()
            .await;
        let dues: Option<Vec<Instant>> = pods.iter().map(|(_, _, d)| *d).collect();
        let now = Instant::now();
        let reloads_due_in = dues
            .filter(|d| !d.is_empty())
            .and_then(|d| d.into_iter().min())
            .map(|at| at.saturating_duration_since(now));
        let pods = pods.into_iter().map(|(n, o, _)| (n, o)).collect();
        let report = DeploymentReport { plan: render.plan_id(), pods, duration: started.elapsed(), reloads_due_in };
        self.metrics.deployment_duration.observe(report.duration.as_secs_f64());
        self.refresh_gauges();
        report
    }

    /// Sets the converged/total gauges from the board.
    pub fn refresh_gauges(&self) {
        let s = self.board.snapshot();
        self.metrics.pods_converged.set(i64::try_from(s.converged).unwrap_or(i64::MAX));
        self.metrics.pods.set(i64::try_from(s.total).unwrap_or(i64::MAX));
        self.metrics.retain_pods(s.pods.iter().map(|p| p.pod.as_str()));
    }

    fn fail(&self, ep: &Endpoint, why: String) -> PodOutcome {
        warn!(pod = %ep.name, "apply failed: {why}");
        self.board.pod(&ep.name, |p| {
            p.phase = Phase::Failed;
            p.last_error = Some(why.clone());
        });
        PodOutcome::Failed(why)
    }

    fn stand_down(&self, ep: &Endpoint, why: String) -> PodOutcome {
        self.board.controller(|c| c.stood_down = Some(why.clone()));
        self.board.pod(&ep.name, |p| {
            p.phase = Phase::StoodDown;
            p.last_error = Some(why.clone());
        });
        PodOutcome::StoodDown(why)
    }

    async fn read_state(&self, ep: &Endpoint, verify: bool) -> Result<StateResponse, String> {
        let s = self.client.state(ep, verify).await.map_err(|e| e.to_string())?;
        self.board.pod(&ep.name, |p| p.observe(&s));
        lock(&self.known).insert(ep.name.clone(), Known::of(&s));
        Ok(s)
    }

    /// The plans the pods are known to hold.
    fn held_plans(&self) -> HashSet<PlanId> {
        lock(&self.known).values().filter_map(|k| k.applied).collect()
    }

    /// The baseline for a pod's applied plan: the plan cache, else its blob.
    fn baseline(&self, pod: &str, k: &Known) -> Option<Arc<Baseline>> {
        let applied = k.applied?;
        if let Some(b) = lock(&self.cache).get(applied) {
            return Some(b);
        }
        match blob::decode(&k.blob, applied) {
            Ok(b) => {
                let b = Arc::new(b);
                let held = self.held_plans();
                lock(&self.cache).insert(b.clone(), &held);
                Some(b)
            }
            Err(e) => {
                info!(pod, plan = %applied.short(), "no baseline from the pod's blob ({e}): complete state and a reload");
                None
            }
        }
    }

    fn diff_for(&self, pod: &str, k: &Known, render: &Bundle, shared: &Shared) -> PodDiff {
        let base = self.baseline(pod, k);
        let mut ops = k.caps.ops.clone();
        ops.sort();
        let key = DiffKey {
            baseline: base.as_ref().map(|b| b.plan_id),
            baseline_has_cfg: base.as_ref().is_some_and(|b| b.cfg_text.is_some()),
            api_major: k.api.major,
            runtime_batches: k.caps.runtime_batches,
            ops,
        };
        let cell = lock(&shared.diffs).entry(key.clone()).or_default().clone();
        let diff = cell
            .get_or_init(|| {
                let d = plan(base.as_deref(), render, k.api, &k.caps);
                if let Some(mode) = d.mode {
                    // Once per baseline and render: what the pods on this baseline will be asked, and why.
                    info!(pod, plan = %render.plan_id().short(), %mode, causes = ?d.causes, reasons = ?d.reasons, "diff");
                }
                Arc::new(d)
            })
            .clone();
        PodDiff { diff, key: Some(key) }
    }

    /// The pod's request: a new fence on the request it shares with the pods of the deployment
    /// that have the same diff and lack the same files.
    fn request(
        &self,
        render: &Bundle,
        pd: &PodDiff,
        pod_files: &[FileEntry],
        extra: &BTreeSet<RelPath>,
        shared: &Shared,
    ) -> Result<PodRequest, NoRequest> {
        let fence = self.fence.next_fence().ok_or(NoRequest::StoodDown)?;
        let parts: Vec<RelPath> = render
            .manifest()
            .iter()
            .filter(|e| {
                let has = pod_files.iter().any(|p| p.path == e.path && p.digest == e.digest);
                e.path.is_haproxy_cfg() || !has || extra.contains(&e.path)
            })
            .map(|e| e.path.clone())
            .collect();
        let req = match &pd.key {
            Some(diff) => {
                let key = RequestKey { diff: diff.clone(), parts };
                let cell = lock(&shared.requests).entry(key.clone()).or_default().clone();
                cell.get_or_init(|| compose(render, &pd.diff, &key.parts, shared)).clone()
            }
            None => compose(render, &pd.diff, &parts, shared),
        }
        .map_err(NoRequest::Encode)?;
        let body = req.encoded.with_fence(&fence).map_err(|e| NoRequest::Encode(format!("encoding the apply: {e}")))?;
        Ok(PodRequest { fence, shared: req, body: Bytes::from(body) })
    }

    fn no_request(&self, ep: &Endpoint, why: NoRequest) -> PodOutcome {
        match why {
            NoRequest::StoodDown => self.stand_down(ep, self.fence.stood_down().unwrap_or_else(|| "stood down".into())),
            NoRequest::Encode(e) => self.fail(ep, e),
        }
    }

    async fn deploy_pod(
        self: &Arc<Self>,
        ep: &Endpoint,
        render: &Arc<Bundle>,
        kind: DeployKind,
        shared: &Shared,
    ) -> PodOutcome {
        let started = Instant::now();
        let target = render.plan_id();
        if let Some(why) = self.fence.stood_down() {
            return self.stand_down(ep, why);
        }
        let known = match self.know(ep, kind).await {
            Ok(k) => k,
            Err(e) => return self.fail(ep, e),
        };
        let drifted = if known.applied == Some(target) { differing(&known.files, render) } else { BTreeSet::new() };
        if known.applied == Some(target) && drifted.is_empty() {
            return self.unchanged(ep, render).await;
        }
        self.board.pod(&ep.name, |p| p.phase = Phase::Deploying);
        let mut pd = if known.applied == Some(target) && !drifted.is_empty() {
            PodDiff::own(drift_repair(&drifted, target))
        } else {
            self.diff_for(&ep.name, &known, render, shared)
        };
        let mut pod_files = known.files.clone();
        let mut attempts = Attempts::with_extra(drifted.clone());
        let mut skew_counted = false;
        let mut req = match self.request(render, &pd, &pod_files, attempts.extra(), shared) {
            Ok(req) => req,
            Err(why) => return self.no_request(ep, why),
        };
        loop {
            if pd.diff.skew.is_some() && !skew_counted {
                skew_counted = true;
                self.metrics.version_skew.inc();
            }
            let span = tracing::info_span!(
                "apply",
                pod = %ep.name,
                plan = %target.short(),
                fence = %req.fence,
                mode = %req.shared.mode,
            );
            let answer = self.client.apply_body(ep, req.body.clone()).instrument(span.clone()).await;
            // The span is entered only around code that does not await.
            let judged = span.in_scope(|| self.judge_answer(&answer, &req.shared));
            let step = next(&mut attempts, judged);
            // Every step but an exact retry sends a new request (a new fence).
            match step {
                Next::Acked => {
                    let Ok(ApplyAnswer::Ack(ack)) = answer else { unreachable!("judged as an ACK") };
                    let repaired = !drifted.is_empty();
                    return span.in_scope(|| self.acked(ep, render, &req.shared, ack, started, repaired));
                }
                Next::Rejected => {
                    let Ok(ApplyAnswer::Nack(n)) = answer else { unreachable!("judged as a NACK") };
                    return span.in_scope(|| self.rejected(ep, &req.shared, n));
                }
                Next::Fail(why) => {
                    lock(&self.known).remove(&ep.name);
                    return span.in_scope(|| self.fail(ep, why));
                }
                Next::ExactRetry => {
                    self.metrics.apply_retries.inc();
                    let backoff = TRANSPORT_RETRY_BACKOFF * u32::try_from(attempts.transport_retries()).unwrap_or(1);
                    span.in_scope(|| {
                        warn!(?backoff, "no answer to the apply; sending the same apply again (same fence and plan)")
                    });
                    tokio::time::sleep(backoff).await;
                    continue;
                }
                Next::Reclaim { seen } => {
                    if let Err(why) = self.fence.reclaim(&seen).await {
                        return self.stand_down(ep, why);
                    }
                    let epoch = self.fence.epoch();
                    self.board.controller(|c| c.epoch = epoch);
                }
                Next::Rediff => {
                    let s = match self.read_state(ep, true).await {
                        Ok(s) => s,
                        Err(e) => return self.fail(ep, e),
                    };
                    let k = Known::of(&s);
                    if k.applied == Some(target) && differing(&k.files, render).is_empty() {
                        return self.unchanged(ep, render).await;
                    }
                    pd = self.diff_for(&ep.name, &k, render, shared);
                    pod_files = k.files;
                }
                Next::CompleteState(why) => pd = PodDiff::own(complete_state(why)),
                Next::Resend { forget_pod_files, .. } => {
                    if forget_pod_files {
                        pod_files.clear();
                    }
                }
            }
            req = match self.request(render, &pd, &pod_files, attempts.extra(), shared) {
                Ok(req) => req,
                Err(why) => return self.no_request(ep, why),
            };
        }
    }

    /// What the pod knows for a deployment: its last state read or ACK for a normal one, else
    /// (or when unknown) its state read now, verified for a drift pass.
    async fn know(&self, ep: &Endpoint, kind: DeployKind) -> Result<Known, String> {
        let known = lock(&self.known).get(&ep.name).cloned();
        match (known, kind) {
            (Some(k), DeployKind::Normal) => Ok(k),
            _ => self.read_state(ep, kind == DeployKind::Drift).await.map(|s| Known::of(&s)),
        }
    }

    /// The answer to an apply as [`crate::attempt::next`] reads it, counted in the metrics.
    fn judge_answer(&self, answer: &Result<ApplyAnswer, CallError>, req: &SharedRequest) -> Answer {
        match answer {
            Ok(ApplyAnswer::Ack(_)) => Answer::Ack,
            Ok(ApplyAnswer::Nack(_)) => Answer::Nack,
            Ok(ApplyAnswer::Conflict(c)) => {
                self.metrics.apply(req.mode.as_str(), "conflict");
                self.metrics.conflicts.get_or_create(&ConflictLabel { conflict: c.conflict.as_str().into() }).inc();
                info!(conflict = c.conflict.as_str(), "409: {}", c.error);
                Answer::Conflict { kind: c.conflict, fence: c.fence.clone(), missing: c.missing.clone() }
            }
            Ok(ApplyAnswer::HaproxyDown(why)) => {
                // HAProxy down on the pod is a real answer: the pod fails at once.
                self.metrics.apply(req.mode.as_str(), "error");
                Answer::Refused(why.clone())
            }
            Ok(ApplyAnswer::Refused { status, error }) => {
                self.metrics.apply(req.mode.as_str(), "error");
                if *status >= 500 {
                    // No real answer (a proxy, an overloaded agent): retry the same apply.
                    Answer::Transport(error.clone())
                } else {
                    Answer::Refused(error.clone())
                }
            }
            Err(e) => {
                self.metrics.apply(req.mode.as_str(), "error");
                Answer::Transport(e.to_string())
            }
        }
    }

    /// A NACK: HAProxy's words into the pod's status; nothing stayed changed on the pod.
    fn rejected(&self, ep: &Endpoint, req: &SharedRequest, n: haptic_protocol::Nack) -> PodOutcome {
        self.metrics.apply(req.mode.as_str(), "nack");
        self.metrics.pod_apply_rejected(&ep.name);
        // Drop the pod's baseline: what the controller believed it holds. The next deployment
        // re-reads its state (a NACK leaves the pod as it was).
        lock(&self.known).remove(&ep.name);
        let words = if n.haproxy_output.trim().is_empty() { n.reason.clone() } else { n.haproxy_output.clone() };
        warn!(pod = %ep.name, "HAProxy refused the plan: {}: {words}", n.reason);
        // The pod still holds and runs its previous plan: its mode, reasons and last apply stay
        // those of that plan; the refusal is the error.
        self.board.pod(&ep.name, |p| {
            p.phase = Phase::Rejected;
            p.last_error = Some(format!("{}: {words}", n.reason));
        });
        PodOutcome::Rejected(words)
    }

    /// The pod already holds the render: converged if it runs it, else followed up.
    async fn unchanged(&self, ep: &Endpoint, render: &Bundle) -> PodOutcome {
        // A fresh read tells whether it runs it (a known pod may have reloaded since).
        let s = match self.read_state(ep, false).await {
            Ok(s) => s,
            Err(e) => return self.fail(ep, e),
        };
        let target = render.plan_id();
        if s.running.as_ref().map(|r| r.plan_id) == Some(target) {
            self.board.pod(&ep.name, |p| p.phase = Phase::Converged);
            PodOutcome::Unchanged
        } else {
            let mode = s.applied.as_ref().map(|a| a.mode).unwrap_or(Mode::Reload);
            self.board.pod(&ep.name, |p| p.phase = Phase::ReloadPending);
            PodOutcome::ReloadPending { mode, due_in_ms: s.pending_reload.as_ref().map_or(0, |r| r.due_in_ms) }
        }
    }

    fn acked(
        &self,
        ep: &Endpoint,
        render: &Arc<Bundle>,
        req: &SharedRequest,
        ack: Ack,
        started: Instant,
        repaired: bool,
    ) -> PodOutcome {
        let target = render.plan_id();
        self.metrics.apply(ack.mode.as_str(), "ack");
        if ack.mode != Mode::Reload {
            self.metrics.reloads_avoided.inc();
        }
        self.metrics.reload_causes(&landed_reload_causes(req.mode, &req.causes, ack.mode));
        if repaired {
            self.metrics.drift_repairs.inc();
        }
        {
            let mut known = lock(&self.known);
            if let Some(k) = known.get_mut(&ep.name) {
                k.applied = Some(target);
                k.files = req.files.clone();
                k.blob = req.blob.clone();
            }
        }
        // A reload state this controller does not know is followed up like a scheduled one.
        let scheduled = ack.reload.as_ref().filter(|r| r.state != haptic_protocol::ReloadState::Done);
        let due_in_ms = scheduled.and_then(|r| r.due_in_ms).unwrap_or(0);
        let converged = ack.running == Some(target);
        info!(pod = %ep.name, plan = %target.short(), mode = %ack.mode, converged, "ACK");
        if ack.mode != req.mode {
            warn!(pod = %ep.name, plan = %target.short(), asked = %req.mode, mode = %ack.mode, reasons = ?ack.reasons,
                "the agent landed the apply in another mode than asked");
        }
        self.board.pod(&ep.name, |p| {
            p.applied = Some(ack.applied);
            p.running = ack.running;
            p.mode = Some(ack.mode);
            p.reasons = ack.reasons.clone();
            p.last_error = None;
            p.last_apply_at = Some(now_rfc3339());
            p.last_apply_duration_ms = Some(started.elapsed().as_millis() as u64);
            p.pending_reload = scheduled.map(|_| haptic_protocol::PendingReload { plan_id: target, due_in_ms });
            p.phase = if converged { Phase::Converged } else { Phase::ReloadPending };
        });
        if converged {
            PodOutcome::Converged(ack.mode)
        } else {
            PodOutcome::ReloadPending { mode: ack.mode, due_in_ms }
        }
    }

    /// Follows up a pod's scheduled reload in the background, superseding any older follow-up.
    fn spawn_follow_up(self: &Arc<Self>, ep: Endpoint, target: PlanId, mode: Mode, due_in_ms: u64, sync: Duration) {
        let ticket = lock(&self.follow_ups).issue(&ep.name, target);
        let me = self.clone();
        let span = tracing::info_span!("follow_up", pod = %ep.name, plan = %target.short());
        let name = ep.name.clone();
        let task = tokio::spawn(
            async move {
                let stop = me.stop.clone();
                tokio::select! {
                    _ = stop.cancelled() => {}
                    () = me.follow_up(&ep, &ticket, mode, due_in_ms, sync) => {}
                }
            }
            .instrument(span),
        );
        // One poller per pod: the superseded one stops now, not at its next poll.
        if let Some(old) = lock(&self.pollers).insert(name, task.abort_handle()) {
            old.abort();
        }
    }

    /// Stops the pod's poller (a newer apply supersedes its follow-up).
    fn stop_poller(&self, pod: &str) {
        lock(&self.follow_ups).supersede(pod);
        if let Some(old) = lock(&self.pollers).remove(pod) {
            old.abort();
        }
    }

    /// Polls a pod until it runs the ticket's plan (converged), its applied plan moves on, or the
    /// deadline (`due_in_ms` + `sync`, the sync timeout) passes (failed); returns quietly once
    /// superseded.
    async fn follow_up(&self, ep: &Endpoint, ticket: &Ticket, mode: Mode, due_in_ms: u64, sync: Duration) {
        let due_in = Duration::from_millis(due_in_ms);
        let deadline = Instant::now() + due_in + sync;
        let target = ticket.plan;
        for polls in 0u32.. {
            tokio::time::sleep(poll_delay(polls, due_in)).await;
            if !lock(&self.follow_ups).is_current(ticket) {
                return;
            }
            let answer = self.client.state(ep, false).await;
            let poll = match &answer {
                Ok(s) => Poll::State {
                    applied: s.applied.as_ref().map(|a| a.plan_id),
                    running: s.running.as_ref().map(|r| r.plan_id),
                    last_error: s.last_error.clone(),
                },
                Err(e) => Poll::Unreachable(e.to_string()),
            };
            let step = judge(target, poll, Instant::now() >= deadline);
            // Judged and recorded under the tickets' lock, so a newer apply that supersedes this
            // follow-up never sees its board entry overwritten by a stale answer.
            {
                let mut tickets = lock(&self.follow_ups);
                if !tickets.is_current(ticket) {
                    return;
                }
                if let Ok(s) = &answer {
                    self.board.pod(&ep.name, |p| p.observe(s));
                }
                match &step {
                    Step::Wait => continue,
                    Step::Converged => {
                        info!(mode = %mode, "the paced reload ran");
                        self.board.pod(&ep.name, |p| {
                            p.phase = Phase::Converged;
                            p.pending_reload = None;
                        });
                    }
                    Step::Failed(why) => {
                        lock(&self.known).remove(&ep.name);
                        warn!(pod = %ep.name, "follow-up failed: {why}");
                        self.board.pod(&ep.name, |p| {
                            p.phase = Phase::Failed;
                            p.last_error = Some(why.to_string());
                        });
                    }
                }
                tickets.close(ticket);
            }
            self.refresh_gauges();
            if let Some(tx) = lock(&self.follow_up_events).as_ref() {
                let _ = tx.send(FollowUpEnd { pod: ep.name.clone(), plan: target, converged: step == Step::Converged });
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_counts_for_the_diffs_causes_or_for_the_agents_fallback() {
        let frontend = BTreeSet::from([ReloadCause::Config(haptic_haproxy::claim::ConfigPart::Frontend)]);
        assert_eq!(landed_reload_causes(Mode::Reload, &frontend, Mode::Reload), frontend);
        let fallback = BTreeSet::from([ReloadCause::AgentFallback]);
        assert_eq!(landed_reload_causes(Mode::Runtime, &BTreeSet::new(), Mode::Reload), fallback);
        assert_eq!(landed_reload_causes(Mode::FileOnly, &BTreeSet::new(), Mode::Reload), fallback);
        assert!(landed_reload_causes(Mode::Runtime, &BTreeSet::new(), Mode::Runtime).is_empty());
        // A runtime landing of an apply asked as a reload (none in practice) counts no reload.
        assert!(landed_reload_causes(Mode::Reload, &frontend, Mode::Runtime).is_empty());
    }

    #[test]
    fn every_deployment_result_has_a_series_from_the_start() {
        use DeploymentResult::*;
        let labels: Vec<&str> = [Success, Partial, Failed, StoodDown, Timeout].map(DeploymentResult::as_str).into();
        let mut want = crate::metrics::DEPLOYMENT_RESULTS.to_vec();
        want.sort_unstable();
        let mut got = labels.clone();
        got.sort_unstable();
        assert_eq!(got, want);
    }

    fn r(n: u32) -> Bundle {
        let cfg = format!("global\n  maxconn {n}\n");
        Bundle::from_texts([("haproxy.cfg", cfg.as_str()), ("maps/a.map", "k v\n")]).unwrap()
    }

    #[test]
    fn differing_files() {
        let a = r(1);
        assert!(differing(a.manifest(), &a).is_empty());
        let b = r(2);
        let d: Vec<String> = differing(b.manifest(), &a).into_iter().map(|p| p.to_string()).collect();
        assert_eq!(d, vec!["haproxy.cfg"]);
        let mut extra = a.manifest().to_vec();
        extra.push(FileEntry {
            path: RelPath::new("x.txt").unwrap(),
            digest: haptic_protocol::Digest::of(b""),
            size: 0,
        });
        assert_eq!(differing(&extra, &a).len(), 1);
        assert_eq!(differing(&[], &a).len(), 2);
    }

    #[test]
    fn plan_cache_keeps_the_newest_and_the_plans_pods_hold() {
        let mut c = PlanCache::default();
        let renders: Vec<Bundle> = (0..(PLAN_CACHE as u32 + 2)).map(r).collect();
        let none = HashSet::new();
        for x in &renders[..4] {
            c.insert(Arc::new(Baseline::of_render(x)), &none);
            // Keep the first one hot: it stays among the newest.
            assert!(c.get(renders[0].plan_id()).is_some());
        }
        assert_eq!(c.entries.len(), PLAN_CACHE_NEWEST);
        assert!(c.get(renders[1].plan_id()).is_none(), "the least recently used is evicted");
        // A plan a pod holds stays however many renders come after it, up to the bound.
        let held: HashSet<PlanId> = renders.iter().map(Bundle::plan_id).collect();
        for x in &renders {
            c.insert(Arc::new(Baseline::of_render(x)), &held);
        }
        assert_eq!(c.entries.len(), PLAN_CACHE);
        assert!(c.get(renders[0].plan_id()).is_none() && c.get(renders[2].plan_id()).is_some());
        // Once no pod holds them, only the newest two (the one just inserted and the one just
        // used) and the one still held stay.
        let one_held: HashSet<PlanId> = [renders[3].plan_id()].into();
        c.insert(Arc::new(Baseline::of_render(&renders[5])), &one_held);
        let kept: Vec<PlanId> = c.entries.iter().map(|e| e.plan_id).collect();
        assert_eq!(kept, [renders[5].plan_id(), renders[2].plan_id(), renders[3].plan_id()]);
    }

    #[test]
    fn report_results() {
        let rep = |o: Vec<PodOutcome>| DeploymentReport {
            plan: r(1).plan_id(),
            pods: o.into_iter().enumerate().map(|(i, o)| (format!("p{i}"), o)).collect(),
            duration: Duration::ZERO,
            reloads_due_in: None,
        };
        use DeploymentResult::*;
        assert_eq!(rep(vec![PodOutcome::Unchanged, PodOutcome::Converged(Mode::Runtime)]).result(), Success);
        assert_eq!(rep(vec![PodOutcome::Unchanged, PodOutcome::Failed("x".into())]).result(), Partial);
        assert_eq!(rep(vec![PodOutcome::Rejected("x".into())]).result(), Failed);
        let sd = rep(vec![PodOutcome::Unchanged, PodOutcome::StoodDown("other".into())]);
        assert_eq!((sd.result(), sd.stood_down()), (StoodDown, Some("other")));
        // The text is public (a metric label, the status JSON): it stays these words.
        let words: Vec<String> = [Success, Partial, Failed, StoodDown, Timeout]
            .iter()
            .map(|r| format!("{r}|{}", serde_json::to_string(r).unwrap()))
            .collect();
        assert_eq!(
            words,
            [
                "success|\"success\"",
                "partial|\"partial\"",
                "failed|\"failed\"",
                "stood_down|\"stood_down\"",
                "timeout|\"timeout\""
            ]
        );
    }
}
