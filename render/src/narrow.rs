//! Gate narrowing: when `haproxy -c` still refuses a render the translator accepted, which
//! objects to leave out of the next renders so the rest deploys, down to the culprits.
//!
//! Owns the decision only: [`changed`] (the objects whose version differs from the last render
//! the gate passed, or that are new) and the [`Narrower`], a bisection over them. First every
//! changed object is left out (that render is the last good one plus unchanged objects, so it
//! should pass, and deploys); then groups of them are let back in, half by half: a group whose
//! render passes stays in, a refused group of one is a culprit and stays out with the gate's
//! words; a refused larger group is split. Culprits go into [`crate::IngressInput::excluded`]
//! and so into their own verdicts (status and Events). [`to_fit`] picks the objects a render
//! over its size limit leaves out: its largest contributors. It must never run the gate nor read the
//! clock: a shell renders with [`Narrower::excluded`], runs the gate, and calls
//! [`Narrower::on_verdict`]. Pure.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::model::ObjectRef;

/// Why an object is left out of a render: what its verdict says (as a [`Cause::LeftOut`]
/// refusal, so `Verdict::left_out`).
///
/// [`Cause::LeftOut`]: crate::Cause::LeftOut
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclusion {
    /// Under suspicion while the controller narrows down which change the gate refuses.
    Suspect,
    /// With it the render fails `haproxy -c`: HAProxy's words.
    GateRefused(String),
    /// With it the render is over its size limit of this many bytes.
    TooLarge(u64),
}

impl std::fmt::Display for Exclusion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exclusion::Suspect => {
                f.write_str("left out while the controller narrows down which change the gate refuses")
            }
            Exclusion::GateRefused(words) => write!(f, "left out: with it the render fails haproxy -c: {words}"),
            Exclusion::TooLarge(limit) => {
                write!(f, "left out: with it the render is over its size limit of {limit} bytes")
            }
        }
    }
}

/// The objects of `now` whose version differs from `last_good`'s, or that `last_good` lacks
/// (objects by kind, namespace and name; versions are whatever the caller compares, such as
/// `metadata.resourceVersion`).
pub fn changed(last_good: &BTreeMap<ObjectRef, String>, now: &BTreeMap<ObjectRef, String>) -> BTreeSet<ObjectRef> {
    now.iter().filter(|(o, v)| last_good.get(*o) != Some(*v)).map(|(o, _)| o.clone()).collect()
}

/// Where a narrowing stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The next render leaves out [`Narrower::excluded`]; its verdict goes to
    /// [`Narrower::on_verdict`].
    Trying,
    /// Every changed object is judged: the culprits stay out, the rest is in.
    Done,
    /// Even with every changed object left out the gate refuses: the cause is not among them
    /// (the template, the admin's snippets), so narrowing cannot help and the gate stays pinned.
    Stuck,
}

/// The objects to leave out of a render of `total` bytes so it fits in `limit`: the largest
/// contributors first (`adds`: the bytes each object adds to the render; ties by kind,
/// namespace and name), until what stays fits; every contributor when even that does not fit.
/// Empty when the render fits.
pub fn to_fit(adds: &BTreeMap<ObjectRef, u64>, total: u64, limit: u64) -> Vec<ObjectRef> {
    let mut by_size: Vec<(&ObjectRef, u64)> = adds.iter().map(|(o, b)| (o, *b)).collect();
    by_size.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let mut left = total;
    let mut out = Vec::new();
    for (o, bytes) in by_size {
        if left <= limit {
            break;
        }
        left = left.saturating_sub(bytes);
        out.push(o.clone());
    }
    out
}

/// A bisection over the changed objects of a refused render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Narrower {
    /// Every object under suspicion at the start.
    suspects: BTreeSet<ObjectRef>,
    /// Let back in: their render passed.
    cleared: BTreeSet<ObjectRef>,
    /// Out for good, with the gate's words.
    culprits: BTreeMap<ObjectRef, String>,
    /// Groups still to try, first first.
    queue: VecDeque<Vec<ObjectRef>>,
    /// The group the pending render lets in; `None` for the first render (all left out).
    trial: Option<Vec<ObjectRef>>,
    step: Step,
}

impl Narrower {
    /// Starts over the changed objects of a refused render (see [`changed`]).
    pub fn start(changed: BTreeSet<ObjectRef>) -> Self {
        let all: Vec<ObjectRef> = changed.iter().cloned().collect();
        let queue = if all.is_empty() { VecDeque::new() } else { VecDeque::from([all]) };
        let step = if changed.is_empty() { Step::Stuck } else { Step::Trying };
        Narrower { suspects: changed, cleared: BTreeSet::new(), culprits: BTreeMap::new(), queue, trial: None, step }
    }

    /// Where it stands.
    pub fn step(&self) -> &Step {
        &self.step
    }

    /// What the next render leaves out, each with why (for its verdict): the culprits with the
    /// gate's words, the others as still under suspicion.
    pub fn excluded(&self) -> BTreeMap<ObjectRef, Exclusion> {
        let trying: BTreeSet<&ObjectRef> = self.trial.iter().flatten().collect();
        let mut out: BTreeMap<ObjectRef, Exclusion> = self
            .suspects
            .iter()
            .filter(|o| !self.cleared.contains(*o) && !trying.contains(o) && !self.culprits.contains_key(*o))
            .map(|o| (o.clone(), Exclusion::Suspect))
            .collect();
        for (o, why) in &self.culprits {
            out.insert(o.clone(), Exclusion::GateRefused(why.clone()));
        }
        out
    }

    /// The culprits found so far, with the gate's words.
    pub fn culprits(&self) -> &BTreeMap<ObjectRef, String> {
        &self.culprits
    }

    /// Moves on the gate's verdict on the render made with [`Narrower::excluded`]: `Ok` when it
    /// passed, `Err` with HAProxy's words when refused. After [`Step::Done`] or
    /// [`Step::Stuck`] it changes nothing.
    pub fn on_verdict(&mut self, verdict: Result<(), &str>) {
        if self.step != Step::Trying {
            return;
        }
        match (self.trial.take(), verdict) {
            // Everything changed left out, and still refused: not ours to find.
            (None, Err(_)) => {
                self.step = Step::Stuck;
                return;
            }
            (None, Ok(())) => {}
            (Some(group), Ok(())) => self.cleared.extend(group),
            (Some(group), Err(words)) if group.len() == 1 => {
                self.culprits.insert(group[0].clone(), words.to_string());
            }
            (Some(group), Err(_)) => {
                let (a, b) = group.split_at(group.len() / 2);
                self.queue.push_front(b.to_vec());
                self.queue.push_front(a.to_vec());
            }
        }
        match self.queue.pop_front() {
            Some(next) => self.trial = Some(next),
            None => self.step = Step::Done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ing(n: &str) -> ObjectRef {
        ObjectRef { kind: "Ingress".into(), namespace: "shop".into(), name: n.into() }
    }

    /// Runs a narrowing against a gate that refuses any render letting in one of `bad`;
    /// returns the culprits and how many renders it took.
    fn run(changed: &[&str], bad: &[&str]) -> (Vec<String>, usize, Step) {
        let mut n = Narrower::start(changed.iter().map(|c| ing(c)).collect());
        let mut renders = 0;
        while *n.step() == Step::Trying {
            renders += 1;
            assert!(renders <= 64, "bounded");
            let out = n.excluded();
            let in_render = |o: &str| !changed.contains(&o) || !out.contains_key(&ing(o));
            let refused = bad.iter().any(|b| in_render(b));
            n.on_verdict(if refused { Err("bad line") } else { Ok(()) });
        }
        (n.culprits().keys().map(|o| o.name.clone()).collect(), renders, n.step().clone())
    }

    #[test]
    fn only_what_changed_is_suspected() {
        let good = BTreeMap::from([(ing("a"), "1".to_string()), (ing("b"), "1".to_string())]);
        let now = BTreeMap::from([(ing("a"), "1".to_string()), (ing("b"), "2".to_string()), (ing("c"), "1".into())]);
        assert_eq!(changed(&good, &now), BTreeSet::from([ing("b"), ing("c")]));
    }

    #[test]
    fn one_culprit_among_many_is_found_and_the_rest_deploys() {
        let names: Vec<String> = (0..16).map(|i| format!("i{i:02}")).collect();
        let changed: Vec<&str> = names.iter().map(String::as_str).collect();
        let (culprits, renders, step) = run(&changed, &["i11"]);
        assert_eq!((culprits, step), (vec!["i11".to_string()], Step::Done));
        // All out, then a binary search: about 2 · log2(16) renders, not 16.
        assert!(renders <= 10, "{renders}");
    }

    #[test]
    fn every_culprit_is_found() {
        let (culprits, _, step) = run(&["a", "b", "c", "d", "e"], &["b", "e"]);
        assert_eq!((culprits, step), (vec!["b".to_string(), "e".to_string()], Step::Done));
        let (culprits, renders, _) = run(&["a"], &["a"]);
        assert_eq!((culprits, renders), (vec!["a".to_string()], 2));
        let (culprits, _, step) = run(&["a", "b"], &[]);
        assert_eq!((culprits.len(), step), (0, Step::Done), "a gate that passes everything clears everyone");
    }

    #[test]
    fn a_cause_outside_the_changes_is_not_narrowed() {
        let (culprits, renders, step) = run(&["a", "b"], &["zz-not-changed"]);
        assert_eq!((culprits.len(), renders, step), (0, 1, Step::Stuck));
        assert_eq!(*Narrower::start(BTreeSet::new()).step(), Step::Stuck);
    }

    proptest::proptest! {
        /// Whatever the gate answers, a narrowing ends (Done or Stuck) within 2·n renders and
        /// never leaves out an object that did not change.
        #[test]
        fn any_verdicts_end_within_a_bound_and_leave_out_only_changed_objects(
            n in 0..12usize,
            verdicts in proptest::collection::vec(proptest::prelude::any::<bool>(), 0..64),
        ) {
            let changed: BTreeSet<ObjectRef> = (0..n).map(|i| ing(&format!("i{i}"))).collect();
            let mut nar = Narrower::start(changed.clone());
            let mut renders = 0;
            let mut answers = verdicts.into_iter().chain(std::iter::repeat(true));
            while *nar.step() == Step::Trying {
                proptest::prop_assert!(nar.excluded().keys().all(|o| changed.contains(o)));
                renders += 1;
                proptest::prop_assert!(renders <= 2 * n, "{renders} renders for {n}");
                let pass = answers.next().unwrap_or(true);
                nar.on_verdict(if pass { Ok(()) } else { Err("refused") });
            }
            proptest::prop_assert!(nar.culprits().keys().all(|o| changed.contains(o)));
        }
    }

    #[test]
    fn a_render_over_its_limit_leaves_out_its_largest_contributors() {
        let adds = BTreeMap::from([(ing("small"), 10), (ing("big"), 500), (ing("mid"), 100), (ing("mid2"), 100)]);
        assert!(to_fit(&adds, 900, 1000).is_empty(), "it fits");
        assert_eq!(to_fit(&adds, 1200, 1000), [ing("big")]);
        // Ties by name; only as many as needed.
        assert_eq!(to_fit(&adds, 1550, 1000), [ing("big"), ing("mid")]);
        // Nothing fits: every contributor is left out, largest first.
        assert_eq!(to_fit(&adds, 5000, 1000), [ing("big"), ing("mid"), ing("mid2"), ing("small")]);
        assert!(to_fit(&BTreeMap::new(), 5000, 1000).is_empty());
    }

    #[test]
    fn excluded_says_why() {
        let mut n = Narrower::start(BTreeSet::from([ing("a"), ing("b")]));
        assert_eq!(n.excluded().len(), 2);
        assert_eq!(n.excluded()[&ing("a")], Exclusion::Suspect);
        n.on_verdict(Ok(()));
        // Both let in together: refused, so split.
        assert!(n.excluded().is_empty());
        n.on_verdict(Err("parsing [haproxy.cfg:9] : unknown keyword"));
        assert_eq!(n.excluded().keys().cloned().collect::<Vec<_>>(), [ing("b")], "a is tried alone");
        n.on_verdict(Err("parsing [haproxy.cfg:9] : unknown keyword"));
        assert_eq!(n.excluded()[&ing("a")], Exclusion::GateRefused("parsing [haproxy.cfg:9] : unknown keyword".into()));
        n.on_verdict(Ok(()));
        assert_eq!(*n.step(), Step::Done);
        assert_eq!(n.excluded().keys().cloned().collect::<Vec<_>>(), [ing("a")]);
    }
}
