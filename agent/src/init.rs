//! `haptic-agent init`: the bootstrap tree HAProxy starts on before the first apply.
//!
//! Owns writing the bootstrap config (`haptic_haproxy::bootstrap`: a frontend on `--health-bind`
//! answering `/healthz` 200 and `/ready` 503) crash-safely as the first tree. It must never touch
//! an already initialised root.

use std::collections::{BTreeMap, BTreeSet};

use haptic_protocol::{Digest, FileEntry, RelPath};

use crate::error::AgentError;
use crate::store::{GoodRecord, Persisted, Store};
use crate::tree::{plan_tree, StageError, Stamps, Tree};

/// The bootstrap `haproxy.cfg` for a health bind such as `:8404` or `127.0.0.1:8404`.
pub fn bootstrap_cfg(health_bind: &str) -> Result<String, AgentError> {
    haptic_haproxy::bootstrap::config(health_bind).map_err(|e| AgentError::Tree(e.to_string()))
}

/// Initialises `root` unless it already has a `current` tree. Returns whether it wrote anything.
pub fn init(root: &std::path::Path, health_bind: &str) -> Result<bool, AgentError> {
    let cfg = bootstrap_cfg(health_bind)?;
    let tree = Tree::new(root);
    if tree.live_id()?.is_some() {
        return Ok(false);
    }
    std::fs::create_dir_all(root).map_err(|e| AgentError::io("create", root, e))?;
    // A crash during an earlier init may have left a half-written tree.
    tree.gc(&[])?;
    let bytes = cfg.into_bytes();
    let entry = FileEntry { path: RelPath::haproxy_cfg(), digest: Digest::of(&bytes), size: bytes.len() as u64 };
    let parts = BTreeMap::from([(RelPath::haproxy_cfg(), bytes)]);
    let files = vec![entry];
    let plan = plan_tree(&files, &parts.keys().cloned().collect::<BTreeSet<_>>(), &[]);
    let id = Tree::new_id();
    tree.stage(&id, &files, parts, &plan, None, &Stamps::new()).map_err(|e| match e {
        StageError::Agent(a) => a,
        StageError::Missing(m) => AgentError::Tree(format!("bootstrap tree incomplete: {m:?}")),
    })?;
    let store = Store::new(root);
    let p = Persisted { last_good: Some(GoodRecord { tree: id.clone(), applied: None }), ..Default::default() };
    store.save(&p)?;
    tree.swap(&id)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        assert!(init(&root, "127.0.0.1:1").unwrap());
        let id = Tree::new(&root).live_id().unwrap().unwrap();
        assert!(!init(&root, "127.0.0.1:1").unwrap());
        assert_eq!(Tree::new(&root).live_id().unwrap().unwrap(), id);
        assert!(bootstrap_cfg("bad bind").is_err());
        assert!(bootstrap_cfg(":8404").unwrap().contains("bind :8404"));
    }
}
