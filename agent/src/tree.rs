//! The crash-safe config tree: `ROOT/current -> .trees/<id>`.
//!
//! Owns creating trees (written parts plus unchanged files carried by hard link), verifying their
//! digests (a carried file is re-hashed unless its inode still matches the [`Stamp`] the agent
//! took when it wrote or hashed it), fsyncing files and directories, the atomic symlink swap, hashing a live tree from disk
//! and removing old trees. It never follows a symlink found inside a tree (a planted symlink is
//! treated as an absent file) and never writes outside `ROOT`. It must never decide what to
//! apply, talk to HAProxy or touch `ROOT/.state`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// How much older than the moment the agent last hashed a file its mtime must be for the stamp to
/// be trusted: file timestamps are coarse (one clock tick, or whole seconds on file systems that
/// store no nanoseconds), so an edit made in the same tick could keep mtime and size. Such
/// "racily clean" files are hashed once more, later, before they are trusted.
pub const RACY_MARGIN: Duration = Duration::from_millis(100);
/// [`RACY_MARGIN`] on a file system whose timestamps carry no nanoseconds.
pub const RACY_MARGIN_COARSE: Duration = Duration::from_secs(2);
/// How far back the agent sets the mtime of a file it writes into a new tree, so that any later
/// edit moves the mtime even within the same clock tick (the file's stamp is trusted at once).
pub const WRITE_BACKDATE: Duration = Duration::from_secs(3);

/// What the agent knows about one file it wrote or hashed: while the inode keeps these stat
/// fields, its content is still `digest`. A file edited behind the agent's back changes mtime or
/// ctime (and usually size), so its stamp no longer matches and it is hashed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    nlink: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// When the agent wrote or hashed it (wall clock, taken before the stat).
    verified_at: SystemTime,
    /// The content's digest.
    pub digest: Digest,
}

/// Stamps of one tree's files, by path.
pub type Stamps = BTreeMap<RelPath, Stamp>;

impl Stamp {
    /// The stamp of a file with metadata `md` whose content was `digest` at `verified_at`.
    pub fn of(md: &fs::Metadata, digest: Digest, verified_at: SystemTime) -> Self {
        Self {
            dev: md.dev(),
            ino: md.ino(),
            nlink: md.nlink(),
            size: md.size(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
            verified_at,
            digest,
        }
    }

    /// Whether `md` is the very inode and state this stamp recorded.
    pub fn matches(&self, md: &fs::Metadata) -> bool {
        md.file_type().is_file()
            && md.dev() == self.dev
            && md.ino() == self.ino
            && md.nlink() == self.nlink
            && md.size() == self.size
            && (md.mtime(), md.mtime_nsec()) == self.mtime
            && (md.ctime(), md.ctime_nsec()) == self.ctime
    }

    /// Whether size and mtime are unchanged (what a link or unlink by the agent leaves alone).
    fn same_content_stat(&self, md: &fs::Metadata) -> bool {
        md.file_type().is_file() && md.size() == self.size && (md.mtime(), md.mtime_nsec()) == self.mtime
    }

    /// The same content after the agent changed the link count (new ctime and nlink).
    fn relinked(&self, md: &fs::Metadata) -> Self {
        Self { nlink: md.nlink(), ctime: (md.ctime(), md.ctime_nsec()), ..*self }
    }

    /// Whether the mtime is old enough, relative to when the agent read or wrote the file, that
    /// any later edit must have moved it.
    pub fn trusted(&self) -> bool {
        let mtime = UNIX_EPOCH
            + Duration::new(u64::try_from(self.mtime.0).unwrap_or(0), u32::try_from(self.mtime.1).unwrap_or(0));
        let margin = if self.mtime.1 == 0 && self.ctime.1 == 0 { RACY_MARGIN_COARSE } else { RACY_MARGIN };
        mtime + margin < self.verified_at
    }
}

/// The fsyncs a built tree still needs before it may be swapped in: the files written into it
/// (carried files are already durable, or were fsynced when re-hashed), every directory of it,
/// and `.trees`.
#[derive(Debug, Default)]
#[must_use = "a built tree must be synced before it is swapped in"]
pub struct Unsynced {
    files: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

/// Threads that run a tree's fsyncs at once.
const SYNC_THREADS: usize = 4;

impl Unsynced {
    /// Runs the fsyncs, several at once: each one must be done before the swap, none depends on
    /// another's order, and concurrent fsyncs share the file system's journal commits.
    pub fn sync(self) -> Result<(), AgentError> {
        let jobs: Vec<(&PathBuf, bool)> =
            self.files.iter().map(|f| (f, true)).chain(self.dirs.iter().map(|d| (d, false))).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = || -> Result<(), AgentError> {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((path, is_file)) = jobs.get(i) else { return Ok(()) };
                if *is_file {
                    OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(path)
                        .and_then(|f| f.sync_all())
                        .ctx("fsync", path)?;
                } else {
                    sync_dir(path)?;
                }
            }
        };
        let helpers = jobs.len().min(SYNC_THREADS).saturating_sub(1);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..helpers).map(|_| s.spawn(work)).collect();
            let mine = work();
            handles.into_iter().fold(mine, |acc, h| {
                let theirs = h.join().unwrap_or_else(|_| Err(AgentError::Tree("fsync thread panicked".into())));
                acc.and(theirs)
            })
        })
    }
}

/// The bytes of one written file: held in memory, or already decoded into a spool file under
/// the root (see [`crate::body`]), which is moved into the new tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartData {
    /// The bytes.
    Mem(Vec<u8>),
    /// A spool file on the root's file system, with the digest computed while it was written.
    Spooled {
        /// The spool file.
        file: PathBuf,
        /// Its digest.
        digest: Digest,
    },
}

impl From<Vec<u8>> for PartData {
    fn from(v: Vec<u8>) -> Self {
        PartData::Mem(v)
    }
}

/// What [`Tree::build`] builds a tree from, besides the parts written: the files the tree must
/// hold, which are written and which carried, and the live tree carried files come from with
/// the stamps the agent trusts there.
#[derive(Debug, Clone, Copy)]
struct BuildFrom<'a> {
    desired: &'a [FileEntry],
    plan: &'a TreePlan,
    live_dir: Option<&'a Path>,
    trusted: &'a Stamps,
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

    /// Builds tree `id` from `parts` (written, each dropped once on disk) and `plan.carry`
    /// (hard-linked from `live_dir`), checks every digest and fsyncs what is new: written files,
    /// carried files that had to be re-hashed, and every directory of the new tree.
    ///
    /// A carried file whose live inode still matches its [`Stamp`] in `trusted` (the agent wrote
    /// or hashed it and it was not touched since) is linked without being re-read or re-synced;
    /// any other carried file is hashed from disk and fsynced. Returns the new tree's directory
    /// and the stamps of its files. On any error the half-built tree is removed.
    pub fn stage(
        &self,
        id: &str,
        desired: &[FileEntry],
        parts: BTreeMap<RelPath, impl Into<PartData>>,
        plan: &TreePlan,
        live_dir: Option<&Path>,
        trusted: &Stamps,
    ) -> Result<(PathBuf, Stamps), StageError> {
        let parts = parts.into_iter().map(|(p, d)| (p, d.into())).collect();
        let (dir, stamps, unsynced) = self.build(id, desired, parts, plan, live_dir, trusted)?;
        if let Err(e) = unsynced.sync() {
            let _ = fs::remove_dir_all(&dir);
            return Err(e.into());
        }
        Ok((dir, stamps))
    }

    /// [`Tree::stage`] without the final fsyncs: they are returned as [`Unsynced`], to run (maybe
    /// in parallel with other work) before the tree is swapped in. On error the half-built tree
    /// is removed.
    pub fn build(
        &self,
        id: &str,
        desired: &[FileEntry],
        parts: BTreeMap<RelPath, PartData>,
        plan: &TreePlan,
        live_dir: Option<&Path>,
        trusted: &Stamps,
    ) -> Result<(PathBuf, Stamps, Unsynced), StageError> {
        let dir = self.dir_of(id);
        let mut unsynced = Unsynced::default();
        let from = BuildFrom { desired, plan, live_dir, trusted };
        let res = self.stage_inner(&dir, from, parts, &mut unsynced);
        match res {
            Ok(stamps) => Ok((dir, stamps, unsynced)),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    fn stage_inner(
        &self,
        dir: &Path,
        from: BuildFrom<'_>,
        mut parts: BTreeMap<RelPath, PartData>,
        unsynced: &mut Unsynced,
    ) -> Result<Stamps, StageError> {
        let BuildFrom { desired, plan, live_dir, trusted } = from;
        let trees = self.trees_dir();
        fs::create_dir_all(&trees).ctx("create", &trees)?;
        fs::create_dir(dir).ctx("create tree", dir)?;
        let by_path: BTreeMap<&RelPath, &FileEntry> = desired.iter().map(|f| (&f.path, f)).collect();
        let mut stamps = Stamps::new();
        let mut dirs: BTreeSet<PathBuf> = BTreeSet::from([dir.to_path_buf()]);
        for path in &plan.write {
            // The caller checked each part's bytes against its digest when it decoded them.
            let data = parts.remove(path).ok_or_else(|| AgentError::Tree(format!("no part for {path}")))?;
            let entry = by_path.get(path).ok_or_else(|| AgentError::Tree(format!("{path} is not desired")))?;
            let dst = dir.join(path.as_str());
            let stamp = match data {
                PartData::Mem(bytes) => {
                    if bytes.len() as u64 != entry.size {
                        return Err(AgentError::Tree(format!("part {path} does not match its size")).into());
                    }
                    ensure_parent(&dst, dir, &mut dirs)?;
                    write_stamped(&dst, &bytes, entry.digest)?
                }
                PartData::Spooled { file, digest } => {
                    if digest != entry.digest {
                        return Err(AgentError::Tree(format!("part {path} does not match its digest")).into());
                    }
                    ensure_parent(&dst, dir, &mut dirs)?;
                    move_stamped(&file, &dst, entry.digest, entry.size)?
                }
            };
            stamps.insert(path.clone(), stamp);
            unsynced.files.push(dst);
        }
        drop(parts);
        let mut missing = Vec::new();
        for (dst_rel, src_rel) in &plan.carry {
            let Some(entry) = by_path.get(dst_rel) else {
                missing.push(dst_rel.clone());
                continue;
            };
            let Some(live) = live_dir else {
                missing.push(dst_rel.clone());
                continue;
            };
            let src = live.join(src_rel.as_str());
            let Some(src_md) = regular_nofollow(live, src_rel) else {
                missing.push(dst_rel.clone());
                continue;
            };
            let dst = dir.join(dst_rel.as_str());
            ensure_parent(&dst, dir, &mut dirs)?;
            let linked = fs::hard_link(&src, &dst).is_ok();
            if !linked {
                // Another file system or a link limit: copy without following symlinks.
                match read_nofollow(&src) {
                    Ok(bytes) => {
                        // Hashed and fsynced below.
                        write_file(&dst, &bytes, false)?;
                    }
                    Err(_) => {
                        missing.push(dst_rel.clone());
                        continue;
                    }
                }
            }
            // Trusted: the same inode, untouched since the agent wrote or hashed it, and the link
            // reached that very inode (nothing swapped it in between).
            let stamp = trusted.get(src_rel).filter(|s| {
                linked && s.digest == entry.digest && s.size == entry.size && s.trusted() && s.matches(&src_md)
            });
            if let Some(s) = stamp {
                match fs::symlink_metadata(&dst) {
                    Ok(md) if md.ino() == s.ino && md.dev() == s.dev && s.same_content_stat(&md) => {
                        stamps.insert(dst_rel.clone(), s.relinked(&md));
                        continue;
                    }
                    _ => {}
                }
            }
            match hash_and_sync(&dst) {
                Ok((d, size, md, at)) if d == entry.digest && size == entry.size => {
                    stamps.insert(dst_rel.clone(), Stamp::of(&md, d, at));
                }
                Ok(_) | Err(_) => missing.push(dst_rel.clone()),
            }
        }
        if !missing.is_empty() {
            missing.sort();
            missing.dedup();
            return Err(StageError::Missing(missing));
        }
        // Every directory of the new tree is new: deepest first, then .trees itself.
        let mut all: Vec<PathBuf> = dirs.into_iter().collect();
        all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        unsynced.dirs = all;
        unsynced.dirs.push(trees);
        Ok(stamps)
    }

    /// Re-reads the stamps of tree `id` right after the agent itself linked or unlinked its files
    /// (which moves ctime and the link count): a stamp survives only if its inode, size and mtime
    /// are unchanged; anything else is dropped, so that file is hashed again before it is trusted.
    pub fn refresh_stamps(&self, id: &str, stamps: &mut Stamps) {
        let dir = self.dir_of(id);
        stamps.retain(|path, s| match regular_nofollow(&dir, path) {
            Some(md) if s.matches(&md) => true,
            Some(md) if md.ino() == s.ino && md.dev() == s.dev && s.same_content_stat(&md) => {
                *s = s.relinked(&md);
                true
            }
            _ => false,
        });
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

/// How an indexed file that is not a regular file of the tree any more looks on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// Nothing is there.
    Missing,
    /// Something is there, but not a regular file reached without symlinks (a symlink, a
    /// directory, a fifo...).
    NotRegular,
}

/// Re-hashes the tree at `dir` against its `index`: every regular file found, plus one entry per
/// indexed path that is no longer a regular file, marked with how it drifted (its digest is that
/// of empty content, so a peer that ignores the marker still sees a change). Sorted by path.
pub fn verify_dir(dir: &Path, index: &[FileEntry]) -> Result<Vec<(FileEntry, Option<Drift>)>, AgentError> {
    let found = hash_dir(dir)?;
    let have: BTreeSet<&RelPath> = found.iter().map(|f| &f.path).collect();
    let mut drifted: Vec<(FileEntry, Option<Drift>)> = index
        .iter()
        .filter(|f| !have.contains(&f.path))
        .map(|f| {
            let p = dir.join(f.path.as_str());
            let how = match fs::symlink_metadata(&p) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Drift::Missing,
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Drift::NotRegular,
                _ => Drift::NotRegular,
            };
            (FileEntry { path: f.path.clone(), digest: Digest::of(b""), size: 0 }, Some(how))
        })
        .collect();
    let mut out: Vec<(FileEntry, Option<Drift>)> = found.into_iter().map(|f| (f, None)).collect();
    out.append(&mut drifted);
    out.sort_by(|a, b| a.0.path.as_str().as_bytes().cmp(b.0.path.as_str().as_bytes()));
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

/// The metadata of `base/rel` if it is a regular file reached without any symlink on the way.
fn regular_nofollow(base: &Path, rel: &RelPath) -> Option<fs::Metadata> {
    let mut p = base.to_path_buf();
    let comps: Vec<&str> = rel.components().collect();
    for (i, c) in comps.iter().enumerate() {
        p.push(c);
        let md = fs::symlink_metadata(&p).ok()?;
        let last = i + 1 == comps.len();
        if last {
            return md.file_type().is_file().then_some(md);
        }
        if !md.file_type().is_dir() {
            return None;
        }
    }
    None
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

/// Hashes and fsyncs a regular file; returns its digest, size, the metadata taken before reading
/// and the moment just before that stat.
fn hash_and_sync(p: &Path) -> io::Result<(Digest, u64, fs::Metadata, SystemTime)> {
    let f = open_nofollow(p)?;
    let at = SystemTime::now();
    let md = f.metadata()?;
    if !md.file_type().is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file"));
    }
    f.sync_all()?;
    let (d, size) = Digest::from_reader(f)?;
    Ok((d, size, md, at))
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

/// Writes a new file (never through an existing symlink), fsyncing it when `sync`.
pub fn write_file(p: &Path, bytes: &[u8], sync: bool) -> Result<(), AgentError> {
    let mut f =
        OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(p).ctx("create", p)?;
    f.write_all(bytes).ctx("write", p)?;
    if sync {
        f.sync_all().ctx("fsync", p)?;
    }
    Ok(())
}

/// Writes a new tree file (never through an existing symlink) with its mtime set
/// [`WRITE_BACKDATE`] in the past and returns its stamp. The caller fsyncs it.
fn write_stamped(p: &Path, bytes: &[u8], digest: Digest) -> Result<Stamp, AgentError> {
    let mut f =
        OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(p).ctx("create", p)?;
    f.write_all(bytes).ctx("write", p)?;
    let at = SystemTime::now();
    f.set_times(fs::FileTimes::new().set_modified(at - WRITE_BACKDATE)).ctx("set mtime", p)?;
    let md = f.metadata().ctx("stat", p)?;
    Ok(Stamp::of(&md, digest, at))
}

/// Moves a spool file (written and hashed by the agent, on the root's file system) into a tree
/// with its mtime set [`WRITE_BACKDATE`] in the past and returns its stamp. The caller fsyncs it.
fn move_stamped(src: &Path, dst: &Path, digest: Digest, size: u64) -> Result<Stamp, AgentError> {
    fs::rename(src, dst).ctx("move spooled part", dst)?;
    let f = OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(dst).ctx("open", dst)?;
    let at = SystemTime::now();
    f.set_times(fs::FileTimes::new().set_modified(at - WRITE_BACKDATE)).ctx("set mtime", dst)?;
    let md = f.metadata().ctx("stat", dst)?;
    if !md.file_type().is_file() || md.len() != size {
        return Err(AgentError::Tree(format!("spooled part {} is not the {size} bytes written", dst.display())));
    }
    Ok(Stamp::of(&md, digest, at))
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
        tree.stage("one", &files, parts, &plan, None, &Stamps::new()).unwrap();
        tree.swap("one").unwrap();
        assert_eq!(tree.live_id().unwrap().as_deref(), Some("one"));
        assert_eq!(hash_dir(&tree.live_dir().unwrap().unwrap()).unwrap(), files);

        // Carry the map into a second tree by hard link.
        let files2 = vec![fe("haproxy.cfg", b"cfg2"), fe("maps/a.map", b"k v\n")];
        let parts2 = BTreeMap::from([(RelPath::haproxy_cfg(), b"cfg2".to_vec())]);
        let plan2 = plan_tree(&files2, &parts2.keys().cloned().collect(), &files);
        assert_eq!(plan2.carry.len(), 1);
        let live = tree.live_dir().unwrap().unwrap();
        tree.stage("two", &files2, parts2.clone(), &plan2, Some(&live), &Stamps::new()).unwrap();

        // A symlink planted in the live tree is never followed.
        let secret = tmp.path().join("secret");
        fs::write(&secret, b"k v\n").unwrap();
        fs::remove_file(live.join("maps/a.map")).unwrap();
        std::os::unix::fs::symlink(&secret, live.join("maps/a.map")).unwrap();
        let err = tree.stage("three", &files2, parts2, &plan2, Some(&live), &Stamps::new()).unwrap_err();
        assert!(matches!(err, StageError::Missing(ref m) if m == &vec![RelPath::new("maps/a.map").unwrap()]));
        assert!(!tree.dir_of("three").exists());
        // hash_dir skips the symlink.
        assert_eq!(hash_dir(&live).unwrap().len(), 1);

        tree.swap("two").unwrap();
        assert_eq!(tree.gc(&["two"]).unwrap(), 1);
        assert_eq!(tree.list().unwrap(), vec!["two".to_string()]);
    }

    #[test]
    fn carried_file_edited_behind_the_agents_back_is_rehashed() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = Tree::new(tmp.path());
        let map = b"key1 value1\n".to_vec();
        let files = vec![fe("haproxy.cfg", b"cfg1"), fe("maps/a.map", &map)];
        let parts: BTreeMap<RelPath, Vec<u8>> =
            BTreeMap::from([(RelPath::haproxy_cfg(), b"cfg1".to_vec()), (RelPath::new("maps/a.map").unwrap(), map)]);
        let plan = plan_tree(&files, &parts.keys().cloned().collect(), &[]);
        let (_, stamps) = tree.stage("one", &files, parts, &plan, None, &Stamps::new()).unwrap();
        tree.swap("one").unwrap();
        let a = RelPath::new("maps/a.map").unwrap();
        // A file the agent wrote is trusted at once (its mtime was set back).
        assert!(stamps[&a].trusted());

        // Carried untouched: trusted, and its stamp follows the new link count.
        let files2 = vec![fe("haproxy.cfg", b"cfg2"), fe("maps/a.map", b"key1 value1\n")];
        let parts2 = BTreeMap::from([(RelPath::haproxy_cfg(), b"cfg2".to_vec())]);
        let plan2 = plan_tree(&files2, &parts2.keys().cloned().collect(), &files);
        let live = tree.live_dir().unwrap().unwrap();
        let (_, mut stamps2) = tree.stage("two", &files2, parts2.clone(), &plan2, Some(&live), &stamps).unwrap();
        tree.swap("two").unwrap();
        tree.gc(&["two"]).unwrap();
        tree.refresh_stamps("two", &mut stamps2);
        let live = tree.live_dir().unwrap().unwrap();
        let md = fs::symlink_metadata(live.join("maps/a.map")).unwrap();
        assert!(stamps2[&a].matches(&md), "refreshed after the agent's own unlink");

        // Edited behind the agent's back: same size, and even the old mtime put back.
        let p = live.join("maps/a.map");
        let old_mtime = md.modified().unwrap();
        fs::write(&p, b"key1 VALUE1\n").unwrap();
        File::options().write(true).open(&p).unwrap().set_times(fs::FileTimes::new().set_modified(old_mtime)).unwrap();
        let md2 = fs::symlink_metadata(&p).unwrap();
        assert_eq!(md2.len(), md.len());
        assert!(!stamps2[&a].matches(&md2), "ctime moved");
        let err = tree.stage("three", &files2, parts2.clone(), &plan2, Some(&live), &stamps2).unwrap_err();
        assert!(matches!(err, StageError::Missing(ref m) if m == &vec![a.clone()]));
        // A refresh drops the stamp of an edited file (mtime or size moved).
        fs::write(&p, b"key1 value2\n").unwrap();
        tree.refresh_stamps("two", &mut stamps2);
        assert!(!stamps2.contains_key(&a));

        // Restored content, untrusted (no stamp): hashed, accepted and stamped again.
        fs::write(&p, b"key1 value1\n").unwrap();
        let (_, stamps3) = tree.stage("four", &files2, parts2, &plan2, Some(&live), &stamps2).unwrap();
        assert_eq!(stamps3[&a].digest, Digest::of(b"key1 value1\n"));
    }

    #[test]
    fn verify_marks_missing_and_non_regular_files() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        fs::create_dir_all(d.join("maps")).unwrap();
        fs::write(d.join("haproxy.cfg"), b"global\n").unwrap();
        fs::write(d.join("outside"), b"k v\n").unwrap();
        std::os::unix::fs::symlink(d.join("outside"), d.join("maps/a.map")).unwrap();
        let index = vec![fe("haproxy.cfg", b"global\n"), fe("maps/a.map", b"k v\n"), fe("maps/gone.map", b"x")];
        let got = verify_dir(d, &index).unwrap();
        let marks: Vec<(&str, Option<Drift>)> = got.iter().map(|(f, m)| (f.path.as_str(), *m)).collect();
        assert_eq!(
            marks,
            vec![
                ("haproxy.cfg", None),
                ("maps/a.map", Some(Drift::NotRegular)),
                ("maps/gone.map", Some(Drift::Missing)),
                ("outside", None)
            ]
        );
        assert!(got.iter().filter(|(_, m)| m.is_some()).all(|(f, _)| f.digest == Digest::of(b"") && f.size == 0));
    }

    #[test]
    fn racy_stamps_are_not_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        fs::write(&p, b"x").unwrap();
        let md = fs::symlink_metadata(&p).unwrap();
        let mtime = md.modified().unwrap();
        // Hashed within the same tick as its last write: an edit could keep mtime and size.
        assert!(!Stamp::of(&md, Digest::of(b"x"), mtime).trusted());
        assert!(!Stamp::of(&md, Digest::of(b"x"), mtime + RACY_MARGIN / 2).trusted());
        assert!(Stamp::of(&md, Digest::of(b"x"), mtime + RACY_MARGIN_COARSE * 2).trusted());
    }
}
