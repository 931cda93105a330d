//! The Landlock domain a contained run enters: which paths it may read or execute.
//!
//! Owns the rule list and entering it on the calling thread. It must never be called from a
//! thread that outlives the run (a Landlock domain cannot be left).

use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, Access as _, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    Scope, ABI,
};

/// What a rule allows beneath its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read files and list directories.
    Read,
    /// Read, list and execute (the binary and the shared libraries).
    ReadExecute,
    /// Read and write a file (only `/dev/null`).
    ReadWrite,
}

/// The newest Landlock ABI this domain asks for; older kernels get what they support.
const ABI_WANTED: ABI = ABI::V6;

/// Shared libraries (the dynamic loader maps them from here) and the system's programs (not
/// secrets; a program started inside the domain stays inside it).
const EXEC_DIRS: &[&str] = &[
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/usr/local/lib",
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
];

/// Files the loader, libc's name resolution and OpenSSL's start-up read. None holds a secret.
const SYSTEM_FILES: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl/openssl.cnf",
];

/// The rules for a run of `bin` over `dir`: the render (`dir`) and `read` readable, the binary's
/// directory, `exec` and the [`EXEC_DIRS`] readable and executable, the [`SYSTEM_FILES`]
/// readable, `/dev/null` readable and writable. Nothing else: not `/proc`, not `/var/run/secrets`,
/// not `/dev/zero`, not `/tmp`, not `/etc` beyond those files.
pub fn rules(bin: &Path, dir: &Path, read: &[PathBuf], exec: &[PathBuf]) -> Vec<(PathBuf, Access)> {
    let mut out = vec![(dir.to_path_buf(), Access::Read)];
    out.extend(read.iter().map(|p| (p.clone(), Access::Read)));
    if let Some(parent) = bin.parent() {
        out.push((parent.to_path_buf(), Access::ReadExecute));
    }
    out.extend(exec.iter().map(|p| (p.clone(), Access::ReadExecute)));
    out.extend(EXEC_DIRS.iter().map(|p| (PathBuf::from(p), Access::ReadExecute)));
    out.extend(SYSTEM_FILES.iter().map(|p| (PathBuf::from(p), Access::Read)));
    out.push((PathBuf::from("/dev/null"), Access::ReadWrite));
    out
}

fn access(a: Access) -> landlock::BitFlags<AccessFs> {
    let read = AccessFs::from_read(ABI_WANTED) & !AccessFs::Execute;
    match a {
        Access::Read => read,
        Access::ReadExecute => read | AccessFs::Execute,
        Access::ReadWrite => read | AccessFs::WriteFile,
    }
}

/// Restricts the calling thread (and what it spawns afterwards) to `rules`: every filesystem
/// access not granted is denied, TCP bind and connect are denied, and signals and abstract unix
/// sockets reach only this domain (each where the kernel supports it). Sets `no_new_privs`.
/// `Ok(true)` when the kernel enforces it.
pub fn enter(rules: &[(PathBuf, Access)]) -> Result<bool, String> {
    let err = |e: landlock::RulesetError| e.to_string();
    let mut created = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI_WANTED))
        .map_err(err)?
        .handle_access(AccessNet::from_all(ABI_WANTED))
        .map_err(err)?
        .scope(Scope::from_all(ABI_WANTED))
        .map_err(err)?
        .create()
        .map_err(err)?;
    for (path, a) in rules {
        created = created.add_rules(path_beneath_rules([path], access(*a))).map_err(err)?;
    }
    let status = created.restrict_self().map_err(err)?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

/// Whether the kernel enforces a Landlock domain. Restricts the calling thread: call it only
/// on a thread that ends right after.
pub fn probe() -> bool {
    enter(&[]).unwrap_or(false)
}
