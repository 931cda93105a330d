//! Bundles: one complete desired file set (`haproxy.cfg` plus aux files) with its plan id —
//! what the controller deploys (a "render" in the docs and logs).
//!
//! Owns the [`Bundle`] value, reading a bundle from a directory (dotfiles, `.tmp`, `~` and
//! swap files are not part of a bundle), and the parsed form of a bundle's config that the
//! gate and the plan diff share ([`CfgIndex`], [`diff_cfg_cached`]). It must never watch,
//! debounce or decide when a bundle is complete — that is the [`crate::seams::BundleSource`]'s
//! job — and never write into the directory.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use haptic_haproxy::claim::{diff_indexed, CfgDiff, IndexedCfg, NewCfg};
use haptic_protocol::{plan_id, Digest, FileEntry, PlanId, RelPath};

use crate::error::Error;

/// The largest render file the controller reads (the agent's body limit is far above this).
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// One immutable desired state: every file's bytes, the manifest and the plan id.
#[derive(Clone, PartialEq, Eq)]
pub struct Bundle {
    files: BTreeMap<RelPath, Arc<Vec<u8>>>,
    manifest: Vec<FileEntry>,
    plan_id: PlanId,
    cfg_index: CfgIndex,
}

/// The parsed form of one `haproxy.cfg` text, computed once when first needed and shared by
/// clones. A cache, no part of the value that holds it: any two compare equal.
#[derive(Clone, Default)]
pub struct CfgIndex(Arc<OnceLock<Arc<IndexedCfg>>>);

impl CfgIndex {
    /// The parsed form of `text` (which must be the text this index belongs to).
    pub fn get_or_parse(&self, text: &str) -> Arc<IndexedCfg> {
        self.0.get_or_init(|| Arc::new(IndexedCfg::parse(text))).clone()
    }
}

impl PartialEq for CfgIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for CfgIndex {}

impl fmt::Debug for CfgIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() { "CfgIndex(parsed)" } else { "CfgIndex(empty)" })
    }
}

/// The structural diff of `old_text` (indexed by `old`) and `new_text` (indexed by `new`), as
/// `haptic_haproxy::claim::diff_cfg` gives it, comparing only the changed lines when it can;
/// `new` is filled on the way, so the next diff from this config parses nothing.
pub fn diff_cfg_cached(old_text: &str, old: &CfgIndex, new_text: &str, new: &CfgIndex) -> CfgDiff {
    let parsed = old.get_or_parse(old_text);
    let (diff, next) = diff_indexed(&parsed, old_text, new_text);
    if new.0.get().is_none() {
        let next = match next {
            NewCfg::Parsed(p) => p,
            edits => {
                let mut p = IndexedCfg::clone(&parsed);
                p.update(edits);
                p
            }
        };
        let _ = new.0.set(Arc::new(next));
    }
    diff
}

impl fmt::Debug for Bundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bundle").field("plan_id", &self.plan_id).field("files", &self.files.len()).finish()
    }
}

impl Bundle {
    /// Builds a render from files; refuses a set without `haproxy.cfg` or with a non-UTF-8 config.
    pub fn new(files: BTreeMap<RelPath, Vec<u8>>) -> Result<Self, String> {
        let cfg = files.get(&RelPath::haproxy_cfg()).ok_or("the render has no haproxy.cfg")?;
        if std::str::from_utf8(cfg).is_err() {
            return Err("haproxy.cfg is not UTF-8".into());
        }
        let manifest: Vec<FileEntry> = files
            .iter()
            .map(|(p, b)| FileEntry { path: p.clone(), digest: Digest::of(b), size: b.len() as u64 })
            .collect();
        let plan_id = plan_id(&manifest).map_err(|e| e.to_string())?;
        let files = files.into_iter().map(|(p, b)| (p, Arc::new(b))).collect();
        Ok(Bundle { files, manifest, plan_id, cfg_index: CfgIndex::default() })
    }

    /// Builds a render from `(path, text)` pairs; for tests and tools.
    pub fn from_texts<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for (p, t) in files {
            map.insert(RelPath::new(p).map_err(|e| format!("{p}: {e}"))?, t.as_bytes().to_vec());
        }
        Self::new(map)
    }

    /// The plan id of the manifest.
    pub fn plan_id(&self) -> PlanId {
        self.plan_id
    }

    /// The manifest, sorted by path.
    pub fn manifest(&self) -> &[FileEntry] {
        &self.manifest
    }

    /// The config text.
    pub fn cfg_text(&self) -> &str {
        // Checked to be present and UTF-8 in `new`.
        self.files.get(&RelPath::haproxy_cfg()).and_then(|b| std::str::from_utf8(b).ok()).unwrap_or_default()
    }

    /// The parsed form of the config, filled when first needed.
    pub fn cfg_index(&self) -> &CfgIndex {
        &self.cfg_index
    }

    /// The bytes of one file.
    pub fn bytes(&self, path: &RelPath) -> Option<&[u8]> {
        self.files.get(path).map(|b| b.as_slice())
    }

    /// Every file and its bytes.
    pub fn files(&self) -> impl Iterator<Item = (&RelPath, &[u8])> {
        self.files.iter().map(|(p, b)| (p, b.as_slice()))
    }

    /// The manifest entry of one file.
    pub fn entry(&self, path: &RelPath) -> Option<&FileEntry> {
        self.manifest.iter().find(|e| &e.path == path)
    }

    /// Writes the render into `dir` (which must exist); used by the gate's temp dir.
    pub fn write_to(&self, dir: &Path) -> Result<(), Error> {
        for (p, b) in &self.files {
            let target = dir.join(p.as_str());
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
            }
            std::fs::write(&target, b.as_slice()).map_err(|e| Error::io(&target, e))?;
        }
        Ok(())
    }
}

/// Whether a directory entry name is never part of a render: dotfiles (editor swap files,
/// `.git`), `*.tmp`, `*~` backups and `*.swp`/`*.swx` files.
pub fn is_ignored_name(name: &str) -> bool {
    name.starts_with('.')
        || name.ends_with(".tmp")
        || name.ends_with('~')
        || name.ends_with(".swp")
        || name.ends_with(".swx")
        || name.starts_with('#')
}

/// Reads a render from a directory: every regular file below it, except ignored names.
pub fn load_dir(dir: &Path) -> Result<Bundle, Error> {
    let mut files = BTreeMap::new();
    walk(dir, dir, 0, &mut files)?;
    Bundle::new(files).map_err(|why| Error::ConfigDir { dir: dir.to_path_buf(), why })
}

fn walk(root: &Path, dir: &Path, depth: usize, out: &mut BTreeMap<RelPath, Vec<u8>>) -> Result<(), Error> {
    let render_err = |why: String| Error::ConfigDir { dir: root.to_path_buf(), why };
    if depth > haptic_protocol::path::MAX_DEPTH {
        return Err(render_err(format!("{} is nested too deep", dir.display())));
    }
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut entries: Vec<(String, PathBuf)> = Vec::new();
    for e in rd {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if is_ignored_name(&name) {
            continue;
        }
        entries.push((name, e.path()));
    }
    entries.sort();
    for (_, path) in entries {
        // Follows symlinks, so a render may be a tree of links (e.g. a Kubernetes ConfigMap mount).
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            // A file removed between listing and reading: the caller re-reads until stable.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io(&path, e)),
        };
        if meta.is_dir() {
            walk(root, &path, depth + 1, out)?;
        } else if meta.is_file() {
            if meta.len() > MAX_FILE_BYTES {
                return Err(render_err(format!("{} is over {MAX_FILE_BYTES} bytes", path.display())));
            }
            let rel = path.strip_prefix(root).map_err(|e| render_err(e.to_string()))?;
            let rel_text = rel.to_string_lossy().replace(std::path::MAIN_SEPARATOR, "/");
            let rel = RelPath::new(rel_text.clone()).map_err(|e| render_err(format!("{rel_text}: {e}")))?;
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(&path, e)),
            };
            out.insert(rel, bytes);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_a_tree_and_skips_editor_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("haproxy.cfg"), "global\n").unwrap();
        std::fs::create_dir(d.path().join("maps")).unwrap();
        std::fs::write(d.path().join("maps/hosts.map"), "a b\n").unwrap();
        std::fs::write(d.path().join(".haproxy.cfg.swp"), "x").unwrap();
        std::fs::write(d.path().join("haproxy.cfg.tmp"), "x").unwrap();
        std::fs::write(d.path().join("haproxy.cfg~"), "x").unwrap();
        std::fs::create_dir(d.path().join(".git")).unwrap();
        std::fs::write(d.path().join(".git/HEAD"), "x").unwrap();
        let r = load_dir(d.path()).unwrap();
        let paths: Vec<&str> = r.manifest().iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, vec!["haproxy.cfg", "maps/hosts.map"]);
        assert_eq!(r.cfg_text(), "global\n");
        let again = load_dir(d.path()).unwrap();
        assert_eq!(again.plan_id(), r.plan_id());
    }

    #[test]
    fn refuses_missing_cfg_and_bad_names() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("x.map"), "a b\n").unwrap();
        assert!(matches!(load_dir(d.path()), Err(Error::ConfigDir { .. })));
        std::fs::write(d.path().join("haproxy.cfg"), "global\n").unwrap();
        std::fs::write(d.path().join("bad name.map"), "a b\n").unwrap();
        assert!(matches!(load_dir(d.path()), Err(Error::ConfigDir { .. })), "a name that is no tree path");
        std::fs::rename(d.path().join("bad name.map"), d.path().join("good.map")).unwrap();
        assert!(load_dir(d.path()).is_ok(), "the same file under a tree path");
    }
}
