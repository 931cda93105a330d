//! The apply pipeline and the agent's live state.
//!
//! Owns [`Agent`]: crash recovery on start, the serialized all-or-nothing apply (fence → persist
//! → baseline → stage → mode → check → swap → record → runtime ops / paced reload → ACK), the
//! background paced-reload task, restoring the last good tree after a failed reload, and the
//! `/v1/state` snapshot that never waits behind an apply. The state outside the apply lock lives
//! in the owned parts of [`parts`]. It must never speak HTTP (see
//! [`crate::api`]) nor parse HAProxy's replies itself (see [`crate::reload`], [`crate::runtime`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use haptic_protocol::api::{Conflict, ConflictKind, Nack};
use haptic_protocol::{Ack, ApplyRequest, Capabilities, Op, RelPath};
use tracing::{info, warn, Instrument};

use crate::error::AgentError;
use crate::master::MasterCli;
use crate::metrics::Metrics;
use crate::reload::probe;
use crate::store::{Persisted, Store};
use crate::tree::{PartData, Tree};

mod admit;
mod health;
mod land;
mod mode;
mod parts;
mod recover;
mod reloading;
mod snapshot;
mod stage;

use mode::{decide_mode, ModeInputs};
use parts::{HaproxyView, Pacing, TreeCache};
pub use recover::recover;

/// How the agent is set up.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The tree root.
    pub root: PathBuf,
    /// HAProxy's master CLI socket.
    pub master_socket: PathBuf,
    /// The pod's HAProxy binary, for `haproxy -c`.
    pub haproxy_bin: PathBuf,
    /// At most one reload per this interval.
    pub min_reload_interval: Duration,
    /// How long a reload may take to be verified.
    pub reload_timeout: Duration,
    /// The pod's name in logs.
    pub pod: String,
    /// Refuse a reload whose new TCP binds are held by another socket (see [`crate::check::precheck_binds`]).
    pub bind_precheck: bool,
    /// Advertise and run `backend.add` where HAProxy can (`--runtime-backends`).
    pub runtime_backends: bool,
    /// Where config paths may point outside the tree, and where sockets may live.
    pub path_policy: haptic_haproxy::paths::PathPolicy,
    /// Directories besides the HAProxy binary's whose programs its contained `haproxy -c` may
    /// run (`--check-exec-path`: the real binary behind a wrapper script).
    pub check_exec: Vec<PathBuf>,
    /// The environment its contained `haproxy -c` gets besides a fixed `PATH`
    /// ([`crate::check::haproxy_env`] of the agent's own).
    pub check_env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

impl AgentConfig {
    /// `haproxy -c` of the tree in `dir` with the pod's binary, allowed paths, programs and
    /// environment ([`crate::check::check_tree`]).
    pub(crate) async fn check_tree(&self, dir: &std::path::Path) -> Result<Vec<String>, crate::check::CheckFailed> {
        crate::check::check_tree(&self.haproxy_bin, dir, &self.path_policy.allowed, &self.check_exec, &self.check_env)
            .await
    }
}

/// Why an apply was refused (nothing changed, except a raised fence high-water mark).
#[derive(Debug, Clone)]
pub enum Refusal {
    /// 400: malformed request.
    BadRequest(String),
    /// 409: conflicts with the agent's state.
    Conflict(Box<Conflict>),
    /// 422: HAProxy refused the config.
    Nack(Box<Nack>),
    /// 500: the agent itself failed.
    Internal(String),
    /// 503: HAProxy is not running; the tree was written (HAProxy starts on it when it restarts).
    Unavailable(String),
    /// 503: the pod is stopping and HAProxy drains its connections; nothing was written.
    Stopping,
}

impl Refusal {
    /// The one-line error text.
    pub fn message(&self) -> String {
        match self {
            Refusal::BadRequest(m) | Refusal::Internal(m) | Refusal::Unavailable(m) => m.clone(),
            Refusal::Conflict(c) => c.error.clone(),
            Refusal::Nack(n) => n.error.clone(),
            Refusal::Stopping => "the pod is stopping: HAProxy is draining its connections".to_string(),
        }
    }

    /// The label for metrics.
    fn result(&self) -> &'static str {
        match self {
            Refusal::BadRequest(_) => "bad_request",
            Refusal::Conflict(_) => "conflict",
            Refusal::Nack(_) => "nack",
            Refusal::Internal(_) => "error",
            Refusal::Unavailable(_) => "haproxy_unavailable",
            Refusal::Stopping => "stopping",
        }
    }
}

impl From<AgentError> for Refusal {
    fn from(e: AgentError) -> Self {
        Refusal::Internal(e.to_string())
    }
}

/// The authoritative record, only touched with the apply lock held.
#[derive(Debug)]
struct Inner {
    p: Persisted,
}

/// One agent: its tree, record, HAProxy and pacing.
#[derive(Debug)]
pub struct Agent {
    cfg: AgentConfig,
    tree: Tree,
    store: Store,
    cli: MasterCli,
    state_cli: MasterCli,
    metrics: Arc<Metrics>,
    inner: tokio::sync::Mutex<Inner>,
    /// The last published record: readers clone the `Arc`, writers swap it (never held across work).
    snapshot: RwLock<Arc<Persisted>>,
    /// What the agent knows of its HAProxy.
    haproxy: HaproxyView,
    /// When the next reload may run.
    pacing: Pacing,
    /// Stamps of the live tree's files and the last parsed `haproxy.cfg`.
    cache: TreeCache,
    /// Set once the pod is stopping: no apply runs after it ([`Agent::stop_applies`]).
    stopping: std::sync::atomic::AtomicBool,
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

fn conflict(kind: ConflictKind, p: &Persisted, missing: Vec<RelPath>, error: String) -> Refusal {
    Refusal::Conflict(Box::new(Conflict {
        error,
        conflict: kind,
        fence: p.fence.clone(),
        actual_baseline: p.applied.as_ref().map(|a| a.plan_id),
        missing,
    }))
}

/// Runs file-system work that blocks (fsyncs, renames, `remove_dir_all`) without stalling the
/// async runtime's other tasks (`/v1/state`, `/healthz`): on a multi-threaded runtime the worker
/// hands its other tasks to another thread first. Elsewhere (a current-thread runtime, or no
/// runtime at all) it just runs.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl Agent {
    /// Opens the root: clears staging leftovers, reconciles `.state` with `current` (trusting
    /// `current` after a crash) and persists the reconciled record. Does not talk to HAProxy.
    pub fn open(cfg: AgentConfig, metrics: Arc<Metrics>) -> Result<Arc<Self>, AgentError> {
        let tree = Tree::new(&cfg.root);
        let store = Store::new(&cfg.root);
        crate::body::Spool::clear_leftovers(&cfg.root);
        let p = recover(&tree, &store)?;
        let cli = MasterCli::new(&cfg.master_socket, Duration::from_secs(5));
        let state_cli = MasterCli::new(&cfg.master_socket, Duration::from_millis(1500));
        if let Some(a) = &p.applied {
            metrics.tree(a.files.len(), a.files.iter().map(|f| f.size).sum());
        }
        let pacing = Pacing::new(cfg.min_reload_interval);
        let haproxy = HaproxyView::new(cfg.runtime_backends);
        Ok(Arc::new(Self {
            cfg,
            tree,
            store,
            cli,
            state_cli,
            metrics,
            snapshot: RwLock::new(Arc::new(p.clone())),
            inner: tokio::sync::Mutex::new(Inner { p }),
            haproxy,
            pacing,
            cache: TreeCache::default(),
            stopping: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether the master CLI answers.
    pub async fn ready(&self) -> bool {
        self.state_cli.ping().await
    }

    /// Starts the background work: probing HAProxy, converging a running plan that lags the
    /// applied one after a restart, and running paced reloads when they come due.
    pub fn spawn_background(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let _ = me.version().await;
            me.converge().await;
            tokio::join!(me.watch_loop(), me.reload_loop());
        })
    }

    /// HAProxy's version, probing when unknown.
    async fn version(&self) -> Option<(u32, u32, u32)> {
        if let Some(v) = self.haproxy.version() {
            return Some(v);
        }
        match probe(&self.cli).await {
            Ok(p) => {
                let v = p.version;
                self.haproxy.set_probe(p);
                Some(v)
            }
            Err(e) => {
                warn!(root = %self.cfg.root.display(), "cannot probe HAProxy: {e}");
                None
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.haproxy.capabilities()
    }

    fn publish(&self, p: &Persisted) {
        let next = Arc::new(p.clone());
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = next;
    }

    /// The fence `/v1/state` shows (the last one written).
    fn shown_fence(&self) -> Option<haptic_protocol::Fence> {
        self.snapshot.read().unwrap_or_else(|e| e.into_inner()).fence.clone()
    }

    fn save(&self, p: &Persisted) -> Result<(), AgentError> {
        blocking(|| self.store.save(p))?;
        self.publish(p);
        Ok(())
    }

    /// Handles one apply to completion; its parts were decoded into `spool` as the body arrived
    /// (see [`crate::body`]), `req.parts` holds any sent inline. It runs in its own task (in a
    /// span with the pod, plan and fence) so a client that goes away never cuts an apply in
    /// half: the parts are checked, the apply lock taken and the pipeline run
    /// ([`Agent::apply_fenced`]); after a refusal the live tree's stamps are refreshed and a
    /// raised fence is on disk before the refusal is answered. The spool is removed when the
    /// apply ends.
    pub async fn apply_spooled(self: &Arc<Self>, req: ApplyRequest, spool: crate::body::Spool) -> Result<Ack, Refusal> {
        let me = self.clone();
        let span = tracing::info_span!("apply", pod = %self.cfg.pod, plan = %req.plan_id.short(), fence = %req.fence);
        let task = async move {
            let started = Instant::now();
            let asked = req.mode;
            let res = async {
                let mut req = req;
                // Everything that needs no state is checked before the lock, so a malformed
                // request changes nothing, not even the fence.
                let mut parts: BTreeMap<RelPath, PartData> = req
                    .take_checked_parts()
                    .map_err(|e| Refusal::BadRequest(e.to_string()))?
                    .into_iter()
                    .map(|(p, b)| (p, PartData::Mem(b)))
                    .collect();
                parts.extend(spool.checked(&req.files).map_err(|e| Refusal::BadRequest(e.to_string()))?);
                let mut guard = me.inner.lock().await;
                if me.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    // A reload now would start a new worker beside the draining ones.
                    return Err(Refusal::Stopping);
                }
                let p = &mut guard.p;
                let res = me.apply_fenced(p, &req, parts).await;
                if res.is_err() {
                    // Staging linked (and removing the staged tree unlinked) live files.
                    blocking(|| me.refresh_stamps());
                    // A raised fence is on disk before the refusal is answered (a runtime
                    // apply's is not written before its intent record).
                    if blocking(|| me.store.flush()).is_err() || me.shown_fence() != p.fence {
                        if let Err(e) = me.save(p) {
                            warn!("cannot persist the fence before answering a refusal: {e}");
                        }
                    }
                }
                res
            }
            .await;
            drop(spool);
            match &res {
                Ok(ack) => {
                    me.metrics.apply(ack.mode.as_str(), "ack");
                    me.metrics.apply_duration.observe(started.elapsed().as_secs_f64());
                    info!(mode = %ack.mode, reload = ?ack.reload.as_ref().map(|r| r.state), "applied");
                }
                Err(r) => {
                    me.metrics.apply(asked.as_str(), r.result());
                    if let Refusal::Conflict(c) = r {
                        me.metrics.conflict(c.conflict.as_str());
                    }
                }
            }
            res
        };
        tokio::spawn(task.instrument(span))
            .await
            .unwrap_or_else(|e| Err(Refusal::Internal(format!("apply task failed: {e}"))))
    }

    /// The pipeline, with the lock held: admit (fence, persisted; baseline) → stage → decide the
    /// mode → check → swap and record → land (runtime ops or a paced reload) → ACK.
    async fn apply_fenced(
        &self,
        p: &mut Persisted,
        req: &ApplyRequest,
        parts: BTreeMap<RelPath, PartData>,
    ) -> Result<Ack, Refusal> {
        if let Some(ack) = self.admit(p, req)? {
            return Ok(ack);
        }
        let staged = self.stage(p, req, parts).await?;
        let ops: Vec<Op> = req.ops().cloned().collect();
        let mut reasons = req.reasons.clone();
        let claim = |changed: &[haptic_haproxy::claim::ChangedFile<'_>], ops: &[Op]| {
            self.cache.runtime_claim(&staged.live_files, &staged.old_cfg, &req.files, &staged.new_cfg, changed, ops)
        };
        let caps = self.capabilities();
        let read = |p: &RelPath| std::fs::read(staged.dir.join(p.as_str())).ok();
        let (mode, why) = decide_mode(&ModeInputs {
            asked: req.mode,
            live_files: &staged.live_files,
            files: &req.files,
            old_cfg: &staged.old_cfg,
            new_cfg: &staged.new_cfg,
            ops: &ops,
            caps: &caps,
            version_known: self.haproxy.version().is_some(),
            claim: (req.mode == haptic_protocol::Mode::Runtime).then_some(&claim as &mode::RuntimeClaim<'_>),
            read: &read,
        });
        reasons.extend(why);
        let mut staged = self.check(staged, mode).await?;
        let prev = self.swap_and_record(p, req, &mut staged, mode).await?;
        let (final_mode, reload) = self.land(p, &staged, mode, prev, &ops, &mut reasons).await?;
        self.gc(p);
        // A landed apply ends whatever failure was recorded before; a checked one replaces the
        // warnings HAProxy had about the config.
        p.last_error = None;
        if let Some(w) = staged.warnings.take() {
            p.last_warnings = w;
        }
        let ack = Ack { applied: req.plan_id, running: p.running, mode: final_mode, reasons, reload };
        if let Some(la) = p.last_accepted.as_mut() {
            if la.fence == req.fence && la.plan_id == req.plan_id {
                la.ack = Some(ack.clone());
            }
        }
        // The ACK's record is written in the background: the fence and the applied plan are
        // durable already (the intent, before the swap), see `Store::save_deferred`.
        self.store.save_deferred(p);
        self.publish(p);
        Ok(ack)
    }

    /// Refuses every later apply (503) once the one in flight, if any, ends: the pod is
    /// stopping and HAProxy drains; the last state record is written.
    pub async fn stop_applies(&self) {
        let _g = self.inner.lock().await;
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Err(e) = blocking(|| self.store.flush()) {
            warn!("writing the last state record failed: {e}");
        }
    }

    /// Waits until HAProxy's master stops answering (it exits once its draining workers are
    /// gone), or `limit` passed; whether it stopped.
    pub async fn wait_haproxy_gone(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.state_cli.ping().await {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        true
    }

    /// Sets `haptic_agent_haproxy_old_workers` from the master's `show proc`.
    pub async fn count_old_workers(&self) {
        let n = match self.state_cli.master("show proc").await.map(|t| haptic_haproxy::cli::parse_show_proc(&t)) {
            Ok(Ok(p)) => i64::try_from(p.old_workers.len()).unwrap_or(i64::MAX),
            _ => -1,
        };
        self.metrics.old_workers.set(n);
    }

    /// Waits for an in-flight apply or reload to finish and for its record to be on disk (used
    /// on shutdown).
    pub async fn quiesce(&self) {
        let _g = self.inner.lock().await;
        if let Err(e) = blocking(|| self.store.flush()) {
            warn!("writing the last state record failed: {e}");
        }
    }
}
