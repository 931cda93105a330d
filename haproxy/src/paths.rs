//! Every file path a config makes HAProxy read, the rule that keeps them inside the tree, and
//! how a config loads each file.
//!
//! Owns [`file_refs`] (maps and ACL pattern files, `crt`, `crt-list` and the certificates it
//! lists, `ca-file`, `crl-file`, `errorfile`, `http-request/response return ... file|lf-file`,
//! `lua-load`, `lua-load-per-thread`, `lua-prepend-path`, `crt-base`/`ca-base`,
//! `server-state-file`, `stats socket` and unix `bind` sockets), [`check_paths`]: every path
//! must resolve inside the tree, except absolute paths under allowed prefixes, and sockets must
//! live under the socket directory (a config without `default-path config` in `global` is
//! refused, since its relative paths would not resolve against the tree), [`loaded_paths`] and
//! [`classify`] (whether a file is loaded as a map, an ACL, a certificate or otherwise, which
//! decides whether the runtime API can replace it). Pure: it never reads a disk; `crt-list`
//! contents come through a caller's reader.

use std::fmt;

use crate::cfg::tokenize;

/// What a referenced path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    /// A file HAProxy reads.
    File,
    /// A directory HAProxy reads files from (`crt DIR/`, `crt-base`, `lua-prepend-path`).
    Dir,
    /// A UNIX socket HAProxy creates.
    Socket,
}

/// One path a config makes HAProxy read (or create, for sockets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRef {
    /// 1-based line in `haproxy.cfg` (for a `crt-list` entry: the line of the `crt-list`).
    pub line: usize,
    /// The directive, e.g. `map()`, `crt`, `errorfile`, `stats socket`.
    pub directive: String,
    /// The path as written (quotes removed).
    pub path: String,
    /// File, directory or socket.
    pub kind: RefKind,
}

impl fmt::Display for FileRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {} {}", self.line, self.directive, self.path)
    }
}

/// A token or argument without the quotes around it (and without surrounding whitespace).
fn unquote(t: &str) -> &str {
    let t = t.trim();
    let t = t.strip_prefix('"').and_then(|x| x.strip_suffix('"')).unwrap_or(t);
    t.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')).unwrap_or(t)
}

/// One function-style reference inside a token: `name(first argument`.
struct Call<'a> {
    /// The name before `(`: letters, digits, `_` and `-` (`map_str`, `set-map`, `add-acl`).
    name: &'a str,
    /// The first argument as written, up to `,` or `)` (or the token's end).
    arg: &'a str,
    /// Where the argument starts in the token.
    at: usize,
}

/// Every `name(arg` in a token, e.g. `%[req.hdr(host),lower,map_str(maps/x.map,def)]` gives
/// `hdr(host` and `map_str(maps/x.map`. The one scan both [`file_refs`] and [`classify`] use.
fn calls(token: &str) -> impl Iterator<Item = Call<'_>> {
    token.match_indices('(').filter_map(move |(open, _)| {
        let before = &token[..open];
        let name_len: usize = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
            .map(char::len_utf8)
            .sum();
        let name = &before[before.len() - name_len..];
        let at = open + 1;
        let rest = &token[at..];
        let arg = &rest[..rest.find([',', ')']).unwrap_or(rest.len())];
        (!name.is_empty()).then_some(Call { name, arg, at })
    })
}

/// Paths inside sample-fetch converters and actions such as `map(FILE)`, `map_str(FILE,def)`,
/// `map_beg_int(FILE)`, `set-map(FILE)` (named by the converter: `map()`, `map_str()`...).
fn converter_files(token: &str, out: &mut Vec<(String, String)>) {
    for call in calls(token) {
        let conv = call.name.rsplit('-').next().unwrap_or(call.name);
        let path = unquote(call.arg);
        if conv.starts_with("map") && !path.is_empty() {
            out.push((format!("{conv}()"), path.to_string()));
        }
    }
}

/// Every path the config text makes HAProxy read. `read_crt_list` returns a `crt-list` file's
/// text (by the path as written), so the certificates it lists are included too.
pub fn file_refs(cfg_text: &str, read_crt_list: &dyn Fn(&str) -> Option<String>) -> Vec<FileRef> {
    let mut out = Vec::new();
    let mut section = String::new();
    for (i, raw) in cfg_text.lines().enumerate() {
        let line = i + 1;
        let toks: Vec<String> = tokenize(raw);
        let Some(first) = toks.first() else { continue };
        if crate::cfg::SECTION_KEYWORDS.contains(&first.as_str()) {
            section = first.clone();
            continue;
        }
        let mut push = |directive: &str, path: &str, kind: RefKind| {
            out.push(FileRef { line, directive: directive.to_string(), path: unquote(path).to_string(), kind });
        };
        // Directives whose argument is a path.
        match (first.as_str(), toks.get(1).map(String::as_str)) {
            ("errorfile", _) => {
                if let Some(p) = toks.get(2) {
                    push("errorfile", p, RefKind::File);
                }
            }
            ("lua-load" | "lua-load-per-thread", Some(p)) => push(first, p, RefKind::File),
            ("lua-prepend-path", Some(p)) => push(first, p, RefKind::Dir),
            ("crt-base" | "ca-base", Some(p)) => push(first, p, RefKind::Dir),
            ("server-state-file" | "server-state-base", Some(p)) => push(first, p, RefKind::File),
            ("stats", Some("socket")) => {
                if let Some(p) = toks.get(2) {
                    if is_unix_addr(p) {
                        push("stats socket", p, RefKind::Socket);
                    }
                }
            }
            ("bind", Some(p)) if is_unix_addr(p) => push("bind", p, RefKind::Socket),
            _ => {}
        }
        // Keyword arguments anywhere on a line (bind, server, default-server, http-request ...).
        for (k, w) in toks.iter().zip(toks.iter().skip(1)) {
            match k.as_str() {
                "crt" => {
                    let kind = if w.ends_with('/') { RefKind::Dir } else { RefKind::File };
                    push("crt", w, kind);
                    if kind == RefKind::File {
                        for ext in ["key", "ocsp", "issuer", "sctl"] {
                            push("crt (companion)", &format!("{}.{ext}", unquote(w)), RefKind::File);
                        }
                    }
                }
                "crt-list" => {
                    push("crt-list", w, RefKind::File);
                    if let Some(text) = read_crt_list(unquote(w)) {
                        for l in text.lines() {
                            if let Some(cert) = tokenize(l).first() {
                                push("crt-list entry", cert, RefKind::File);
                            }
                        }
                    }
                }
                "ca-file" | "crl-file" | "ca-verify-file" | "ca-sign-file" | "issuers-chain-path" => {
                    push(k, w, RefKind::File)
                }
                "-f" if section != "global" => push("pattern file (-f)", w, RefKind::File),
                "file" | "lf-file" | "errorfile" if first.starts_with("http-") => push(k, w, RefKind::File),
                _ => {}
            }
        }
        let mut conv = Vec::new();
        for t in &toks {
            converter_files(t, &mut conv);
        }
        for (d, p) in conv {
            out.push(FileRef { line, directive: d, path: p, kind: RefKind::File });
        }
    }
    out
}

fn is_unix_addr(a: &str) -> bool {
    let a = unquote(a);
    a.starts_with('/') || a.starts_with("unix@")
}

/// Which of `candidates` (tree paths) HAProxy loads when it loads `cfg_text`: a path the config
/// names in a file directive (including `crt` companions and `crt-list` entries), a path under a
/// directory it reads (`crt DIR/`, `crt-base`...), or any path [`crate::cfg::referenced_paths`]
/// finds mentioned. A file HAProxy loads is never `file_only`. Pure.
pub fn loaded_paths<'a>(
    cfg_text: &str,
    candidates: impl IntoIterator<Item = &'a haptic_protocol::RelPath>,
    read_crt_list: &dyn Fn(&str) -> Option<String>,
) -> std::collections::BTreeSet<haptic_protocol::RelPath> {
    let candidates: Vec<&haptic_protocol::RelPath> = candidates.into_iter().collect();
    let mut out = crate::cfg::referenced_paths(cfg_text, candidates.iter().copied());
    let refs: Vec<(String, RefKind)> = file_refs(cfg_text, read_crt_list)
        .into_iter()
        .filter_map(|r| normalize(&r.path).map(|p| (p, r.kind)))
        .filter(|(p, _)| !p.starts_with('/'))
        .collect();
    for c in candidates {
        let hit = refs.iter().any(|(p, kind)| match kind {
            RefKind::File => p == c.as_str(),
            RefKind::Dir => p.is_empty() || under(c.as_str(), p),
            RefKind::Socket => false,
        });
        if hit {
            out.insert(c.clone());
        }
    }
    out
}

/// How a config loads a file, which decides how a change to the file can land without a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LoadKind {
    /// A map (`map*(` converters, `set-map(`/`del-map(`, or `-M -f`): replaceable at runtime
    /// with `prepare map` / `add map` / `commit map`.
    Map,
    /// An ACL pattern file (`-f` without `-M`, `add-acl(`/`del-acl(`): `prepare acl` ...
    Acl,
    /// A certificate loaded with `crt` (the file, or a file under a `crt` directory):
    /// `set ssl cert` / `commit ssl cert`.
    Cert,
    /// A CA file loaded with `ca-file` (a bind's or a server's): `set ssl ca-file` /
    /// `commit ssl ca-file`.
    CaFile,
    /// Anything else (errorfiles, crt-lists, CRL files, Lua, a `crt` companion such as
    /// `.key` or `.ocsp`...), or references of several kinds: a change needs a reload.
    Other,
}

/// How `cfg_text` loads `path`; [`LoadKind::Other`] when the reference is of no kind the runtime
/// API can replace, or of several kinds. Pure.
pub fn classify(cfg_text: &str, path: &haptic_protocol::RelPath) -> LoadKind {
    let parsed = crate::cfg::parse(cfg_text);
    let lines = parsed.preamble.iter().chain(parsed.sections.iter().flat_map(|s| s.lines.iter()));
    let mut kinds = std::collections::BTreeSet::new();
    for line in lines {
        classify_line(line, path.as_str(), &mut kinds);
    }
    match kinds.len() {
        1 => kinds.into_iter().next().unwrap_or(LoadKind::Other),
        _ => LoadKind::Other,
    }
}

/// Extra files HAProxy loads next to a certificate; `set ssl cert` does not take them by name.
fn is_cert_companion(path: &str) -> bool {
    [".key", ".ocsp", ".issuer", ".sctl"].iter().any(|s| path.ends_with(s))
}

fn classify_line(tokens: &[String], path: &str, kinds: &mut std::collections::BTreeSet<LoadKind>) {
    let has_m = tokens.iter().any(|t| t == "-M");
    for (i, tok) in tokens.iter().enumerate() {
        let t = unquote(tok);
        let next = tokens.get(i + 1).map(|n| unquote(n));
        match (t, next) {
            ("-f", Some(n)) if n == path => {
                kinds.insert(if has_m { LoadKind::Map } else { LoadKind::Acl });
                continue;
            }
            ("crt", Some(n)) if dir_or_file_match(n, path) => {
                kinds.insert(if is_cert_companion(path) { LoadKind::Other } else { LoadKind::Cert });
                continue;
            }
            ("ca-file", Some(n)) if n == path => {
                kinds.insert(LoadKind::CaFile);
                continue;
            }
            _ => {}
        }
        if i > 0 && ["-f", "crt", "ca-file"].contains(&tokens[i - 1].as_str()) {
            continue; // handled above as the argument of the previous token
        }
        // Function-style references: `map_str(maps/x.map,default)`, `set-map(maps/x.map)`.
        let mut as_arg = Vec::new();
        for call in calls(t).filter(|c| c.arg == path) {
            as_arg.push(call.at);
            let n = call.name;
            kinds.insert(if n == "map" || n.starts_with("map_") || n == "set-map" || n == "del-map" {
                LoadKind::Map
            } else if n == "add-acl" || n == "del-acl" {
                LoadKind::Acl
            } else {
                LoadKind::Other
            });
        }
        // Any other mention of the path (a whole argument, or inside one) is of no runtime kind.
        let mentioned = t.match_indices(path).any(|(at, _)| {
            let after = t[at + path.len()..].chars().next();
            after.is_none_or(|c| matches!(c, ',' | ')' | '"' | '\'')) && !as_arg.contains(&at)
        });
        if mentioned {
            kinds.insert(LoadKind::Other);
        }
    }
}

fn dir_or_file_match(arg: &str, path: &str) -> bool {
    if arg == path {
        return true;
    }
    let dir = arg.trim_end_matches('/');
    !dir.is_empty() && path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

/// Where paths may point.
#[derive(Debug, Clone, Default)]
pub struct PathPolicy {
    /// Absolute path prefixes HAProxy may read outside the tree (`--allow-path`).
    pub allowed: Vec<String>,
    /// The directory sockets must live under (absolute); `None`: no socket is allowed.
    pub socket_dir: Option<String>,
}

impl PathPolicy {
    /// The default allowed prefixes: the system CA bundles.
    pub const DEFAULT_ALLOWED: [&'static str; 2] = ["/etc/ssl/certs", "/usr/share/ca-certificates"];
}

/// Lexically normalizes a `/`-separated path; `None` when a relative path climbs above its start.
fn normalize(path: &str) -> Option<String> {
    let abs = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    let j = parts.join("/");
    Some(if abs { format!("/{j}") } else { j })
}

fn under(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || path.strip_prefix(prefix).is_some_and(|r| r.starts_with('/'))
}

/// Whether `global` carries `default-path config` (relative paths then resolve in the tree).
pub fn has_default_path_config(cfg_text: &str) -> bool {
    let cfg = crate::cfg::parse(cfg_text);
    cfg.sections
        .iter()
        .filter(|s| s.kind == "global")
        .flat_map(|s| &s.lines)
        .any(|l| l.len() >= 2 && l[0] == "default-path" && l[1] == "config")
}

/// What breaks the path rules; shown as one clear line (directive and line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathViolation {
    /// The global section has no `default-path config`.
    NoDefaultPath,
    /// A path naming an environment variable.
    EnvVar(FileRef),
    /// A path climbing out of the tree.
    LeavesTree(FileRef),
    /// A socket outside the socket directory (the directory, if there is one).
    SocketOutside(FileRef, Option<String>),
    /// An absolute path outside the allowed directories (those allowed).
    AbsoluteOutside(FileRef, Vec<String>),
}

impl PathViolation {
    /// The reference at fault (none for a missing `default-path config`).
    pub fn reference(&self) -> Option<&FileRef> {
        match self {
            PathViolation::NoDefaultPath => None,
            PathViolation::EnvVar(r)
            | PathViolation::LeavesTree(r)
            | PathViolation::SocketOutside(r, _)
            | PathViolation::AbsoluteOutside(r, _) => Some(r),
        }
    }
}

impl fmt::Display for PathViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathViolation::NoDefaultPath => f.write_str(
                "the config has no `default-path config` in its global section: relative paths would not resolve \
                 inside the tree",
            ),
            PathViolation::EnvVar(r) => write!(f, "{r}: environment variables in paths are not allowed"),
            PathViolation::LeavesTree(r) => write!(f, "{r}: the path leaves the tree"),
            PathViolation::SocketOutside(r, dir) => {
                write!(
                    f,
                    "{r}: sockets may only live under the socket directory {}",
                    dir.as_deref().unwrap_or("(none)")
                )
            }
            PathViolation::AbsoluteOutside(r, allowed) => write!(
                f,
                "{r}: an absolute path outside the tree (allowed: {})",
                if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") }
            ),
        }
    }
}

/// Checks every path of [`file_refs`] against the policy; `Err` lists every violation, in
/// order: a missing `default-path config`, then one per offending reference.
pub fn check_paths(cfg_text: &str, refs: &[FileRef], policy: &PathPolicy) -> Result<(), Vec<PathViolation>> {
    let mut why = Vec::new();
    if !has_default_path_config(cfg_text) {
        why.push(PathViolation::NoDefaultPath);
    }
    for r in refs {
        let path = r.path.strip_prefix("unix@").unwrap_or(&r.path);
        if path.contains('$') {
            why.push(PathViolation::EnvVar(r.clone()));
            continue;
        }
        let Some(norm) = normalize(path) else {
            why.push(PathViolation::LeavesTree(r.clone()));
            continue;
        };
        match r.kind {
            RefKind::Socket => {
                let ok = policy.socket_dir.as_deref().is_some_and(|d| norm.starts_with('/') && under(&norm, d));
                if !ok {
                    why.push(PathViolation::SocketOutside(r.clone(), policy.socket_dir.clone()));
                }
            }
            RefKind::File | RefKind::Dir => {
                if norm.starts_with('/') && !policy.allowed.iter().any(|a| under(&norm, a)) {
                    why.push(PathViolation::AbsoluteOutside(r.clone(), policy.allowed.clone()));
                }
            }
        }
    }
    if why.is_empty() {
        Ok(())
    } else {
        Err(why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> PathPolicy {
        PathPolicy {
            allowed: PathPolicy::DEFAULT_ALLOWED.iter().map(|s| s.to_string()).collect(),
            socket_dir: Some("/run/haptic".into()),
        }
    }

    const HEAD: &str = "global\n    default-path config\n";

    fn refs(text: &str) -> Vec<(usize, String, String)> {
        file_refs(text, &|p| (p == "certs/list.txt").then(|| "certs/a.pem [alpn h2]\n# c\ncerts/b.pem\n".into()))
            .into_iter()
            .map(|r| (r.line, r.directive, r.path))
            .collect()
    }

    #[test]
    fn lists_every_kind_of_path() {
        let text = format!(
            "{HEAD}    lua-load lua/x.lua\n    stats socket /run/haptic/w.sock level admin\n\
             frontend f\n    bind :443 ssl crt certs/site.pem ca-file /etc/ssl/certs/ca.pem crt-list certs/list.txt\n\
             \x20   http-request set-header X %[req.hdr(host),lower,map(maps/hosts.map,none)]\n\
             \x20   acl bad src -f acl/bad.acl\n    errorfile 503 errors/503.http\n\
             \x20   http-request return status 200 file errors/ok.txt if {{ path /ok }}\n\
             backend b\n    server s 127.0.0.1:1 ssl crt certs/client.pem crl-file certs/crl.pem\n"
        );
        let got = refs(&text);
        let paths: Vec<&str> = got.iter().map(|r| r.2.as_str()).collect();
        for want in [
            "lua/x.lua",
            "/run/haptic/w.sock",
            "certs/site.pem",
            "certs/site.pem.key",
            "certs/site.pem.ocsp",
            "certs/site.pem.issuer",
            "certs/site.pem.sctl",
            "/etc/ssl/certs/ca.pem",
            "certs/list.txt",
            "certs/a.pem",
            "certs/b.pem",
            "maps/hosts.map",
            "acl/bad.acl",
            "errors/503.http",
            "errors/ok.txt",
            "certs/client.pem",
            "certs/crl.pem",
        ] {
            assert!(paths.contains(&want), "{want} missing from {got:?}");
        }
        assert!(check_paths(&text, &file_refs(&text, &|_| None), &policy()).is_ok());
        let map = got.iter().find(|r| r.2 == "maps/hosts.map").unwrap();
        assert_eq!((map.0, map.1.as_str()), (7, "map()"));
    }

    #[test]
    fn paths_outside_the_tree_are_refused_with_directive_and_line() {
        for (line, bad) in [
            ("    http-request set-var(txn.x) req.hdr(host),map(/etc/passwd,x)", "map()"),
            ("    http-request set-var(txn.x) req.hdr(host),map_str(../../.state/state.json,x)", "map_str()"),
            ("    errorfile 503 ../../x", "errorfile"),
            ("    bind :443 ssl crt certs/a.pem ca-file /etc/ssl/private/ca.pem", "ca-file"),
            ("    acl a src -f /etc/hosts", "pattern file (-f)"),
            ("    bind /tmp/x.sock", "bind"),
        ] {
            let text = format!("{HEAD}frontend f\n{line}\n");
            let why = check_paths(&text, &file_refs(&text, &|_| None), &policy()).unwrap_err();
            let at = |w: &PathViolation| w.reference().is_some_and(|r| r.line == 4 && r.directive == bad);
            assert!(why.iter().any(at), "{line}: {why:?}");
        }
        let sock = format!("{HEAD}    stats socket /var/run/x.sock\n");
        assert!(check_paths(&sock, &file_refs(&sock, &|_| None), &policy()).is_err());
    }

    #[test]
    fn default_path_config_is_required() {
        let text = "global\n    daemon\nfrontend f\n    bind :80\n";
        let why = check_paths(text, &file_refs(text, &|_| None), &policy()).unwrap_err();
        assert_eq!(why, [PathViolation::NoDefaultPath]);
    }

    #[test]
    fn loaded_paths_include_companions_crt_list_entries_and_dirs() {
        let text = format!(
            "{HEAD}frontend f\n    bind :443 ssl crt certs/site.pem crt-list lists/l.txt\n    bind :444 ssl crt dir/\n"
        );
        let read = |p: &str| (p == "lists/l.txt").then(|| "certs/other.pem\n".to_string());
        let paths: Vec<haptic_protocol::RelPath> =
            ["certs/site.pem.key", "certs/other.pem", "dir/x.pem", "files/readme.txt", "certs/site.pem.ocsp"]
                .into_iter()
                .map(|p| haptic_protocol::RelPath::new(p).unwrap())
                .collect();
        let got: Vec<String> = loaded_paths(&text, paths.iter(), &read).into_iter().map(|p| p.to_string()).collect();
        assert_eq!(got, ["certs/other.pem", "certs/site.pem.key", "certs/site.pem.ocsp", "dir/x.pem"]);
    }

    #[test]
    fn classifies_references() {
        let p = |s: &str| haptic_protocol::RelPath::new(s).unwrap();
        let cfg = "frontend fe\n  bind 127.0.0.1:8443 ssl crt certs/\n  acl blocked src -f acls/blocked.acl\n  use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_app)]\n  errorfile 503 errors/503.http\n";
        assert_eq!(classify(cfg, &p("maps/hosts.map")), LoadKind::Map);
        assert_eq!(classify(cfg, &p("acls/blocked.acl")), LoadKind::Acl);
        assert_eq!(classify(cfg, &p("certs/site.pem")), LoadKind::Cert);
        let ca = "frontend f\n  bind :443 ssl crt certs/s.pem ca-file certs/clients.pem verify required\nbackend b\n  server s 10.0.0.1:443 ssl verify required ca-file \"certs/up.pem\"\n";
        assert_eq!(classify(ca, &p("certs/clients.pem")), LoadKind::CaFile);
        assert_eq!(classify(ca, &p("certs/up.pem")), LoadKind::CaFile);
        // Loaded as a CA file and as something else: a reload.
        let both = "frontend f\n  bind :443 ssl crt certs/x.pem ca-file certs/x.pem\n";
        assert_eq!(classify(both, &p("certs/x.pem")), LoadKind::Other);
        assert_eq!(classify(cfg, &p("certs/site.pem.ocsp")), LoadKind::Other);
        assert_eq!(classify(cfg, &p("errors/503.http")), LoadKind::Other);
        let c = "frontend f\n  http-request set-map(maps/a.map) %[src] x\n  acl h hdr(host) -M -f maps/b.map\n  http-request add-acl(acls/c.acl) %[src]\n  bind :443 ssl crt \"certs/d.pem\" crt-list lists/e.txt\n";
        assert_eq!(classify(c, &p("maps/a.map")), LoadKind::Map);
        assert_eq!(classify(c, &p("maps/b.map")), LoadKind::Map);
        assert_eq!(classify(c, &p("acls/c.acl")), LoadKind::Acl);
        assert_eq!(classify(c, &p("certs/d.pem")), LoadKind::Cert);
        assert_eq!(classify(c, &p("lists/e.txt")), LoadKind::Other);
        let both = "frontend f\n  acl x src -f maps/a.map\n  use_backend %[src,map_ip(maps/a.map)]\n";
        assert_eq!(classify(both, &p("maps/a.map")), LoadKind::Other);
        let inside =
            "frontend f\n  use_backend %[src,map_ip(maps/a.map)]\n  http-request set-var(txn.x) str(x/maps/a.map)\n";
        assert_eq!(classify(inside, &p("maps/a.map")), LoadKind::Other);
        assert_eq!(
            classify("frontend f\n  use_backend %[src,map(maps/a.map.bak)]\n", &p("maps/a.map")),
            LoadKind::Other
        );
    }

    #[test]
    fn calls_name_their_first_argument() {
        let got: Vec<(&str, &str)> =
            calls("%[req.hdr(host),lower,map_str(maps/x.map,def)]").map(|c| (c.name, c.arg)).collect();
        assert_eq!(got, [("hdr", "host"), ("map_str", "maps/x.map")]);
        let mut out = Vec::new();
        converter_files("set-map(maps/a.map)", &mut out);
        converter_files("%[src,foo_map(x)]", &mut out);
        assert_eq!(out, [("map()".to_string(), "maps/a.map".to_string())]);
    }

    #[test]
    fn normalization() {
        assert_eq!(normalize("a/./b/../c").as_deref(), Some("a/c"));
        assert_eq!(normalize("../x"), None);
        assert_eq!(normalize("/etc/ssl/certs/../../passwd").as_deref(), Some("/etc/passwd"));
        assert!(under("/etc/ssl/certs/x.pem", "/etc/ssl/certs/"));
        assert!(!under("/etc/ssl/certsX", "/etc/ssl/certs"));
    }
}
