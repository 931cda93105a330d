//! A directory as a bundle source ([`ConfigDir`]): each settled change of `--config-dir` is one render.
//!
//! Owns watching (inotify through `notify`, plus a slow poll as a safety net), debouncing and
//! the settle rule: a render is read only after the directory has been quiet for the settle
//! window, and is emitted only if nothing changed while it was read, so a half-written edit does
//! not deploy. It must never emit the same plan twice in a row, and never write into the
//! directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use haptic_protocol::PlanId;
use notify::Watcher as _;
use tokio::sync::mpsc;

use crate::bundle::{self, is_ignored_name};
use crate::seams::{BundleEvent, BundleSource};

/// Watches a directory and yields settled renders.
pub struct ConfigDir {
    dir: PathBuf,
    settle: Duration,
    poll: Duration,
    events: mpsc::UnboundedReceiver<()>,
    _watcher: Option<notify::RecommendedWatcher>,
    last: Option<Result<PlanId, String>>,
}

impl std::fmt::Debug for ConfigDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigDir").field("dir", &self.dir).field("settle", &self.settle).finish()
    }
}

/// Whether a filesystem event touches something that can be part of a render.
fn relevant(dir: &Path, ev: &notify::Event) -> bool {
    if matches!(ev.kind, notify::EventKind::Access(_)) {
        return false;
    }
    ev.paths.iter().any(|p| {
        let rel = p.strip_prefix(dir).unwrap_or(p);
        !rel.components().any(|c| is_ignored_name(&c.as_os_str().to_string_lossy()))
    })
}

impl ConfigDir {
    /// Watches `dir`; `settle` is the quiet window before a change is read.
    pub fn new(dir: &Path, settle: Duration) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let dir = dir.to_path_buf();
        let watch_dir = dir.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(ev) if relevant(&watch_dir, &ev) => {
                let _ = tx.send(());
            }
            Ok(_) => {}
            Err(_) => {
                let _ = tx.send(());
            }
        })
        .and_then(|mut w| w.watch(&dir, notify::RecursiveMode::Recursive).map(|()| w));
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "cannot watch the config dir ({e}); polling it instead");
                None
            }
        };
        let poll = if watcher.is_some() {
            Duration::from_secs(2).max(settle * 4)
        } else {
            settle.max(Duration::from_millis(200))
        };
        ConfigDir { dir, settle, poll, events: rx, _watcher: watcher, last: None }
    }

    fn drain(&mut self) -> bool {
        let mut any = false;
        while self.events.try_recv().is_ok() {
            any = true;
        }
        any
    }

    /// Waits until the directory was quiet for the settle window.
    async fn settle(&mut self) {
        loop {
            self.drain();
            tokio::time::sleep(self.settle).await;
            if !self.drain() {
                return;
            }
        }
    }

    async fn next_render(&mut self) -> Option<BundleEvent> {
        let mut first = self.last.is_none();
        loop {
            if !first {
                // Wait for a change, or poll as a safety net for missed events.
                let _ = tokio::time::timeout(self.poll, self.events.recv()).await;
            }
            first = false;
            self.settle().await;
            let dir = self.dir.clone();
            let loaded = tokio::task::spawn_blocking(move || bundle::load_dir(&dir)).await;
            if self.drain() {
                // Something changed while reading: not settled, read again.
                first = true;
                continue;
            }
            let ev: BundleEvent = match loaded {
                Ok(Ok(r)) => Ok(Arc::new(r)),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(format!("reading the render failed: {e}")),
            };
            let key = ev.as_ref().map(|r| r.plan_id()).map_err(Clone::clone);
            if self.last.as_ref() == Some(&key) {
                continue;
            }
            self.last = Some(key);
            return Some(ev);
        }
    }
}

impl BundleSource for ConfigDir {
    fn next(&mut self) -> BoxFuture<'_, Option<BundleEvent>> {
        self.next_render().boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // On paused time: the writer's 40 ms and the 150 ms settle window are both virtual, so the
    // completing write always lands inside the window, however slow the machine. (Time only
    // advances while the runtime is idle, so a filesystem event can arrive late, never early.)
    #[tokio::test(start_paused = true)]
    async fn settled_changes_only() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("haproxy.cfg"), "global\n").unwrap();
        let mut src = ConfigDir::new(d.path(), Duration::from_millis(150));
        let first = src.next().await.unwrap().unwrap();
        assert_eq!(first.cfg_text(), "global\n");

        // A half-written edit completed within the settle window yields one render: the whole one.
        let p = d.path().join("haproxy.cfg");
        std::fs::write(&p, "glo").unwrap();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(40)).await;
            std::fs::write(&p, "global\n  maxconn 10\n").unwrap();
        });
        let second = src.next().await.unwrap().unwrap();
        assert_eq!(second.cfg_text(), "global\n  maxconn 10\n");
        writer.await.unwrap();

        // Editor noise never makes a render.
        std::fs::write(d.path().join(".haproxy.cfg.swp"), "x").unwrap();
        std::fs::write(d.path().join("haproxy.cfg.tmp"), "x").unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(600), src.next()).await.is_err());

        // A broken directory is an error event, then a fix is a render again.
        std::fs::remove_file(d.path().join("haproxy.cfg")).unwrap();
        assert!(src.next().await.unwrap().is_err());
        std::fs::write(d.path().join("haproxy.cfg"), "global\n").unwrap();
        assert_eq!(src.next().await.unwrap().unwrap().plan_id(), first.plan_id());
    }
}
