//! Runtime-API op batches: `server.set`, `server.add`, `server.del`, `map.replace`,
//! `map.load`, `acl.replace`, `cert.set`, and `backend.add` on HAProxy 3.4.
//!
//! This module owns the runtime-op table: which HAProxy commands each op becomes and in which
//! order, sent to the current worker through the master CLI, checking *every* reply against what
//! success looks like for that command, and the op kinds each HAProxy version can run
//! ([`capabilities`]). A reply that is not a known success is an [`OpError`] carrying HAProxy's
//! own words; the batch stops at the first failure so the caller can reload from the tree (the
//! desired state). The command text, payload limits and reply forms live in
//! `haptic_haproxy::cli::command`.
//!
//! It must never write files, never reload, and never send a payload with a blank line or over
//! 12 KiB (maps go in chunks, PEMs have blank lines stripped). Every `server.add` and
//! `server.del` of a batch is checked before the first command goes out, so one the CLI cannot
//! carry sends nothing. Map and ACL updates are atomic swaps
//! (`prepare` / `add @ver` / `commit @ver`), verified afterwards with `show map` / `show acl`; a
//! map's payloads go one to a connection, and nothing is committed unless all were taken.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use haptic_haproxy::cli::command::{
    self, PatternFile, WorkerLine, ADDR_CHANGED, BACKEND_PUBLISHED, BACKEND_REGISTERED, CA_FILE_TRANSACTION,
    CERT_COMMITTED, CERT_TRANSACTION, MAX_PAYLOAD, NEW_VERSION, SERVER_DELETED, SERVER_REGISTERED,
};
use haptic_haproxy::cli::{self, Expect};
use haptic_protocol::{BackendAdd, Capabilities, Op, OpKind, ServerAdd, ServerDel, ServerSet, ServerState};

use crate::master::MasterCli;

/// The oldest HAProxy whose runtime API this agent has been tested against.
const MIN_RUNTIME_VERSION: (u32, u32, u32) = (2, 6, 0);
/// The oldest HAProxy that adds and publishes backends at runtime (`add backend … from`).
const MIN_BACKEND_ADD_VERSION: (u32, u32, u32) = (3, 4, 0);
/// Longest HAProxy reply kept in an error.
const MAX_ERROR_TEXT: usize = 2000;
/// How long `server.del` waits for the connections still using a server in maintenance to end
/// before it fails (and the apply reloads from the tree, where the server is gone).
const DEL_SERVER_WAIT: Duration = Duration::from_secs(5);
/// Pause between `del server` attempts while connections still use the server.
const DEL_SERVER_RETRY: Duration = Duration::from_millis(100);

/// What this agent can run over the runtime API of HAProxy `version`.
///
/// 2.6, 3.0 and 3.2 run the same eight kinds (all tested against each; `server.add` carries
/// only the parameters they all take); 3.4 adds `backend.add`; older versions get no runtime
/// batches, so every change reloads.
pub fn capabilities(version: (u32, u32, u32)) -> Capabilities {
    if version < MIN_RUNTIME_VERSION {
        return Capabilities { runtime_batches: false, ops: Vec::new() };
    }
    let runs = |k: &&OpKind| **k != OpKind::BackendAdd || version >= MIN_BACKEND_ADD_VERSION;
    Capabilities {
        runtime_batches: true,
        ops: OpKind::ALL.iter().filter(runs).map(|k| k.as_str().to_string()).collect(),
    }
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
    let runner = Runner { cli, line: WorkerLine::for_version(version) };
    let mut report = RunReport::default();
    // Membership ops the CLI cannot carry refuse the batch before anything is sent.
    for (index, op) in ops.iter().enumerate() {
        let bad = match op {
            Op::ServerAdd(a) => command::add_server(a).err().map(|e| e.to_string()),
            Op::BackendAdd(b) => command::add_backend(b)
                .err()
                .map(|e| e.to_string())
                .or_else(|| b.servers.iter().find_map(|a| command::add_server(a).err().map(|e| e.to_string()))),
            Op::ServerDel(d) => d.validate().err(),
            _ => None,
        };
        if let Some(reply) = bad {
            return Err(OpError {
                op: op.describe(),
                kind: op.kind_name().to_string(),
                index,
                command: String::new(),
                reply,
            });
        }
    }
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
            Op::ServerAdd(a) => runner.server_add(a).await,
            Op::ServerDel(d) => runner.server_del(d).await,
            Op::MapReplace { path, entries } => runner.map_replace(path.as_str(), entries).await,
            Op::MapLoad { path } => runner.map_load(path.as_str(), tree).await,
            Op::AclReplace { path, patterns } => runner.acl_replace(path.as_str(), patterns).await,
            Op::CertSet { path } => runner.cert_set(path.as_str(), tree).await,
            Op::CaFileSet { path } => runner.ca_file_set(path.as_str(), tree).await,
            Op::BackendAdd(b) => runner.backend_add(b).await,
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

/// Sends commands to the current worker, with severity tags where HAProxy supports them.
struct Runner<'a> {
    cli: &'a MasterCli,
    line: WorkerLine,
}

impl Runner<'_> {
    /// Sends `data` (one or more complete command lines, with their payloads) on one connection
    /// and checks the reply; `what` names the command in a failure.
    async fn exec(&self, data: &str, what: &str, expect: Expect) -> Result<String, Failure> {
        let fail = |reply: String| Failure { command: what.to_string(), reply };
        let reply = self.cli.send(data, self.cli.timeout()).await.map_err(|e| fail(e.to_string()))?;
        cli::check_reply(&reply, expect).map_err(|text| {
            fail(if text.is_empty() {
                "(empty reply)".to_string()
            } else {
                command::short_reply(&text, MAX_ERROR_TEXT)
            })
        })
    }

    /// One worker command.
    async fn command(&self, cmd: &str, expect: Expect) -> Result<String, Failure> {
        self.exec(&self.line.command(cmd), cmd, expect).await
    }

    async fn server_set(&self, s: &ServerSet) -> Result<(), Failure> {
        if !command::valid_name(&s.backend) || !command::valid_name(&s.server) {
            return Err(Failure::local(format!("invalid backend/server name {:?}/{:?}", s.backend, s.server)));
        }
        let target = format!("{}/{}", s.backend, s.server);
        let addr_cmd = match (&s.addr, s.port) {
            (Some(addr), port) => {
                let ip: IpAddr =
                    addr.parse().map_err(|_| Failure::local(format!("address {addr:?} is not an IP address")))?;
                Some(command::set_server_addr(&target, ip, port))
            }
            (None, Some(_)) => return Err(Failure::local("a port change needs the address too")),
            (None, None) => None,
        };
        let state_cmd = s.state.map(|st| command::set_server_state(&target, st.as_str()));
        // Taking a server out: do it first. Bringing it in: only once address and weight are right.
        let state_first = matches!(s.state, Some(ServerState::Maint | ServerState::Drain));
        if state_first {
            if let Some(cmd) = &state_cmd {
                self.command(cmd, Expect::Empty).await?;
            }
        }
        if let Some(cmd) = &addr_cmd {
            self.command(cmd, Expect::Starts(ADDR_CHANGED)).await?;
        }
        if let Some(w) = s.weight {
            self.command(&command::set_server_weight(&target, w), Expect::Empty).await?;
        }
        if !state_first {
            if let Some(cmd) = &state_cmd {
                self.command(cmd, Expect::Empty).await?;
            }
        }
        Ok(())
    }

    /// `add server` (it registers in maintenance), `enable health` with `check`, then `ready`
    /// unless the config keeps it disabled.
    async fn server_add(&self, a: &ServerAdd) -> Result<(), Failure> {
        let cmds = command::add_server(a).map_err(|e| Failure::local(e.to_string()))?;
        let mut expect = Expect::Starts(SERVER_REGISTERED);
        for cmd in &cmds {
            self.command(cmd, expect).await?;
            expect = Expect::Empty;
        }
        Ok(())
    }

    /// `add backend … from`, each server as [`Runner::server_add`] adds it, then `publish
    /// backend`: rules reach the backend only once its servers are in. A failure leaves an
    /// unpublished (or published, partly served) backend that the reload from the tree replaces.
    async fn backend_add(&self, b: &BackendAdd) -> Result<(), Failure> {
        let (add, publish) = command::add_backend(b).map_err(|e| Failure::local(e.to_string()))?;
        self.exec(&self.line.experimental(&add), &add, Expect::Starts(BACKEND_REGISTERED)).await?;
        for a in &b.servers {
            self.server_add(a).await?;
        }
        self.exec(&self.line.experimental(&publish), &publish, Expect::Starts(BACKEND_PUBLISHED)).await?;
        Ok(())
    }

    /// Maintenance first (no new traffic), then `del server`, retried while connections that
    /// still use the server end, for at most [`DEL_SERVER_WAIT`].
    async fn server_del(&self, d: &ServerDel) -> Result<(), Failure> {
        d.validate().map_err(Failure::local)?;
        let target = format!("{}/{}", d.backend, d.server);
        self.command(&command::set_server_state(&target, ServerState::Maint.as_str()), Expect::Empty).await?;
        let del = command::del_server(&target);
        let deadline = Instant::now() + DEL_SERVER_WAIT;
        loop {
            match self.command(&del, Expect::Starts(SERVER_DELETED)).await {
                Err(f) if command::del_server_busy(&f.reply) && Instant::now() < deadline => {
                    tokio::time::sleep(DEL_SERVER_RETRY).await;
                }
                other => return other.map(drop),
            }
        }
    }

    /// `prepare map|acl <name>` → the new version number.
    async fn prepare(&self, file: PatternFile, name: &str) -> Result<u32, Failure> {
        let cmd = file.prepare(name);
        let text = self.command(&cmd, Expect::Starts(NEW_VERSION)).await?;
        command::parse_new_version(&text).ok_or(Failure { command: cmd, reply: text })
    }

    /// Commits version `ver` and checks the listing shows it live with `expected` entries.
    async fn commit_and_verify(&self, file: PatternFile, name: &str, ver: u32, expected: usize) -> Result<(), Failure> {
        self.command(&file.commit(ver, name), Expect::Empty).await?;
        let cmd = file.show();
        let listing =
            self.cli.worker(&cmd).await.map_err(|e| Failure { command: cmd.clone(), reply: e.to_string() })?;
        match command::listing_counts(&listing, name) {
            Some((cur, cnt)) if cur == ver && cnt == expected => Ok(()),
            Some((cur, cnt)) => Err(Failure {
                command: cmd,
                reply: format!("after commit @{ver}: curr_ver={cur} entry_cnt={cnt}, expected @{ver} with {expected}"),
            }),
            None => Err(Failure { command: cmd, reply: format!("{name} is not listed after commit") }),
        }
    }

    async fn map_replace(&self, name: &str, entries: &[(String, String)]) -> Result<(), Failure> {
        let chunks = command::map_chunks(entries, MAX_PAYLOAD).map_err(|e| Failure::local(e.to_string()))?;
        let ver = self.prepare(PatternFile::Map, name).await?;
        let add = PatternFile::Map.add(ver, name);
        // One payload per master-CLI connection: on HAProxy 3.4 a second `@1 add map` payload on
        // the same connection was answered by the master itself ("Unknown command: 'add'"), which
        // failed the apply once a map passed one 12 KiB payload.
        // The version stays uncommitted unless every payload was taken: a failure stops here,
        // before `commit`, and the next `prepare` drops it.
        for (i, chunk) in chunks.iter().enumerate() {
            let data = self
                .line
                .with_payload(&add, chunk)
                .map_err(|e| Failure { command: add.clone(), reply: format!("invalid CLI payload: {e}") })?;
            self.exec(&data, &format!("{add} (payload {} of {})", i + 1, chunks.len()), Expect::Empty).await?;
        }
        self.commit_and_verify(PatternFile::Map, name, ver, entries.len()).await
    }

    async fn acl_replace(&self, name: &str, patterns: &[String]) -> Result<(), Failure> {
        command::validate_patterns(patterns).map_err(|e| Failure::local(e.to_string()))?;
        let ver = self.prepare(PatternFile::Acl, name).await?;
        let lines = command::acl_lines(ver, name, patterns, MAX_PAYLOAD).map_err(|e| Failure::local(e.to_string()))?;
        let add = PatternFile::Acl.add(ver, name);
        for (line, n) in &lines {
            self.exec(&self.line.several(line), &format!("{add} ({n} patterns)"), Expect::Empty).await?;
        }
        self.commit_and_verify(PatternFile::Acl, name, ver, patterns.len()).await
    }

    /// `map.load`: the entries of the map file `name` in `tree`, replaced as `map.replace` does.
    async fn map_load(&self, name: &str, tree: &Path) -> Result<(), Failure> {
        let file = tree.join(name);
        let text = tokio::fs::read_to_string(&file)
            .await
            .map_err(|e| Failure::local(format!("cannot read {}: {e}", file.display())))?;
        let entries = haptic_haproxy::cfg::parse_map_file(&text);
        drop(text);
        self.map_replace(name, &entries).await
    }

    async fn cert_set(&self, name: &str, tree: &Path) -> Result<(), Failure> {
        let cmds = SslFile {
            set: command::set_ssl_cert(name),
            created: CERT_TRANSACTION,
            commit: command::commit_ssl_cert(name),
            abort: command::abort_ssl_cert(name),
        };
        self.ssl_file_set(name, tree, cmds).await
    }

    async fn ca_file_set(&self, name: &str, tree: &Path) -> Result<(), Failure> {
        let cmds = SslFile {
            set: command::set_ssl_ca_file(name),
            created: CA_FILE_TRANSACTION,
            commit: command::commit_ssl_ca_file(name),
            abort: command::abort_ssl_ca_file(name),
        };
        self.ssl_file_set(name, tree, cmds).await
    }

    /// Replaces the loaded TLS file `name` (a certificate or a CA file) with the PEM now in
    /// `tree`: one transaction, committed, or aborted when any step fails.
    async fn ssl_file_set(&self, name: &str, tree: &Path, cmds: SslFile) -> Result<(), Failure> {
        let file = tree.join(name);
        let pem = tokio::fs::read_to_string(&file)
            .await
            .map_err(|e| Failure::local(format!("cannot read {}: {e}", file.display())))?;
        let pem = command::strip_blank_lines(&pem);
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
            let data = self
                .line
                .with_payload(&cmds.set, &pem)
                .map_err(|e| Failure { command: cmds.set.clone(), reply: format!("invalid CLI payload: {e}") })?;
            self.exec(&data, &cmds.set, Expect::Starts(cmds.created)).await?;
            self.command(&cmds.commit, Expect::LastLine(CERT_COMMITTED)).await
        }
        .await;
        if result.is_err() {
            // Drop a half-made transaction; "No ongoing transaction!" is fine too.
            let _ = self.cli.worker(&cmds.abort).await;
        }
        result.map(drop)
    }
}

/// The CLI commands that replace one loaded TLS file: the transaction, its reply, the commit and
/// the abort.
struct SslFile {
    set: String,
    created: &'static [&'static str],
    commit: String,
    abort: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_by_version() {
        // 2.6, 3.0 and 3.2 run the same eight kinds (tests/haproxy_ops.rs runs each on each);
        // 3.4 adds backend.add.
        let c26 = capabilities((2, 6, 12));
        assert_eq!(c26, capabilities((3, 0, 11)), "2.6 and 3.0 do not differ in runnable op kinds");
        assert_eq!(c26, capabilities((3, 2, 26)), "2.6 and 3.2 do not differ in runnable op kinds");
        assert!(c26.runtime_batches);
        for k in OpKind::ALL {
            assert_eq!(c26.supports(k), k != OpKind::BackendAdd, "{k}");
            assert!(capabilities((3, 4, 7)).supports(k), "{k} on 3.4");
        }
        assert!(!capabilities((2, 4, 0)).runtime_batches);
    }
}
