//! Config snippets written by namespace users (an Ingress annotation such as
//! `configuration-snippet`): what such text may contain before it joins a rendered backend.
//!
//! Owns the deny list ([`DENIED`]) of what would give the author of an object more than its own
//! section: directives and actions that run a program, load code, read the environment or files,
//! change state shared with other objects (maps and ACLs at runtime, process-wide variables, the
//! stats page and its admin mode), or leave
//! the section (a section keyword, a preprocessor line). Every word is checked as HAProxy reads
//! it (quotes removed, `\` escapes decoded), so quoting a keyword does not hide it. It also builds
//! the one-section config that `haproxy -c` checks a snippet in ([`check_config`]). It must never
//! judge the admin's own template or snippets (an admin resource, unrestricted), and never
//! rewrite a snippet: text that fails a rule is refused as a whole. Pure: no I/O.

use std::fmt;

/// Why a denied word is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// It runs a program.
    RunsAProgram,
    /// It loads code into HAProxy.
    LoadsCode,
    /// It reads or changes the environment.
    ReadsTheEnvironment,
    /// It reads a file from the pod's disk.
    ReadsAFile,
    /// It changes state every object shares (maps, ACLs, `proc.` variables, other backends' servers).
    ChangesSharedState,
    /// It leaves the snippet's section.
    LeavesTheSection,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::RunsAProgram => "runs a program",
            Why::LoadsCode => "loads code",
            Why::ReadsTheEnvironment => "reads the environment",
            Why::ReadsAFile => "reads a file from the pod",
            Why::ChangesSharedState => "changes state other objects share",
            Why::LeavesTheSection => "leaves the snippet's section",
        })
    }
}

/// How a [`DENIED`] entry matches a word (after unquoting, compared in ASCII lowercase).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The line's first word is exactly this (a directive or section keyword).
    Directive(&'static str),
    /// Any word is exactly this (an option name, an action argument).
    Word(&'static str),
    /// Any word starts with this (an action with an argument, `set-map(…)`).
    WordPrefix(&'static str),
    /// A sample fetch or action family used anywhere in a word: this name at the word's start or
    /// right after a character that cannot be part of a name (`%[env(HOME)]`, `,lua.f`).
    Name(&'static str),
}

/// The deny list: each entry, and why.
pub const DENIED: &[(Match, Why)] = &[
    (Match::Directive("external-check"), Why::RunsAProgram),
    (Match::Word("external-check"), Why::RunsAProgram),
    (Match::Directive("command"), Why::RunsAProgram),
    (Match::Directive("insecure-fork-wanted"), Why::RunsAProgram),
    (Match::Directive("insecure-setuid-wanted"), Why::RunsAProgram),
    (Match::Directive("lua-load"), Why::LoadsCode),
    (Match::Directive("lua-load-per-thread"), Why::LoadsCode),
    (Match::Directive("lua-prepend-path"), Why::LoadsCode),
    (Match::Name("lua."), Why::LoadsCode),
    (Match::Name("tune.lua."), Why::LoadsCode),
    (Match::Directive("ssl-engine"), Why::LoadsCode),
    (Match::Directive("ssl-provider"), Why::LoadsCode),
    (Match::Directive("ssl-provider-path"), Why::LoadsCode),
    (Match::Directive("filter"), Why::LoadsCode),
    (Match::Directive("setenv"), Why::ReadsTheEnvironment),
    (Match::Directive("presetenv"), Why::ReadsTheEnvironment),
    (Match::Directive("resetenv"), Why::ReadsTheEnvironment),
    (Match::Directive("unsetenv"), Why::ReadsTheEnvironment),
    (Match::Name("env("), Why::ReadsTheEnvironment),
    (Match::Directive("load-server-state-from-file"), Why::ReadsAFile),
    (Match::Directive("server-state-file"), Why::ReadsAFile),
    (Match::Directive("server-state-base"), Why::ReadsAFile),
    (Match::Directive("errorfile"), Why::ReadsAFile),
    (Match::Directive("errorfiles"), Why::ReadsAFile),
    (Match::Word("file"), Why::ReadsAFile),
    (Match::Word("lf-file"), Why::ReadsAFile),
    (Match::Word("errorfile"), Why::ReadsAFile),
    (Match::Word("errorfiles"), Why::ReadsAFile),
    (Match::Directive("stats"), Why::ChangesSharedState),
    (Match::WordPrefix("set-map("), Why::ChangesSharedState),
    (Match::WordPrefix("del-map("), Why::ChangesSharedState),
    (Match::WordPrefix("add-acl("), Why::ChangesSharedState),
    (Match::WordPrefix("del-acl("), Why::ChangesSharedState),
    (Match::WordPrefix("set-var(proc."), Why::ChangesSharedState),
    (Match::WordPrefix("set-var-fmt(proc."), Why::ChangesSharedState),
    (Match::WordPrefix("unset-var(proc."), Why::ChangesSharedState),
];

/// Why a snippet is refused. Lines count from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnippetError {
    /// NUL or CR, which no config line carries.
    #[error("line {line}: holds {byte:?}, which a config line cannot carry")]
    ControlChar {
        /// The line.
        line: usize,
        /// The character.
        byte: char,
    },
    /// A quote that is never closed.
    #[error("line {line}: a {quote} quote is never closed")]
    Unterminated {
        /// The line.
        line: usize,
        /// `'` or `"`.
        quote: char,
    },
    /// A line HAProxy's preprocessor reads (`.if`, `.diag`, …): it can test environment variables.
    #[error("line {line}: {word:?} is a preprocessor directive, which can read the environment")]
    Preprocessor {
        /// The line.
        line: usize,
        /// The directive.
        word: String,
    },
    /// `$` inside double quotes, which HAProxy replaces with an environment variable.
    #[error("line {line}: '$' inside double quotes reads an environment variable")]
    Expansion {
        /// The line.
        line: usize,
    },
    /// A section keyword.
    #[error("line {line}: {word:?} opens a new section; a snippet stays in its own")]
    OpensSection {
        /// The line.
        line: usize,
        /// The keyword.
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
}

/// Checks a snippet from an object against every rule here: `Ok` when HAProxy would read each of
/// its lines as directives of the section it is placed in, none of them denied.
pub fn check(text: &str) -> Result<(), SnippetError> {
    for (i, line) in text.split('\n').enumerate() {
        let n = i + 1;
        if let Some(byte) = line.chars().find(|c| matches!(c, '\0' | '\r')) {
            return Err(SnippetError::ControlChar { line: n, byte });
        }
        let words = words(line, n)?;
        let Some(first) = words.first() else { continue };
        if first.starts_with('.') {
            return Err(SnippetError::Preprocessor { line: n, word: first.clone() });
        }
        if crate::cfg::SECTION_KEYWORDS.contains(&first.as_str()) {
            return Err(SnippetError::OpensSection { line: n, word: first.clone() });
        }
        for (m, why) in DENIED {
            let hit = match m {
                Match::Directive(d) => (first == d).then(|| first.clone()),
                Match::Word(w) => words.iter().find(|x| x == w).cloned(),
                Match::WordPrefix(p) => words.iter().find(|x| x.starts_with(p)).cloned(),
                Match::Name(name) => words.iter().find(|x| uses_name(x, name)).cloned(),
            };
            if let Some(word) = hit {
                return Err(SnippetError::Denied { line: n, word, why: *why });
            }
        }
    }
    Ok(())
}

/// Whether `word` uses `name` as a name: at its start, or after a character no name holds.
fn uses_name(word: &str, name: &str) -> bool {
    word.match_indices(name).any(|(at, _)| {
        word[..at].chars().next_back().is_none_or(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    })
}

/// One line's words as HAProxy reads them (quotes removed, escapes decoded), ASCII-lowercased
/// for matching. A `#` outside quotes ends the line.
fn words(line: &str, n: usize) -> Result<Vec<String>, SnippetError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some('\''), '\'') | (Some('"'), '"') => quote = None,
            (Some('\''), c) => cur.push(c),
            (Some('"'), '$') => return Err(SnippetError::Expansion { line: n }),
            (_, '\\') => {
                in_word = true;
                match chars.next() {
                    Some('x') => {
                        let hex: String = [chars.next(), chars.next()].into_iter().flatten().collect();
                        match u8::from_str_radix(&hex, 16) {
                            Ok(b) => cur.push(char::from(b)),
                            Err(_) => cur.push_str(&format!("\\x{hex}")),
                        }
                    }
                    Some('r') => cur.push('\r'),
                    Some('n') => cur.push('\n'),
                    Some('t') => cur.push('\t'),
                    Some(other) => cur.push(other),
                    None => cur.push('\\'),
                }
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') => break,
            (None, c) if c == ' ' || c == '\t' => {
                if in_word {
                    out.push(std::mem::take(&mut cur).to_ascii_lowercase());
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if let Some(q) = quote {
        return Err(SnippetError::Unterminated { line: n, quote: q });
    }
    if in_word {
        out.push(cur.to_ascii_lowercase());
    }
    Ok(out)
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
mod tests {
    use super::*;

    fn denied(text: &str) -> Why {
        match check(text) {
            Err(SnippetError::Denied { why, .. }) => why,
            other => panic!("{text:?} must be denied, got {other:?}"),
        }
    }

    /// One snippet per [`DENIED`] entry, each refused for that entry's reason.
    #[test]
    fn every_entry_of_the_deny_list_is_refused() {
        let example = |m: &Match| -> String {
            match m {
                Match::Directive(d) => format!("{d} x"),
                Match::Word(w) => format!("http-request return status 200 {w} /etc/passwd"),
                Match::WordPrefix(p) => format!("http-request {p}x) y"),
                Match::Name(n) if n.ends_with('(') => format!("http-request set-header X %[{n}HOME)]"),
                Match::Name(n) => format!("http-request {n}f"),
            }
        };
        for (m, why) in DENIED {
            let text = example(m);
            assert_eq!(denied(&text), *why, "{text:?}");
        }
        assert_eq!(DENIED.len(), 36, "a new entry needs its own example above");
    }

    #[test]
    fn named_dangers_each_refused() {
        for (text, why) in [
            ("option external-check", Why::RunsAProgram),
            ("external-check command /bin/sh", Why::RunsAProgram),
            ("lua-load /tmp/x.lua", Why::LoadsCode),
            ("http-request lua.hello", Why::LoadsCode),
            ("http-request use-service lua.svc", Why::LoadsCode),
            ("http-request set-header X %[lua.f]", Why::LoadsCode),
            ("http-request set-header X %[str(a),lua.conv]", Why::LoadsCode),
            ("filter spoe engine e config /etc/spoe.conf", Why::LoadsCode),
            ("setenv HOME /", Why::ReadsTheEnvironment),
            ("http-request set-header X %[env(HAPTIC_PASSWORD)]", Why::ReadsTheEnvironment),
            ("http-request set-header X %[ENV(PATH)]", Why::ReadsTheEnvironment),
            ("http-request return status 200 lf-file /etc/shadow", Why::ReadsAFile),
            ("errorfile 503 /etc/passwd", Why::ReadsAFile),
            ("http-error status 503 errorfile /etc/passwd", Why::ReadsAFile),
            ("load-server-state-from-file global", Why::ReadsAFile),
            ("stats enable", Why::ChangesSharedState),
            ("http-request set-map(maps/hosts.map) a b", Why::ChangesSharedState),
            ("http-request del-acl(x) y", Why::ChangesSharedState),
            ("http-request set-var(proc.limit) int(0)", Why::ChangesSharedState),
            ("http-request set-var-fmt(proc.who) %[src]", Why::ChangesSharedState),
        ] {
            assert_eq!(denied(text), why, "{text:?}");
        }
    }

    #[test]
    fn quoting_or_escaping_a_word_does_not_hide_it() {
        for text in [
            "'lua-load' /tmp/x.lua",
            "\"lua-load\" /tmp/x.lua",
            "lua\\x2dload /tmp/x.lua",
            "lu'a-lo'ad /tmp/x.lua",
            "LUA-LOAD /tmp/x.lua",
            "http-request set-header X '%[env(HOME)]'",
            "http-request set-header X %[e\\nv(HOME)]".replace("\\n", "\\x6e").as_str(),
        ] {
            assert!(matches!(check(text), Err(SnippetError::Denied { .. })), "{text:?} -> {:?}", check(text));
        }
    }

    #[test]
    fn leaving_the_section_or_reading_the_environment_otherwise_is_refused() {
        assert!(matches!(
            check("backend other\n    server s 1.2.3.4:80"),
            Err(SnippetError::OpensSection { line: 1, .. })
        ));
        assert!(matches!(check("acl a always_true\n'program' x"), Err(SnippetError::OpensSection { line: 2, .. })));
        assert!(matches!(check(".if defined(HOME)"), Err(SnippetError::Preprocessor { .. })));
        assert!(matches!(check("http-request set-header X \"${HOME}\""), Err(SnippetError::Expansion { .. })));
        assert!(matches!(check("http-request set-header X \"$HOME\""), Err(SnippetError::Expansion { .. })));
        assert!(matches!(check("http-request deny\r"), Err(SnippetError::ControlChar { byte: '\r', .. })));
        assert!(matches!(check("a\0b"), Err(SnippetError::ControlChar { byte: '\0', .. })));
        assert!(matches!(
            check("http-request set-header X 'open"),
            Err(SnippetError::Unterminated { quote: '\'', .. })
        ));
    }

    #[test]
    fn ordinary_snippets_pass() {
        for text in [
            "http-request set-header X-Env production",
            "http-response set-header Cache-Control no-store\nhttp-request deny if { src 10.0.0.0/8 }",
            "# a comment with lua-load in it\ntimeout server 5s",
            "http-request set-header X-Price '$5'",
            "http-request set-header X-Host %[req.hdr(host),lower]",
            "http-request set-header X-Koala value.lua.example",
            "http-request set-var(txn.user) req.hdr(x-user)",
            "",
        ] {
            assert_eq!(check(text), Ok(()), "{text:?}");
        }
        // `lua.` inside a longer name is not a Lua call.
        assert!(!uses_name("tualua.com", "lua."));
        assert!(uses_name("%[lua.f]", "lua."));
    }

    #[test]
    fn a_check_without_listener_passes() {
        assert!(check_passed(Some(0)) && check_passed(Some(2)));
        assert!(!check_passed(Some(1)) && !check_passed(None));
    }

    #[test]
    fn check_config_holds_the_snippet_in_one_backend() {
        let c = check_config("    timeout server 5s");
        assert!(c.ends_with("backend snippet_check\n    timeout server 5s\n"), "{c}");
    }
}
