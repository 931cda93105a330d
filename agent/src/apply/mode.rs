//! Deciding how an apply lands: the mode asked for, or a safer one.
//!
//! Owns checking a `file_only` or `runtime` claim against the staged tree (the runtime claim
//! through [`haptic_haproxy::claim`]); every downgrade to `reload` adds a human reason. The
//! parsed form of the last config the claim parsed is kept by digest, so a run of runtime applies
//! parses each config once. It must never write the tree nor talk to HAProxy.

use super::*;

impl Agent {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide_mode(
        &self,
        req: &ApplyRequest,
        live_files: &[FileEntry],
        old_cfg: &str,
        new_cfg: &str,
        staged_dir: &std::path::Path,
        ops: &[Op],
        reasons: &mut Vec<String>,
    ) -> Mode {
        let new: BTreeSet<&RelPath> = req.files.iter().map(|f| &f.path).collect();
        let mut changed_paths = haptic_protocol::changed_paths(live_files, &req.files);
        changed_paths.retain(|p| !p.is_haproxy_cfg());
        let cfg_changed = old_cfg != new_cfg;
        match req.mode {
            Mode::Reload => Mode::Reload,
            Mode::Unknown => {
                reasons.push("a mode this agent does not know (newer protocol): checked reload instead".into());
                Mode::Reload
            }
            Mode::FileOnly => {
                if cfg_changed {
                    reasons.push("file_only refused: haproxy.cfg changed, reloading".into());
                    return Mode::Reload;
                }
                if !ops.is_empty() {
                    reasons.push("file_only refused: the apply carries runtime ops, reloading".into());
                    return Mode::Reload;
                }
                let read = |p: &str| -> Option<String> {
                    let rel = RelPath::new(p).ok()?;
                    std::fs::read_to_string(staged_dir.join(rel.as_str())).ok()
                };
                let loaded = haptic_haproxy::paths::loaded_paths(new_cfg, changed_paths.iter().copied(), &read);
                if !loaded.is_empty() {
                    let list: Vec<String> = loaded.iter().map(|p| p.to_string()).collect();
                    reasons.push(format!("file_only refused: the config loads {}, reloading", list.join(", ")));
                    return Mode::Reload;
                }
                Mode::FileOnly
            }
            Mode::Runtime => {
                let caps = self.capabilities();
                let mut why: Vec<String> = Vec::new();
                if self.probe.read().unwrap_or_else(|e| e.into_inner()).is_none() {
                    why.push("HAProxy version unknown".into());
                }
                for op in ops {
                    match op.kind() {
                        Some(k) if caps.supports(k) => {}
                        _ => why.push(format!("op kind {} is not supported here", op.kind_name())),
                    }
                }
                // Bytes of each changed file, from the staged (verified) tree.
                let bytes: Vec<(&RelPath, Option<Vec<u8>>)> = changed_paths
                    .iter()
                    .map(|p| {
                        let b = if new.contains(p) { std::fs::read(staged_dir.join(p.as_str())).ok() } else { None };
                        (*p, b)
                    })
                    .collect();
                let changed: Vec<ChangedFile<'_>> =
                    bytes.iter().map(|(p, b)| ChangedFile { path: p, new: b.as_deref() }).collect();
                let (old_parsed, new_parsed) = self.parsed_pair(live_files, old_cfg, &req.files, new_cfg);
                if let Err(e) = verify_runtime_claim_parsed(&old_parsed, &new_parsed, &changed, ops) {
                    why.extend(e.reasons);
                }
                if why.is_empty() {
                    Mode::Runtime
                } else {
                    reasons.push(format!("runtime claim not verified, checked reload instead: {}", why.join("; ")));
                    Mode::Reload
                }
            }
        }
    }

    /// The parsed old and new `haproxy.cfg`: the old one from the cache when its digest (as the
    /// applied record holds it) is the one parsed last, the new one parsed and cached.
    fn parsed_pair(
        &self,
        live_files: &[FileEntry],
        old_cfg: &str,
        new_files: &[FileEntry],
        new_cfg: &str,
    ) -> (Arc<haptic_haproxy::cfg::Config>, Arc<haptic_haproxy::cfg::Config>) {
        let digest_of = |files: &[FileEntry]| files.iter().find(|f| f.path.is_haproxy_cfg()).map(|f| f.digest);
        let (old_d, new_d) = (digest_of(live_files), digest_of(new_files));
        let cached = lock(&self.parsed_cfg).clone();
        let hit = |d: Option<haptic_protocol::Digest>| match (&cached, d) {
            (Some((cd, c)), Some(d)) if *cd == d => Some(c.clone()),
            _ => None,
        };
        let old = hit(old_d).unwrap_or_else(|| Arc::new(haptic_haproxy::cfg::parse(old_cfg)));
        let new = hit(new_d).unwrap_or_else(|| Arc::new(haptic_haproxy::cfg::parse(new_cfg)));
        if let Some(d) = new_d {
            *lock(&self.parsed_cfg) = Some((d, new.clone()));
        }
        (old, new)
    }
}
