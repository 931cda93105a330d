//! The fence holder of Kubernetes mode: the Lease term published by the elector.
//!
//! Owns stamping applies with `{epoch: leaseTransitions, seq, holder}` while this replica holds
//! the Lease (seq restarts at 1 for every epoch) and answering a pod's `stale_epoch`: while we
//! hold the Lease, ask the elector to raise the epoch above the pod's and wait for it; without
//! the Lease, stand down. It must never write the Lease itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use haptic_protocol::Fence;

use super::lease::{Leadership, RaiseHandle};
use crate::seams::FenceHolder;

/// A [`FenceHolder`] over the elector's leadership feed.
#[derive(Debug)]
pub struct LeaseFence {
    identity: String,
    leadership: Leadership,
    raise: RaiseHandle,
    wait: Duration,
    // (epoch the sequence belongs to, last seq).
    seq: Mutex<(u64, u64)>,
    applies: AtomicU64,
}

impl LeaseFence {
    /// A holder for `identity`; a raise waits at most `wait` (the renew deadline).
    pub fn new(identity: &str, leadership: Leadership, raise: RaiseHandle, wait: Duration) -> Self {
        Self { identity: identity.into(), leadership, raise, wait, seq: Mutex::new((0, 0)), applies: AtomicU64::new(0) }
    }

    fn current_epoch(&self) -> Option<u64> {
        self.leadership.borrow().as_ref().map(|t| t.epoch)
    }
}

impl FenceHolder for LeaseFence {
    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn epoch(&self) -> u64 {
        self.current_epoch().unwrap_or(0)
    }

    fn next_fence(&self) -> Option<Fence> {
        let epoch = self.current_epoch()?;
        let mut s = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        if s.0 != epoch {
            *s = (epoch, 0);
        }
        s.1 += 1;
        self.applies.fetch_add(1, Ordering::Relaxed);
        Some(Fence { epoch, seq: s.1, holder: self.identity.clone() })
    }

    fn reclaim(&self, seen: &Fence) -> BoxFuture<'_, Result<(), String>> {
        let seen = seen.clone();
        Box::pin(async move {
            let Some(epoch) = self.current_epoch() else {
                return Err("this replica no longer holds the Lease".into());
            };
            if epoch > seen.epoch {
                return Ok(());
            }
            // The pods saw a higher epoch (the Lease was deleted and recreated, or restored):
            // while we hold the Lease, lift our epoch above theirs in a guarded write.
            tracing::warn!(seen = seen.epoch, holder = %seen.holder, ours = epoch, "a pod saw a higher epoch: raising ours above it");
            self.raise.raise_above(seen.epoch);
            let mut rx = self.leadership.clone();
            let raised = tokio::time::timeout(self.wait, async {
                loop {
                    match rx.borrow_and_update().as_ref() {
                        None => return Err("lost the Lease while raising the epoch".to_string()),
                        Some(t) if t.epoch > seen.epoch => return Ok(()),
                        Some(_) => {}
                    }
                    if rx.changed().await.is_err() {
                        return Err("the elector stopped".to_string());
                    }
                }
            })
            .await;
            raised.unwrap_or_else(|_| {
                Err(format!("could not raise the epoch above {} within {:?}", seen.epoch, self.wait))
            })
        })
    }

    fn stood_down(&self) -> Option<String> {
        match self.current_epoch() {
            Some(_) => None,
            None => Some("this replica does not hold the Lease".into()),
        }
    }
}
