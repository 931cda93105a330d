//! Re-reading a file the agent depends on while it runs (the credentials file, the TLS files):
//! a mounted Secret changes under a running pod.
//!
//! Owns the timer loop only: call a blocking reload every interval, and log a failure once until
//! it changes. It must never decide what a reload means: each caller's reload does that.

use std::time::Duration;

use tracing::warn;

/// Runs `reload` on the blocking pool every `every` (at least 100 ms) until aborted. An `Err` is
/// logged as a warning after `what` once, until a reload succeeds or fails differently.
pub fn spawn_poll<F>(every: Duration, what: &'static str, reload: F) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Result<(), String> + Clone + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_err: Option<String> = None;
        loop {
            tick.tick().await;
            match tokio::task::spawn_blocking(reload.clone()).await {
                Ok(Ok(())) => last_err = None,
                Ok(Err(msg)) => {
                    if last_err.as_deref() != Some(msg.as_str()) {
                        warn!("{what}: {msg}");
                        last_err = Some(msg);
                    }
                }
                Err(e) => warn!("{what}: {e}"),
            }
        }
    })
}
