//! Deciding how an apply lands: the mode asked for, or a safer one.
//!
//! Owns [`decide_mode`], a pure function: it checks a `file_only` or `runtime` claim against the
//! staged tree's files (the runtime claim through [`haptic_haproxy::claim`]); every downgrade to
//! `reload` adds a human reason. It must never read the disk, write the tree nor talk to
//! HAProxy: the caller hands it the staged bytes through a reader and the runtime claim's
//! comparison of the configs as a function.

use std::collections::BTreeSet;

use haptic_haproxy::claim::{ChangedFile, ClaimError};
use haptic_protocol::{Capabilities, FileEntry, Mode, Op, RelPath};

/// The runtime claim of an apply: the changed files (besides `haproxy.cfg`) and the ops.
pub(super) type RuntimeClaim<'a> = dyn Fn(&[ChangedFile<'_>], &[Op]) -> Result<(), ClaimError> + 'a;

/// Everything [`decide_mode`] looks at.
pub(super) struct ModeInputs<'a> {
    /// The mode the apply asks for.
    pub asked: Mode,
    /// The live tree's files.
    pub live_files: &'a [FileEntry],
    /// The staged tree's files (the request's manifest).
    pub files: &'a [FileEntry],
    /// The live and the staged `haproxy.cfg`.
    pub old_cfg: &'a str,
    /// The staged `haproxy.cfg`.
    pub new_cfg: &'a str,
    /// The apply's runtime ops, flattened.
    pub ops: &'a [Op],
    /// What the agent can run on its HAProxy.
    pub caps: &'a Capabilities,
    /// Whether HAProxy's version is known.
    pub version_known: bool,
    /// The runtime claim from the live to the staged config, given the changed files other
    /// than `haproxy.cfg` and the ops; needed (and only given) for a `runtime` claim.
    pub claim: Option<&'a RuntimeClaim<'a>>,
    /// The bytes of a staged file.
    pub read: &'a dyn Fn(&RelPath) -> Option<Vec<u8>>,
}

/// The mode an apply lands with, and why it is not the one asked for (empty when it is).
pub(super) fn decide_mode(i: &ModeInputs<'_>) -> (Mode, Vec<String>) {
    let reload = |why: String| (Mode::Reload, vec![why]);
    let new: BTreeSet<&RelPath> = i.files.iter().map(|f| &f.path).collect();
    let mut changed_paths = haptic_protocol::changed_paths(i.live_files, i.files);
    changed_paths.retain(|p| !p.is_haproxy_cfg());
    let cfg_changed = i.old_cfg != i.new_cfg;
    match i.asked {
        Mode::Reload => (Mode::Reload, Vec::new()),
        Mode::Unknown => reload("a mode this agent does not know (newer protocol): checked reload instead".into()),
        Mode::FileOnly => {
            if cfg_changed {
                return reload("file_only refused: haproxy.cfg changed, reloading".into());
            }
            if !i.ops.is_empty() {
                return reload("file_only refused: the apply carries runtime ops, reloading".into());
            }
            let read = |p: &str| -> Option<String> {
                let rel = RelPath::new(p).ok()?;
                (i.read)(&rel).and_then(|b| String::from_utf8(b).ok())
            };
            let loaded = haptic_haproxy::paths::loaded_paths(i.new_cfg, changed_paths.iter().copied(), &read);
            if !loaded.is_empty() {
                let list: Vec<String> = loaded.iter().map(|p| p.to_string()).collect();
                return reload(format!("file_only refused: the config loads {}, reloading", list.join(", ")));
            }
            (Mode::FileOnly, Vec::new())
        }
        Mode::Runtime => {
            let mut why: Vec<String> = Vec::new();
            if !i.version_known {
                why.push("HAProxy version unknown".into());
            }
            for op in i.ops {
                match op.kind() {
                    Some(k) if i.caps.supports(k) => {}
                    _ => why.push(format!("op kind {} is not supported here", op.kind_name())),
                }
            }
            // Bytes of each changed file, from the staged (verified) tree.
            let bytes: Vec<(&RelPath, Option<Vec<u8>>)> =
                changed_paths.iter().map(|p| (*p, if new.contains(p) { (i.read)(p) } else { None })).collect();
            let changed: Vec<ChangedFile<'_>> =
                bytes.iter().map(|(p, b)| ChangedFile { path: p, new: b.as_deref() }).collect();
            match i.claim {
                Some(claim) => {
                    if let Err(e) = claim(&changed, i.ops) {
                        why.extend(e.reasons);
                    }
                }
                None => why.push("the configs were not compared".into()),
            }
            if why.is_empty() {
                (Mode::Runtime, Vec::new())
            } else {
                reload(format!("runtime claim not verified, checked reload instead: {}", why.join("; ")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use haptic_protocol::{Digest, OpKind, ServerSet};

    use super::*;

    const CFG: &str = "global\n  default-path config\nfrontend f\n  bind 127.0.0.1:1\n  use_backend %[req.hdr(host),map(maps/h.map,b)]\nbackend b\n  server s1 127.0.0.1:2 weight 10\n";

    fn entry(p: &str, body: &str) -> FileEntry {
        FileEntry { path: RelPath::new(p).unwrap(), digest: Digest::of(body.as_bytes()), size: body.len() as u64 }
    }

    struct Case {
        live: Vec<FileEntry>,
        files: Vec<FileEntry>,
        bytes: BTreeMap<RelPath, Vec<u8>>,
        old_cfg: String,
        new_cfg: String,
    }

    fn case(old_cfg: &str, new_cfg: &str, old: &[(&str, &str)], new: &[(&str, &str)]) -> Case {
        let live = std::iter::once(entry("haproxy.cfg", old_cfg)).chain(old.iter().map(|(p, b)| entry(p, b))).collect();
        let files =
            std::iter::once(entry("haproxy.cfg", new_cfg)).chain(new.iter().map(|(p, b)| entry(p, b))).collect();
        let bytes = new.iter().map(|(p, b)| (RelPath::new(*p).unwrap(), b.as_bytes().to_vec())).collect();
        Case { live, files, bytes, old_cfg: old_cfg.into(), new_cfg: new_cfg.into() }
    }

    fn decide(c: &Case, asked: Mode, ops: &[Op], version_known: bool) -> (Mode, Vec<String>) {
        let caps = Capabilities { runtime_batches: true, ops: OpKind::ALL.iter().map(|k| k.as_str().into()).collect() };
        let claim = |changed: &[ChangedFile<'_>], ops: &[Op]| {
            haptic_haproxy::claim::verify_runtime_claim(&c.old_cfg, &c.new_cfg, changed, ops)
        };
        let read = |p: &RelPath| c.bytes.get(p).cloned();
        decide_mode(&ModeInputs {
            asked,
            live_files: &c.live,
            files: &c.files,
            old_cfg: &c.old_cfg,
            new_cfg: &c.new_cfg,
            ops,
            caps: &caps,
            version_known,
            claim: (asked == Mode::Runtime).then_some(&claim as &RuntimeClaim<'_>),
            read: &read,
        })
    }

    #[test]
    fn reload_and_unknown_reload() {
        let c = case(CFG, CFG, &[], &[]);
        assert_eq!(decide(&c, Mode::Reload, &[], true), (Mode::Reload, vec![]));
        let (mode, why) = decide(&c, Mode::Unknown, &[], true);
        assert_eq!(mode, Mode::Reload);
        assert!(why[0].contains("does not know"), "{why:?}");
    }

    #[test]
    fn file_only_holds_only_for_files_nothing_loads() {
        let notes = case(CFG, CFG, &[("files/n.txt", "a")], &[("files/n.txt", "b")]);
        assert_eq!(decide(&notes, Mode::FileOnly, &[], true), (Mode::FileOnly, vec![]));
        let map = case(CFG, CFG, &[("maps/h.map", "a b\n")], &[("maps/h.map", "a c\n")]);
        let (mode, why) = decide(&map, Mode::FileOnly, &[], true);
        assert_eq!(mode, Mode::Reload);
        assert!(why[0].contains("loads maps/h.map"), "{why:?}");
        let cfg = case(CFG, &CFG.replace("weight 10", "weight 11"), &[], &[]);
        assert!(decide(&cfg, Mode::FileOnly, &[], true).1[0].contains("haproxy.cfg changed"));
        let op = Op::CertSet { path: RelPath::new("certs/a.pem").unwrap() };
        assert!(decide(&notes, Mode::FileOnly, &[op], true).1[0].contains("runtime ops"));
    }

    #[test]
    fn runtime_holds_when_the_claim_verifies() {
        let c = case(CFG, &CFG.replace("weight 10", "weight 11"), &[], &[]);
        let op = Op::ServerSet(ServerSet {
            backend: "b".into(),
            server: "s1".into(),
            addr: None,
            port: None,
            weight: Some(11),
            state: None,
        });
        assert_eq!(decide(&c, Mode::Runtime, std::slice::from_ref(&op), true), (Mode::Runtime, vec![]));
        let (mode, why) = decide(&c, Mode::Runtime, std::slice::from_ref(&op), false);
        assert_eq!(mode, Mode::Reload);
        assert!(why[0].contains("HAProxy version unknown"), "{why:?}");
        // The claim without its op does not verify.
        assert_eq!(decide(&c, Mode::Runtime, &[], true).0, Mode::Reload);
    }
}
