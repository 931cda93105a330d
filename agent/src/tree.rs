//! The crash-safe config tree: `ROOT/current -> .trees/<id>`.
//!
//! Owns creating trees (written parts plus unchanged files carried by hard link), verifying their
//! digests, fsyncing files and directories, the atomic symlink swap, hashing a live tree from disk
//! and removing old trees. It never follows a symlink found inside a tree (a planted symlink is
//! treated as an absent file) and never writes outside `ROOT`. It must never decide what to
//! apply, talk to HAProxy or touch `ROOT/.state`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use haptic_protocol::{Digest, FileEntry, RelPath};

use crate::error::{AgentError, IoContext};

/// The directory holding every tree, relative to the root.
pub const TREES_DIR: &str = ".trees";
/// The live symlink, relative to the root.
pub const CURRENT: &str = "current";

/// What to do for each desired file when building a new tree (pure result of [`plan_tree`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreePlan {
    /// Files written from the request's parts.
    pub write: Vec<RelPath>,
    /// Files carried from the live tree: `(new path, live path with the same digest)`.
    pub carry: Vec<(RelPath, RelPath)>,
    /// Desired files neither sent nor present with that digest.
    pub missing: Vec<RelPath>,
}

/// Decides, for each desired file, whether it is written from a part, carried from a live file
/// with the same digest (the same path preferred), or missing. Pure.
pub fn plan_tree(desired: &[FileEntry], sent: &BTreeSet<RelPath>, live: &[FileEntry]) -> TreePlan {
    let mut by_digest: BTreeMap<Digest, &RelPath> = BTreeMap::new();
    for f in live {
        by_digest.entry(f.digest).or_insert(&f.path);
    }
    let live_by_path: BTreeMap<&RelPath, &FileEntry> = live.iter().map(|f| (&f.path, f)).collect();
    let mut plan = TreePlan::default();
    for f in desired {
        if sent.contains(&f.path) {
            plan.write.push(f.path.clone());
        } else if live_by_path.get(&f.path).is_some_and(|l| l.digest == f.digest && l.size == f.size) {
            plan.carry.push((f.path.clone(), f.path.clone()));
        } else if let Some(src) = by_digest.get(&f.digest) {
            plan.carry.push((f.path.clone(), (*src).clone()));
        } else {
            plan.missing.push(f.path.clone());
        }
    }
    plan.missing.sort();
    plan
}

/// Why staging a tree failed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Carried files that are gone, not regular files, or no longer hash to their digest.
    #[error("files not present with their digest: {0:?}")]
    Missing(Vec<RelPath>),
    /// A disk error.
    #[error(transparent)]
    Agent(#[from] AgentError),
}

/// The config tree under one root.
#[derive(Debug, Clone)]
pub struct Tree {
    root: PathBuf,
}

impl Tree {
    /// The tree under `root` (nothing is touched).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `ROOT/.trees`.
    pub fn trees_dir(&self) -> PathBuf {
        self.root.join(TREES_DIR)
    }

    /// `ROOT/current`.
    pub fn current_link(&self) -> PathBuf {
        self.root.join(CURRENT)
    }

    /// The directory of tree `id`.
    pub fn dir_of(&self, id: &str) -> PathBuf {
        self.trees_dir().join(id)
    }

    /// A fresh, unique tree id (sortable by creation time).
    pub fn new_id() -> String {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        format!("t{nanos:024}-{:08x}", rand::random::<u32>())
    }

    /// The id of the live tree, if `current` exists and points into `.trees`.
    pub fn live_id(&self) -> Result<Option<String>, AgentError> {
        let link = self.current_link();
        match fs::read_link(&link) {
            Ok(target) => {
                let t = target.to_string_lossy().into_owned();
                let id = t.strip_prefix(&format!("{TREES_DIR}/")).unwrap_or("");
                if id.is_empty() || id.contains('/') {
                    return Err(AgentError::Tree(format!("{} points to {t}, not into {TREES_DIR}/", link.display())));
                }
                Ok(Some(id.to_string()))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(AgentError::io("read_link", &link, e)),
        }
    }

    /// Every tree id under `.trees`.
    pub fn list(&self) -> Result<Vec<String>, AgentError> {
        let dir = self.trees_dir();
        let mut out = Vec::new();
        match fs::read_dir(&dir) {
            Ok(rd) => {
                for e in rd {
                    let e = e.ctx("read_dir", &dir)?;
                    out.push(e.file_name().to_string_lossy().into_owned());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(AgentError::io("read_dir", &dir, e)),
        }
        out.sort();
        Ok(out)
    }

    /// Removes every tree not in `keep` (leftover staging, superseded trees).
    pub fn gc(&self, keep: &[&str]) -> Result<usize, AgentError> {
        let mut removed = 0;
        for id in self.list()? {
            if !keep.contains(&id.as_str()) {
                self.remove(&id)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes one tree (no error when it is already gone).
    pub fn remove(&self, id: &str) -> Result<(), AgentError> {
        let dir = self.dir_of(id);
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(AgentError::io("remove tree", &dir, e)),
        }
    }

    /// Builds tree `id` from `parts` (written) and `plan.carry` (hard-linked from `live_dir`),
    /// then re-hashes every file against `desired`, fsyncs files and directories.
    ///
    /// On any error the half-built tree is removed.
    pub fn stage(
        &self,
        id: &str,
        desired: &[FileEntry],
        parts: &BTreeMap<RelPath, Vec<u8>>,
        plan: &TreePlan,
        live_dir: Option<&Path>,
    ) -> Result<PathBuf, StageError> {
        let dir = self.dir_of(id);
        let res = self.stage_inner(&dir, desired, parts, plan, live_dir);
        if res.is_err() {
            let _ = fs::remove_dir_all(&dir);
        }
        res.map(|()| dir)
    }

    fn stage_inner(
        &self,
        dir: &Path,
        desired: &[FileEntry],
        parts: &BTreeMap<RelPath, Vec<u8>>,
        plan: &TreePlan,
        live_dir: Option<&Path>,
    ) -> Result<(), StageError> {
        let trees = self.trees_dir();
        fs::create_dir_all(&trees).ctx("create", &trees)?;
        fs::create_dir(dir).ctx("create tree", dir)?;
        let mut dirs: BTreeSet<PathBuf> = BTreeSet::from([dir.to_path_buf()]);
        for path in &plan.write {
            let bytes = parts.get(path).ok_or_else(|| AgentError::Tree(format!("no part for {path}")))?;
            let dst = dir.join(path.as_str());
            ensure_parent(&dst, dir, &mut dirs)?;
            write_file(&dst, bytes)?;
        }
        let mut missing = Vec::new();
        for (dst_rel, src_rel) in &plan.carry {
            let Some(live) = live_dir else {
                missing.push(dst_rel.clone());
                continue;
            };
            let src = live.join(src_rel.as_str());
            if !is_regular_nofollow(live, src_rel) {
                missing.push(dst_rel.clone());
                continue;
            }
            let dst = dir.join(dst_rel.as_str());
            ensure_parent(&dst, dir, &mut dirs)?;
            if fs::hard_link(&src, &dst).is_err() {
                // Another file system or a link limit: copy without following symlinks.
                match read_nofollow(&src) {
                    Ok(bytes) => write_file(&dst, &bytes)?,
                    Err(_) => missing.push(dst_rel.clone()),
                }
            }
        }
        // Verify every digest from disk, and fsync every file.
        for f in desired {
            if missing.contains(&f.path) {
                continue;
            }
            let p = dir.join(f.path.as_str());
            match hash_and_sync(&p) {
                Ok((d, size)) if d == f.digest && size == f.size => {}
                Ok(_) | Err(_) => missing.push(f.path.clone()),
            }
        }
        if !missing.is_empty() {
            missing.sort();
            missing.dedup();
            return Err(StageError::Missing(missing));
        }
        // Directories deepest first, then .trees itself.
        let mut all: Vec<&PathBuf> = dirs.iter().collect();
        all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for d in all {
            sync_dir(d)?;
        }
        sync_dir(&trees)?;
        Ok(())
    }

    /// Makes tree `id` live: a new symlink renamed over `current`, then the root fsynced.
    pub fn swap(&self, id: &str) -> Result<(), AgentError> {
        let tmp = self.root.join(".current.tmp");
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(format!("{TREES_DIR}/{id}"), &tmp).ctx("symlink", &tmp)?;
        let link = self.current_link();
        fs::rename(&tmp, &link).ctx("rename over", &link)?;
        sync_dir(&self.root)
    }

    /// The real directory of the live tree.
    pub fn live_dir(&self) -> Result<Option<PathBuf>, AgentError> {
        Ok(self.live_id()?.map(|id| self.dir_of(&id)))
    }
}

/// Hashes every regular file under `dir` (symlinks and other non-regular entries are skipped and
/// never followed; names that are not valid tree paths are skipped), sorted by path.
pub fn hash_dir(dir: &Path) -> Result<Vec<FileEntry>, AgentError> {
    let mut out = Vec::new();
    walk(dir, dir, 0, &mut out)?;
    out.sort_by(|a, b| a.path.as_str().as_bytes().cmp(b.path.as_str().as_bytes()));
    Ok(out)
}

fn walk(base: &Path, dir: &Path, depth: usize, out: &mut Vec<FileEntry>) -> Result<(), AgentError> {
    if depth > haptic_protocol::path::MAX_DEPTH {
        return Ok(());
    }
    let rd = fs::read_dir(dir).ctx("read_dir", dir)?;
    for e in rd {
        let e = e.ctx("read_dir", dir)?;
        let p = e.path();
        let ft = e.file_type().ctx("stat", &p)?;
        if ft.is_dir() {
            walk(base, &p, depth + 1, out)?;
        } else if ft.is_file() {
            let Ok(rel) = p.strip_prefix(base) else { continue };
            let Ok(rel) = RelPath::new(rel.to_string_lossy().into_owned()) else { continue };
            let f = open_nofollow(&p).ctx("open", &p)?;
            let (digest, size) = Digest::from_reader(f).ctx("read", &p)?;
            out.push(FileEntry { path: rel, digest, size });
        }
    }
    Ok(())
}

/// Whether `base/rel` is a regular file reached without any symlink on the way.
fn is_regular_nofollow(base: &Path, rel: &RelPath) -> bool {
    let mut p = base.to_path_buf();
    let comps: Vec<&str> = rel.components().collect();
    for (i, c) in comps.iter().enumerate() {
        p.push(c);
        let Ok(md) = fs::symlink_metadata(&p) else { return false };
        let last = i + 1 == comps.len();
        if (last && !md.file_type().is_file()) || (!last && !md.file_type().is_dir()) {
            return false;
        }
    }
    true
}

fn open_nofollow(p: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(p)
}

fn read_nofollow(p: &Path) -> io::Result<Vec<u8>> {
    let mut f = open_nofollow(p)?;
    let mut buf = Vec::new();
    io::Read::read_to_end(&mut f, &mut buf)?;
    Ok(buf)
}

fn hash_and_sync(p: &Path) -> io::Result<(Digest, u64)> {
    let f = open_nofollow(p)?;
    if !f.metadata()?.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
    }
    f.sync_all()?;
    Digest::from_reader(f)
}

fn ensure_parent(dst: &Path, tree: &Path, dirs: &mut BTreeSet<PathBuf>) -> Result<(), AgentError> {
    let Some(parent) = dst.parent() else { return Ok(()) };
    if dirs.contains(parent) {
        return Ok(());
    }
    fs::create_dir_all(parent).ctx("create", parent)?;
    let mut p = parent;
    while p.starts_with(tree) && p != tree {
        dirs.insert(p.to_path_buf());
        match p.parent() {
            Some(pp) => p = pp,
            None => break,
        }
    }
    Ok(())
}

/// Writes a new file (never through an existing symlink) and fsyncs it.
pub fn write_file(p: &Path, bytes: &[u8]) -> Result<(), AgentError> {
    let mut f =
        OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(p).ctx("create", p)?;
    f.write_all(bytes).ctx("write", p)?;
    f.sync_all().ctx("fsync", p)
}

/// fsyncs a directory.
pub fn sync_dir(p: &Path) -> Result<(), AgentError> {
    File::open(p).and_then(|d| d.sync_all()).ctx("fsync dir", p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fe(path: &str, body: &[u8]) -> FileEntry {
        FileEntry { path: RelPath::new(path).unwrap(), digest: Digest::of(body), size: body.len() as u64 }
    }

    #[test]
    fn plan_prefers_parts_then_same_path_then_same_digest() {
        let live = vec![fe("haproxy.cfg", b"old"), fe("maps/a.map", b"A"), fe("certs/x.pem", b"X")];
        let desired = vec![fe("haproxy.cfg", b"new"), fe("maps/a.map", b"A"), fe("maps/b.map", b"X"), fe("c", b"?")];
        let sent = BTreeSet::from([RelPath::new("haproxy.cfg").unwrap()]);
        let p = plan_tree(&desired, &sent, &live);
        assert_eq!(p.write, vec![RelPath::new("haproxy.cfg").unwrap()]);
        assert_eq!(
            p.carry,
            vec![
                (RelPath::new("maps/a.map").unwrap(), RelPath::new("maps/a.map").unwrap()),
                (RelPath::new("maps/b.map").unwrap(), RelPath::new("certs/x.pem").unwrap()),
            ]
        );
        assert_eq!(p.missing, vec![RelPath::new("c").unwrap()]);
    }

    proptest! {
        #[test]
        fn plan_covers_every_desired_file_once(
            live in proptest::collection::btree_map("[a-c]{1,2}", 0u8..4, 0..6),
            want in proptest::collection::btree_map("[a-c]{1,2}", 0u8..4, 1..6),
            sent_mask in proptest::collection::vec(any::<bool>(), 6),
        ) {
            let live: Vec<FileEntry> = live.iter().map(|(p, b)| fe(p, &[*b])).collect();
            let desired: Vec<FileEntry> = want.iter().map(|(p, b)| fe(p, &[*b])).collect();
            let sent: BTreeSet<RelPath> = desired.iter().zip(&sent_mask).filter(|(_, s)| **s).map(|(f, _)| f.path.clone()).collect();
            let p = plan_tree(&desired, &sent, &live);
            prop_assert_eq!(p.write.len() + p.carry.len() + p.missing.len(), desired.len());
            for (dst, src) in &p.carry {
                let d = desired.iter().find(|f| &f.path == dst).unwrap();
                let s = live.iter().find(|f| &f.path == src).unwrap();
                prop_assert_eq!(d.digest, s.digest);
                prop_assert!(!sent.contains(dst));
            }
            for m in &p.missing {
                let d = desired.iter().find(|f| &f.path == m).unwrap();
                prop_assert!(!sent.contains(m));
                prop_assert!(live.iter().all(|l| l.digest != d.digest));
            }
        }
    }

    #[test]
    fn stage_swap_and_refuse_planted_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = Tree::new(tmp.path());
        let files = vec![fe("haproxy.cfg", b"cfg1"), fe("maps/a.map", b"k v\n")];
        let parts: BTreeMap<RelPath, Vec<u8>> = files
            .iter()
            .map(|f| (f.path.clone(), if f.path.is_haproxy_cfg() { b"cfg1".to_vec() } else { b"k v\n".to_vec() }))
            .collect();
        let plan = plan_tree(&files, &parts.keys().cloned().collect(), &[]);
        tree.stage("one", &files, &parts, &plan, None).unwrap();
        tree.swap("one").unwrap();
        assert_eq!(tree.live_id().unwrap().as_deref(), Some("one"));
        assert_eq!(hash_dir(&tree.live_dir().unwrap().unwrap()).unwrap(), files);

        // Carry the map into a second tree by hard link.
        let files2 = vec![fe("haproxy.cfg", b"cfg2"), fe("maps/a.map", b"k v\n")];
        let parts2 = BTreeMap::from([(RelPath::haproxy_cfg(), b"cfg2".to_vec())]);
        let plan2 = plan_tree(&files2, &parts2.keys().cloned().collect(), &files);
        assert_eq!(plan2.carry.len(), 1);
        let live = tree.live_dir().unwrap().unwrap();
        tree.stage("two", &files2, &parts2, &plan2, Some(&live)).unwrap();

        // A symlink planted in the live tree is never followed.
        let secret = tmp.path().join("secret");
        fs::write(&secret, b"k v\n").unwrap();
        fs::remove_file(live.join("maps/a.map")).unwrap();
        std::os::unix::fs::symlink(&secret, live.join("maps/a.map")).unwrap();
        let err = tree.stage("three", &files2, &parts2, &plan2, Some(&live)).unwrap_err();
        assert!(matches!(err, StageError::Missing(ref m) if m == &vec![RelPath::new("maps/a.map").unwrap()]));
        assert!(!tree.dir_of("three").exists());
        // hash_dir skips the symlink.
        assert_eq!(hash_dir(&live).unwrap().len(), 1);

        tree.swap("two").unwrap();
        assert_eq!(tree.gc(&["two"]).unwrap(), 1);
        assert_eq!(tree.list().unwrap(), vec!["two".to_string()]);
    }
}
