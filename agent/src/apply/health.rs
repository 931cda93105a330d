//! HAProxy liveness: noticing that HAProxy is gone, and picking it up again when it is back.
//!
//! Owns applying the "gone" rule ([`crate::reload::presumed_gone`]: the master CLI cannot be
//! connected to *and* the master pid last seen is not alive here) to what one look saw, and the
//! background watcher that records it (`running: null`, `last_error`) and, when a master answers
//! again (a new one, or the same one after a silence), reloads the applied plan so `running` is
//! known again. It must never restart HAProxy itself, send signals, nor write the tree.
use std::time::Duration;

use tracing::{info, warn};

use super::Agent;
use crate::master::{CliError, MasterCli};
use crate::reload::{presumed_gone, probe, Probe, ReloadError};
use crate::store::Persisted;

/// How often the watcher looks at HAProxy.
const WATCH_EVERY: Duration = Duration::from_millis(500);

/// What one look at HAProxy saw.
#[derive(Debug)]
pub(super) enum Seen {
    /// The master answered.
    Up(Probe),
    /// HAProxy is not running; the reason names what was seen.
    Gone(String),
    /// Unreachable, but the master may live (a 2.6 reload refuses connections; a hung master).
    Unsure,
}

impl Agent {
    /// Looks at HAProxy once through `cli`; keeps the cached probe fresh.
    pub(super) async fn look(&self, cli: &MasterCli) -> Seen {
        match probe(cli).await {
            Ok(p) => {
                self.haproxy.seen(p.clone());
                Seen::Up(p)
            }
            Err(e) => {
                let unreachable = matches!(&e, ReloadError::Cli(c @ CliError::Connect(..)) if c.is_unreachable());
                let unreachable_for = self.haproxy.unreachable_for(unreachable);
                let master = self.haproxy.master_pid();
                let alive = master.and_then(crate::reload::pid_alive);
                if presumed_gone(unreachable_for, alive) {
                    let pid = master.map(|m| format!(" (master pid {m} is gone)")).unwrap_or_default();
                    Seen::Gone(format!("HAProxy not running{pid}: {e}"))
                } else {
                    Seen::Unsure
                }
            }
        }
    }

    /// Whether HAProxy is gone right now (one `show version` when the master answers).
    pub(super) async fn gone_now(&self) -> Option<String> {
        if self.cli.ping().await {
            return None;
        }
        match self.look(&self.cli).await {
            Seen::Gone(why) => Some(why),
            Seen::Up(_) | Seen::Unsure => None,
        }
    }

    /// Whether HAProxy was last seen gone, and why.
    pub(super) fn down_reason(&self) -> Option<String> {
        self.haproxy.down_reason()
    }

    /// Records that HAProxy is gone: nothing runs any plan, no reload is pending.
    pub(super) fn mark_down(&self, p: &mut Persisted, why: &str) {
        self.pacing.cancel_pending();
        self.metrics.pending_reload.set(0);
        p.running = None;
        p.last_error = Some(why.to_string());
        if let Err(e) = self.save(p) {
            warn!("recording that HAProxy is gone failed: {e}");
            self.publish(p);
        }
        // Only now, so a reader that sees HAProxy gone also sees the record that says why.
        if self.haproxy.mark_down(why) {
            warn!(root = %self.cfg.root.display(), "{why}");
        }
    }

    /// Watches HAProxy forever: records it gone (after two looks in a row), and when a master
    /// answers after that, or a master with another pid appears, reloads the applied plan.
    pub(super) async fn watch_loop(&self) {
        let mut last_master: Option<u32> = self.haproxy.master_pid();
        let mut gone_looks = 0u32;
        let mut tick = tokio::time::interval(WATCH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.look(&self.state_cli).await {
                Seen::Gone(why) => {
                    gone_looks += 1;
                    if gone_looks >= 2 && self.down_reason().is_none() {
                        let mut inner = self.inner.lock().await;
                        self.mark_down(&mut inner.p, &why);
                    }
                }
                Seen::Up(p) => {
                    gone_looks = 0;
                    let new_master = last_master.is_some_and(|m| m != p.master_pid);
                    last_master = Some(p.master_pid);
                    if self.down_reason().is_some() || new_master {
                        info!(root = %self.cfg.root.display(), master = p.master_pid, "HAProxy is back: reloading the applied plan");
                        let mut inner = self.inner.lock().await;
                        self.haproxy.clear_down();
                        // Whatever the new master loaded, it is not known to be the applied plan.
                        inner.p.running = None;
                        drop(inner);
                        self.converge().await;
                    }
                }
                Seen::Unsure => {}
            }
        }
    }
}
