//! The plan diff: what it takes to bring a pod from its baseline plan to a desired render.
//!
//! Owns the decision runtime / file_only / reload, its human reasons and the op batches, built on
//! `haptic_haproxy::claim::diff_cfg` and `haptic_haproxy::cfg` so the agent's runtime-claim
//! verification agrees with it. Pure: it must never do I/O, never look at a clock, and never call
//! a change runtime-safe that `verify_runtime_claim` would refuse.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use haptic_haproxy::cfg::{parse_acl_file, parse_map_file};
use haptic_haproxy::claim::ConfigPart;
use haptic_haproxy::paths::{classify, loaded_paths, LoadKind};
use haptic_protocol::{
    changed_paths, ApiVersion, Capabilities, FileEntry, Mode, Op, OpKind, PlanId, RelPath, API_VERSION,
};
use serde::{Serialize, Serializer};

use crate::bundle::{diff_cfg_cached, Bundle, CfgIndex};

/// What the controller knows about a plan a pod holds: enough to diff a new render against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Baseline {
    /// The plan id.
    pub plan_id: PlanId,
    /// The plan's complete manifest.
    pub manifest: Vec<FileEntry>,
    /// The plan's `haproxy.cfg` text, when known (needed only if the config changed).
    pub cfg_text: Option<Arc<str>>,
    /// The parsed form of `cfg_text`, filled when first needed.
    pub cfg_index: CfgIndex,
}

impl Baseline {
    /// The baseline of a render the controller holds in full.
    pub fn of_render(r: &Bundle) -> Self {
        Baseline {
            plan_id: r.plan_id(),
            manifest: r.manifest().to_vec(),
            cfg_text: Some(Arc::from(r.cfg_text())),
            cfg_index: r.cfg_index().clone(),
        }
    }

    fn entry(&self, path: &RelPath) -> Option<&FileEntry> {
        self.manifest.iter().find(|e| &e.path == path)
    }
}

/// Why an apply reloads, as `haptic_reload_causes_total{cause}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReloadCause {
    /// A part of `haproxy.cfg` whose change the runtime API cannot make.
    Config(ConfigPart),
    /// A file the config loads at startup was added, removed or changed in a way no runtime op
    /// replaces.
    File,
    /// A file the running config does not load changed in the same apply as runtime changes (one
    /// apply has one mode).
    FileWithRuntime,
    /// A new backend, for an agent whose HAProxy adds backends only by reload (before 3.4).
    BackendByReload,
    /// No usable baseline on the pod (first apply, version skew, an unknown config text): the
    /// complete state.
    CompleteState,
    /// The agent reloaded where a runtime or file-only apply was asked (an op failed there).
    AgentFallback,
}

impl ReloadCause {
    /// The metric label: a config part's (`frontend`, `backend`, `server`, …), or `file`,
    /// `file_with_runtime`, `backend_by_reload`, `complete_state`, `agent_fallback`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config(part) => part.as_str(),
            Self::File => "file",
            Self::FileWithRuntime => "file_with_runtime",
            Self::BackendByReload => "backend_by_reload",
            Self::CompleteState => "complete_state",
            Self::AgentFallback => "agent_fallback",
        }
    }
}

impl Serialize for ReloadCause {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The capability-independent diff of two plans.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Diff {
    /// `None` when nothing changed.
    pub mode: Option<Mode>,
    /// Why this mode, in human words (every reload reason for a reload).
    pub reasons: Vec<String>,
    /// What the reload is for (empty unless the mode is reload).
    pub causes: BTreeSet<ReloadCause>,
    /// The op batches of a runtime change; empty otherwise.
    pub batches: Vec<Vec<Op>>,
}

impl Diff {
    /// A reload for `reasons`, for `causes`.
    fn reload(reasons: Vec<String>, causes: BTreeSet<ReloadCause>) -> Self {
        Diff { mode: Some(Mode::Reload), reasons, causes, batches: Vec::new() }
    }

    /// Every op kind the batches use.
    pub fn op_kinds(&self) -> BTreeSet<OpKind> {
        self.batches.iter().flatten().filter_map(Op::kind).collect()
    }

    /// Number of ops.
    pub fn op_count(&self) -> usize {
        self.batches.iter().map(Vec::len).sum()
    }
}

/// A diff fitted to one agent: the mode, reasons and batches to send, and whether it is the
/// complete state (no baseline).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanDiff {
    /// `None` when the pod already holds the desired plan.
    pub mode: Option<Mode>,
    /// Human reasons.
    pub reasons: Vec<String>,
    /// What the reload is for (empty unless the mode is reload).
    pub causes: BTreeSet<ReloadCause>,
    /// Op batches.
    pub batches: Vec<Vec<Op>>,
    /// The baseline the apply is composed against; `None` = complete state.
    pub baseline: Option<PlanId>,
    /// Why the agent got the complete state and a reload because of version skew, if it did.
    pub skew: Option<String>,
}

/// The complete state and a reload, for a pod without a usable baseline.
pub fn complete_state(reason: impl Into<String>) -> PlanDiff {
    PlanDiff {
        mode: Some(Mode::Reload),
        reasons: vec![reason.into()],
        causes: BTreeSet::from([ReloadCause::CompleteState]),
        batches: Vec::new(),
        baseline: None,
        skew: None,
    }
}

/// Diffs a desired render against a baseline, then fits the result to the agent's API version
/// and capabilities: an agent on another API major, or lacking an op kind the diff uses, gets
/// the complete state and a reload (version skew), never a refusal.
pub fn plan(baseline: Option<&Baseline>, desired: &Bundle, api: ApiVersion, caps: &Capabilities) -> PlanDiff {
    let Some(base) = baseline else {
        return complete_state("no usable baseline on the pod: complete state and a reload");
    };
    if !API_VERSION.compatible_with(&api) {
        let why = format!(
            "agent speaks API {}.{}, the controller {}.{}: complete state and a reload",
            api.major, api.minor, API_VERSION.major, API_VERSION.minor
        );
        return PlanDiff { skew: Some(why.clone()), ..complete_state(why) };
    }
    let mut d = diff(base, desired);
    if !caps.supports(OpKind::MapLoad) {
        map_loads_as_entries(&mut d, desired);
    }
    if !caps.supports(OpKind::BackendAdd) {
        backends_by_reload(&mut d);
    }
    let missing: Vec<&str> = d.op_kinds().into_iter().filter(|k| !caps.supports(*k)).map(OpKind::as_str).collect();
    if !missing.is_empty() {
        let why = format!("agent cannot run {}: complete state and a reload", missing.join(", "));
        return PlanDiff { skew: Some(why.clone()), ..complete_state(why) };
    }
    PlanDiff {
        mode: d.mode,
        reasons: d.reasons,
        causes: d.causes,
        batches: d.batches,
        baseline: Some(base.plan_id),
        skew: None,
    }
}

/// Makes a diff that adds backends a reload, for an agent whose HAProxy adds none at runtime
/// (before 3.4): not version skew, the way that HAProxy takes a new backend.
fn backends_by_reload(d: &mut Diff) {
    let added: Vec<String> = d
        .batches
        .iter()
        .flatten()
        .filter_map(|op| match op {
            Op::BackendAdd(b) => Some(format!(
                "{} (this HAProxy adds backends only by reload)",
                haptic_haproxy::claim::backend_added_reason(b)
            )),
            _ => None,
        })
        .collect();
    if !added.is_empty() {
        *d = Diff::reload(added, BTreeSet::from([ReloadCause::BackendByReload]));
    }
}

/// Turns every `map.load` into the `map.replace` an agent before API 1.1 runs: the same map,
/// with its entries read from the render.
fn map_loads_as_entries(d: &mut Diff, desired: &Bundle) {
    for op in d.batches.iter_mut().flatten() {
        if let Op::MapLoad { path } = op {
            let text = desired.bytes(path).and_then(|b| std::str::from_utf8(b).ok()).unwrap_or_default();
            *op = Op::MapReplace { path: path.clone(), entries: parse_map_file(text) };
        }
    }
}

/// Diffs a desired render against a baseline (capability-independent).
pub fn diff(base: &Baseline, desired: &Bundle) -> Diff {
    if base.plan_id == desired.plan_id() {
        return Diff::default();
    }
    let cfg_path = RelPath::haproxy_cfg();
    let new_cfg = desired.cfg_text();
    let cfg_unchanged = base.entry(&cfg_path).map(|e| e.digest) == desired.entry(&cfg_path).map(|e| e.digest);
    // The running config's text: the same as the new one when the digest matches.
    let old_cfg: Option<&str> = if cfg_unchanged { Some(new_cfg) } else { base.cfg_text.as_deref() };

    let Some(old_cfg) = old_cfg else {
        let why = "haproxy.cfg changed and the baseline's config text is unknown".to_string();
        return Diff::reload(vec![why], BTreeSet::from([ReloadCause::CompleteState]));
    };
    let mut t = Tally::default();
    if !cfg_unchanged {
        let cd = diff_cfg_cached(old_cfg, &base.cfg_index, new_cfg, desired.cfg_index());
        t.reload.extend(cd.reload_reasons.iter().map(|r| (ReloadCause::Config(r.part), r.text.clone())));
        t.runtime.extend(cd.backend_reasons());
        t.backend_ops.extend(cd.backend_ops());
        t.runtime.extend(cd.runtime_reasons());
        let (up, down) = cd.server_ops_split();
        t.server_up_ops.extend(up);
        t.server_down_ops.extend(down);
    }
    files_changed(base, desired, old_cfg, &mut t);
    t.decide(cfg_unchanged)
}

/// The reasons and ops a diff collects before it decides the mode.
#[derive(Debug, Default)]
struct Tally {
    reload: Vec<(ReloadCause, String)>,
    runtime: Vec<String>,
    file_only: Vec<String>,
    /// `backend.add` ops: first in the batch, before the map that routes to the backend.
    backend_ops: Vec<Op>,
    file_ops: Vec<Op>,
    /// Servers added or taking traffic afterwards: before the maps, which may send traffic to them.
    server_up_ops: Vec<Op>,
    /// Servers that stop or go: after the maps, which may have taken traffic away from them.
    server_down_ops: Vec<Op>,
}

impl Tally {
    /// The diff of what was collected: any reload reason reloads; runtime changes with a
    /// file_only change reload too; else runtime, else file_only.
    fn decide(self, cfg_unchanged: bool) -> Diff {
        let Tally { reload, mut runtime, file_only, backend_ops, file_ops, server_up_ops, server_down_ops } = self;
        let no_server_ops = server_up_ops.is_empty() && server_down_ops.is_empty();
        if !reload.is_empty() {
            let causes = reload.iter().map(|(c, _)| *c).collect();
            return Diff::reload(reload.into_iter().map(|(_, r)| r).collect(), causes);
        }
        let runtime_needed = !backend_ops.is_empty() || !file_ops.is_empty() || !no_server_ops || !cfg_unchanged;
        if runtime_needed && !file_only.is_empty() {
            // One apply is either runtime (every changed file covered by an op, as the agent's claim
            // check demands) or file_only (the config text unchanged): both at once reload.
            let mut reasons: Vec<String> = file_only
                .iter()
                .map(|r| format!("{r}, but it ships with runtime changes (one apply, one mode)"))
                .collect();
            reasons.extend(runtime);
            return Diff::reload(reasons, BTreeSet::from([ReloadCause::FileWithRuntime]));
        }
        if runtime_needed {
            if backend_ops.is_empty() && file_ops.is_empty() && no_server_ops {
                // Only comments or whitespace changed: the running config is equivalent and the
                // runtime claim (which compares normalized lines) holds with no ops at all.
                runtime.push("haproxy.cfg: only comments or whitespace changed".into());
                return Diff { mode: Some(Mode::Runtime), reasons: runtime, ..Diff::default() };
            }
            // New backends and new capacity, then the maps that may route to them, then the
            // capacity the maps no longer route to: no request finds a backend without servers.
            let mut batch = backend_ops;
            batch.extend(server_up_ops);
            batch.extend(file_ops);
            batch.extend(server_down_ops);
            return Diff { mode: Some(Mode::Runtime), reasons: runtime, batches: vec![batch], ..Diff::default() };
        }
        Diff { mode: Some(Mode::FileOnly), reasons: file_only, ..Diff::default() }
    }
}

/// Tallies every changed file other than haproxy.cfg: added, removed or modified.
fn files_changed(base: &Baseline, desired: &Bundle, old_cfg: &str, t: &mut Tally) {
    let new_cfg = desired.cfg_text();
    let old_files: BTreeMap<&RelPath, &FileEntry> = base.manifest.iter().map(|e| (&e.path, e)).collect();
    let new_files: BTreeMap<&RelPath, &FileEntry> = desired.manifest().iter().map(|e| (&e.path, e)).collect();
    // Sorted by path: the file ops run in this order, and the render names its maps so that a
    // route's entries come in before the one map that gives it a backend.
    let mut changed = changed_paths(&base.manifest, desired.manifest());
    changed.retain(|p| !p.is_haproxy_cfg());
    // What each config makes HAProxy load, by the one shared path list (crt companions,
    // crt-list entries, directories...): a file HAProxy loads is never file_only. A crt-list is
    // read from the render; for the old config only when the baseline holds the same bytes.
    let read_new = |p: &str| -> Option<String> {
        let rel = RelPath::new(p).ok()?;
        desired.bytes(&rel).and_then(|b| std::str::from_utf8(b).ok()).map(str::to_string)
    };
    let read_old = |p: &str| -> Option<String> {
        let rel = RelPath::new(p).ok()?;
        let same = old_files.get(&rel).map(|e| e.digest) == new_files.get(&rel).map(|e| e.digest);
        if same {
            read_new(p)
        } else {
            None
        }
    };
    let loaded_by_old = loaded_paths(old_cfg, changed.iter().copied(), &read_old);
    let loaded_by_new = loaded_paths(new_cfg, changed.iter().copied(), &read_new);
    for path in changed {
        let (was, is) = (old_files.contains_key(path), new_files.contains_key(path));
        if !loaded_by_old.contains(path) {
            if loaded_by_new.contains(path) {
                t.reload.push((ReloadCause::File, format!("{path}: newly loaded by the config")));
            } else {
                t.file_only.push(format!("{path}: not loaded by the running config (file only)"));
            }
            continue;
        }
        if !is {
            t.reload.push((ReloadCause::File, format!("{path}: removed while the config loads it")));
            continue;
        }
        if !was {
            t.reload.push((
                ReloadCause::File,
                format!("{path}: added where the config loads files (new files load at reload)"),
            ));
            continue;
        }
        loaded_file_changed(path, old_cfg, desired, t);
    }
}

/// Tallies a file the running config loads whose bytes changed: replaced at runtime by the
/// op its kind allows, else a reload.
fn loaded_file_changed(path: &RelPath, old_cfg: &str, desired: &Bundle, t: &mut Tally) {
    let bytes = desired.bytes(path).unwrap_or_default();
    match (classify(old_cfg, path), std::str::from_utf8(bytes)) {
        (LoadKind::Map, Ok(_)) => {
            t.runtime.push(format!("{path}: map replaced at runtime from its file"));
            t.file_ops.push(Op::MapLoad { path: path.clone() });
        }
        (LoadKind::Acl, Ok(text)) => {
            let patterns = parse_acl_file(text);
            t.runtime.push(format!("{path}: ACL replaced at runtime ({} patterns)", patterns.len()));
            t.file_ops.push(Op::AclReplace { path: path.clone(), patterns });
        }
        (LoadKind::Map | LoadKind::Acl, Err(_)) => {
            t.reload.push((ReloadCause::File, format!("{path}: not UTF-8, cannot be sent as entries")))
        }
        (LoadKind::Cert, _) => {
            t.runtime.push(format!("{path}: loaded certificate replaced at runtime"));
            t.file_ops.push(Op::CertSet { path: path.clone() });
        }
        (LoadKind::CaFile, _) => {
            t.runtime.push(format!("{path}: loaded CA file replaced at runtime"));
            t.file_ops.push(Op::CaFileSet { path: path.clone() });
        }
        (LoadKind::Other, _) => {
            t.reload.push((ReloadCause::File, format!("{path}: changed, and the config loads it at startup")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_haproxy::claim::{verify_runtime_claim, ChangedFile};

    const CFG: &str = "global\n  default-path config\ndefaults\n  mode http\n  timeout client 5s\nfrontend fe\n  bind 127.0.0.1:8080\n  bind 127.0.0.1:8443 ssl crt certs/\n  acl blocked src -f acls/blocked.acl\n  http-request deny if blocked\n  use_backend %[req.hdr(host),lower,map(maps/hosts.map,be_app)]\n  errorfile 503 errors/503.http\nbackend be_app\n  server SRV_1 127.0.0.1:9001 weight 10\n  server SRV_2 127.0.0.1:9002 disabled\n";

    fn render(cfg: &str, extra: &[(&str, &str)]) -> Bundle {
        let mut files = vec![("haproxy.cfg", cfg)];
        files.extend_from_slice(extra);
        Bundle::from_texts(files).unwrap()
    }

    fn base_files() -> Vec<(&'static str, &'static str)> {
        vec![
            ("maps/hosts.map", "a.example be_app\n"),
            ("acls/blocked.acl", "10.0.0.0/8\n"),
            ("certs/site.pem", "PEM-1\n"),
            ("errors/503.http", "HTTP/1.0 503\r\n\r\n"),
            ("files/notes.txt", "hello\n"),
        ]
    }

    fn with(path: &'static str, body: &'static str) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<_> = base_files().into_iter().filter(|(p, _)| *p != path).collect();
        if !body.is_empty() {
            v.push((path, body));
        }
        v
    }

    fn caps_all() -> Capabilities {
        Capabilities { runtime_batches: true, ops: OpKind::ALL.iter().map(|k| k.as_str().to_string()).collect() }
    }

    /// Checks the diff as the agent would, with the shared claim verifier over every changed file.
    fn agent_agrees(old: &Bundle, new: &Bundle, d: &Diff) {
        let ops: Vec<Op> = d.batches.iter().flatten().cloned().collect();
        let changed: Vec<(RelPath, Option<Vec<u8>>)> = changed_paths(old.manifest(), new.manifest())
            .into_iter()
            .filter(|p| !p.is_haproxy_cfg())
            .map(|p| (p.clone(), new.bytes(p).map(<[u8]>::to_vec)))
            .collect();
        let cf: Vec<ChangedFile<'_>> =
            changed.iter().map(|(p, b)| ChangedFile { path: p, new: b.as_deref() }).collect();
        let res = verify_runtime_claim(old.cfg_text(), new.cfg_text(), &cf, &ops);
        assert!(res.is_ok(), "agent refuses the claim: {res:?}");
    }

    #[test]
    fn same_render_is_nothing() {
        let r = render(CFG, &base_files());
        let d = diff(&Baseline::of_render(&r), &r);
        assert_eq!(d, Diff::default());
        let p = plan(Some(&Baseline::of_render(&r)), &r, API_VERSION, &caps_all());
        assert_eq!(p.mode, None);
    }

    #[test]
    fn endpoint_changes_are_runtime() {
        let old = render(CFG, &base_files());
        let new_cfg = CFG
            .replace("127.0.0.1:9001 weight 10", "127.0.0.2:9011 weight 20")
            .replace("127.0.0.1:9002 disabled", "127.0.0.1:9002");
        let new = render(&new_cfg, &base_files());
        let d = diff(&Baseline::of_render(&old), &new);
        assert_eq!(d.mode, Some(Mode::Runtime), "{:?}", d.reasons);
        assert_eq!(d.op_count(), 2);
        let servers: Vec<&str> = d
            .batches
            .iter()
            .flatten()
            .filter_map(|op| match op {
                Op::ServerSet(s) => Some(s.server.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(servers, ["SRV_1", "SRV_2"], "{:?}", d.batches);
        agent_agrees(&old, &new, &d);
    }

    #[test]
    fn servers_added_and_removed_are_runtime_for_agents_that_run_them() {
        let old = render(CFG, &base_files());
        let grown = CFG.replace(
            "disabled\n",
            "disabled\n  server SRV_3 127.0.0.1:9003 weight 10\n  server SRV_4 127.0.0.1:9004\n",
        );
        let new = render(&grown, &with("maps/hosts.map", "a.example be_app\nb.example be_app\n"));
        let d = diff(&Baseline::of_render(&old), &new);
        assert_eq!(d.mode, Some(Mode::Runtime), "{:?}", d.reasons);
        assert_eq!(d.op_kinds().into_iter().collect::<Vec<_>>(), vec![OpKind::ServerAdd, OpKind::MapLoad]);
        assert!(
            d.reasons.iter().any(|r| r == "backend be_app: server SRV_4 added (127.0.0.1:9004)"),
            "{:?}",
            d.reasons
        );
        agent_agrees(&old, &new, &d);
        let shrunk = render(&CFG.replace("  server SRV_2 127.0.0.1:9002 disabled\n", ""), &base_files());
        let d = diff(&Baseline::of_render(&old), &shrunk);
        assert_eq!(
            (d.mode, d.op_kinds().into_iter().collect::<Vec<_>>()),
            (Some(Mode::Runtime), vec![OpKind::ServerDel])
        );
        agent_agrees(&old, &shrunk, &d);
        // An agent that does not advertise the kinds gets the complete state and a reload.
        let old_agent = Capabilities {
            runtime_batches: true,
            ops: vec!["server.set".into(), "map.replace".into(), "acl.replace".into(), "cert.set".into()],
        };
        let p = plan(Some(&Baseline::of_render(&old)), &new, API_VERSION, &old_agent);
        assert_eq!((p.mode, p.baseline), (Some(Mode::Reload), None));
        assert_eq!(p.skew.as_deref(), Some("agent cannot run server.add: complete state and a reload"));
        let p = plan(Some(&Baseline::of_render(&old)), &new, API_VERSION, &caps_all());
        assert_eq!((p.mode, p.skew), (Some(Mode::Runtime), None));
    }

    #[test]
    fn a_map_moving_traffic_runs_between_the_capacity_it_needs_and_the_capacity_it_frees() {
        // be_other's server is parked (a Service no rule routes to); the map moves b.example
        // there, be_other's server comes up and be_app's goes to maintenance.
        let two = format!("{CFG}backend be_other\n  server SRV_1 127.0.0.1:1 disabled\n");
        let old = render(&two, &base_files());
        let moved = two
            .replace("server SRV_1 127.0.0.1:9001 weight 10", "server SRV_1 127.0.0.1:9001 weight 10 disabled")
            .replace("server SRV_1 127.0.0.1:1 disabled", "server SRV_1 127.0.0.1:9005");
        let new = render(&moved, &with("maps/hosts.map", "a.example be_other\nb.example be_other\n"));
        let d = diff(&Baseline::of_render(&old), &new);
        assert_eq!(d.mode, Some(Mode::Runtime), "{:?}", d.reasons);
        let order: Vec<String> = d.batches[0]
            .iter()
            .map(|op| match op {
                Op::ServerSet(s) => format!("{}/{} {:?}", s.backend, s.server, s.state),
                other => format!("{:?}", other.kind()),
            })
            .collect();
        assert_eq!(
            order,
            ["be_other/SRV_1 Some(Ready)", "Some(MapLoad)", "be_app/SRV_1 Some(Maint)"],
            "{:?}",
            d.batches
        );
        agent_agrees(&old, &new, &d);
    }

    #[test]
    fn a_backend_added_is_runtime_where_the_agent_adds_backends_and_a_reload_elsewhere() {
        let named = CFG.replace("defaults\n", "defaults haptic\n");
        let old = render(&named, &base_files());
        let grown =
            format!("{named}backend be_new\n  server SRV_1 127.0.0.1:9005\n  server SRV_2 127.0.0.1:1 disabled\n");
        let new = render(&grown, &with("maps/hosts.map", "a.example be_app\nb.example be_new\n"));
        let d = diff(&Baseline::of_render(&old), &new);
        assert_eq!(d.mode, Some(Mode::Runtime), "{:?}", d.reasons);
        // The backend first: the map that routes to it loads once it is there.
        let kinds: Vec<OpKind> = d.batches[0].iter().filter_map(Op::kind).collect();
        assert_eq!(kinds, vec![OpKind::BackendAdd, OpKind::MapLoad]);
        assert_eq!(d.reasons[0], "backend be_new added from defaults haptic (2 servers)");
        agent_agrees(&old, &new, &d);
        let p = plan(Some(&Baseline::of_render(&old)), &new, API_VERSION, &caps_all());
        assert_eq!((p.mode, p.skew, p.baseline.is_some()), (Some(Mode::Runtime), None, true));
        // An agent on HAProxy before 3.4: a reload against the same baseline, and no skew.
        let before_3_4 =
            Capabilities { ops: caps_all().ops.into_iter().filter(|o| o != "backend.add").collect(), ..caps_all() };
        let p = plan(Some(&Baseline::of_render(&old)), &new, API_VERSION, &before_3_4);
        assert_eq!((p.mode, p.skew, p.baseline.is_some()), (Some(Mode::Reload), None, true));
        assert_eq!(
            p.reasons,
            vec!["backend be_new added from defaults haptic (2 servers) (this HAProxy adds backends only by reload)"]
        );
        assert_eq!(p.causes, BTreeSet::from([ReloadCause::BackendByReload]));
        assert!(plan(Some(&Baseline::of_render(&old)), &new, API_VERSION, &caps_all()).causes.is_empty());
    }

    #[test]
    fn map_acl_and_cert_contents_are_runtime() {
        let old = render(CFG, &base_files());
        for (path, body, kind) in [
            ("maps/hosts.map", "a.example be_app\nb.example be_app\n", OpKind::MapLoad),
            ("acls/blocked.acl", "10.0.0.0/8\n192.168.0.0/16\n", OpKind::AclReplace),
            ("certs/site.pem", "PEM-2\n", OpKind::CertSet),
        ] {
            let new = render(CFG, &with(path, body));
            let d = diff(&Baseline::of_render(&old), &new);
            assert_eq!(d.mode, Some(Mode::Runtime), "{path}: {:?}", d.reasons);
            assert_eq!(d.op_kinds().into_iter().collect::<Vec<_>>(), vec![kind]);
            agent_agrees(&old, &new, &d);
        }
        // The map travels once, as its file; an agent before API 1.1 gets the entries in the op.
        let new = render(CFG, &with("maps/hosts.map", "x y\n"));
        let d = diff(&Baseline::of_render(&old), &new);
        assert_eq!(d.batches[0][0], Op::MapLoad { path: RelPath::new("maps/hosts.map").unwrap() });
        let old_agent = Capabilities {
            runtime_batches: true,
            ops: ["server.set", "server.add", "server.del", "map.replace", "acl.replace", "cert.set"]
                .map(String::from)
                .to_vec(),
        };
        let old_api = haptic_protocol::ApiVersion { major: 1, minor: 0 };
        let p = plan(Some(&Baseline::of_render(&old)), &new, old_api, &old_agent);
        assert_eq!((p.mode, p.skew.as_deref()), (Some(Mode::Runtime), None));
        let entries = vec![("x".into(), "y".into())];
        assert_eq!(p.batches[0][0], Op::MapReplace { path: RelPath::new("maps/hosts.map").unwrap(), entries });
        agent_agrees(&old, &new, &Diff { mode: p.mode, reasons: p.reasons, causes: p.causes, batches: p.batches });
    }

    /// A CA file a bind or a server loads (`ca-file`): its new contents are a runtime
    /// `cafile.set` where every pod's agent runs it, a reload where one does not.
    #[test]
    fn ca_file_contents_are_runtime_where_the_agent_can() {
        let cfg = "global\n  default-path config\nfrontend fe\n  bind 127.0.0.1:8443 ssl crt certs/site.pem ca-file certs/clients.pem verify required\nbackend b\n  server s 10.0.0.1:443 ssl verify required ca-file certs/up.pem\n";
        let old = Bundle::from_texts([
            ("haproxy.cfg", cfg),
            ("certs/site.pem", "PEM\n"),
            ("certs/clients.pem", "CA-1\n"),
            ("certs/up.pem", "CA-1\n"),
        ])
        .unwrap();
        for path in ["certs/clients.pem", "certs/up.pem"] {
            let files: Vec<(&str, &str)> = [
                ("haproxy.cfg", cfg),
                ("certs/site.pem", "PEM\n"),
                ("certs/clients.pem", "CA-1\n"),
                ("certs/up.pem", "CA-1\n"),
            ]
            .into_iter()
            .map(|(p, b)| if p == path { (p, "CA-2\n") } else { (p, b) })
            .collect();
            let new = Bundle::from_texts(files).unwrap();
            let d = diff(&Baseline::of_render(&old), &new);
            assert_eq!(d.mode, Some(Mode::Runtime), "{path}: {:?}", d.reasons);
            assert_eq!(d.batches.concat(), vec![Op::CaFileSet { path: RelPath::new(path).unwrap() }]);
            agent_agrees(&old, &new, &d);
            let before =
                Capabilities { ops: caps_all().ops.into_iter().filter(|o| o != "cafile.set").collect(), ..caps_all() };
            let p = plan(Some(&Baseline::of_render(&old)), &new, API_VERSION, &before);
            assert_eq!(p.mode, Some(Mode::Reload), "{path}: an agent without cafile.set reloads");
        }
    }

    #[test]
    fn files_haproxy_loads_are_never_file_only() {
        // A crt companion and a crt-list entry: the config text never names them, HAProxy loads
        // both at start-up.
        let cfg = "global\n  default-path config\nfrontend fe\n  bind 127.0.0.1:8443 ssl crt certs/site.pem crt-list lists/sni.lst\n";
        let files = |ocsp: &'static str, extra: &'static str| {
            vec![
                ("certs/site.pem", "PEM\n"),
                ("certs/site.pem.ocsp", ocsp),
                ("lists/sni.lst", "certs/extra.pem\n"),
                ("certs/extra.pem", extra),
                ("files/notes.txt", "n\n"),
            ]
        };
        let old = render(cfg, &files("OCSP-1", "X-1"));
        for (what, new) in [
            ("companion", render(cfg, &files("OCSP-2", "X-1"))),
            ("crt-list entry", render(cfg, &files("OCSP-1", "X-2"))),
        ] {
            let d = diff(&Baseline::of_render(&old), &new);
            assert_eq!(d.mode, Some(Mode::Reload), "{what}: {:?}", d.reasons);
        }
        // A file nothing loads stays file_only.
        let mut notes = files("OCSP-1", "X-1");
        notes.retain(|(p, _)| *p != "files/notes.txt");
        notes.push(("files/notes.txt", "m\n"));
        assert_eq!(diff(&Baseline::of_render(&old), &render(cfg, &notes)).mode, Some(Mode::FileOnly));
    }

    #[test]
    fn unloaded_files_are_file_only() {
        let old = render(CFG, &base_files());
        let new = render(CFG, &with("files/notes.txt", "changed\n"));
        let d = diff(&Baseline::of_render(&old), &new);
        assert_eq!(d.mode, Some(Mode::FileOnly), "{:?}", d.reasons);
        assert!(d.batches.is_empty());
        let added = render(CFG, &[base_files(), vec![("files/new.txt", "n")]].concat());
        assert_eq!(diff(&Baseline::of_render(&old), &added).mode, Some(Mode::FileOnly));
        let removed = render(CFG, &with("files/notes.txt", ""));
        assert_eq!(diff(&Baseline::of_render(&old), &removed).mode, Some(Mode::FileOnly));
        let comments = render(&format!("# header\n{CFG}"), &base_files());
        let d = diff(&Baseline::of_render(&old), &comments);
        assert_eq!((d.mode, d.op_count()), (Some(Mode::Runtime), 0));
        agent_agrees(&old, &comments, &d);
        // Unloaded files changing together with runtime changes: one apply, one mode.
        let both = render(
            CFG,
            &[with("files/notes.txt", "x"), vec![]]
                .concat()
                .into_iter()
                .map(|(p, b)| if p == "maps/hosts.map" { (p, "q r\n") } else { (p, b) })
                .collect::<Vec<_>>(),
        );
        assert_eq!(diff(&Baseline::of_render(&old), &both).mode, Some(Mode::Reload));
    }

    #[test]
    fn everything_else_reloads() {
        let old = render(CFG, &base_files());
        let (defaults, listener, server, file) = (
            ReloadCause::Config(ConfigPart::Defaults),
            ReloadCause::Config(ConfigPart::Listener),
            ReloadCause::Config(ConfigPart::Server),
            ReloadCause::File,
        );
        let cases: Vec<(&str, Bundle, ReloadCause)> = vec![
            ("defaults", render(&CFG.replace("timeout client 5s", "timeout client 6s"), &base_files()), defaults),
            ("bind", render(&CFG.replace("127.0.0.1:8080", "127.0.0.1:8081"), &base_files()), listener),
            (
                "new server, cookie",
                render(&format!("{CFG}  server SRV_3 127.0.0.1:9003 cookie c3\n"), &base_files()),
                server,
            ),
            ("errorfile", render(CFG, &with("errors/503.http", "HTTP/1.0 503\r\n\r\nx")), file),
            ("removed map", render(CFG, &with("maps/hosts.map", "")), file),
            ("new cert in crt dir", render(CFG, &[base_files(), vec![("certs/other.pem", "P")]].concat()), file),
            ("cert key", render(CFG, &[base_files(), vec![("certs/site.pem.key", "K")]].concat()), file),
        ];
        for (name, new, cause) in cases {
            let d = diff(&Baseline::of_render(&old), &new);
            assert_eq!(d.mode, Some(Mode::Reload), "{name}");
            assert!(!d.reasons.is_empty() && d.batches.is_empty(), "{name}");
            assert_eq!(d.causes, BTreeSet::from([cause]), "{name}: {:?}", d.reasons);
        }
        // A runtime-eligible change plus a reload-only change reloads, for the reload-only one.
        let mixed =
            render(&CFG.replace("weight 10", "weight 11").replace("5s", "6s"), &with("maps/hosts.map", "z z\n"));
        let d = diff(&Baseline::of_render(&old), &mixed);
        assert_eq!((d.mode, d.causes), (Some(Mode::Reload), BTreeSet::from([defaults])));
        // A file the config does not load, with a runtime change: one apply, one mode.
        let file_and_runtime = render(&CFG.replace("weight 10", "weight 11"), &with("files/notes.txt", "x"));
        let d = diff(&Baseline::of_render(&old), &file_and_runtime);
        assert_eq!((d.mode, d.causes), (Some(Mode::Reload), BTreeSet::from([ReloadCause::FileWithRuntime])));
        // What lands at runtime or as files only has no cause.
        let runtime = render(&CFG.replace("weight 10", "weight 11"), &base_files());
        assert!(diff(&Baseline::of_render(&old), &runtime).causes.is_empty());
        assert!(diff(&Baseline::of_render(&old), &render(CFG, &with("files/notes.txt", "x"))).causes.is_empty());
    }

    #[test]
    fn unknown_baseline_text_reloads_only_if_the_cfg_changed() {
        let old = render(CFG, &base_files());
        let mut base = Baseline::of_render(&old);
        base.cfg_text = None;
        let map_only = render(CFG, &with("maps/hosts.map", "q r\n"));
        assert_eq!(diff(&base, &map_only).mode, Some(Mode::Runtime));
        let cfg = render(&CFG.replace("weight 10", "weight 11"), &base_files());
        let d = diff(&base, &cfg);
        assert_eq!((d.mode, d.causes), (Some(Mode::Reload), BTreeSet::from([ReloadCause::CompleteState])));
    }

    #[test]
    fn skew_and_missing_baseline_get_complete_state() {
        let old = render(CFG, &base_files());
        let new = render(CFG, &with("maps/hosts.map", "q r\n"));
        let b = Baseline::of_render(&old);
        let p = plan(None, &new, API_VERSION, &caps_all());
        assert_eq!((p.mode, p.baseline), (Some(Mode::Reload), None));
        assert_eq!(p.causes, BTreeSet::from([ReloadCause::CompleteState]));
        let old_agent = Capabilities { runtime_batches: true, ops: vec!["server.set".into()] };
        let p = plan(Some(&b), &new, API_VERSION, &old_agent);
        assert_eq!((p.mode, p.baseline.is_none(), p.skew.is_some()), (Some(Mode::Reload), true, true));
        let p = plan(Some(&b), &new, ApiVersion { major: 2, minor: 0 }, &caps_all());
        assert!(p.skew.is_some());
        let p = plan(Some(&b), &new, ApiVersion { major: 1, minor: 7 }, &caps_all());
        assert_eq!((p.mode, p.skew), (Some(Mode::Runtime), None));
        let no_batches = Capabilities { runtime_batches: false, ..caps_all() };
        assert!(plan(Some(&b), &new, API_VERSION, &no_batches).skew.is_some());
        // File-only changes need no op kind at all.
        let fo = render(CFG, &with("files/notes.txt", "x"));
        assert_eq!(plan(Some(&b), &fo, API_VERSION, &no_batches).mode, Some(Mode::FileOnly));
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    fn ip() -> impl Strategy<Value = String> {
        (1u8..=254, 0u8..=255).prop_map(|(a, b)| format!("10.0.{a}.{b}"))
    }

    fn server() -> impl Strategy<Value = (String, u16, Option<u32>, bool)> {
        (ip(), 1u16..=65535, proptest::option::of(0u32..=256), any::<bool>())
    }

    fn cfg_text(servers: &[(String, u16, Option<u32>, bool)], timeout: u32, comment: bool) -> String {
        let mut s = format!(
            "global\n  default-path config\ndefaults\n  mode http\n  timeout client {timeout}s\nfrontend fe\n  bind 127.0.0.1:8080\n  use_backend %[req.hdr(host),map(maps/h.map,be)]\nbackend be\n"
        );
        for (i, (ip, port, w, dis)) in servers.iter().enumerate() {
            let w = w.map(|w| format!(" weight {w}")).unwrap_or_default();
            let d = if *dis { " disabled" } else { "" };
            let c = if comment { "   # slot" } else { "" };
            s.push_str(&format!("  server s{i} {ip}:{port}{w}{d} check{c}\n"));
        }
        s
    }

    fn render(cfg: &str, map: &str, other: &str) -> Bundle {
        Bundle::from_texts([("haproxy.cfg", cfg), ("maps/h.map", map), ("files/x.txt", other)]).unwrap()
    }

    proptest! {
        #[test]
        fn a_render_against_itself_is_nothing(
            servers in proptest::collection::vec(server(), 0..6),
            t in 1u32..100,
            map in "[a-z ]{0,40}",
            other in ".{0,20}",
        ) {
            let r = render(&cfg_text(&servers, t, false), &map, &other);
            let d = diff(&Baseline::of_render(&r), &r);
            prop_assert_eq!(d.mode, None);
            prop_assert!(d.batches.is_empty());
            let caps = Capabilities { runtime_batches: true, ops: vec!["server.set".into(), "map.replace".into()] };
            let p = plan(Some(&Baseline::of_render(&r)), &r, API_VERSION, &caps);
            prop_assert_eq!(p.mode, None);
        }

        #[test]
        fn server_slot_changes_are_runtime_and_the_agent_agrees(
            old in proptest::collection::vec(server(), 1..6),
            new in proptest::collection::vec(server(), 1..6),
            map_old in "[a-z]{1,5} [a-z]{1,5}\n",
            map_new in "[a-z]{1,5} [a-z]{1,5}\n",
            comment in any::<bool>(),
        ) {
            let n = old.len().min(new.len());
            let (old, new) = (&old[..n], &new[..n]);
            let a = render(&cfg_text(old, 5, false), &map_old, "x");
            let b = render(&cfg_text(new, 5, comment), &map_new, "x");
            let d = diff(&Baseline::of_render(&a), &b);
            if a.plan_id() == b.plan_id() {
                prop_assert_eq!(d.mode, None);
            } else {
                prop_assert!(d.mode != Some(Mode::Reload), "{:?}", d.reasons);
                let ops: Vec<Op> = d.batches.iter().flatten().cloned().collect();
                let p = RelPath::new("maps/h.map").unwrap();
                let changed: Vec<haptic_haproxy::claim::ChangedFile<'_>> = if map_old != map_new {
                    vec![haptic_haproxy::claim::ChangedFile { path: &p, new: Some(map_new.as_bytes()) }]
                } else {
                    vec![]
                };
                let res = haptic_haproxy::claim::verify_runtime_claim(a.cfg_text(), b.cfg_text(), &changed, &ops);
                prop_assert!(d.mode != Some(Mode::Runtime) || res.is_ok(), "{:?}", res);
            }
        }
    }
}
