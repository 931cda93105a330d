//! The reflector plumbing every watcher of Kubernetes mode shares: a watch into a store of its
//! own that reports each event as a [`Change`] on one channel, and [`Named`] stores of exactly
//! the objects named (one watch per name, by field selector).
//!
//! Owns starting, keying and stopping watches and whether a store's first list has arrived. It
//! must never render, decide when to render, or list a kind the caller did not ask for.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::settle::Change;

/// Where the watches send their events.
pub type Changes = futures::channel::mpsc::UnboundedSender<Change>;

/// Reflector stores of one kind, one per referenced name: each is fed by its own watch with the
/// field selector `metadata.name=<name>`, so no other object of the namespace (Helm release
/// Secrets, unrelated ConfigMaps) is listed or cached.
pub struct Named<K: kube::Resource + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    watches: Arc<Mutex<BTreeMap<String, Watched<K>>>>,
}

/// One name's store and the token that stops its watch.
type Watched<K> = (Store<K>, CancellationToken);

impl<K: kube::Resource + 'static> Clone for Named<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn clone(&self) -> Self {
        Self { watches: self.watches.clone() }
    }
}

impl<K: kube::Resource + 'static> Default for Named<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn default() -> Self {
        Self { watches: Arc::default() }
    }
}

impl<K: kube::Resource + 'static> std::fmt::Debug for Named<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = lock(&self.watches).keys().cloned().collect();
        f.debug_struct("Named").field("names", &names).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<K> Named<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    /// The object `name` in `namespace`, if it is watched and exists.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let store = lock(&self.watches).get(name).map(|(s, _)| s.clone())?;
        store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Whether every one of `names` (keys) is watched and its first list has arrived.
    pub(crate) fn ready(&self, names: &BTreeSet<String>) -> bool {
        let w = lock(&self.watches);
        names.iter().all(|n| w.get(n).is_some_and(|(s, _)| ready(s)))
    }

    /// Starts a watch for each of `names` not watched yet; each of its events is sent on
    /// `changes`; all stop with `stop`.
    pub(crate) fn ensure(&self, api: &Api<K>, names: &BTreeSet<String>, changes: &Changes, stop: &CancellationToken) {
        self.ensure_each(names.iter().map(|n| (n.clone(), api.clone(), n.clone())), changes, stop);
    }

    /// Starts a watch for each `(key, api, name)` whose key is not watched yet.
    pub(crate) fn ensure_each(
        &self,
        wanted: impl Iterator<Item = (String, Api<K>, String)>,
        changes: &Changes,
        stop: &CancellationToken,
    ) {
        let mut w = lock(&self.watches);
        for (key, api, name) in wanted {
            if w.contains_key(&key) {
                continue;
            }
            let token = stop.child_token();
            let store = watch_one(api, &name, changes.clone(), token.clone());
            w.insert(key, (store, token));
        }
    }

    /// The object `name` in `namespace` from the watch of `key`.
    pub(crate) fn get_keyed(&self, key: &str, namespace: &str, name: &str) -> Option<Arc<K>> {
        let store = lock(&self.watches).get(key).map(|(s, _)| s.clone())?;
        store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Stops the watches of names (keys) not in `names`.
    pub(crate) fn retain(&self, names: &BTreeSet<String>) {
        lock(&self.watches).retain(|n, (_, token)| {
            let keep = names.contains(n);
            if !keep {
                token.cancel();
            }
            keep
        });
    }
}

/// One object's watch (by `metadata.name`, backing off on errors) into a store of its own.
fn watch_one<K>(api: Api<K>, name: &str, changes: Changes, stop: CancellationToken) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let what = format!("{} {name}", K::kind(&K::DynamicType::default()));
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watch_into(api, cfg, what, Change::Objects, changes, stop)
}

/// A watch (`cfg`, backing off on errors, managed fields dropped) into a store of its own;
/// each event is sent on `changes` as `kind`; it stops with `stop`.
pub(crate) fn watch_into<K>(
    api: Api<K>,
    cfg: watcher::Config,
    what: String,
    kind: Change,
    changes: Changes,
    stop: CancellationToken,
) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    reflect_into(api, cfg, what, kind, changes, stop, |_| true)
}

/// [`watch_into`] for a kind whose status haptic writes and the render never reads (routes,
/// Gateways, Ingresses): an event that changed only an object's status (haptic's own status
/// write, coming back) is not sent, so it neither renders again nor joins the next burst.
pub(crate) fn watch_specs_into<K>(
    api: Api<K>,
    cfg: watcher::Config,
    what: String,
    kind: Change,
    changes: Changes,
    stop: CancellationToken,
) -> Store<K>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let mut specs = SpecChanges::default();
    reflect_into(api, cfg, what, kind, changes, stop, move |ev| specs.is_change(ev))
}

/// Which watch events of a kind changed more than an object's status: a digest of each
/// object's spec and metadata ([`fingerprint`]) per object.
pub(crate) struct SpecChanges<K: kube::Resource>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    seen: HashMap<ObjectRef<K>, u64>,
}

impl<K: kube::Resource> Default for SpecChanges<K>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    fn default() -> Self {
        Self { seen: HashMap::new() }
    }
}

impl<K> SpecChanges<K>
where
    K: kube::Resource + serde::Serialize,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    /// Whether `ev` is a change: anything but an object modified in its status only (a list's
    /// objects and deletions always are).
    pub(crate) fn is_change(&mut self, ev: &watcher::Event<K>) -> bool {
        match ev {
            watcher::Event::Apply(o) => {
                let now = fingerprint(o);
                self.seen.insert(ObjectRef::from_obj(o), now) != Some(now)
            }
            watcher::Event::InitApply(o) => {
                self.seen.insert(ObjectRef::from_obj(o), fingerprint(o));
                true
            }
            watcher::Event::Delete(o) => {
                self.seen.remove(&ObjectRef::from_obj(o));
                // A hash map keeps its room after removals (see [`Room`]).
                if mostly_empty(self.seen.len(), self.seen.capacity()) {
                    self.seen.shrink_to_fit();
                }
                true
            }
            watcher::Event::Init => {
                self.seen.clear();
                true
            }
            watcher::Event::InitDone => true,
        }
    }
}

/// The watch itself: each event the store takes is sent on `changes` as `kind` when `is_change`
/// says it is one.
fn reflect_into<K>(
    api: Api<K>,
    cfg: watcher::Config,
    what: String,
    kind: Change,
    changes: Changes,
    stop: CancellationToken,
    mut is_change: impl FnMut(&watcher::Event<K>) -> bool + Send + 'static,
) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let (reader, mut writer) = reflector::store();
    let store = reader.clone();
    let mut stream = watcher(api, cfg).default_backoff().modify(|o| o.meta_mut().managed_fields = None).boxed();
    tokio::spawn(async move {
        let mut room = Room::default();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                ev = stream.next() => match ev {
                    None => return,
                    Some(Err(e)) => warn!("watching {what}: {e}"),
                    Some(Ok(ev)) => {
                        writer.apply_watcher_event(&ev);
                        if room.outgrown(&ev, store.len()) {
                            rebuild(&mut writer, &store);
                        }
                        if is_change(&ev) && changes.unbounded_send(kind).is_err() {
                            return;
                        }
                    }
                },
            }
        }
    });
    reader
}

/// The fewest objects a store must once have held before it is rebuilt smaller: below that its
/// map's spare room is a few KiB.
const COMPACT_FROM: usize = 256;

/// Whether a map holding `len` entries with room for `room` (or a store that held `room` at
/// most) should be made smaller: it once held [`COMPACT_FROM`] or more and holds under a quarter.
fn mostly_empty(len: usize, room: usize) -> bool {
    room >= COMPACT_FROM && len.saturating_mul(4) < room
}

/// When a store's map has too much room. A hash map keeps the room of the most it ever held
/// after its objects are deleted: after 5,000 routes and their Services and EndpointSlices were
/// deleted, the stores' empty tables were half of the controller's live heap (840 KiB each,
/// heaptrack). Tracks the most a store held since it was last built; once it holds under a
/// quarter of that, it is due to be rebuilt at its present size. Each rebuild copies the objects
/// left, fewer than a third of those deleted since the last one.
#[derive(Debug, Default)]
struct Room {
    peak: usize,
}

impl Room {
    /// Whether the store, holding `len` objects after `ev`, is due to be rebuilt. Only after a
    /// deletion: that is the only event that shrinks a store, and never comes while a list is
    /// being read (whose objects wait in the writer's buffer, which a rebuild would discard). A
    /// list builds the store anew.
    fn outgrown<K>(&mut self, ev: &watcher::Event<K>, len: usize) -> bool {
        match ev {
            watcher::Event::InitDone => self.peak = len,
            watcher::Event::Delete(_) if mostly_empty(len, self.peak) => {
                self.peak = len;
                return true;
            }
            _ => self.peak = self.peak.max(len),
        }
        false
    }
}

/// Builds `store` anew from its own objects, as a list would: the reader sees the old map until
/// the new one replaces it whole.
fn rebuild<K>(writer: &mut reflector::store::Writer<K>, store: &Store<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in store.state() {
        writer.apply_watcher_event(&watcher::Event::InitApply(K::clone(&o)));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}

/// A digest of everything in `o` but its status and resourceVersion: equal for two versions of
/// an object that differ only in status. (A 64-bit hash, not the objects: 5,000 routes cost
/// 5,000 numbers; a collision would only skip one render, which the next change makes.)
fn fingerprint<K: serde::Serialize>(o: &K) -> u64 {
    let mut v = serde_json::to_value(o).unwrap_or_default();
    if let Some(m) = v.as_object_mut() {
        m.remove("status");
        if let Some(meta) = m.get_mut("metadata").and_then(serde_json::Value::as_object_mut) {
            meta.remove("resourceVersion");
            meta.remove("managedFields");
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

pub(crate) fn ready<K: kube::Resource + Clone + 'static>(s: &Store<K>) -> bool
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    futures::FutureExt::now_or_never(s.wait_until_ready()).is_some()
}

#[cfg(test)]
mod tests {
    use super::{fingerprint, rebuild, Room, COMPACT_FROM};
    use haptic_render::gateway_api::HttpRoute;
    use k8s_openapi::api::core::v1::Service;
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::watcher::Event;
    use proptest::prelude::*;
    use serde_json::json;

    fn service(k: usize) -> Service {
        serde_json::from_value(json!({"metadata": {"name": format!("s{k}"), "namespace": "a"}})).unwrap()
    }

    /// What a watch can say to a store, for the property test.
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Add(usize),
        Delete(usize),
        Relist,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1usize..600).prop_map(Op::Add),
            4 => (1usize..600).prop_map(Op::Delete),
            1 => Just(Op::Relist),
        ]
    }

    #[test]
    fn a_store_is_rebuilt_with_every_object_it_holds_once_under_a_quarter_of_its_peak() {
        let (reader, mut writer) = reflector::store::<Service>();
        let mut room = Room::default();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        for k in 0..1000 {
            writer.apply_watcher_event(&Event::Apply(service(k)));
            assert!(!room.outgrown(&Event::Apply(service(k)), reader.len()));
        }
        let mut rebuilt_at = Vec::new();
        for k in 0..1000 {
            let ev = Event::Delete(service(k));
            writer.apply_watcher_event(&ev);
            if room.outgrown(&ev, reader.len()) {
                rebuild(&mut writer, &reader);
                rebuilt_at.push(reader.len());
            }
        }
        // 1000 -> 249 (under a quarter), then 249 is under COMPACT_FROM: no more.
        assert_eq!(rebuilt_at, vec![249]);
        assert!(reader.is_empty());

        // A rebuild keeps every object the store holds, and the store serves them after it.
        for k in 0..300 {
            writer.apply_watcher_event(&Event::Apply(service(k)));
        }
        rebuild(&mut writer, &reader);
        assert_eq!(reader.len(), 300);
        for k in 0..300 {
            assert!(reader.get(&ObjectRef::new(&format!("s{k}")).within("a")).is_some(), "s{k} lost");
        }
    }

    proptest! {
        /// Rebuilds copy at most a third of the objects deleted (amortised O(1) per event), come
        /// only after a deletion, and a store that once held `COMPACT_FROM` or more never stays
        /// under a quarter of its peak since the last list or rebuild.
        #[test]
        fn rebuilds_cost_at_most_a_third_of_the_deletions(ops in proptest::collection::vec(op(), 1..60)) {
            let mut room = Room::default();
            let (mut len, mut deleted, mut copied, mut peak) = (0usize, 0usize, 0usize, 0usize);
            for op in ops {
                let (ev, now) = match op {
                    Op::Add(n) => (Event::Apply(()), len + n),
                    Op::Delete(n) => (Event::Delete(()), len.saturating_sub(n)),
                    Op::Relist => (Event::InitDone, len),
                };
                deleted += len - now.min(len);
                len = now;
                peak = if matches!(op, Op::Relist) { len } else { peak.max(len) };
                if room.outgrown(&ev, len) {
                    prop_assert!(matches!(op, Op::Delete(_)));
                    copied += len;
                    peak = len;
                }
                prop_assert!(peak < COMPACT_FROM || len * 4 >= peak, "{len} of a peak of {peak}");
            }
            prop_assert!(copied * 3 <= deleted, "copied {copied} for {deleted} deleted");
        }
    }

    fn route(v: serde_json::Value) -> HttpRoute {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_status_write_keeps_the_fingerprint_and_any_other_change_moves_it() {
        let base = json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "r", "namespace": "a", "resourceVersion": "1", "generation": 1},
            "spec": {"hostnames": ["a.example"], "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}
        });
        let at = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v = base.clone();
            f(&mut v);
            fingerprint(&route(v))
        };
        let plain = at(&|_| {});
        // Our own status write comes back with a new resourceVersion and a status.
        let status = at(&|v| {
            v["metadata"]["resourceVersion"] = json!("2");
            v["status"] = json!({"parents": [{"parentRef": {"name": "gw"}, "controllerName": "haptic.dev/gateway",
                                              "conditions": []}]});
        });
        assert_eq!(plain, status);
        // A spec, label or annotation change, or a deletion being started, is a change.
        let spec = at(&|v| v["spec"]["hostnames"] = json!(["b.example"]));
        let label = at(&|v| v["metadata"]["labels"] = json!({"team": "b"}));
        let annotation = at(&|v| v["metadata"]["annotations"] = json!({"x": "y"}));
        let deleting = at(&|v| v["metadata"]["deletionTimestamp"] = json!("2026-12-06T00:00:00Z"));
        for other in [spec, label, annotation, deleting] {
            assert_ne!(plain, other);
        }
    }
}
