//! The three seams Kubernetes mode swaps: bundle source, endpoint source, fence holder.
//!
//! Owns the traits only. The gate, diff, deployer, scheduler and status talk to these traits and
//! must never learn which implementation runs; this module must never contain an implementation
//! (standalone ones live in [`crate::standalone`]).

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use haptic_protocol::Fence;

use crate::bundle::Bundle;

/// One render from a source, or why the source's current content is not a render.
pub type BundleEvent = Result<Arc<Bundle>, String>;

/// Where renders come from (a watched directory, or an `HAProxyConfig` and what it names).
pub trait BundleSource: Send + 'static {
    /// Waits for the next settled render. `None` means the source ended.
    fn next(&mut self) -> BoxFuture<'_, Option<BundleEvent>>;
}

/// One agent to deploy to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// A stable name for status and metrics (the URL's authority in standalone mode).
    pub name: String,
    /// The agent's base URL, e.g. `http://127.0.0.1:9300`.
    pub url: String,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Where endpoints come from (the `--agent` list, or the admitted pods of Kubernetes discovery).
pub trait EndpointSource: Send + 'static {
    /// Waits for the next endpoint set; the first call answers the initial set at once.
    /// `None` means the set never changes again.
    fn next(&mut self) -> BoxFuture<'_, Option<Vec<Endpoint>>>;
}

/// Who holds the fence (a local epoch file, or a Lease whose transitions count the epoch).
///
/// Every apply is stamped with [`FenceHolder::next_fence`]. When a pod answers `stale_epoch`
/// with the fence it has seen, the deployer calls [`FenceHolder::reclaim`]: it lifts this
/// holder's epoch above the pod's when that fence is this holder's own (a regressed counter),
/// and refuses — standing the holder down — when another holder is behind it.
pub trait FenceHolder: Send + Sync + 'static {
    /// This controller's identity, sent as the fence holder.
    fn identity(&self) -> String;
    /// The current epoch.
    fn epoch(&self) -> u64;
    /// The fence for the next apply (seq increases per apply within the term); `None` once
    /// stood down.
    fn next_fence(&self) -> Option<Fence>;
    /// Answers a pod's `stale_epoch`: `Ok` once the epoch is above `seen` (retry), `Err` with
    /// the reason when this controller must stand down.
    fn reclaim(&self, seen: &Fence) -> BoxFuture<'_, Result<(), String>>;
    /// Why this controller stood down, if it did.
    fn stood_down(&self) -> Option<String>;
}
