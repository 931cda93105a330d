//! Slot planning: which endpoint sits in which named server slot of a backend.
//!
//! Owns the rule that an endpoint keeps its slot across renders (given the last ACKed slot
//! map), that new endpoints take the lowest free slot, that a backend has at least a fixed
//! number of slots and never shrinks (spare slots are parked `disabled`), so endpoint churn is
//! a runtime change of a server, not a reload; and that a backend no route names any more is
//! kept, retired, with every slot parked (up to [`RETIRED_KEPT`], oldest dropped first), so the
//! last route to a Service going, and coming back, is a runtime change too. [`plan_backends`]
//! is the one backend planner every source uses. It must never read a ClusterIP: endpoints come
//! from EndpointSlices only.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::{Backend, BackendOptions, Server};

/// What ends the slot map key of a backend's backup slots (`<backend>#backup`): they live and
/// go with their backend, never retired alone.
pub const BACKUP_SLOTS: &str = "#backup";

/// A backend a render wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Its endpoints.
    pub endpoints: Vec<Endpoint>,
    /// The fewest slots it gets.
    pub min_slots: usize,
    /// Its options.
    pub options: BackendOptions,
    /// The weight of each endpoint that has one (the others get the default).
    pub weights: BTreeMap<SocketAddr, u16>,
    /// The endpoints of its backup servers (`BAK_<n>`, at least two slots), when it has some.
    pub backups: Option<Vec<Endpoint>>,
}

/// The backends of a render, sorted by name: each wanted one's servers planned against the
/// previous render's slot map `prev`, and those no route names any more, retired with every
/// slot parked (at least `retired_min` slots), so a backend's last route going (and one coming
/// back) is a change of servers and maps, not of sections; the assignments go into `slot_map`
/// (`backends` and `retired`). A backend whose wants and previous slots are those `memo` holds
/// takes its servers from there; `memo` then holds this render's.
pub fn plan_backends(
    prev: &SlotMap,
    wanted: BTreeMap<String, Wanted>,
    retired_min: usize,
    slot_map: &mut SlotMap,
    memo: &mut PlanMemo,
) -> Vec<Backend> {
    // Backup slots are never retired alone: they count as active, and go with their backend.
    let backups = prev.backends.keys().filter(|k| k.ends_with(BACKUP_SLOTS));
    let active: BTreeSet<&str> = wanted.keys().chain(backups).map(String::as_str).collect();
    slot_map.retired = retired(prev, &active, RETIRED_KEPT);
    // A retired backend keeps its shape (the protocol its servers speak, `mode tcp`), so its
    // section's text does not change with its last route going.
    let parked = |name: &String| {
        let shape = prev.shapes.get(name).copied().unwrap_or_default();
        let options = BackendOptions { protocol: shape.protocol, passthrough: shape.passthrough, ..Default::default() };
        Wanted { min_slots: retired_min, options, ..Wanted::default() }
    };
    let retired = slot_map.retired.iter().map(|n| (n.clone(), parked(n)));
    let all: BTreeMap<String, Wanted> = wanted.into_iter().chain(retired).collect();
    slot_map.shapes = all
        .iter()
        .map(|(n, w)| (n, Shape { protocol: w.options.protocol, passthrough: w.options.passthrough }))
        .filter(|(_, s)| *s != Shape::default())
        .map(|(n, s)| (n.clone(), s))
        .collect();
    memo.generation += 1;
    let mut out = Vec::with_capacity(all.len());
    for (name, w) in all {
        let backup_key = w.backups.is_some().then(|| format!("{name}{BACKUP_SLOTS}"));
        let was = (prev.backends.get(&name), backup_key.as_ref().and_then(|k| prev.backends.get(k)));
        let planned = match memo.planned.get_mut(&name) {
            Some(p) => {
                if !p.holds(&w, was) {
                    *p = Planned::of(w, was);
                }
                p
            }
            None => memo.planned.entry(name.clone()).or_insert_with(|| Planned::of(w, was)),
        };
        planned.generation = memo.generation;
        if let (Some(backup), Some(s)) = (backup_key, &planned.backup_slots) {
            slot_map.backends.insert(backup, Arc::clone(s));
        }
        slot_map.backends.insert(name.clone(), Arc::clone(&planned.slots));
        out.push(Backend { name, servers: planned.servers.clone(), options: planned.wanted.options.clone() });
    }
    let generation = memo.generation;
    memo.planned.retain(|_, p| p.generation == generation);
    out
}

/// What [`plan_backends`] planned for each backend of its last render: reused for a backend
/// whose wants and previous slots are the same, as planning depends on those alone.
#[derive(Debug, Clone, Default)]
pub struct PlanMemo {
    planned: BTreeMap<String, Planned>,
    /// Counts the calls; what the last one did not plan is dropped. Entries are updated in
    /// place and swept by generation: taking the map and inserting every entry again made a
    /// moved endpoint at 1,000 backends 0.7 ms slower (`bench --only render_scale`).
    generation: u64,
}

/// A backend's slots and backup slots in the previous slot map.
type Was<'a> = (Option<&'a Arc<BackendSlots>>, Option<&'a Arc<BackendSlots>>);

/// One backend's planning: what it was planned of, and what it gave.
#[derive(Debug, Clone)]
struct Planned {
    wanted: Wanted,
    /// Its slots, and its backup slots, in the previous slot map.
    prev: (Option<Arc<BackendSlots>>, Option<Arc<BackendSlots>>),
    servers: Vec<Server>,
    slots: Arc<BackendSlots>,
    backup_slots: Option<Arc<BackendSlots>>,
    /// The last [`PlanMemo::generation`] that planned this backend.
    generation: u64,
}

impl Planned {
    /// Plans `w` against its previous slots and backup slots `was`.
    fn of(w: Wanted, was: Was<'_>) -> Self {
        let (mut servers, slots) = plan(&w.endpoints, was.0.map(Arc::as_ref), w.min_slots);
        for srv in &mut servers {
            srv.weight = srv.endpoint.and_then(|a| w.weights.get(&a).copied());
        }
        let mut backup_slots = None;
        if let Some(fb) = &w.backups {
            let (backups, s) = plan(fb, was.1.map(Arc::as_ref), 2);
            servers.extend(backups.into_iter().map(|mut b| {
                b.name = b.name.replacen("SRV_", "BAK_", 1);
                b.backup = true;
                b
            }));
            backup_slots = Some(Arc::new(s));
        }
        let prev = (was.0.cloned(), was.1.cloned());
        Planned { wanted: w, prev, servers, slots: Arc::new(slots), backup_slots, generation: 0 }
    }

    /// Whether planning `w` against `was` gives this again.
    fn holds(&self, w: &Wanted, was: Was<'_>) -> bool {
        let same = |a: Option<&Arc<BackendSlots>>, b: Option<&Arc<BackendSlots>>| match (a, b) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            (a, b) => a.is_none() && b.is_none(),
        };
        let p = &self.wanted;
        p.endpoints == w.endpoints
            && p.min_slots == w.min_slots
            && p.weights == w.weights
            && p.backups == w.backups
            && p.options == w.options
            && same(self.prev.0.as_ref(), was.0)
            && same(self.prev.1.as_ref(), was.1)
    }
}

/// Per backend: its slot count and which endpoint sits in which slot (0-based).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotMap {
    /// Backend name → its slots (retired backends included); shared with the renders that
    /// planned the same slots, so the slot maps a controller keeps cost what changed.
    pub backends: BTreeMap<String, Arc<BackendSlots>>,
    /// The retired backends: no route names them; kept with every slot parked. Oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<String>,
    /// Gateway API: `<namespace>/<gateway>:<listener port>` → the bind port serving it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bind_ports: BTreeMap<String, u16>,
    /// Backend name → its [`Shape`], for those (retired ones included) not of the default one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub shapes: BTreeMap<String, Shape>,
}

/// What of a backend's options a retired one keeps: what its servers speak and whether it is
/// `mode tcp`. Never a file its options name (a CA, a client certificate), which a render
/// without its route no longer writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// The protocol its servers speak.
    pub protocol: crate::model::Protocol,
    /// `mode tcp`.
    pub passthrough: bool,
}

/// How many retired backends a render keeps. Dropping one removes its `backend` section, which
/// HAProxy takes only with a reload.
pub const RETIRED_KEPT: usize = 64;

/// The backends retired after a render whose routes name `active`, given the previous slot map
/// `prev`: those of `prev` that are not active, the ones already retired first (in their
/// order), then the newly retired by name; at most `keep`, the oldest dropped.
pub fn retired(prev: &SlotMap, active: &BTreeSet<&str>, keep: usize) -> Vec<String> {
    let mut out: Vec<String> = prev
        .retired
        .iter()
        .filter(|n| prev.backends.contains_key(*n) && !active.contains(n.as_str()))
        .cloned()
        .collect();
    for name in prev.backends.keys() {
        if !active.contains(name.as_str()) && !out.contains(name) {
            out.push(name.clone());
        }
    }
    let extra = out.len().saturating_sub(keep);
    out.drain(..extra);
    out
}

/// One backend's slots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendSlots {
    /// How many slots the backend has.
    pub count: usize,
    /// Endpoint → slot index (0-based; the server is `SRV_<index+1>`).
    pub endpoints: BTreeMap<SocketAddr, usize>,
}

/// One endpoint to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    /// Address and target port.
    pub addr: SocketAddr,
    /// Serving but terminating: kept in its slot with no new traffic.
    pub draining: bool,
}

/// Places `endpoints` into slots, keeping every endpoint of `prev` that is still present in
/// its slot. Returns the servers in slot order and the new assignments.
pub fn plan(endpoints: &[Endpoint], prev: Option<&BackendSlots>, min_slots: usize) -> (Vec<Server>, BackendSlots) {
    let present: BTreeMap<SocketAddr, bool> = endpoints.iter().map(|e| (e.addr, e.draining)).collect();
    let mut assigned: BTreeMap<SocketAddr, usize> = BTreeMap::new();
    let mut used = BTreeSet::new();
    if let Some(prev) = prev {
        for (addr, slot) in &prev.endpoints {
            if present.contains_key(addr) && used.insert(*slot) {
                assigned.insert(*addr, *slot);
            }
        }
    }
    let mut next = 0usize;
    for addr in present.keys() {
        if assigned.contains_key(addr) {
            continue;
        }
        while used.contains(&next) {
            next += 1;
        }
        used.insert(next);
        assigned.insert(*addr, next);
    }
    let highest = assigned.values().map(|s| s + 1).max().unwrap_or(0);
    let count = min_slots.max(highest).max(prev.map_or(0, |p| p.count));
    let mut servers: Vec<Server> = (0..count)
        .map(|i| Server {
            name: format!("SRV_{}", i + 1),
            endpoint: None,
            draining: false,
            weight: None,
            backup: false,
        })
        .collect();
    for (addr, slot) in &assigned {
        servers[*slot].endpoint = Some(*addr);
        servers[*slot].draining = present[addr];
    }
    (servers, BackendSlots { count, endpoints: assigned })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ep(i: u8) -> Endpoint {
        Endpoint { addr: SocketAddr::from(([10, 0, 0, i], 8080)), draining: false }
    }

    /// A retired backend keeps its shape (`mode tcp`, the protocol of its servers) and so its
    /// section's text; only the shape is kept, and only for backends not of the default one.
    #[test]
    fn a_retired_backend_keeps_its_shape() {
        use crate::model::Protocol;
        let shaped = |protocol, passthrough| Wanted {
            endpoints: vec![ep(1)],
            min_slots: 2,
            options: BackendOptions { protocol, passthrough, connect_timeout: Some(3), ..Default::default() },
            ..Wanted::default()
        };
        let wanted: BTreeMap<String, Wanted> = [
            ("tcp".to_string(), shaped(Protocol::Http, true)),
            ("grpc".to_string(), shaped(Protocol::H2c, false)),
            ("plain".to_string(), shaped(Protocol::Http, false)),
        ]
        .into();
        let mut first = SlotMap::default();
        plan_backends(&SlotMap::default(), wanted, 2, &mut first, &mut PlanMemo::default());
        assert_eq!(first.shapes.len(), 2, "{:?}", first.shapes);
        let mut second = SlotMap::default();
        let bs = plan_backends(&first, BTreeMap::new(), 2, &mut second, &mut PlanMemo::default());
        let opts = |n: &str| bs.iter().find(|b| b.name == n).unwrap().options.clone();
        assert_eq!((opts("tcp").passthrough, opts("tcp").protocol), (true, Protocol::Http));
        assert_eq!((opts("grpc").passthrough, opts("grpc").protocol), (false, Protocol::H2c));
        assert_eq!(opts("tcp").connect_timeout, None, "only the shape is kept");
        assert_eq!(second.shapes, first.shapes, "kept while retired");
        assert!(bs.iter().all(|b| b.servers.iter().all(|s| s.endpoint.is_none())), "every slot parked");
    }

    /// A backend's backup slots go with it: retired together, never alone; a retired backend
    /// keeps its section with every slot parked, and the backends come sorted by name.
    #[test]
    fn backends_are_planned_with_their_backups_and_retired_whole() {
        let wanted = |names: &[&str]| -> BTreeMap<String, Wanted> {
            names
                .iter()
                .map(|n| {
                    let w = Wanted {
                        endpoints: vec![ep(1), ep(2)],
                        min_slots: 2,
                        weights: [(ep(2).addr, 7)].into(),
                        backups: (*n == "b").then(|| vec![ep(9)]),
                        ..Wanted::default()
                    };
                    (n.to_string(), w)
                })
                .collect()
        };
        let mut first = SlotMap::default();
        let bs = plan_backends(&SlotMap::default(), wanted(&["b", "a"]), 4, &mut first, &mut PlanMemo::default());
        assert_eq!(bs.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let b = &bs[1].servers;
        let names: Vec<(&str, bool, Option<u16>)> = b.iter().map(|s| (s.name.as_str(), s.backup, s.weight)).collect();
        assert_eq!(
            names,
            [("SRV_1", false, None), ("SRV_2", false, Some(7)), ("BAK_1", true, None), ("BAK_2", true, None)]
        );
        assert!(first.backends.contains_key("b#backup"));
        let mut second = SlotMap::default();
        let bs = plan_backends(&first, wanted(&["a"]), 4, &mut second, &mut PlanMemo::default());
        assert_eq!(second.retired, ["b"], "the backup slots are never retired alone");
        let b = bs.iter().find(|b| b.name == "b").unwrap();
        assert!(b.servers.iter().all(|s| s.endpoint.is_none() && !s.backup), "{b:?}");
        assert_eq!(b.servers.len(), 4, "parked with at least the retired minimum");
    }

    #[test]
    fn spare_slots_are_disabled_and_minimum_holds() {
        let (servers, slots) = plan(&[ep(1), ep(2)], None, 4);
        assert_eq!(servers.len(), 4);
        assert_eq!(servers.iter().filter(|s| s.endpoint.is_none()).count(), 2);
        assert_eq!(slots.count, 4);
    }

    #[test]
    fn a_new_endpoint_takes_the_freed_slot() {
        let (_, s1) = plan(&[ep(1), ep(2), ep(3)], None, 2);
        let (servers, s2) = plan(&[ep(1), ep(3), ep(9)], Some(&s1), 2);
        assert_eq!(s2.endpoints[&ep(1).addr], s1.endpoints[&ep(1).addr]);
        assert_eq!(s2.endpoints[&ep(3).addr], s1.endpoints[&ep(3).addr]);
        assert_eq!(s2.endpoints[&ep(9).addr], s1.endpoints[&ep(2).addr]);
        assert_eq!(servers.len(), 3);
    }

    fn slot_map(backends: &[&str], retired: &[&str]) -> SlotMap {
        SlotMap {
            backends: backends
                .iter()
                .map(|b| (b.to_string(), Arc::new(BackendSlots { count: 2, ..Default::default() })))
                .collect(),
            retired: retired.iter().map(|r| r.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn unrouted_backends_retire_oldest_first_and_come_back() {
        let active = |names: &[&'static str]| names.iter().copied().collect::<BTreeSet<&str>>();
        // b and c lose their last route: retired (by name), after the already retired z.
        let prev = slot_map(&["a", "b", "c", "z"], &["z"]);
        assert_eq!(retired(&prev, &active(&["a"]), 10), ["z", "b", "c"]);
        // z is routed again: no longer retired.
        assert_eq!(retired(&prev, &active(&["a", "z"]), 10), ["b", "c"]);
        // Over the limit the oldest goes first.
        assert_eq!(retired(&prev, &active(&["a"]), 2), ["b", "c"]);
        assert!(retired(&prev, &active(&["a"]), 0).is_empty());
        // A retired name the slot map no longer has is not kept.
        assert_eq!(retired(&slot_map(&["a"], &["gone"]), &active(&[]), 10), ["a"]);
    }

    proptest! {
        /// A memo kept across renders plans what a fresh one plans: each render's backends and
        /// slot map are the same, whichever backends come, go, move endpoints or get backups.
        #[test]
        fn a_kept_memo_plans_as_a_fresh_one(
            renders in proptest::collection::vec(
                proptest::collection::btree_map(0u8..4, (proptest::collection::btree_set(0u8..6, 0..5), any::<bool>()), 0..4),
                1..10,
            ),
        ) {
            let mut kept = PlanMemo::default();
            let mut prev = SlotMap::default();
            for r in renders {
                let wanted = || -> BTreeMap<String, Wanted> {
                    r.iter()
                        .map(|(b, (eps, backup))| {
                            let endpoints: Vec<Endpoint> = eps.iter().map(|i| ep(*i)).collect();
                            let backups = backup.then(|| endpoints.iter().rev().copied().collect());
                            (format!("be{b}"), Wanted { endpoints, min_slots: 2, backups, ..Wanted::default() })
                        })
                        .collect()
                };
                let (mut with, mut without) = (SlotMap::default(), SlotMap::default());
                let a = plan_backends(&prev, wanted(), 2, &mut with, &mut kept);
                let b = plan_backends(&prev, wanted(), 2, &mut without, &mut PlanMemo::default());
                prop_assert_eq!(a, b);
                prop_assert_eq!(&with, &without);
                prev = with;
            }
        }

        /// Any sequence of endpoint sets keeps every surviving endpoint in its slot, puts no two
        /// endpoints in one slot, and never shrinks a backend below its minimum.
        #[test]
        fn survivors_keep_their_slots(sets in proptest::collection::vec(proptest::collection::btree_set(0u8..40, 0..30), 1..12), min in 0usize..8) {
            let mut prev: Option<BackendSlots> = None;
            for set in sets {
                let eps: Vec<Endpoint> = set.iter().map(|i| ep(*i)).collect();
                let (servers, next) = plan(&eps, prev.as_ref(), min);
                prop_assert!(servers.len() >= min.max(eps.len()));
                prop_assert_eq!(next.endpoints.len(), eps.len());
                let slots: BTreeSet<usize> = next.endpoints.values().copied().collect();
                prop_assert_eq!(slots.len(), eps.len());
                if let Some(p) = &prev {
                    for (addr, slot) in &p.endpoints {
                        if let Some(now) = next.endpoints.get(addr) {
                            prop_assert_eq!(now, slot);
                        }
                    }
                }
                for (addr, slot) in &next.endpoints {
                    prop_assert_eq!(servers[*slot].endpoint, Some(*addr));
                }
                prev = Some(next);
            }
        }
    }
}
