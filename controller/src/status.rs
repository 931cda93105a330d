//! Per-pod status and the fleet roll-up, served on `GET /status` and printed as a table.
//!
//! Owns the status JSON shape (`{"pods": [...], "converged": n, "total": n, "gate": {...}}`),
//! the pure roll-up (which pods count as converged), the table, and the board's version that
//! `GET /status?after=N` waits on. It must never talk to a pod;
//! the deployer and scheduler write into the [`StatusBoard`].

use std::collections::BTreeMap;
use std::sync::Mutex;

use haptic_protocol::{Fence, Mode, PendingReload, PlanId, StateResponse};
use serde::{Deserialize, Serialize};

use crate::gate::{GateMode, Latch, Refusal};

/// How a deployment ended: the `result` label of `haptic_deployments_total` and the status's
/// `last_deployment` (`success`, `partial`, `failed`, `stood_down`, `timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentResult {
    /// Every pod ACKed (or already ran the render).
    Success,
    /// Some pods ACKed, others did not.
    Partial,
    /// No pod ACKed.
    Failed,
    /// This controller stood down during it.
    StoodDown,
    /// The deployment timeout cancelled it.
    Timeout,
}

impl DeploymentResult {
    /// The label text.
    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentResult::Success => "success",
            DeploymentResult::Partial => "partial",
            DeploymentResult::Failed => "failed",
            DeploymentResult::StoodDown => "stood_down",
            DeploymentResult::Timeout => "timeout",
        }
    }

    /// Whether some pods were left off the target (a retry with backoff follows).
    pub fn left_pods_behind(self) -> bool {
        matches!(self, DeploymentResult::Partial | DeploymentResult::Failed)
    }
}

impl std::fmt::Display for DeploymentResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a pod stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Not contacted yet.
    #[default]
    Unknown,
    /// An apply is in flight.
    Deploying,
    /// Applied and running the target plan.
    Converged,
    /// Applied; a paced reload is scheduled and followed up (neither converged nor failed).
    ReloadPending,
    /// HAProxy refused the plan (NACK); the pod keeps its previous plan.
    Rejected,
    /// The agent could not be reached or answered an error.
    Failed,
    /// The controller stood down (another holder fences this pod).
    StoodDown,
}

impl Phase {
    /// The word in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Unknown => "unknown",
            Phase::Deploying => "deploying",
            Phase::Converged => "converged",
            Phase::ReloadPending => "reload-pending",
            Phase::Rejected => "rejected",
            Phase::Failed => "failed",
            Phase::StoodDown => "stood-down",
        }
    }
}

/// One pod's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PodStatus {
    /// The endpoint name.
    pub pod: String,
    /// The agent URL.
    pub url: String,
    /// Where it stands.
    pub phase: Phase,
    /// The plan on disk.
    pub applied: Option<PlanId>,
    /// The plan the worker runs.
    pub running: Option<PlanId>,
    /// The mode of the last apply.
    pub mode: Option<Mode>,
    /// The reasons of the last apply.
    #[serde(default)]
    pub reasons: Vec<String>,
    /// A scheduled reload.
    pub pending_reload: Option<PendingReload>,
    /// The last error, in HAProxy's words where it had any (kept after the pod recovers; the
    /// table shows it only while the pod is not converged).
    pub last_error: Option<String>,
    /// When the last apply was answered (RFC 3339).
    pub last_apply_at: Option<String>,
    /// How long the last apply took.
    pub last_apply_duration_ms: Option<u64>,
    /// HAProxy's version.
    pub haproxy_version: Option<String>,
    /// The agent's version.
    pub agent_version: Option<String>,
    /// The pod's fence high-water mark.
    pub fence: Option<Fence>,
    /// HAProxy's reload counter.
    pub reloads: Option<u64>,
}

impl PodStatus {
    /// Copies what a state read tells.
    pub fn observe(&mut self, s: &StateResponse) {
        self.applied = s.applied.as_ref().map(|a| a.plan_id);
        self.running = s.running.as_ref().map(|r| r.plan_id);
        self.pending_reload = s.pending_reload.clone();
        self.haproxy_version = Some(s.haproxy.version.clone());
        self.agent_version = Some(s.agent.version.clone());
        self.fence = s.fence.clone();
        self.reloads = Some(s.haproxy.reloads);
    }
}

/// The gate's part of the status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateStatus {
    /// The resting mode.
    pub mode: GateMode,
    /// Whether the fleet is pinned on the last good render.
    pub pinned: bool,
    /// The last render that passed.
    pub last_good: Option<PlanId>,
    /// The last refused render and HAProxy's words.
    pub last_refused: Option<Refusal>,
    /// Why the render source's current content is not a render, if it is not.
    pub render_error: Option<String>,
}

impl GateStatus {
    /// From the latch.
    pub fn from_latch(l: &Latch, render_error: Option<String>) -> Self {
        GateStatus {
            mode: l.mode,
            pinned: l.pinned,
            last_good: l.last_good,
            last_refused: l.last_refused.clone(),
            render_error,
        }
    }
}

/// The controller's own part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ControllerStatus {
    /// Fence holder identity.
    pub identity: String,
    /// Current epoch.
    pub epoch: u64,
    /// Why it stood down, if it did.
    pub stood_down: Option<String>,
    /// The plan the fleet should run.
    pub target: Option<PlanId>,
    /// Deployments finished.
    pub deployments: u64,
    /// The last deployment's result.
    pub last_deployment: Option<DeploymentResult>,
}

/// `GET /status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetStatus {
    /// One entry per pod, by name.
    pub pods: Vec<PodStatus>,
    /// Pods running the target plan.
    pub converged: usize,
    /// Pods known.
    pub total: usize,
    /// The gate.
    pub gate: GateStatus,
    /// The controller.
    pub controller: ControllerStatus,
}

/// Whether a pod counts as converged on `target`.
pub fn is_converged(p: &PodStatus, target: Option<PlanId>) -> bool {
    p.phase == Phase::Converged && target.is_some() && p.applied == target && p.running == target
}

/// The pure roll-up: `(converged, total)`.
pub fn roll_up(pods: &[PodStatus], target: Option<PlanId>) -> (usize, usize) {
    (pods.iter().filter(|p| is_converged(p, target)).count(), pods.len())
}

/// The shared, mutable status the components write into. Every edit bumps a version that
/// readers can wait on ([`StatusBoard::wait_change`]) instead of polling.
#[derive(Debug)]
pub struct StatusBoard {
    inner: Mutex<Board>,
    version: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug)]
struct Board {
    pods: BTreeMap<String, PodStatus>,
    gate: GateStatus,
    controller: ControllerStatus,
}

impl StatusBoard {
    /// An empty board.
    pub fn new(gate: GateStatus, controller: ControllerStatus) -> Self {
        StatusBoard {
            inner: Mutex::new(Board { pods: BTreeMap::new(), gate, controller }),
            version: tokio::sync::watch::Sender::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Board> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Edits the board and bumps its version (inside the lock, so a snapshot's version always
    /// names its content).
    fn edit<R>(&self, f: impl FnOnce(&mut Board) -> R) -> R {
        let mut b = self.lock();
        let r = f(&mut b);
        self.version.send_modify(|v| *v += 1);
        r
    }

    /// The board's version: it grows with every edit.
    pub fn version(&self) -> u64 {
        *self.version.borrow()
    }

    /// A receiver of the board's version: it changes with every edit.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Waits until the version is past `after`, or `timeout` passed; returns the version then.
    pub async fn wait_change(&self, after: u64, timeout: std::time::Duration) -> u64 {
        let mut rx = self.version.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|v| *v > after)).await;
        self.version()
    }

    /// Sets the endpoint list: new pods appear as unknown, removed pods disappear, and a pod
    /// whose agent URL changed (a pod replaced under the same name) is unknown again: nothing
    /// the old pod ran says anything about the new one.
    pub fn set_endpoints(&self, eps: &[(String, String)]) {
        self.edit(|b| {
            b.pods.retain(|name, p| eps.iter().any(|(n, u)| n == name && *u == p.url));
            for (name, url) in eps {
                b.pods.entry(name.clone()).or_insert_with(|| PodStatus {
                    pod: name.clone(),
                    url: url.clone(),
                    ..Default::default()
                });
            }
        })
    }

    /// Edits one pod's status (if the pod is still known).
    pub fn pod(&self, name: &str, f: impl FnOnce(&mut PodStatus)) {
        self.edit(|b| {
            if let Some(p) = b.pods.get_mut(name) {
                f(p);
            }
        })
    }

    /// Edits the gate status.
    pub fn gate(&self, f: impl FnOnce(&mut GateStatus)) {
        self.edit(|b| f(&mut b.gate))
    }

    /// Edits the controller status.
    pub fn controller(&self, f: impl FnOnce(&mut ControllerStatus)) {
        self.edit(|b| f(&mut b.controller))
    }

    /// A consistent snapshot with the roll-up.
    pub fn snapshot(&self) -> FleetStatus {
        self.versioned_snapshot().0
    }

    /// A consistent snapshot and the version it is of.
    pub fn versioned_snapshot(&self) -> (FleetStatus, u64) {
        let b = self.lock();
        let version = self.version();
        let pods: Vec<PodStatus> = b.pods.values().cloned().collect();
        let (converged, total) = roll_up(&pods, b.controller.target);
        (FleetStatus { pods, converged, total, gate: b.gate.clone(), controller: b.controller.clone() }, version)
    }
}

fn short(p: &Option<PlanId>) -> String {
    p.map(|p| p.short()).unwrap_or_else(|| "-".into())
}

/// The widest REASON / ERROR cell.
const NOTE_WIDTH: usize = 110;

/// Shortens a `what: cause: cause ...` chain to `max` characters keeping its ends: the first
/// part says what failed, the last says why (`POST http://…/v1/apply: … : Connection refused
/// (os error 111)`), so a cut never hides the cause.
fn clip(text: &str, max: usize) -> String {
    let len = |s: &str| s.chars().count();
    if len(text) <= max {
        return text.to_string();
    }
    let parts: Vec<&str> = text.split(": ").collect();
    let cut = |s: &str, n: usize| -> String {
        if len(s) <= n {
            s.to_string()
        } else {
            s.chars().take(n.saturating_sub(1)).collect::<String>() + "…"
        }
    };
    if parts.len() < 2 {
        return cut(text, max);
    }
    // The tail: as many trailing parts as fit in two thirds of the width (at least the last).
    let mut tail: Vec<&str> = Vec::new();
    for p in parts[1..].iter().rev() {
        let joined = len(&tail.iter().rev().chain(std::iter::once(p)).copied().collect::<Vec<_>>().join(": "));
        if !tail.is_empty() && joined + len(p) > max * 2 / 3 {
            break;
        }
        tail.push(p);
    }
    tail.reverse();
    let tail = cut(&tail.join(": "), max * 2 / 3);
    let head_room = max.saturating_sub(len(&tail) + 5).max(1);
    format!("{}: …: {tail}", cut(parts[0], head_room))
}

/// The status as a table: one row per pod, then the fleet and gate lines.
pub fn table(s: &FleetStatus) -> String {
    let mut rows: Vec<[String; 8]> = vec![[
        "POD".into(),
        "PHASE".into(),
        "APPLIED".into(),
        "RUNNING".into(),
        "MODE".into(),
        "LAST APPLY".into(),
        "HAPROXY".into(),
        "REASON / ERROR".into(),
    ]];
    for p in &s.pods {
        let mode = p.mode.map(|m| m.as_str().to_string()).unwrap_or_else(|| "-".into());
        let when = match (&p.last_apply_at, p.last_apply_duration_ms) {
            (Some(at), Some(ms)) => format!("{} ({ms}ms)", at.get(11..19).unwrap_or(at)),
            (Some(at), None) => at.clone(),
            _ => "-".into(),
        };
        let error = p.last_error.as_ref().filter(|_| p.phase != Phase::Converged);
        let mut note = match (error, p.reasons.first()) {
            (Some(e), _) => {
                format!("error: {}", clip(e.lines().find(|l| !l.trim().is_empty()).unwrap_or(e), NOTE_WIDTH - 7))
            }
            (None, Some(r)) if p.reasons.len() > 1 => format!("{r} (+{} more)", p.reasons.len() - 1),
            (None, Some(r)) => r.clone(),
            (None, None) => String::new(),
        };
        if let Some(pr) = &p.pending_reload {
            note = format!("reload in {}ms; {note}", pr.due_in_ms);
        }
        note = clip(&note, NOTE_WIDTH);
        rows.push([
            p.pod.clone(),
            p.phase.as_str().into(),
            short(&p.applied),
            short(&p.running),
            mode,
            when,
            p.haproxy_version.clone().unwrap_or_else(|| "-".into()),
            note,
        ]);
    }
    let mut widths = [0usize; 8];
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    let g = &s.gate;
    out.push_str(&format!(
        "fleet: {}/{} converged on {}   gate: {}{}   last good: {}\n",
        s.converged,
        s.total,
        short(&s.controller.target),
        match g.mode {
            GateMode::Optimistic => "optimistic",
            GateMode::Pessimistic => "pessimistic",
        },
        if g.pinned { ", PINNED" } else { "" },
        short(&g.last_good),
    ));
    if let Some(r) = &g.last_refused {
        if g.pinned {
            let first =
                r.output.lines().find(|l| l.contains("ALERT")).or_else(|| r.output.lines().next()).unwrap_or("");
            out.push_str(&format!("gate refused {}: {}\n", r.plan_id.short(), first.trim()));
        }
    }
    if let Some(e) = &g.render_error {
        out.push_str(&format!("render error: {e}\n"));
    }
    if let Some(why) = &s.controller.stood_down {
        out.push_str(&format!("CONTROLLER STOOD DOWN: {why}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_protocol::Digest;

    fn pid(s: &str) -> PlanId {
        PlanId(Digest::of(s.as_bytes()))
    }

    #[test]
    fn roll_up_counts_only_pods_running_the_target() {
        let t = Some(pid("t"));
        let pod = |phase, applied: &str, running: &str| PodStatus {
            phase,
            applied: Some(pid(applied)),
            running: Some(pid(running)),
            ..Default::default()
        };
        let pods = vec![
            pod(Phase::Converged, "t", "t"),
            pod(Phase::ReloadPending, "t", "o"),
            pod(Phase::Converged, "o", "o"),
            pod(Phase::Failed, "t", "t"),
        ];
        assert_eq!(roll_up(&pods, t), (1, 4));
        assert_eq!(roll_up(&pods, None), (0, 4));
    }

    #[test]
    fn long_errors_keep_what_failed_and_the_cause() {
        let e = "POST http://127.0.0.1:18201/v1/apply: error sending request: client error (Connect): \
                 tcp connect error: Connection refused (os error 111)";
        let c = clip(e, NOTE_WIDTH);
        assert!(c.chars().count() <= NOTE_WIDTH, "{c}");
        assert!(c.starts_with("POST http://127.0.0.1:18201/v1/apply: …: "), "{c}");
        assert!(c.ends_with("Connection refused (os error 111)"), "{c}");
        assert_eq!(clip("short: enough", 110), "short: enough");
        let one = "x".repeat(200);
        assert_eq!(clip(&one, 50).chars().count(), 50);
        let tiny_tail = format!("{}: {}", "h".repeat(150), "y".repeat(150));
        assert!(clip(&tiny_tail, 60).chars().count() <= 60);
    }

    #[test]
    fn board_and_table() {
        let b = StatusBoard::new(
            GateStatus::from_latch(&Latch::new(GateMode::Optimistic), None),
            ControllerStatus { identity: "me".into(), epoch: 1, ..Default::default() },
        );
        b.set_endpoints(&[("p1".into(), "http://p1".into()), ("p2".into(), "http://p2".into())]);
        b.controller(|c| c.target = Some(pid("t")));
        b.pod("p1", |p| {
            p.phase = Phase::Converged;
            p.applied = Some(pid("t"));
            p.running = Some(pid("t"));
            p.mode = Some(Mode::Runtime);
            p.reasons = vec!["backend be: server s1 address a -> b".into()];
        });
        b.pod("p2", |p| {
            p.phase = Phase::Rejected;
            p.last_error = Some("[ALERT] parsing [haproxy.cfg:3]: unknown keyword".into());
        });
        let s = b.snapshot();
        assert_eq!((s.converged, s.total), (1, 2));
        let t = table(&s);
        assert!(t.contains("p1") && t.contains("converged") && t.contains("runtime"), "{t}");
        assert!(t.contains("error: [ALERT]"), "{t}");
        assert!(t.contains("fleet: 1/2 converged"), "{t}");
        let json = serde_json::to_value(&s).unwrap();
        assert!(json["pods"].is_array() && json["converged"] == 1 && json["total"] == 2 && json["gate"].is_object());
        let back: FleetStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
        b.set_endpoints(&[("p2".into(), "http://p2".into())]);
        assert_eq!(b.snapshot().total, 1);
        // p2 comes back at another address: a new pod under the old name, unknown until applied.
        b.pod("p2", |p| p.phase = Phase::Converged);
        b.set_endpoints(&[("p2".into(), "http://p2-new".into())]);
        let s = b.snapshot();
        assert_eq!((s.total, s.converged), (1, 0));
        assert_eq!((s.pods[0].url.as_str(), s.pods[0].phase), ("http://p2-new", Phase::Unknown));
    }
}
