//! Gate narrowing in render mode: after the gate refuses a render the translator accepted, the
//! objects changed since the last render it passed are left out of the next renders, narrowed
//! down to the culprits (a bisection, `haptic_render::narrow`), so the rest deploys and each
//! culprit's verdict (status and Events) says why it is out.
//!
//! Owns [`GateNarrowing`]: the object versions of recent published renders, the running
//! bisection and the plan of its pending render, and the culprits found (out while their
//! version stays; a new version is judged again). Pure: the render loop gives it the objects'
//! versions, each published plan and the gate's status, and renders with
//! [`GateNarrowing::excluded`]. A render's recorded versions hold only the objects it let in:
//! an object it left out is, against that render, new, so a later narrowing can still find it
//! (recording it would make it look judged, and a narrowing started after a concurrent change
//! could then never leave it out: the gate stays pinned). Ingress and Gateway renders alike:
//! the objects are Ingresses, routes, ListenerSets and the Secrets they name. It must never run the gate
//! nor leave out an object that did not change since the last render the gate passed.

use std::collections::{BTreeMap, VecDeque};

use haptic_protocol::PlanId;
use haptic_render::narrow::{changed, Exclusion, Narrower, Step};
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
/// Ingresses, the routes, the ListenerSets, the BackendTLSPolicies and the Secrets they name.
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
        .chain(o.routes.iter().map(|r| v("HTTPRoute", &r.metadata)))
        .chain(o.grpc_routes.iter().map(|r| v("GRPCRoute", &r.metadata)))
        .chain(o.tls_routes.iter().map(|r| v("TLSRoute", &r.metadata)))
        .chain(o.tcp_routes.iter().map(|r| v("TCPRoute", &r.metadata)))
        .chain(o.listener_sets.iter().map(|s| v("ListenerSet", &s.metadata)))
        .chain(o.backend_tls_policies.iter().map(|p| v("BackendTLSPolicy", &p.metadata)))
        .chain(o.secrets.iter().map(|s| v("Secret", &s.metadata)))
        .collect()
}

/// The largest render (all files) the render loop publishes; a larger one leaves out its
/// largest contributors ([`haptic_render::narrow::to_fit`]). The largest file the controller
/// reads from a directory, and far below the agents' default request body limit (256 MiB), so a
/// render that fits is one every agent with default settings accepts.
pub const MAX_RENDER_BYTES: u64 = crate::bundle::MAX_FILE_BYTES;

/// The bytes each object adds to a render, by what it brings: a Secret its data (certificates,
/// keys, users), an Ingress or an HTTPRoute its spec (its hosts, paths and rules become map
/// lines and config in proportion).
pub fn object_sizes(o: &super::routes::Objects) -> BTreeMap<ObjectRef, u64> {
    let r = |kind: &str, m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| ObjectRef {
        kind: kind.into(),
        namespace: m.namespace.clone().unwrap_or_default(),
        name: m.name.clone().unwrap_or_default(),
    };
    o.ingresses
        .iter()
        .map(|i| (r("Ingress", &i.metadata), json_len(&i.spec)))
        .chain(o.routes.iter().map(|h| (r("HTTPRoute", &h.metadata), json_len(&h.spec))))
        .chain(o.grpc_routes.iter().map(|g| (r("GRPCRoute", &g.metadata), json_len(&g.spec))))
        .chain(o.tls_routes.iter().map(|t| (r("TLSRoute", &t.metadata), json_len(&t.spec))))
        .chain(o.tcp_routes.iter().map(|t| (r("TCPRoute", &t.metadata), json_len(&t.spec))))
        .chain(o.listener_sets.iter().map(|s| (r("ListenerSet", &s.metadata), json_len(&s.spec))))
        .chain(o.backend_tls_policies.iter().map(|p| (r("BackendTLSPolicy", &p.metadata), json_len(&p.spec))))
        .chain(o.secrets.iter().map(|s| {
            let data = s.data.as_ref().map(|d| d.values().map(|b| b.0.len() as u64).sum()).unwrap_or(0);
            (r("Secret", &s.metadata), data)
        }))
        .collect()
}

/// The length of `v`'s JSON form (0 when it does not serialize).
fn json_len<T: serde::Serialize>(v: &T) -> u64 {
    serde_json::to_vec(v).map(|v| v.len() as u64).unwrap_or(0)
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct GateNarrowing {
    /// By plan: the objects it let in.
    versions: VecDeque<(PlanId, Versions)>,
    /// The newest plan and every object it was rendered from (also those it left out).
    newest: Option<(PlanId, Versions)>,
    running: Option<Running>,
    culprits: BTreeMap<ObjectRef, (String, Exclusion)>,
    /// The refused plan the last narrowing started from.
    handled: Option<PlanId>,
}

impl GateNarrowing {
    /// What the next render (of objects at `now`) leaves out, each with why. Culprits whose
    /// version changed are judged again (not left out); a running narrowing whose objects
    /// changed is abandoned (the next refusal starts a new one).
    pub fn excluded(&mut self, now: &Versions) -> BTreeMap<ObjectRef, Exclusion> {
        self.culprits.retain(|o, (v, _)| now.get(o) == Some(v));
        if self.running.as_ref().is_some_and(|r| r.base != *now) {
            self.running = None;
        }
        let mut out: BTreeMap<ObjectRef, Exclusion> =
            self.culprits.iter().map(|(o, (_, why))| (o.clone(), why.clone())).collect();
        if let Some(r) = &self.running {
            out.extend(r.narrower.excluded());
        }
        out
    }

    /// Records a render made from `now` leaving out `excluded` as `plan`; `true` when the gate
    /// has judged it already (a render equal to an earlier one) and the narrowing moved on:
    /// render again. Only the objects it let in are recorded (see the module documentation).
    pub fn published(
        &mut self,
        plan: PlanId,
        mut now: Versions,
        excluded: &BTreeMap<ObjectRef, Exclusion>,
        gate: &GateStatus,
    ) -> bool {
        self.newest = Some((plan, now.clone()));
        now.retain(|o, _| !excluded.contains_key(o));
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
        self.forget_before(gate.last_good);
        if let Some(r) = &mut self.running {
            let Some(p) = r.pending else { return false };
            let verdict = match &gate.last_refused {
                _ if gate.last_good == Some(p) => Ok(()),
                Some(refused) if refused.plan_id == p => {
                    Err(haptic_haproxy::check_output::check_words(&refused.output))
                }
                _ => return false,
            };
            r.pending = None;
            r.narrower.on_verdict(verdict.as_ref().map(|_| ()).map_err(String::as_str));
            match r.narrower.step() {
                Step::Trying => return true,
                Step::Done => {
                    for (o, why) in r.narrower.culprits() {
                        let v = r.base.get(o).cloned().unwrap_or_default();
                        self.culprits.insert(o.clone(), (v, Exclusion::GateRefused(why.clone())));
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
        let Some((newest, now)) = self.newest.as_ref() else { return false };
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

    /// Drops the versions of the plans published before `good`, the last plan the gate passed:
    /// a narrowing starts from the last good plan's versions, and the gate judges plans in the
    /// order they are published, so an older one is never asked for again. At thousands of
    /// routes each plan's versions are most of a megabyte.
    fn forget_before(&mut self, good: Option<PlanId>) {
        let Some(at) = good.and_then(|g| self.versions.iter().position(|(p, _)| *p == g)) else { return };
        self.versions.drain(..at);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use crate::gate::{GateMode, Refusal};

    fn ing(n: &str) -> ObjectRef {
        ObjectRef { kind: "Ingress".into(), namespace: "shop".into(), name: n.into() }
    }

    fn plan(n: u32) -> PlanId {
        PlanId(haptic_protocol::Digest::of(&n.to_be_bytes()))
    }

    fn gate(good: Option<u32>, refused: Option<u32>) -> GateStatus {
        GateStatus {
            mode: GateMode::Optimistic,
            pinned: refused.is_some() && refused > good,
            last_good: good.map(plan),
            last_refused: refused
                .map(|r| Refusal { plan_id: plan(r), output: "parsing [haproxy.cfg:9]: bad cert".into() }),
            render_error: None,
        }
    }

    fn versions(v: &[(&str, &str)]) -> Versions {
        v.iter().map(|(n, v)| (ing(n), v.to_string())).collect()
    }

    /// A render loop against a gate that refuses any render letting in an object at a version
    /// in `bad`; plans are numbered by render.
    #[derive(Default)]
    struct Sim {
        n: GateNarrowing,
        renders: u32,
        good: Option<u32>,
        refused: Option<u32>,
        bad: BTreeSet<(ObjectRef, String)>,
        /// The objects the last render the gate passed let in.
        last_good_in: Versions,
    }

    impl Sim {
        /// One render of `now`; `true` when the loop renders again at once. Checks that no
        /// object left out is at the version the last passing render let in.
        fn render(&mut self, now: &Versions) -> bool {
            self.renders += 1;
            let out = self.n.excluded(now);
            for o in out.keys() {
                assert_ne!(self.last_good_in.get(o), now.get(o), "{o} is left out but unchanged");
            }
            let rendered: Versions =
                now.iter().filter(|(o, _)| !out.contains_key(*o)).map(|(o, v)| (o.clone(), v.clone())).collect();
            if rendered.iter().any(|(o, v)| self.bad.contains(&(o.clone(), v.clone()))) {
                self.refused = Some(self.renders);
            } else {
                self.good = Some(self.renders);
                self.last_good_in = rendered;
            }
            self.n.published(plan(self.renders), now.clone(), &out, &gate(self.good, self.refused))
        }

        /// Renders until the loop waits for a change; how many renders that took.
        fn settle(&mut self, now: &Versions) -> u32 {
            let start = self.renders;
            while self.render(now) {
                assert!(self.renders - start < 200, "bounded");
            }
            self.renders - start
        }

        fn pinned(&self) -> bool {
            self.refused > self.good
        }

        fn left_out(&mut self, now: &Versions) -> Vec<String> {
            self.n.excluded(now).keys().map(|o| o.name.clone()).collect()
        }
    }

    #[test]
    fn only_the_versions_of_the_last_good_plan_and_newer_are_kept() {
        let mut sim = Sim::default();
        for v in 1..=5 {
            sim.settle(&versions(&[("a", &v.to_string())]));
        }
        let kept: Vec<PlanId> = sim.n.versions.iter().map(|(p, _)| *p).collect();
        assert_eq!(kept, [plan(5)], "every render passed: the newest is the last good");
        // Refused renders stay until one after them passes; the last good one stays with them.
        sim.bad.insert((ing("b"), "1".into()));
        sim.render(&versions(&[("a", "5"), ("b", "1")]));
        let kept: Vec<PlanId> = sim.n.versions.iter().map(|(p, _)| *p).collect();
        assert_eq!(kept, [plan(5), plan(6)]);
    }

    #[test]
    fn a_refused_render_is_narrowed_to_its_culprit() {
        let mut sim = Sim::default();
        sim.settle(&versions(&[("a", "1"), ("b", "1")]));
        let now = versions(&[("a", "2"), ("b", "1"), ("c", "1"), ("d", "1")]);
        sim.bad.insert((ing("c"), "1".into()));
        let renders = sim.settle(&now);
        assert_eq!((sim.left_out(&now), sim.pinned()), (vec!["c".to_string()], false), "only the culprit stays out");
        assert!(renders <= 8, "{renders}");
        let why = sim.n.excluded(&now)[&ing("c")].clone();
        assert_eq!(why, Exclusion::GateRefused("parsing [haproxy.cfg:9]: bad cert".into()));
        // A new version of the culprit is judged again.
        let mut fixed = now.clone();
        fixed.insert(ing("c"), "2".into());
        assert!(sim.n.excluded(&fixed).is_empty());
    }

    #[test]
    fn an_unchanged_object_is_never_left_out() {
        let mut n = GateNarrowing::default();
        let v = versions(&[("a", "1")]);
        let none = BTreeMap::new();
        n.published(plan(1), v.clone(), &none, &gate(Some(1), None));
        // The same objects, refused (the template changed, say): nothing to narrow.
        n.published(plan(2), v.clone(), &none, &gate(Some(1), None));
        assert!(!n.on_gate(&gate(Some(1), Some(2))));
        assert!(n.excluded(&v).is_empty());
    }

    #[test]
    fn a_change_while_narrowing_abandons_it() {
        let mut n = GateNarrowing::default();
        let none = BTreeMap::new();
        n.published(plan(1), versions(&[("a", "1")]), &none, &gate(Some(1), None));
        let now = versions(&[("a", "2"), ("b", "1")]);
        n.published(plan(2), now.clone(), &none, &gate(Some(1), None));
        assert!(n.on_gate(&gate(Some(1), Some(2))));
        assert_eq!(n.excluded(&now).len(), 2);
        let mut later = now.clone();
        later.insert(ing("b"), "2".into());
        assert!(n.excluded(&later).is_empty(), "a new change starts over from the whole");
        // The same refusal does not start a second narrowing.
        assert!(!n.on_gate(&gate(Some(1), Some(2))));
    }

    /// The render that left a culprit out passed; then another object changed before the
    /// narrowing let the culprit back in. The next narrowing must still suspect the culprit
    /// (it was never in a passing render), else it is stuck and nothing deploys again.
    #[test]
    fn a_concurrent_change_during_narrowing_never_pins_the_gate() {
        let mut sim = Sim::default();
        sim.settle(&versions(&[("a", "1")]));
        let with_bad = versions(&[("a", "1"), ("bad", "1")]);
        sim.bad.insert((ing("bad"), "1".into()));
        // Refused, then everything changed left out: that render passes.
        assert!(sim.render(&with_bad));
        assert!(sim.render(&with_bad));
        assert!(!sim.pinned());
        // An endpoint-carrying object changes before the culprit is tried alone.
        let later = versions(&[("a", "1"), ("bad", "1"), ("web", "1")]);
        sim.settle(&later);
        assert!(!sim.pinned(), "the gate is not pinned: the change deploys");
        assert_eq!(sim.left_out(&later), ["bad"]);
        assert_eq!(sim.last_good_in, versions(&[("a", "1"), ("web", "1")]));
    }

    #[test]
    fn an_object_adds_its_data_or_its_spec_and_the_largest_is_left_out_first() {
        let mut objects = super::super::routes::Objects::default();
        let mut big = k8s_openapi::api::core::v1::Secret::default();
        big.metadata.namespace = Some("shop".into());
        big.metadata.name = Some("big".into());
        big.data = Some([("tls.crt".to_string(), k8s_openapi::ByteString(vec![b'x'; 4096]))].into());
        let mut small = k8s_openapi::api::networking::v1::Ingress::default();
        small.metadata.namespace = Some("shop".into());
        small.metadata.name = Some("small".into());
        objects.secrets.push(std::sync::Arc::new(big));
        objects.ingresses.push(std::sync::Arc::new(small));
        let sizes = object_sizes(&objects);
        let secret = ObjectRef { kind: "Secret".into(), namespace: "shop".into(), name: "big".into() };
        assert_eq!(sizes[&secret], 4096);
        assert!(sizes[&ing("small")] < 64, "{sizes:?}");
        let limit = MAX_RENDER_BYTES;
        assert_eq!(haptic_render::narrow::to_fit(&sizes, limit + 100, limit), [secret]);
        assert!(haptic_render::narrow::to_fit(&sizes, limit, limit).is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A new version of object `i`, bad or good.
        Change { i: usize, bad: bool },
        /// One render (a narrowing may be in the middle).
        Render,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![(0..6usize, any::<bool>()).prop_map(|(i, bad)| Op::Change { i, bad }), Just(Op::Render)]
    }

    proptest! {
        /// Whatever changes arrive between renders, once they stop the loop rests within a
        /// bounded number of renders with the gate not pinned, leaving out exactly the objects
        /// at a bad version; no render ever leaves out an object the last passing render let
        /// in at the same version.
        #[test]
        fn a_left_out_object_never_pins_the_gate(ops in proptest::collection::vec(op(), 0..40)) {
            let names = ["a", "b", "c", "d", "e", "f"];
            let mut sim = Sim::default();
            let mut now: Versions = names.iter().map(|n| (ing(n), "0".to_string())).collect();
            sim.settle(&now);
            let mut next = 1;
            for op in ops {
                match op {
                    Op::Change { i, bad } => {
                        next += 1;
                        now.insert(ing(names[i]), next.to_string());
                        if bad {
                            sim.bad.insert((ing(names[i]), next.to_string()));
                        }
                    }
                    Op::Render => {
                        sim.render(&now);
                    }
                }
            }
            let renders = sim.settle(&now);
            prop_assert!(renders <= 3 * names.len() as u32 + 4, "{renders}");
            prop_assert!(!sim.pinned());
            let bad: Vec<String> = now
                .iter()
                .filter(|(o, v)| sim.bad.contains(&((*o).clone(), (*v).clone())))
                .map(|(o, _)| o.name.clone())
                .collect();
            prop_assert_eq!(sim.left_out(&now), bad);
        }
    }
}
