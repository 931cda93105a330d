//! Plan manifests and plan ids.
//!
//! Owns [`FileEntry`] and the canonical plan id: `sha256:` of, for each file sorted bytewise by
//! path, `<path> NUL <digest text> LF`. It must never depend on the order files were given in.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::digest::{Digest, DigestError};
use crate::path::RelPath;

/// One file of a plan: its path, digest and size in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FileEntry {
    /// Where the file lives in the tree.
    pub path: RelPath,
    /// The digest of its bytes.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
}

/// The id of a whole plan (the digest of its canonical manifest).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PlanId(pub Digest);

impl fmt::Display for PlanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for PlanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for PlanId {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(PlanId)
    }
}

impl PlanId {
    /// A short form (the first 12 hex characters) for logs and tables.
    pub fn short(&self) -> String {
        self.0.hex()[..12].to_string()
    }
}

/// Why a manifest has no plan id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The same path is listed twice.
    #[error("duplicate path {0}")]
    DuplicatePath(RelPath),
    /// `haproxy.cfg` is not in the manifest.
    #[error("the plan has no haproxy.cfg")]
    MissingHaproxyCfg,
    /// A path is both a file and a directory of another file (`files/a` and `files/a/b`).
    #[error("path {file} is a file, but {under} needs it to be a directory")]
    FileDirClash {
        /// The path listed as a file.
        file: RelPath,
        /// A path below it.
        under: RelPath,
    },
}

/// Computes the canonical plan id of a manifest; refuses duplicates and a missing `haproxy.cfg`.
pub fn plan_id(files: &[FileEntry]) -> Result<PlanId, PlanError> {
    let mut sorted: Vec<&FileEntry> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.as_str().as_bytes().cmp(b.path.as_str().as_bytes()));
    for w in sorted.windows(2) {
        if w[0].path == w[1].path {
            return Err(PlanError::DuplicatePath(w[0].path.clone()));
        }
    }
    if !sorted.iter().any(|f| f.path.is_haproxy_cfg()) {
        return Err(PlanError::MissingHaproxyCfg);
    }
    let paths: std::collections::BTreeSet<&str> = sorted.iter().map(|f| f.path.as_str()).collect();
    for f in &sorted {
        let p = f.path.as_str();
        for (i, _) in p.match_indices('/') {
            if let Some(file) = paths.get(&p[..i]) {
                return Err(PlanError::FileDirClash {
                    file: RelPath::new(*file).expect("a listed path"),
                    under: f.path.clone(),
                });
            }
        }
    }
    let mut h = crate::digest::Hasher::new();
    for f in sorted {
        h.update(f.path.as_str().as_bytes());
        h.update(b"\0");
        h.update(f.digest.to_string().as_bytes());
        h.update(b"\n");
    }
    Ok(PlanId(h.finish()))
}

/// The paths whose file differs between two manifests: listed in only one of them, or in both
/// with different digests (`haproxy.cfg` included; sizes are not compared, the digest covers
/// them). Sorted by path.
pub fn changed_paths<'a>(old: &'a [FileEntry], new: &'a [FileEntry]) -> std::collections::BTreeSet<&'a RelPath> {
    use std::collections::BTreeMap;
    let old: BTreeMap<&RelPath, &Digest> = old.iter().map(|e| (&e.path, &e.digest)).collect();
    let new: BTreeMap<&RelPath, &Digest> = new.iter().map(|e| (&e.path, &e.digest)).collect();
    let added_or_modified = new.iter().filter(|(p, d)| old.get(*p) != Some(*d)).map(|(p, _)| *p);
    let removed = old.keys().filter(|p| !new.contains_key(*p)).copied();
    added_or_modified.chain(removed).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(p: &str, body: &[u8]) -> FileEntry {
        FileEntry { path: RelPath::new(p).unwrap(), digest: Digest::of(body), size: body.len() as u64 }
    }

    #[test]
    fn a_file_that_is_also_a_directory_is_refused() {
        let files =
            [entry("haproxy.cfg", b"x"), entry("files/a", b"1"), entry("files/a-x", b"2"), entry("files/a/b", b"3")];
        assert_eq!(
            plan_id(&files),
            Err(PlanError::FileDirClash {
                file: RelPath::new("files/a").unwrap(),
                under: RelPath::new("files/a/b").unwrap()
            })
        );
        assert!(plan_id(&[entry("haproxy.cfg", b"x"), entry("files/a-x", b"2"), entry("files/a/b", b"3")]).is_ok());
        assert!(plan_id(&[entry("haproxy.cfg", b"x"), entry("haproxy.cfg/x", b"2")]).is_err());
    }

    #[test]
    fn canonical_bytes() {
        let files = vec![entry("maps/a.map", b"k v\n"), entry("haproxy.cfg", b"global\n")];
        let manual = format!("haproxy.cfg\0{}\nmaps/a.map\0{}\n", Digest::of(b"global\n"), Digest::of(b"k v\n"));
        assert_eq!(plan_id(&files).unwrap(), PlanId(Digest::of(manual.as_bytes())));
    }

    #[test]
    fn changed_paths_are_added_removed_and_modified_files() {
        let old = [entry("haproxy.cfg", b"a"), entry("maps/a.map", b"1"), entry("gone.txt", b"g")];
        let new = [entry("maps/a.map", b"2"), entry("haproxy.cfg", b"a"), entry("new.txt", b"n")];
        let got: Vec<&str> = changed_paths(&old, &new).into_iter().map(RelPath::as_str).collect();
        assert_eq!(got, ["gone.txt", "maps/a.map", "new.txt"]);
        assert!(changed_paths(&old, &old).is_empty());
        let cfg = [entry("haproxy.cfg", b"b")];
        let got: Vec<&str> = changed_paths(&old[..1], &cfg).into_iter().map(RelPath::as_str).collect();
        assert_eq!(got, ["haproxy.cfg"]);
    }

    #[test]
    fn refuses_duplicates_and_missing_cfg() {
        let dup = vec![entry("haproxy.cfg", b"a"), entry("haproxy.cfg", b"b")];
        assert!(matches!(plan_id(&dup), Err(PlanError::DuplicatePath(_))));
        assert_eq!(plan_id(&[entry("x.map", b"")]), Err(PlanError::MissingHaproxyCfg));
    }
}
