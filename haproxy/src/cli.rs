//! Parsers for the text replies of HAProxy's CLI (master socket and worker stats socket).
//!
//! This module owns the *interpretation* of HAProxy's reply texts: `show proc`, the master CLI
//! `reload` status (≥ 2.7), `show info`, `show version` / `haproxy -v`, and whether a runtime
//! command's reply is its success form (with or without `set severity-output number;` tags); and,
//! in [`command`], the text of the commands themselves. It is shared by the agent and the test
//! harness so both read HAProxy the same way.
//!
//! It must stay pure: it must never do I/O (no sockets, no files, no processes, no clocks) and never
//! depend on an async runtime. Callers fetch the text; this module only reads it.
//!
//! The golden strings in the tests were captured from Debian's HAProxy 2.6.12 and 3.0.11.

use std::collections::BTreeMap;

pub mod command;

/// Why a CLI reply could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CliParseError {
    /// The reply has no line describing the master process.
    #[error("no master line in `show proc` reply: {0:?}")]
    NoMaster(String),
    /// A process line could not be read.
    #[error("malformed `show proc` line: {0:?}")]
    BadProcLine(String),
    /// The text holds no `major.minor[.patch]` version.
    #[error("no HAProxy version found in: {0:?}")]
    NoVersion(String),
}

/// One process row of `show proc` (master, worker or program).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcEntry {
    /// The process id.
    pub pid: u32,
    /// The `<type>` column: `master`, `worker`, or a program name.
    pub kind: String,
    /// The `<reloads>` column: for a worker, how many reloads it has survived.
    pub reloads: u32,
    /// The `<uptime>` column as printed, e.g. `0d00h01m45s`.
    pub uptime: String,
    /// The `<version>` column, e.g. `2.6.12-1+deb12u4` (may be empty or `-` for programs).
    pub version: String,
}

impl ProcEntry {
    /// The uptime in seconds, when the `<uptime>` column has the `NdHHhMMmSSs` form.
    pub fn uptime_secs(&self) -> Option<u64> {
        parse_uptime(&self.uptime)
    }
}

/// The parsed reply of the master CLI `show proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShowProc {
    /// The master process row.
    pub master: ProcEntry,
    /// The `[failed: N]` counter of the master: failed reloads since the last success.
    pub failed_reloads: u32,
    /// Rows under `# workers` (the current worker first).
    pub workers: Vec<ProcEntry>,
    /// Rows under `# old workers` (draining workers, or on 3.x after a failed reload the serving one).
    pub old_workers: Vec<ProcEntry>,
    /// Rows under `# programs`.
    pub programs: Vec<ProcEntry>,
}

impl ShowProc {
    /// The master's pid.
    pub fn master_pid(&self) -> u32 {
        self.master.pid
    }

    /// The master's `reloads` counter, which counts successful and failed reloads.
    pub fn master_reloads(&self) -> u32 {
        self.master.reloads
    }

    /// The first row under `# workers`, if any.
    pub fn current_worker(&self) -> Option<&ProcEntry> {
        self.workers.first()
    }

    /// The worker most likely serving: the current worker, else (3.x quirk after a failed reload)
    /// the old worker that survived the fewest reloads.
    pub fn serving_worker(&self) -> Option<&ProcEntry> {
        self.current_worker().or_else(|| self.old_workers.iter().min_by_key(|w| w.reloads))
    }

    /// Every worker pid, current and old.
    pub fn all_worker_pids(&self) -> Vec<u32> {
        self.workers.iter().chain(self.old_workers.iter()).map(|w| w.pid).collect()
    }
}

/// Parses `NdHHhMMmSSs` (as printed by `show proc`) into seconds.
fn parse_uptime(s: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut num = String::new();
    let mut seen_any = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().ok()?;
        num.clear();
        let mult = match c {
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(mult)?)?;
        seen_any = true;
    }
    if !num.is_empty() || !seen_any {
        return None;
    }
    Some(total)
}

/// Section of `show proc` a row belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Head,
    Workers,
    OldWorkers,
    Programs,
    Other,
}

/// Parses the master CLI `show proc` reply (2.6 and 3.x formats).
pub fn parse_show_proc(text: &str) -> Result<ShowProc, CliParseError> {
    let mut section = Section::Head;
    let mut master: Option<(ProcEntry, u32)> = None;
    let mut workers = Vec::new();
    let mut old_workers = Vec::new();
    let mut programs = Vec::new();
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with("#<PID>") {
            continue;
        }
        if let Some(title) = line.strip_prefix('#') {
            section = match title.trim() {
                "workers" => Section::Workers,
                "old workers" => Section::OldWorkers,
                "programs" | "old programs" => Section::Programs,
                _ => Section::Other,
            };
            continue;
        }
        let (entry, failed) = parse_proc_line(line)?;
        if entry.kind == "master" && master.is_none() {
            master = Some((entry, failed.unwrap_or(0)));
            continue;
        }
        match section {
            Section::Workers => workers.push(entry),
            Section::OldWorkers => old_workers.push(entry),
            Section::Programs => programs.push(entry),
            Section::Head | Section::Other => {
                if entry.kind == "worker" {
                    workers.push(entry);
                }
            }
        }
    }
    let (master, failed_reloads) = master.ok_or_else(|| CliParseError::NoMaster(text.into()))?;
    Ok(ShowProc { master, failed_reloads, workers, old_workers, programs })
}

/// Parses one `show proc` row: `pid type reloads [ [failed: N] ] uptime version`.
fn parse_proc_line(line: &str) -> Result<(ProcEntry, Option<u32>), CliParseError> {
    let bad = || CliParseError::BadProcLine(line.into());
    let mut toks: Vec<&str> = line.split_whitespace().collect();
    if toks.len() < 3 {
        return Err(bad());
    }
    let pid: u32 = toks[0].parse().map_err(|_| bad())?;
    let kind = toks[1].to_string();
    let reloads: u32 = toks[2].parse().map_err(|_| bad())?;
    let mut rest = toks.split_off(3);
    let mut failed = None;
    if rest.first() == Some(&"[failed:") && rest.len() >= 2 {
        let n = rest[1].trim_end_matches(']');
        failed = Some(n.parse().map_err(|_| bad())?);
        rest.drain(..2);
    }
    let uptime = rest.first().map(|s| s.to_string()).unwrap_or_default();
    let version = rest.get(1..).map(|v| v.join(" ")).unwrap_or_default();
    Ok((ProcEntry { pid, kind, reloads, uptime, version }, failed))
}

/// The meaning of a master CLI `reload` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadReply {
    /// `Success=1`: the new config was loaded (3.1+: the new worker is ready); `logs` is the text after `--`.
    Success {
        /// Startup logs printed after `--`.
        logs: String,
    },
    /// `Success=0`: the reload failed and the old worker is kept; `logs` holds the `[ALERT]` lines.
    Failure {
        /// Startup logs printed after `--` (alerts, `Loading failure!`).
        logs: String,
    },
    /// `Success=0` with "Another reload is still in progress." (3.1+): back off and retry.
    InProgress,
    /// An empty reply (2.6, or a 3.x reload that never reported): verify with `show proc`.
    NoStatus,
    /// A non-empty reply without a `Success=` line.
    Unrecognized(String),
}

/// The text HAProxy (3.1+) sends when a reload is requested while one is running.
pub const ANOTHER_RELOAD_IN_PROGRESS: &str = "Another reload is still in progress.";

/// Parses the reply of the master CLI `reload` command (status lines exist from 2.7 on).
pub fn parse_reload_reply(text: &str) -> ReloadReply {
    if text.trim().is_empty() {
        return ReloadReply::NoStatus;
    }
    let mut lines = text.lines().skip_while(|l| l.trim().is_empty());
    let first = lines.next().unwrap_or("").trim();
    let success = match first {
        "Success=1" => true,
        "Success=0" => false,
        _ => return ReloadReply::Unrecognized(text.into()),
    };
    let rest: Vec<&str> = lines.collect();
    let logs_lines: &[&str] = match rest.iter().position(|l| l.trim() == "--") {
        Some(i) => &rest[i + 1..],
        None => &rest[..],
    };
    let logs = logs_lines.join("\n").trim_end().to_string();
    if success {
        ReloadReply::Success { logs }
    } else if logs.contains(ANOTHER_RELOAD_IN_PROGRESS) {
        ReloadReply::InProgress
    } else {
        ReloadReply::Failure { logs }
    }
}

/// The parsed reply of `show info` (plain `key: value` form).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShowInfo {
    /// Every `key: value` pair, keys as printed (e.g. `Pid`, `Stopping`, `description`).
    pub fields: BTreeMap<String, String>,
}

impl ShowInfo {
    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// The `Pid` field: the pid of the worker that answered.
    pub fn pid(&self) -> Option<u32> {
        self.get("Pid")?.parse().ok()
    }

    /// The `Stopping` field: `true` for a draining (old) worker.
    pub fn stopping(&self) -> Option<bool> {
        match self.get("Stopping")? {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        }
    }

    /// The `description` field (haptic puts `cfggen=<hash>` there).
    pub fn description(&self) -> Option<&str> {
        self.get("description")
    }

    /// The `Version` field, e.g. `2.6.12-1+deb12u4`.
    pub fn version(&self) -> Option<&str> {
        self.get("Version")
    }

    /// The `Uptime_sec` field.
    pub fn uptime_secs(&self) -> Option<u64> {
        self.get("Uptime_sec")?.parse().ok()
    }
}

/// Parses the plain-text `show info` reply into its `key: value` fields (other lines are ignored).
pub fn parse_show_info(text: &str) -> ShowInfo {
    let fields = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let k = k.trim();
            if k.is_empty() || k.contains(char::is_whitespace) {
                return None;
            }
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect();
    ShowInfo { fields }
}

/// A HAProxy version triple `(major, minor, patch)`.
pub type Version = (u32, u32, u32);

/// Parses the version from `haproxy -v` (`HAProxy version 2.6.12-1+deb12u4 …`) or `show version`.
pub fn parse_version(text: &str) -> Result<Version, CliParseError> {
    let candidate = text
        .lines()
        .find_map(|l| {
            let l = l.trim();
            if let Some(i) = l.find("version ") {
                let after = &l[i + "version ".len()..];
                return after.split_whitespace().next();
            }
            None
        })
        .or_else(|| text.split_whitespace().next())
        .ok_or_else(|| CliParseError::NoVersion(text.into()))?;
    parse_version_token(candidate).ok_or_else(|| CliParseError::NoVersion(text.into()))
}

/// Reads `M.m[.p]` at the start of a token such as `3.0.11-1+deb13u4` or `3.2-dev5`.
fn parse_version_token(tok: &str) -> Option<Version> {
    let core: &str = tok.split(|c: char| !(c.is_ascii_digit() || c == '.')).next()?;
    let mut parts = core.split('.').filter(|p| !p.is_empty());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    Some((major, minor, patch))
}

/// What a successful reply to one runtime command looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Silence: the reply holds only whitespace (one line per command on a multi-command line).
    Empty,
    /// The reply's first line starts with one of these.
    Starts(&'static [&'static str]),
    /// The reply's last non-empty line is exactly this.
    LastLine(&'static str),
}

/// Checks a command's reply against what its success looks like: `Ok(text)` with severity tags
/// removed and trimmed, else `Err(text)` (HAProxy's words; empty when it said nothing). A reply
/// carries no status code: error-tagged lines (`[3]: …`, 3.0 with `set severity-output number`),
/// "Unknown command" and any text the success form does not allow all fail, which also catches the
/// untagged errors 2.6 sends through the master (`No such server.`).
pub fn check_reply(reply: &str, expect: Expect) -> Result<String, String> {
    let mut error_tag = false;
    let lines: Vec<&str> = reply
        .lines()
        .map(|l| match strip_severity_tag(l) {
            Some((level, rest)) => {
                error_tag |= level <= 3;
                rest
            }
            None => l,
        })
        .collect();
    let text = lines.join("\n").trim().to_string();
    if error_tag || text.contains("Unknown command") {
        return Err(text);
    }
    let ok = match expect {
        Expect::Empty => text.is_empty(),
        Expect::Starts(prefixes) => {
            let first = text.lines().next().unwrap_or("");
            prefixes.iter().any(|p| first.starts_with(p))
        }
        Expect::LastLine(last) => text.lines().rev().find(|l| !l.trim().is_empty()).map(str::trim) == Some(last),
    };
    if ok {
        Ok(text)
    } else {
        Err(text)
    }
}

/// Splits a leading `[N]: ` severity tag (from `set severity-output number`) off a reply line.
pub fn strip_severity_tag(line: &str) -> Option<(u8, &str)> {
    let rest = line.strip_prefix('[')?;
    let (num, rest) = rest.split_once("]: ").or_else(|| rest.split_once("]:"))?;
    Some((num.parse().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_26: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
2921            master          0 [failed: 0]   0d00h00m01s     2.6.12-1+deb12u4\n\
# workers\n\
2925            worker          0               0d00h00m01s     2.6.12-1+deb12u4\n\
# programs\n\
\n";

    const PROC_26_FAILED: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
2921            master          2 [failed: 1]   0d00h00m03s     2.6.12-1+deb12u4\n\
# workers\n\
3104            worker          1               0d00h00m02s     2.6.12-1+deb12u4\n\
# programs\n\
\n";

    const PROC_26_OLD: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
4640            master          1 [failed: 0]   0d00h00m02s     2.6.12-1+deb12u4\n\
# workers\n\
4775            worker          0               0d00h00m01s     2.6.12-1+deb12u4\n\
# old workers\n\
4666            worker          1               0d00h00m02s     2.6.12-1+deb12u4\n\
# programs\n\
\n";

    const PROC_30_OLD: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
4914            master          1 [failed: 0]   0d00h00m02s     3.0.11-1+deb13u4\n\
# workers\n\
5048            worker          0               0d00h00m01s     3.0.11-1+deb13u4\n\
# old workers\n\
4928            worker          1               0d00h00m02s     3.0.11-1+deb13u4\n\
# programs\n\
\n";

    /// 3.2.0 quirk: after a failed reload `# workers` is empty.
    const PROC_32_QUIRK: &str = "#<PID>          <type>          <reloads>       <uptime>        <version>      \n\
100             master          2 [failed: 1]   1d02h03m04s     3.2.0\n\
# workers\n\
# old workers\n\
200             worker          1               0d00h00m09s     3.2.0\n\
# programs\n\
\n";

    #[test]
    fn show_proc_26() {
        let p = parse_show_proc(PROC_26).unwrap();
        assert_eq!(p.master_pid(), 2921);
        assert_eq!(p.master_reloads(), 0);
        assert_eq!(p.failed_reloads, 0);
        assert_eq!(p.master.version, "2.6.12-1+deb12u4");
        assert_eq!(p.master.uptime_secs(), Some(1));
        let w = p.current_worker().unwrap();
        assert_eq!((w.pid, w.reloads, w.kind.as_str()), (2925, 0, "worker"));
        assert!(p.old_workers.is_empty());
        assert!(p.programs.is_empty());
    }

    #[test]
    fn show_proc_26_failed_reload() {
        let p = parse_show_proc(PROC_26_FAILED).unwrap();
        assert_eq!((p.master_reloads(), p.failed_reloads), (2, 1));
        assert_eq!(p.current_worker().unwrap().pid, 3104);
        assert_eq!(p.current_worker().unwrap().reloads, 1);
    }

    #[test]
    fn show_proc_old_workers_both_versions() {
        for (text, cur, old) in [(PROC_26_OLD, 4775, 4666), (PROC_30_OLD, 5048, 4928)] {
            let p = parse_show_proc(text).unwrap();
            assert_eq!(p.current_worker().unwrap().pid, cur);
            assert_eq!(p.old_workers.len(), 1);
            assert_eq!(p.old_workers[0].pid, old);
            assert_eq!(p.old_workers[0].reloads, 1);
            assert_eq!(p.all_worker_pids(), vec![cur, old]);
        }
    }

    #[test]
    fn show_proc_3x_quirk_serving_worker_under_old() {
        let p = parse_show_proc(PROC_32_QUIRK).unwrap();
        assert!(p.current_worker().is_none());
        assert_eq!(p.serving_worker().unwrap().pid, 200);
        assert_eq!(p.failed_reloads, 1);
        assert_eq!(p.master.uptime_secs(), Some(86_400 + 2 * 3600 + 3 * 60 + 4));
    }

    #[test]
    fn show_proc_errors() {
        assert!(matches!(parse_show_proc(""), Err(CliParseError::NoMaster(_))));
        assert!(matches!(parse_show_proc("Unknown command, but maybe\n"), Err(CliParseError::BadProcLine(_))));
    }

    #[test]
    fn reload_reply_30_success() {
        let text = "Success=1\n--\n[NOTICE]   (3519) : New worker (3701) forked\n\
[NOTICE]   (3519) : Loading success.\n\
[NOTICE]   (3519) : haproxy version is 3.0.11-1+deb13u4\n\
[NOTICE]   (3519) : path to executable is /work/main/target/haproxy/3.0/haproxy\n\
[WARNING]  (3519) : Former worker (3523) exited with code 0 (Exit)\n\n";
        match parse_reload_reply(text) {
            ReloadReply::Success { logs } => {
                assert!(logs.starts_with("[NOTICE]   (3519) : New worker (3701) forked"));
                assert!(logs.ends_with("(Exit)"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reload_reply_30_failure() {
        let text = "Success=0\n--\n[NOTICE]   (3519) : haproxy version is 3.0.11-1+deb13u4\n\
[NOTICE]   (3519) : path to executable is /work/main/target/haproxy/3.0/haproxy\n\
[ALERT]    (3519) : config : parsing [haproxy.cfg:13] : unknown keyword 'broken' in 'frontend' section\n\
[ALERT]    (3519) : config : Error(s) found in configuration file : haproxy.cfg\n\
[ALERT]    (3519) : config : Fatal errors found in configuration.\n\
[WARNING]  (3519) : Loading failure!\n\n";
        match parse_reload_reply(text) {
            ReloadReply::Failure { logs } => {
                assert!(logs.contains("[ALERT]    (3519) : config : parsing [haproxy.cfg:13]"));
                assert!(logs.ends_with("Loading failure!"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reload_reply_other_forms() {
        assert_eq!(parse_reload_reply(""), ReloadReply::NoStatus);
        assert_eq!(parse_reload_reply("\n"), ReloadReply::NoStatus);
        assert_eq!(
            parse_reload_reply("Success=0\n--\nAnother reload is still in progress.\n"),
            ReloadReply::InProgress
        );
        assert!(matches!(parse_reload_reply("Unknown command\n"), ReloadReply::Unrecognized(_)));
        assert_eq!(parse_reload_reply("Success=1\n"), ReloadReply::Success { logs: String::new() });
    }

    #[test]
    fn show_info_26() {
        let text = "Name: HAProxy\nVersion: 2.6.12-1+deb12u4\nRelease_date: 2026/10/17\nNbthread: 2\n\
Nbproc: 1\nProcess_num: 1\nPid: 2925\nUptime: 0d 0h00m01s\nUptime_sec: 1\n\
description: cfggen=abc\nStopping: 0\nnode: \n\n";
        let i = parse_show_info(text);
        assert_eq!(i.pid(), Some(2925));
        assert_eq!(i.stopping(), Some(false));
        assert_eq!(i.description(), Some("cfggen=abc"));
        assert_eq!(i.version(), Some("2.6.12-1+deb12u4"));
        assert_eq!(i.uptime_secs(), Some(1));
        assert_eq!(i.get("Uptime"), Some("0d 0h00m01s"));
        assert_eq!(i.get("node"), Some(""));
        let old = parse_show_info("Pid: 4666\nStopping: 1\n");
        assert_eq!(old.stopping(), Some(true));
        assert_eq!(parse_show_info("").pid(), None);
    }

    #[test]
    fn versions() {
        let v26 = "HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/\n\
Status: long-term supported branch - will stop receiving fixes around Q2 2027.\n";
        let v30 = "HAProxy version 3.0.11-1+deb13u4 2026/10/15 - https://haproxy.org/\n";
        assert_eq!(parse_version(v26).unwrap(), (2, 6, 12));
        assert_eq!(parse_version(v30).unwrap(), (3, 0, 11));
        assert_eq!(parse_version("2.6.12-1+deb12u4\n\n").unwrap(), (2, 6, 12));
        assert_eq!(parse_version("3.0.11-1+deb13u4\n").unwrap(), (3, 0, 11));
        assert_eq!(parse_version("3.2-dev5\n").unwrap(), (3, 2, 0));
        assert!(parse_version("").is_err());
        assert!(parse_version("hello world").is_err());
    }

    #[test]
    fn replies_are_checked_against_their_success_form() {
        // Captured from 3.0 with `set severity-output number;` and from 2.6 through the master.
        assert_eq!(check_reply("\n\n", Expect::Empty), Ok(String::new()));
        let ip = "\n[4]: IP changed from '127.0.0.1' to '127.0.0.2' by 'stats socket command'\n\n";
        assert!(check_reply(ip, Expect::Starts(&["IP changed from"])).unwrap().starts_with("IP changed"));
        assert_eq!(check_reply("\n[3]: No such server.\n\n", Expect::Empty), Err("No such server.".into()));
        assert_eq!(check_reply("No such server.\n", Expect::Empty), Err("No such server.".into()));
        let unk = "\n[6]: Unknown command: 'foo', but maybe one of the following ones is a better match:\n  quit\n\n";
        assert!(check_reply(unk, Expect::Empty).is_err());
        assert!(check_reply("Committing certs/a.pem.\nSuccess!\n\n", Expect::LastLine("Success!")).is_ok());
        assert_eq!(strip_severity_tag("[3]: x"), Some((3, "x")));
        assert_eq!(strip_severity_tag("[x]: y"), None);
    }
}
