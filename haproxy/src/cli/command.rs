//! The text of every master CLI and runtime API command haptic sends, and of the replies that
//! mean success.
//!
//! Owns the command syntax (`show proc`, `reload`, `@1 …` routing to the current worker,
//! `set severity-output number;` tags, `<<` payloads, `set server …`, `add server` with the
//! parameters HAProxy 2.6 and 3.0 both take on it, `del server`, `prepare`/`add`/`commit`
//! of maps and ACLs, `set ssl cert`), the argument escaping of the CLI tokenizer, the split of
//! map entries and ACL patterns into payloads and lines that fit HAProxy's limits, and reading
//! `New version created:` and `show map`/`show acl` listings. Pure: it must never do I/O; the
//! agent sends these bytes and hands the replies back to [`super::check_reply`].
//!
//! Payload limits: a payload holds no blank line (it would end the payload early) and at most
//! [`MAX_PAYLOAD`] bytes (HAProxy 2.6 silently drops payloads over 16 KiB; 3.2.0 crashed on
//! large ones).

use super::Version;

/// The largest payload sent in one command.
pub const MAX_PAYLOAD: usize = 12 * 1024;

/// Master command: HAProxy's version (also a cheap liveness check).
pub const SHOW_VERSION: &str = "show version";
/// Master command: the master and its workers.
pub const SHOW_PROC: &str = "show proc";
/// Master command: reload (re-exec the master, fork a new worker).
pub const RELOAD: &str = "reload";
/// `show info` of the current worker, routed through the master.
pub const WORKER_SHOW_INFO: &str = "@1 show info";

/// Successful replies of `set server … addr … [port …]` (2.6 and 3.0 wording).
pub const ADDR_CHANGED: &[&str] = &[
    "IP changed from",
    "no need to change the addr",
    "nothing changed",
    "port changed from",
    "no need to change the port",
];
/// Successful reply of `prepare map|acl`.
pub const NEW_VERSION: &[&str] = &["New version created:"];
/// Successful replies of `set ssl cert`.
pub const CERT_TRANSACTION: &[&str] = &["Transaction created for certificate", "Transaction updated for certificate"];
/// Successful replies of `set ssl ca-file` (2.6 to 3.4 spell them in lower case).
pub const CA_FILE_TRANSACTION: &[&str] = &["transaction created for CA", "transaction updated for CA"];
/// The last line of a successful `commit ssl cert` (and `commit ssl ca-file`).
pub const CERT_COMMITTED: &str = "Success!";

/// Successful reply of `add server`.
pub const SERVER_REGISTERED: &[&str] = &["New server registered."];
/// Successful reply of `add backend` (HAProxy 3.4).
pub const BACKEND_REGISTERED: &[&str] = &["New backend registered."];
/// Successful reply of `publish backend` (HAProxy 3.4).
pub const BACKEND_PUBLISHED: &[&str] = &["Backend published."];
/// Successful reply of `del server`.
pub const SERVER_DELETED: &[&str] = &["Server deleted."];
/// The start of `del server`'s refusal while connections still use the server (2.6 and 3.0).
pub const SERVER_BUSY: &str = "Server still has connections attached to it";

/// Whether a `del server` reply says only that connections still use the server (worth
/// retrying once they ended).
pub fn del_server_busy(reply: &str) -> bool {
    reply.contains(SERVER_BUSY)
}

/// `add backend NAME from DEFAULTS` and `publish backend NAME` (HAProxy 3.4, experimental: sent
/// with [`WorkerLine::experimental`]); the backend's servers go in between, each as
/// [`add_server`] makes it, so the backend takes traffic only once they are there.
pub fn add_backend(op: &haptic_protocol::BackendAdd) -> Result<(String, String), CommandError> {
    op.validate().map_err(CommandError::Argument)?;
    Ok((format!("add backend {} from {}", op.backend, op.defaults), format!("publish backend {}", op.backend)))
}

/// `server` parameters that `add server` takes on HAProxy 2.6, 3.0, 3.2 and 3.4, with the same
/// meaning as on a `server` line, and that need no other config object: flags first, then
/// keywords followed by one value (`proto h2`, the mux of an h2c or gRPC backend, is taken by
/// all four). Anything else (`cookie` is refused by 2.6, `enabled` by 3.0, `init-addr`/`resolvers`
/// by both, `ssl`/`track`/`agent-check` need more than the line) keeps a server change a reload.
const ADD_SERVER_FLAGS: &[&str] = &["check", "backup", "send-proxy", "send-proxy-v2"];
const ADD_SERVER_VALUED: &[&str] = &[
    "inter",
    "fastinter",
    "downinter",
    "rise",
    "fall",
    "slowstart",
    "maxconn",
    "maxqueue",
    "minconn",
    "error-limit",
    "observe",
    "on-error",
    "proto",
];

/// Checks a `server` line's parameters (besides address, `weight` and `disabled`) for
/// `add server`: every one must be a flag or a keyword with a plain value (letters, digits,
/// `.`, `_`, `-`) that both HAProxy 2.6 and 3.0 accept at runtime.
pub fn check_add_server_params(params: &[String]) -> Result<(), String> {
    let plain = |v: &str| !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    let mut it = params.iter();
    while let Some(p) = it.next() {
        if ADD_SERVER_FLAGS.contains(&p.as_str()) {
            continue;
        }
        if !ADD_SERVER_VALUED.contains(&p.as_str()) {
            return Err(format!("parameter {p:?} is not one `add server` takes on HAProxy 2.6 and 3.0"));
        }
        match it.next() {
            Some(v) if plain(v) => {}
            Some(v) => return Err(format!("parameter {p} {v:?}: the value is not a plain word")),
            None => return Err(format!("parameter {p} has no value")),
        }
    }
    Ok(())
}

/// The commands that add a server, in order: `add server <backend>/<server> <ip:port>
/// [weight N] [disabled] <params>` (it registers in maintenance), `enable health` when it has
/// `check` (a runtime-added server's checks start off), and `set server … state ready` unless
/// it is to stay in maintenance. Each is checked with [`SERVER_REGISTERED`], then empty replies.
pub fn add_server(op: &haptic_protocol::ServerAdd) -> Result<Vec<String>, CommandError> {
    op.validate().map_err(CommandError::Argument)?;
    check_add_server_params(&op.params).map_err(CommandError::Argument)?;
    let target = format!("{}/{}", op.backend, op.server);
    let mut add = format!("add server {target} {}", op.socket_addr());
    if let Some(w) = op.weight {
        add.push_str(&format!(" weight {w}"));
    }
    let ready = match op.state {
        haptic_protocol::ServerState::Ready => true,
        haptic_protocol::ServerState::Maint => false,
        haptic_protocol::ServerState::Drain => unreachable!("validate refuses drain"),
    };
    if !ready {
        add.push_str(" disabled");
    }
    for p in &op.params {
        add.push(' ');
        add.push_str(p);
    }
    let mut cmds = vec![add];
    if op.params.iter().any(|p| p == "check") {
        cmds.push(format!("enable health {target}"));
    }
    if ready {
        cmds.push(set_server_state(&target, "ready"));
    }
    Ok(cmds)
}

/// `del server <backend>/<server>` (success: [`SERVER_DELETED`]); HAProxy deletes only a
/// server in maintenance ([`set_server_state`] `maint` first) that no connection uses.
pub fn del_server(target: &str) -> String {
    format!("del server {target}")
}

/// Why a command or its payload cannot be sent as is (nothing was sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The payload is empty, holds a blank line, or is over [`MAX_PAYLOAD`].
    #[error("{0}")]
    Payload(String),
    /// A map entry, ACL pattern or name a command line cannot carry.
    #[error("{0}")]
    Argument(String),
}

/// `cmd` for the current worker (`@1 <cmd>`), without severity tags.
pub fn worker(cmd: &str) -> String {
    format!("@1 {cmd}")
}

/// Whether the master's `set severity-output number` also tags the replies of `@1` commands:
/// from HAProxy 3.0 on.
pub fn tags_worker_replies(version: Version) -> bool {
    version >= (3, 0, 0)
}

/// How command lines reach the current worker: `@1 <cmd>`, with every reply line tagged with its
/// severity (`[3]: …`) where HAProxy supports it, so errors cannot pass for success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLine {
    /// Whether `set severity-output number;` leads each line.
    pub tagged: bool,
}

impl WorkerLine {
    /// The form for HAProxy `version`.
    pub fn for_version(version: Version) -> Self {
        Self { tagged: tags_worker_replies(version) }
    }

    fn tag(&self) -> &'static str {
        if self.tagged {
            "set severity-output number; "
        } else {
            ""
        }
    }

    /// One worker command.
    pub fn command(&self, cmd: &str) -> String {
        format!("{}@1 {cmd}", self.tag())
    }

    /// One worker command that HAProxy marks experimental (`add backend`, `publish backend` on
    /// 3.4): the master's `experimental-mode on` carries over to the command it forwards (a
    /// worker-side `experimental-mode on` would end with its own forwarded session).
    pub fn experimental(&self, cmd: &str) -> String {
        format!("{}experimental-mode on; @1 {cmd}", self.tag())
    }

    /// One worker command with its payload (`<cmd> <<`, the payload, a blank line).
    pub fn with_payload(&self, cmd: &str, payload: &str) -> Result<String, CommandError> {
        payload_line(&self.command(cmd), payload)
    }

    /// A line of several `@1 …` commands joined by `;` (from [`acl_lines`]).
    pub fn several(&self, line: &str) -> String {
        format!("{}{line}", self.tag())
    }
}

/// Builds `<cmd> <<\n<payload>\n\n`, refusing payloads HAProxy would cut short or choke on.
pub fn payload_line(cmd: &str, payload: &str) -> Result<String, CommandError> {
    let body = payload.trim_end_matches(['\n', '\r']);
    if body.len() > MAX_PAYLOAD {
        return Err(CommandError::Payload(format!("{} bytes is over the {MAX_PAYLOAD}-byte limit", body.len())));
    }
    if body.is_empty() || body.lines().any(|l| l.trim().is_empty()) {
        return Err(CommandError::Payload("an empty payload, or a blank line that would end it early".into()));
    }
    Ok(format!("{cmd} <<\n{body}\n\n"))
}

/// Escapes one CLI argument: `\`, `;`, whitespace and quote characters get a backslash.
pub fn escape_arg(arg: &str) -> String {
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
pub fn valid_name(name: &str) -> bool {
    haptic_protocol::ops::valid_name(name)
}

/// `set server <backend>/<server> addr <ip> [port <port>]`.
pub fn set_server_addr(target: &str, ip: std::net::IpAddr, port: Option<u16>) -> String {
    match port {
        Some(p) => format!("set server {target} addr {ip} port {p}"),
        None => format!("set server {target} addr {ip}"),
    }
}

/// `set server <backend>/<server> weight <w>`.
pub fn set_server_weight(target: &str, weight: u32) -> String {
    format!("set server {target} weight {weight}")
}

/// `set server <backend>/<server> state ready|drain|maint`.
pub fn set_server_state(target: &str, state: &str) -> String {
    format!("set server {target} state {state}")
}

/// The two kinds of pattern file the runtime API swaps atomically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternFile {
    /// A map file (`key value` lines).
    Map,
    /// An ACL pattern file (one pattern a line).
    Acl,
}

impl PatternFile {
    /// `map` or `acl`, as the commands spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            PatternFile::Map => "map",
            PatternFile::Acl => "acl",
        }
    }

    /// `prepare map|acl <name>`: a new empty version (reply: [`NEW_VERSION`]).
    pub fn prepare(self, name: &str) -> String {
        format!("prepare {} {name}", self.as_str())
    }

    /// `add map|acl @<ver> <name>`, the head of a payload (maps) or of one pattern (ACLs).
    pub fn add(self, ver: u32, name: &str) -> String {
        format!("add {} @{ver} {name}", self.as_str())
    }

    /// `commit map|acl @<ver> <name>`: the version becomes the live one.
    pub fn commit(self, ver: u32, name: &str) -> String {
        format!("commit {} @{ver} {name}", self.as_str())
    }

    /// `show map|acl`: the listing [`listing_counts`] reads.
    pub fn show(self) -> String {
        format!("show {}", self.as_str())
    }
}

/// `set ssl cert <name>` (its payload is the PEM, see [`strip_blank_lines`]).
pub fn set_ssl_cert(name: &str) -> String {
    format!("set ssl cert {name}")
}

/// `commit ssl cert <name>` (success: last line [`CERT_COMMITTED`]).
pub fn commit_ssl_cert(name: &str) -> String {
    format!("commit ssl cert {name}")
}

/// `abort ssl cert <name>`: drops a half-made transaction.
pub fn abort_ssl_cert(name: &str) -> String {
    format!("abort ssl cert {name}")
}

/// `set ssl ca-file <name>` (its payload is the PEM, see [`strip_blank_lines`]).
pub fn set_ssl_ca_file(name: &str) -> String {
    format!("set ssl ca-file {name}")
}

/// `commit ssl ca-file <name>` (success: last line [`CERT_COMMITTED`], as for a certificate).
pub fn commit_ssl_ca_file(name: &str) -> String {
    format!("commit ssl ca-file {name}")
}

/// `abort ssl ca-file <name>`: drops a half-made transaction.
pub fn abort_ssl_ca_file(name: &str) -> String {
    format!("abort ssl ca-file {name}")
}

/// Parses the version number out of `New version created: N`.
pub fn parse_new_version(text: &str) -> Option<u32> {
    text.lines().next()?.strip_prefix("New version created:")?.trim().parse().ok()
}

/// The `curr_ver` and `entry_cnt` of the `(name)` line of a `show map` / `show acl` listing.
pub fn listing_counts(listing: &str, name: &str) -> Option<(u32, usize)> {
    let needle = format!("({name})");
    let line = listing.lines().find(|l| l.split_whitespace().nth(1) == Some(needle.as_str()))?;
    let field = |key: &str| line.split_whitespace().find_map(|t| t.strip_prefix(key));
    Some((field("curr_ver=")?.parse().ok()?, field("entry_cnt=")?.parse().ok()?))
}

/// Groups `key value` lines into payloads of at most `limit` bytes.
pub fn map_chunks(entries: &[(String, String)], limit: usize) -> Result<Vec<String>, CommandError> {
    let mut chunks = Vec::new();
    let mut cur = String::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if k.is_empty() || k.chars().any(char::is_whitespace) {
            return Err(CommandError::Argument(format!(
                "entry {i}: key {k:?} is empty or holds whitespace, which a map payload cannot carry"
            )));
        }
        if v.contains(['\n', '\r']) {
            return Err(CommandError::Argument(format!("entry {i} (key {k:?}): value holds a line break")));
        }
        let line = format!("{k} {v}\n");
        if line.len() > limit {
            return Err(CommandError::Argument(format!("entry {i} (key {k:?}) is longer than a {limit}-byte payload")));
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

/// Refuses patterns a CLI line cannot carry (empty, or holding a line break).
pub fn validate_patterns(patterns: &[String]) -> Result<(), CommandError> {
    match patterns.iter().enumerate().find(|(_, p)| p.is_empty() || p.contains(['\n', '\r'])) {
        Some((i, p)) => Err(CommandError::Argument(format!("pattern {i} ({p:?}) is empty or holds a line break"))),
        None => Ok(()),
    }
}

/// Groups ACL patterns into `;`-joined `@1 add acl @<ver> <name> <pattern>` command lines of at
/// most `limit` bytes (`add acl` takes no payload on 2.6 and 3.0); each line with the number of
/// patterns it holds.
pub fn acl_lines(
    ver: u32,
    name: &str,
    patterns: &[String],
    limit: usize,
) -> Result<Vec<(String, usize)>, CommandError> {
    acl_lines_with(&worker(&PatternFile::Acl.add(ver, name)), patterns, limit)
}

fn acl_lines_with(prefix: &str, patterns: &[String], limit: usize) -> Result<Vec<(String, usize)>, CommandError> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    let mut count = 0;
    validate_patterns(patterns)?;
    for (i, p) in patterns.iter().enumerate() {
        let cmd = format!("{prefix} {}", escape_arg(p));
        if cmd.len() > limit {
            return Err(CommandError::Argument(format!("pattern {i} is longer than a {limit}-byte command line")));
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

/// Strips `\r` and blank lines from a PEM, so it can be a payload (a blank line would end it).
pub fn strip_blank_lines(pem: &str) -> String {
    pem.lines().map(|l| l.trim_end_matches('\r')).filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join("\n")
}

/// HAProxy's reply cut to something that fits a log line and a JSON error: at most `max` bytes
/// (then `…`), and the "Unknown command" help listing reduced to its first line.
pub fn short_reply(text: &str, max: usize) -> String {
    let text = if text.starts_with("Unknown command") { text.lines().next().unwrap_or(text) } else { text };
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::super::{check_reply, strip_severity_tag, Expect};
    use super::*;

    #[test]
    fn worker_lines() {
        let tagged = WorkerLine::for_version((3, 0, 11));
        let plain = WorkerLine::for_version((2, 6, 12));
        assert_eq!(tagged.command("show info"), "set severity-output number; @1 show info");
        assert_eq!(plain.command("show info"), "@1 show info");
        assert!(matches!(plain.with_payload("set ssl cert c.pem", "A\n\nB\n"), Err(CommandError::Payload(_))));
        assert_eq!(plain.with_payload("set ssl cert c.pem", "A\nB\n").unwrap(), "@1 set ssl cert c.pem <<\nA\nB\n\n");
        assert_eq!(plain.several("@1 a; @1 b"), "@1 a; @1 b");
        assert_eq!(tagged.several("@1 a; @1 b"), "set severity-output number; @1 a; @1 b");
        assert_eq!(
            set_server_addr("b/s", "10.0.0.1".parse().unwrap(), Some(80)),
            "set server b/s addr 10.0.0.1 port 80"
        );
        assert_eq!(PatternFile::Map.commit(3, "maps/m.map"), "commit map @3 maps/m.map");
        assert_eq!(worker(PatternFile::Acl.show().as_str()), "@1 show acl");
    }

    #[test]
    fn payload_line_form() {
        assert_eq!(payload_line("@1 add map @1 m", "a 1\nb 2\n").unwrap(), "@1 add map @1 m <<\na 1\nb 2\n\n");
        assert_eq!(payload_line("x", "a").unwrap(), "x <<\na\n\n");
        assert!(matches!(payload_line("x", "a\n\nb"), Err(CommandError::Payload(_))));
        assert!(matches!(payload_line("x", "a\n  \nb"), Err(CommandError::Payload(_))));
        assert!(matches!(payload_line("x", ""), Err(CommandError::Payload(_))));
        assert!(matches!(payload_line("x", &"k v\n".repeat(4000)), Err(CommandError::Payload(_))));
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
        assert!(check_reply("Committing certs/site.pem.\nSuccess!\n\n", Expect::LastLine(CERT_COMMITTED)).is_ok());
        let nocommit = "No ongoing transaction! !\nCan't commit certs/site.pem!\n\n";
        assert!(check_reply(nocommit, Expect::LastLine(CERT_COMMITTED)).is_err());
        let unk = "Unknown command, but maybe one of the following ones is a better match:\n  quit : disconnect\n\n";
        assert_eq!(
            short_reply(&check_reply(unk, Expect::Empty).unwrap_err(), 2000),
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
        assert_eq!(strip_severity_tag("plain"), None);
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
    fn acl_lines_escape_and_split() {
        let pats: Vec<String> = vec!["/a".into(), "a b;c\\d#e\"f'g".into()];
        let lines = acl_lines(3, "maps/p.acl", &pats, MAX_PAYLOAD).unwrap();
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].0, "@1 add acl @3 maps/p.acl /a; @1 add acl @3 maps/p.acl a\\ b\\;c\\\\d\\#e\\\"f\\'g");
        assert_eq!(lines[0].1, 2);
        let many: Vec<String> = (0..2000).map(|i| format!("/path/{i}")).collect();
        let lines = acl_lines(3, "maps/p.acl", &many, 1000).unwrap();
        assert!(lines.len() > 1);
        assert!(lines.iter().all(|(l, _)| l.len() <= 1000));
        assert_eq!(lines.iter().map(|(_, n)| n).sum::<usize>(), 2000);
        assert!(acl_lines_with("x", &["".into()], 100).is_err());
        assert!(acl_lines_with("x", &["a\nb".into()], 100).is_err());
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
    fn add_and_del_server_commands() {
        let op = |params: &[&str], state| haptic_protocol::ServerAdd {
            backend: "be_app".into(),
            server: "SRV_3".into(),
            addr: "10.0.0.3".parse().unwrap(),
            port: 8080,
            weight: Some(10),
            state,
            params: params.iter().map(|p| p.to_string()).collect(),
        };
        use haptic_protocol::ServerState::{Maint, Ready};
        assert_eq!(
            add_server(&op(&["check", "inter", "2s"], Ready)).unwrap(),
            vec![
                "add server be_app/SRV_3 10.0.0.3:8080 weight 10 check inter 2s",
                "enable health be_app/SRV_3",
                "set server be_app/SRV_3 state ready"
            ]
        );
        assert_eq!(
            add_server(&op(&[], Maint)).unwrap(),
            vec!["add server be_app/SRV_3 10.0.0.3:8080 weight 10 disabled"]
        );
        assert_eq!(
            add_server(&op(&["proto", "h2"], Maint)).unwrap(),
            vec!["add server be_app/SRV_3 10.0.0.3:8080 weight 10 disabled proto h2"]
        );
        let v6 = haptic_protocol::ServerAdd { addr: "::1".parse().unwrap(), weight: None, ..op(&[], Ready) };
        assert_eq!(add_server(&v6).unwrap()[0], "add server be_app/SRV_3 [::1]:8080");
        for bad in [&["cookie", "c1"][..], &["enabled"], &["inter"], &["inter", "2s;x"], &["track", "b/s"], &["ssl"]] {
            assert!(matches!(add_server(&op(bad, Ready)), Err(CommandError::Argument(_))), "{bad:?}");
        }
        assert!(add_server(&haptic_protocol::ServerAdd { backend: "a b".into(), ..op(&[], Ready) }).is_err());
        assert_eq!(del_server("be_app/SRV_1"), "del server be_app/SRV_1");
        // Captured from 2.6.12 (untagged) and 3.0.11 (tagged).
        assert!(check_reply("New server registered.\n\n", Expect::Starts(SERVER_REGISTERED)).is_ok());
        assert!(check_reply("[6]: New server registered.\n\n", Expect::Starts(SERVER_REGISTERED)).is_ok());
        assert_eq!(
            check_reply("No such backend.\n", Expect::Starts(SERVER_REGISTERED)).unwrap_err(),
            "No such backend."
        );
        assert!(check_reply("[3]: No such backend.\n\n", Expect::Starts(SERVER_REGISTERED)).is_err());
        let dyn_lb = "Backend must use a dynamic load balancing to support dynamic servers.\n";
        assert!(check_reply(dyn_lb, Expect::Starts(SERVER_REGISTERED)).is_err());
        assert!(check_reply("Server deleted.\n", Expect::Starts(SERVER_DELETED)).is_ok());
        let maint = "Only servers in maintenance mode can be deleted.\n";
        assert!(check_reply(maint, Expect::Starts(SERVER_DELETED)).is_err());
        let busy = "[3]: Server still has connections attached to it, cannot remove it.\n\n";
        assert!(del_server_busy(&check_reply(busy, Expect::Starts(SERVER_DELETED)).unwrap_err()));
        assert!(!del_server_busy(maint));
    }

    #[test]
    fn names_and_error_text() {
        assert!(valid_name("be_app") && valid_name("SRV_2") && valid_name("a.b-c:d"));
        assert!(!valid_name("") && !valid_name("a b") && !valid_name("a;b") && !valid_name("a/b"));
        assert_eq!(short_reply(&"x".repeat(5000), 2000).chars().count(), 2001);
    }
}
