//! The reflector plumbing every watcher of Kubernetes mode shares: a watch into a store of its
//! own that reports each event as a [`Change`] on one channel, and [`Named`] stores of exactly
//! the objects named (one watch per name, by field selector).
//!
//! Owns starting, keying and stopping watches and whether a store's first list has arrived. It
//! must never render, decide when to render, or list a kind the caller did not ask for.

use std::collections::{BTreeMap, BTreeSet};
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
    let (reader, writer) = reflector::store();
    let mut stream =
        watcher(api, cfg).default_backoff().modify(|o| o.meta_mut().managed_fields = None).reflect(writer).boxed();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                ev = stream.next() => match ev {
                    None => return,
                    Some(Err(e)) => warn!("watching {what}: {e}"),
                    Some(Ok(_)) => if changes.unbounded_send(kind).is_err() { return },
                },
            }
        }
    });
    reader
}

pub(crate) fn ready<K: kube::Resource + Clone + 'static>(s: &Store<K>) -> bool
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    futures::FutureExt::now_or_never(s.wait_until_ready()).is_some()
}
