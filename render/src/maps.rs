//! The map builder: the Model's host/path/rule tables as HAProxy map files.
//!
//! Owns the map files and their keys, which the built-in template's lookups read:
//! - `maps/hosts.map`: exact host → host id; `maps/wildcards.map`: `.suffix` → host id (the
//!   request host less its first label is looked up, so `*.a.b` matches one label only);
//!   a request whose host matches neither uses the host id `*` (rules without a host).
//! - For Gateway API host tables (which serve one bind port each) the keys end in `@<port>`:
//!   `maps/hosts.map` holds `<host>@<port>` and, for a table serving any host, `@<port>`;
//!   `maps/suffixes.map` holds `.suffix@<port>`, read with `map_end`, longest first, so
//!   `*.example.com` matches any number of labels before `.example.com`.
//! - `maps/ports.map`: bind port → Gateway listener port (for redirects).
//! - `maps/listeners.map` (`<host>@<port>` and `@<port>`) and `maps/listener_suffixes.map`
//!   (`.suffix@<port>`, `map_end`, longest first): which HTTPS listener a name selects, for the
//!   SNI and the Host of a request.
//! - `maps/paths_exact.map`: `<host id><path>` → rule id, for Exact paths and for a Prefix
//!   path's own value (a segment-wise prefix matches itself).
//! - `maps/paths_prefix.map`: `<host id><prefix>/` → rule id, read with `map_beg`, longest key
//!   first (HAProxy takes the first matching line of a `beg` map), so `/foo` matches `/foo/…`
//!   and never `/foobar`; a host whose unmatched requests answer 404 gets `<host id>/` →
//!   `not_found` (no rule: `rules.map` gives the 404 backend) as its shortest key.
//! - `maps/paths_regex.map`: `^<host id>~(?i:<regex>)` → rule id ([`regex_key`]), read with
//!   `map_reg` after the exact map and before the prefix map (as nginx checks regex locations
//!   before prefixes), longest pattern first. The template looks it up with `<host id>~<path>`
//!   ([`regex_lookup`]): no host id holds [`REGEX_DELIM`], so a key's literal part `^<id>~`
//!   matches the lookup string of its own host id only, whatever the regex after it consumes
//!   (without the delimiter `^h1(?i:/?\d*/.*)` matched `h11/account`).
//! - `maps/rules.map`: rule id → backend name (`default` → the default backend).
//! - `maps/policies.map`: rule id → policy id, for the rules that have a policy.
//! - `maps/policy_timeouts.map`: policy id → server timeout in ms, for the policies that set one
//!   (read by a rule every backend inherits, so a timeout is a map entry, never a backend line).
//! - `maps/rewrites.map`: rule id → rewrite id, for the rules that rewrite their path.
//! - `maps/passthrough.map`: SNI host → `mode tcp` backend, for `ssl-passthrough` hosts.
//! - `maps/tls_terminate.map`: host id → bind port, for the host tables of Gateway TLS
//!   listeners that terminate TLS (their connections go to that port's decrypting frontend).
//! - `maps/canaries.map`: rule id → canary selector id; `maps/canary_backends.map` and
//!   `maps/main_backends.map`: rule id → its canary's and its main backend, for the rules with
//!   a canary (whose `rules.map` backend is the weighted one holding both).
//!
//! So adding, removing or retargeting a host/path route changes map contents only. A runtime
//! change replaces the changed maps one after another, in path order (the controller's plan
//! takes changed files sorted by path), and each map's id stands for one content whatever else
//! comes and goes. `maps/rules.map` sorts after the path maps and the per-rule maps: a rule just
//! added answers 404 until its policy, rewrite and canary entries are in, never without them.
//! It must never write a line other than through `haptic_haproxy::quote::map_line` (or `push_map_line`).

use std::collections::{BTreeMap, HashSet};

use haptic_haproxy::quote::{map_line, push_map_line, regex_literal, Inexpressible};

use crate::model::{HostLookup, HostMatch, Listeners, Model, PathKind, TlsListener, NOT_FOUND_RULE};
use crate::names::{MapFile, Var};

/// What ends a host id in the regex map's keys and lookup strings; no host id holds it.
pub const REGEX_DELIM: char = '~';

/// The sample expression the template's regex lookup reads: the host id, [`REGEX_DELIM`], the
/// path.
pub fn regex_lookup() -> String {
    format!("var({}),concat({REGEX_DELIM},{},)", Var::HostId, Var::Path)
}

/// The `maps/paths_regex.map` key of `regex` (checked by `haptic_haproxy::regex::check`) under
/// host id `hid`: `^<hid>~(?i:<regex>)`. Refuses a host id holding [`REGEX_DELIM`], whose key
/// could match another host's lookup string.
pub fn regex_key(hid: &str, regex: &str) -> Result<String, Inexpressible> {
    if hid.contains(REGEX_DELIM) {
        return Err(Inexpressible::HostIdDelimiter(hid.to_string()));
    }
    Ok(format!("^{}{REGEX_DELIM}(?i:{regex})", regex_literal(hid)?))
}

/// The map files (relative path → bytes), every one present even when empty.
pub fn build(model: &Model) -> Result<BTreeMap<String, Vec<u8>>, Inexpressible> {
    let mut hosts = String::new();
    let mut wild = String::new();
    let mut suffixes: Vec<(String, &str)> = Vec::new();
    let mut exact: Vec<(String, &str)> = Vec::new();
    let mut prefix: Vec<(String, &str)> = Vec::new();
    let mut regex: Vec<(String, &str)> = Vec::new();
    // The keys in `exact`, for the "an Exact entry wins" check (only asked whether it holds one).
    let mut exact_keys: HashSet<String> = HashSet::new();
    for t in &model.hosts {
        let at = t.port.map(|p| format!("@{p}")).unwrap_or_default();
        let hid = match &t.host {
            HostMatch::Exact(h) => {
                push_map_line(&mut hosts, &format!("{h}{at}"), &t.id)?;
                t.id.as_str()
            }
            HostMatch::Wildcard(suffix) => {
                push_map_line(&mut wild, suffix, &t.id)?;
                t.id.as_str()
            }
            HostMatch::Suffix(suffix) => {
                suffixes.push((format!("{suffix}{at}"), t.id.as_str()));
                t.id.as_str()
            }
            HostMatch::Any if t.port.is_some() => {
                push_map_line(&mut hosts, &at, &t.id)?;
                t.id.as_str()
            }
            HostMatch::Any => "*",
        };
        for p in &t.paths {
            let full = format!("{hid}{}", p.path);
            match p.kind {
                PathKind::Regex => regex.push((regex_key(hid, &p.path)?, &p.rule)),
                PathKind::Exact => {
                    exact_keys.insert(full.clone());
                    exact.push((full, &p.rule));
                }
                PathKind::Prefix => {
                    // An Exact entry of the same path wins (it was sorted first).
                    if !exact_keys.contains(&full) {
                        exact_keys.insert(full.clone());
                        exact.push((full.clone(), &p.rule));
                    }
                    let beg = if p.path == "/" { full } else { full + "/" };
                    prefix.push((beg, &p.rule));
                }
            }
        }
        // The shortest key of the host: only what no path of it matches.
        if t.unmatched_not_found && !t.paths.iter().any(|p| p.kind == PathKind::Prefix && p.path == "/") {
            prefix.push((format!("{hid}/"), NOT_FOUND_RULE));
        }
    }
    // Longest first; ties by key so the bytes are deterministic.
    prefix.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    regex.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    exact.sort();
    suffixes.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    let mut out = BTreeMap::new();
    rule_maps(model, &mut out)?;
    out.insert(MapFile::Hosts.name().to_string(), hosts.into_bytes());
    out.insert(MapFile::Wildcards.name().to_string(), wild.into_bytes());
    out.insert(MapFile::PathsExact.name().to_string(), lines(&exact)?.into_bytes());
    out.insert(MapFile::PathsPrefix.name().to_string(), lines(&prefix)?.into_bytes());
    out.insert(MapFile::PathsRegex.name().to_string(), lines(&regex)?.into_bytes());
    let mut pt = String::new();
    for p in &model.passthrough {
        push_map_line(&mut pt, &p.host, &p.backend)?;
    }
    out.insert(MapFile::Passthrough.name().to_string(), pt.into_bytes());
    let mut term = String::new();
    for f in &model.frontends {
        if let HostLookup::Sni(ts) = &f.hosts {
            for t in ts {
                for id in &t.tables {
                    push_map_line(&mut term, id, &t.port.to_string())?;
                }
            }
        }
    }
    out.insert(MapFile::TlsTerminate.name().to_string(), term.into_bytes());
    let listeners: Vec<&Listeners> = model
        .frontends
        .iter()
        .filter_map(|f| match &f.hosts {
            HostLookup::Listener(l) => Some(l),
            HostLookup::Host | HostLookup::Sni(_) | HostLookup::Port => None,
        })
        .collect();
    if !listeners.is_empty() {
        listener_maps(&listeners, &suffixes, &mut out)?;
    }
    Ok(out)
}

/// The map lines of `v`'s (key, value) pairs.
fn lines(v: &[(String, &str)]) -> Result<String, Inexpressible> {
    let mut out = String::with_capacity(v.iter().map(|(k, r)| k.len() + r.len() + 2).sum());
    for (k, r) in v {
        push_map_line(&mut out, k, r)?;
    }
    Ok(out)
}

/// The per-rule maps: each rule's backend, policy, rewrite and canary parts.
fn rule_maps(model: &Model, out: &mut BTreeMap<String, Vec<u8>>) -> Result<(), Inexpressible> {
    let mut rules = String::new();
    let mut policies = String::new();
    let mut rewrites = String::new();
    let (mut canaries, mut canary_be, mut main_be) = (String::new(), String::new(), String::new());
    for r in &model.rules {
        if let Some(c) = &r.canary {
            push_map_line(&mut canary_be, &r.id, &c.canary)?;
            push_map_line(&mut main_be, &r.id, &c.main)?;
            if let Some(s) = &c.selector {
                push_map_line(&mut canaries, &r.id, s)?;
            }
        }
        push_map_line(&mut rules, &r.id, &r.backend)?;
        if let Some(p) = &r.policy {
            push_map_line(&mut policies, &r.id, p)?;
        }
        if let Some(w) = &r.rewrite {
            push_map_line(&mut rewrites, &r.id, w)?;
        }
    }
    out.insert(MapFile::Rules.name().to_string(), rules.into_bytes());
    out.insert(MapFile::Rewrites.name().to_string(), rewrites.into_bytes());
    out.insert(MapFile::Canaries.name().to_string(), canaries.into_bytes());
    out.insert(MapFile::CanaryBackends.name().to_string(), canary_be.into_bytes());
    out.insert(MapFile::MainBackends.name().to_string(), main_be.into_bytes());
    out.insert(MapFile::Policies.name().to_string(), policies.into_bytes());
    let mut timeouts = String::new();
    for p in &model.policies {
        if let Some(ms) = p.policy.timeout_ms {
            push_map_line(&mut timeouts, &p.id, &ms.to_string())?;
        }
    }
    out.insert(MapFile::PolicyTimeouts.name().to_string(), timeouts.into_bytes());
    Ok(())
}

/// The maps of frontends that look hosts up by listener: host suffixes, bind port → listener
/// port, and the TLS listeners.
fn listener_maps(
    listeners: &[&Listeners],
    suffixes: &[(String, &str)],
    out: &mut BTreeMap<String, Vec<u8>>,
) -> Result<(), Inexpressible> {
    out.insert(MapFile::Suffixes.name().to_string(), lines(suffixes)?.into_bytes());
    let ports = listeners.iter().flat_map(|l| l.ports.iter());
    let ports: String = ports.map(|(b, l)| map_line(&b.to_string(), &l.to_string())).collect::<Result<_, _>>()?;
    out.insert(MapFile::Ports.name().to_string(), ports.into_bytes());
    let (mut exact, mut suffix) = (String::new(), Vec::new());
    for TlsListener { port, host, id } in listeners.iter().flat_map(|l| l.tls.iter()) {
        match host {
            Some(HostMatch::Exact(h)) => push_map_line(&mut exact, &format!("{h}@{port}"), id)?,
            Some(HostMatch::Suffix(s)) => suffix.push((format!("{s}@{port}"), id.as_str())),
            _ => push_map_line(&mut exact, &format!("@{port}"), id)?,
        }
    }
    suffix.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    out.insert(MapFile::Listeners.name().to_string(), exact.into_bytes());
    out.insert(MapFile::ListenerSuffixes.name().to_string(), lines(&suffix)?.into_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An accepted regex path (each passes `haptic_haproxy::regex::check`), including forms that
    /// consume digits and slashes at their start, as an attacker's would.
    fn accepted_regex() -> impl Strategy<Value = String> {
        let atom = prop::sample::select(vec![
            "/", "/?", "\\d*", "\\d+", "[0-9]*", ".*", "[^/]*", "1", "h", "a", "(/|$)", "\\w*", "~", "[~]", ".",
        ]);
        prop::collection::vec(atom, 1..6)
            .prop_map(|v| format!("/{}", v.concat()))
            .prop_filter("accepted", |p| haptic_haproxy::regex::check(p).is_ok())
    }

    /// A host id as the translators make them (`h<16 hex>`), one of other widths, or `*`.
    fn host_id() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u32..200_000).prop_map(|n| format!("h{n}")),
            "[0-9a-f]{16}".prop_map(|x| format!("h{x}")),
            Just("*".to_string()),
        ]
    }

    /// The map giving a rule its backend is replaced last of those naming rule ids (see the
    /// module's opening): a rename that sorts another one after it fails here.
    #[test]
    fn the_rules_map_sorts_after_every_map_naming_a_rule() {
        let names: Vec<String> = build(&Model::default()).unwrap().into_keys().collect();
        let rule_maps = [
            MapFile::PathsExact.name(),
            MapFile::PathsPrefix.name(),
            MapFile::PathsRegex.name(),
            MapFile::Policies.name(),
            MapFile::PolicyTimeouts.name(),
            MapFile::Rewrites.name(),
            MapFile::Canaries.name(),
            MapFile::CanaryBackends.name(),
            MapFile::MainBackends.name(),
        ];
        let at = |n: &str| names.iter().position(|m| m == n).unwrap_or_else(|| panic!("{n} not in {names:?}"));
        for m in rule_maps {
            assert!(at(m) < at(MapFile::Rules.name()), "{m} after {} in {names:?}", MapFile::Rules);
        }
    }

    /// The lookup string the template builds (see [`regex_lookup`]).
    fn lookup(hid: &str, path: &str) -> String {
        format!("{hid}{REGEX_DELIM}{path}")
    }

    proptest! {
        /// A key built for host id A never matches a lookup string of host id B ≠ A, whatever
        /// the path; and it matches its own host's lookup of a path its regex matches. PCRE and
        /// the `regex` crate agree on the accepted subset's literal prefix and on these atoms.
        #[test]
        fn a_regex_key_never_matches_another_hosts_lookup(
            a in host_id(), b in host_id(), re in accepted_regex(), path in "/[a-z0-9/~h]{0,12}",
        ) {
            prop_assume!(a != b);
            let key = regex_key(&a, &re).unwrap();
            let m = regex::Regex::new(&key).unwrap();
            prop_assert!(!m.is_match(&lookup(&b, &path)), "{key} matched {}", lookup(&b, &path));
            let own = regex::Regex::new(&format!("^(?i:{re})")).unwrap();
            prop_assert_eq!(m.is_match(&lookup(&a, &path)), own.is_match(&path));
        }
    }

    #[test]
    fn the_reported_cross_host_regex_stays_on_its_host() {
        let key = regex_key("h1", "/?\\d*/.*").unwrap();
        let m = regex::Regex::new(&key).unwrap();
        assert!(!m.is_match(&lookup("h11", "/account")));
        assert!(m.is_match(&lookup("h1", "/account")));
        assert!(matches!(regex_key("h~1", "/a"), Err(Inexpressible::HostIdDelimiter(_))));
    }

    #[test]
    fn the_template_looks_the_regex_map_up_with_the_delimited_string() {
        assert_eq!(regex_lookup(), "var(txn.hostid),concat(~,txn.path,)");
        assert!(crate::template::BUILTIN.contains("{{ regex_lookup }},map_reg({{ maps.paths_regex }})"));
    }
}
