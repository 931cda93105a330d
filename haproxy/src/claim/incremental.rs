//! The runtime claim and the config diff at the cost of the change, not of the config.
//!
//! Owns [`IndexedCfg`] (a parsed config that remembers where each line of its text went) and
//! the incremental comparison: a line diff of the two texts first, then only the changed lines
//! tokenized and compared against the parsed running config. When every changed line is a
//! `server` line keeping its name, in a section where it can be compared alone, the result is
//! the one [`super::diff_parsed`] and [`super::verify_runtime_claim_parsed`] give on fully
//! parsed configs (those stay the oracle, tested against this one); any other change falls back
//! to them. It must never do I/O and never answer differently from the full comparison.

use std::collections::BTreeMap;

use super::{
    check_claim, diff_parsed, line_part, push_section_reasons, server_change, server_name, servers_by_name,
    verify_runtime_claim_parsed, CfgDiff, ChangedFile, ClaimError, OpsByTarget, ReloadReason, ServerChange,
};
use crate::cfg::{self, parse_server, tokenize, Config, LineSlot, ServerLine};
use haptic_protocol::Op;

/// A parsed config with where each line of its text went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedCfg {
    config: Config,
    /// One slot per line of the text (`str::lines`).
    slots: Vec<LineSlot>,
    /// Per section: whether a changed `server` line in it can be compared alone. True for a
    /// `backend` or `listen` section whose server names are unique and whose name no other such
    /// section has: a server keeping its name is then the one server of that name in the whole
    /// config, matched by position exactly as the full comparison matches it by name.
    alone: Vec<bool>,
}

/// One changed line of a config: body line `line` of section `section` is now `tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineEdit {
    section: usize,
    line: usize,
    tokens: Vec<String>,
}

/// The new config of an incremental comparison: edits of the old one, or parsed in full when
/// the change was not one the incremental comparison takes.
#[derive(Debug, Clone)]
pub enum NewCfg {
    /// The old config with these lines replaced (same lines, same sections).
    Edits(Vec<LineEdit>),
    /// The new config, parsed.
    Parsed(IndexedCfg),
}

impl IndexedCfg {
    /// Parses `text` (as [`cfg::parse`] does) and indexes its lines.
    pub fn parse(text: &str) -> Self {
        let mut slots = Vec::new();
        let config = cfg::parse_with_slots(text, |s| slots.push(s));
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        for s in config.sections.iter().filter(|s| s.has_servers()) {
            *names.entry(s.name.as_deref().unwrap_or_default()).or_default() += 1;
        }
        let alone = config
            .sections
            .iter()
            .map(|s| {
                if !s.has_servers() || names.get(s.name.as_deref().unwrap_or_default()) != Some(&1) {
                    return false;
                }
                let mut seen = std::collections::BTreeSet::new();
                s.lines.iter().filter_map(|l| server_name(l)).all(|n| seen.insert(n))
            })
            .collect();
        IndexedCfg { config, slots, alone }
    }

    /// The parsed config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// This config after `new`: the edits applied in place, or the new parse.
    pub fn update(&mut self, new: NewCfg) {
        match new {
            NewCfg::Edits(edits) => {
                for e in edits {
                    self.config.sections[e.section].lines[e.line] = e.tokens;
                }
            }
            NewCfg::Parsed(p) => *self = p,
        }
    }

    /// The changed lines between `old_text` (the text this was parsed from) and `new_text`, when
    /// every one of them is a `server` line keeping its name in a section where it can be
    /// compared alone (lines that differ only in blanks or comments are no change); `None`
    /// otherwise, or when `old_text` is not the text this was parsed from line for line.
    fn line_edits(&self, old_text: &str, new_text: &str) -> Option<Vec<LineEdit>> {
        let (mut old_lines, mut new_lines) = (old_text.lines(), new_text.lines());
        let mut edits = Vec::new();
        let mut i = 0;
        loop {
            let (a, b) = match (old_lines.next(), new_lines.next()) {
                (None, None) => break,
                (Some(a), Some(b)) => (a, b),
                _ => return None,
            };
            let slot = *self.slots.get(i)?;
            i += 1;
            if a == b {
                continue;
            }
            let tokens = tokenize(b);
            match slot {
                LineSlot::Body { section, line } => {
                    let (section, line) = (section as usize, line as usize);
                    let old = &self.config.sections[section].lines[line];
                    if *old == tokens {
                        continue;
                    }
                    let same_server = server_name(old).is_some() && server_name(old) == server_name(&tokens);
                    if !self.alone[section] || !same_server {
                        return None;
                    }
                    edits.push(LineEdit { section, line, tokens });
                }
                LineSlot::Blank | LineSlot::Preamble | LineSlot::Header(_) => {
                    if tokenize(a) != tokens {
                        return None;
                    }
                }
            }
        }
        (i == self.slots.len()).then_some(edits)
    }

    /// The diff that [`super::diff_parsed`] gives for these edits: each changed line is a server
    /// change or a reload reason of its section.
    fn diff_edits(&self, edits: &[LineEdit]) -> CfgDiff {
        let mut out = CfgDiff::default();
        let mut at = 0;
        while at < edits.len() {
            let section = &self.config.sections[edits[at].section];
            let group = edits[at..].iter().take_while(|e| e.section == edits[at].section);
            let mut reasons = Vec::new();
            let mut n = 0;
            for e in group {
                n += 1;
                match server_change(true, &section.lines[e.line], &e.tokens) {
                    Ok((old, new)) => out.servers.push(ServerChange {
                        backend: section.name.clone().unwrap_or_default(),
                        server: old.name.clone(),
                        old,
                        new,
                    }),
                    Err(why) => reasons.push(ReloadReason::new(
                        line_part(section, &section.lines[e.line]),
                        format!("{}: {why}", section.label()),
                    )),
                }
            }
            push_section_reasons(section, reasons, &mut out);
            at += n;
        }
        out
    }
}

/// [`super::diff_cfg`] of `old` (parsed from `old_text`) and `new_text`, comparing only the
/// changed lines when it can; also the new config, for the caller to keep.
pub fn diff_indexed(old: &IndexedCfg, old_text: &str, new_text: &str) -> (CfgDiff, NewCfg) {
    match old.line_edits(old_text, new_text) {
        Some(edits) => (old.diff_edits(&edits), NewCfg::Edits(edits)),
        None => {
            let new = IndexedCfg::parse(new_text);
            (diff_parsed(&old.config, &new.config), NewCfg::Parsed(new))
        }
    }
}

/// [`super::verify_runtime_claim`] of `old` (parsed from `old_text`) and `new_text`, comparing
/// only the changed lines when it can; also the new config, for the caller to keep.
pub fn verify_runtime_claim_indexed(
    old: &IndexedCfg,
    old_text: &str,
    new_text: &str,
    changed: &[ChangedFile<'_>],
    ops: &[Op],
) -> (Result<(), ClaimError>, NewCfg) {
    let membership_ops = ops.iter().any(|op| matches!(op, Op::ServerAdd(_) | Op::ServerDel(_) | Op::BackendAdd(_)));
    let edits = if membership_ops { None } else { old.line_edits(old_text, new_text) };
    let Some(edits) = edits else {
        let new = IndexedCfg::parse(new_text);
        return (verify_runtime_claim_parsed(&old.config, &new.config, changed, ops), NewCfg::Parsed(new));
    };
    let diff = old.diff_edits(&edits);
    let by = OpsByTarget::of(ops);
    // The server lines a `server.set` can name: the changed ones, and, only when an op names
    // another server, every unchanged one (each changed server is the only one of its name).
    let mut new_servers = BTreeMap::new();
    if !by.server.is_empty() {
        let edited: Vec<((String, String), ServerLine)> = edits
            .iter()
            .filter_map(|e| {
                let backend = old.config.sections[e.section].name.clone().unwrap_or_default();
                parse_server(&e.tokens).map(|l| ((backend, l.name.clone()), l))
            })
            .collect();
        if !by.server.keys().all(|(b, s)| edited.iter().any(|((eb, es), _)| eb == b && es == s)) {
            new_servers = servers_by_name(&old.config);
        }
        new_servers.extend(edited);
    }
    // No `server.add` or `server.del` op, and the edits add or delete no server.
    let res = check_claim(&diff, &by, &new_servers, changed, |_| {});
    (res, NewCfg::Edits(edits))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::claim::{diff_cfg, verify_runtime_claim};
    use haptic_protocol::ServerSet;

    const BASE: &str = "global\n  maxconn 10\nbackend be_a\n  balance roundrobin\n  server s1 10.0.0.1:80 weight 5\n  # note\n  server s2 10.0.0.2:80 check\nbackend be_b\n  server s1 10.0.0.3:80\n";

    #[test]
    fn an_address_change_is_compared_alone_and_kept_as_an_edit() {
        let old = IndexedCfg::parse(BASE);
        let new_text = BASE.replace("10.0.0.2:80", "10.0.0.9:81");
        let (diff, new) = diff_indexed(&old, BASE, &new_text);
        assert_eq!(diff, diff_cfg(BASE, &new_text));
        assert!(matches!(&new, NewCfg::Edits(e) if e.len() == 1), "{new:?}");
        let ops = diff.server_ops();
        let (res, new) = verify_runtime_claim_indexed(&old, BASE, &new_text, &[], &ops);
        assert_eq!(res, Ok(()));
        let mut kept = old.clone();
        kept.update(new);
        assert_eq!(kept, IndexedCfg::parse(&new_text));
        // Without its op the claim fails, with the full comparison's reasons.
        let (res, _) = verify_runtime_claim_indexed(&old, BASE, &new_text, &[], &[]);
        assert_eq!(res, verify_runtime_claim(BASE, &new_text, &[], &[]));
        assert!(res.is_err());
    }

    #[test]
    fn other_changes_fall_back_to_the_full_parse() {
        let old = IndexedCfg::parse(BASE);
        for new_text in [
            BASE.replace("balance roundrobin", "balance source"),
            BASE.replace("  server s2 10.0.0.2:80 check\n", ""),
            BASE.replace("server s2", "server s3"),
            BASE.replace("maxconn 10", "maxconn 11"),
        ] {
            let (diff, new) = diff_indexed(&old, BASE, &new_text);
            assert_eq!(diff, diff_cfg(BASE, &new_text));
            assert!(matches!(new, NewCfg::Parsed(_)), "{new_text}");
        }
        // A text the index was not built from is never compared line by line.
        let (_, new) = diff_indexed(&old, "global\n", "global\n");
        assert!(matches!(new, NewCfg::Parsed(_)));
    }

    fn line() -> impl Strategy<Value = String> {
        let server = (0u8..4, 1u8..4, prop::sample::select(vec![80u16, 81]), 0u32..3, any::<bool>(), 0u8..3).prop_map(
            |(n, a, port, w, dis, p)| {
                let w = [String::new(), " weight 7".into(), " weight 300".into()][w as usize].clone();
                let d = if dis { " disabled" } else { "" };
                let p = ["", " check", " app.local"][p as usize];
                format!("  server s{n} 10.0.0.{a}:{port}{w}{d}{p}")
            },
        );
        prop_oneof![
            4 => server,
            1 => prop::sample::select(vec![
                "  balance roundrobin".to_string(),
                "  balance source".into(),
                "  mode http".into(),
                "  # a comment".into(),
                "".into(),
                "backend be_0".into(),
                "backend be_1".into(),
                "listen li".into(),
                "frontend fe".into(),
                "defaults".into(),
                "  server s9 app.local:80".into(),
                "  server s1 '10.0.0.1:80'".into(),
                "  default-server check".into(),
            ]),
        ]
    }

    /// Backends of servers with unique names (the common shape), with other lines mixed in:
    /// blanks, comments, directives, sections, duplicate names.
    fn config() -> impl Strategy<Value = Vec<String>> {
        let backend = (0u8..3, prop::collection::btree_map(0u8..12, line(), 0..6));
        (prop::collection::vec(backend, 1..4), prop::collection::vec((any::<prop::sample::Index>(), line()), 0..3))
            .prop_map(|(backends, extra)| {
                let mut ls = Vec::new();
                for (b, servers) in backends {
                    ls.push(format!("backend be_{b}"));
                    for (n, l) in servers {
                        let rest: Vec<&str> = l.split_whitespace().skip(2).collect();
                        ls.push(match l.trim_start().starts_with("server") {
                            true => format!("  server s{n} {}", rest.join(" ")),
                            false => l,
                        });
                    }
                }
                for (at, l) in extra {
                    ls.insert(at.index(ls.len() + 1).max(1), l);
                }
                ls
            })
    }

    /// An edit: at a line (picked by `Index`), one of: replace it, give it the server name it
    /// had (a runtime-looking change), pad it with blanks, insert a line, delete it.
    fn edit(mut lines: Vec<String>, edits: &[(prop::sample::Index, u8, String)]) -> Vec<String> {
        for (at, kind, with) in edits {
            if lines.is_empty() {
                lines.push(with.clone());
                continue;
            }
            let i = at.index(lines.len());
            match kind {
                0 => lines[i] = with.clone(),
                1 | 2 => {
                    let name = lines[i].split_whitespace().nth(1).map(str::to_string);
                    if let (true, Some(name), true) =
                        (lines[i].trim_start().starts_with("server"), name, with.trim_start().starts_with("server"))
                    {
                        let rest: Vec<&str> = with.split_whitespace().skip(2).collect();
                        lines[i] = format!("  server {name} {}", rest.join(" "));
                    }
                }
                3 => lines[i].push_str("   # c"),
                4 => lines.insert(i, with.clone()),
                _ => {
                    lines.remove(i);
                }
            }
        }
        lines
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn the_incremental_comparison_agrees_with_the_full_one(
            lines in config(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), prop_oneof![3 => Just(1u8), 1 => 0u8..6], line()), 0..4),
            ops_kind in 0u8..4,
            weight in 0u32..3,
        ) {
            let old_text = format!("global\n  maxconn 10\n{}\n", lines.join("\n"));
            let new_text = format!("global\n  maxconn 10\n{}\n", edit(lines, &edits).join("\n"));
            let old = IndexedCfg::parse(&old_text);
            let (diff, new) = diff_indexed(&old, &old_text, &new_text);
            prop_assert_eq!(&diff, &diff_cfg(&old_text, &new_text));
            let mut kept = old.clone();
            kept.update(new);
            prop_assert_eq!(&kept, &IndexedCfg::parse(&new_text));

            let mut ops = diff.server_ops();
            match ops_kind {
                0 => {}
                1 => { ops.pop(); }
                2 => ops.push(Op::ServerSet(ServerSet {
                    backend: "be_0".into(), server: "s1".into(), addr: None, port: None, weight: Some(weight), state: None,
                })),
                _ => ops.push(Op::ServerSet(ServerSet {
                    backend: "be_1".into(), server: "s2".into(), addr: Some("10.0.0.2".into()), port: Some(80), weight: None, state: None,
                })),
            }
            let (res, new) = verify_runtime_claim_indexed(&old, &old_text, &new_text, &[], &ops);
            prop_assert_eq!(res, verify_runtime_claim(&old_text, &new_text, &[], &ops));
            let mut kept = old;
            kept.update(new);
            prop_assert_eq!(kept, IndexedCfg::parse(&new_text));
        }
    }
}
