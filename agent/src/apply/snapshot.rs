//! `GET /v1/state`: the snapshot readers take without waiting for an apply.
//!
//! Owns assembling [`StateResponse`] from the published record, a fresh HAProxy probe and (with
//! `verify=1`) a re-hash of the live tree. It must never take the apply lock nor write anything.

use super::*;

impl Agent {
    /// `GET /v1/state`: never waits for an apply.
    pub async fn state(&self, verify: bool) -> Result<StateResponse, AgentError> {
        let snap = self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone();
        let fresh = probe(&self.state_cli).await;
        let busy = self.inner.try_lock().is_err();
        let down = self.down_reason().is_some();
        let haproxy = match &fresh {
            Ok(pr) if !down => {
                *self.probe.write().unwrap_or_else(|e| e.into_inner()) = Some(pr.clone());
                HaproxyInfo {
                    version: pr.version_string.clone(),
                    running: true,
                    master_pid: Some(pr.master_pid),
                    worker_pid: pr.worker_pid,
                    reloads: pr.reloads,
                }
            }
            _ if down => HaproxyInfo {
                version: self
                    .probe
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .map(|c| c.version_string.clone())
                    .unwrap_or_default(),
                running: false,
                master_pid: None,
                worker_pid: None,
                reloads: 0,
            },
            _ => {
                let cached = self.probe.read().unwrap_or_else(|e| e.into_inner()).clone();
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
        let files = if verify || snap.applied.is_none() {
            let live = self.tree.live_dir()?;
            match live {
                Some(d) => tokio::task::spawn_blocking(move || hash_dir(&d))
                    .await
                    .map_err(|e| AgentError::Tree(format!("hash task: {e}")))??,
                None => vec![],
            }
        } else {
            snap.applied.as_ref().map(|a| a.files.clone()).unwrap_or_default()
        };
        let pending = lock(&self.pacer).due(Instant::now());
        let pending_reload = pending.and_then(|(plan, d)| {
            Some(PendingReload {
                plan_id: snap.applied.as_ref().map_or(plan, |a| a.plan_id),
                due_in_ms: u64::try_from(d.as_millis()).ok()?,
            })
        });
        Ok(StateResponse {
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
        })
    }
}
