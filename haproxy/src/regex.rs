//! Regular expressions from objects (an Ingress path under `use-regex`): which patterns HAProxy
//! is given, and how many capture groups they hold.
//!
//! Owns [`check`]: a pattern is accepted only when it is written in a small subset of PCRE2 that
//! reads the same under every reading (no nested or bracketed classes, no `(?` forms other than
//! `(?:`, every metacharacter meant literally escaped), so its groups and alternations are exactly
//! the ones seen here and wrapping it in `(?:…)` can never be escaped from. Patterns that can
//! backtrack exponentially are refused: a quantifier may apply only to one character, class,
//! escape or `.`, or to a group of such without alternation or quantifiers inside. Patterns that
//! can backtrack polynomially are refused too: no repeat whose count varies (`*`, `+`, `?`,
//! `{n,m}`) may match a character that an earlier such repeat can still take, unless a mandatory
//! item the earlier one cannot match stands between them (the rule, precisely, in the `overlap` module);
//! so `/a*a*[0-9]` and `/.*/.*` are refused and `/[^/]*/.*` passes. The number of unbounded
//! quantifiers, bounded repeat counts and the length are capped as well (PCRE2's own match limit
//! bounds whatever is left). It must never rewrite a pattern: one that fails a rule
//! is refused as a whole. Pure: no I/O. The accepted text is still pattern text: a caller writes
//! it as a config word through [`crate::quote::config_arg`] or as a map key through
//! [`crate::quote::map_key`].

mod overlap;

/// The longest pattern accepted, in bytes.
pub const MAX_LEN: usize = 1024;
/// The most unbounded quantifiers (`*`, `+`, `{n,}`) in one pattern.
pub const MAX_UNBOUNDED: usize = 4;
/// The largest count in a bounded repeat (`{n,m}`).
pub const MAX_REPEAT: u32 = 255;
/// The most capture groups (HAProxy's back references are `\1` to `\9`).
pub const MAX_GROUPS: usize = 9;

/// Why a pattern is refused. Offsets are byte offsets into the pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegexError {
    /// Longer than [`MAX_LEN`].
    #[error("{len} bytes, over the {MAX_LEN}-byte limit")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A byte that is not printable ASCII, or a blank (a map key ends at a blank).
    #[error("byte {at}: only printable ASCII without blanks is accepted (escape a blank as \\x20)")]
    Byte {
        /// Where.
        at: usize,
    },
    /// A construct outside the accepted subset.
    #[error("byte {at}: {what}")]
    Unsupported {
        /// Where.
        at: usize,
        /// What it is and what to write instead.
        what: &'static str,
    },
    /// A `(` without its `)` or the other way round, or a `[` without its `]`.
    #[error("byte {at}: unbalanced {what}")]
    Unbalanced {
        /// Where.
        at: usize,
        /// `(`, `)` or `[`.
        what: char,
    },
    /// A quantifier applied to something that already repeats or alternates: exponential
    /// backtracking on some inputs.
    #[error("byte {at}: a quantifier over a group that repeats or alternates can backtrack without bound")]
    Nested {
        /// Where.
        at: usize,
    },
    /// A repeat that can take a character an earlier repeat can still take (the `overlap` rule):
    /// polynomial backtracking on some inputs.
    #[error(
        "byte {at}: this repeat can match what an earlier repeat matches, with nothing between them that the earlier cannot match, so it can backtrack without bound (write the earlier one as a class that excludes what follows it, e.g. [^/]* before /)"
    )]
    Overlap {
        /// Where the later repeat's atom starts.
        at: usize,
    },
    /// Too many unbounded quantifiers.
    #[error("more than {MAX_UNBOUNDED} unbounded quantifiers (*, +, {{n,}})")]
    TooManyUnbounded,
    /// A bounded repeat over [`MAX_REPEAT`], or `{n,m}` with n > m.
    #[error("byte {at}: a repeat count over {MAX_REPEAT} or out of order")]
    Repeat {
        /// Where.
        at: usize,
    },
    /// More than [`MAX_GROUPS`] capture groups.
    #[error("more than {MAX_GROUPS} capture groups")]
    TooManyGroups,
}

/// What an accepted pattern holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Its capture groups (`(…)`, not `(?:…)`).
    pub groups: usize,
}

/// One open group while parsing.
#[derive(Default)]
struct Group {
    /// It holds a quantifier or an alternation (directly or in a group inside).
    complex: bool,
    /// Where it opened.
    at: usize,
}

/// Checks `pattern` against every rule of this module.
///
/// ```
/// use haptic_haproxy::regex::check;
/// assert_eq!(check("/foo(/|$)(.*)").unwrap().groups, 2);
/// assert!(check("(a+)+$").is_err());
/// assert!(check("/a)|(/b").is_err());
/// ```
pub fn check(pattern: &str) -> Result<Checked, RegexError> {
    let b = pattern.as_bytes();
    if b.len() > MAX_LEN {
        return Err(RegexError::TooLong { len: b.len() });
    }
    if let Some(at) = b.iter().position(|c| !c.is_ascii_graphic()) {
        return Err(RegexError::Byte { at });
    }
    let mut scan = Scan { stack: vec![Group::default()], groups: 0, unbounded: 0, last: None, quantified: false };
    let mut i = 0;
    while i < b.len() {
        i = scan.step(b, i)?;
    }
    if let Some(g) = scan.stack.get(1) {
        return Err(RegexError::Unbalanced { at: g.at.saturating_sub(1), what: '(' });
    }
    if scan.unbounded > MAX_UNBOUNDED {
        return Err(RegexError::TooManyUnbounded);
    }
    if scan.groups > MAX_GROUPS {
        return Err(RegexError::TooManyGroups);
    }
    if let Some(at) = overlap::first_overlap(b) {
        return Err(RegexError::Overlap { at });
    }
    Ok(Checked { groups: scan.groups })
}

/// The state of [`check`]'s one pass over a pattern.
struct Scan {
    /// The open groups, the pattern itself at the bottom.
    stack: Vec<Group>,
    /// Capture groups seen.
    groups: usize,
    /// Unbounded quantifiers seen.
    unbounded: usize,
    /// What the next quantifier would apply to: None at the start, after `(`, `|` or an anchor.
    /// Some(true) when that is a complex group, Some(false) for a single atom.
    last: Option<bool>,
    /// The last atom already carries a quantifier.
    quantified: bool,
}

impl Scan {
    /// Reads the item at `b[i]`; returns where the next one starts.
    fn step(&mut self, b: &[u8], i: usize) -> Result<usize, RegexError> {
        let c = b[i];
        let next = match c {
            b'\\' => {
                escape(b, i, false)?;
                // `\b` and `\B` are assertions: nothing to repeat.
                self.last = (!matches!(b[i + 1], b'b' | b'B')).then_some(false);
                i + 2
            }
            b'[' => {
                self.last = Some(false);
                class(b, i)?
            }
            b'(' => return self.open(b, i),
            b')' => {
                self.close(i)?;
                i + 1
            }
            b'|' => {
                if let Some(g) = self.stack.last_mut() {
                    g.complex = true;
                }
                self.last = None;
                i + 1
            }
            b'^' | b'$' => {
                self.last = None;
                i + 1
            }
            b'*' | b'+' | b'?' | b'{' => return self.quantifier(b, i),
            b'}' | b']' => {
                return Err(RegexError::Unsupported { at: i, what: "a bare '}' or ']' (escape it: \\} or \\])" })
            }
            _ => {
                self.last = Some(false);
                i + 1
            }
        };
        self.quantified = false;
        Ok(next)
    }

    /// The group opening at `b[i] == '('`: `(…)` counts as a capture group, `(?:…)` does not,
    /// any other `(?` form is refused.
    fn open(&mut self, b: &[u8], i: usize) -> Result<usize, RegexError> {
        let next = if b.get(i + 1) == Some(&b'?') {
            if b.get(i + 2) != Some(&b':') {
                return Err(RegexError::Unsupported {
                    at: i,
                    what: "only (…) and (?:…) groups are accepted (no flags, lookaround or named groups)",
                });
            }
            i + 3
        } else {
            self.groups += 1;
            i + 1
        };
        self.stack.push(Group { complex: false, at: next });
        self.last = None;
        self.quantified = false;
        Ok(next)
    }

    /// The `)` at `i`: closes the innermost group, whose complexity passes to the one around it.
    fn close(&mut self, i: usize) -> Result<(), RegexError> {
        if self.stack.len() == 1 {
            return Err(RegexError::Unbalanced { at: i, what: ')' });
        }
        let g = self.stack.pop().unwrap_or_default();
        if g.complex {
            if let Some(outer) = self.stack.last_mut() {
                outer.complex = true;
            }
        }
        self.last = Some(g.complex);
        Ok(())
    }

    /// The quantifier at `b[i]` (`*`, `+`, `?` or `{…}`); returns where the next item starts.
    fn quantifier(&mut self, b: &[u8], i: usize) -> Result<usize, RegexError> {
        let c = b[i];
        let (end, is_unbounded, repeats) = if c == b'{' { repeat(b, i)? } else { (i + 1, c != b'?', c != b'?') };
        match self.last {
            None => {
                return Err(RegexError::Unsupported {
                    at: i,
                    what: "a quantifier with nothing to repeat (escape it to mean it literally)",
                })
            }
            Some(_) if self.quantified => {
                return Err(RegexError::Unsupported {
                    at: i,
                    what: "a quantifier after a quantifier (no lazy or possessive forms)",
                })
            }
            Some(true) if repeats => return Err(RegexError::Nested { at: i }),
            Some(_) => {}
        }
        if is_unbounded {
            self.unbounded += 1;
        }
        if let Some(g) = self.stack.last_mut() {
            g.complex = true;
        }
        self.quantified = true;
        Ok(end)
    }
}

/// Checks the escape at `b[i] == '\\'`: a backslash before punctuation (a literal), or one of
/// the classes `\d \D \w \W \s \S`, and outside a class the assertions `\b \B`.
fn escape(b: &[u8], i: usize, in_class: bool) -> Result<(), RegexError> {
    match b.get(i + 1) {
        None => Err(RegexError::Unsupported { at: i, what: "a pattern ending in '\\'" }),
        Some(c) if c.is_ascii_punctuation() => Ok(()),
        Some(b'd' | b'D' | b'w' | b'W' | b's' | b'S') => Ok(()),
        Some(b'b' | b'B') if !in_class => Ok(()),
        Some(_) => Err(RegexError::Unsupported {
            at: i,
            what: "an escape other than \\ before punctuation, \\d \\D \\w \\W \\s \\S, or \\b \\B",
        }),
    }
}

/// Checks the class opening at `b[i] == '['` and returns the index after its `]`. Inside: an
/// optional leading `^`, then characters, ranges `a-z` and escapes; `[` and an unescaped `]`
/// first are refused (POSIX classes and nested classes read differently across engines).
fn class(b: &[u8], start: usize) -> Result<usize, RegexError> {
    let mut i = start + 1;
    if b.get(i) == Some(&b'^') {
        i += 1;
    }
    let first = i;
    // The previous item was a single character that may start a range.
    let mut prev: Option<u8> = None;
    while i < b.len() {
        match b[i] {
            b']' if i == first => {
                return Err(RegexError::Unsupported {
                    at: i,
                    what: "an empty class or ']' first in it (escape it: \\])",
                })
            }
            b']' => return Ok(i + 1),
            b'[' => {
                return Err(RegexError::Unsupported { at: i, what: "'[' inside a class (escape it: \\[)" });
            }
            b'\\' => {
                escape(b, i, true)?;
                let lit = b[i + 1];
                prev = lit.is_ascii_punctuation().then_some(lit);
                i += 2;
            }
            b'-' if prev.is_some() && i + 1 < b.len() && b[i + 1] != b']' => {
                let lo = prev.unwrap_or_default();
                let hi = match b[i + 1] {
                    b'\\' => {
                        escape(b, i + 1, true)?;
                        let h = b[i + 2];
                        if !h.is_ascii_punctuation() {
                            return Err(RegexError::Unsupported { at: i, what: "a range ending in a class escape" });
                        }
                        i += 3;
                        h
                    }
                    b'[' => {
                        return Err(RegexError::Unsupported { at: i + 1, what: "'[' inside a class (escape it: \\[)" })
                    }
                    h => {
                        i += 2;
                        h
                    }
                };
                if lo > hi {
                    return Err(RegexError::Unsupported { at: i, what: "a range out of order" });
                }
                prev = None;
            }
            c => {
                prev = Some(c);
                i += 1;
            }
        }
    }
    Err(RegexError::Unbalanced { at: start, what: '[' })
}

/// Parses `{n}`, `{n,}` or `{n,m}` at `b[i] == '{'`: (index after it, unbounded, repeats more
/// than once).
fn repeat(b: &[u8], i: usize) -> Result<(usize, bool, bool), RegexError> {
    let (end, _, hi) = counts(b, i)?;
    Ok((end, hi.is_none(), hi.is_none_or(|h| h > 1)))
}

/// Parses `{n}`, `{n,}` or `{n,m}` at `b[i] == '{'`: (index after it, n, m or `None` for no
/// upper bound).
fn counts(b: &[u8], i: usize) -> Result<(usize, u32, Option<u32>), RegexError> {
    let Some(len) = b[i..].iter().position(|c| *c == b'}') else {
        return Err(RegexError::Unsupported { at: i, what: "a bare '{' (escape it: \\{)" });
    };
    let inner = std::str::from_utf8(&b[i + 1..i + len]).unwrap_or_default();
    let num = |s: &str| -> Result<u32, RegexError> {
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(RegexError::Unsupported { at: i, what: "a bare '{' (escape it: \\{)" });
        }
        s.parse::<u32>().ok().filter(|n| *n <= MAX_REPEAT).ok_or(RegexError::Repeat { at: i })
    };
    let (lo, hi) = match inner.split_once(',') {
        None => {
            let n = num(inner)?;
            (n, Some(n))
        }
        Some((lo, "")) => (num(lo)?, None),
        Some((lo, hi)) => (num(lo)?, Some(num(hi)?)),
    };
    if hi.is_some_and(|h| h < lo) {
        return Err(RegexError::Repeat { at: i });
    }
    Ok((i + len + 1, lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ingress_nginx_style_paths_pass() {
        for (p, groups) in [
            ("/foo(/|$)(.*)", 2),
            ("/something(/|$)(.*)", 2),
            ("/api/v[0-9]+/users", 0),
            ("/(?:a|b)/x", 0),
            ("/static/.*\\.(js|css)$", 1),
            ("/[^/]+/edit", 0),
            ("/a{2,3}", 0),
            ("/x\\d{4}", 0),
            ("/[a-z\\-_]+", 0),
            ("/(abc)?", 1),
            ("/\\(literal\\)\\[\\]\\{\\}", 0),
        ] {
            assert_eq!(check(p), Ok(Checked { groups }), "{p}");
        }
    }

    #[test]
    fn structure_changing_or_catastrophic_patterns_are_refused() {
        for (p, want) in [
            ("(a+)+$", "backtrack"),
            ("(a|a)*b", "backtrack"),
            ("((a)*)*", "backtrack"),
            ("(x+x+)+y", "backtrack"),
            ("/a)|(/b", "unbalanced )"),
            ("/a(", "unbalanced ("),
            ("/[a", "unbalanced ["),
            ("/[[:alpha:]]", "'[' inside a class"),
            ("/[]a]", "']' first"),
            ("(?i)/a", "only (…) and (?:…)"),
            ("(?=a)", "only (…) and (?:…)"),
            ("/a b", "printable ASCII"),
            ("/a\nb", "printable ASCII"),
            ("/\u{e9}", "printable ASCII"),
            ("*a", "nothing to repeat"),
            ("/a+?", "after a quantifier"),
            ("/a**", "after a quantifier"),
            ("/a{1000}", "repeat count"),
            ("/a{3,2}", "repeat count"),
            ("/a{x}", "bare '{'"),
            ("/a}", "bare '}'"),
            ("/\\1", "an escape other than"),
            ("/\\Q", "an escape other than"),
            ("/a\\", "ending in"),
            ("/.*.*.*.*.*", "unbounded"),
            ("/a\\w+\\w+\\w+\\w+\\w+", "unbounded"),
            ("/(a)(a)(a)(a)(a)(a)(a)(a)(a)(a)", "capture groups"),
        ] {
            let e = check(p).expect_err(p).to_string();
            assert!(e.contains(want), "{p}: {e}");
        }
        assert!(matches!(check(&"a".repeat(MAX_LEN + 1)), Err(RegexError::TooLong { .. })));
    }

    #[test]
    fn overlapping_repeats_are_refused() {
        for (p, at) in [
            ("/a*a*a*a*[0-9]", 3),
            ("/.*/.*", 4),
            ("/a*b?a*", 5),
            ("/a*A*", 3),
            ("/[a-z]*[A-Z]+", 7),
            ("/(ab)*a*", 6),
            ("/x*(y|x)x*", 8),
            ("/a?a?a?aaa", 3),
            ("/\\d+[0-9]?", 4),
            ("/\\w*_+", 4),
            ("/[^/]*[^a]*", 6),
            ("/(a*)(a*)", 6),
            ("/(/.*)?.*", 7),
            ("/a{1,9}a{1,9}", 7),
            ("/something/(.*)/(.*)", 17),
            ("/api/?.*", 6),
            ("/[a-z]+[0-9a-z]*", 7),
        ] {
            assert_eq!(check(p), Err(RegexError::Overlap { at }), "{p}");
        }
    }

    #[test]
    fn repeats_separated_or_disjoint_pass() {
        for p in [
            "/api/.*",
            "/.*",
            "/v[0-9]+/users",
            "/(foo|bar)/.*",
            "/foo(/|$)(.*)",
            "/[^/]+/edit/[^/]*",
            "/a*b*c*[0-9]",
            "/a*ba*",
            "/([^/]*)/(.*)",
            "/static/.*\\.(js|css)$",
            "/users/\\d+/posts/\\d+",
            "/[a-z\\-]+-[0-9]+",
            "/x{2}x{3}",
            "/a+a",
            "/api(/.*)?$",
            "/[a-z][0-9a-z]*",
            "/\\d{1,3}\\.\\d{1,3}",
        ] {
            assert!(check(p).is_ok(), "{p}: {:?}", check(p));
        }
        // `\-` in a class is a literal, not a range: `[\-a]` holds `-` and `a` only.
        assert!(check("/[b\\-a]*c*").is_ok());
        assert!(check("/[b\\-a]*A*").is_err());
    }

    /// Items of the property tests' grammar (each a valid item on its own).
    fn item() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let atom =
            prop::sample::select(vec!["a", "B", "/", "\\d", "\\w", "[^/]", "[a-c]", ".", "(ab)", "(a|/)", "\\.", "$"]);
        let q = prop::sample::select(vec!["", "", "*", "+", "?", "{2}", "{1,3}"]);
        (atom, q).prop_map(|(a, q)| format!("{a}{q}"))
    }

    proptest::proptest! {
        /// Two repeats of one atom in a row are refused after any prefix; a refused pattern
        /// stays refused whatever follows (the rule reads left to right).
        #[test]
        fn the_rule_holds_after_any_prefix(
            pre in proptest::collection::vec(item(), 0..5),
            post in proptest::collection::vec(item(), 0..5),
            x in proptest::sample::select(vec!["a", "\\d", "[^/]", ".", "(ab)"]),
            q1 in proptest::sample::select(vec!["*", "+", "?", "{1,4}"]),
            q2 in proptest::sample::select(vec!["*", "+", "?", "{0,2}"]),
        ) {
            let pre = format!("/{}", pre.concat());
            let p = format!("{pre}{x}{q1}{x}{q2}");
            if let Err(e) = check(&p) {
                proptest::prop_assert!(!matches!(e, RegexError::TooLong { .. }), "{}", p);
            }
            if check(&pre).is_ok() || matches!(check(&pre), Err(RegexError::Overlap { .. })) {
                proptest::prop_assert!(check(&p).is_err(), "{p}");
            }
            if matches!(check(&pre), Err(RegexError::Overlap { .. })) {
                let longer = format!("{pre}{}", post.concat());
                proptest::prop_assert!(check(&longer).is_err(), "{longer}");
            }
        }

        /// An accepted pattern never holds two variable repeats of overlapping single-character
        /// atoms side by side (checked here by a direct scan of the generated items).
        #[test]
        fn accepted_patterns_hold_no_adjacent_overlapping_repeats(items in proptest::collection::vec(item(), 1..8)) {
            let p = format!("/{}", items.concat());
            let variable = |s: &str| s.ends_with(['*', '+', '?', '}']) && !s.ends_with("{2}");
            let chars = |s: &str| -> Vec<u8> {
                let a = s.trim_end_matches(['*', '+', '?']).split('{').next().unwrap_or("");
                match a {
                    "a" | "(ab)" => b"aA".to_vec(),
                    "B" => b"bB".to_vec(),
                    "[a-c]" => b"abcABC".to_vec(),
                    "(a|/)" => b"aA/".to_vec(),
                    "/" => b"/".to_vec(),
                    "\\." => b".".to_vec(),
                    "\\d" => b"0".to_vec(),
                    "\\w" => b"aAbB0".to_vec(),
                    "[^/]" => b"aAbB0.".to_vec(),
                    "." => b"aAbB0/.".to_vec(),
                    _ => Vec::new(),
                }
            };
            if check(&p).is_ok() {
                for w in items.windows(2) {
                    if variable(&w[0]) && variable(&w[1]) {
                        let (x, y) = (chars(&w[0]), chars(&w[1]));
                        proptest::prop_assert!(!x.iter().any(|c| y.contains(c)), "{p}: {} {}", w[0], w[1]);
                    }
                }
            }
        }
    }
}
