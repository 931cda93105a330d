//! Render mode's writes to Ingresses, by the leader only: `status.loadBalancer` of every served
//! Ingress (the address of the Service in front of the fleet), written with server-side apply
//! as field manager `haptic-controller`, and a Warning Event on an Ingress when what the
//! translator refused or warned about it changes (naming the field and why).
//!
//! Owns the pure [`due`] (what two consecutive outcomes call for) and the loop that does it. It
//! must never change an Ingress's spec, and never write an Ingress that is not served.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::networking::v1::{Ingress, IngressLoadBalancerIngress};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::Api;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::context::Context;
use super::routes::{IngressOutcome, Served};
use super::status::FIELD_MANAGER;
use haptic_render::{ObjectRef, Refusal};

/// The Event reason when parts of an Ingress were refused.
pub const REFUSED: &str = "IngressRefused";
/// The Event reason when an Ingress (or a Secret it names) is left out because the gate refuses
/// renders with it (its own reason, so it is not folded into an earlier `IngressRefused`
/// series, whose note would stay the first one).
pub const LEFT_OUT: &str = "IngressLeftOut";
/// The Event reason when an Ingress is served with a warning (a missing Service answers 503).
pub const WARNING: &str = "IngressWarning";

/// What the loop has done: the address written per Ingress and the remarks warned about.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Done {
    /// `status.loadBalancer.ingress` written, per Ingress.
    pub written: BTreeMap<ObjectRef, Vec<IngressLoadBalancerIngress>>,
    /// (refusals, warnings) last published as Events, per Ingress.
    pub warned: BTreeMap<ObjectRef, (Vec<Refusal>, Vec<Refusal>)>,
}

/// One thing to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Apply this `status.loadBalancer.ingress`.
    Status(ObjectRef, Vec<IngressLoadBalancerIngress>),
    /// Publish a Warning Event.
    Warn {
        /// The Ingress.
        served: Served,
        /// [`REFUSED`] or [`WARNING`].
        reason: &'static str,
        /// `field: why; field: why`.
        note: String,
    },
}

fn note(rs: &[Refusal]) -> String {
    rs.iter().map(|r| format!("{}: {}", r.field, r.message)).collect::<Vec<_>>().join("; ")
}

/// What `now` calls for after `done` (pure): a status write where the address differs from
/// what was written, and an Event where an Ingress's refusals or warnings changed to something
/// non-empty.
pub fn due(done: &Done, now: &IngressOutcome) -> Vec<Action> {
    let mut out = Vec::new();
    for s in &now.served {
        let o = &s.verdict.object;
        if let Some(lb) = &now.load_balancer {
            if done.written.get(o) != Some(lb) {
                out.push(Action::Status(o.clone(), lb.clone()));
            }
        }
        let (refusals, warnings) = (&s.verdict.refusals, &s.verdict.warnings);
        let before = done.warned.get(o);
        if !refusals.is_empty() && before.map(|b| &b.0) != Some(refusals) {
            let reason = if s.verdict.left_out() { LEFT_OUT } else { REFUSED };
            out.push(Action::Warn { served: s.clone(), reason, note: note(refusals) });
        }
        if !warnings.is_empty() && before.map(|b| &b.1) != Some(warnings) {
            out.push(Action::Warn { served: s.clone(), reason: WARNING, note: note(warnings) });
        }
    }
    out
}

/// Writes Ingress status and Events while `token` is not cancelled, after each published
/// render. A failed status write is retried with the next published render.
pub async fn write_loop(ctx: Context, token: CancellationToken) {
    let mut snaps = ctx.snapshots.clone();
    let mut done = Done::default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    loop {
        let outcome = snaps.borrow_and_update().ingress.clone();
        if let Some(now) = outcome {
            for a in due(&done, &now) {
                match a {
                    Action::Status(o, lb) => {
                        let api: Api<Ingress> = Api::namespaced(ctx.client.clone(), &o.namespace);
                        let patch = serde_json::json!({
                            "apiVersion": "networking.k8s.io/v1",
                            "kind": "Ingress",
                            "metadata": {"name": o.name},
                            "status": {"loadBalancer": {"ingress": lb}},
                        });
                        match api.patch_status(&o.name, &params, &Patch::Apply(&patch)).await {
                            Ok(_) => {
                                done.written.insert(o, lb);
                            }
                            Err(e) => warn!("cannot write the status of {o}: {e}"),
                        }
                    }
                    Action::Warn { served, reason, note } => {
                        let o = &served.verdict.object;
                        let regarding = ObjectReference {
                            api_version: Some("networking.k8s.io/v1".into()),
                            kind: Some("Ingress".into()),
                            namespace: Some(o.namespace.clone()),
                            name: Some(o.name.clone()),
                            uid: served.uid.clone(),
                            ..Default::default()
                        };
                        let event = Event {
                            type_: EventType::Warning,
                            reason: reason.into(),
                            note: Some(note.chars().take(1000).collect()),
                            action: "Render".into(),
                            secondary: None,
                        };
                        if let Err(e) = ctx.recorder.publish(&event, &regarding).await {
                            warn!("cannot publish Event {reason} on {o}: {e}");
                        }
                    }
                }
            }
            for s in &now.served {
                let v = &s.verdict;
                done.warned.insert(v.object.clone(), (v.refusals.clone(), v.warnings.clone()));
            }
        }
        tokio::select! {
            _ = token.cancelled() => return,
            r = snaps.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_render::{Cause, Verdict};

    fn served(name: &str, refusals: &[&str], warnings: &[&str]) -> Served {
        let r = |v: &[&str]| {
            v.iter().map(|f| Refusal { cause: Cause::Invalid, field: f.to_string(), message: "why".into() }).collect()
        };
        Served {
            verdict: Verdict {
                object: ObjectRef { kind: "Ingress".into(), namespace: "ns".into(), name: name.into() },
                refusals: r(refusals),
                warnings: r(warnings),
            },
            uid: Some(format!("uid-{name}")),
        }
    }

    fn lb(ip: &str) -> Vec<IngressLoadBalancerIngress> {
        vec![IngressLoadBalancerIngress { ip: Some(ip.into()), ..Default::default() }]
    }

    /// What the loop records after doing `actions`.
    fn apply(done: &mut Done, now: &IngressOutcome) {
        for a in due(done, now) {
            if let Action::Status(o, lb) = a {
                done.written.insert(o, lb);
            }
        }
        for s in &now.served {
            done.warned.insert(s.verdict.object.clone(), (s.verdict.refusals.clone(), s.verdict.warnings.clone()));
        }
    }

    #[test]
    fn writes_once_per_address_and_warns_once_per_change() {
        let mut done = Done::default();
        let now = IngressOutcome {
            served: vec![served("a", &[], &[]), served("b", &["spec.rules[0].host"], &[])],
            load_balancer: Some(lb("10.0.0.1")),
            ..Default::default()
        };
        let first = due(&done, &now);
        assert_eq!(first.iter().filter(|a| matches!(a, Action::Status(..))).count(), 2);
        let warns: Vec<_> = first
            .iter()
            .filter_map(|a| {
                if let Action::Warn { served, reason, note } = a {
                    Some((served.verdict.object.name.clone(), *reason, note.clone()))
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(warns, [("b".to_string(), REFUSED, "spec.rules[0].host: why".to_string())]);
        apply(&mut done, &now);
        assert!(due(&done, &now).is_empty(), "nothing changed, nothing to do");
        // The address moves; b gains a warning and keeps its refusal.
        let moved = IngressOutcome {
            served: vec![served("a", &[], &[]), served("b", &["spec.rules[0].host"], &["spec.defaultBackend"])],
            load_balancer: Some(lb("10.0.0.2")),
            ..Default::default()
        };
        let next = due(&done, &moved);
        assert_eq!(next.iter().filter(|a| matches!(a, Action::Status(..))).count(), 2);
        assert!(next.iter().any(|a| matches!(a, Action::Warn { reason: WARNING, .. })));
        assert!(!next.iter().any(|a| matches!(a, Action::Warn { reason: REFUSED, .. })), "the refusal is old news");
        // Without a publish Service nothing is written.
        let none = IngressOutcome { served: vec![served("c", &[], &[])], ..Default::default() };
        assert!(due(&Done::default(), &none).is_empty());
        // Left out after the gate refused renders with it: an Event of its own reason.
        let mut gated = served("d", &["metadata"], &[]);
        gated.verdict.refusals[0].cause = Cause::LeftOut;
        let out = due(&Done::default(), &IngressOutcome { served: vec![gated], ..Default::default() });
        assert!(matches!(&out[..], [Action::Warn { reason: LEFT_OUT, .. }]), "{out:?}");
    }
}
