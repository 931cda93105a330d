//! What `haproxy -c` said, as typed findings: the one reader of its output for the gate, the
//! per-snippet check and the agent's check.
//!
//! Owns the summary of a run ([`summarize`]: passed or refused, by which exit codes pass for
//! what was checked, with the findings that may be shown, or why it did not finish), parsing HAProxy's `[ALERT]`/`[WARNING]`/`[NOTICE]` lines into [`Finding`]s (severity,
//! file, line, message) without the process id and the check directory's path, keeping only the
//! findings about a snippet's own lines (renumbered from the snippet's first line), and the
//! bounds every message shown to a namespace user gets: at most [`MAX_MESSAGE`] bytes, and never
//! a message that quotes the content of a file the line loaded. Pure: no I/O. It must never
//! decide whether a check passed (the exit code does) and never let a finding about another
//! file or line through [`snippet_findings`].

use std::fmt;
use std::process::ExitStatus;
use std::time::Duration;

/// The longest message kept, in bytes (longer ones are cut at a character boundary).
pub const MAX_MESSAGE: usize = 300;

/// The longest text [`words`] returns, in bytes.
pub const MAX_WORDS: usize = 512;

/// What a message that quoted a loaded file's content is replaced with.
pub const FILE_CONTENT_REDACTED: &str =
    "HAProxy refused the content of a file this line loads (the content is not shown)";

/// A finding's severity, from its `[ALERT]`, `[WARNING]`, `[NOTICE]` or `[DIAG]` tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// `[ALERT]`: the config is refused.
    Alert,
    /// `[WARNING]`.
    Warning,
    /// `[NOTICE]` (version, path to the executable).
    Notice,
    /// `[DIAG]`.
    Diag,
}

/// One thing `haproxy -c` said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Its severity.
    pub severity: Severity,
    /// The config file it is about, relative to the check directory (`haproxy.cfg`), if named.
    pub file: Option<String>,
    /// The line of `file` it is about, if named.
    pub line: Option<u32>,
    /// HAProxy's words, without the location, at most [`MAX_MESSAGE`] bytes.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{file} line {line}: {}", self.message),
            (Some(file), None) => write!(f, "{file}: {}", self.message),
            (None, Some(line)) => write!(f, "line {line}: {}", self.message),
            (None, None) => f.write_str(&self.message),
        }
    }
}

impl Finding {
    /// The finding as one line in HAProxy's own shape (`[ALERT] parsing [file:line] : message`),
    /// without a process id; [`parse`] reads it back to the same finding.
    pub fn to_haproxy_line(&self) -> String {
        let tag = match self.severity {
            Severity::Alert => "ALERT",
            Severity::Warning => "WARNING",
            Severity::Notice => "NOTICE",
            Severity::Diag => "DIAG",
        };
        match (&self.file, self.line) {
            (Some(file), Some(line)) => format!("[{tag}] parsing [{file}:{line}] : {}", self.message),
            _ => format!("[{tag}] {}", self.message),
        }
    }
}

/// The alerts and warnings of `findings` in HAProxy's shape ([`Finding::to_haproxy_line`]), one
/// a line, each message redacted ([`redacted`]): what the gate reports of a refused render.
pub fn report(findings: &[Finding]) -> String {
    let lines: Vec<String> = findings
        .iter()
        .filter(|f| f.severity <= Severity::Warning)
        .map(|f| redacted(f.clone()).to_haproxy_line())
        .collect();
    lines.join("\n")
}

/// The findings in `output`, in order. `root` (the check directory) is removed from paths:
/// `root/x` becomes `x`, `root` alone `.`. Lines without a severity tag are dropped, except an
/// indented line right after a finding, which continues its message. HAProxy's closing summary
/// (`Error(s) found …`, `Fatal errors found …`) is dropped: it says nothing the exit code does not.
pub fn parse(output: &str, root: Option<&str>) -> Vec<Finding> {
    let strip = |s: &str| -> String {
        match root.map(|r| r.trim_end_matches('/')).filter(|r| !r.is_empty()) {
            Some(r) => s.replace(&format!("{r}/"), "").replace(r, "."),
            None => s.to_string(),
        }
    };
    let mut out: Vec<Finding> = Vec::new();
    let mut continues = false;
    for raw in output.lines() {
        let Some((severity, rest)) = tag(raw.trim_start()) else {
            let cont = raw.starts_with([' ', '\t']) && !raw.trim().is_empty();
            if let (true, true, Some(last)) = (cont, continues, out.last_mut()) {
                last.message = cap(&format!("{} {}", last.message, strip(raw.trim())));
            }
            continue;
        };
        let rest = strip(without_pid(rest));
        let rest = rest.strip_prefix("config :").map_or(rest.as_str(), str::trim_start);
        continues = !is_summary(rest);
        if !continues {
            continue;
        }
        let (file, line, message) = location(rest);
        out.push(Finding { severity, file, line, message: cap(&message) });
    }
    out
}

fn tag(l: &str) -> Option<(Severity, &str)> {
    let (t, rest) = l.strip_prefix('[')?.split_once(']')?;
    let s = match t {
        "ALERT" => Severity::Alert,
        "WARNING" => Severity::Warning,
        "NOTICE" => Severity::Notice,
        "DIAG" => Severity::Diag,
        _ => return None,
    };
    Some((s, rest.trim_start()))
}

/// `(1234) : rest` → `rest`.
fn without_pid(s: &str) -> &str {
    match s.strip_prefix('(').and_then(|r| r.split_once(')')) {
        Some((pid, r)) if pid.chars().all(|c| c.is_ascii_digit()) => {
            r.trim_start().trim_start_matches(':').trim_start()
        }
        _ => s,
    }
}

fn is_summary(rest: &str) -> bool {
    rest.starts_with("Error(s) found in configuration file") || rest.starts_with("Fatal errors found in configuration")
}

/// The first `[file:line]` in `rest` (after `parsing ` when present) and the message around it.
fn location(rest: &str) -> (Option<String>, Option<u32>, String) {
    let mut from = 0;
    while let Some(open) = rest[from..].find('[').map(|i| i + from) {
        let Some(close) = rest[open..].find(']').map(|i| i + open) else { break };
        let inside = &rest[open + 1..close];
        if let Some((file, n)) = inside.rsplit_once(':') {
            if let (Ok(line), false) = (n.parse::<u32>(), file.is_empty() || file.contains(char::is_whitespace)) {
                let before = rest[..open].trim_end();
                let before = before.strip_suffix("parsing").unwrap_or(before).trim_end();
                let after = rest[close + 1..].trim_start().trim_start_matches(':').trim_start();
                let message = match before.trim_end_matches(':').trim_end() {
                    "" => after.to_string(),
                    b => format!("{b} {after}"),
                };
                return (Some(file.to_string()), Some(line), message);
            }
        }
        from = close + 1;
    }
    (None, None, rest.to_string())
}

/// `s` cut to [`MAX_MESSAGE`] bytes at a character boundary (marked with `…`).
fn cap(s: &str) -> String {
    cut(s, MAX_MESSAGE)
}

/// `s` cut to `max` bytes at a character boundary (marked with `…`).
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Whether a message quotes what HAProxy read from a file the line loads (an ACL, map or
/// pattern file: `… at line N of file '…'`).
pub fn quotes_file_content(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains(" of file") || m.contains("in file '") || m.contains("line content")
}

/// `f` with its message replaced by [`FILE_CONTENT_REDACTED`] when it quotes a file's content.
pub fn redacted(mut f: Finding) -> Finding {
    if quotes_file_content(&f.message) {
        f.message = FILE_CONTENT_REDACTED.to_string();
    }
    f
}

/// The line (from 1) of `config` on which `snippet` starts, when `config` holds it (the check
/// config built by [`crate::snippet::check_config`] ends with it; otherwise its last occurrence).
pub fn snippet_first_line(config: &str, snippet: &str) -> Option<u32> {
    let at = match config.strip_suffix('\n').and_then(|c| c.strip_suffix(snippet)) {
        Some(prefix) => prefix.len(),
        None => config.rfind(snippet)?,
    };
    Some(config[..at].matches('\n').count() as u32 + 1)
}

/// The alerts and warnings of `findings` about lines `first ..= first + lines - 1` of `file`,
/// renumbered from 1 (the snippet's own lines), redacted ([`redacted`]) and without a file name.
/// Everything else (the wrapper's lines, other files, notices) is dropped.
pub fn snippet_findings(findings: &[Finding], file: &str, first: u32, lines: u32) -> Vec<Finding> {
    findings
        .iter()
        .filter(|f| f.severity <= Severity::Warning && f.file.as_deref() == Some(file))
        .filter_map(|f| {
            let l = f.line?;
            (l >= first && l < first.saturating_add(lines)).then(|| {
                redacted(Finding {
                    severity: f.severity,
                    file: None,
                    line: Some(l - first + 1),
                    message: f.message.clone(),
                })
            })
        })
        .collect()
}

/// The alerts of `findings`, redacted and joined with `; `, at most [`MAX_WORDS`] bytes; when
/// there is none, a fixed sentence (never HAProxy's other output).
pub fn words(findings: &[Finding]) -> String {
    let alerts: Vec<String> =
        findings.iter().filter(|f| f.severity == Severity::Alert).map(|f| redacted(f.clone()).to_string()).collect();
    if alerts.is_empty() {
        return "haproxy -c refused it without an [ALERT] line".to_string();
    }
    cut(&alerts.join("; "), MAX_WORDS)
}

/// How a `haproxy -c` run ended, as its runner saw it (the runner owns the process; this module
/// only reads what it reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The process exited (or died of a signal the runner did not send).
    Exited(ExitStatus),
    /// Killed at the runner's deadline, after this long.
    TimedOut(Duration),
    /// Killed after writing more than this many bytes.
    TooMuchOutput(usize),
}

/// What a run checked: it decides which exit codes pass and which findings are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked<'a> {
    /// A whole config (a render, a staged tree): passes on exit code 0 only; every finding kept.
    Config,
    /// One snippet inside [`crate::snippet::check_config`]'s text `config`, written to `file`
    /// of the check directory: passes on [`crate::snippet::check_passed`] (0, or 2 for a config
    /// without a listener); only findings about the snippet's own lines are kept
    /// ([`snippet_findings`]).
    Snippet {
        /// The whole check config.
        config: &'a str,
        /// The snippet inside it.
        snippet: &'a str,
        /// The file name the config was written to, relative to the check directory.
        file: &'a str,
    },
}

/// What a `haproxy -c` run came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Summary {
    /// It passed; HAProxy's warnings (a valid config may still have some).
    Passed {
        /// The warnings kept for what was checked.
        warnings: Vec<Finding>,
    },
    /// HAProxy refused it.
    Refused {
        /// How it exited.
        status: ExitStatus,
        /// The findings kept for what was checked, in order.
        findings: Vec<Finding>,
    },
    /// It did not finish within this time.
    TimedOut(Duration),
    /// It wrote more than this many bytes of output.
    TooMuchOutput(usize),
}

/// The summary of one run over `checked` that ended as `ending` and wrote `output`; `root` (the
/// check directory) is removed from paths as [`parse`] does.
pub fn summarize(checked: Checked<'_>, ending: Ending, output: &str, root: Option<&str>) -> Summary {
    let status = match ending {
        Ending::Exited(s) => s,
        Ending::TimedOut(d) => return Summary::TimedOut(d),
        Ending::TooMuchOutput(n) => return Summary::TooMuchOutput(n),
    };
    let all = parse(output, root);
    let (passed, findings) = match checked {
        Checked::Config => (status.success(), all),
        Checked::Snippet { config, snippet, file } => {
            let first = snippet_first_line(config, snippet).unwrap_or(u32::MAX);
            let lines = snippet.lines().count().max(1) as u32;
            (crate::snippet::check_passed(status.code()), snippet_findings(&all, file, first, lines))
        }
    };
    if passed {
        Summary::Passed { warnings: findings.into_iter().filter(|f| f.severity == Severity::Warning).collect() }
    } else {
        Summary::Refused { status, findings }
    }
}

impl Summary {
    /// Whether the run passed.
    pub fn passed(&self) -> bool {
        matches!(self, Summary::Passed { .. })
    }

    /// Why the run did not pass, in full: the alerts and warnings one a line ([`report`]), or
    /// how it ended when HAProxy said nothing or did not finish. `None` when it passed. What the
    /// gate and the agent report.
    pub fn refusal(&self) -> Option<String> {
        (!self.passed()).then(|| self.text(false))
    }

    /// Why the run did not pass, short: its alerts joined ([`words`]), or how it ended when it
    /// did not finish. `None` when it passed. What a namespace user sees of a refused snippet.
    pub fn words(&self) -> Option<String> {
        (!self.passed()).then(|| self.text(true))
    }

    /// The warnings when the run passed, else why not ([`Summary::refusal`]).
    pub fn into_result(self) -> Result<Vec<Finding>, String> {
        match self {
            Summary::Passed { warnings } => Ok(warnings),
            other => Err(other.text(false)),
        }
    }

    fn text(&self, short: bool) -> String {
        match self {
            Summary::Passed { .. } => "haproxy -c passed".to_string(),
            Summary::Refused { findings, .. } if short => words(findings),
            Summary::Refused { findings, status } => {
                let text = report(findings);
                if text.is_empty() {
                    format!("haproxy -c exited with {status}")
                } else {
                    text
                }
            }
            Summary::TimedOut(d) => format!("haproxy -c did not finish within {d:?}"),
            Summary::TooMuchOutput(n) => format!("haproxy -c wrote more than {n} bytes of output"),
        }
    }
}

/// HAProxy's words on a refused check, short, from a refusal's text (the gate's [`report`], or a
/// runner's whole output): its alerts ([`words`]) with each file named by its last path
/// component. A text without a single HAProxy line (the gate's own reasons, such as its path
/// rules) is kept, cut to [`MAX_WORDS`] bytes.
pub fn check_words(output: &str) -> String {
    let mut findings = parse(output, None);
    if findings.is_empty() {
        return cut(output.trim(), MAX_WORDS);
    }
    for f in &mut findings {
        f.file = f.file.as_deref().map(|p| p.rsplit('/').next().unwrap_or(p).to_string());
    }
    words(&findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT_26: &str = "[NOTICE]   (22485) : haproxy version is 2.6.12-1+deb12u4\n\
        [NOTICE]   (22485) : path to executable is /usr/sbin/haproxy\n\
        [ALERT]    (22485) : config : parsing [/tmp/x/haproxy.cfg:10] : error detected while parsing ACL 'x' : failed to open pattern file </tmp/s/token>.\n\
        [WARNING]  (22485) : config : parsing [/tmp/x/haproxy.cfg:11] : a rule placed after ...\n\
        [ALERT]    (22485) : config : Error(s) found in configuration file : /tmp/x/haproxy.cfg\n\
        [ALERT]    (22485) : config : Fatal errors found in configuration.\n";

    #[test]
    fn lines_become_findings_without_pid_or_root() {
        let f = parse(OUT_26, Some("/tmp/x"));
        assert_eq!(f.len(), 4, "{f:?}");
        assert_eq!(
            f[0],
            Finding {
                severity: Severity::Notice,
                file: None,
                line: None,
                message: "haproxy version is 2.6.12-1+deb12u4".into()
            }
        );
        assert_eq!(f[2].severity, Severity::Alert);
        assert_eq!((f[2].file.as_deref(), f[2].line), (Some("haproxy.cfg"), Some(10)));
        assert_eq!(f[2].message, "error detected while parsing ACL 'x' : failed to open pattern file </tmp/s/token>.");
        assert_eq!(f[3].to_string(), "haproxy.cfg line 11: a rule placed after ...");
        assert!(!f.iter().any(|f| f.message.contains("/tmp/x")));
    }

    #[test]
    fn a_report_reads_back_to_the_same_findings() {
        let f = parse(OUT_26, Some("/tmp/x"));
        let r = report(&f);
        assert!(!r.contains("NOTICE") && !r.contains("22485"), "{r}");
        assert_eq!(parse(&r, None), f[2..].to_vec());
    }

    #[test]
    fn other_shapes() {
        let f = parse("[ALERT] (1) : config : proxy 'b' : no server named 'x' declared at [haproxy.cfg:7].\n", None);
        assert_eq!((f[0].file.as_deref(), f[0].line), (Some("haproxy.cfg"), Some(7)));
        assert_eq!(f[0].message, "proxy 'b' : no server named 'x' declared at .");
        let f =
            parse("[ALERT] (1) : Cannot open configuration file/directory x.cfg : No such file\n  more words\n", None);
        assert_eq!(f[0].message, "Cannot open configuration file/directory x.cfg : No such file more words");
        let f = parse("[ALERT] (1) : [weird] [a b:3] [c.cfg:x]\nConfiguration file is valid\n", None);
        assert_eq!((f.len(), f[0].file.as_deref()), (1, None));
        assert!(parse("odd\n", None).is_empty());
    }

    #[test]
    fn messages_are_capped() {
        let long = format!("[ALERT] (1) : config : parsing [a.cfg:1] : {}\n", "é".repeat(400));
        let f = parse(&long, None);
        assert!(f[0].message.len() <= MAX_MESSAGE && f[0].message.ends_with('…'));
        assert!(words(&parse(&"[ALERT] (1) : x\n".repeat(200), None)).len() <= MAX_WORDS);
        assert_eq!(words(&[]), "haproxy -c refused it without an [ALERT] line");
    }

    #[test]
    fn a_snippet_sees_only_its_own_lines_and_no_file_content() {
        let config = crate::snippet::check_config("http-request set-header X a\nacl x src -f /etc/passwd");
        let first = snippet_first_line(&config, "http-request set-header X a").unwrap();
        let out = format!(
            "[ALERT] (1) : config : parsing [check.cfg:{}] : 'root:x:0:0:root:/root:/bin/bash' is not a valid IPv4 or IPv6 address at line 1 of file '/etc/passwd'.\n\
             [ALERT] (1) : config : parsing [check.cfg:2] : a wrapper line.\n\
             [ALERT] (1) : config : parsing [other.cfg:{first}] : another file.\n\
             [ALERT] (1) : config : parsing [check.cfg:{first}] : 'http-request set-header' expects exactly 2 arguments.\n\
             [NOTICE] (1) : path to executable is /usr/sbin/haproxy\n",
            first + 1
        );
        let f = snippet_findings(&parse(&out, None), "check.cfg", first, 2);
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].to_string(), format!("line 2: {FILE_CONTENT_REDACTED}"));
        assert_eq!(f[1].to_string(), "line 1: 'http-request set-header' expects exactly 2 arguments.");
        assert!(!f.iter().any(|f| f.message.contains("root:x")));
        assert_eq!(snippet_findings(&parse(&out, None), "check.cfg", first, 1).len(), 1);
        // A snippet that repeats the wrapper's own words is still found at its own line.
        let c = crate::snippet::check_config("mode http");
        assert_eq!(snippet_first_line(&c, "mode http"), Some(c.lines().count() as u32));
    }

    #[test]
    fn check_words_keep_the_alerts_only() {
        let out = "[NOTICE]   (1) : haproxy version is 2.6.12\n[ALERT]    (27303) : config : parsing [/tmp/x/haproxy.cfg:8] : 'http-request set-header' expects exactly 2 arguments.\n[ALERT]    (27303) : config : Error(s) found in configuration file : /tmp/x/haproxy.cfg\n[ALERT]    (27303) : config : Fatal errors found in configuration.\n";
        assert_eq!(check_words(out), "haproxy.cfg line 8: 'http-request set-header' expects exactly 2 arguments.");
        assert_eq!(check_words("odd"), "odd");
        assert_eq!(check_words("[NOTICE] (1) : only this\n"), "haproxy -c refused it without an [ALERT] line");
        assert!(check_words(&"[ALERT] (1) : x".repeat(200)).len() <= 512);
    }

    fn exited(code: i32) -> Ending {
        use std::os::unix::process::ExitStatusExt;
        Ending::Exited(ExitStatus::from_raw(code << 8))
    }

    #[test]
    fn a_config_passes_on_zero_only_and_keeps_its_warnings() {
        let s = summarize(Checked::Config, exited(0), OUT_26, Some("/tmp/x"));
        assert!(s.passed() && s.refusal().is_none() && s.words().is_none());
        let warnings = s.into_result().unwrap();
        assert_eq!(
            warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["haproxy.cfg line 11: a rule placed after ..."]
        );
        let s = summarize(Checked::Config, exited(2), OUT_26, Some("/tmp/x"));
        assert!(!s.passed());
        assert_eq!(s.refusal().unwrap(), report(&parse(OUT_26, Some("/tmp/x"))));
        assert_eq!(s.words().unwrap(), words(&parse(OUT_26, Some("/tmp/x"))));
        let s = summarize(Checked::Config, exited(1), "[NOTICE] (1) : nothing\n", None);
        assert_eq!(s.refusal().unwrap(), "haproxy -c exited with exit status: 1");
        assert_eq!(s.into_result(), Err("haproxy -c exited with exit status: 1".to_string()));
    }

    #[test]
    fn a_run_that_did_not_finish_says_how() {
        for checked in [Checked::Config, Checked::Snippet { config: "", snippet: "", file: "check.cfg" }] {
            let s = summarize(checked, Ending::TimedOut(Duration::from_secs(3)), "[ALERT] (1) : x\n", None);
            assert_eq!(s, Summary::TimedOut(Duration::from_secs(3)));
            assert_eq!(s.refusal().unwrap(), "haproxy -c did not finish within 3s");
            let s = summarize(checked, Ending::TooMuchOutput(9), "", None);
            assert_eq!(s.words().unwrap(), "haproxy -c wrote more than 9 bytes of output");
        }
    }

    #[test]
    fn a_snippet_passes_on_two_and_sees_only_its_own_lines() {
        let snippet = "http-request set-header X";
        let config = crate::snippet::check_config(snippet);
        let first = snippet_first_line(&config, snippet).unwrap();
        let checked = Checked::Snippet { config: &config, snippet, file: "check.cfg" };
        assert!(summarize(checked, exited(2), "", Some("/d")).passed());
        let out = format!(
            "[ALERT] (1) : config : parsing [/d/check.cfg:{first}] : 'http-request set-header' expects exactly 2 arguments.\n\
             [ALERT] (1) : config : parsing [/d/check.cfg:1] : a wrapper line.\n"
        );
        let s = summarize(checked, exited(1), &out, Some("/d"));
        assert_eq!(s.words().unwrap(), "line 1: 'http-request set-header' expects exactly 2 arguments.");
    }

    proptest::proptest! {
        /// Whatever HAProxy prints, a snippet sees only findings on its own lines, numbered from
        /// 1, capped, and never a line of another file.
        #[test]
        fn snippet_findings_stay_inside_the_snippet(
            lines in proptest::collection::vec((0u32..40, "[a-z]{1,3}\\.cfg", ".{0,400}"), 0..20),
            first in 1u32..30,
            count in 1u32..10,
        ) {
            let out: String = lines
                .iter()
                .map(|(n, file, msg)| format!("[ALERT] (7) : config : parsing [{file}:{n}] : {msg}\n"))
                .collect();
            for f in snippet_findings(&parse(&out, None), "ab.cfg", first, count) {
                let l = f.line.unwrap();
                proptest::prop_assert!(l >= 1 && l <= count);
                proptest::prop_assert!(f.message.len() <= MAX_MESSAGE);
                proptest::prop_assert!(f.file.is_none());
                proptest::prop_assert!(lines.iter().any(|(n, file, _)| file == "ab.cfg" && *n == first + l - 1));
            }
        }
    }
}
