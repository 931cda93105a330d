//! Turning any string into HAProxy text that means exactly that string.
//!
//! Owns the one way a value from outside (a Kubernetes object, a user) becomes part of a
//! `haproxy.cfg` or of a map file: [`config_arg`] (one config word), [`log_format_arg`] (one
//! config word HAProxy then reads as a log-format string), [`map_key`] / [`map_value`] /
//! [`map_line`] (a line of a map file or of an `add map` payload) and [`regex_literal`] (a PCRE
//! pattern that matches the string literally). It must never pass a value through unchanged
//! that HAProxy would read differently: what cannot be expressed is an [`Inexpressible`] error,
//! never a silent change. Pure: no I/O.
//!
//! The rules these follow (HAProxy 2.6 and 3.0, `configuration.txt` section 2.2, checked by
//! `tests/quote.rs` against both with real `haproxy -c` and real HTTP):
//! - A config line is split into words at unquoted blanks; `#` outside quotes starts a comment;
//!   outside quotes `\` escapes the next character; inside double quotes `$VAR` and `${VAR}` are
//!   replaced by environment variables and `\` escapes still apply; inside single quotes nothing
//!   is interpreted. Quoted and unquoted pieces that touch form one word (`'it'\''s'` is `it's`).
//!   So a word is written single-quoted, with each `'` as `'\''`.
//! - A config line ends at LF; NUL cannot appear in one, and CR is refused here too (it would
//!   end up in the value on some readers and not others). These three are refused everywhere.
//! - In a log-format string `%` starts a variable (`%ci`, `%[sample]`, `%{+Q}o`); `%%` is a
//!   literal `%`.
//! - A map file line (and an `add map` payload line) is: leading blanks skipped, `#` then starts
//!   a comment, the key runs to the first space or tab, blanks are skipped, the value runs to the
//!   end of the line, less trailing blanks. There is no escaping: a key holding whitespace or
//!   starting with `#`, and a value starting or ending with a space or tab, cannot be written.
//!
//! A value quoted with [`config_arg`] is one word wherever HAProxy takes a word, with one
//! exception the caller must mind: inside an anonymous ACL (`{ … }`) a word that is exactly `}`
//! closes it.

/// Why a string cannot be written as the HAProxy text asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Inexpressible {
    /// NUL, CR or LF, which no config line, map line or payload can carry.
    #[error("{what}: byte {at} is {byte:?}, which HAProxy text cannot carry")]
    ControlChar {
        /// What was being written (`config argument`, `map key`, …).
        what: &'static str,
        /// The byte offset of the character.
        at: usize,
        /// The character (`'\0'`, `'\r'` or `'\n'`).
        byte: char,
    },
    /// The empty string as a config word: HAProxy reads an empty word (`''`) as a missing
    /// argument (`'string' expects <str> as argument`), so it never means "empty".
    #[error("{what}: empty, which HAProxy reads as a missing argument")]
    Empty {
        /// What was being written.
        what: &'static str,
    },
    /// An empty map key (a map line needs a key).
    #[error("map key: empty")]
    EmptyKey,
    /// A map key holding whitespace (the key ends at the first space or tab).
    #[error("map key {0:?}: holds whitespace, where a map line ends its key")]
    KeyWhitespace(String),
    /// A host id holding the character that ends host ids in regex map keys.
    #[error("host id {0:?}: holds the delimiter that ends a host id in a regex map key")]
    HostIdDelimiter(String),
    /// A map key starting with `#` (the line would be a comment).
    #[error("map key {0:?}: starts with '#', which makes the map line a comment")]
    KeyComment(String),
    /// A map value starting with a space or tab (HAProxy skips them).
    #[error("map value {0:?}: starts with a space or tab, which a map line skips")]
    ValueLeadingBlank(String),
    /// A map value ending with a space or tab (HAProxy trims them when it reads a map file).
    #[error("map value {0:?}: ends with a space or tab, which a map file loses")]
    ValueTrailingBlank(String),
    /// A map line longer than HAProxy reads as one line.
    #[error("map line of {len} bytes is over the {max}-byte limit")]
    LineTooLong {
        /// The line's length with its LF.
        len: usize,
        /// [`MAX_MAP_LINE`].
        max: usize,
    },
}

/// The longest map line (key, space, value, LF) written: HAProxy reads map files line by line
/// into a buffer of `tune.bufsize` (16 KiB by default), and a payload is at most
/// [`crate::cli::command::MAX_PAYLOAD`].
pub const MAX_MAP_LINE: usize = crate::cli::command::MAX_PAYLOAD;

fn refuse_control(what: &'static str, s: &str) -> Result<(), Inexpressible> {
    match s.char_indices().find(|(_, c)| matches!(c, '\0' | '\r' | '\n')) {
        Some((at, byte)) => Err(Inexpressible::ControlChar { what, at, byte }),
        None => Ok(()),
    }
}

fn single_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            // Close the quote, an escaped quote, open again: one word.
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// One config word that HAProxy reads as exactly `s` (no escape, variable or comment is
/// interpreted in it). Every non-empty string without NUL, CR and LF is expressible; the empty
/// one is not ([`Inexpressible::Empty`]: HAProxy takes `''` for a missing argument).
///
/// ```
/// use haptic_haproxy::quote::config_arg;
/// assert_eq!(config_arg("it's $HOME #1").unwrap(), r#"'it'\''s $HOME #1'"#);
/// assert!(config_arg("a\nb").is_err());
/// ```
pub fn config_arg(s: &str) -> Result<String, Inexpressible> {
    refuse_control("config argument", s)?;
    if s.is_empty() {
        return Err(Inexpressible::Empty { what: "config argument" });
    }
    Ok(single_quoted(s))
}

/// One config word that HAProxy reads as a log-format string producing exactly `s` (for
/// `http-request set-header`, `return … hdr`, `lf-string`, `set-var-fmt`, …): every `%` is
/// doubled, so `%[…]` and `%{…}` stay literal text. Expressible as [`config_arg`] (not empty,
/// no NUL, CR or LF).
///
/// ```
/// use haptic_haproxy::quote::log_format_arg;
/// assert_eq!(log_format_arg("100% %[src]").unwrap(), "'100%% %%[src]'");
/// ```
pub fn log_format_arg(s: &str) -> Result<String, Inexpressible> {
    refuse_control("log-format argument", s)?;
    if s.is_empty() {
        return Err(Inexpressible::Empty { what: "log-format argument" });
    }
    Ok(single_quoted(&s.replace('%', "%%")))
}

/// `s` as the key of a map line (returned as is: map files have no escaping). Refuses the empty
/// key, any whitespace, a leading `#`, NUL, CR and LF.
pub fn map_key(s: &str) -> Result<&str, Inexpressible> {
    refuse_control("map key", s)?;
    if s.is_empty() {
        return Err(Inexpressible::EmptyKey);
    }
    if s.chars().any(|c| c.is_ascii_whitespace() || c == '\u{b}') {
        return Err(Inexpressible::KeyWhitespace(s.to_string()));
    }
    if s.starts_with('#') {
        return Err(Inexpressible::KeyComment(s.to_string()));
    }
    Ok(s)
}

/// `s` as the value of a map line (returned as is). Refuses a leading or trailing space or tab,
/// NUL, CR and LF; the empty value and any other text (inner blanks, `#`) are kept exactly.
pub fn map_value(s: &str) -> Result<&str, Inexpressible> {
    refuse_control("map value", s)?;
    if s.starts_with([' ', '\t']) {
        return Err(Inexpressible::ValueLeadingBlank(s.to_string()));
    }
    if s.ends_with([' ', '\t']) {
        return Err(Inexpressible::ValueTrailingBlank(s.to_string()));
    }
    Ok(s)
}

/// The map line `<key> <value>\n` (for a map file or an `add map` payload), within
/// [`MAX_MAP_LINE`].
pub fn map_line(key: &str, value: &str) -> Result<String, Inexpressible> {
    let mut line = String::new();
    push_map_line(&mut line, key, value)?;
    Ok(line)
}

/// [`map_line`] appended to `out` (a whole map file is built without a string per line);
/// `out` is unchanged when the line is refused.
pub fn push_map_line(out: &mut String, key: &str, value: &str) -> Result<(), Inexpressible> {
    let (key, value) = (map_key(key)?, map_value(value)?);
    let len = map_line_fits(key.len(), value.len())?;
    out.reserve(len);
    out.push_str(key);
    out.push(' ');
    out.push_str(value);
    out.push('\n');
    Ok(())
}

/// The length of a map line of a `key_len`-byte key and a `value_len`-byte value (the space and
/// the newline counted), or why it exceeds [`MAX_MAP_LINE`]. For checking a key or value that is
/// only part of the line's text (the rest known to be well formed) without writing the line.
pub fn map_line_fits(key_len: usize, value_len: usize) -> Result<usize, Inexpressible> {
    let len = key_len + value_len + 2;
    if len > MAX_MAP_LINE {
        return Err(Inexpressible::LineTooLong { len, max: MAX_MAP_LINE });
    }
    Ok(len)
}

/// A PCRE pattern matching `s` literally (not anchored: wrap it in `^…$` for an exact match):
/// every ASCII metacharacter (`\ ^ $ . | ? * + ( ) [ ] { }`) gets a backslash. It is pattern
/// text, not yet a config word: pass it through [`config_arg`]. Refuses NUL, CR and LF.
///
/// ```
/// use haptic_haproxy::quote::{config_arg, regex_literal};
/// let re = format!("^{}$", regex_literal("a.b(c)").unwrap());
/// assert_eq!(config_arg(&re).unwrap(), r"'^a\.b\(c\)$'");
/// ```
pub fn regex_literal(s: &str) -> Result<String, Inexpressible> {
    refuse_control("regex", s)?;
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if matches!(c, '\\' | '^' | '$' | '.' | '|' | '?' | '*' | '+' | '(' | ')' | '[' | ']' | '{' | '}') {
            out.push('\\');
        }
        out.push(c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_map_line_is_appended_whole_or_not_at_all() {
        let mut out = String::from("a b\n");
        push_map_line(&mut out, "k", "v w").unwrap();
        assert_eq!(out, "a b\nk v w\n");
        assert_eq!(map_line("k", "v w").unwrap(), "k v w\n");
        let long = "x".repeat(MAX_MAP_LINE);
        for (k, v) in [("k k", "v"), ("k", " v"), (long.as_str(), "v"), ("#k", "v")] {
            assert!(push_map_line(&mut out, k, v).is_err(), "{k:?} {v:?}");
            assert_eq!(out, "a b\nk v w\n");
        }
        let fits = "x".repeat(MAX_MAP_LINE - 3);
        assert_eq!(map_line(&fits, "v").unwrap().len(), MAX_MAP_LINE);
        assert!(map_line(&fits, "vv").is_err());
    }

    #[test]
    fn forms() {
        assert_eq!(config_arg(""), Err(Inexpressible::Empty { what: "config argument" }));
        assert!(matches!(log_format_arg(""), Err(Inexpressible::Empty { .. })));
        assert_eq!(regex_literal("").unwrap(), "");
        assert_eq!(config_arg("a b").unwrap(), "'a b'");
        assert_eq!(config_arg("'").unwrap(), r"''\'''");
        assert_eq!(config_arg(r#"\"$X"#).unwrap(), r#"'\"$X'"#);
        assert_eq!(log_format_arg("%").unwrap(), "'%%'");
        assert_eq!(map_key("a.example").unwrap(), "a.example");
        assert_eq!(map_line("k", "v w").unwrap(), "k v w\n");
        assert!(matches!(map_value("v "), Err(Inexpressible::ValueTrailingBlank(_))));
        assert_eq!(map_line("k", "").unwrap(), "k \n");
        assert_eq!(regex_literal("x*").unwrap(), r"x\*");
    }

    #[test]
    fn refusals_are_typed() {
        for f in [config_arg, log_format_arg, regex_literal] {
            assert!(matches!(f("a\0b"), Err(Inexpressible::ControlChar { at: 1, byte: '\0', .. })));
            assert!(matches!(f("\r"), Err(Inexpressible::ControlChar { byte: '\r', .. })));
            assert!(matches!(f("x\n"), Err(Inexpressible::ControlChar { at: 1, byte: '\n', .. })));
        }
        assert_eq!(map_key(""), Err(Inexpressible::EmptyKey));
        assert!(matches!(map_key("a b"), Err(Inexpressible::KeyWhitespace(_))));
        assert!(matches!(map_key("a\tb"), Err(Inexpressible::KeyWhitespace(_))));
        assert!(matches!(map_key("#a"), Err(Inexpressible::KeyComment(_))));
        assert!(matches!(map_key("a\nb"), Err(Inexpressible::ControlChar { .. })));
        assert!(matches!(map_value(" v"), Err(Inexpressible::ValueLeadingBlank(_))));
        assert!(matches!(map_value("\tv"), Err(Inexpressible::ValueLeadingBlank(_))));
        assert!(matches!(map_value("v\r"), Err(Inexpressible::ControlChar { .. })));
        assert!(matches!(map_line("k", &"v".repeat(MAX_MAP_LINE)), Err(Inexpressible::LineTooLong { .. })));
    }

    /// Reads a single-quoted word back the way HAProxy's line parser does.
    fn unquote_word(w: &str) -> String {
        let (mut out, mut quoted, mut chars) = (String::new(), false, w.chars());
        while let Some(c) = chars.next() {
            match (quoted, c) {
                (true, '\'') | (false, '\'') => quoted = !quoted,
                (false, '\\') => out.extend(chars.next()),
                (_, c) => out.push(c),
            }
        }
        out
    }

    proptest! {
        #[test]
        fn a_string_with_a_line_break_or_nul_is_always_refused(a in ".*", b in ".*", c in prop::sample::select(vec!['\0', '\r', '\n'])) {
            let s = format!("{a}{c}{b}");
            prop_assert!(config_arg(&s).is_err());
            prop_assert!(log_format_arg(&s).is_err());
            prop_assert!(map_key(&s).is_err());
            prop_assert!(map_value(&s).is_err());
            prop_assert!(regex_literal(&s).is_err());
        }

        #[test]
        fn config_words_read_back_exactly(s in "[^\\x00\\r\\n]+") {
            let w = config_arg(&s).unwrap();
            prop_assert_eq!(unquote_word(&w), s);
        }
    }
}
