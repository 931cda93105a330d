//! Staging a new tree and checking it, before the swap.
//!
//! Owns planning the tree (written parts, carried files, missing ones), building it off the
//! async runtime, starting its fsyncs, and the `haproxy -c` and bind pre-check of what a reload
//! would load. Every refusal here removes the staged tree: nothing visible changes. It must never
//! move `current` nor touch `.state`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use haptic_haproxy::paths::PathViolation;
use haptic_protocol::api::{ConflictKind, Nack};
use haptic_protocol::{ApplyRequest, FileEntry, Mode, RelPath};

use super::{conflict, Agent, Refusal};
use crate::error::AgentError;
use crate::store::Persisted;
use crate::tree::{plan_tree, PartData, StageError, Stamps, Tree};

/// A staged tree, not yet live.
#[derive(Debug)]
pub(super) struct Staged {
    /// Its id under `.trees`.
    pub id: String,
    /// Its directory.
    pub dir: PathBuf,
    /// The stamps of its files.
    pub stamps: Stamps,
    /// Its fsyncs, running while the mode is decided and the config checked.
    pub syncing: tokio::task::JoinHandle<Result<(), AgentError>>,
    /// The live tree's file index.
    pub live_files: Vec<FileEntry>,
    /// The live and the staged `haproxy.cfg`.
    pub old_cfg: String,
    /// The staged `haproxy.cfg`.
    pub new_cfg: String,
    /// HAProxy's warnings from `haproxy -c` of this tree (`None`: not checked, a runtime apply).
    pub warnings: Option<Vec<String>>,
}

impl Agent {
    /// Plans and builds the new tree; `missing_parts` when a desired file is neither sent nor
    /// present with its digest.
    pub(super) async fn stage(
        &self,
        p: &Persisted,
        req: &ApplyRequest,
        parts: BTreeMap<RelPath, PartData>,
    ) -> Result<Staged, Refusal> {
        let live_files: Vec<FileEntry> = p.applied.as_ref().map(|a| a.files.clone()).unwrap_or_default();
        let sent: BTreeSet<RelPath> = parts.keys().cloned().collect();
        let plan = plan_tree(&req.files, &sent, &live_files);
        if !plan.missing.is_empty() {
            let msg = format!("{} desired file(s) neither sent nor present", plan.missing.len());
            return Err(conflict(ConflictKind::MissingParts, p, plan.missing, msg));
        }
        let live_id = self.tree.live_id()?;
        let live_dir = live_id.as_deref().map(|l| self.tree.dir_of(l));
        let trusted = self.cache.stamps_of(live_id.as_deref());
        let id = Tree::new_id();
        let staged = {
            let (tree, id, files, live_dir) = (self.tree.clone(), id.clone(), req.files.clone(), live_dir.clone());
            tokio::task::spawn_blocking(move || tree.build(&id, &files, parts, &plan, live_dir.as_deref(), &trusted))
                .await
                .map_err(|e| Refusal::Internal(format!("staging task failed: {e}")))?
        };
        let (dir, stamps, syncing) = match staged {
            // The new tree's fsyncs run while the mode is decided and the config checked; the
            // swap waits for them.
            Ok((d, stamps, unsynced)) => (d, stamps, tokio::task::spawn_blocking(move || unsynced.sync())),
            Err(StageError::Missing(m)) => {
                let msg = format!("{} file(s) in the live tree do not match their digest: send them", m.len());
                return Err(conflict(ConflictKind::MissingParts, p, m, msg));
            }
            Err(StageError::Agent(e)) => return Err(e.into()),
        };
        let (old_cfg, new_cfg) = {
            let (live_dir, dir) = (live_dir.clone(), dir.clone());
            tokio::task::spawn_blocking(move || {
                let read = |d: Option<&Path>| {
                    d.and_then(|d| std::fs::read_to_string(d.join("haproxy.cfg")).ok()).unwrap_or_default()
                };
                (read(live_dir.as_deref()), read(Some(&dir)))
            })
            .await
            .map_err(|e| Refusal::Internal(format!("reading configs failed: {e}")))?
        };
        Ok(Staged { id, dir, stamps, syncing, live_files, old_cfg, new_cfg, warnings: None })
    }

    /// Checks whatever a reload will load (or lies on disk for file_only): `haproxy -c`, then
    /// the bind pre-check. A refusal removes the staged tree.
    pub(super) async fn check(&self, mut staged: Staged, mode: Mode) -> Result<Staged, Refusal> {
        // The path rules parse the staged config and read what it references: once, and not at
        // all for a verified runtime claim. That claim admits only server address, port, weight
        // and state changes, so the config references exactly the files the live one does, and
        // the live one passed these rules when it was applied (the profile's largest item: two
        // parses of the config per runtime apply).
        let paths = if mode == Mode::Runtime { Ok(()) } else { self.check_paths(&staged) };
        let checked =
            if mode == Mode::Runtime || paths.is_err() { None } else { Some(self.cfg.check_tree(&staged.dir).await) };
        let refused = if let Err(why) = paths {
            Some(Nack {
                error: "the config makes HAProxy read paths outside the tree".into(),
                rejected: true,
                haproxy_output: why.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"),
                reason: format!("path rules: {}", why.first().map(ToString::to_string).unwrap_or_default()),
            })
        } else if mode == Mode::Runtime {
            None
        } else if let Some(Err(e)) = checked.clone() {
            Some(Nack {
                error: "haproxy -c refused the config".into(),
                rejected: true,
                haproxy_output: e.output,
                reason: "check: haproxy -c failed".into(),
            })
        } else if mode == Mode::Reload && self.cfg.bind_precheck {
            crate::check::precheck_binds(&staged.old_cfg, &staged.new_cfg).err().map(|e| Nack {
                error: "a port the new config binds is already in use".into(),
                rejected: true,
                haproxy_output: e.output,
                reason: "bind pre-check: a new bind address is held by another socket".into(),
            })
        } else {
            None
        };
        match refused {
            None => {
                staged.warnings = checked.and_then(Result::ok);
                Ok(staged)
            }
            Some(nack) => {
                self.discard(staged).await;
                Err(Refusal::Nack(Box::new(nack)))
            }
        }
    }

    /// The path rules (every path inside the tree or under an allowed prefix, sockets under the
    /// socket directory, `default-path config`) over the staged config, before `haproxy -c`
    /// reads anything.
    fn check_paths(&self, staged: &Staged) -> Result<(), Vec<PathViolation>> {
        use haptic_haproxy::paths::{check_paths, file_refs};
        let dir = staged.dir.clone();
        let read = move |p: &str| -> Option<String> {
            let rel = RelPath::new(p).ok()?;
            std::fs::read_to_string(dir.join(rel.as_str())).ok()
        };
        let refs = file_refs(&staged.new_cfg, &read);
        check_paths(&staged.new_cfg, &refs, &self.cfg.path_policy)
    }

    /// Removes a staged tree that will not be swapped in (off the async runtime).
    pub(super) async fn discard(&self, staged: Staged) {
        let _ = staged.syncing.await;
        let (tree, id) = (self.tree.clone(), staged.id);
        let _ = tokio::task::spawn_blocking(move || tree.remove(&id)).await;
    }
}
