//! Config snippets written by namespace users (an Ingress annotation such as
//! `configuration-snippet`): what such text may contain before it joins a rendered section.
//!
//! Owns the allow-list ([`allowed_directives`], [`allowed_actions`]) of what a snippet may say
//! in the section it lands in (today only a backend, [`Section::Backend`]), and the words refused
//! even inside an allowed line ([`DENIED`]). Each line is read into words by
//! [`crate::words::split`] exactly as HAProxy reads it (every `isspace` byte, quotes, escapes), and
//! that refuses every control byte but `\t`, every `$`, every line continuation and any escape
//! whose reading is not certain. Then a line is refused when its first word starts with `.` (a
//! preprocessor line), when its directive or action is not on the allow-list, when any word is
//! on the deny list (file references, maps, Lua, the environment, other objects' state), or when
//! it holds a regular expression anywhere but the pattern of a `replace-*` action, which must
//! pass [`crate::regex::check`]. So a snippet can never leave its section, name a file, run or
//! load code, or change what other objects share. It also builds the one-section config that
//! `haproxy -c` checks a snippet in ([`check_config`]). It must never judge the admin's own
//! template or snippets (an admin resource, unrestricted), and never rewrite a snippet: text
//! that fails a rule is refused as a whole. Pure: no I/O.

use std::fmt;

use crate::regex::RegexError;
use crate::words::WordsError;

/// The section a snippet lands in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// One backend (the Service port's), where `configuration-snippet` and `server-snippet` go.
    Backend,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Backend => "backend",
        })
    }
}

/// Why a denied word is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// It loads or runs code in HAProxy.
    LoadsCode,
    /// It reads the environment.
    ReadsTheEnvironment,
    /// It reads a file from the pod's disk.
    ReadsAFile,
    /// It changes state every object shares (maps, ACLs, `proc.` variables, stick counters).
    ChangesSharedState,
    /// It reads what another object owns (a userlist, another backend's stick table).
    ReadsOtherObjects,
    /// It matches a regular expression where the snippet's regexes are not checked.
    UncheckedRegex,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::LoadsCode => "loads or runs code",
            Why::ReadsTheEnvironment => "reads the environment",
            Why::ReadsAFile => "reads a file from the pod",
            Why::ChangesSharedState => "changes state other objects share",
            Why::ReadsOtherObjects => "reads what other objects own",
            Why::UncheckedRegex => {
                "matches a regular expression outside a replace-* pattern (the only place a snippet's regexes are checked)"
            }
        })
    }
}

/// How a [`DENIED`] entry matches a word (compared in ASCII lowercase, after unquoting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The word is exactly this.
    Word(&'static str),
    /// The word is exactly this, compared with case (`-M` and `-m` differ).
    CaseWord(&'static str),
    /// A sample fetch, converter or action name used anywhere in a word: this text at the
    /// word's start or right after a character that cannot be part of a name (`%[env(HOME)]`,
    /// `,lua.f`, `path,map_str(x)`).
    Name(&'static str),
    /// This text anywhere in the word.
    Inside(&'static str),
}

/// The words refused anywhere in a snippet line, even an allowed one, and why.
pub const DENIED: &[(Match, Why)] = &[
    (Match::CaseWord("-f"), Why::ReadsAFile),
    (Match::CaseWord("-M"), Why::ReadsAFile),
    (Match::Word("file"), Why::ReadsAFile),
    (Match::Word("lf-file"), Why::ReadsAFile),
    (Match::Word("errorfile"), Why::ReadsAFile),
    (Match::Word("errorfiles"), Why::ReadsAFile),
    (Match::Word("default-errorfiles"), Why::ReadsAFile),
    (Match::Name("map("), Why::ReadsAFile),
    (Match::Name("map_"), Why::ReadsAFile),
    (Match::Name("lua."), Why::LoadsCode),
    (Match::Name("use-service"), Why::LoadsCode),
    (Match::Name("env("), Why::ReadsTheEnvironment),
    (Match::Name("set-map("), Why::ChangesSharedState),
    (Match::Name("del-map("), Why::ChangesSharedState),
    (Match::Name("add-acl("), Why::ChangesSharedState),
    (Match::Name("del-acl("), Why::ChangesSharedState),
    (Match::Name("proc."), Why::ChangesSharedState),
    (Match::Inside("inc_gpc"), Why::ChangesSharedState),
    (Match::Inside("clr_gpc"), Why::ChangesSharedState),
    (Match::Name("track-sc"), Why::ChangesSharedState),
    (Match::Name("table_"), Why::ReadsOtherObjects),
    (Match::Name("http_auth"), Why::ReadsOtherObjects),
    (Match::Word("reg"), Why::UncheckedRegex),
    (Match::Inside("_reg"), Why::UncheckedRegex),
    (Match::Name("regsub("), Why::UncheckedRegex),
];

/// The directives a snippet may use in `section`.
pub fn allowed_directives(section: Section) -> &'static [&'static str] {
    match section {
        Section::Backend => &[
            "http-request",
            "http-response",
            "http-after-response",
            "timeout",
            "acl",
            "retries",
            "retry-on",
            "option",
            "balance",
            "hash-type",
        ],
    }
}

/// The actions a snippet may use after `directive` (`http-request`, `http-response`,
/// `http-after-response`). `set-var`, `set-var-fmt` and `unset-var` only on the `txn.`,
/// `req.`, `res.` and `sess.` scopes.
pub fn allowed_actions(directive: &str) -> &'static [&'static str] {
    const HEADERS: [&str; 5] = ["set-header", "add-header", "del-header", "replace-header", "replace-value"];
    match directive {
        "http-request" => &[
            "set-header",
            "add-header",
            "del-header",
            "replace-header",
            "replace-value",
            "set-path",
            "set-pathq",
            "set-query",
            "replace-path",
            "replace-pathq",
            "set-method",
            "deny",
            "allow",
            "return",
            "redirect",
            "auth",
            "tarpit",
            "set-log-level",
            "set-var",
            "set-var-fmt",
            "unset-var",
        ],
        "http-response" => &[
            HEADERS[0],
            HEADERS[1],
            HEADERS[2],
            HEADERS[3],
            HEADERS[4],
            "set-status",
            "deny",
            "allow",
            "return",
            "redirect",
            "set-log-level",
            "set-var",
            "set-var-fmt",
            "unset-var",
        ],
        "http-after-response" => &[
            HEADERS[0],
            HEADERS[1],
            HEADERS[2],
            HEADERS[3],
            HEADERS[4],
            "set-status",
            "allow",
            "set-log-level",
            "set-var",
            "set-var-fmt",
            "unset-var",
        ],
        _ => &[],
    }
}

/// The `timeout` kinds a snippet may set.
pub const TIMEOUTS: &[&str] = &["server", "connect", "queue", "tunnel", "http-request", "http-keep-alive", "check"];
/// The `option`s a snippet may set.
pub const OPTIONS: &[&str] = &["forwardfor", "http-server-close", "http-keep-alive", "redispatch"];
/// The `balance` algorithms a snippet may pick (and `hdr(<name>)`).
pub const BALANCE: &[&str] = &["roundrobin", "static-rr", "leastconn", "first", "source", "random", "uri", "url_param"];
/// The words of a `hash-type` line.
pub const HASH_TYPE: &[&str] = &["map-based", "consistent", "sdbm", "djb2", "wt6", "crc32", "none", "avalanche"];
/// The variable scopes `set-var`, `set-var-fmt` and `unset-var` may write.
pub const VAR_SCOPES: &[&str] = &["txn", "req", "res", "sess"];

/// Why a snippet is refused. Lines count from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnippetError {
    /// A line that cannot be read into words with certainty (a control byte, `$`, an unclosed
    /// quote, a continuation, an uncertain escape).
    #[error("line {line}: {error}")]
    Words {
        /// The line.
        line: usize,
        /// What in it.
        error: WordsError,
    },
    /// A line HAProxy's preprocessor reads (`.if`, `.diag`, …).
    #[error("line {line}: {word:?} is a preprocessor directive, which a snippet may not use")]
    Preprocessor {
        /// The line.
        line: usize,
        /// The directive.
        word: String,
    },
    /// A directive not on the allow-list of the section.
    #[error(
        "line {line}: {word:?} is not a directive a snippet may use in a {section} (see the allow-list in the docs)"
    )]
    Directive {
        /// The line.
        line: usize,
        /// The directive, as HAProxy reads it.
        word: String,
        /// The section.
        section: Section,
    },
    /// An allowed directive with an argument or action not on its allow-list.
    #[error("line {line}: {word:?} is not allowed after {directive:?} in a snippet")]
    Argument {
        /// The line.
        line: usize,
        /// The directive.
        directive: String,
        /// The word refused.
        word: String,
    },
    /// A word of the deny list.
    #[error("line {line}: {word:?} is not allowed in a snippet: it {why}")]
    Denied {
        /// The line.
        line: usize,
        /// The word as HAProxy reads it.
        word: String,
        /// Why.
        why: Why,
    },
    /// A `replace-*` pattern outside the accepted regex subset.
    #[error("line {line}: the pattern {word:?} is not an accepted regular expression: {error}")]
    Regex {
        /// The line.
        line: usize,
        /// The pattern.
        word: String,
        /// Why.
        error: RegexError,
    },
}

/// Checks a snippet from an object that lands in `section`: `Ok` when every line reads with
/// certainty and uses only what the allow-list of `section` holds, and no denied word.
pub fn check(text: &str, section: Section) -> Result<(), SnippetError> {
    for (i, line) in text.split('\n').enumerate() {
        let n = i + 1;
        let words = crate::words::split(line).map_err(|error| SnippetError::Words { line: n, error })?;
        let Some(first) = words.first() else { continue };
        if first.starts_with('.') {
            return Err(SnippetError::Preprocessor { line: n, word: first.clone() });
        }
        if !allowed_directives(section).contains(&first.as_str()) {
            return Err(SnippetError::Directive { line: n, word: first.clone(), section });
        }
        for w in &words[1..] {
            if let Some(why) = denied(w) {
                return Err(SnippetError::Denied { line: n, word: w.clone(), why });
            }
        }
        arguments(&words, n)?;
    }
    Ok(())
}

/// Why `word` is denied, if it is.
fn denied(word: &str) -> Option<Why> {
    let lower = word.to_ascii_lowercase();
    DENIED.iter().find_map(|(m, why)| {
        let hit = match m {
            Match::Word(w) => lower == *w,
            Match::CaseWord(w) => word == *w,
            Match::Name(name) => uses_name(&lower, name),
            Match::Inside(s) => lower.contains(s),
        };
        hit.then_some(*why)
    })
}

/// Checks the arguments of an allowed directive's line `words`.
fn arguments(words: &[String], n: usize) -> Result<(), SnippetError> {
    let directive = words[0].as_str();
    let refuse = |w: &str| SnippetError::Argument { line: n, directive: directive.to_string(), word: w.to_string() };
    let second = words.get(1).map(String::as_str).unwrap_or_default();
    let ok = match directive {
        "http-request" | "http-response" | "http-after-response" => return action(words, n),
        "timeout" => words.len() == 3 && TIMEOUTS.contains(&second),
        "option" => OPTIONS.contains(&second),
        "balance" => {
            BALANCE.contains(&second) || (second.starts_with("hdr(") && second.ends_with(')') && words.len() == 2)
        }
        "hash-type" => {
            if let Some(w) = words[1..].iter().find(|w| !HASH_TYPE.contains(&w.as_str())) {
                return Err(refuse(w));
            }
            true
        }
        "retries" => words.len() == 2 && !second.is_empty() && second.bytes().all(|b| b.is_ascii_digit()),
        "retry-on" => {
            words.len() >= 2 && words[1..].iter().all(|w| w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        }
        "acl" => words.len() >= 3,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(refuse(words.get(1).map(String::as_str).unwrap_or(directive)))
    }
}

/// Checks an `http-request`/`http-response`/`http-after-response` line's action, its variable
/// scope and its `replace-*` pattern.
fn action(words: &[String], n: usize) -> Result<(), SnippetError> {
    let directive = words[0].as_str();
    let word = words.get(1).map(String::as_str).unwrap_or_default();
    let refuse = || SnippetError::Argument { line: n, directive: directive.to_string(), word: word.to_string() };
    let (name, args) = match word.split_once('(') {
        Some((name, rest)) => (name, Some(rest.strip_suffix(')').ok_or_else(refuse)?)),
        None => (word, None),
    };
    if !allowed_actions(directive).contains(&name) {
        return Err(refuse());
    }
    match (name, args) {
        ("set-var" | "set-var-fmt" | "unset-var", Some(args)) => {
            let scope = args.split('.').next().unwrap_or_default();
            if !VAR_SCOPES.contains(&scope) || !args.contains('.') {
                return Err(refuse());
            }
        }
        ("set-var" | "set-var-fmt" | "unset-var", None) | (_, Some(_)) => return Err(refuse()),
        _ => {}
    }
    // The pattern's place: replace-path <re> <fmt>; replace-header <name> <re> <fmt>.
    let pattern = match name {
        "replace-path" | "replace-pathq" => words.get(2),
        "replace-header" | "replace-value" => words.get(3),
        _ => None,
    };
    if let Some(p) = pattern {
        crate::regex::check(p).map_err(|error| SnippetError::Regex { line: n, word: p.clone(), error })?;
    }
    Ok(())
}

/// Whether `word` uses `name` as a name: at its start, or after a character no name holds.
fn uses_name(word: &str, name: &str) -> bool {
    word.match_indices(name).any(|(at, _)| {
        word[..at].chars().next_back().is_none_or(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    })
}

/// The config `haproxy -c` checks a snippet in: the snippet alone in one backend (where an
/// object's snippet goes: a backend serves one namespace's Service, so its rules see only that
/// Service's traffic), so an error it holds is reported as its own and not as the render's.
pub fn check_config(text: &str) -> String {
    format!(
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\n\
         backend snippet_check\n{text}\n"
    )
}

/// Whether `haproxy -c` over [`check_config`] passed, by its exit code: 0, or 2, which HAProxy
/// returns for a config that is valid but has no listener (as that one has none).
pub fn check_passed(exit_code: Option<i32>) -> bool {
    matches!(exit_code, Some(0 | 2))
}

#[cfg(test)]
mod tests;
