//! One config line read into words the way HAProxy's config parser reads it, for text that is
//! judged before it joins a config (a snippet from an object).
//!
//! Owns [`split`]. HAProxy splits a line on every `isspace` byte (space, `\t`, `\n`, `\v`, `\f`,
//! `\r`) outside quotes; single quotes keep everything up to the next `'` literally; double
//! quotes keep blanks and `#` but still read `\` escapes and `$` environment variables; outside
//! single quotes `\\`, `\ `, `\'`, `\"`, `\#`, `\$` stand for the character, `\r`, `\n`, `\t` for
//! CR, LF and tab, and `\xNN` for the byte NN; a `#` outside quotes starts a comment; quoted and
//! unquoted pieces next to each other form one word. [`split`] reads only the lines whose
//! reading is certain and safe and refuses the rest, so it never expands anything: every control
//! byte but `\t` (raw or from an escape, so of the `isspace` bytes only space and tab ever
//! split), any `$` outside single quotes (escaped or not: it would read or stand for an
//! environment variable), a `\` ending the line (a continuation HAProxy's manual does not
//! define), any other escape, a `\xNN` that is not printable ASCII, and an unclosed quote. It
//! must never say anything about what the words mean (that is the caller's, e.g.
//! [`crate::snippet`]). Hand-written: no crate reads HAProxy's config syntax. Pure: no I/O.

/// Why a line cannot be read into words here. Offsets are byte offsets into the line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WordsError {
    /// A control byte other than `\t`, in the line or from an escape.
    #[error("byte {at}: {byte:?} is a control character")]
    Control {
        /// Where.
        at: usize,
        /// The character.
        byte: char,
    },
    /// A quote that is never closed.
    #[error("byte {at}: a {quote} quote is never closed")]
    Unterminated {
        /// Where it opens.
        at: usize,
        /// `'` or `"`.
        quote: char,
    },
    /// A `$` outside single quotes: HAProxy reads an environment variable there.
    #[error("byte {at}: '$' outside single quotes reads an environment variable")]
    Expansion {
        /// Where.
        at: usize,
    },
    /// A `\` that ends the line.
    #[error("byte {at}: a '\\' ending the line (line continuations are not accepted)")]
    Continuation {
        /// Where.
        at: usize,
    },
    /// An escape other than `\\ \  \' \" \# \t` and `\xNN` for printable ASCII.
    #[error("byte {at}: an escape outside \\\\ \\' \\\" \\# \\t, '\\ ' and \\xNN for printable ASCII (put the word in single quotes)")]
    Escape {
        /// Where.
        at: usize,
    },
}

/// HAProxy's `isspace`: what separates words outside quotes.
pub fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r')
}

/// The words of `line` (one line, without its LF) as HAProxy reads them: quotes removed,
/// escapes decoded, the comment dropped. Refuses what the module doc lists.
///
/// ```
/// use haptic_haproxy::words::split;
/// assert_eq!(split(r#"http-request set-header 'X A' "b c"\#d # e"#).unwrap(), ["http-request", "set-header", "X A", "b c#d"]);
/// assert!(split("a \"${HOME}\"").is_err());
/// ```
pub fn split(line: &str) -> Result<Vec<String>, WordsError> {
    if let Some((at, byte)) = line.char_indices().find(|(_, c)| c.is_control() && *c != '\t') {
        return Err(WordsError::Control { at, byte });
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<(char, usize)> = None;
    let mut chars = line.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match (quote.map(|q| q.0), c) {
            (Some('\''), '\'') | (Some('"'), '"') => quote = None,
            (Some('\''), c) => cur.push(c),
            (_, '$') => return Err(WordsError::Expansion { at }),
            (_, '\\') => {
                in_word = true;
                cur.push(escape(&mut chars, at)?);
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some((c, at));
                in_word = true;
            }
            (None, '#') => break,
            (None, c) if is_space(c) => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if let Some((q, at)) = quote {
        return Err(WordsError::Unterminated { at, quote: q });
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// Decodes the escape whose `\` is at `at` (already consumed from `chars`).
fn escape(chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>, at: usize) -> Result<char, WordsError> {
    match chars.next().map(|(_, c)| c) {
        None => Err(WordsError::Continuation { at }),
        Some(c @ ('\\' | ' ' | '\'' | '"' | '#')) => Ok(c),
        Some('t') => Ok('\t'),
        Some('$') => Err(WordsError::Expansion { at: at + 1 }),
        Some('r') => Err(WordsError::Control { at, byte: '\r' }),
        Some('n') => Err(WordsError::Control { at, byte: '\n' }),
        Some('x') => {
            let hex: String = [chars.next(), chars.next()].into_iter().flatten().map(|(_, c)| c).collect();
            match u8::from_str_radix(&hex, 16) {
                Ok(b) if hex.len() == 2 && (b.is_ascii_graphic() || b == b' ') => Ok(char::from(b)),
                Ok(b) if hex.len() == 2 && b.is_ascii_control() && b != b'\t' => {
                    Err(WordsError::Control { at, byte: char::from(b) })
                }
                Ok(b'\t') if hex.len() == 2 => Ok('\t'),
                _ => Err(WordsError::Escape { at }),
            }
        }
        Some(_) => Err(WordsError::Escape { at }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn w(line: &str) -> Vec<String> {
        split(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    #[test]
    fn quotes_escapes_and_comments_read_as_haproxy_reads_them() {
        assert_eq!(w("  a\tb  "), ["a", "b"]);
        assert_eq!(w("'a b' \"c d\" e\\ f"), ["a b", "c d", "e f"]);
        assert_eq!(w("'a'\"b\"c"), ["abc"]);
        assert_eq!(w("'' x"), ["", "x"]);
        assert_eq!(w("a # b"), ["a"]);
        assert_eq!(w("a#b"), ["a"]);
        assert_eq!(w("\"a#b\" 'c#d' e\\#f"), ["a#b", "c#d", "e#f"]);
        assert_eq!(w("'\\x2f' \\x2fetc"), ["\\x2f", "/etc"]);
        assert_eq!(w("'$HOME' '\\'"), ["$HOME", "\\"]);
        assert_eq!(w("\\'a\\\" \\\\"), ["'a\"", "\\"]);
        assert_eq!(w("a\\tb"), ["a\tb"]);
        assert_eq!(w(""), Vec::<String>::new());
    }

    #[test]
    fn what_is_uncertain_or_unsafe_is_refused() {
        for (line, want) in [
            ("\u{b}global", WordsError::Control { at: 0, byte: '\u{b}' }),
            ("a\u{c}b", WordsError::Control { at: 1, byte: '\u{c}' }),
            ("a\rb", WordsError::Control { at: 1, byte: '\r' }),
            ("a\0", WordsError::Control { at: 1, byte: '\0' }),
            ("a\u{7f}", WordsError::Control { at: 1, byte: '\u{7f}' }),
            ("a\u{85}", WordsError::Control { at: 1, byte: '\u{85}' }),
            ("'a\u{b}'", WordsError::Control { at: 2, byte: '\u{b}' }),
            ("a\\r", WordsError::Control { at: 1, byte: '\r' }),
            ("a\\n", WordsError::Control { at: 1, byte: '\n' }),
            ("a\\x0b", WordsError::Control { at: 1, byte: '\u{b}' }),
            ("a\\x00", WordsError::Control { at: 1, byte: '\0' }),
            ("a\\xff", WordsError::Escape { at: 1 }),
            ("a\\x2", WordsError::Escape { at: 1 }),
            ("a\\q", WordsError::Escape { at: 1 }),
            ("a\\d", WordsError::Escape { at: 1 }),
            ("a \\", WordsError::Continuation { at: 2 }),
            ("\"a \\", WordsError::Continuation { at: 3 }),
            ("a $HOME", WordsError::Expansion { at: 2 }),
            ("a \"${HOME}\"", WordsError::Expansion { at: 3 }),
            ("a \\$HOME", WordsError::Expansion { at: 3 }),
            ("a 'b", WordsError::Unterminated { at: 2, quote: '\'' }),
            ("a \"b", WordsError::Unterminated { at: 2, quote: '"' }),
        ] {
            assert_eq!(split(line), Err(want), "{line:?}");
        }
        // A backslash in single quotes is literal, so a line may end with one there.
        assert_eq!(w("a '\\'"), ["a", "\\"]);
    }

    proptest! {
        /// Words joined by single spaces, each in single quotes (with `'` written as `'\''`),
        /// read back as themselves: the form `quote::config_arg` writes.
        #[test]
        fn single_quoted_words_read_back(words in prop::collection::vec("[ -~]{0,8}", 1..5)) {
            let line: Vec<String> =
                words.iter().map(|w| format!("'{}'", w.replace('\'', "'\\''"))).collect();
            prop_assert_eq!(split(&line.join(" ")).unwrap(), words);
        }

        /// Whatever a line holds, no word read from it holds a control byte other than `\t`.
        #[test]
        fn no_word_holds_a_control_byte(line in "[ -~\t\u{b}\u{c}\r\u{0}\u{80}-\u{a0}]{0,24}") {
            if let Ok(words) = split(&line) {
                for w in words {
                    prop_assert!(!w.chars().any(|c| c.is_control() && c != '\t'), "{:?}", w);
                }
            }
        }
    }
}
