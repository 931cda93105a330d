//! The apply pipeline and the agent's live state (BRIEF §3–§4).
//!
//! Owns [`Agent`]: crash recovery on start, the serialized all-or-nothing apply (fence → persist
//! → baseline → stage → mode → check → swap → record → runtime ops / paced reload → ACK), the
//! background paced-reload task, restoring the last good tree after a failed reload, and the
//! `/v1/state` snapshot that never waits behind an apply. It must never speak HTTP (see
//! [`crate::api`]) nor parse HAProxy's replies itself (see [`crate::reload`], [`crate::runtime`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use haptic_haproxy::claim::{verify_runtime_claim, ChangedFile};
use haptic_protocol::api::{
    AgentInfo, AppliedInfo, Conflict, ConflictKind, HaproxyInfo, Nack, PendingReload, ReloadState, ReloadStatus,
    RunningInfo, StateResponse,
};
use haptic_protocol::{Ack, ApplyRequest, Capabilities, FileEntry, Mode, Op, RelPath, API_VERSION};
use tracing::{info, warn, Instrument};

use crate::check::check_tree;
use crate::error::AgentError;
use crate::master::MasterCli;
use crate::metrics::Metrics;
use crate::pacer::{PaceDecision, Pacer};
use crate::reload::{probe, reload_verified, Probe, ReloadError};
use crate::store::{baseline_check, fence_step, AppliedRecord, FenceStep, GoodRecord, LastAccepted, Persisted, Store};
use crate::tree::{hash_dir, plan_tree, StageError, Stamps, Tree};

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
}

impl Refusal {
    /// The one-line error text.
    pub fn message(&self) -> String {
        match self {
            Refusal::BadRequest(m) | Refusal::Internal(m) => m.clone(),
            Refusal::Conflict(c) => c.error.clone(),
            Refusal::Nack(n) => n.error.clone(),
        }
    }

    /// The label for metrics.
    fn result(&self) -> &'static str {
        match self {
            Refusal::BadRequest(_) => "bad_request",
            Refusal::Conflict(_) => "conflict",
            Refusal::Nack(_) => "nack",
            Refusal::Internal(_) => "error",
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
    snapshot: RwLock<Persisted>,
    pacer: Mutex<Pacer>,
    probe: RwLock<Option<Probe>>,
    wake: tokio::sync::Notify,
    /// Stamps of the files of one tree (by id) the agent wrote or hashed itself; only ever
    /// trusted for that tree. Empty after a start, so the first apply hashes what it carries.
    stamps: Mutex<(String, Stamps)>,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Agent {
    /// Opens the root: clears staging leftovers, reconciles `.state` with `current` (trusting
    /// `current` after a crash) and persists the reconciled record. Does not talk to HAProxy.
    pub fn open(cfg: AgentConfig, metrics: Arc<Metrics>) -> Result<Arc<Self>, AgentError> {
        let tree = Tree::new(&cfg.root);
        let store = Store::new(&cfg.root);
        let p = recover(&tree, &store)?;
        let cli = MasterCli::new(&cfg.master_socket, Duration::from_secs(5));
        let state_cli = MasterCli::new(&cfg.master_socket, Duration::from_millis(1500));
        if let Some(a) = &p.applied {
            metrics.tree(a.files.len(), a.files.iter().map(|f| f.size).sum());
        }
        let pacer = Pacer::new(cfg.min_reload_interval);
        Ok(Arc::new(Self {
            cfg,
            tree,
            store,
            cli,
            state_cli,
            metrics,
            snapshot: RwLock::new(p.clone()),
            inner: tokio::sync::Mutex::new(Inner { p }),
            pacer: Mutex::new(pacer),
            probe: RwLock::new(None),
            wake: tokio::sync::Notify::new(),
            stamps: Mutex::new((String::new(), Stamps::new())),
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
            me.converge_after_start().await;
            me.reload_loop().await;
        })
    }

    /// HAProxy's version, probing when unknown.
    async fn version(&self) -> Option<(u32, u32, u32)> {
        if let Some(p) = self.probe.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            return Some(p.version);
        }
        match probe(&self.cli).await {
            Ok(p) => {
                let v = p.version;
                *self.probe.write().unwrap_or_else(|e| e.into_inner()) = Some(p);
                Some(v)
            }
            Err(e) => {
                warn!(root = %self.cfg.root.display(), "cannot probe HAProxy: {e}");
                None
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        match self.probe.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(p) => crate::runtime::capabilities(p.version),
            None => Capabilities::default(),
        }
    }

    fn publish(&self, p: &Persisted) {
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = p.clone();
    }

    fn save(&self, p: &Persisted) -> Result<(), AgentError> {
        self.store.save(p)?;
        self.publish(p);
        Ok(())
    }

    /// After a restart, a running plan that is not the applied one is reloaded (paced).
    async fn converge_after_start(&self) {
        let mut inner = self.inner.lock().await;
        let Some(applied) = inner.p.applied.as_ref().map(|a| a.plan_id) else { return };
        if inner.p.running == Some(applied) {
            return;
        }
        info!(root = %self.cfg.root.display(), plan = %applied.short(), "running plan unknown or behind after start: reloading");
        let decision = lock(&self.pacer).request(Instant::now(), applied);
        match decision {
            PaceDecision::ReloadNow => {
                let _ = self.run_reload(&mut inner.p).await;
            }
            PaceDecision::Scheduled { .. } => self.wake.notify_one(),
        }
    }

    /// Runs scheduled reloads when they come due (forever).
    async fn reload_loop(&self) {
        loop {
            let due = lock(&self.pacer).due(Instant::now());
            self.metrics.pending_reload.set(i64::from(due.is_some()));
            match due {
                None => self.wake.notified().await,
                Some((_, d)) if !d.is_zero() => {
                    tokio::select! {
                        _ = tokio::time::sleep(d) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                Some(_) => {
                    let mut inner = self.inner.lock().await;
                    let taken = lock(&self.pacer).take_due(Instant::now());
                    if taken.is_some() {
                        self.metrics.pending_reload.set(0);
                        let plan = inner.p.applied.as_ref().map(|a| a.plan_id);
                        let span = tracing::info_span!("paced_reload", pod = %self.cfg.pod, plan = %plan.map(|p| p.short()).unwrap_or_default());
                        let _ = self.run_reload(&mut inner.p).instrument(span).await;
                    } else {
                        drop(inner);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }
    }

    /// Handles one apply to completion. Runs in its own task so a client that goes away never
    /// cuts an apply in half.
    pub async fn apply(self: &Arc<Self>, req: ApplyRequest) -> Result<Ack, Refusal> {
        let me = self.clone();
        let span = tracing::info_span!(
            "apply",
            pod = %self.cfg.pod,
            plan = %req.plan_id.short(),
            fence = %format!("{}/{}/{}", req.fence.epoch, req.fence.seq, req.fence.holder),
        );
        let handle = tokio::spawn(async move { me.apply_inner(req).await }.instrument(span));
        handle.await.unwrap_or_else(|e| Err(Refusal::Internal(format!("apply task failed: {e}"))))
    }

    async fn apply_inner(&self, req: ApplyRequest) -> Result<Ack, Refusal> {
        let started = Instant::now();
        let asked = req.mode;
        let res = self.apply_locked(req).await;
        match &res {
            Ok(ack) => {
                self.metrics.apply(ack.mode.as_str(), "ack");
                self.metrics.apply_duration.observe(started.elapsed().as_secs_f64());
                info!(mode = %ack.mode, reload = ?ack.reload.as_ref().map(|r| r.state), "applied");
            }
            Err(r) => {
                self.metrics.apply(asked.as_str(), r.result());
                if let Refusal::Conflict(c) = r {
                    self.metrics.conflict(c.conflict.as_str());
                }
            }
        }
        res
    }

    async fn apply_locked(&self, mut req: ApplyRequest) -> Result<Ack, Refusal> {
        let parts = req.take_checked_parts().map_err(|e| Refusal::BadRequest(e.to_string()))?;
        let mut guard = self.inner.lock().await;
        let p = &mut guard.p;
        let mut fence_dirty = false;
        let res = self.apply_fenced(p, &req, parts, &mut fence_dirty).await;
        if res.is_err() {
            // Staging linked (and removing the staged tree unlinked) live files.
            self.refresh_stamps();
            if fence_dirty {
                // A refusal still raised the high-water mark: make it durable before answering.
                self.save(p)?;
            }
        }
        res
    }

    /// The apply after the request was decoded, with the lock held. The raised fence (if any) is
    /// persisted together with the swap intent, the one write that must precede the swap;
    /// `fence_dirty` says whether it still has to be persisted.
    async fn apply_fenced(
        &self,
        p: &mut Persisted,
        req: &ApplyRequest,
        parts: BTreeMap<RelPath, Vec<u8>>,
        fence_dirty: &mut bool,
    ) -> Result<Ack, Refusal> {
        // 1. Fence, persisted before anything else.
        match fence_step(p, &req.fence, &req.plan_id) {
            FenceStep::Stale => {
                let seen = p.fence.clone();
                return Err(conflict(
                    ConflictKind::StaleEpoch,
                    p,
                    vec![],
                    format!(
                        "stale fence {}/{}/{}: the agent has seen {}",
                        req.fence.epoch,
                        req.fence.seq,
                        req.fence.holder,
                        seen.map(|f| format!("{}/{}/{}", f.epoch, f.seq, f.holder)).unwrap_or_default()
                    ),
                ));
            }
            FenceStep::Replay(ack) => {
                info!("exact retry: answering the same ACK");
                return Ok(ack);
            }
            FenceStep::Proceed { raise } => {
                if raise {
                    p.fence = Some(req.fence.clone());
                    p.last_accepted = Some(LastAccepted { fence: req.fence.clone(), plan_id: req.plan_id, ack: None });
                    *fence_dirty = true;
                }
            }
        }

        // 2. Baseline.
        if let Err(kind) = baseline_check(p.applied.as_ref().map(|a| &a.plan_id), req.baseline.as_ref()) {
            let msg = match kind {
                ConflictKind::UnknownBaseline => "the agent has no applied plan: send the complete state".to_string(),
                _ => format!(
                    "baseline {} is not the applied plan {}",
                    req.baseline.map(|b| b.to_string()).unwrap_or_default(),
                    p.applied.as_ref().map(|a| a.plan_id.to_string()).unwrap_or_default()
                ),
            };
            return Err(conflict(kind, p, vec![], msg));
        }

        // 3. Plan and stage the new tree.
        let live_files: Vec<FileEntry> = p.applied.as_ref().map(|a| a.files.clone()).unwrap_or_default();
        let sent: BTreeSet<RelPath> = parts.keys().cloned().collect();
        let plan = plan_tree(&req.files, &sent, &live_files);
        if !plan.missing.is_empty() {
            let msg = format!("{} desired file(s) neither sent nor present", plan.missing.len());
            return Err(conflict(ConflictKind::MissingParts, p, plan.missing, msg));
        }
        let live_id = self.tree.live_id()?;
        let live_dir = live_id.as_deref().map(|l| self.tree.dir_of(l));
        let trusted = {
            let st = lock(&self.stamps);
            if live_id.as_deref() == Some(st.0.as_str()) {
                st.1.clone()
            } else {
                Stamps::new()
            }
        };
        let id = Tree::new_id();
        let new_stamps: Stamps;
        let syncing: tokio::task::JoinHandle<Result<(), AgentError>>;
        let staged = {
            let (tree, id, files, live_dir) = (self.tree.clone(), id.clone(), req.files.clone(), live_dir.clone());
            tokio::task::spawn_blocking(move || tree.build(&id, &files, parts, &plan, live_dir.as_deref(), &trusted))
                .await
                .map_err(|e| Refusal::Internal(format!("staging task failed: {e}")))?
        };
        let staged_dir = match staged {
            Ok((d, stamps, unsynced)) => {
                new_stamps = stamps;
                // The new tree's fsyncs run while the mode is decided and the intent persisted;
                // the swap waits for them.
                syncing = tokio::task::spawn_blocking(move || unsynced.sync());
                d
            }
            Err(StageError::Missing(m)) => {
                let msg = format!("{} file(s) in the live tree do not match their digest: send them", m.len());
                return Err(conflict(ConflictKind::MissingParts, p, m, msg));
            }
            Err(StageError::Agent(e)) => return Err(e.into()),
        };

        // 4. Decide the mode.
        let read_cfg = |dir: &Option<PathBuf>| {
            dir.as_ref().and_then(|d| std::fs::read_to_string(d.join("haproxy.cfg")).ok()).unwrap_or_default()
        };
        let old_cfg = read_cfg(&live_dir);
        let new_cfg = read_cfg(&Some(staged_dir.clone()));
        let ops: Vec<Op> = req.ops().cloned().collect();
        let mut reasons = req.reasons.clone();
        let mode = self.decide_mode(req, &live_files, &old_cfg, &new_cfg, &staged_dir, &ops, &mut reasons);

        // 5. Check whatever will be loaded by a reload (or lies on disk for file_only).
        if mode != Mode::Runtime {
            if let Err(e) = check_tree(&self.cfg.haproxy_bin, &staged_dir).await {
                let _ = syncing.await;
                let _ = self.tree.remove(&id);
                return Err(Refusal::Nack(Box::new(Nack {
                    error: "haproxy -c refused the config".into(),
                    rejected: true,
                    haproxy_output: e.output,
                    reason: "check: haproxy -c failed".into(),
                })));
            }
        }
        if mode == Mode::Reload && self.cfg.bind_precheck {
            if let Err(e) = crate::check::precheck_binds(&old_cfg, &new_cfg) {
                let _ = syncing.await;
                let _ = self.tree.remove(&id);
                return Err(Refusal::Nack(Box::new(Nack {
                    error: "a port the new config binds is already in use".into(),
                    rejected: true,
                    haproxy_output: e.output,
                    reason: "bind pre-check: a new bind address is held by another socket".into(),
                })));
            }
        }

        // 6. Swap and record.
        let mut files = req.files.clone();
        files.sort_by(|a, b| a.path.as_str().as_bytes().cmp(b.path.as_str().as_bytes()));
        let record = AppliedRecord {
            plan_id: req.plan_id,
            blob: req.blob.clone(),
            mode,
            at: now_rfc3339(),
            files,
            tree: id.clone(),
        };
        // One durable write carries the raised fence and the intent: both must be on disk before
        // `current` moves. After the swap, recovery trusts `current` plus this intent, so the
        // applied record is persisted with the ACK below (before it is answered).
        p.intent = Some(record.clone());
        let saved = self.store.save(p);
        let synced = syncing.await.map_err(|e| AgentError::Tree(format!("fsync task failed: {e}"))).and_then(|r| r);
        if let Err(e) = saved.and(synced) {
            p.intent = None;
            let _ = self.tree.remove(&id);
            return Err(e.into());
        }
        self.publish(p);
        *fence_dirty = false;
        self.tree.swap(&id)?;
        *lock(&self.stamps) = (id.clone(), new_stamps);
        let prev = p.applied.replace(record).map(|a| a.plan_id);
        p.intent = None;
        self.publish(p);
        self.metrics.tree(req.files.len(), req.files.iter().map(|f| f.size).sum());
        self.gc(p);

        // 7. Land it.
        let running_was_prev = p.running.is_some() && p.running == prev || (p.running.is_none() && prev.is_none());
        let mut final_mode = mode;
        let mut reload = None;
        match mode {
            Mode::FileOnly => {
                self.advance_running(p, running_was_prev);
                self.metrics.reloads_avoided.inc();
            }
            Mode::Runtime => match self.run_ops(&staged_dir, &ops).await {
                Ok(()) => {
                    self.advance_running(p, running_was_prev);
                    self.metrics.reloads_avoided.inc();
                }
                Err(why) => {
                    warn!("runtime op failed, reloading from the tree: {why}");
                    reasons.push(format!("runtime op failed, reloading from the tree: {why}"));
                    final_mode = Mode::Reload;
                    if let Some(a) = p.applied.as_mut() {
                        a.mode = Mode::Reload;
                    }
                    self.save(p)?;
                    if let Err(e) = check_tree(&self.cfg.haproxy_bin, &staged_dir).await {
                        // The tree is not loadable: put the last good tree back and reset the
                        // worker's runtime state to it.
                        self.restore_last_good(p, &e.output)?;
                        lock(&self.pacer).started(Instant::now());
                        let _ = self.reload_once(p).await;
                        return Err(Refusal::Nack(Box::new(Nack {
                            error: "haproxy -c refused the config after a runtime op failed".into(),
                            rejected: true,
                            haproxy_output: e.output,
                            reason: format!("runtime op failed ({why}) and the tree does not pass haproxy -c"),
                        })));
                    }
                    reload = Some(self.reload_paced(p).await?);
                }
            },
            Mode::Reload => reload = Some(self.reload_paced(p).await?),
        }

        self.gc(p);
        let ack = Ack { applied: req.plan_id, running: p.running, mode: final_mode, reasons, reload };
        if let Some(la) = p.last_accepted.as_mut() {
            if la.fence == req.fence && la.plan_id == req.plan_id {
                la.ack = Some(ack.clone());
            }
        }
        self.save(p)?;
        Ok(ack)
    }

    #[allow(clippy::too_many_arguments)]
    fn decide_mode(
        &self,
        req: &ApplyRequest,
        live_files: &[FileEntry],
        old_cfg: &str,
        new_cfg: &str,
        staged_dir: &std::path::Path,
        ops: &[Op],
        reasons: &mut Vec<String>,
    ) -> Mode {
        let old: BTreeMap<&RelPath, &FileEntry> = live_files.iter().map(|f| (&f.path, f)).collect();
        let new: BTreeMap<&RelPath, &FileEntry> = req.files.iter().map(|f| (&f.path, f)).collect();
        let mut changed_paths: Vec<&RelPath> = Vec::new();
        for (path, f) in &new {
            if !path.is_haproxy_cfg() && old.get(path).is_none_or(|o| o.digest != f.digest) {
                changed_paths.push(path);
            }
        }
        for path in old.keys() {
            if !path.is_haproxy_cfg() && !new.contains_key(path) {
                changed_paths.push(path);
            }
        }
        let cfg_changed = old_cfg != new_cfg;
        match req.mode {
            Mode::Reload => Mode::Reload,
            Mode::FileOnly => {
                if cfg_changed {
                    reasons.push("file_only refused: haproxy.cfg changed, reloading".into());
                    return Mode::Reload;
                }
                if !ops.is_empty() {
                    reasons.push("file_only refused: the apply carries runtime ops, reloading".into());
                    return Mode::Reload;
                }
                let loaded = haptic_haproxy::cfg::referenced_paths(new_cfg, changed_paths.iter().copied());
                if !loaded.is_empty() {
                    let list: Vec<String> = loaded.iter().map(|p| p.to_string()).collect();
                    reasons.push(format!("file_only refused: the config loads {}, reloading", list.join(", ")));
                    return Mode::Reload;
                }
                Mode::FileOnly
            }
            Mode::Runtime => {
                let caps = self.capabilities();
                let mut why: Vec<String> = Vec::new();
                if self.probe.read().unwrap_or_else(|e| e.into_inner()).is_none() {
                    why.push("HAProxy version unknown".into());
                }
                for op in ops {
                    match op.kind() {
                        Some(k) if caps.supports(k) => {}
                        _ => why.push(format!("op kind {} is not supported here", op.kind_name())),
                    }
                }
                // Bytes of each changed file, from the staged (verified) tree.
                let bytes: Vec<(&RelPath, Option<Vec<u8>>)> = changed_paths
                    .iter()
                    .map(|p| {
                        let b =
                            if new.contains_key(p) { std::fs::read(staged_dir.join(p.as_str())).ok() } else { None };
                        (*p, b)
                    })
                    .collect();
                let changed: Vec<ChangedFile<'_>> =
                    bytes.iter().map(|(p, b)| ChangedFile { path: p, new: b.as_deref() }).collect();
                if let Err(e) = verify_runtime_claim(old_cfg, new_cfg, &changed, ops) {
                    why.extend(e.reasons);
                }
                if why.is_empty() {
                    Mode::Runtime
                } else {
                    reasons.push(format!("runtime claim not verified, checked reload instead: {}", why.join("; ")));
                    Mode::Reload
                }
            }
        }
    }

    async fn run_ops(&self, tree_dir: &std::path::Path, ops: &[Op]) -> Result<(), String> {
        let Some(version) = self.version().await else {
            return Err("HAProxy version unknown".into());
        };
        match crate::runtime::run_ops(&self.cli, version, tree_dir, ops).await {
            Ok(_) => {
                for op in ops {
                    self.metrics.op(op.kind_name(), "ok");
                }
                Ok(())
            }
            Err(e) => {
                for op in ops.iter().take(e.index) {
                    self.metrics.op(op.kind_name(), "ok");
                }
                self.metrics.op(&e.kind, "failed");
                Err(e.to_string())
            }
        }
    }

    /// running := applied when the worker ran the previous applied plan (runtime/file_only land
    /// on top of it); the applied tree becomes the last good one.
    fn advance_running(&self, p: &mut Persisted, running_was_prev: bool) {
        if running_was_prev {
            if let Some(a) = p.applied.clone() {
                p.running = Some(a.plan_id);
                p.last_good = Some(GoodRecord { tree: a.tree.clone(), applied: Some(a) });
            }
        }
    }

    /// Asks the pacer; reloads now or schedules.
    async fn reload_paced(&self, p: &mut Persisted) -> Result<ReloadStatus, Refusal> {
        let plan = p.applied.as_ref().map(|a| a.plan_id).ok_or_else(|| Refusal::Internal("nothing applied".into()))?;
        let decision = lock(&self.pacer).request(Instant::now(), plan);
        match decision {
            PaceDecision::ReloadNow => match self.run_reload(p).await {
                Ok(()) => Ok(ReloadStatus { state: ReloadState::Done, due_in_ms: None }),
                Err(output) => Err(Refusal::Nack(Box::new(Nack {
                    error: "HAProxy refused the reload; the last good tree is live again".into(),
                    rejected: true,
                    haproxy_output: output,
                    reason: "reload failed".into(),
                }))),
            },
            PaceDecision::Scheduled { due_in, replaced } => {
                if replaced.is_some() {
                    self.metrics.reload_coalesced.inc();
                }
                self.metrics.pending_reload.set(1);
                self.wake.notify_one();
                Ok(ReloadStatus {
                    state: ReloadState::Scheduled,
                    due_in_ms: Some(u64::try_from(due_in.as_millis()).unwrap_or(u64::MAX)),
                })
            }
        }
    }

    /// Runs one verified reload of the live tree (the pacer already counts it as started).
    /// Success: running := applied. Failure: the last good tree is restored and HAProxy's words
    /// are recorded in `last_error` and returned.
    async fn run_reload(&self, p: &mut Persisted) -> Result<(), String> {
        let res = self.reload_once(p).await;
        match res {
            Ok(()) => Ok(()),
            Err(e) => {
                let output = match &e {
                    ReloadError::Failed { output } => output.clone(),
                    other => other.to_string(),
                };
                warn!(root = %self.cfg.root.display(), "reload failed, restoring the last good tree: {output}");
                if let Err(err) = self.restore_last_good(p, &output) {
                    warn!("restoring the last good tree failed: {err}");
                }
                if !matches!(e, ReloadError::Failed { .. }) {
                    // HAProxy's state is unknown: load the restored tree.
                    lock(&self.pacer).started(Instant::now());
                    if self.reload_once(p).await.is_err() {
                        warn!("reloading back to the last good tree failed too");
                    }
                }
                Err(output)
            }
        }
    }

    /// One verified reload; records success (running, last good) or failure metrics.
    async fn reload_once(&self, p: &mut Persisted) -> Result<(), ReloadError> {
        let started = Instant::now();
        let res = match self.version().await {
            Some(v) => reload_verified(&self.cli, v, self.cfg.reload_timeout).await,
            None => Err(ReloadError::Unexpected("HAProxy version unknown (master CLI unreachable)".into())),
        };
        lock(&self.pacer).finished(Instant::now(), res.is_ok());
        let secs = started.elapsed().as_secs_f64();
        match &res {
            Ok(ok) => {
                self.metrics.reload("ok", secs);
                info!(old = ?ok.old_worker, new = ok.new_worker, took_ms = ok.took.as_millis() as u64, "reload verified");
                p.running = p.applied.as_ref().map(|a| a.plan_id);
                p.last_good = match &p.applied {
                    Some(a) => Some(GoodRecord { tree: a.tree.clone(), applied: Some(a.clone()) }),
                    None => self.tree.live_id().ok().flatten().map(|tree| GoodRecord { tree, applied: None }),
                };
                if let Err(e) = self.save(p) {
                    warn!("recording the reload failed: {e}");
                }
                self.gc(p);
                if let Ok(pr) = probe(&self.cli).await {
                    *self.probe.write().unwrap_or_else(|e| e.into_inner()) = Some(pr);
                }
            }
            Err(e) => {
                let label = if matches!(e, ReloadError::Timeout) { "timeout" } else { "failed" };
                self.metrics.reload(label, secs);
            }
        }
        res.map(|_| ())
    }

    /// Swaps the last good tree back in and makes it the applied record.
    fn restore_last_good(&self, p: &mut Persisted, why: &str) -> Result<(), AgentError> {
        p.last_error = Some(why.to_string());
        if let Some(lg) = p.last_good.clone() {
            if self.tree.dir_of(&lg.tree).is_dir() {
                self.tree.swap(&lg.tree)?;
                p.applied = lg.applied.clone();
                if let Some(a) = &lg.applied {
                    self.metrics.tree(a.files.len(), a.files.iter().map(|f| f.size).sum());
                }
            }
        }
        lock(&self.pacer).cancel_pending();
        self.metrics.pending_reload.set(0);
        self.save(p)?;
        self.gc(p);
        Ok(())
    }

    /// Keeps only the live tree and the last good one.
    fn gc(&self, p: &Persisted) {
        let live = self.tree.live_id().ok().flatten();
        let mut keep: Vec<&str> = Vec::new();
        if let Some(l) = live.as_deref() {
            keep.push(l);
        }
        if let Some(g) = p.last_good.as_ref() {
            keep.push(&g.tree);
        }
        if let Err(e) = self.tree.gc(&keep) {
            warn!("removing old trees failed: {e}");
        }
        self.refresh_stamps();
    }

    /// Re-reads the live tree's stamps after the agent linked or unlinked its files (which moves
    /// their ctime); stamps of any other tree are dropped.
    fn refresh_stamps(&self) {
        let live = self.tree.live_id().ok().flatten();
        let mut st = lock(&self.stamps);
        if live.as_deref() == Some(st.0.as_str()) {
            let (id, stamps) = &mut *st;
            self.tree.refresh_stamps(id, stamps);
        } else {
            *st = (String::new(), Stamps::new());
        }
    }

    /// `GET /v1/state`: never waits for an apply.
    pub async fn state(&self, verify: bool) -> Result<StateResponse, AgentError> {
        let snap = self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone();
        let fresh = probe(&self.state_cli).await;
        let busy = self.inner.try_lock().is_err();
        let haproxy = match &fresh {
            Ok(pr) => {
                *self.probe.write().unwrap_or_else(|e| e.into_inner()) = Some(pr.clone());
                HaproxyInfo {
                    version: pr.version_string.clone(),
                    running: true,
                    master_pid: Some(pr.master_pid),
                    worker_pid: pr.worker_pid,
                    reloads: pr.reloads,
                }
            }
            Err(_) => {
                let cached = self.probe.read().unwrap_or_else(|e| e.into_inner()).clone();
                HaproxyInfo {
                    version: cached.as_ref().map(|c| c.version_string.clone()).unwrap_or_default(),
                    // A reload in progress makes 2.6's master CLI refuse connections for a moment.
                    running: busy && cached.is_some(),
                    master_pid: cached.as_ref().map(|c| c.master_pid),
                    worker_pid: cached.as_ref().and_then(|c| c.worker_pid),
                    reloads: cached.as_ref().map_or(0, |c| c.reloads),
                }
            }
        };
        let files = if verify || snap.applied.is_none() {
            let live = self.tree.live_dir()?;
            match live {
                Some(d) => tokio::task::spawn_blocking(move || hash_dir(&d))
                    .await
                    .map_err(|e| AgentError::Tree(format!("hash task: {e}")))??,
                None => vec![],
            }
        } else {
            snap.applied.as_ref().map(|a| a.files.clone()).unwrap_or_default()
        };
        let pending = lock(&self.pacer).due(Instant::now());
        let pending_reload = pending.and_then(|(plan, d)| {
            Some(PendingReload {
                plan_id: snap.applied.as_ref().map_or(plan, |a| a.plan_id),
                due_in_ms: u64::try_from(d.as_millis()).ok()?,
            })
        });
        Ok(StateResponse {
            api: API_VERSION,
            agent: AgentInfo { version: env!("CARGO_PKG_VERSION").to_string() },
            haproxy,
            capabilities: self.capabilities(),
            fence: snap.fence.clone(),
            applied: snap.applied.as_ref().map(|a| AppliedInfo {
                plan_id: a.plan_id,
                blob: a.blob.clone(),
                mode: a.mode,
                at: a.at.clone(),
            }),
            running: snap.running.map(|plan_id| RunningInfo { plan_id }),
            pending_reload,
            files,
            verified: verify,
            last_error: snap.last_error.clone(),
        })
    }

    /// Waits for an in-flight apply or reload to finish (used on shutdown).
    pub async fn quiesce(&self) {
        let _g = self.inner.lock().await;
    }
}

/// Reconciles `.state` with `current` after a start (possibly after a crash) and persists it.
pub fn recover(tree: &Tree, store: &Store) -> Result<Persisted, AgentError> {
    let mut p = store.load()?;
    let Some(live) = tree.live_id()? else {
        return Err(AgentError::Tree(format!(
            "{} is not initialised (no current link): run `haptic-agent init`",
            tree.root().display()
        )));
    };
    let live_dir = tree.dir_of(&live);
    if !live_dir.is_dir() {
        return Err(AgentError::Tree(format!("current points to a missing tree {live}")));
    }
    let intent = p.intent.take();
    let bootstrap = p.last_good.as_ref().is_some_and(|g| g.tree == live && g.applied.is_none());
    match (&p.applied, intent) {
        (Some(a), _) if a.tree == live => {}
        (_, Some(i)) if i.tree == live => p.applied = Some(i),
        // Either the bootstrap tree, or unknown: rebuilt from disk below.
        _ => p.applied = None,
    }
    let disk = hash_dir(&live_dir)?;
    let rebuild = match &p.applied {
        Some(a) => a.files != disk,
        None => !bootstrap,
    };
    if rebuild {
        warn!(root = %tree.root().display(), tree = %live, "the applied record does not match current: rebuilding it from disk");
        p.applied = haptic_protocol::plan_id(&disk).ok().map(|plan_id| AppliedRecord {
            blob: p.applied.as_ref().filter(|a| a.plan_id == plan_id).map(|a| a.blob.clone()).unwrap_or_default(),
            plan_id,
            mode: Mode::Reload,
            at: now_rfc3339(),
            files: disk,
            tree: live.clone(),
        });
    }
    let lg_ok = p.last_good.as_ref().is_some_and(|g| tree.dir_of(&g.tree).is_dir());
    if !lg_ok {
        p.last_good = Some(GoodRecord { tree: live.clone(), applied: p.applied.clone() });
    }
    let mut keep = vec![live.as_str()];
    if let Some(g) = &p.last_good {
        keep.push(&g.tree);
    }
    tree.gc(&keep)?;
    store.save(&p)?;
    Ok(p)
}
