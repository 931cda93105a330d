//! `GET /v1/state`: the snapshot readers take without waiting for an apply.
//!
//! Owns assembling [`StateResponse`] from the published record, a fresh HAProxy probe and (with
//! `verify=1`) a re-hash of the live tree. It must never take the apply lock nor write anything.

use std::sync::Arc;

use haptic_protocol::api::{AgentInfo, AppliedInfo, HaproxyInfo, PendingReload, RunningInfo, StateResponse};
use haptic_protocol::{FileEntry, RelPath, API_VERSION};

use super::Agent;
use crate::error::AgentError;
use crate::reload::probe;
use crate::store::Persisted;
use crate::tree::{verify_dir, Drift};

impl Agent {
    fn published(&self) -> Arc<Persisted> {
        self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The published record and the tree it names, re-hashed from disk, from one and the same
    /// plan: the hash is of the record's own tree (never of whatever `current` is by then), and
    /// it is retried when an apply published another record meanwhile.
    async fn verified(&self) -> Result<(Arc<Persisted>, Vec<(FileEntry, Option<Drift>)>), AgentError> {
        let mut tries = 0;
        loop {
            tries += 1;
            let snap = self.published();
            let (dir, index) = match &snap.applied {
                Some(a) => (Some(self.tree.dir_of(&a.tree)), a.files.clone()),
                None => (self.tree.live_dir()?, vec![]),
            };
            let Some(dir) = dir else { return Ok((snap, vec![])) };
            let hashed = tokio::task::spawn_blocking(move || verify_dir(&dir, &index))
                .await
                .map_err(|e| AgentError::Tree(format!("hash task: {e}")))?;
            let again = self.published();
            let same = Arc::ptr_eq(&snap, &again)
                || snap.applied.as_ref().map(|a| (&a.tree, a.plan_id))
                    == again.applied.as_ref().map(|a| (&a.tree, a.plan_id));
            match hashed {
                Ok(files) if same => return Ok((snap, files)),
                // The tree was replaced (or removed) while it was read: read the new one.
                _ if tries < 20 => continue,
                Ok(files) => return Ok((snap, files)),
                Err(e) => return Err(e),
            }
        }
    }

    /// `GET /v1/state`: never waits for an apply. Drifted files (with `verify`) are returned
    /// beside the response, to be marked in `files`.
    pub async fn state_marked(&self, verify: bool) -> Result<(StateResponse, Vec<(RelPath, Drift)>), AgentError> {
        let (snap, verified) = if verify || self.published().applied.is_none() {
            let (s, f) = self.verified().await?;
            (s, Some(f))
        } else {
            (self.published(), None)
        };
        let drift: Vec<(RelPath, Drift)> =
            verified.iter().flatten().filter_map(|(f, m)| m.map(|m| (f.path.clone(), m))).collect();
        let files = match verified {
            Some(v) => v.into_iter().map(|(f, _)| f).collect(),
            None => snap.applied.as_ref().map(|a| a.files.clone()).unwrap_or_default(),
        };
        let resp = self.state_from(&snap, files, verify).await;
        Ok((resp, drift))
    }

    async fn state_from(&self, snap: &Persisted, files: Vec<FileEntry>, verify: bool) -> StateResponse {
        let fresh = probe(&self.state_cli).await;
        let busy = self.inner.try_lock().is_err();
        let down = self.down_reason().is_some();
        let haproxy = match &fresh {
            Ok(pr) if !down => {
                self.haproxy.set_probe(pr.clone());
                HaproxyInfo {
                    version: pr.version_string.clone(),
                    running: true,
                    master_pid: Some(pr.master_pid),
                    worker_pid: pr.worker_pid,
                    reloads: pr.reloads,
                }
            }
            _ if down => HaproxyInfo {
                version: self.haproxy.probe().map(|c| c.version_string).unwrap_or_default(),
                running: false,
                master_pid: None,
                worker_pid: None,
                reloads: 0,
            },
            _ => {
                let cached = self.haproxy.probe();
                HaproxyInfo {
                    version: cached.as_ref().map(|c| c.version_string.clone()).unwrap_or_default(),
                    // A reload in progress makes 2.6's master CLI refuse connections for a moment.
                    running: busy && cached.is_some(),
                    master_pid: cached.as_ref().map(|c| c.master_pid),
                    worker_pid: cached.as_ref().and_then(|c| c.worker_pid),
                    reloads: cached.as_ref().map_or(0, |c| c.reloads),
                }
            }
        };
        let pending = self.pacing.due();
        let pending_reload = pending.and_then(|(plan, d)| {
            Some(PendingReload {
                plan_id: snap.applied.as_ref().map_or(plan, |a| a.plan_id),
                due_in_ms: u64::try_from(d.as_millis()).ok()?,
            })
        });
        StateResponse {
            api: API_VERSION,
            agent: AgentInfo { version: env!("CARGO_PKG_VERSION").to_string() },
            haproxy,
            capabilities: self.capabilities(),
            fence: snap.fence.clone(),
            applied: snap.applied.as_ref().map(|a| AppliedInfo {
                plan_id: a.plan_id,
                blob: a.blob.clone(),
                mode: a.mode,
                at: a.at.clone(),
            }),
            running: if down { None } else { snap.running.map(|plan_id| RunningInfo { plan_id }) },
            pending_reload,
            files,
            verified: verify,
            last_error: snap.last_error.clone(),
            last_warnings: snap.last_warnings.clone(),
        }
    }
}
