//! Runtime-API op batches: `server.set`, `map.replace`, `acl.replace`, `cert.set` (FACTS §1, §5).
//!
//! This module owns turning ops into HAProxy runtime commands sent to the current worker through
//! the master CLI (`@1 …`), checking *every* reply against what success looks like for that command,
//! and the op kinds each HAProxy version can run ([`capabilities`]). A reply that is not a known
//! success is an [`OpError`] carrying HAProxy's own words; the batch stops at the first failure so the
//! caller can reload from the tree (the desired state).
//!
//! It must never write files, never reload, and never send a payload with a blank line or over
//! 12 KiB (maps go in chunks, PEMs have blank lines stripped). Map and ACL updates are atomic swaps
//! (`prepare` / `add @ver` / `commit @ver`), verified afterwards with `show map` / `show acl`; a
//! map's payloads go several to a connection, and nothing is committed unless all were taken.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use haptic_haproxy::cli::{self, Expect};
use haptic_protocol::{Capabilities, Op, OpKind, ServerSet, ServerState};

use crate::master::{payload_line, MasterCli, MAX_PAYLOAD};

/// The oldest HAProxy whose runtime API this agent has been tested against.
const MIN_RUNTIME_VERSION: (u32, u32, u32) = (2, 6, 0);
/// Master-level `set severity-output` covers `@1` commands from 3.0 on (FACTS §1).
const SEVERITY_VERSION: (u32, u32, u32) = (3, 0, 0);
/// Longest HAProxy reply kept in an error.
const MAX_ERROR_TEXT: usize = 2000;

/// What this agent can run over the runtime API of HAProxy `version`.
///
/// 2.6 and 3.0 run the same four kinds (all tested against both); older versions get no runtime
/// batches, so every change reloads.
pub fn capabilities(version: (u32, u32, u32)) -> Capabilities {
    if version < MIN_RUNTIME_VERSION {
        return Capabilities { runtime_batches: false, ops: Vec::new() };
    }
    Capabilities { runtime_batches: true, ops: OpKind::ALL.iter().map(|k| k.as_str().to_string()).collect() }
}

/// How many ops of each kind ran, and how long the batch took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Ops run, per kind.
    pub counts: BTreeMap<OpKind, usize>,
    /// Wall time of the whole batch.
    pub took: Duration,
}

impl RunReport {
    /// The number of ops run.
    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }
}

/// An op HAProxy (or this agent, before sending anything) refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {reply}")]
pub struct OpError {
    /// The op, as [`Op::describe`] puts it.
    pub op: String,
    /// The op's kind name (`server.set`, …), for metrics.
    pub kind: String,
    /// The op's index in the flattened batch.
    pub index: usize,
    /// The HAProxy command that failed (without its payload); empty when nothing was sent.
    pub command: String,
    /// HAProxy's reply, or the agent's reason when the op could not be sent at all.
    pub reply: String,
}

/// Runs `ops` in order against the current worker; stops at the first failure.
///
/// `tree` is the live tree directory (e.g. `ROOT/current`), where `cert.set` reads its PEM.
pub async fn run_ops(cli: &MasterCli, version: (u32, u32, u32), tree: &Path, ops: &[Op]) -> Result<RunReport, OpError> {
    let started = Instant::now();
    let caps = capabilities(version);
    let runner = Runner { cli, severity: version >= SEVERITY_VERSION };
    let mut report = RunReport::default();
    for (index, op) in ops.iter().enumerate() {
        let fail = |command: String, reply: String| OpError {
            op: op.describe(),
            kind: op.kind_name().to_string(),
            index,
            command,
            reply,
        };
        let Some(kind) = op.kind() else {
            return Err(fail(String::new(), format!("op kind {:?} is unknown to this agent", op.kind_name())));
        };
        if !caps.supports(kind) {
            return Err(fail(String::new(), format!("op kind {kind} is not supported on HAProxy {version:?}")));
        }
        let result = match op {
            Op::ServerSet(s) => runner.server_set(s).await,
            Op::MapReplace { path, entries } => runner.map_replace(path.as_str(), entries).await,
            Op::AclReplace { path, patterns } => runner.acl_replace(path.as_str(), patterns).await,
            Op::CertSet { path } => runner.cert_set(path.as_str(), tree).await,
            Op::Unknown { .. } => unreachable!("unknown kinds are refused above"),
        };
        if let Err(Failure { command, reply }) = result {
            tracing::warn!(op = %op.describe(), %command, %reply, "runtime op failed");
            return Err(fail(command, reply));
        }
        tracing::debug!(op = %op.describe(), "runtime op applied");
        *report.counts.entry(kind).or_default() += 1;
    }
    report.took = started.elapsed();
    Ok(report)
}

/// A failed command: what was sent and what came back.
#[derive(Debug)]
struct Failure {
    command: String,
    reply: String,
}

impl Failure {
    fn local(reply: impl Into<String>) -> Self {
        Self { command: String::new(), reply: reply.into() }
    }
}

/// Successful replies of `set server … addr … [port …]` (2.6 and 3.0 wording).
const ADDR_CHANGED: &[&str] = &[
    "IP changed from",
    "no need to change the addr",
    "nothing changed",
    "port changed from",
    "no need to change the port",
];
const NEW_VERSION: &[&str] = &["New version created:"];
const CERT_TRANSACTION: &[&str] = &["Transaction created for certificate", "Transaction updated for certificate"];

/// [`cli::check_reply`] with HAProxy's words shortened for logs and JSON errors.
fn check_reply(reply: &str, expect: Expect) -> Result<String, String> {
    cli::check_reply(reply, expect)
        .map_err(|text| if text.is_empty() { "(empty reply)".to_string() } else { shorten(&text) })
}

/// HAProxy's reply cut to something that fits a log line and a JSON error: the "Unknown command"
/// help listing is reduced to its first line.
fn shorten(text: &str) -> String {
    let text = if text.starts_with("Unknown command") { text.lines().next().unwrap_or(text) } else { text };
    if text.len() <= MAX_ERROR_TEXT {
        return text.to_string();
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Escapes one CLI argument: `\`, `;`, whitespace and quote characters get a backslash.
fn escape_arg(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    for c in arg.chars() {
        if matches!(c, '\\' | ';' | ' ' | '\t' | '#' | '"' | '\'') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether `name` is safe as a backend or server name on a CLI line.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// Parses the version number out of `New version created: N`.
fn parse_new_version(text: &str) -> Option<u32> {
    text.lines().next()?.strip_prefix("New version created:")?.trim().parse().ok()
}

/// The `curr_ver` and `entry_cnt` of the `(name)` line of a `show map` / `show acl` listing.
fn listing_counts(listing: &str, name: &str) -> Option<(u32, usize)> {
    let needle = format!("({name})");
    let line = listing.lines().find(|l| l.split_whitespace().nth(1) == Some(needle.as_str()))?;
    let field = |key: &str| line.split_whitespace().find_map(|t| t.strip_prefix(key));
    Some((field("curr_ver=")?.parse().ok()?, field("entry_cnt=")?.parse().ok()?))
}

/// Groups `key value` lines into payloads of at most `limit` bytes.
fn map_chunks(entries: &[(String, String)], limit: usize) -> Result<Vec<String>, String> {
    let mut chunks = Vec::new();
    let mut cur = String::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if k.is_empty() || k.chars().any(char::is_whitespace) {
            return Err(format!("entry {i}: key {k:?} is empty or holds whitespace, which a map payload cannot carry"));
        }
        if v.contains(['\n', '\r']) {
            return Err(format!("entry {i} (key {k:?}): value holds a line break"));
        }
        let line = format!("{k} {v}\n");
        if line.len() > limit {
            return Err(format!("entry {i} (key {k:?}) is longer than a {limit}-byte payload"));
        }
        if cur.len() + line.len() > limit {
            chunks.push(std::mem::take(&mut cur));
        }
        cur.push_str(&line);
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    Ok(chunks)
}

/// `add map @ver` payloads sent on one master-CLI connection. The master reads command after
/// command on a connection (2.6 and 3.0: 200 payloads of 12 KiB on one connection applied in
/// order), so a transaction's payloads need not pay a connection each; groups bound the work
/// behind one timeout.
const CHUNKS_PER_CONNECTION: usize = 32;

/// Joins payload commands `<head> <<` + chunk into groups of at most `per` per connection: each
/// group is the bytes to write and how many payloads it holds.
fn pipelined_payloads(head: &str, chunks: &[String], per: usize) -> Result<Vec<(String, usize)>, String> {
    chunks
        .chunks(per.max(1))
        .map(|group| {
            let mut data = String::with_capacity(group.iter().map(|c| head.len() + c.len() + 8).sum());
            for c in group {
                data.push_str(&payload_line(head, c).map_err(|e| e.to_string())?);
            }
            Ok((data, group.len()))
        })
        .collect()
}

/// Refuses patterns a CLI line cannot carry (empty, or holding a line break).
fn validate_patterns(patterns: &[String]) -> Result<(), String> {
    match patterns.iter().enumerate().find(|(_, p)| p.is_empty() || p.contains(['\n', '\r'])) {
        Some((i, p)) => Err(format!("pattern {i} ({p:?}) is empty or holds a line break")),
        None => Ok(()),
    }
}

/// Groups ACL patterns into `;`-joined `add acl @ver` command lines of at most `limit` bytes.
fn acl_lines(prefix: &str, patterns: &[String], limit: usize) -> Result<Vec<(String, usize)>, String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    let mut count = 0;
    validate_patterns(patterns)?;
    for (i, p) in patterns.iter().enumerate() {
        let cmd = format!("{prefix} {}", escape_arg(p));
        if cmd.len() > limit {
            return Err(format!("pattern {i} is longer than a {limit}-byte command line"));
        }
        if !cur.is_empty() && cur.len() + 2 + cmd.len() > limit {
            lines.push((std::mem::take(&mut cur), count));
            count = 0;
        }
        if !cur.is_empty() {
            cur.push_str("; ");
        }
        cur.push_str(&cmd);
        count += 1;
    }
    if !cur.is_empty() {
        lines.push((cur, count));
    }
    Ok(lines)
}

/// Strips `\r` and blank lines from a PEM (a blank line would end the payload, FACTS §1).
fn strip_blank_lines(pem: &str) -> String {
    pem.lines().map(|l| l.trim_end_matches('\r')).filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join("\n")
}

/// Sends commands to the current worker, with severity tags where HAProxy supports them.
struct Runner<'a> {
    cli: &'a MasterCli,
    severity: bool,
}

impl Runner<'_> {
    /// The line prefix for worker commands.
    fn prefix(&self) -> &'static str {
        if self.severity {
            "set severity-output number; @1 "
        } else {
            "@1 "
        }
    }

    /// Sends one worker command (optionally with a payload) and checks its reply.
    async fn exec(&self, cmd: &str, payload: Option<&str>, expect: Expect) -> Result<String, Failure> {
        let head = format!("{}{cmd}", self.prefix());
        let line = match payload {
            Some(p) => payload_line(&head, p).map_err(|e| Failure { command: cmd.into(), reply: e.to_string() })?,
            None => head,
        };
        let reply = self
            .cli
            .send(&line, self.cli.timeout())
            .await
            .map_err(|e| Failure { command: cmd.into(), reply: e.to_string() })?;
        check_reply(&reply, expect).map_err(|reply| Failure { command: cmd.into(), reply })
    }

    /// Sends a raw worker line (several `@1` commands) whose every reply must be empty.
    async fn exec_line(&self, line: &str, what: &str) -> Result<(), Failure> {
        let line = if self.severity { format!("set severity-output number; {line}") } else { line.to_string() };
        let reply = self
            .cli
            .send(&line, self.cli.timeout())
            .await
            .map_err(|e| Failure { command: what.into(), reply: e.to_string() })?;
        check_reply(&reply, Expect::Empty).map(drop).map_err(|reply| Failure { command: what.into(), reply })
    }

    async fn server_set(&self, s: &ServerSet) -> Result<(), Failure> {
        if !valid_name(&s.backend) || !valid_name(&s.server) {
            return Err(Failure::local(format!("invalid backend/server name {:?}/{:?}", s.backend, s.server)));
        }
        let target = format!("{}/{}", s.backend, s.server);
        let addr_cmd = match (&s.addr, s.port) {
            (Some(addr), port) => {
                let ip: IpAddr =
                    addr.parse().map_err(|_| Failure::local(format!("address {addr:?} is not an IP address")))?;
                Some(match port {
                    Some(p) => format!("set server {target} addr {ip} port {p}"),
                    None => format!("set server {target} addr {ip}"),
                })
            }
            (None, Some(_)) => return Err(Failure::local("a port change needs the address too")),
            (None, None) => None,
        };
        let state_cmd = s.state.map(|st| format!("set server {target} state {}", st.as_str()));
        // Taking a server out: do it first. Bringing it in: only once address and weight are right.
        let state_first = matches!(s.state, Some(ServerState::Maint | ServerState::Drain));
        if state_first {
            if let Some(cmd) = &state_cmd {
                self.exec(cmd, None, Expect::Empty).await?;
            }
        }
        if let Some(cmd) = &addr_cmd {
            self.exec(cmd, None, Expect::Starts(ADDR_CHANGED)).await?;
        }
        if let Some(w) = s.weight {
            self.exec(&format!("set server {target} weight {w}"), None, Expect::Empty).await?;
        }
        if !state_first {
            if let Some(cmd) = &state_cmd {
                self.exec(cmd, None, Expect::Empty).await?;
            }
        }
        Ok(())
    }

    /// `prepare <what> <name>` → the new version number.
    async fn prepare(&self, what: &str, name: &str) -> Result<u32, Failure> {
        let cmd = format!("prepare {what} {name}");
        let text = self.exec(&cmd, None, Expect::Starts(NEW_VERSION)).await?;
        parse_new_version(&text).ok_or(Failure { command: cmd, reply: text })
    }

    /// Commits version `ver` and checks the listing shows it live with `expected` entries.
    async fn commit_and_verify(&self, what: &str, name: &str, ver: u32, expected: usize) -> Result<(), Failure> {
        self.exec(&format!("commit {what} @{ver} {name}"), None, Expect::Empty).await?;
        let cmd = format!("show {what}");
        let listing =
            self.cli.worker(&cmd).await.map_err(|e| Failure { command: cmd.clone(), reply: e.to_string() })?;
        match listing_counts(&listing, name) {
            Some((cur, cnt)) if cur == ver && cnt == expected => Ok(()),
            Some((cur, cnt)) => Err(Failure {
                command: cmd,
                reply: format!("after commit @{ver}: curr_ver={cur} entry_cnt={cnt}, expected @{ver} with {expected}"),
            }),
            None => Err(Failure { command: cmd, reply: format!("{name} is not listed after commit") }),
        }
    }

    /// Sends several complete command lines (with their payloads) on one connection; every
    /// reply must be silent.
    async fn exec_pipelined(&self, data: &str, what: &str) -> Result<(), Failure> {
        let reply = self
            .cli
            .send(data, self.cli.timeout())
            .await
            .map_err(|e| Failure { command: what.into(), reply: e.to_string() })?;
        check_reply(&reply, Expect::Empty).map(drop).map_err(|reply| Failure { command: what.into(), reply })
    }

    async fn map_replace(&self, name: &str, entries: &[(String, String)]) -> Result<(), Failure> {
        let chunks = map_chunks(entries, MAX_PAYLOAD).map_err(Failure::local)?;
        let ver = self.prepare("map", name).await?;
        let head = format!("{}add map @{ver} {name}", self.prefix());
        let groups = pipelined_payloads(&head, &chunks, CHUNKS_PER_CONNECTION)
            .map_err(|e| Failure { command: format!("add map @{ver} {name}"), reply: e })?;
        // The version stays uncommitted unless every payload was taken: a failure stops here,
        // before `commit`, and the next `prepare` drops it.
        for (data, n) in &groups {
            self.exec_pipelined(data, &format!("add map @{ver} {name} ({n} payloads)")).await?;
        }
        self.commit_and_verify("map", name, ver, entries.len()).await
    }

    async fn acl_replace(&self, name: &str, patterns: &[String]) -> Result<(), Failure> {
        // `add acl` takes no payload (2.6, 3.0): several commands per line instead.
        validate_patterns(patterns).map_err(Failure::local)?;
        let ver = self.prepare("acl", name).await?;
        let prefix = format!("@1 add acl @{ver} {name}");
        let lines = acl_lines(&prefix, patterns, MAX_PAYLOAD).map_err(Failure::local)?;
        for (line, n) in &lines {
            self.exec_line(line, &format!("add acl @{ver} {name} ({n} patterns)")).await?;
        }
        self.commit_and_verify("acl", name, ver, patterns.len()).await
    }

    async fn cert_set(&self, name: &str, tree: &Path) -> Result<(), Failure> {
        let file = tree.join(name);
        let pem = tokio::fs::read_to_string(&file)
            .await
            .map_err(|e| Failure::local(format!("cannot read {}: {e}", file.display())))?;
        let pem = strip_blank_lines(&pem);
        if pem.is_empty() {
            return Err(Failure::local(format!("{name} is empty")));
        }
        if pem.len() > MAX_PAYLOAD {
            return Err(Failure::local(format!(
                "{name} is {} bytes, over the {MAX_PAYLOAD}-byte runtime payload limit",
                pem.len()
            )));
        }
        let result = async {
            self.exec(&format!("set ssl cert {name}"), Some(&pem), Expect::Starts(CERT_TRANSACTION)).await?;
            self.exec(&format!("commit ssl cert {name}"), None, Expect::LastLine("Success!")).await
        }
        .await;
        if result.is_err() {
            // Drop a half-made transaction; "No ongoing transaction!" is fine too.
            let _ = self.cli.worker(&format!("abort ssl cert {name}")).await;
        }
        result.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_the_same_on_2_6_and_3_0() {
        // HAProxy 2.6 and 3.0 run the same four kinds (tests/haproxy_ops.rs runs each on both).
        let c26 = capabilities((2, 6, 12));
        let c30 = capabilities((3, 0, 11));
        assert_eq!(c26, c30, "2.6 and 3.0 do not differ in runnable op kinds");
        assert!(c26.runtime_batches);
        for k in OpKind::ALL {
            assert!(c26.supports(k), "{k}");
        }
        assert!(!capabilities((2, 4, 0)).runtime_batches);
    }

    #[test]
    fn replies_2_6_untagged() {
        // Captured from 2.6.12 through the master (`@1 cmd`, no severity tags).
        assert!(check_reply("\n", Expect::Empty).is_ok());
        assert!(check_reply("", Expect::Empty).is_ok());
        assert_eq!(check_reply("No such server.\n\n", Expect::Empty).unwrap_err(), "No such server.");
        let ip =
            "IP changed from '127.0.0.1' to '127.0.0.2', port changed from '1' to '80' by 'stats socket command'\n\n";
        assert!(check_reply(ip, Expect::Starts(ADDR_CHANGED)).is_ok());
        let same = "no need to change the addr, no need to change the port by 'stats socket command'\n\n";
        assert!(check_reply(same, Expect::Starts(ADDR_CHANGED)).is_ok());
        assert!(check_reply("No such server.\n\n", Expect::Starts(ADDR_CHANGED)).is_err());
        let w = "Absolute weight can only be between 0 and 256 inclusive.\n\n";
        assert_eq!(check_reply(w, Expect::Empty).unwrap_err(), w.trim());
        let v = check_reply("New version created: 2\n\n", Expect::Starts(NEW_VERSION)).unwrap();
        assert_eq!(parse_new_version(&v), Some(2));
        let unknown = "Unknown map identifier. Please use #<id> or <file>.\n\n";
        assert!(check_reply(unknown, Expect::Starts(NEW_VERSION)).is_err());
        assert!(check_reply("Missing value for key 'q'.\n\n", Expect::Empty).is_err());
        let multi_ok = "\n\n\n\n";
        assert!(check_reply(multi_ok, Expect::Empty).is_ok());
        let multi_bad = "\n\n\nVersion number in the future, please use 'prepare acl' before.\n\n";
        assert!(check_reply(multi_bad, Expect::Empty).unwrap_err().starts_with("Version number in the future"));
        let tx = "Transaction created for certificate certs/site.pem!\n\n";
        assert!(check_reply(tx, Expect::Starts(CERT_TRANSACTION)).is_ok());
        let tx2 = "Transaction updated for certificate certs/site.pem!\n\n";
        assert!(check_reply(tx2, Expect::Starts(CERT_TRANSACTION)).is_ok());
        let notref = "Can't replace a certificate which is not referenced by the configuration!\nCan't update certs/nope.pem!\n\n";
        assert!(check_reply(notref, Expect::Starts(CERT_TRANSACTION)).is_err());
        assert!(check_reply("Committing certs/site.pem.\nSuccess!\n\n", Expect::LastLine("Success!")).is_ok());
        let nocommit = "No ongoing transaction! !\nCan't commit certs/site.pem!\n\n";
        assert!(check_reply(nocommit, Expect::LastLine("Success!")).is_err());
        let unk = "Unknown command, but maybe one of the following ones is a better match:\n  quit : disconnect\n\n";
        assert_eq!(
            check_reply(unk, Expect::Empty).unwrap_err(),
            "Unknown command, but maybe one of the following ones is a better match:"
        );
    }

    #[test]
    fn replies_3_0_tagged() {
        // Captured from 3.0.11 with `set severity-output number; @1 cmd`.
        assert_eq!(check_reply("[3]: No such server.\n\n", Expect::Empty).unwrap_err(), "No such server.");
        let ip = "[4]: IP changed from '127.0.0.1' to '127.0.0.2', port changed from '1' to '80' by 'stats socket command'\n\n";
        assert!(check_reply(ip, Expect::Starts(ADDR_CHANGED)).unwrap().starts_with("IP changed"));
        assert!(check_reply("[4]: nothing changed\n\n", Expect::Starts(ADDR_CHANGED)).is_ok());
        assert!(check_reply("\n", Expect::Empty).is_ok());
        let v = check_reply("[6]: New version created: 4\n\n", Expect::Starts(NEW_VERSION)).unwrap();
        assert_eq!(parse_new_version(&v), Some(4));
        assert!(check_reply(
            "[3]: Unknown map identifier. Please use #<id> or <file>.\n\n",
            Expect::Starts(NEW_VERSION)
        )
        .is_err());
        let multi_bad = "\n\n\n[3]: Version number in the future, please use 'prepare acl' before.\n\n";
        assert!(check_reply(multi_bad, Expect::Empty).is_err());
        // An error tag fails even when the text would otherwise look like success.
        assert!(check_reply("[3]: IP changed from x\n", Expect::Starts(ADDR_CHANGED)).is_err());
        assert!(check_reply("[6]: Unknown command: 'bogus', but maybe\n  quit\n\n", Expect::Empty).is_err());
    }

    #[test]
    fn listing_counts_finds_the_named_file() {
        let l = "# id (file) description\n0 (maps/hosts.map) pattern loaded from file 'maps/hosts.map' used by map at file 'haproxy.cfg' line 12. curr_ver=3 next_ver=3 entry_cnt=700\n1 (maps/other.map) x curr_ver=0 next_ver=0 entry_cnt=2\n\n";
        assert_eq!(listing_counts(l, "maps/hosts.map"), Some((3, 700)));
        assert_eq!(listing_counts(l, "maps/other.map"), Some((0, 2)));
        assert_eq!(listing_counts(l, "maps/nope.map"), None);
        let acl = "2 () acl 'path' file 'haproxy.cfg' line 13. curr_ver=0 next_ver=0 entry_cnt=0\n";
        assert_eq!(listing_counts(acl, ""), Some((0, 0)));
    }

    #[test]
    fn map_chunks_respect_the_limit_and_keep_every_entry() {
        let entries: Vec<(String, String)> =
            (0..5000).map(|i| (format!("k{i}"), format!("value number {i}"))).collect();
        let chunks = map_chunks(&entries, MAX_PAYLOAD).unwrap();
        assert!(chunks.len() > 1);
        assert!(chunks.iter().all(|c| c.len() <= MAX_PAYLOAD && !c.contains("\n\n")));
        let joined: String = chunks.concat();
        assert_eq!(joined.lines().count(), 5000);
        assert!(joined.starts_with("k0 value number 0\n"));
        assert!(map_chunks(&[("a b".into(), "v".into())], MAX_PAYLOAD).is_err());
        assert!(map_chunks(&[("".into(), "v".into())], MAX_PAYLOAD).is_err());
        assert!(map_chunks(&[("k".into(), "v\nx".into())], MAX_PAYLOAD).is_err());
        assert!(map_chunks(&[("k".into(), "v".repeat(MAX_PAYLOAD))], MAX_PAYLOAD).is_err());
        assert!(map_chunks(&[], MAX_PAYLOAD).unwrap().is_empty());
    }

    #[test]
    fn pipelined_payloads_keep_every_chunk_in_order() {
        let chunks: Vec<String> = (0..70).map(|i| format!("k{i} v{i}\n")).collect();
        let groups = pipelined_payloads("@1 add map @3 m", &chunks, 32).unwrap();
        assert_eq!(groups.iter().map(|(_, n)| *n).collect::<Vec<_>>(), vec![32, 32, 6]);
        let all: String = groups.iter().map(|(d, _)| d.as_str()).collect();
        assert_eq!(all.matches("@1 add map @3 m <<\n").count(), 70);
        assert!(all.starts_with("@1 add map @3 m <<\nk0 v0\n\n@1 add map @3 m <<\nk1 v1\n\n"));
        // Every payload ends with its blank line, so the next command starts on its own line.
        assert_eq!(all.matches("\n\n").count(), 70);
        assert!(pipelined_payloads("h", &["a\n\nb".into()], 32).is_err());
        assert!(pipelined_payloads("h", &[], 32).unwrap().is_empty());
    }

    #[test]
    fn acl_lines_escape_and_split() {
        let pats: Vec<String> = vec!["/a".into(), "a b;c\\d#e\"f'g".into()];
        let lines = acl_lines("@1 add acl @3 maps/p.acl", &pats, MAX_PAYLOAD).unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].0, "@1 add acl @3 maps/p.acl /a; @1 add acl @3 maps/p.acl a\\ b\\;c\\\\d\\#e\\\"f\\'g");
        assert_eq!(lines[0].1, 2);
        let many: Vec<String> = (0..2000).map(|i| format!("/path/{i}")).collect();
        let lines = acl_lines("@1 add acl @3 maps/p.acl", &many, 1000).unwrap();
        assert!(lines.len() > 1);
        assert!(lines.iter().all(|(l, _)| l.len() <= 1000));
        assert_eq!(lines.iter().map(|(_, n)| n).sum::<usize>(), 2000);
        assert!(acl_lines("x", &["".into()], 100).is_err());
        assert!(acl_lines("x", &["a\nb".into()], 100).is_err());
    }

    #[test]
    fn pem_blank_lines_are_stripped() {
        let pem = "-----BEGIN CERTIFICATE-----\r\nAAA\r\n\r\n-----END CERTIFICATE-----\n\n-----BEGIN PRIVATE KEY-----\nBBB\n  \n-----END PRIVATE KEY-----\n";
        assert_eq!(
            strip_blank_lines(pem),
            "-----BEGIN CERTIFICATE-----\nAAA\n-----END CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\nBBB\n-----END PRIVATE KEY-----"
        );
    }

    #[test]
    fn names_and_error_text() {
        assert!(valid_name("be_app") && valid_name("SRV_2") && valid_name("a.b-c:d"));
        assert!(!valid_name("") && !valid_name("a b") && !valid_name("a;b") && !valid_name("a/b"));
        assert_eq!(cli::strip_severity_tag("plain"), None);
        assert_eq!(shorten(&"x".repeat(5000)).chars().count(), MAX_ERROR_TEXT + 1);
    }
}
