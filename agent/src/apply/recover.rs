//! Crash recovery on start: reconciling `ROOT/.state` with `ROOT/current`.
//!
//! Owns [`recover`]: trusting `current` (plus the persisted swap intent) after a crash, rebuilding
//! the index from disk when it disagrees, and removing staging leftovers. It must never talk to
//! HAProxy nor accept an apply.

use haptic_protocol::Mode;
use tracing::warn;

use super::now_rfc3339;
use crate::error::AgentError;
use crate::store::{AppliedRecord, GoodRecord, Persisted, Store};
use crate::tree::{hash_dir, Tree};

/// Reconciles `.state` with `current` after a start (possibly after a crash) and persists it.
pub fn recover(tree: &Tree, store: &Store) -> Result<Persisted, AgentError> {
    let mut p = store.load()?;
    let Some(live) = tree.live_id()? else {
        return Err(AgentError::Tree(format!(
            "{} is not initialised (no current link): run `haptic-agent init`",
            tree.root().display()
        )));
    };
    let live_dir = tree.dir_of(&live);
    if !live_dir.is_dir() {
        return Err(AgentError::Tree(format!("current points to a missing tree {live}")));
    }
    let intent = p.intent.take();
    let bootstrap = p.last_good.as_ref().is_some_and(|g| g.tree == live && g.applied.is_none());
    match (&p.applied, intent) {
        (Some(a), _) if a.tree == live => {}
        (_, Some(i)) if i.tree == live => p.applied = Some(i),
        // Either the bootstrap tree, or unknown: rebuilt from disk below.
        _ => p.applied = None,
    }
    let disk = hash_dir(&live_dir)?;
    let rebuild = match &p.applied {
        Some(a) => a.files != disk,
        None => !bootstrap,
    };
    if rebuild {
        warn!(root = %tree.root().display(), tree = %live, "the applied record does not match current: rebuilding it from disk");
        p.applied = haptic_protocol::plan_id(&disk).ok().map(|plan_id| AppliedRecord {
            blob: p.applied.as_ref().filter(|a| a.plan_id == plan_id).map(|a| a.blob.clone()).unwrap_or_default(),
            plan_id,
            mode: Mode::Reload,
            at: now_rfc3339(),
            files: disk,
            tree: live.clone(),
        });
    }
    let lg_ok = p.last_good.as_ref().is_some_and(|g| tree.dir_of(&g.tree).is_dir());
    if !lg_ok {
        p.last_good = Some(GoodRecord { tree: live.clone(), applied: p.applied.clone() });
    }
    let mut keep = vec![live.as_str()];
    if let Some(g) = &p.last_good {
        keep.push(&g.tree);
    }
    tree.gc(&keep)?;
    store.save(&p)?;
    Ok(p)
}
