//! Gate narrowing in render mode: after the gate refuses a render the translator accepted, the
//! objects changed since the last render it passed are left out of the next renders, narrowed
//! down to the culprits (a bisection, `haptic_render::narrow`), so the rest deploys and each
//! culprit's verdict (status and Events) says why it is out.
//!
//! Owns [`GateNarrowing`]: the object versions of recent published renders, the running
//! bisection and the plan of its pending render, and the culprits found (out while their
//! version stays; a new version is judged again). Pure: the render loop gives it the objects'
//! versions, each published plan and the gate's status, and renders with
//! [`GateNarrowing::excluded`]. It must never run the gate nor leave out an object that did not
//! change since the last render the gate passed.

use std::collections::{BTreeMap, VecDeque};

use haptic_protocol::PlanId;
use haptic_render::narrow::{changed, Narrower, Step};
use haptic_render::ObjectRef;

use crate::status::GateStatus;

/// How many published renders' object versions are kept.
pub const VERSIONS_KEPT: usize = 32;

/// Object → version (`metadata.resourceVersion`).
pub type Versions = BTreeMap<ObjectRef, String>;

#[derive(Debug)]
struct Running {
    narrower: Narrower,
    /// The versions it narrows over: any change to them abandons it.
    base: Versions,
    /// The plan of the render whose verdict it waits for.
    pending: Option<PlanId>,
}

/// The versions of the objects a render reads that a gate refusal can be narrowed to: the
/// Ingresses and the Secrets they name.
pub fn object_versions(o: &super::routes::Objects) -> Versions {
    let v = |kind: &str, m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        let r = ObjectRef {
            kind: kind.into(),
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
        };
        (r, m.resource_version.clone().unwrap_or_default())
    };
    o.ingresses
        .iter()
        .map(|i| v("Ingress", &i.metadata))
        .chain(o.secrets.iter().map(|s| v("Secret", &s.metadata)))
        .collect()
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct GateNarrowing {
    versions: VecDeque<(PlanId, Versions)>,
    running: Option<Running>,
    culprits: BTreeMap<ObjectRef, (String, String)>,
    /// The refused plan the last narrowing started from.
    handled: Option<PlanId>,
}

impl GateNarrowing {
    /// What the next render (of objects at `now`) leaves out, each with why. Culprits whose
    /// version changed are judged again (not left out); a running narrowing whose objects
    /// changed is abandoned (the next refusal starts a new one).
    pub fn excluded(&mut self, now: &Versions) -> BTreeMap<ObjectRef, String> {
        self.culprits.retain(|o, (v, _)| now.get(o) == Some(v));
        if self.running.as_ref().is_some_and(|r| r.base != *now) {
            self.running = None;
        }
        let mut out: BTreeMap<ObjectRef, String> =
            self.culprits.iter().map(|(o, (_, why))| (o.clone(), why.clone())).collect();
        if let Some(r) = &self.running {
            out.extend(r.narrower.excluded());
        }
        out
    }

    /// Records a render made from `now` as `plan`; `true` when the gate has judged it already
    /// (a render equal to an earlier one) and the narrowing moved on: render again.
    pub fn published(&mut self, plan: PlanId, now: Versions, gate: &GateStatus) -> bool {
        self.versions.retain(|(p, _)| *p != plan);
        self.versions.push_back((plan, now));
        while self.versions.len() > VERSIONS_KEPT {
            self.versions.pop_front();
        }
        if let Some(r) = &mut self.running {
            r.pending = Some(plan);
        }
        self.on_gate(gate)
    }

    /// Moves on the gate's status; `true` when the next render differs: render again.
    pub fn on_gate(&mut self, gate: &GateStatus) -> bool {
        if let Some(r) = &mut self.running {
            let Some(p) = r.pending else { return false };
            let verdict = match &gate.last_refused {
                _ if gate.last_good == Some(p) => Ok(()),
                Some(refused) if refused.plan_id == p => Err(haptic_render::ingress::check_words(&refused.output)),
                _ => return false,
            };
            r.pending = None;
            r.narrower.on_verdict(verdict.as_ref().map(|_| ()).map_err(String::as_str));
            match r.narrower.step() {
                Step::Trying => return true,
                Step::Done => {
                    for (o, why) in r.narrower.culprits() {
                        let v = r.base.get(o).cloned().unwrap_or_default();
                        let why = format!("{}: {why}", haptic_render::narrow::GATE_REFUSES);
                        self.culprits.insert(o.clone(), (v, why));
                    }
                    self.running = None;
                    return true;
                }
                Step::Stuck => {
                    self.running = None;
                    return false;
                }
            }
        }
        // A refusal of the newest render starts a narrowing, once.
        let Some(refused) = gate.last_refused.as_ref().filter(|_| gate.pinned) else { return false };
        let Some((newest, now)) = self.versions.back() else { return false };
        if *newest != refused.plan_id || self.handled == Some(refused.plan_id) {
            return false;
        }
        self.handled = Some(refused.plan_id);
        let good = gate
            .last_good
            .and_then(|g| self.versions.iter().find(|(p, _)| *p == g))
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let mut suspects = changed(&good, now);
        suspects.retain(|o| !self.culprits.contains_key(o));
        let narrower = Narrower::start(suspects);
        if *narrower.step() != Step::Trying {
            return false;
        }
        self.running = Some(Running { narrower, base: now.clone(), pending: None });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{GateMode, Refusal};

    fn ing(n: &str) -> ObjectRef {
        ObjectRef { kind: "Ingress".into(), namespace: "shop".into(), name: n.into() }
    }

    fn plan(n: u8) -> PlanId {
        PlanId(haptic_protocol::Digest::of(&[n]))
    }

    fn gate(good: Option<u8>, refused: Option<u8>) -> GateStatus {
        GateStatus {
            mode: GateMode::Optimistic,
            pinned: refused.is_some() && refused > good,
            last_good: good.map(plan),
            last_refused: refused
                .map(|r| Refusal { plan_id: plan(r), output: "parsing [haproxy.cfg:9]: bad cert".into() }),
            render_error: None,
        }
    }

    /// A render loop against a gate that refuses any render with `bad` in it; plans are
    /// numbered by render. Returns what is finally left out and how many renders it took.
    fn drive(n: &mut GateNarrowing, now: &Versions, bad: &str, start: u8) -> (Vec<String>, u8) {
        let mut p = start;
        let (mut good, mut refused) = (Some(1u8), Some(start));
        // The refused render `start` was published from `now`.
        assert!(!n.published(plan(p), now.clone(), &gate(good, None)));
        let mut again = n.on_gate(&gate(good, refused));
        while again {
            assert!(p < 60, "bounded");
            p += 1;
            let out = n.excluded(now);
            let in_render = !out.contains_key(&ing(bad));
            if in_render {
                refused = Some(p);
            } else {
                good = Some(p);
            }
            again = n.published(plan(p), now.clone(), &gate(good, refused));
        }
        (n.excluded(now).keys().map(|o| o.name.clone()).collect(), p - start)
    }

    #[test]
    fn a_refused_render_is_narrowed_to_its_culprit() {
        let mut n = GateNarrowing::default();
        let before: Versions = [(ing("a"), "1".into()), (ing("b"), "1".into())].into();
        n.published(plan(1), before.clone(), &gate(Some(1), None));
        let now: Versions =
            [(ing("a"), "2".into()), (ing("b"), "1".into()), (ing("c"), "1".into()), (ing("d"), "1".into())].into();
        let (out, renders) = drive(&mut n, &now, "c", 10);
        assert_eq!(out, ["c"], "only the culprit stays out");
        assert!(renders <= 8, "{renders}");
        let why = n.excluded(&now)[&ing("c")].clone();
        assert!(why.contains("fails haproxy -c: parsing [haproxy.cfg:9]: bad cert"), "{why}");
        // A new version of the culprit is judged again.
        let mut fixed = now.clone();
        fixed.insert(ing("c"), "2".into());
        assert!(n.excluded(&fixed).is_empty());
    }

    #[test]
    fn an_unchanged_object_is_never_left_out() {
        let mut n = GateNarrowing::default();
        let v: Versions = [(ing("a"), "1".into())].into();
        n.published(plan(1), v.clone(), &gate(Some(1), None));
        // The same objects, refused (the template changed, say): nothing to narrow.
        n.published(plan(2), v.clone(), &gate(Some(1), None));
        assert!(!n.on_gate(&gate(Some(1), Some(2))));
        assert!(n.excluded(&v).is_empty());
    }

    #[test]
    fn a_change_while_narrowing_abandons_it() {
        let mut n = GateNarrowing::default();
        let before: Versions = [(ing("a"), "1".into())].into();
        n.published(plan(1), before, &gate(Some(1), None));
        let now: Versions = [(ing("a"), "2".into()), (ing("b"), "1".into())].into();
        n.published(plan(2), now.clone(), &gate(Some(1), None));
        assert!(n.on_gate(&gate(Some(1), Some(2))));
        assert_eq!(n.excluded(&now).len(), 2);
        let mut later = now.clone();
        later.insert(ing("b"), "2".into());
        assert!(n.excluded(&later).is_empty(), "a new change starts over from the whole");
        // The same refusal does not start a second narrowing.
        assert!(!n.on_gate(&gate(Some(1), Some(2))));
    }
}
