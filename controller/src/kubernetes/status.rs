//! The resource's status and Events, written by the leader only.
//!
//! Owns the pure [`build`] (status board + discovery + render state → `HAProxyConfigStatus`),
//! the pure [`events_between`] (which Kubernetes Events two consecutive views call for: gate
//! refusals, NACKs, stand-downs) and the writer loop that applies the status subresource
//! (server-side apply, field manager `haptic-controller`) when the status board, the render or
//! the admitted pods change, at most every 500 ms. It must never decide anything about
//! deployments.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::context::Context;
use super::crd::{GateStatusField, HAProxyConfig, HAProxyConfigStatus, LeaderField, PodStatusField};
use super::published::Discovered;
use super::published::Snapshot;
use crate::status::{FleetStatus, Phase};

/// The smallest gap between two status writes.
pub const MIN_INTERVAL: Duration = Duration::from_millis(500);

fn condition(type_: &str, ok: bool, reason: &str, message: &str, generation: Option<i64>) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.chars().take(32 * 1024).collect(),
        observed_generation: generation,
        // Filled in by `keep_transition_times`.
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

/// The status of the resource from what the leader knows (pure; transition times are the
/// epoch here and fixed up against the previous status by [`keep_transition_times`]).
pub fn build(fleet: &FleetStatus, snap: &Snapshot, disc: &Discovered) -> HAProxyConfigStatus {
    let generation = snap.config.as_ref().and_then(|c| c.metadata.generation);
    let target = fleet.controller.target;
    let gate_refused = fleet.gate.last_refused.as_ref();
    let gate_state = if fleet.gate.pinned {
        "pinned"
    } else {
        match fleet.gate.mode {
            crate::gate::GateMode::Optimistic => "optimistic",
            crate::gate::GateMode::Pessimistic => "pessimistic",
        }
    };
    let render_err = snap.bundle.as_ref().and_then(|r| r.as_ref().err());
    let latest_refused = fleet.gate.pinned && gate_refused.is_some();
    let validated = match (render_err, latest_refused) {
        (Some(e), _) => condition("Validated", false, e.reason, &e.message, generation),
        (None, true) => {
            let words = gate_refused.map(|r| r.output.clone()).unwrap_or_default();
            condition("Validated", false, "GateRefused", &words, generation)
        }
        (None, false) => match fleet.gate.last_good {
            Some(p) => condition("Validated", true, "GatePassed", &format!("plan {} passed haproxy -c", p), generation),
            None => condition("Validated", false, "Pending", "no render has passed the gate yet", generation),
        },
    };
    let (converged, total) = (fleet.converged, disc.endpoints.len().max(fleet.total));
    let conv_ok = total > 0 && converged == total;
    let converged_cond = if let Some(e) = &disc.credentials_error {
        condition("Converged", false, "NoCredentials", e, generation)
    } else if total == 0 {
        condition(
            "Converged",
            false,
            "NoPods",
            "no HAProxy pod is admitted (see podSelector and the agents)",
            generation,
        )
    } else if conv_ok {
        condition("Converged", true, "AllPodsConverged", &format!("{converged}/{total} pods run the plan"), generation)
    } else {
        condition("Converged", false, "Deploying", &format!("{converged}/{total} pods run the plan"), generation)
    };
    let deployed_to_pods = fleet
        .pods
        .iter()
        .map(|p| {
            let info = disc.pods.get(&p.pod);
            PodStatusField {
                pod: p.pod.clone(),
                uid: info.map(|i| i.uid.clone()).unwrap_or_default(),
                ip: info.map(|i| i.ip.clone()).unwrap_or_default(),
                phase: p.phase.as_str().into(),
                applied_plan: p.applied.map(|x| x.to_string()),
                running_plan: p.running.map(|x| x.to_string()),
                mode: p.mode.map(|m| m.as_str().to_string()),
                reasons: p.reasons.clone(),
                pending_reload: p.pending_reload.is_some(),
                last_error: if p.phase == Phase::Converged { None } else { p.last_error.clone() },
                last_applied_at: p.last_apply_at.clone(),
                haproxy_version: p.haproxy_version.clone(),
                node: info.and_then(|i| i.facts.node.clone()),
                ready: info.and_then(|i| i.facts.ready),
                not_ready_reason: info.and_then(|i| i.facts.not_ready_reason.clone()),
                restarts: info.map_or(0, |i| i.facts.restarts),
            }
        })
        .collect();
    HAProxyConfigStatus {
        observed_generation: generation,
        plan_id: fleet.gate.last_good.or(target).map(|p| p.to_string()),
        plan_short: fleet.gate.last_good.or(target).map(|p| p.short()),
        last_good_plan_id: fleet.gate.last_good.map(|p| p.to_string()),
        gate: Some(GateStatusField {
            state: gate_state.into(),
            message: gate_refused
                .map(|r| r.output.lines().find(|l| l.contains("[ALERT]")).unwrap_or(&r.output).to_string()),
        }),
        converged: u32::try_from(converged).unwrap_or(u32::MAX),
        total: u32::try_from(total).unwrap_or(u32::MAX),
        converged_text: Some(format!("{converged}/{total}")),
        leader: Some(LeaderField { identity: fleet.controller.identity.clone(), epoch: fleet.controller.epoch }),
        conditions: {
            let ready = super::crd::ready_condition(&validated, &converged_cond);
            vec![validated, converged_cond, ready]
        },
        deployed_to_pods,
    }
}

/// The resource's status as the fleet status the table prints (`status --kubernetes`).
pub fn to_fleet(s: &HAProxyConfigStatus) -> FleetStatus {
    use crate::gate::GateMode;
    use crate::status::{ControllerStatus, GateStatus, PodStatus};
    let plan = |t: &Option<String>| t.as_deref().and_then(|t| t.parse().ok());
    let phase = |t: &str| match t {
        "converged" => Phase::Converged,
        "deploying" => Phase::Deploying,
        "reload-pending" => Phase::ReloadPending,
        "rejected" => Phase::Rejected,
        "failed" => Phase::Failed,
        "stood-down" => Phase::StoodDown,
        _ => Phase::Unknown,
    };
    let gate = s.gate.clone().unwrap_or_default();
    let validated = s.conditions.iter().find(|c| c.type_ == "Validated");
    let render_error = validated
        .filter(|c| c.status == "False" && c.reason != "GateRefused" && c.reason != "Pending")
        .map(|c| format!("{}: {}", c.reason, c.message));
    let pods: Vec<PodStatus> = s
        .deployed_to_pods
        .iter()
        .map(|p| PodStatus {
            pod: p.pod.clone(),
            url: p.ip.clone(),
            phase: phase(&p.phase),
            applied: plan(&p.applied_plan),
            running: plan(&p.running_plan),
            mode: p.mode.as_deref().and_then(|m| serde_json::from_value(serde_json::json!(m)).ok()),
            reasons: p.reasons.clone(),
            last_error: p.last_error.clone(),
            last_apply_at: p.last_applied_at.clone(),
            haproxy_version: p.haproxy_version.clone(),
            ..PodStatus::default()
        })
        .collect();
    FleetStatus {
        pods,
        converged: s.converged as usize,
        total: s.total as usize,
        gate: GateStatus {
            mode: if gate.state == "pessimistic" { GateMode::Pessimistic } else { GateMode::Optimistic },
            pinned: gate.state == "pinned",
            last_good: plan(&s.last_good_plan_id),
            last_refused: gate.message.map(|m| crate::gate::Refusal {
                plan_id: plan(&s.plan_id).unwrap_or(haptic_protocol::PlanId(haptic_protocol::Digest::of(b""))),
                output: m,
            }),
            render_error,
        },
        controller: ControllerStatus {
            identity: s.leader.as_ref().map(|l| l.identity.clone()).unwrap_or_default(),
            epoch: s.leader.as_ref().map_or(0, |l| l.epoch),
            target: plan(&s.plan_id),
            ..ControllerStatus::default()
        },
    }
}

/// Keeps each condition's `lastTransitionTime` from `prev` while its status is unchanged, and
/// stamps `now` on the ones that changed.
pub fn keep_transition_times(new: &mut HAProxyConfigStatus, prev: Option<&HAProxyConfigStatus>, now: Time) {
    for c in &mut new.conditions {
        let old = prev.and_then(|p| p.conditions.iter().find(|o| o.type_ == c.type_));
        c.last_transition_time = match old {
            Some(o) if o.status == c.status => o.last_transition_time.clone(),
            _ => now.clone(),
        };
    }
}

/// An Event to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    /// `Warning` (else `Normal`).
    pub warning: bool,
    /// The Event's reason (`GateRefused`, `ApplyRejected`, `StoodDown`, `Deployed`).
    pub reason: &'static str,
    /// What happened.
    pub note: String,
}

impl EventSpec {
    /// A `Warning` Event.
    pub fn warning(reason: &'static str, note: String) -> Self {
        EventSpec { warning: true, reason, note }
    }

    /// A `Normal` Event.
    pub fn normal(reason: &'static str, note: String) -> Self {
        EventSpec { warning: false, reason, note }
    }
}

/// The Events between two consecutive fleet views (pure).
pub fn events_between(prev: Option<&FleetStatus>, now: &FleetStatus) -> Vec<EventSpec> {
    let mut out = Vec::new();
    let prev_refused = prev.and_then(|p| p.gate.last_refused.as_ref()).map(|r| r.plan_id);
    if let Some(r) = &now.gate.last_refused {
        if prev_refused != Some(r.plan_id) {
            out.push(EventSpec::warning(
                "GateRefused",
                format!("haproxy -c refused plan {}: {}", r.plan_id.short(), r.output),
            ));
        }
    }
    for p in &now.pods {
        let before = prev.and_then(|f| f.pods.iter().find(|q| q.pod == p.pod));
        let was = before.map(|b| (b.phase, b.last_error.clone()));
        if p.phase == Phase::Rejected && was != Some((Phase::Rejected, p.last_error.clone())) {
            let words = p.last_error.clone().unwrap_or_default();
            out.push(EventSpec::warning("ApplyRejected", format!("pod {}: HAProxy refused the plan: {words}", p.pod)));
        }
    }
    if let Some(note) = super::deployed::deployed_note(prev, now) {
        out.push(EventSpec::normal("Deployed", note));
    }
    if let Some(why) = &now.controller.stood_down {
        if prev.and_then(|p| p.controller.stood_down.as_ref()) != Some(why) {
            out.push(EventSpec::warning("StoodDown", format!("{} stood down: {why}", now.controller.identity)));
        }
    }
    out
}

/// Publishes one Event on the resource (failures are logged, never fatal).
pub async fn publish(recorder: &Recorder, obj: &HAProxyConfig, ev: EventSpec) {
    let EventSpec { warning, reason, note } = ev;
    let event = Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Deploy".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &obj.object_ref(&())).await {
        warn!("cannot publish Event {reason}: {e}");
    }
}

/// An Events recorder named after the controller and this replica.
pub fn recorder(client: Client, identity: &str) -> Recorder {
    Recorder::new(client, Reporter { controller: "haptic-controller".into(), instance: Some(identity.into()) })
}

/// The field manager of the status writes (server-side apply).
pub const FIELD_MANAGER: &str = "haptic-controller";

/// Writes the status while `token` is not cancelled: after each change of the status board,
/// the published render or the admitted pods (event-driven), at most every [`MIN_INTERVAL`],
/// with server-side apply as [`FIELD_MANAGER`]. A failed write is tried again after
/// [`MIN_INTERVAL`].
pub async fn write_loop(ctx: Context, board: std::sync::Arc<crate::status::StatusBoard>, token: CancellationToken) {
    let api = ctx.configs();
    let name = ctx.names.config.clone();
    let mut snaps = ctx.snapshots.clone();
    let mut disc = ctx.discovered.clone();
    let mut changes = board.subscribe();
    let mut last_written: Option<HAProxyConfigStatus> = None;
    let mut last_fleet: Option<FleetStatus> = None;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    loop {
        let started = tokio::time::Instant::now();
        changes.borrow_and_update();
        let fleet = board.snapshot();
        let snap = snaps.borrow_and_update().clone();
        let discovered = disc.borrow_and_update().clone();
        let mut failed = false;
        if let Some(obj) = snap.config.clone() {
            for ev in events_between(last_fleet.as_ref(), &fleet) {
                publish(&ctx.recorder, &obj, ev).await;
            }
            let mut status = build(&fleet, &snap, &discovered);
            let prev = last_written.clone().or_else(|| obj.status.clone());
            keep_transition_times(&mut status, prev.as_ref(), Time(k8s_openapi::jiff::Timestamp::now()));
            if Some(&status) != last_written.as_ref() {
                let patch = serde_json::json!({
                    "apiVersion": "haptic.dev/v1alpha1",
                    "kind": "HAProxyConfig",
                    "metadata": {"name": name},
                    "status": status,
                });
                match api.patch_status(&name, &params, &Patch::Apply(&patch)).await {
                    Ok(_) => last_written = Some(status),
                    Err(e) => {
                        failed = true;
                        warn!("cannot write the status of {name}: {e}");
                    }
                }
            }
        }
        last_fleet = Some(fleet);
        // Wait for a change (or, after a failed write, for the retry), then keep the spacing.
        tokio::select! {
            _ = token.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
            r = snaps.changed() => if r.is_err() { return },
            r = disc.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(MIN_INTERVAL), if failed => {}
        }
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep_until(started + MIN_INTERVAL) => {}
        }
    }
}
