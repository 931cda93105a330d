//! The runtime claim: whether a change can land through the runtime API alone.
//!
//! Owns the structural comparison of two `haproxy.cfg` texts (only server address, port, weight
//! and enabled/disabled may differ) and the check that a
//! set of ops covers exactly what changed. The controller's plan diff and the agent's
//! verification both call it, so both sides agree on what "runtime" means. It must never do
//! I/O and never call a change runtime-safe unless every changed token is one HAProxy can set
//! at runtime with a well-formed value.

use std::collections::{BTreeMap, BTreeSet};

use crate::cfg::{self, parse_server, ServerLine};
use haptic_protocol::ops::{Op, ServerSet, ServerState};
use haptic_protocol::RelPath;

/// The most reload reasons listed per section before they are summarised.
const MAX_REASONS_PER_SECTION: usize = 3;

/// One server whose runtime-settable fields changed between two configs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerChange {
    /// The backend (or listen section) name.
    pub backend: String,
    /// The server name.
    pub server: String,
    /// The server line before.
    pub old: ServerLine,
    /// The server line after.
    pub new: ServerLine,
}

impl ServerChange {
    /// The `server.set` op that brings a running server from `old` to `new`.
    pub fn op(&self) -> ServerSet {
        let addr_changed = self.old.addr_token != self.new.addr_token;
        ServerSet {
            backend: self.backend.clone(),
            server: self.server.clone(),
            addr: addr_changed.then(|| self.new.ip.map(|ip| ip.to_string())).flatten(),
            port: if addr_changed { self.new.port } else { None },
            weight: (self.old.effective_weight() != self.new.effective_weight()).then(|| self.new.effective_weight()),
            state: (self.old.disabled != self.new.disabled).then_some(if self.new.disabled {
                ServerState::Maint
            } else {
                ServerState::Ready
            }),
        }
    }

    /// A human reason, e.g. `backend be_app: server SRV_2 address 10.0.0.6:80 -> 10.0.0.7:80`.
    pub fn reason(&self) -> String {
        let mut parts = Vec::new();
        if self.old.addr_token != self.new.addr_token {
            parts.push(format!("address {} -> {}", self.old.addr_token, self.new.addr_token));
        }
        if self.old.effective_weight() != self.new.effective_weight() {
            parts.push(format!("weight {} -> {}", self.old.effective_weight(), self.new.effective_weight()));
        }
        if self.old.disabled != self.new.disabled {
            parts.push(if self.new.disabled { "disabled".into() } else { "enabled".into() });
        }
        format!("backend {}: server {} {}", self.backend, self.server, parts.join(", "))
    }
}

/// How two configs differ: server changes the runtime API can make, and everything else.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CfgDiff {
    /// Server lines whose only changes are runtime-settable.
    pub servers: Vec<ServerChange>,
    /// Human reasons for every change that needs a reload; empty means runtime-eligible.
    pub reload_reasons: Vec<String>,
}

impl CfgDiff {
    /// Whether the configs are equal once normalized.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty() && self.reload_reasons.is_empty()
    }

    /// Whether every change can be made at runtime.
    pub fn runtime_eligible(&self) -> bool {
        self.reload_reasons.is_empty()
    }
}

/// Compares two `haproxy.cfg` texts structurally.
pub fn diff_cfg(old: &str, new: &str) -> CfgDiff {
    diff_parsed(&cfg::parse(old), &cfg::parse(new))
}

/// Compares two parsed configs structurally (see [`diff_cfg`]).
pub fn diff_parsed(old: &cfg::Config, new: &cfg::Config) -> CfgDiff {
    let mut out = CfgDiff::default();
    if old.preamble != new.preamble {
        out.reload_reasons.push("lines before the first section changed".into());
    }
    let old_headers: Vec<&str> = old.sections.iter().map(|s| s.header.as_str()).collect();
    let new_headers: Vec<&str> = new.sections.iter().map(|s| s.header.as_str()).collect();
    if old_headers != new_headers {
        section_set_reasons(&old_headers, &new_headers, &mut out.reload_reasons);
        return out;
    }
    for (o, n) in old.sections.iter().zip(&new.sections) {
        let mut reasons = Vec::new();
        if o.lines.len() != n.lines.len() {
            added_and_removed(o, n, &mut reasons);
        } else {
            for (ol, nl) in o.lines.iter().zip(&n.lines) {
                if ol == nl {
                    continue;
                }
                match server_change(o.has_servers(), ol, nl) {
                    Ok((os, ns)) => out.servers.push(ServerChange {
                        backend: o.name.clone().unwrap_or_default(),
                        server: os.name.clone(),
                        old: os,
                        new: ns,
                    }),
                    Err(why) => reasons.push(format!("{}: {why}", o.label())),
                }
            }
        }
        if reasons.len() > MAX_REASONS_PER_SECTION {
            let more = reasons.len() - MAX_REASONS_PER_SECTION;
            reasons.truncate(MAX_REASONS_PER_SECTION);
            reasons.push(format!("{}: and {more} more changed lines", o.label()));
        }
        out.reload_reasons.extend(reasons);
    }
    out
}

/// Names the lines a section gained and lost (as multisets, in file order), e.g.
/// `backend be_app: added "server SRV_3 127.0.0.1:9003"`.
fn added_and_removed(o: &cfg::Section, n: &cfg::Section, reasons: &mut Vec<String>) {
    let mut old_left: BTreeMap<&[String], usize> = BTreeMap::new();
    for l in &o.lines {
        *old_left.entry(l.as_slice()).or_default() += 1;
    }
    let mut added = Vec::new();
    for l in &n.lines {
        match old_left.get_mut(l.as_slice()) {
            Some(c) if *c > 0 => *c -= 1,
            _ => added.push(l),
        }
    }
    let mut new_left: BTreeMap<&[String], usize> = BTreeMap::new();
    for l in &n.lines {
        *new_left.entry(l.as_slice()).or_default() += 1;
    }
    for l in &o.lines {
        match new_left.get_mut(l.as_slice()) {
            Some(c) if *c > 0 => *c -= 1,
            _ => reasons.push(format!("{}: removed {:?}", o.label(), l.join(" "))),
        }
    }
    for l in added {
        reasons.push(format!("{}: added {:?}", o.label(), l.join(" ")));
    }
}

fn section_set_reasons(old: &[&str], new: &[&str], reasons: &mut Vec<String>) {
    let o: BTreeSet<&str> = old.iter().copied().collect();
    let n: BTreeSet<&str> = new.iter().copied().collect();
    for added in n.difference(&o) {
        reasons.push(format!("section added: {added}"));
    }
    for removed in o.difference(&n) {
        reasons.push(format!("section removed: {removed}"));
    }
    if o == n {
        reasons.push("sections reordered".into());
    }
}

fn server_change(in_backend: bool, old: &[String], new: &[String]) -> Result<(ServerLine, ServerLine), String> {
    let line = || format!("line changed: {:?} -> {:?}", old.join(" "), new.join(" "));
    let (Some(os), Some(ns)) = (parse_server(old), parse_server(new)) else {
        return Err(line());
    };
    if !in_backend {
        return Err(line());
    }
    if os.name != ns.name {
        return Err(format!("server {} replaced by {}", os.name, ns.name));
    }
    if os.rest != ns.rest {
        return Err(format!("server {}: parameters other than address, weight or state changed", os.name));
    }
    if os.addr_token != ns.addr_token && !(os.addr_is_runtime_settable() && ns.addr_is_runtime_settable()) {
        return Err(format!("server {}: address {} -> {} is not an IP literal", os.name, os.addr_token, ns.addr_token));
    }
    if os.addr_token != ns.addr_token && os.port.is_some() != ns.port.is_some() {
        return Err(format!("server {}: port added or removed", os.name));
    }
    if ns.effective_weight() > 256 {
        return Err(format!("server {}: weight {} is over 256", os.name, ns.effective_weight()));
    }
    Ok((os, ns))
}

/// Why a runtime claim does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("runtime claim does not hold: {}", .reasons.join("; "))]
pub struct ClaimError {
    /// Every reason found.
    pub reasons: Vec<String>,
}

/// A changed file other than `haproxy.cfg`, with its new contents.
#[derive(Debug, Clone, Copy)]
pub struct ChangedFile<'a> {
    /// The path in the tree.
    pub path: &'a RelPath,
    /// The new bytes, or `None` when the file was removed.
    pub new: Option<&'a [u8]>,
}

/// Verifies a runtime claim: the configs differ only in runtime-settable server fields, every
/// such change and every changed file is covered by an op that sets exactly the new contents,
/// and no op sets anything the new tree does not say.
pub fn verify_runtime_claim(
    old_cfg: &str,
    new_cfg: &str,
    changed: &[ChangedFile<'_>],
    ops: &[Op],
) -> Result<(), ClaimError> {
    verify_runtime_claim_parsed(&cfg::parse(old_cfg), &cfg::parse(new_cfg), changed, ops)
}

/// [`verify_runtime_claim`] over configs parsed already (with [`cfg::parse`]), so a caller that
/// keeps the live config's parsed form parses only the new one.
pub fn verify_runtime_claim_parsed(
    old_parsed: &cfg::Config,
    new_parsed: &cfg::Config,
    changed: &[ChangedFile<'_>],
    ops: &[Op],
) -> Result<(), ClaimError> {
    let mut reasons = Vec::new();
    let diff = diff_parsed(old_parsed, new_parsed);
    reasons.extend(diff.reload_reasons.iter().cloned());

    let mut server_ops: BTreeMap<(&str, &str), Vec<&ServerSet>> = BTreeMap::new();
    let mut file_ops: BTreeMap<&RelPath, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        match op {
            Op::ServerSet(s) => server_ops.entry((&s.backend, &s.server)).or_default().push(s),
            Op::Unknown { op, .. } => reasons.push(format!("unknown op kind {op:?}")),
            other => {
                if let Some(p) = other.path() {
                    file_ops.entry(p).or_default().push(other);
                }
            }
        }
    }

    let new_servers = if server_ops.is_empty() { BTreeMap::new() } else { servers_by_name(new_parsed) };
    for ch in &diff.servers {
        if !server_ops.contains_key(&(ch.backend.as_str(), ch.server.as_str())) {
            reasons.push(format!("{} has no server.set op", ch.reason()));
        }
    }
    for ((backend, server), sets) in &server_ops {
        let Some(line) = new_servers.get(&(backend.to_string(), server.to_string())) else {
            reasons.push(format!("server.set {backend}/{server}: no such server in the new config"));
            continue;
        };
        for s in sets {
            if let Err(why) = server_op_matches(s, line) {
                reasons.push(format!("server.set {backend}/{server}: {why}"));
            }
        }
    }

    let changed_paths: BTreeSet<&RelPath> = changed.iter().map(|c| c.path).collect();
    for c in changed {
        match (file_ops.get(c.path), c.new) {
            (None, _) => reasons.push(format!("{} changed with no op covering it", c.path)),
            (Some(_), None) => reasons.push(format!("{} removed", c.path)),
            (Some(list), Some(bytes)) => {
                for op in list {
                    if let Err(why) = file_op_matches(op, bytes) {
                        reasons.push(format!("{}: {why}", op.describe()));
                    }
                }
            }
        }
    }
    for (path, list) in &file_ops {
        if !changed_paths.contains(path) {
            for op in list {
                reasons.push(format!("{} targets a file that did not change", op.describe()));
            }
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(ClaimError { reasons })
    }
}

fn servers_by_name(parsed: &cfg::Config) -> BTreeMap<(String, String), ServerLine> {
    let mut out = BTreeMap::new();
    for s in parsed.sections.iter().filter(|s| s.has_servers()) {
        for l in &s.lines {
            if let Some(sl) = parse_server(l) {
                out.insert((s.name.clone().unwrap_or_default(), sl.name.clone()), sl);
            }
        }
    }
    out
}

fn server_op_matches(op: &ServerSet, line: &ServerLine) -> Result<(), String> {
    if let Some(addr) = &op.addr {
        let ip: std::net::IpAddr = addr.parse().map_err(|_| format!("addr {addr:?} is not an IP"))?;
        if line.ip != Some(ip) {
            return Err(format!("addr {addr} but the config says {}", line.addr_token));
        }
    }
    if let Some(port) = op.port {
        if line.port != Some(port) {
            return Err(format!("port {port} but the config says {}", line.addr_token));
        }
    }
    if let Some(w) = op.weight {
        if w != line.effective_weight() {
            return Err(format!("weight {w} but the config says {}", line.effective_weight()));
        }
    }
    match (op.state, line.disabled) {
        (Some(ServerState::Ready), true) => Err("state ready but the config says disabled".into()),
        (Some(ServerState::Maint), false) => Err("state maint but the config says enabled".into()),
        (Some(ServerState::Drain), _) => Err("state drain cannot be written in the config".into()),
        _ => Ok(()),
    }
}

fn file_op_matches(op: &Op, bytes: &[u8]) -> Result<(), String> {
    let text = || std::str::from_utf8(bytes).map_err(|_| "the file is not UTF-8".to_string());
    match op {
        Op::MapReplace { entries, .. } => {
            if cfg::parse_map_file(text()?) != *entries {
                return Err("entries differ from the file in the tree".into());
            }
        }
        Op::AclReplace { patterns, .. } => {
            if cfg::parse_acl_file(text()?) != *patterns {
                return Err("patterns differ from the file in the tree".into());
            }
        }
        Op::CertSet { .. } => {}
        Op::ServerSet(_) | Op::Unknown { .. } => return Err("not a file op".into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "global\n  default-path config\ndefaults\n  mode http\nfrontend fe\n  bind 127.0.0.1:80\n  default_backend be_app\nbackend be_app\n  server SRV_1 10.0.0.1:8080 weight 10 check\n  server SRV_2 10.0.0.2:8080 disabled\n";

    #[test]
    fn identical_modulo_comments() {
        let noisy = BASE.replace("mode http", "mode   http   # comment") + "\n# trailing\n";
        assert!(diff_cfg(BASE, &noisy).is_empty());
    }

    #[test]
    fn server_fields_are_runtime() {
        let new = BASE
            .replace("10.0.0.1:8080 weight 10", "10.0.0.9:9090 weight 20")
            .replace("10.0.0.2:8080 disabled", "10.0.0.2:8080");
        let d = diff_cfg(BASE, &new);
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        assert_eq!(d.servers.len(), 2);
        let op = d.servers[0].op();
        assert_eq!((op.addr.as_deref(), op.port, op.weight, op.state), (Some("10.0.0.9"), Some(9090), Some(20), None));
        assert_eq!(d.servers[1].op().state, Some(ServerState::Ready));
        let ops: Vec<Op> = d.servers.iter().map(|c| Op::ServerSet(c.op())).collect();
        assert_eq!(verify_runtime_claim(BASE, &new, &[], &ops), Ok(()));
        assert!(verify_runtime_claim(BASE, &new, &[], &ops[..1]).is_err());
    }

    #[test]
    fn added_and_removed_lines_are_named() {
        let added = BASE.replace("disabled\n", "disabled\n  server SRV_3 10.0.0.3:8080\n");
        let d = diff_cfg(BASE, &added);
        assert_eq!(d.reload_reasons, vec![r#"backend be_app: added "server SRV_3 10.0.0.3:8080""#]);
        let removed = BASE.replace("  default_backend be_app\n", "");
        assert_eq!(diff_cfg(BASE, &removed).reload_reasons, vec![r#"frontend fe: removed "default_backend be_app""#]);
        // A duplicate line added is named once; a changed line among added ones is both.
        let dup = BASE.replace("mode http\n", "mode http\n  mode http\n  option httplog\n");
        assert_eq!(
            diff_cfg(BASE, &dup).reload_reasons,
            vec![r#"defaults: added "mode http""#, r#"defaults: added "option httplog""#]
        );
    }

    #[test]
    fn other_changes_need_reload() {
        for new in [
            BASE.replace("bind 127.0.0.1:80", "bind 127.0.0.1:81"),
            BASE.replace(" check", ""),
            BASE.replace("SRV_2 10.0.0.2:8080", "SRV_3 10.0.0.2:8080"),
            BASE.replace("10.0.0.1:8080", "app.local:8080"),
            BASE.replace("backend be_app", "backend be_other"),
            BASE.replace("weight 10", "weight 300"),
            format!("{BASE}  server SRV_3 10.0.0.3:80\n"),
        ] {
            let d = diff_cfg(BASE, &new);
            assert!(!d.runtime_eligible(), "{new}");
            assert!(verify_runtime_claim(BASE, &new, &[], &[]).is_err());
        }
    }

    #[test]
    fn file_ops_must_match_the_tree() {
        let p = RelPath::new("maps/hosts.map").unwrap();
        let bytes = b"a.example be_a\n";
        let good = Op::MapReplace { path: p.clone(), entries: vec![("a.example".into(), "be_a".into())] };
        let bad = Op::MapReplace { path: p.clone(), entries: vec![] };
        let changed = [ChangedFile { path: &p, new: Some(bytes) }];
        assert_eq!(verify_runtime_claim(BASE, BASE, &changed, std::slice::from_ref(&good)), Ok(()));
        assert!(verify_runtime_claim(BASE, BASE, &changed, &[bad]).is_err());
        assert!(verify_runtime_claim(BASE, BASE, &changed, &[]).is_err());
        assert!(verify_runtime_claim(BASE, BASE, &[], &[good]).is_err());
    }

    #[test]
    fn server_ops_must_agree_with_the_config() {
        let lying = Op::ServerSet(ServerSet {
            backend: "be_app".into(),
            server: "SRV_1".into(),
            addr: Some("10.9.9.9".into()),
            port: None,
            weight: None,
            state: None,
        });
        assert!(verify_runtime_claim(BASE, BASE, &[], &[lying]).is_err());
    }
}
