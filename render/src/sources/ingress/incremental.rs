//! The Ingress render that redoes only what endpoints change: [`Incremental`] keeps what its
//! last render translated (the Model but its backends, the verdicts, what each backend wants,
//! the map and certificate files) and, while every input but the EndpointSlices and the
//! previous slot map is the same, redoes only the backends' endpoints and slots and the
//! template (or, while the backends keep their server slots, fills the [`Skeleton`] of the
//! config cut around its servers). Its backend memo, kept across translations too, resolves
//! and plans again only the backends whose EndpointSlices, wants or previous slots changed.
//!
//! Owns the proof that the kept translation still holds: every Ingress, Service and Secret the
//! same `Arc` ([`Arc::ptr_eq`], in the same order) as last time, and the class, settings, allowed
//! annotations, refused snippets, left-out objects and host sharing equal (`==`); anything else
//! is a full translation. It must never serve a translation whose inputs it has not proven
//! unchanged, nor give other bytes, verdicts or slots than [`crate::render`] of the same input.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

use super::annotations::Allowed;
use super::assemble::BackendMemo;
use super::{translate_routes, IngressInput, Settings, Translated};
use crate::model::ObjectRef;
use crate::narrow::Exclusion;
use crate::ownership::HostSharing;
use crate::skeleton::Skeleton;
use crate::{model_files, template, Render, RenderError, Templates};

/// A stateful Ingress render: [`Incremental::render`] gives what [`crate::render`] gives, reusing
/// the last translation when only endpoints (or the previous slot map) changed.
#[derive(Debug, Default)]
pub struct Incremental {
    last: Option<Kept>,
    /// What the backends of the last render resolved and planned (valid across translations:
    /// keyed by every input it was made of).
    backends: BackendMemo,
    reused: bool,
    filled: bool,
}

/// The last translation and the inputs it holds for.
#[derive(Debug)]
struct Kept {
    of: Key,
    translated: Translated,
    /// The maps and certificates of `translated` (none depends on backends).
    files: BTreeMap<String, Vec<u8>>,
    /// `haproxy.cfg` cut around its servers, once an endpoint-only render ran the template.
    skeleton: Option<Skeleton>,
}

/// Every input a translation reads but the EndpointSlices and the previous slot map. The
/// objects are held (not only their addresses), so an `Arc` equal by pointer is the same,
/// unchanged object.
#[derive(Debug)]
struct Key {
    class: IngressClass,
    ingresses: Vec<Arc<Ingress>>,
    services: Vec<Arc<Service>>,
    secrets: Vec<Arc<Secret>>,
    settings: Settings,
    allowed: Allowed,
    refused_snippets: BTreeMap<String, String>,
    excluded: BTreeMap<ObjectRef, Exclusion>,
    sharing: HostSharing,
}

impl Key {
    fn of(input: &IngressInput) -> Self {
        Key {
            class: input.class.clone(),
            ingresses: input.ingresses.clone(),
            services: input.services.clone(),
            secrets: input.secrets.clone(),
            settings: input.settings.clone(),
            allowed: input.allowed,
            refused_snippets: input.refused_snippets.clone(),
            excluded: input.excluded.clone(),
            sharing: input.sharing,
        }
    }

    /// Whether `input` has the very objects and equal settings this key was taken of.
    fn holds(&self, input: &IngressInput) -> bool {
        same(&self.ingresses, &input.ingresses)
            && same(&self.services, &input.services)
            && same(&self.secrets, &input.secrets)
            && self.settings == input.settings
            && self.allowed == input.allowed
            && self.sharing == input.sharing
            && self.excluded == input.excluded
            && self.refused_snippets == input.refused_snippets
            && self.class == input.class
    }
}

/// Whether `a` and `b` hold the same objects (by pointer) in the same order.
fn same<T>(a: &[Arc<T>], b: &[Arc<T>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

impl Incremental {
    /// A render keeping nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Renders `input` as [`crate::render`] does, translating its routes again only when an input
    /// other than the EndpointSlices and the previous slot map changed.
    pub fn render(&mut self, input: &IngressInput, templates: &Templates) -> Result<Render, RenderError> {
        let kept = match self.last.take() {
            Some(k) if k.of.holds(input) => {
                self.reused = true;
                k
            }
            _ => {
                self.reused = false;
                let translated = translate_routes(input);
                let files = model_files(&translated.model)?;
                Kept { of: Key::of(input), translated, files, skeleton: None }
            }
        };
        let kept = self.last.insert(kept);
        let t = &mut kept.translated;
        let (backends, slots) = t.wants.backends(input, &mut self.backends);
        t.model.backends = backends;
        let filled = kept.skeleton.as_mut().and_then(|s| s.fill(&t.model, templates));
        self.filled = filled.is_some();
        let cfg = match filled {
            Some(cfg) => cfg,
            None => {
                let cfg = template::render_cfg(&t.model, templates)?;
                // Endpoints change again and again: the next endpoint-only renders fill this.
                if self.reused {
                    kept.skeleton = Skeleton::cut(&t.model, templates, &cfg)?;
                }
                cfg
            }
        };
        let mut files = kept.files.clone();
        files.insert("haproxy.cfg".to_string(), cfg.into_bytes());
        Ok(Render { files, verdicts: t.verdicts.clone(), slots, certificates: crate::certificates(&t.model) })
    }

    /// Whether the last [`Incremental::render`] reused the translation before it.
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Whether the last [`Incremental::render`] filled the kept skeleton instead of running the
    /// template.
    pub fn filled(&self) -> bool {
        self.filled
    }

    /// Forgets the kept translation: the next render translates in full.
    pub fn clear(&mut self) {
        self.last = None;
        self.backends = BackendMemo::default();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use proptest::prelude::*;

    use super::super::fixture::input;
    use super::*;

    const FIXTURES: [&str; 5] = [
        include_str!("../../../tests/fixtures/basic.yaml"),
        include_str!("../../../tests/fixtures/canary.yaml"),
        include_str!("../../../tests/fixtures/annotations.yaml"),
        include_str!("../../../tests/fixtures/nginx.yaml"),
        include_str!("../../../tests/fixtures/policies.yaml"),
    ];

    /// `fixture` with a `default-backend` on its first Ingress, naming the Service of its first
    /// EndpointSlice, so backup servers follow endpoints too.
    fn with_fallback(fixture: &str) -> IngressInput {
        let mut i = input(fixture);
        let svc = i.endpoint_slices[0].metadata.labels.as_ref().and_then(|l| l.get(super::super::SERVICE_NAME_LABEL));
        let svc = svc.cloned().unwrap_or_default();
        let ing = Arc::make_mut(&mut i.ingresses[0]);
        ing.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("nginx.ingress.kubernetes.io/default-backend".into(), svc);
        i
    }

    /// A change between two renders.
    #[derive(Debug, Clone)]
    enum Step {
        /// An endpoint of a slice gets another address.
        Move(usize, usize, u8),
        /// A slice gains an endpoint.
        Add(usize, u8),
        /// A slice loses an endpoint.
        Remove(usize, usize),
        /// An endpoint turns terminating (serving: draining) or ready again.
        Terminate(usize, usize, bool),
        /// A slice goes (its Service loses its endpoints) or comes back (first endpoints).
        Toggle(usize),
        /// An Ingress is replaced by an equal copy (a new `Arc`): a full translation.
        Touch(usize),
        /// The settings change: a full translation.
        Slots,
    }

    /// The `n`th EndpointSlice of `i` (modulo their number), to change.
    fn slice(i: &mut IngressInput, n: usize) -> Option<&mut k8s_openapi::api::discovery::v1::EndpointSlice> {
        let len = i.endpoint_slices.len();
        (len > 0).then(|| Arc::make_mut(&mut i.endpoint_slices[n % len]))
    }

    impl Step {
        /// Whether the step may be served from the kept translation.
        fn endpoints_only(&self) -> bool {
            !matches!(self, Step::Touch(_) | Step::Slots)
        }

        fn apply(&self, i: &mut IngressInput, gone: &mut Vec<Arc<k8s_openapi::api::discovery::v1::EndpointSlice>>) {
            match *self {
                Step::Move(s, e, b) => {
                    if let Some(sl) = slice(i, s).filter(|sl| !sl.endpoints.is_empty()) {
                        let n = sl.endpoints.len();
                        sl.endpoints[e % n].addresses = vec![format!("10.7.0.{b}")];
                    }
                }
                Step::Add(s, b) => {
                    if let Some(sl) = slice(i, s) {
                        sl.endpoints.push(Endpoint { addresses: vec![format!("10.8.0.{b}")], ..Default::default() });
                    }
                }
                Step::Remove(s, e) => {
                    if let Some(sl) = slice(i, s).filter(|sl| !sl.endpoints.is_empty()) {
                        let n = sl.endpoints.len();
                        sl.endpoints.remove(e % n);
                    }
                }
                Step::Terminate(s, e, t) => {
                    if let Some(sl) = slice(i, s).filter(|sl| !sl.endpoints.is_empty()) {
                        let n = sl.endpoints.len();
                        sl.endpoints[e % n].conditions =
                            Some(EndpointConditions { ready: Some(!t), serving: Some(true), terminating: Some(t) });
                    }
                }
                Step::Toggle(s) => {
                    if !gone.is_empty() {
                        let n = gone.len();
                        i.endpoint_slices.push(gone.remove(s % n));
                    } else if !i.endpoint_slices.is_empty() {
                        let n = i.endpoint_slices.len();
                        gone.push(i.endpoint_slices.remove(s % n));
                    }
                }
                Step::Touch(n) => {
                    let len = i.ingresses.len();
                    let copy = Ingress::clone(&i.ingresses[n % len]);
                    i.ingresses[n % len] = Arc::new(copy);
                }
                Step::Slots => i.settings.min_slots = i.settings.min_slots % 4 + 1,
            }
        }
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0..8usize, 0..8usize, 1..250u8).prop_map(|(s, e, b)| Step::Move(s, e, b)),
            3 => (0..8usize, 1..250u8).prop_map(|(s, b)| Step::Add(s, b)),
            3 => (0..8usize, 0..8usize).prop_map(|(s, e)| Step::Remove(s, e)),
            2 => (0..8usize, 0..8usize, any::<bool>()).prop_map(|(s, e, t)| Step::Terminate(s, e, t)),
            2 => (0..8usize).prop_map(Step::Toggle),
            1 => (0..8usize).prop_map(Step::Touch),
            1 => Just(Step::Slots),
        ]
    }

    /// Renders `i` both ways and checks they agree; each render's slots feed the next.
    fn both(inc: &mut Incremental, i: &mut IngressInput) -> Render {
        let t = Templates::default();
        let whole = crate::render(i, &t).unwrap();
        let mine = inc.render(i, &t).unwrap();
        assert_eq!(mine, whole, "the incremental render differs from the whole one");
        i.previous_slots = whole.slots.clone();
        whole
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Over any sequence of endpoint changes (canaries, default backends, draining, Services
        /// losing and gaining their endpoints) the incremental render gives the whole render's
        /// files, verdicts and slots, reusing the translation exactly when only endpoints
        /// changed.
        #[test]
        fn the_incremental_render_is_the_whole_render(
            fixture in 0..FIXTURES.len(),
            fallback in any::<bool>(),
            steps in prop::collection::vec(step(), 1..12),
        ) {
            let mut i = if fallback { with_fallback(FIXTURES[fixture]) } else { input(FIXTURES[fixture]) };
            let mut inc = Incremental::new();
            let mut gone = Vec::new();
            both(&mut inc, &mut i);
            prop_assert!(!inc.reused());
            for s in &steps {
                s.apply(&mut i, &mut gone);
                both(&mut inc, &mut i);
                prop_assert_eq!(inc.reused(), s.endpoints_only(), "{:?}", s);
            }
        }
    }

    /// The first endpoint-only render runs the template and cuts the skeleton; the next ones
    /// fill it, until a server slot is added (the template again) or a translation.
    #[test]
    fn endpoint_only_renders_fill_the_skeleton_while_the_slots_stay() {
        let mut i = input(FIXTURES[0]);
        let mut inc = Incremental::new();
        let mut gone = Vec::new();
        both(&mut inc, &mut i);
        let mut filled = Vec::new();
        for s in
            [Step::Move(0, 0, 9), Step::Move(0, 0, 10), Step::Terminate(0, 0, true), Step::Slots, Step::Move(0, 0, 11)]
        {
            s.apply(&mut i, &mut gone);
            both(&mut inc, &mut i);
            filled.push(inc.filled());
        }
        assert_eq!(filled, [false, true, true, false, false]);
    }

    /// The canary weights follow the endpoint counts on the fast path.
    #[test]
    fn canary_weights_follow_endpoints_on_the_fast_path() {
        let mut i = input(FIXTURES[1]);
        let mut inc = Incremental::new();
        let weights = |r: &Render| -> Vec<String> {
            let cfg = String::from_utf8(r.files["haproxy.cfg"].clone()).unwrap();
            cfg.lines().filter(|l| l.contains("server SRV_") && l.contains(" weight ")).map(String::from).collect()
        };
        let before = both(&mut inc, &mut i);
        Step::Add(0, 2).apply(&mut i, &mut Vec::new());
        Step::Add(0, 3).apply(&mut i, &mut Vec::new());
        let after = both(&mut inc, &mut i);
        assert!(inc.reused());
        assert_ne!(weights(&before), weights(&after), "three main servers share the main's part");
    }

    /// A changed Ingress (a new `Arc`) is translated again, never served from the kept
    /// translation, even when the EndpointSlices changed with it; so is a changed Service or
    /// Secret list, class or setting.
    #[test]
    fn a_changed_object_is_never_served_from_the_cache() {
        let t = Templates::default();
        let mut i = input(FIXTURES[0]);
        let mut inc = Incremental::new();
        let first = both(&mut inc, &mut i);
        let ing = Arc::make_mut(&mut i.ingresses[0]);
        let rules = ing.spec.as_mut().unwrap().rules.as_mut().unwrap();
        rules[0].host = Some("moved.example.com".into());
        Step::Move(0, 0, 9).apply(&mut i, &mut Vec::new());
        let second = inc.render(&i, &t).unwrap();
        assert!(!inc.reused());
        assert_eq!(second, crate::render(&i, &t).unwrap());
        assert_ne!(second.files["maps/hosts.map"], first.files["maps/hosts.map"]);
        let changes: [fn(&mut IngressInput); 5] = [
            |i| i.services.push(Arc::new(Service::default())),
            |i| i.secrets.push(Arc::new(Secret::default())),
            |i| i.class.metadata.name = Some("other".into()),
            |i| i.allowed.snippets = !i.allowed.snippets,
            |i| i.sharing = HostSharing::Shared,
        ];
        for change in changes {
            inc.render(&i, &t).unwrap();
            assert!(inc.reused());
            change(&mut i);
            assert_eq!(inc.render(&i, &t).unwrap(), crate::render(&i, &t).unwrap());
            assert!(!inc.reused());
        }
        let excluded = ObjectRef { kind: "Ingress".into(), namespace: "shop".into(), name: "old".into() };
        i.excluded.insert(excluded, Exclusion::Suspect);
        assert_eq!(inc.render(&i, &t).unwrap(), crate::render(&i, &t).unwrap());
        assert!(!inc.reused());
        i.refused_snippets.insert("x".into(), "y".into());
        assert_eq!(inc.render(&i, &t).unwrap(), crate::render(&i, &t).unwrap());
        assert!(!inc.reused());
    }
}
