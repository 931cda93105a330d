//! The overlap rule of [`super::check`]: which sequences of repeats an accepted pattern may hold
//! so that a backtracking matcher (PCRE2) stays linear in the subject's length.
//!
//! Owns [`first_overlap`]. A *variable* repeat is a quantifier whose count is not fixed (`*`, `+`,
//! `?`, `{n,}`, `{n,m}` with n < m); its *atom set* is the set of characters its atom can match
//! (for a group, every character any of its items can match). Letters are folded to both cases,
//! as the pattern is matched case-insensitively. Reading the pattern left to right, along every
//! alternative, a set of *live* characters is kept: those some earlier variable repeat could
//! still take. The rule: **a variable repeat whose atom set meets the live set is refused**.
//! A mandatory item (a character, class or group that must match at least once) whose set
//! does not meet the live set ends every earlier repeat (none of them can take it), so the live
//! set empties; one that meets it leaves the live set as it is. Then the repeat's own atom set
//! joins the live set. So `/a*a*`, `/.*/.*`, `/a*b?a*`, `/[a-z]*[A-Z]*` and `/(ab)*a*` are
//! refused; `/[^/]*/.*`, `/a*b*`, `/v[0-9]+/users`, `/a*ba*` pass. Two repeats that can
//! both take the same character split a run of it in as many ways as the run is long, so `k`
//! such repeats cost a failing match `n^k` steps; with no two of them live at once each
//! character is taken by one repeat at a time and a failing match costs steps in proportion to
//! the subject's length times the pattern's. Pure: reads the pattern only; it must be called on
//! a pattern the syntax rules of [`super::check`] accepted (it assumes balanced groups and
//! classes).

/// A set of characters: the ASCII ones bit by bit, and whether any non-ASCII character.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(super) struct Set {
    ascii: u128,
    high: bool,
}

impl Set {
    const ALL: Set = Set { ascii: u128::MAX, high: true };

    fn byte(c: u8) -> Set {
        let mut s = Set::default();
        s.add(c);
        s
    }

    /// Adds `c`, in both cases when it is a letter.
    fn add(&mut self, c: u8) {
        for c in [c.to_ascii_lowercase(), c.to_ascii_uppercase()] {
            if c.is_ascii() {
                self.ascii |= 1u128 << c;
            } else {
                self.high = true;
            }
        }
    }

    fn union(self, o: Set) -> Set {
        Set { ascii: self.ascii | o.ascii, high: self.high || o.high }
    }

    fn meets(self, o: Set) -> bool {
        self.ascii & o.ascii != 0 || (self.high && o.high)
    }

    fn negate(self) -> Set {
        Set { ascii: !self.ascii, high: !self.high }
    }

    fn of(pred: impl Fn(u8) -> bool) -> Set {
        let mut s = Set::default();
        (0u8..128).filter(|c| pred(*c)).for_each(|c| s.add(c));
        s
    }
}

/// One item of a sequence: its atom and its count.
#[derive(Debug)]
struct Item {
    atom: Atom,
    min: u32,
    max: Option<u32>,
    at: usize,
}

#[derive(Debug)]
enum Atom {
    Chars(Set),
    /// A group: its alternatives.
    Group(Vec<Vec<Item>>),
    /// An anchor or assertion: matches no character.
    Empty,
}

/// The offset of the first variable repeat that breaks the rule, if any.
pub(super) fn first_overlap(pattern: &[u8]) -> Option<usize> {
    let mut i = 0;
    let alts = alternatives(pattern, &mut i);
    alts.iter().find_map(|seq| walk(seq, Set::default()).err())
}

/// Reads alternatives until a `)` (consumed) or the end.
fn alternatives(b: &[u8], i: &mut usize) -> Vec<Vec<Item>> {
    let mut alts = vec![Vec::new()];
    while *i < b.len() {
        let at = *i;
        let atom = match b[at] {
            b')' => {
                *i += 1;
                return alts;
            }
            b'|' => {
                alts.push(Vec::new());
                *i += 1;
                continue;
            }
            b'(' => {
                *i += if b.get(at + 1) == Some(&b'?') { 3 } else { 1 };
                Atom::Group(alternatives(b, i))
            }
            b'[' => {
                let (set, end) = class(b, at);
                *i = end;
                Atom::Chars(set)
            }
            b'\\' => {
                *i += 2;
                escape(b[at + 1]).map_or(Atom::Empty, Atom::Chars)
            }
            b'^' | b'$' => {
                *i += 1;
                Atom::Empty
            }
            b'.' => {
                *i += 1;
                Atom::Chars(Set::ALL)
            }
            c => {
                *i += 1;
                Atom::Chars(Set::byte(c))
            }
        };
        let (min, max) = quantifier(b, i);
        if let Some(seq) = alts.last_mut() {
            seq.push(Item { atom, min, max, at });
        }
    }
    alts
}

/// Reads the quantifier at `b[*i]`, if any: its counts (1, 1 without one).
fn quantifier(b: &[u8], i: &mut usize) -> (u32, Option<u32>) {
    let q = match b.get(*i) {
        Some(b'*') => (0, None),
        Some(b'+') => (1, None),
        Some(b'?') => (0, Some(1)),
        Some(b'{') => match super::counts(b, *i) {
            Ok((end, lo, hi)) => {
                *i = end;
                return (lo, hi);
            }
            Err(_) => return (1, Some(1)),
        },
        _ => return (1, Some(1)),
    };
    *i += 1;
    q
}

/// The set of the escape `\c`, or `None` for an assertion (`\b`, `\B`).
fn escape(c: u8) -> Option<Set> {
    let digit = Set::of(|c| c.is_ascii_digit());
    let word = Set::of(|c| c.is_ascii_alphanumeric() || c == b'_');
    // PCRE2's \s: space, \t, \n, \v, \f, \r.
    let space = Set::of(|c| matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'));
    Some(match c {
        b'd' => digit,
        b'D' => digit.negate(),
        b'w' => word,
        b'W' => word.negate(),
        b's' => space,
        b'S' => space.negate(),
        b'b' | b'B' => return None,
        c => Set::byte(c),
    })
}

/// The class at `b[start] == '['`: its set and the index after its `]`.
fn class(b: &[u8], start: usize) -> (Set, usize) {
    let mut i = start + 1;
    let negated = b.get(i) == Some(&b'^');
    if negated {
        i += 1;
    }
    let mut set = Set::default();
    let mut prev: Option<u8> = None;
    while i < b.len() && b[i] != b']' {
        let (c, single) = if b[i] == b'\\' {
            i += 2;
            match escape(b[i - 1]) {
                Some(s) if b[i - 1].is_ascii_punctuation() => (b[i - 1], Some(s)),
                s => {
                    set = set.union(s.unwrap_or_default());
                    prev = None;
                    continue;
                }
            }
        } else {
            i += 1;
            (b[i - 1], None)
        };
        match prev {
            Some(lo) if c == b'-' && single.is_none() && i < b.len() && b[i] != b']' => {
                let hi = if b[i] == b'\\' { b[i + 1] } else { b[i] };
                i += if b[i] == b'\\' { 2 } else { 1 };
                (lo..=hi).for_each(|x| set.add(x));
                prev = None;
            }
            _ => {
                set = set.union(single.unwrap_or_else(|| Set::byte(c)));
                prev = Some(c);
            }
        }
    }
    (if negated { set.negate() } else { set }, i + 1)
}

/// Every character `atom` can match.
fn chars(atom: &Atom) -> Set {
    match atom {
        Atom::Chars(s) => *s,
        Atom::Group(alts) => alts.iter().flatten().fold(Set::default(), |s, it| s.union(chars(&it.atom))),
        Atom::Empty => Set::default(),
    }
}

/// Walks one sequence from the live set `live`: the live set after it, or the offset of the
/// first variable repeat that meets a live set.
fn walk(seq: &[Item], mut live: Set) -> Result<Set, usize> {
    for it in seq {
        let set = chars(&it.atom);
        let variable = it.max != Some(it.min);
        if variable && set.meets(live) {
            return Err(it.at);
        }
        // The live set after the atom's own items (a group's inside, along each alternative).
        let inner = match &it.atom {
            Atom::Group(alts) => {
                let mut out = Set::default();
                for seq in alts {
                    out = out.union(walk(seq, live)?);
                }
                out
            }
            Atom::Chars(_) if it.min >= 1 && !set.meets(live) => Set::default(),
            Atom::Chars(_) | Atom::Empty => live,
        };
        live = if it.min == 0 { live.union(inner) } else { inner };
        if variable {
            live = live.union(set);
        }
    }
    Ok(live)
}
