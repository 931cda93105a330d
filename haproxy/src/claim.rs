//! The runtime claim: whether a change can land through the runtime API alone.
//!
//! Owns the structural comparison of two `haproxy.cfg` texts (only server address, port, weight
//! and enabled/disabled may differ, a plain backend may gain or lose `server` lines that HAProxy
//! 2.6 to 3.4 can add or delete at runtime, and the config may gain plain backend sections of
//! such lines after a named `defaults` section, which HAProxy 3.4 adds at runtime) and the check
//! that a set of ops covers exactly what changed. The controller's plan diff and the agent's
//! verification both call it, so both sides agree on what "runtime" means; which op kinds an
//! agent's HAProxy runs is the agent's capabilities, not this module's. It must never do I/O and
//! never call a change runtime-safe unless every changed token is one HAProxy can set at runtime
//! with a well-formed value, on every version that runs the op.

use std::collections::{BTreeMap, BTreeSet};

use crate::cfg::{self, parse_server, ServerLine};
use crate::cli::command::check_add_server_params;
use haptic_protocol::ops::{valid_name, BackendAdd, Op, ServerAdd, ServerDel, ServerSet, ServerState, MAX_WEIGHT};
use haptic_protocol::RelPath;

mod incremental;
pub use incremental::{diff_indexed, verify_runtime_claim_indexed, IndexedCfg, LineEdit, NewCfg};

/// The most reload reasons listed per section before they are summarised.
const MAX_REASONS_PER_SECTION: usize = 3;

/// Where in a config a change that needs a reload is: what an operator asks of a fleet's reloads
/// (the controller counts reloads by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigPart {
    /// Lines before the first section, or a `global` section.
    Global,
    /// A `defaults` section.
    Defaults,
    /// A listener: a `bind` line of a `frontend` or `listen` section, or such a section added or
    /// removed (a port HAProxy cannot open or close at runtime).
    Listener,
    /// A `frontend` or `listen` section's other lines (its rules).
    Frontend,
    /// A `backend` section's own lines, or a backend added or removed where that is a reload.
    Backend,
    /// A backend's `server` lines, where the runtime API cannot make the change.
    Server,
    /// Any other section (`userlist`, `resolvers`, `http-errors`, `peers`, …).
    OtherSection,
    /// The same sections in another order.
    Order,
}

impl ConfigPart {
    /// The part a section of this kind (its header's keyword) is.
    pub fn of_kind(kind: &str) -> Self {
        match kind {
            "global" => Self::Global,
            "defaults" => Self::Defaults,
            "frontend" | "listen" => Self::Frontend,
            "backend" => Self::Backend,
            _ => Self::OtherSection,
        }
    }

    /// The part a section (`backend be_app`) added or removed is: a `frontend` or `listen` is a
    /// listener.
    fn of_header(header: &str) -> Self {
        match Self::of_kind(header.split_whitespace().next().unwrap_or_default()) {
            Self::Frontend => Self::Listener,
            part => part,
        }
    }

    /// A metric label: `global`, `defaults`, `listener`, `frontend`, `backend`, `server`,
    /// `other_section`, `order`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Global => "global",
            Self::Defaults => "defaults",
            Self::Listener => "listener",
            Self::Frontend => "frontend",
            Self::Backend => "backend",
            Self::Server => "server",
            Self::OtherSection => "other_section",
            Self::Order => "order",
        }
    }
}

/// One change that needs a reload: where it is, and in human words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadReason {
    /// The part of the config it is in.
    pub part: ConfigPart,
    /// What changed, e.g. `frontend fe: added "bind :8443"`.
    pub text: String,
}

impl ReloadReason {
    fn new(part: ConfigPart, text: impl Into<String>) -> Self {
        Self { part, text: text.into() }
    }
}

impl std::fmt::Display for ReloadReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// One server whose runtime-settable fields changed between two configs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerChange {
    /// The backend (or listen section) name.
    pub backend: String,
    /// The server name.
    pub server: String,
    /// The server line before.
    pub old: ServerLine,
    /// The server line after.
    pub new: ServerLine,
}

impl ServerChange {
    /// The `server.set` op that brings a running server from `old` to `new`.
    pub fn op(&self) -> ServerSet {
        let addr_changed = self.old.addr_token != self.new.addr_token;
        ServerSet {
            backend: self.backend.clone(),
            server: self.server.clone(),
            addr: addr_changed.then(|| self.new.ip.map(|ip| ip.to_string())).flatten(),
            port: if addr_changed { self.new.port } else { None },
            weight: (self.old.effective_weight() != self.new.effective_weight()).then(|| self.new.effective_weight()),
            state: (self.old.disabled != self.new.disabled).then_some(if self.new.disabled {
                ServerState::Maint
            } else {
                ServerState::Ready
            }),
        }
    }

    /// A human reason, e.g. `backend be_app: server SRV_2 address 10.0.0.6:80 -> 10.0.0.7:80`.
    pub fn reason(&self) -> String {
        let mut parts = Vec::new();
        if self.old.addr_token != self.new.addr_token {
            parts.push(format!("address {} -> {}", self.old.addr_token, self.new.addr_token));
        }
        if self.old.effective_weight() != self.new.effective_weight() {
            parts.push(format!("weight {} -> {}", self.old.effective_weight(), self.new.effective_weight()));
        }
        if self.old.disabled != self.new.disabled {
            parts.push(if self.new.disabled { "disabled".into() } else { "enabled".into() });
        }
        format!("backend {}: server {} {}", self.backend, self.server, parts.join(", "))
    }
}

/// How two configs differ: server changes the runtime API can make, and everything else.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CfgDiff {
    /// Server lines whose only changes are runtime-settable.
    pub servers: Vec<ServerChange>,
    /// Servers a backend gained, as the `server.add` ops that create them.
    pub added: Vec<ServerAdd>,
    /// Servers a backend lost, as the `server.del` ops that delete them.
    pub removed: Vec<ServerDel>,
    /// Backend sections the new config gains, as the `backend.add` ops that create them (which
    /// only HAProxy 3.4 runs; the controller fits the diff to each agent's capabilities).
    pub backends_added: Vec<BackendAdd>,
    /// Every change that needs a reload; empty means runtime-eligible.
    pub reload_reasons: Vec<ReloadReason>,
}

/// A human reason for a `server.add`, e.g. `backend be_app: server SRV_3 added (10.0.0.3:80)`.
pub fn added_reason(op: &ServerAdd) -> String {
    format!("backend {}: server {} added ({})", op.backend, op.server, op.socket_addr())
}

/// A human reason for a `backend.add`, e.g. `backend be_new added from defaults haptic (4 servers)`.
pub fn backend_added_reason(op: &BackendAdd) -> String {
    format!("backend {} added from defaults {} ({} servers)", op.backend, op.defaults, op.servers.len())
}

/// A human reason for a `server.del`, e.g. `backend be_app: server SRV_3 removed`.
pub fn removed_reason(op: &ServerDel) -> String {
    format!("backend {}: server {} removed", op.backend, op.server)
}

impl CfgDiff {
    /// Whether the configs are equal once normalized.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
            && self.added.is_empty()
            && self.removed.is_empty()
            && self.backends_added.is_empty()
            && self.reload_reasons.is_empty()
    }

    /// The `backend.add` ops, in config order. They go before every other op of the apply: a
    /// map entry that routes to a new backend is loaded only once the backend is there.
    pub fn backend_ops(&self) -> Vec<Op> {
        self.backends_added.iter().cloned().map(Op::BackendAdd).collect()
    }

    /// A human reason per [`CfgDiff::backend_ops`] op.
    pub fn backend_reasons(&self) -> Vec<String> {
        self.backends_added.iter().map(backend_added_reason).collect()
    }

    /// The ops that make every runtime change, new capacity before old goes: `server.add` first,
    /// then the `server.set`s of servers that take traffic afterwards, then those of servers that
    /// stop (maint or weight 0), then `server.del`. A backend whose only endpoint is replaced (a
    /// one-replica rollout: the new one ready, the old one draining) so never has a moment with no
    /// server, whatever order the servers have in the config.
    pub fn server_ops(&self) -> Vec<Op> {
        let (mut up, down) = self.server_ops_split();
        up.extend(down);
        up
    }

    /// [`CfgDiff::server_ops`] in two parts: the new capacity (`server.add`s and the `server.set`s
    /// of servers that take traffic afterwards), and the old going (the `server.set`s of servers
    /// that stop, then `server.del`s). An apply that also changes maps runs the maps between the
    /// two, so a map that moves traffic to a backend finds its servers ready and a backend loses
    /// its servers only once no map sends traffic to it.
    pub fn server_ops_split(&self) -> (Vec<Op>, Vec<Op>) {
        let adds = self.added.iter().cloned().map(Op::ServerAdd);
        let up = self.servers.iter().filter(|c| c.new.takes_traffic()).map(|c| Op::ServerSet(c.op()));
        let stop = self.servers.iter().filter(|c| !c.new.takes_traffic()).map(|c| Op::ServerSet(c.op()));
        let dels = self.removed.iter().cloned().map(Op::ServerDel);
        (adds.chain(up).collect(), stop.chain(dels).collect())
    }

    /// A human reason per runtime change, in [`CfgDiff::server_ops`] order.
    pub fn runtime_reasons(&self) -> Vec<String> {
        let adds = self.added.iter().map(added_reason);
        let sets = self.sets_in_order().map(ServerChange::reason);
        adds.chain(sets).chain(self.removed.iter().map(removed_reason)).collect()
    }

    /// The server changes, those that leave a server taking traffic first.
    fn sets_in_order(&self) -> impl Iterator<Item = &ServerChange> {
        let up = self.servers.iter().filter(|c| c.new.takes_traffic());
        up.chain(self.servers.iter().filter(|c| !c.new.takes_traffic()))
    }

    /// Whether every change can be made at runtime.
    pub fn runtime_eligible(&self) -> bool {
        self.reload_reasons.is_empty()
    }

    /// The parts of the config whose changes need the reload (empty when runtime-eligible).
    pub fn reload_parts(&self) -> BTreeSet<ConfigPart> {
        self.reload_reasons.iter().map(|r| r.part).collect()
    }
}

/// Compares two `haproxy.cfg` texts structurally.
pub fn diff_cfg(old: &str, new: &str) -> CfgDiff {
    diff_parsed(&cfg::parse(old), &cfg::parse(new))
}

/// Compares two parsed configs structurally (see [`diff_cfg`]).
pub fn diff_parsed(old: &cfg::Config, new: &cfg::Config) -> CfgDiff {
    let mut out = CfgDiff::default();
    if old.preamble != new.preamble {
        out.reload_reasons.push(ReloadReason::new(ConfigPart::Global, "lines before the first section changed"));
    }
    let old_headers: Vec<&str> = old.sections.iter().map(|s| s.header.as_str()).collect();
    let new_headers: Vec<&str> = new.sections.iter().map(|s| s.header.as_str()).collect();
    let mut kept: Vec<&cfg::Section> = new.sections.iter().collect();
    if old_headers != new_headers {
        let Some(added) = added_sections(&old_headers, &new_headers) else {
            section_set_reasons(&old_headers, &new_headers, &mut out.reload_reasons);
            return out;
        };
        // What every added backend shares (the `defaults` sections, `track`), checked once.
        let config = dynamic_config(old, new);
        for &i in &added {
            match config.clone().and_then(|()| backend_add(new, i)) {
                Ok(op) => out.backends_added.push(op),
                Err(why) => out.reload_reasons.push(ReloadReason::new(
                    ConfigPart::of_header(new_headers[i]),
                    format!("section added: {} ({why})", new_headers[i]),
                )),
            }
        }
        let added: BTreeSet<usize> = added.into_iter().collect();
        kept = new.sections.iter().enumerate().filter(|(i, _)| !added.contains(i)).map(|(_, s)| s).collect();
    }
    for (o, n) in old.sections.iter().zip(kept) {
        let mut reasons = Vec::new();
        match align(o, n) {
            Some(al) => {
                for &(ol, nl) in &al.pairs {
                    if ol == nl {
                        continue;
                    }
                    match server_change(o.has_servers(), ol, nl) {
                        Ok((os, ns)) => out.servers.push(ServerChange {
                            backend: o.name.clone().unwrap_or_default(),
                            server: os.name.clone(),
                            old: os,
                            new: ns,
                        }),
                        Err(why) => reasons.push(ReloadReason::new(line_part(o, ol), format!("{}: {why}", o.label()))),
                    }
                }
                if !al.added.is_empty() || !al.removed.is_empty() {
                    membership(old, new, n, &al, &mut out, &mut reasons);
                }
            }
            None => added_and_removed(o, n, &mut reasons),
        }
        push_section_reasons(o, reasons, &mut out);
    }
    out
}

/// Adds one section's reload reasons to `out`, at most [`MAX_REASONS_PER_SECTION`] of them; the
/// summary of the rest keeps the parts they are in.
fn push_section_reasons(section: &cfg::Section, mut reasons: Vec<ReloadReason>, out: &mut CfgDiff) {
    if reasons.len() > MAX_REASONS_PER_SECTION {
        let rest = reasons.split_off(MAX_REASONS_PER_SECTION);
        let parts: BTreeSet<ConfigPart> = rest.iter().map(|r| r.part).collect();
        for &part in &parts {
            let more = rest.iter().filter(|r| r.part == part).count();
            let text = match parts.len() {
                1 => format!("{}: and {more} more changed lines", section.label()),
                _ => format!("{}: and {more} more changed lines ({})", section.label(), part.as_str()),
            };
            reasons.push(ReloadReason::new(part, text));
        }
    }
    out.reload_reasons.extend(reasons);
}

/// The part a changed line of `section` is in: a backend's `server` line, a frontend's `bind`
/// line, else the section.
fn line_part(section: &cfg::Section, line: &[String]) -> ConfigPart {
    let first = line.first().map(String::as_str);
    match ConfigPart::of_kind(&section.kind) {
        _ if section.has_servers() && first == Some("server") => ConfigPart::Server,
        ConfigPart::Frontend if first == Some("bind") => ConfigPart::Listener,
        part => part,
    }
}

/// The lines of two versions of one section, matched: `server` lines by name (those only in
/// the new one are `added`, only in the old one `removed`), every other line by position.
struct Aligned<'a> {
    pairs: Vec<(&'a [String], &'a [String])>,
    added: Vec<&'a [String]>,
    removed: Vec<&'a [String]>,
}

fn server_name(line: &[String]) -> Option<&str> {
    (line.len() >= 3 && line[0] == "server").then(|| line[1].as_str())
}

/// Matches the lines of `o` and `n` (see [`Aligned`]); `None` when they cannot be matched line
/// for line: a different number of other lines, or a server name twice in one section.
fn align<'a>(o: &'a cfg::Section, n: &'a cfg::Section) -> Option<Aligned<'a>> {
    let names = |s: &'a cfg::Section| -> Option<BTreeSet<&'a str>> {
        let mut set = BTreeSet::new();
        for name in s.lines.iter().filter_map(|l| server_name(l)) {
            if !set.insert(name) {
                return None;
            }
        }
        Some(set)
    };
    let (old_names, new_names) = if o.has_servers() { (names(o)?, names(n)?) } else { Default::default() };
    let only_in =
        |l: &[String], other: &BTreeSet<&str>| o.has_servers() && server_name(l).is_some_and(|s| !other.contains(s));
    let (mut kept_old, mut removed) = (Vec::new(), Vec::new());
    for l in &o.lines {
        if only_in(l, &new_names) {
            removed.push(l.as_slice())
        } else {
            kept_old.push(l.as_slice())
        }
    }
    let (mut kept_new, mut added) = (Vec::new(), Vec::new());
    for l in &n.lines {
        if only_in(l, &old_names) {
            added.push(l.as_slice())
        } else {
            kept_new.push(l.as_slice())
        }
    }
    (kept_old.len() == kept_new.len()).then(|| Aligned {
        pairs: kept_old.into_iter().zip(kept_new).collect(),
        added,
        removed,
    })
}

/// Backend directives under which a server added or deleted at runtime would not be the server
/// a reload builds from the file: dynamic servers ignore `default-server`, and persistence,
/// stickiness, hashing and server templates tie servers to more than their own line.
const NOT_DYNAMIC: &[&str] = &[
    "default-server",
    "server-template",
    "use-server",
    "force-persist",
    "ignore-persist",
    "persist",
    "cookie",
    "dynamic-cookie-key",
    "hash-type",
    "hash-balance-factor",
    "load-server-state-from-file",
    "server-state-file-name",
];

/// `balance` algorithms under which HAProxy 2.6 and 3.0 take `add server`.
const DYNAMIC_BALANCE: &[&str] = &["roundrobin", "leastconn", "first", "random"];

/// Why servers cannot be added to or deleted from section `n` of `new` at runtime, if not.
fn dynamic_backend(old: &cfg::Config, new: &cfg::Config, n: &cfg::Section) -> Result<(), String> {
    if n.kind != "backend" || n.header.split_whitespace().count() != 2 {
        return Err("servers are added or deleted at runtime only in a plain `backend` section".into());
    }
    dynamic_lines(n)?;
    dynamic_config(old, new)
}

/// Why section `s`'s own lines keep servers added at runtime from being the file's servers.
fn dynamic_lines(s: &cfg::Section) -> Result<(), String> {
    for line in &s.lines {
        let kw = line[0].as_str();
        if NOT_DYNAMIC.contains(&kw) || kw.starts_with("stick") {
            return Err(format!("{} has `{kw}`, which servers added at runtime do not follow", s.label()));
        }
        if kw == "balance" {
            let algo = line.get(1).map(|a| a.split('(').next().unwrap_or(a)).unwrap_or("");
            if !DYNAMIC_BALANCE.contains(&algo) {
                return Err(format!("{} balances with {algo:?}, which takes no servers at runtime", s.label()));
            }
        }
    }
    Ok(())
}

/// Why nothing is added or deleted at runtime anywhere in `new`: its `defaults` sections' lines,
/// or a server of either config that `track`s another.
fn dynamic_config(old: &cfg::Config, new: &cfg::Config) -> Result<(), String> {
    for d in new.sections.iter().filter(|s| s.kind == "defaults") {
        dynamic_lines(d)?;
    }
    let tracks = |c: &cfg::Config| {
        c.sections.iter().flat_map(|s| &s.lines).any(|l| server_name(l).is_some() && l.iter().any(|t| t == "track"))
    };
    if tracks(old) || tracks(new) {
        return Err("a server `track`s another, so servers are not added or deleted at runtime".into());
    }
    Ok(())
}

/// The `server.add` that creates the server of `line` in `backend`, when `add server` can.
fn addable(backend: &str, line: &[String]) -> Result<ServerAdd, String> {
    let Some(sl) = parse_server(line) else {
        return Err("not a server line".into());
    };
    if !valid_name(&sl.name) {
        return Err(format!("server name {:?} cannot be named on the runtime API", sl.name));
    }
    let (Some(ip), Some(port)) = (sl.ip, sl.port) else {
        return Err(format!("address {} is not an IP address with a port", sl.addr_token));
    };
    let addr = std::net::SocketAddr::new(ip, port);
    if sl.addr_token != addr.to_string() {
        return Err(format!("address {} is not written as {addr}", sl.addr_token));
    }
    if let Some(w) = sl.weight.filter(|w| *w > MAX_WEIGHT) {
        return Err(format!("weight {w} is over {MAX_WEIGHT}"));
    }
    check_add_server_params(&sl.rest)?;
    let op = ServerAdd {
        backend: backend.to_string(),
        server: sl.name,
        addr: ip,
        port,
        weight: sl.weight,
        state: if sl.disabled { ServerState::Maint } else { ServerState::Ready },
        params: sl.rest,
    };
    op.validate()?;
    Ok(op)
}

/// The servers section `n` gained and lost, as ops, or reload reasons naming each line.
fn membership(
    old: &cfg::Config,
    new: &cfg::Config,
    n: &cfg::Section,
    al: &Aligned<'_>,
    out: &mut CfgDiff,
    reasons: &mut Vec<ReloadReason>,
) {
    let backend = n.name.clone().unwrap_or_default();
    let server = |text: String| ReloadReason::new(ConfigPart::Server, text);
    if let Err(why) = dynamic_backend(old, new, n) {
        for l in &al.removed {
            reasons.push(server(format!("{}: removed {:?} ({why})", n.label(), l.join(" "))));
        }
        for l in &al.added {
            reasons.push(server(format!("{}: added {:?} ({why})", n.label(), l.join(" "))));
        }
        return;
    }
    for l in &al.removed {
        if !valid_name(&l[1]) {
            reasons.push(server(format!(
                "{}: removed {:?} (a name the runtime API cannot carry)",
                n.label(),
                l.join(" ")
            )));
            continue;
        }
        out.removed.push(ServerDel { backend: backend.clone(), server: l[1].clone() });
    }
    for l in &al.added {
        match addable(&backend, l) {
            Ok(op) => out.added.push(op),
            Err(why) => reasons.push(server(format!("{}: added {:?} ({why})", n.label(), l.join(" ")))),
        }
    }
}

/// The indexes of the sections `new` adds to `old` when that is the only change of the
/// section list (every old header still there, in order); `None` otherwise.
fn added_sections(old: &[&str], new: &[&str]) -> Option<Vec<usize>> {
    let mut next_old = old.iter().peekable();
    let mut added = Vec::new();
    for (i, h) in new.iter().enumerate() {
        if next_old.peek() == Some(&h) {
            next_old.next();
        } else {
            added.push(i);
        }
    }
    next_old.peek().is_none().then_some(added)
}

/// The `backend.add` that creates section `i` of `new` at runtime, when one can: a plain
/// `backend` section of `server` lines only (each one `add server` takes), after a named
/// `defaults` section (the one it inherits from on a cold load, and the one `add backend …
/// from` names). What the configs share is the caller's check ([`dynamic_config`]).
fn backend_add(new: &cfg::Config, i: usize) -> Result<BackendAdd, String> {
    let n = &new.sections[i];
    if n.kind != "backend" || n.header.split_whitespace().count() != 2 {
        return Err("only a plain `backend` section is added at runtime".into());
    }
    let backend = n.name.clone().unwrap_or_default();
    if !valid_name(&backend) {
        return Err(format!("backend name {backend:?} cannot be named on the runtime API"));
    }
    let defaults = new.sections[..i].iter().rev().find(|s| s.kind == "defaults");
    let defaults = match defaults.map(|d| (d.header.split_whitespace().count(), d.name.as_deref())) {
        Some((2, Some(name))) if valid_name(name) => name.to_string(),
        _ => return Err("the `defaults` section before it has no name for `add backend … from`".into()),
    };
    let mut servers: Vec<ServerAdd> = Vec::new();
    for l in &n.lines {
        let Some(name) = server_name(l) else {
            return Err(format!("it has `{}`, which a backend added at runtime does not carry", l[0]));
        };
        if servers.iter().any(|s| s.server == name) {
            return Err(format!("server {name} is named twice"));
        }
        servers.push(addable(&backend, l).map_err(|why| format!("{:?}: {why}", l.join(" ")))?);
    }
    let op = BackendAdd { backend, defaults, servers };
    op.validate()?;
    Ok(op)
}

/// Names the lines a section gained and lost (as multisets, in file order), e.g.
/// `backend be_app: added "server SRV_3 127.0.0.1:9003"`.
fn added_and_removed(o: &cfg::Section, n: &cfg::Section, reasons: &mut Vec<ReloadReason>) {
    let mut old_left: BTreeMap<&[String], usize> = BTreeMap::new();
    for l in &o.lines {
        *old_left.entry(l.as_slice()).or_default() += 1;
    }
    let mut added = Vec::new();
    for l in &n.lines {
        match old_left.get_mut(l.as_slice()) {
            Some(c) if *c > 0 => *c -= 1,
            _ => added.push(l),
        }
    }
    let mut new_left: BTreeMap<&[String], usize> = BTreeMap::new();
    for l in &n.lines {
        *new_left.entry(l.as_slice()).or_default() += 1;
    }
    for l in &o.lines {
        match new_left.get_mut(l.as_slice()) {
            Some(c) if *c > 0 => *c -= 1,
            _ => reasons.push(ReloadReason::new(line_part(o, l), format!("{}: removed {:?}", o.label(), l.join(" ")))),
        }
    }
    for l in added {
        reasons.push(ReloadReason::new(line_part(n, l), format!("{}: added {:?}", o.label(), l.join(" "))));
    }
}

fn section_set_reasons(old: &[&str], new: &[&str], reasons: &mut Vec<ReloadReason>) {
    let o: BTreeSet<&str> = old.iter().copied().collect();
    let n: BTreeSet<&str> = new.iter().copied().collect();
    for added in n.difference(&o) {
        reasons.push(ReloadReason::new(ConfigPart::of_header(added), format!("section added: {added}")));
    }
    for removed in o.difference(&n) {
        reasons.push(ReloadReason::new(ConfigPart::of_header(removed), format!("section removed: {removed}")));
    }
    if o == n {
        reasons.push(ReloadReason::new(ConfigPart::Order, "sections reordered"));
    }
}

fn server_change(in_backend: bool, old: &[String], new: &[String]) -> Result<(ServerLine, ServerLine), String> {
    let line = || format!("line changed: {:?} -> {:?}", old.join(" "), new.join(" "));
    let (Some(os), Some(ns)) = (parse_server(old), parse_server(new)) else {
        return Err(line());
    };
    if !in_backend {
        return Err(line());
    }
    if os.name != ns.name {
        return Err(format!("server {} replaced by {}", os.name, ns.name));
    }
    if os.rest != ns.rest {
        return Err(format!("server {}: parameters other than address, weight or state changed", os.name));
    }
    if os.addr_token != ns.addr_token && !(os.addr_is_runtime_settable() && ns.addr_is_runtime_settable()) {
        return Err(format!("server {}: address {} -> {} is not an IP literal", os.name, os.addr_token, ns.addr_token));
    }
    if os.addr_token != ns.addr_token && os.port.is_some() != ns.port.is_some() {
        return Err(format!("server {}: port added or removed", os.name));
    }
    if ns.effective_weight() > 256 {
        return Err(format!("server {}: weight {} is over 256", os.name, ns.effective_weight()));
    }
    Ok((os, ns))
}

/// Why a runtime claim does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("runtime claim does not hold: {}", .reasons.join("; "))]
pub struct ClaimError {
    /// Every reason found.
    pub reasons: Vec<String>,
}

/// A changed file other than `haproxy.cfg`, with its new contents.
#[derive(Debug, Clone, Copy)]
pub struct ChangedFile<'a> {
    /// The path in the tree.
    pub path: &'a RelPath,
    /// The new bytes, or `None` when the file was removed.
    pub new: Option<&'a [u8]>,
}

/// Verifies a runtime claim: the configs differ only in runtime-settable server fields, every
/// such change and every changed file is covered by an op that sets exactly the new contents,
/// and no op sets anything the new tree does not say.
pub fn verify_runtime_claim(
    old_cfg: &str,
    new_cfg: &str,
    changed: &[ChangedFile<'_>],
    ops: &[Op],
) -> Result<(), ClaimError> {
    verify_runtime_claim_parsed(&cfg::parse(old_cfg), &cfg::parse(new_cfg), changed, ops)
}

/// [`verify_runtime_claim`] over configs parsed already (with [`cfg::parse`]), so a caller that
/// keeps the live config's parsed form parses only the new one.
pub fn verify_runtime_claim_parsed(
    old_parsed: &cfg::Config,
    new_parsed: &cfg::Config,
    changed: &[ChangedFile<'_>],
    ops: &[Op],
) -> Result<(), ClaimError> {
    let diff = diff_parsed(old_parsed, new_parsed);
    let by = OpsByTarget::of(ops);
    let new_servers = if by.server.is_empty() { BTreeMap::new() } else { servers_by_name(new_parsed) };
    check_claim(&diff, &by, &new_servers, changed, |reasons| {
        membership_ops_match(old_parsed, new_parsed, &diff, &by.add, &by.del, reasons)
    })
}

/// An apply's ops, grouped by what they target.
pub(crate) struct OpsByTarget<'a> {
    pub(crate) server: BTreeMap<(&'a str, &'a str), Vec<&'a ServerSet>>,
    pub(crate) add: BTreeMap<(&'a str, &'a str), Vec<&'a ServerAdd>>,
    pub(crate) del: BTreeMap<(&'a str, &'a str), usize>,
    pub(crate) backend: BTreeMap<&'a str, Vec<&'a BackendAdd>>,
    pub(crate) file: BTreeMap<&'a RelPath, Vec<&'a Op>>,
    /// A reason per op of a kind this crate does not know.
    pub(crate) unknown: Vec<String>,
}

impl<'a> OpsByTarget<'a> {
    pub(crate) fn of(ops: &'a [Op]) -> Self {
        let mut by = OpsByTarget {
            server: BTreeMap::new(),
            add: BTreeMap::new(),
            del: BTreeMap::new(),
            backend: BTreeMap::new(),
            file: BTreeMap::new(),
            unknown: Vec::new(),
        };
        for op in ops {
            match op {
                Op::ServerSet(s) => by.server.entry((&s.backend, &s.server)).or_default().push(s),
                Op::ServerAdd(a) => by.add.entry((&a.backend, &a.server)).or_default().push(a),
                Op::ServerDel(d) => *by.del.entry((&d.backend, &d.server)).or_default() += 1,
                Op::BackendAdd(b) => by.backend.entry(&b.backend).or_default().push(b),
                Op::Unknown { op, .. } => by.unknown.push(format!("unknown op kind {op:?}")),
                other => {
                    if let Some(p) = other.path() {
                        by.file.entry(p).or_default().push(other);
                    }
                }
            }
        }
        by
    }
}

/// The checks of a runtime claim after the configs' diff: every server change has its
/// `server.set`, every `server.set` matches the new config's line (from `new_servers`, which
/// holds at least every server a `server.set` names that the new config has), and the file ops
/// cover exactly the changed files; `membership` checks the `server.add` and `server.del` ops.
pub(crate) fn check_claim(
    diff: &CfgDiff,
    by: &OpsByTarget<'_>,
    new_servers: &BTreeMap<(String, String), ServerLine>,
    changed: &[ChangedFile<'_>],
    membership: impl FnOnce(&mut Vec<String>),
) -> Result<(), ClaimError> {
    let mut reasons: Vec<String> = diff.reload_reasons.iter().map(ToString::to_string).collect();
    reasons.extend(by.unknown.iter().cloned());
    for ch in &diff.servers {
        if !by.server.contains_key(&(ch.backend.as_str(), ch.server.as_str())) {
            reasons.push(format!("{} has no server.set op", ch.reason()));
        }
    }
    for ((backend, server), sets) in &by.server {
        let Some(line) = new_servers.get(&(backend.to_string(), server.to_string())) else {
            reasons.push(format!("server.set {backend}/{server}: no such server in the new config"));
            continue;
        };
        for s in sets {
            if let Err(why) = server_op_matches(s, line) {
                reasons.push(format!("server.set {backend}/{server}: {why}"));
            }
        }
    }
    membership(&mut reasons);
    backend_ops_match(diff, &by.backend, &mut reasons);

    let changed_paths: BTreeSet<&RelPath> = changed.iter().map(|c| c.path).collect();
    for c in changed {
        match (by.file.get(c.path), c.new) {
            (None, _) => reasons.push(format!("{} changed with no op covering it", c.path)),
            (Some(_), None) => reasons.push(format!("{} removed", c.path)),
            (Some(list), Some(bytes)) => {
                for op in list {
                    if let Err(why) = file_op_matches(op, bytes) {
                        reasons.push(format!("{}: {why}", op.describe()));
                    }
                }
            }
        }
    }
    for (path, list) in &by.file {
        if !changed_paths.contains(path) {
            for op in list {
                reasons.push(format!("{} targets a file that did not change", op.describe()));
            }
        }
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(ClaimError { reasons })
    }
}

/// Checks the `server.add` and `server.del` ops against the servers the configs gain and lose:
/// exactly one op each, equal to what the new config's line says, and none for anything else.
fn membership_ops_match(
    old: &cfg::Config,
    new: &cfg::Config,
    diff: &CfgDiff,
    adds: &BTreeMap<(&str, &str), Vec<&ServerAdd>>,
    dels: &BTreeMap<(&str, &str), usize>,
    reasons: &mut Vec<String>,
) {
    let has_backend =
        |c: &cfg::Config, b: &str| c.sections.iter().any(|s| s.has_servers() && s.name.as_deref() == Some(b));
    let has_server = |c: &cfg::Config, b: &str, s: &str| {
        c.sections
            .iter()
            .filter(|sec| sec.has_servers() && sec.name.as_deref() == Some(b))
            .any(|sec| sec.lines.iter().any(|l| server_name(l) == Some(s)))
    };
    let mut expected_adds = BTreeSet::new();
    for want in &diff.added {
        let key = (want.backend.as_str(), want.server.as_str());
        expected_adds.insert(key);
        match adds.get(&key).map(Vec::as_slice) {
            None | Some([]) => reasons.push(format!("{} has no server.add op", added_reason(want))),
            Some([got]) if *got == want => {}
            Some([_]) => reasons.push(format!(
                "server.add {}/{}: differs from the new config's line (address, weight, state or parameters)",
                want.backend, want.server
            )),
            Some(_) => reasons.push(format!("server.add {}/{}: sent more than once", want.backend, want.server)),
        }
    }
    for (backend, server) in adds.keys().filter(|k| !expected_adds.contains(*k)) {
        reasons.push(if !has_backend(new, backend) {
            format!("server.add {backend}/{server}: no backend {backend} in the new config")
        } else if has_server(old, backend, server) {
            format!("server.add {backend}/{server}: the server is in the running config already")
        } else {
            format!("server.add {backend}/{server}: the new config does not add this server")
        });
    }
    let mut expected_dels = BTreeSet::new();
    for want in &diff.removed {
        let key = (want.backend.as_str(), want.server.as_str());
        expected_dels.insert(key);
        match dels.get(&key) {
            None => reasons.push(format!("{} has no server.del op", removed_reason(want))),
            Some(1) => {}
            Some(_) => reasons.push(format!("server.del {}/{}: sent more than once", want.backend, want.server)),
        }
    }
    for (backend, server) in dels.keys().filter(|k| !expected_dels.contains(*k)) {
        reasons.push(if !has_backend(old, backend) {
            format!("server.del {backend}/{server}: no backend {backend} in the running config")
        } else if has_server(new, backend, server) {
            format!("server.del {backend}/{server}: the new config keeps this server")
        } else {
            format!("server.del {backend}/{server}: no such server in the running config")
        });
    }
}

/// Checks the `backend.add` ops against the backends the new config gains: exactly one op
/// each, equal to what the new config's section says, and none for anything else.
fn backend_ops_match(diff: &CfgDiff, adds: &BTreeMap<&str, Vec<&BackendAdd>>, reasons: &mut Vec<String>) {
    for want in &diff.backends_added {
        match adds.get(want.backend.as_str()).map(Vec::as_slice) {
            None | Some([]) => reasons.push(format!("{} has no backend.add op", backend_added_reason(want))),
            Some([got]) if *got == want => {}
            Some([_]) => reasons.push(format!(
                "backend.add {}: differs from the new config's section (defaults or servers)",
                want.backend
            )),
            Some(_) => reasons.push(format!("backend.add {}: sent more than once", want.backend)),
        }
    }
    for backend in adds.keys().filter(|b| !diff.backends_added.iter().any(|w| w.backend == **b)) {
        reasons.push(format!("backend.add {backend}: the new config does not add this backend"));
    }
}

fn servers_by_name(parsed: &cfg::Config) -> BTreeMap<(String, String), ServerLine> {
    let mut out = BTreeMap::new();
    for s in parsed.sections.iter().filter(|s| s.has_servers()) {
        for l in &s.lines {
            if let Some(sl) = parse_server(l) {
                out.insert((s.name.clone().unwrap_or_default(), sl.name.clone()), sl);
            }
        }
    }
    out
}

fn server_op_matches(op: &ServerSet, line: &ServerLine) -> Result<(), String> {
    if let Some(addr) = &op.addr {
        let ip: std::net::IpAddr = addr.parse().map_err(|_| format!("addr {addr:?} is not an IP"))?;
        if line.ip != Some(ip) {
            return Err(format!("addr {addr} but the config says {}", line.addr_token));
        }
    }
    if let Some(port) = op.port {
        if line.port != Some(port) {
            return Err(format!("port {port} but the config says {}", line.addr_token));
        }
    }
    if let Some(w) = op.weight {
        if w != line.effective_weight() {
            return Err(format!("weight {w} but the config says {}", line.effective_weight()));
        }
    }
    match (op.state, line.disabled) {
        (Some(ServerState::Ready), true) => Err("state ready but the config says disabled".into()),
        (Some(ServerState::Maint), false) => Err("state maint but the config says enabled".into()),
        (Some(ServerState::Drain), _) => Err("state drain cannot be written in the config".into()),
        _ => Ok(()),
    }
}

fn file_op_matches(op: &Op, bytes: &[u8]) -> Result<(), String> {
    let text = || std::str::from_utf8(bytes).map_err(|_| "the file is not UTF-8".to_string());
    match op {
        Op::MapReplace { entries, .. } => {
            if cfg::parse_map_file(text()?) != *entries {
                return Err("entries differ from the file in the tree".into());
            }
        }
        Op::AclReplace { patterns, .. } => {
            if cfg::parse_acl_file(text()?) != *patterns {
                return Err("patterns differ from the file in the tree".into());
            }
        }
        // The entries are the file's, read from the new tree when the op runs.
        Op::MapLoad { .. } => {
            text()?;
        }
        Op::CertSet { .. } | Op::CaFileSet { .. } => {}
        Op::ServerSet(_) | Op::ServerAdd(_) | Op::ServerDel(_) | Op::BackendAdd(_) | Op::Unknown { .. } => {
            return Err("not a file op".into())
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "global\n  default-path config\ndefaults\n  mode http\nfrontend fe\n  bind 127.0.0.1:80\n  default_backend be_app\nbackend be_app\n  server SRV_1 10.0.0.1:8080 weight 10 check\n  server SRV_2 10.0.0.2:8080 disabled\n";

    fn texts(d: &CfgDiff) -> Vec<&str> {
        d.reload_reasons.iter().map(|r| r.text.as_str()).collect()
    }

    fn parts(old: &str, new: &str) -> Vec<&'static str> {
        diff_cfg(old, new).reload_parts().into_iter().map(ConfigPart::as_str).collect()
    }

    #[test]
    fn each_reload_reason_names_the_part_of_the_config_it_is_in() {
        let swap = |from: &str, to: &str| BASE.replace(from, to);
        assert_eq!(parts(BASE, &swap("default-path config", "default-path origin")), ["global"]);
        assert_eq!(parts(BASE, &swap("  mode http\n", "  mode http\n  timeout client 5s\n")), ["defaults"]);
        assert_eq!(parts(BASE, &swap("127.0.0.1:80\n", "127.0.0.1:80\n  bind 127.0.0.1:81\n")), ["listener"]);
        assert_eq!(
            parts(BASE, &swap("127.0.0.1:80\n", "127.0.0.1:80\n  http-request deny if { path /x }\n")),
            ["frontend"]
        );
        assert_eq!(parts(BASE, &swap("\nbackend be_app\n", "\nbackend be_app\n  balance source\n")), ["backend"]);
        // A server change the runtime API cannot make: a parameter other than address/weight/state.
        assert_eq!(parts(BASE, &swap("weight 10 check", "weight 10 check inter 3s")), ["server"]);
        let listener = format!("{BASE}frontend fe2\n  bind 127.0.0.1:82\n  default_backend be_app\n");
        assert_eq!(parts(BASE, &listener), ["listener"]);
        assert_eq!(parts(&listener, BASE), ["listener"]);
        let users = format!("{BASE}userlist u\n  user a insecure-password b\n");
        assert_eq!(parts(BASE, &users), ["other_section"]);
        let two = format!("{BASE}backend be_b\n  server S 10.0.0.9:80\n");
        let swapped = two.replace(
            "backend be_app\n  server SRV_1 10.0.0.1:8080 weight 10 check\n  server SRV_2 10.0.0.2:8080 disabled\n",
            "",
        )
            + "backend be_app\n  server SRV_1 10.0.0.1:8080 weight 10 check\n  server SRV_2 10.0.0.2:8080 disabled\n";
        assert_eq!(parts(&two, &swapped), ["order"]);
        // Runtime changes name no part.
        assert!(parts(BASE, &swap("10.0.0.1:8080", "10.0.0.7:8080")).is_empty());
    }

    #[test]
    fn a_summarised_section_keeps_the_parts_of_the_lines_it_leaves_out() {
        let old = "defaults d\n  mode http\nbackend be\n  balance roundrobin\n  retries 1\n  timeout server 5s\n  timeout connect 1s\n  server S 10.0.0.1:80 check\n";
        let new = "defaults d\n  mode http\nbackend be\n  balance source\n  retries 2\n  timeout server 6s\n  timeout connect 2s\n  server S 10.0.0.1:80 check inter 3s\n";
        let d = diff_cfg(old, new);
        let summaries: Vec<&str> = texts(&d)[MAX_REASONS_PER_SECTION..].to_vec();
        assert_eq!(
            summaries,
            ["backend be: and 1 more changed lines (backend)", "backend be: and 1 more changed lines (server)"]
        );
        assert_eq!(d.reload_parts().into_iter().collect::<Vec<_>>(), [ConfigPart::Backend, ConfigPart::Server]);
    }

    #[test]
    fn identical_modulo_comments() {
        let noisy = BASE.replace("mode http", "mode   http   # comment") + "\n# trailing\n";
        assert!(diff_cfg(BASE, &noisy).is_empty());
    }

    #[test]
    fn server_fields_are_runtime() {
        let new = BASE
            .replace("10.0.0.1:8080 weight 10", "10.0.0.9:9090 weight 20")
            .replace("10.0.0.2:8080 disabled", "10.0.0.2:8080");
        let d = diff_cfg(BASE, &new);
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        assert_eq!(d.servers.len(), 2);
        let op = d.servers[0].op();
        assert_eq!((op.addr.as_deref(), op.port, op.weight, op.state), (Some("10.0.0.9"), Some(9090), Some(20), None));
        assert_eq!(d.servers[1].op().state, Some(ServerState::Ready));
        let ops: Vec<Op> = d.servers.iter().map(|c| Op::ServerSet(c.op())).collect();
        assert_eq!(verify_runtime_claim(BASE, &new, &[], &ops), Ok(()));
        assert!(verify_runtime_claim(BASE, &new, &[], &ops[..1]).is_err());
    }

    #[test]
    fn a_server_taking_over_is_set_before_the_one_it_replaces_stops() {
        // SRV_1 (first in the config) goes to maint, SRV_2 comes up in its place: a one-replica
        // rollout. Run in config order, the backend would have no server between the two ops.
        let new = BASE
            .replace("10.0.0.1:8080 weight 10 check", "10.0.0.1:8080 weight 10 check disabled")
            .replace("10.0.0.2:8080 disabled", "10.0.0.2:8080");
        let d = diff_cfg(BASE, &new);
        let names: Vec<(String, Option<ServerState>)> = d
            .server_ops()
            .iter()
            .map(|op| match op {
                Op::ServerSet(s) => (s.server.clone(), s.state),
                other => panic!("only server.set expected: {other:?}"),
            })
            .collect();
        assert_eq!(names, vec![("SRV_2".into(), Some(ServerState::Ready)), ("SRV_1".into(), Some(ServerState::Maint))]);
        assert!(d.runtime_reasons()[0].contains("SRV_2"), "{:?}", d.runtime_reasons());
        assert_eq!(verify_runtime_claim(BASE, &new, &[], &d.server_ops()), Ok(()));
        // Draining to weight 0 also waits for the server taking over.
        let drain =
            BASE.replace("weight 10 check", "weight 0 check").replace("10.0.0.2:8080 disabled", "10.0.0.2:8080");
        let ops = diff_cfg(BASE, &drain).server_ops();
        assert!(matches!(&ops[0], Op::ServerSet(s) if s.server == "SRV_2"), "{ops:?}");
    }

    #[test]
    fn added_and_removed_lines_are_named() {
        let added = BASE.replace("disabled\n", "disabled\n  server SRV_3 10.0.0.3:8080\n  balance source\n");
        let d = diff_cfg(BASE, &added);
        assert_eq!(
            texts(&d),
            [r#"backend be_app: added "server SRV_3 10.0.0.3:8080""#, r#"backend be_app: added "balance source""#]
        );
        let removed = BASE.replace("  default_backend be_app\n", "");
        assert_eq!(texts(&diff_cfg(BASE, &removed)), [r#"frontend fe: removed "default_backend be_app""#]);
        // A duplicate line added is named once; a changed line among added ones is both.
        let dup = BASE.replace("mode http\n", "mode http\n  mode http\n  option httplog\n");
        assert_eq!(
            texts(&diff_cfg(BASE, &dup)),
            [r#"defaults: added "mode http""#, r#"defaults: added "option httplog""#]
        );
    }

    #[test]
    fn other_changes_need_reload() {
        for new in [
            BASE.replace("bind 127.0.0.1:80", "bind 127.0.0.1:81"),
            BASE.replace(" check", ""),
            BASE.replace("10.0.0.1:8080", "app.local:8080"),
            BASE.replace("backend be_app", "backend be_other"),
            BASE.replace("weight 10", "weight 300"),
            BASE.replace("  server SRV_1", "  server SRV_0 10.0.0.9:80\n  balance static-rr\n  server SRV_1"),
        ] {
            let d = diff_cfg(BASE, &new);
            assert!(!d.runtime_eligible(), "{new}");
            assert!(verify_runtime_claim(BASE, &new, &[], &[]).is_err());
        }
    }

    #[test]
    fn file_ops_must_match_the_tree() {
        let p = RelPath::new("maps/hosts.map").unwrap();
        let bytes = b"a.example be_a\n";
        let good = Op::MapReplace { path: p.clone(), entries: vec![("a.example".into(), "be_a".into())] };
        let bad = Op::MapReplace { path: p.clone(), entries: vec![] };
        let changed = [ChangedFile { path: &p, new: Some(bytes) }];
        assert_eq!(verify_runtime_claim(BASE, BASE, &changed, std::slice::from_ref(&good)), Ok(()));
        assert!(verify_runtime_claim(BASE, BASE, &changed, &[bad]).is_err());
        assert!(verify_runtime_claim(BASE, BASE, &changed, &[]).is_err());
        assert!(verify_runtime_claim(BASE, BASE, &[], &[good]).is_err());
    }

    fn added(server: &str, addr: &str, weight: Option<u32>, state: ServerState, params: &[&str]) -> ServerAdd {
        let sa: std::net::SocketAddr = addr.parse().unwrap();
        ServerAdd {
            backend: "be_app".into(),
            server: server.into(),
            addr: sa.ip(),
            port: sa.port(),
            weight,
            state,
            params: params.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn servers_added_and_removed_are_runtime() {
        let new = BASE.replace("disabled\n", "disabled\n  server SRV_3 10.0.0.3:8080 weight 5 check inter 2s\n");
        let d = diff_cfg(BASE, &new);
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        let want = added("SRV_3", "10.0.0.3:8080", Some(5), ServerState::Ready, &["check", "inter", "2s"]);
        assert_eq!(d.added, vec![want.clone()]);
        assert_eq!(d.runtime_reasons(), vec!["backend be_app: server SRV_3 added (10.0.0.3:8080)"]);
        assert_eq!(verify_runtime_claim(BASE, &new, &[], &d.server_ops()), Ok(()));
        let e = verify_runtime_claim(BASE, &new, &[], &[]).unwrap_err();
        assert_eq!(e.reasons, vec!["backend be_app: server SRV_3 added (10.0.0.3:8080) has no server.add op"]);
        let other = Op::ServerAdd(ServerAdd { weight: Some(6), ..want.clone() });
        assert!(verify_runtime_claim(BASE, &new, &[], &[other]).unwrap_err().reasons[0].contains("differs"));
        let twice = [Op::ServerAdd(want.clone()), Op::ServerAdd(want)];
        assert!(verify_runtime_claim(BASE, &new, &[], &twice).unwrap_err().reasons[0].contains("more than once"));

        // A server renamed is one deleted and one added; a disabled one is added in maintenance.
        let renamed = BASE.replace("SRV_2 10.0.0.2:8080 disabled", "SRV_9 [::1]:8080 disabled");
        let d = diff_cfg(BASE, &renamed);
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        assert_eq!(d.added, vec![added("SRV_9", "[::1]:8080", None, ServerState::Maint, &[])]);
        assert_eq!(d.removed, vec![ServerDel { backend: "be_app".into(), server: "SRV_2".into() }]);
        let ops = d.server_ops();
        assert!(matches!((&ops[0], &ops[1]), (Op::ServerAdd(_), Op::ServerDel(_))), "{ops:?}");
        assert_eq!(verify_runtime_claim(BASE, &renamed, &[], &ops), Ok(()));
        assert!(verify_runtime_claim(BASE, &renamed, &[], &ops[..1]).unwrap_err().reasons[0].contains("no server.del"));

        // Removing every server, with a kept server's weight changed alongside.
        let gone = BASE.replace("  server SRV_2 10.0.0.2:8080 disabled\n", "").replace("weight 10", "weight 20");
        let d = diff_cfg(BASE, &gone);
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        assert_eq!((d.servers.len(), d.added.len(), d.removed.len()), (1, 0, 1));
        assert_eq!(verify_runtime_claim(BASE, &gone, &[], &d.server_ops()), Ok(()));
    }

    #[test]
    fn servers_added_where_runtime_cannot_follow_the_file_reload() {
        let add = |line: &str| BASE.replace("disabled\n", &format!("disabled\n  {line}\n"));
        for (what, new, why) in [
            ("cookie", add("server SRV_3 10.0.0.3:80 cookie c3"), "parameter \"cookie\""),
            ("enabled is refused by 3.0", add("server SRV_3 10.0.0.3:80 weight 1 ssl"), "parameter \"ssl\""),
            ("a hostname", add("server SRV_3 app.local:80"), "not an IP address with a port"),
            ("no port", add("server SRV_3 10.0.0.3"), "not an IP address with a port"),
            ("prefixed", add("server SRV_3 ipv4@10.0.0.3:80"), "is not written as 10.0.0.3:80"),
            ("weight", add("server SRV_3 10.0.0.3:80 weight 999"), "weight"),
            ("quoted", add("server SRV_3 10.0.0.3:80 inter \"2s\""), "not a plain word"),
            ("static-rr", add("server SRV_3 10.0.0.3:80\n  balance static-rr"), "added \"balance static-rr\""),
            ("track", add("server SRV_3 10.0.0.3:80 track be_app/SRV_1"), "`track`s another"),
            (
                "default-server in defaults",
                add("server SRV_3 10.0.0.3:80").replace("mode http", "mode http\n  default-server check"),
                "defaults has `default-server`",
            ),
            (
                "hash balance in defaults",
                add("server SRV_3 10.0.0.3:80").replace("mode http", "mode http\n  balance source"),
                "balances with \"source\"",
            ),
        ] {
            let d = diff_cfg(BASE, &new);
            assert!(!d.runtime_eligible(), "{what}");
            assert!(d.added.is_empty(), "{what}");
            assert!(d.reload_reasons.iter().any(|r| r.text.contains(why)), "{what}: {:?}", d.reload_reasons);
        }
        for header in ["listen be_app", "backend be_app from d"] {
            let base = BASE.replace("backend be_app", header).replace("defaults", "defaults d");
            let d = diff_cfg(&base, &base.replace("disabled\n", "disabled\n  server SRV_3 10.0.0.3:80\n"));
            assert!(
                d.reload_reasons.iter().any(|r| r.text.contains("plain `backend`")),
                "{header}: {:?}",
                d.reload_reasons
            );
        }
        let tracked = format!("{BASE}backend be_b\n  server t 10.0.0.4:80 track be_app/SRV_1\n");
        let d = diff_cfg(&tracked, &tracked.replace("  server SRV_2 10.0.0.2:8080 disabled\n", ""));
        assert!(d.reload_reasons[0].text.contains("`track`s another"), "{:?}", d.reload_reasons);
        // Deleting follows the same backend rules.
        let sticky = BASE.replace("mode http", "mode http\n  stick-table type ip size 1k");
        let gone = sticky.replace("  server SRV_2 10.0.0.2:8080 disabled\n", "");
        assert!(diff_cfg(&sticky, &gone).reload_reasons[0].text.contains("`stick-table`"));
        // Kept servers reordered: a reload (their ids and round-robin order come from the file).
        let swapped = BASE
            .replace("  server SRV_1 10.0.0.1:8080 weight 10 check\n", "")
            .replace("disabled\n", "disabled\n  server SRV_1 10.0.0.1:8080 weight 10 check\n");
        assert!(!diff_cfg(BASE, &swapped).runtime_eligible());
    }

    /// [`BASE`] with a named `defaults` section, plus `extra` appended after `be_app`.
    fn named(extra: &str) -> String {
        BASE.replace("defaults\n", "defaults haptic\n") + extra
    }

    #[test]
    fn a_plain_backend_after_named_defaults_is_added_at_runtime() {
        let old = named("");
        let new = named("backend be_new\n  server SRV_1 10.0.0.7:80 check\n  server SRV_2 127.0.0.1:1 disabled\n");
        let d = diff_cfg(&old, &new);
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        let want = BackendAdd {
            backend: "be_new".into(),
            defaults: "haptic".into(),
            servers: vec![
                added("SRV_1", "10.0.0.7:80", None, ServerState::Ready, &["check"]),
                added("SRV_2", "127.0.0.1:1", None, ServerState::Maint, &[]),
            ]
            .into_iter()
            .map(|a| ServerAdd { backend: "be_new".into(), ..a })
            .collect(),
        };
        assert_eq!(d.backends_added, vec![want.clone()]);
        assert_eq!(d.backend_reasons(), vec!["backend be_new added from defaults haptic (2 servers)".to_string()]);
        // Between two kept sections too, and beside a server change of a kept backend.
        let between = old.replace("frontend fe", "backend be_mid\n  server SRV_1 10.0.0.8:80\nfrontend fe");
        let between = between.replace("10.0.0.1:8080", "10.0.0.9:8080");
        let d = diff_cfg(&old, &between);
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        assert_eq!((d.backends_added.len(), d.servers.len()), (1, 1));

        let ops = [Op::BackendAdd(want.clone())];
        assert_eq!(verify_runtime_claim(&old, &new, &[], &ops), Ok(()));
        let missing = verify_runtime_claim(&old, &new, &[], &[]).unwrap_err().reasons.join("; ");
        assert!(missing.contains("be_new added from defaults haptic (2 servers) has no backend.add op"), "{missing}");
        let mut wrong = want.clone();
        wrong.servers.pop();
        let e = verify_runtime_claim(&old, &new, &[], &[Op::BackendAdd(wrong)]).unwrap_err().reasons.join("; ");
        assert!(e.contains("backend.add be_new: differs from the new config's section"), "{e}");
        let twice = [Op::BackendAdd(want.clone()), Op::BackendAdd(want.clone())];
        assert!(verify_runtime_claim(&old, &new, &[], &twice)
            .unwrap_err()
            .reasons
            .join("; ")
            .contains("more than once"));
        let stray = BackendAdd { backend: "be_other".into(), servers: vec![], ..want };
        let e = verify_runtime_claim(&old, &old, &[], &[Op::BackendAdd(stray)]).unwrap_err().reasons.join("; ");
        assert!(e.contains("backend.add be_other: the new config does not add this backend"), "{e}");
    }

    #[test]
    fn a_backend_runtime_cannot_build_as_the_file_does_reloads() {
        let server = "  server SRV_1 10.0.0.7:80\n";
        for (what, old, new, why) in [
            ("unnamed defaults", BASE.to_string(), format!("{BASE}backend be_new\n{server}"), "has no name"),
            ("a timeout", named(""), named(&format!("backend be_new\n  timeout server 5s\n{server}")), "`timeout`"),
            ("balance source", named(""), named(&format!("backend be_new\n  balance source\n{server}")), "`balance`"),
            ("a hostname", named(""), named("backend be_new\n  server SRV_1 app.local:80\n"), "not an IP"),
            ("a listen section", named(""), named(&format!("listen be_new\n{server}")), "plain `backend`"),
            ("a frontend", named(""), named("frontend fe2\n  bind 127.0.0.1:81\n"), "plain `backend`"),
            ("a name twice", named(""), named(&format!("backend be_new\n{server}{server}")), "named twice"),
            (
                "cookie in defaults",
                named(""),
                named(&format!("backend be_new\n{server}")).replace("mode http", "mode http\n  cookie SRV insert"),
                "`cookie`",
            ),
        ] {
            let d = diff_cfg(&old, &new);
            assert!(!d.runtime_eligible() && d.backends_added.is_empty(), "{what}");
            assert!(d.reload_reasons.iter().any(|r| r.text.contains(why)), "{what}: {:?}", d.reload_reasons);
        }
        // A section removed or reordered is no addition.
        let two = named("backend be_b\n  server SRV_1 10.0.0.7:80\n");
        let reordered =
            two.replace("backend be_app\n", "backend be_tmp\n").replace("backend be_b\n", "backend be_app\n");
        for (old, new) in [(two.as_str(), named("")), (two.as_str(), reordered)] {
            let d = diff_cfg(old, &new);
            assert!(!d.runtime_eligible() && d.backends_added.is_empty(), "{new}");
        }
    }

    #[test]
    fn membership_ops_the_configs_do_not_say_are_refused_by_name() {
        let op = added("SRV_3", "10.0.0.3:80", None, ServerState::Ready, &[]);
        let cases = [
            (
                Op::ServerAdd(ServerAdd { backend: "be_nope".into(), ..op.clone() }),
                "no backend be_nope in the new config",
            ),
            (Op::ServerAdd(op), "the new config does not add this server"),
            (
                Op::ServerAdd(added("SRV_1", "10.0.0.1:8080", None, ServerState::Ready, &[])),
                "in the running config already",
            ),
            (
                Op::ServerDel(ServerDel { backend: "be_app".into(), server: "SRV_1".into() }),
                "the new config keeps this server",
            ),
            (
                Op::ServerDel(ServerDel { backend: "be_nope".into(), server: "x".into() }),
                "no backend be_nope in the running",
            ),
            (Op::ServerDel(ServerDel { backend: "be_app".into(), server: "SRV_7".into() }), "no such server"),
        ];
        for (op, want) in cases {
            let e = verify_runtime_claim(BASE, BASE, &[], std::slice::from_ref(&op)).unwrap_err();
            assert!(e.reasons.iter().any(|r| r.contains(want)), "{op:?}: {e}");
        }
    }

    #[test]
    fn server_ops_must_agree_with_the_config() {
        let lying = Op::ServerSet(ServerSet {
            backend: "be_app".into(),
            server: "SRV_1".into(),
            addr: Some("10.9.9.9".into()),
            port: None,
            weight: None,
            state: None,
        });
        assert!(verify_runtime_claim(BASE, BASE, &[], &[lying]).is_err());
    }
}

#[cfg(test)]
mod proptests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// What a server looks like to HAProxy: address, weight, state, parameters.
    type Srv = (std::net::SocketAddr, u32, bool, Vec<String>);

    /// A server's parameters follow from its name (a parameter change is a reload, not tested here).
    fn params(n: u8) -> Vec<String> {
        let p: &[&str] = match n % 4 {
            0 => &[],
            1 => &["check"],
            2 => &["check", "inter", "500ms"],
            _ => &["maxconn", "10"],
        };
        p.iter().map(|s| s.to_string()).collect()
    }

    fn server() -> impl Strategy<Value = (std::net::SocketAddr, u32, bool)> {
        (1u8..=254, 1u16..=65535, 0u32..=256, any::<bool>())
            .prop_map(|(a, port, w, dis)| (std::net::SocketAddr::from(([10, 0, 0, a], port)), w, dis))
    }

    /// Server name index → server, for two backends.
    fn fleet() -> impl Strategy<Value = [BTreeMap<u8, Srv>; 2]> {
        let one = || {
            proptest::collection::btree_map(0u8..12, server(), 0..8)
                .prop_map(|m| m.into_iter().map(|(n, (a, w, d))| (n, (a, w, d, params(n)))).collect())
        };
        (one(), one()).prop_map(|(a, b)| [a, b])
    }

    fn text(backends: &[BTreeMap<u8, Srv>; 2]) -> String {
        let mut s = "global\n  default-path config\ndefaults\n  mode http\nfrontend fe\n  bind 127.0.0.1:80\n  default_backend be_0\n".to_string();
        for (i, servers) in backends.iter().enumerate() {
            s.push_str(&format!("backend be_{i}\n  balance roundrobin\n"));
            for (n, (addr, w, dis, params)) in servers {
                let d = if *dis { " disabled" } else { "" };
                let p: String = params.iter().map(|p| format!(" {p}")).collect();
                s.push_str(&format!("  server s{n} {addr} weight {w}{d}{p}\n"));
            }
        }
        s
    }

    /// Runs ops on a model of the running servers, as HAProxy would.
    fn apply(mut running: [BTreeMap<u8, Srv>; 2], ops: &[Op]) -> Result<[BTreeMap<u8, Srv>; 2], String> {
        let key = |b: &str, s: &str| -> (usize, u8) {
            (b.trim_start_matches("be_").parse().unwrap(), s.trim_start_matches('s').parse().unwrap())
        };
        for op in ops {
            match op {
                Op::ServerAdd(a) => {
                    let (b, n) = key(&a.backend, &a.server);
                    let srv = (a.socket_addr(), a.weight.unwrap_or(1), a.state == ServerState::Maint, a.params.clone());
                    if running[b].insert(n, srv).is_some() {
                        return Err(format!("{} exists", op.describe()));
                    }
                }
                Op::ServerDel(d) => {
                    let (b, n) = key(&d.backend, &d.server);
                    running[b].remove(&n).ok_or(format!("{} missing", op.describe()))?;
                }
                Op::ServerSet(s) => {
                    let (b, n) = key(&s.backend, &s.server);
                    let srv = running[b].get_mut(&n).ok_or(format!("{} missing", op.describe()))?;
                    if let Some(a) = &s.addr {
                        srv.0 = std::net::SocketAddr::new(a.parse().unwrap(), s.port.unwrap_or(srv.0.port()));
                    }
                    if let Some(w) = s.weight {
                        srv.1 = w;
                    }
                    if let Some(st) = s.state {
                        srv.2 = st == ServerState::Maint;
                    }
                }
                other => return Err(format!("unexpected {}", other.describe())),
            }
        }
        Ok(running)
    }

    proptest! {
        #[test]
        fn the_ops_turn_the_old_servers_into_the_new_ones(old in fleet(), new in fleet()) {
            let (a, b) = (text(&old), text(&new));
            let d = diff_cfg(&a, &b);
            prop_assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
            let ops = d.server_ops();
            prop_assert_eq!(verify_runtime_claim(&a, &b, &[], &ops), Ok(()));
            prop_assert_eq!(apply(old, &ops), Ok(new));
            // Dropping any one op breaks the claim.
            for i in 0..ops.len() {
                let mut fewer = ops.clone();
                fewer.remove(i);
                prop_assert!(verify_runtime_claim(&a, &b, &[], &fewer).is_err());
            }
        }
    }
}
