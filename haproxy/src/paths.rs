//! Every file path a config makes HAProxy read, and the rule that keeps them inside the tree
//! (BRIEF §2).
//!
//! Owns [`file_refs`] (maps and ACL pattern files, `crt`, `crt-list` and the certificates it
//! lists, `ca-file`, `crl-file`, `errorfile`, `http-request/response return ... file|lf-file`,
//! `lua-load`, `lua-load-per-thread`, `lua-prepend-path`, `crt-base`/`ca-base`,
//! `server-state-file`, `stats socket` and unix `bind` sockets) and [`check_paths`]: every path
//! must resolve inside the tree, except absolute paths under allowed prefixes, and sockets must
//! live under the socket directory. A config without `default-path config` in `global` is refused,
//! since its relative paths would not resolve against the tree. Pure: it never reads a disk;
//! `crt-list` contents come through a caller's reader.

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

fn unquote(t: &str) -> String {
    let t = t.trim();
    let t = t.strip_prefix('"').and_then(|x| x.strip_suffix('"')).unwrap_or(t);
    let t = t.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')).unwrap_or(t);
    t.to_string()
}

/// Paths inside sample-fetch converters such as `map(FILE)`, `map_str(FILE,def)`,
/// `map_beg_int(FILE)`.
fn converter_files(token: &str, out: &mut Vec<(String, String)>) {
    let mut rest = token;
    while let Some(i) = rest.find("map") {
        let after = &rest[i..];
        let open = after.find('(');
        let name_ok = open.is_some_and(|o| after[..o].chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        let before_ok = rest[..i].chars().next_back().is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if let (Some(o), true, true) = (open, name_ok, before_ok) {
            let args = &after[o + 1..];
            let end = args.find([',', ')']).unwrap_or(args.len());
            let path = unquote(&args[..end]);
            if !path.is_empty() {
                out.push((format!("{}()", &after[..o]), path));
            }
            rest = &after[o + 1..];
        } else {
            rest = &after[3..];
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
            out.push(FileRef { line, directive: directive.to_string(), path: unquote(path), kind });
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
                    if let Some(text) = read_crt_list(&unquote(w)) {
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

/// Checks every path of [`file_refs`] against the policy; `Err` lists one clear line per
/// offending reference (directive and line), plus a missing `default-path config`.
pub fn check_paths(cfg_text: &str, refs: &[FileRef], policy: &PathPolicy) -> Result<(), Vec<String>> {
    let mut why = Vec::new();
    if !has_default_path_config(cfg_text) {
        why.push(
            "the config has no `default-path config` in its global section: relative paths would not resolve \
             inside the tree"
                .to_string(),
        );
    }
    for r in refs {
        let path = r.path.strip_prefix("unix@").unwrap_or(&r.path);
        if path.contains('$') {
            why.push(format!("{r}: environment variables in paths are not allowed"));
            continue;
        }
        let Some(norm) = normalize(path) else {
            why.push(format!("{r}: the path leaves the tree"));
            continue;
        };
        match r.kind {
            RefKind::Socket => {
                let ok = policy.socket_dir.as_deref().is_some_and(|d| norm.starts_with('/') && under(&norm, d));
                if !ok {
                    let dir = policy.socket_dir.as_deref().unwrap_or("(none)");
                    why.push(format!("{r}: sockets may only live under the socket directory {dir}"));
                }
            }
            RefKind::File | RefKind::Dir => {
                if norm.starts_with('/') && !policy.allowed.iter().any(|a| under(&norm, a)) {
                    why.push(format!(
                        "{r}: an absolute path outside the tree (allowed: {})",
                        if policy.allowed.is_empty() { "none".to_string() } else { policy.allowed.join(", ") }
                    ));
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
            assert!(why.iter().any(|w| w.starts_with("line 4: ") && w.contains(bad)), "{line}: {why:?}");
        }
        let sock = format!("{HEAD}    stats socket /var/run/x.sock\n");
        assert!(check_paths(&sock, &file_refs(&sock, &|_| None), &policy()).is_err());
    }

    #[test]
    fn default_path_config_is_required() {
        let text = "global\n    daemon\nfrontend f\n    bind :80\n";
        let why = check_paths(text, &file_refs(text, &|_| None), &policy()).unwrap_err();
        assert!(why[0].contains("default-path config"), "{why:?}");
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
    fn normalization() {
        assert_eq!(normalize("a/./b/../c").as_deref(), Some("a/c"));
        assert_eq!(normalize("../x"), None);
        assert_eq!(normalize("/etc/ssl/certs/../../passwd").as_deref(), Some("/etc/passwd"));
        assert!(under("/etc/ssl/certs/x.pem", "/etc/ssl/certs/"));
        assert!(!under("/etc/ssl/certsX", "/etc/ssl/certs"));
    }
}
