//! The standalone fence holder: a single writer whose epoch lives in a small state file.
//!
//! Owns the state file (`<state-dir>/fence.json`: identity and the last epoch claimed), the
//! per-term seq, and the pure reclaim rule. Every start claims a new term (epoch + 1, persisted
//! before the first apply), so a restart never sends a lower epoch. It must never out-bid
//! another holder: a pod fenced by another identity at an equal or higher epoch stands this
//! controller down.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use futures::future::BoxFuture;
use futures::FutureExt;
use haptic_protocol::Fence;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::seams::FenceHolder;

const FILE: &str = "fence.json";

#[derive(Debug, Serialize, Deserialize)]
struct StateFile {
    identity: String,
    epoch: u64,
}

/// What to do about a pod's `stale_epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reclaim {
    /// Our own older term is ahead of us: lift to this epoch and retry.
    Lift(u64),
    /// Our epoch is already above the pod's (a concurrent reclaim): retry.
    Retry,
    /// Another holder fences the pod: stand down.
    StandDown(String),
}

/// The pure reclaim rule.
pub fn reclaim_rule(identity: &str, epoch: u64, seen: &Fence) -> Reclaim {
    if seen.holder == identity {
        if seen.epoch >= epoch {
            Reclaim::Lift(seen.epoch + 1)
        } else {
            Reclaim::Retry
        }
    } else if seen.epoch < epoch {
        Reclaim::Retry
    } else {
        Reclaim::StandDown(format!(
            "the fleet is fenced by {:?} at epoch {} (this controller {identity:?} is at epoch {epoch}): another \
             controller deploys to these pods, so this one stands down. Stop the other one, or restart this one \
             with --identity {:?} to take over its fence",
            seen.holder, seen.epoch, seen.holder
        ))
    }
}

#[derive(Debug)]
struct Inner {
    epoch: u64,
    seq: u64,
    stood_down: Option<String>,
}

/// The epoch file fence holder.
#[derive(Debug)]
pub struct EpochFile {
    path: PathBuf,
    identity: String,
    inner: Mutex<Inner>,
}

/// A default identity: the host name and a random suffix, persisted on first use.
fn fresh_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "controller".into());
    format!("{host}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

impl EpochFile {
    /// Opens (creating) the state dir and claims a new term: `epoch = persisted + 1`.
    ///
    /// The identity is `identity` when given, else the one persisted, else a fresh
    /// `<hostname>-<random>` that is persisted so restarts keep it.
    pub fn open(state_dir: &Path, identity: Option<String>) -> Result<Self, Error> {
        std::fs::create_dir_all(state_dir).map_err(|e| Error::io(state_dir, e))?;
        let path = state_dir.join(FILE);
        let prev: Option<StateFile> = match std::fs::read(&path) {
            Ok(b) => Some(
                serde_json::from_slice(&b).map_err(|e| Error::FenceState { path: path.clone(), why: e.to_string() })?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(&path, e)),
        };
        let identity = identity
            .filter(|i| !i.trim().is_empty())
            .or_else(|| prev.as_ref().map(|p| p.identity.clone()))
            .unwrap_or_else(fresh_identity);
        let epoch = prev.map(|p| p.epoch).unwrap_or(0) + 1;
        let me = EpochFile { path, identity, inner: Mutex::new(Inner { epoch, seq: 0, stood_down: None }) };
        me.persist(epoch)?;
        Ok(me)
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn persist(&self, epoch: u64) -> Result<(), Error> {
        let body = serde_json::to_vec_pretty(&StateFile { identity: self.identity.clone(), epoch })
            .map_err(|e| Error::FenceState { path: self.path.clone(), why: e.to_string() })?;
        let tmp = self.path.with_extension("json.tmp");
        let io = |p: &Path, e| Error::io(p, e);
        let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
        f.write_all(&body).map_err(|e| io(&tmp, e))?;
        f.sync_all().map_err(|e| io(&tmp, e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| io(&self.path, e))?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io(dir, e))?;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl FenceHolder for EpochFile {
    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    fn next_fence(&self) -> Option<Fence> {
        let mut g = self.lock();
        if g.stood_down.is_some() {
            return None;
        }
        g.seq += 1;
        Some(Fence { epoch: g.epoch, seq: g.seq, holder: self.identity.clone() })
    }

    fn reclaim(&self, seen: &Fence) -> BoxFuture<'_, Result<(), String>> {
        let seen = seen.clone();
        async move {
            let mut g = self.lock();
            if let Some(why) = &g.stood_down {
                return Err(why.clone());
            }
            match reclaim_rule(&self.identity, g.epoch, &seen) {
                Reclaim::Retry => Ok(()),
                Reclaim::Lift(epoch) => {
                    // Persist before any apply carries the new epoch.
                    self.persist(epoch).map_err(|e| e.to_string())?;
                    tracing::warn!(
                        from = g.epoch,
                        to = epoch,
                        "a pod had seen this controller's fence at a higher epoch; lifted the epoch"
                    );
                    g.epoch = epoch;
                    g.seq = 0;
                    Ok(())
                }
                Reclaim::StandDown(why) => {
                    tracing::error!("STANDING DOWN: {why}");
                    g.stood_down = Some(why.clone());
                    Err(why)
                }
            }
        }
        .boxed()
    }

    fn stood_down(&self) -> Option<String> {
        self.lock().stood_down.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(epoch: u64, seq: u64, holder: &str) -> Fence {
        Fence { epoch, seq, holder: holder.into() }
    }

    #[test]
    fn rule() {
        assert_eq!(reclaim_rule("a", 3, &f(3, 9, "a")), Reclaim::Lift(4));
        assert_eq!(reclaim_rule("a", 3, &f(7, 1, "a")), Reclaim::Lift(8));
        assert_eq!(reclaim_rule("a", 5, &f(4, 1, "a")), Reclaim::Retry);
        assert_eq!(reclaim_rule("a", 5, &f(4, 1, "b")), Reclaim::Retry);
        assert!(matches!(reclaim_rule("a", 1, &f(1, 1, "b")), Reclaim::StandDown(_)));
        assert!(matches!(reclaim_rule("a", 1, &f(9, 1, "b")), Reclaim::StandDown(_)));
    }

    #[test]
    fn every_start_is_a_new_term_and_identity_persists() {
        let d = tempfile::tempdir().unwrap();
        let a = EpochFile::open(d.path(), None).unwrap();
        assert_eq!(a.epoch(), 1);
        assert_eq!(a.next_fence().unwrap().seq, 1);
        assert_eq!(a.next_fence().unwrap().seq, 2);
        let id = a.identity();
        drop(a);
        let b = EpochFile::open(d.path(), None).unwrap();
        assert_eq!((b.epoch(), b.identity()), (2, id.clone()));
        let c = EpochFile::open(d.path(), Some("other".into())).unwrap();
        assert_eq!((c.epoch(), c.identity()), (3, "other".to_string()));
    }

    #[tokio::test]
    async fn reclaim_lifts_persists_or_stands_down() {
        let d = tempfile::tempdir().unwrap();
        let a = EpochFile::open(d.path(), Some("a".into())).unwrap();
        a.reclaim(&f(4, 10, "a")).await.unwrap();
        assert_eq!(a.epoch(), 5);
        assert_eq!(a.next_fence().unwrap(), f(5, 1, "a"));
        drop(a);
        let a = EpochFile::open(d.path(), None).unwrap();
        assert_eq!(a.epoch(), 6, "the lifted epoch was persisted");
        assert!(a.reclaim(&f(6, 1, "b")).await.is_err());
        assert!(a.stood_down().is_some());
        assert!(a.next_fence().is_none());
    }
}
