//! The render gate: the controller's own `haproxy -c` over each render, and the latch.
//!
//! Owns running the check in a temp dir (off the deploy path), passing without a process a
//! render that differs from a passed one only at runtime, and the two-state latch:
//! OPTIMISTIC dispatches renders at once, PESSIMISTIC holds them until one passes. A refusal
//! pins the fleet on the last good render until a render passes. The latch is pure; the check
//! is the only I/O here. It must never let a refused render replace the last good one.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use haptic_haproxy::paths::PathViolation;
use haptic_protocol::{Digest, PlanId, RelPath};
use serde::{Deserialize, Serialize};

use crate::bundle::Bundle;
use crate::error::Error;

/// The latch's resting mode (`--gate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GateMode {
    /// Renders dispatch at once; a refusal reverts the pods that took it and pins the fleet.
    Optimistic,
    /// Every render waits for the gate to pass it.
    Pessimistic,
}

/// The gate's verdict on one render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `haproxy -c` accepted it.
    Pass,
    /// Refused, and why.
    Refused(Refused),
}

/// Why the gate refused a render; shown as the gate's words (its `Display`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The global section has no `default-path config` ([`precheck`]).
    NoDefaultPath,
    /// The path rules the agents enforce refuse it ([`path_refusal`]).
    PathRules(Vec<PathViolation>),
    /// `haproxy -c` refused it: HAProxy's words.
    Haproxy(String),
    /// The check could not run: why.
    CouldNotRun(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NoDefaultPath => f.write_str(
                "haproxy.cfg: the global section has no `default-path config` line; without it HAProxy \
                 looks up relative paths (maps/, certs/, errors/ ...) in its working directory instead of \
                 next to haproxy.cfg, so the render would not load the same files in the pod",
            ),
            Refused::PathRules(why) => {
                let lines: Vec<String> = why.iter().map(|w| format!("[path rules] {w}")).collect();
                f.write_str(&lines.join("\n"))
            }
            Refused::Haproxy(words) => f.write_str(words),
            Refused::CouldNotRun(why) => write!(f, "the gate could not run: {why}"),
        }
    }
}

/// The latch: pure state, moved by verdicts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Latch {
    /// The resting mode.
    pub mode: GateMode,
    /// Whether the last verdict was a refusal: the fleet stays on the last good render.
    pub pinned: bool,
    /// The last render that passed.
    pub last_good: Option<PlanId>,
    /// The last refused render and HAProxy's words.
    pub last_refused: Option<Refusal>,
}

/// A refused render.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// The render.
    pub plan_id: PlanId,
    /// HAProxy's words.
    pub output: String,
}

impl Latch {
    /// A fresh latch in `mode`.
    pub fn new(mode: GateMode) -> Self {
        Latch { mode, pinned: false, last_good: None, last_refused: None }
    }

    /// Whether a render may be dispatched before its verdict.
    pub fn dispatch_before_verdict(&self) -> bool {
        self.mode == GateMode::Optimistic && !self.pinned
    }

    /// Moves the latch on a verdict.
    pub fn on_verdict(&mut self, plan: PlanId, v: &Verdict) {
        match v {
            Verdict::Pass => {
                self.pinned = false;
                self.last_good = Some(plan);
            }
            Verdict::Refused(why) => {
                self.pinned = true;
                self.last_refused = Some(Refusal { plan_id: plan, output: why.to_string() });
            }
        }
    }
}

/// What the gate refuses before running HAProxy: a `haproxy.cfg` without `default-path config`
/// in its `global` section. Without it HAProxy resolves the relative paths of aux files
/// (`maps/…`, `certs/…`) against its working directory, so the same render would load other
/// files (or none) in the gate, in the agent's check and in the pod. The agent's path rules
/// (`haptic_haproxy::paths::check_paths`) refuse such a config too.
pub fn precheck(render: &Bundle) -> Option<Refused> {
    let has = haptic_haproxy::paths::has_default_path_config(render.cfg_text());
    (!has).then_some(Refused::NoDefaultPath)
}

/// Whether `new` passes `haproxy -c` exactly when `passed` (a render that passed it) does,
/// without running it: the same files besides `haproxy.cfg`, and configs that differ only in
/// what the runtime claim allows (server address, port, weight, enabled, with well-formed values:
/// the rule that lets the agent skip its own `haproxy -c` for a runtime apply), with no backend
/// section added (a new section always gets its `haproxy -c` here). Pure.
pub fn runtime_equivalent(passed: &Bundle, new: &Bundle) -> bool {
    let others = |r: &Bundle| -> Vec<(RelPath, Digest)> {
        r.manifest().iter().filter(|e| !e.path.is_haproxy_cfg()).map(|e| (e.path.clone(), e.digest)).collect()
    };
    if others(passed) != others(new) {
        return false;
    }
    // A backend added at runtime is a new section: `haproxy -c` checks it.
    let d = crate::bundle::diff_cfg_cached(passed.cfg_text(), passed.cfg_index(), new.cfg_text(), new.cfg_index());
    d.runtime_eligible() && d.backends_added.is_empty()
}

/// The variables the operator named (`--gate-env`) with their values from `lookup` (the
/// controller's environment), and the names `lookup` does not know. The gate's check gets
/// only these: the controller can read every Secret, and its own environment never reaches a
/// process that parses a render unless the operator names it. Pure.
pub fn named_env(
    names: &[String],
    lookup: impl Fn(&str) -> Option<OsString>,
) -> (Vec<(OsString, OsString)>, Vec<String>) {
    let (mut found, mut missing) = (Vec::new(), Vec::new());
    for name in names.iter().filter(|n| !n.is_empty()) {
        match lookup(name) {
            Some(v) => found.push((OsString::from(name), v)),
            None => missing.push(name.clone()),
        }
    }
    (found, missing)
}

/// How many verdicts of `haproxy -c` the gate keeps, by render content.
pub const VERDICTS_KEPT: usize = 64;

/// Runs `haproxy -c` over renders, contained ([`haptic_sandbox`]). Clones share the last render
/// that passed, so a render that differs from it only at runtime ([`runtime_equivalent`]) passes
/// without another process, and the verdicts of the last [`VERDICTS_KEPT`] renders checked, by
/// content (the plan id, a digest of every file; a checker has one binary), so a render seen
/// before is never checked twice.
#[derive(Debug, Clone)]
pub struct Checker {
    bin: PathBuf,
    timeout: Duration,
    env: Vec<(OsString, OsString)>,
    passed: Arc<Mutex<Option<Arc<Bundle>>>>,
    verdicts: Arc<Mutex<haptic_sandbox::Lru<Digest, Verdict>>>,
}

impl Checker {
    /// A checker using `bin` (looked up on `PATH` when it has no `/`).
    pub fn new(bin: impl Into<PathBuf>, timeout: Duration) -> Self {
        Checker {
            bin: bin.into(),
            timeout,
            env: Vec::new(),
            passed: Arc::default(),
            verdicts: Arc::new(Mutex::new(haptic_sandbox::Lru::new(VERDICTS_KEPT))),
        }
    }

    /// The checker whose `haproxy -c` gets `env` besides the sandbox's fixed `PATH` (the
    /// variables a config names, `bind "${ADDR}"`; see [`named_env`]). Without it the check's
    /// environment is empty.
    pub fn with_env(mut self, env: Vec<(OsString, OsString)>) -> Self {
        self.env = env;
        self
    }

    /// The binary.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Checks one render. `Err` means the check could not run at all (or did not finish in
    /// time); such an outcome is not kept.
    pub async fn check(&self, render: &Bundle) -> Result<Verdict, Error> {
        // The path rules come first: `haproxy -c` would read whatever the config names.
        if let Some(why) = precheck(render).or_else(|| path_refusal(render).map(Refused::PathRules)) {
            return Ok(Verdict::Refused(why));
        }
        let key = render.plan_id().0;
        if let Some(v) = self.verdicts.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(v);
        }
        let v = self.run(render).await?;
        self.verdicts.lock().unwrap_or_else(|e| e.into_inner()).insert(key, v.clone());
        Ok(v)
    }

    /// Writes the render to a temp dir and runs the contained check over it.
    async fn run(&self, render: &Bundle) -> Result<Verdict, Error> {
        let gate = |e: &dyn std::fmt::Display| Error::Gate(e.to_string());
        let tmp = tempfile::Builder::new().prefix("haptic-gate-").tempdir().map_err(|e| gate(&e))?;
        let root = tmp.path().to_path_buf();
        let (r, root2) = (render.clone(), root.clone());
        tokio::task::spawn_blocking(move || r.write_to(&root2)).await.map_err(|e| gate(&e))??;
        let mut run = haptic_sandbox::Run::check(&self.bin, &root, "haproxy.cfg", self.timeout);
        // What the path rules let a config read outside the tree (CA bundles).
        run.extra_read = haptic_haproxy::paths::PathPolicy::DEFAULT_ALLOWED.iter().map(PathBuf::from).collect();
        run.env = self.env.clone();
        let out = tokio::task::spawn_blocking(move || haptic_sandbox::run(run))
            .await
            .map_err(|e| gate(&e))?
            .map_err(|e| gate(&e))?;
        verdict_of(&out, &root)
    }
    /// Checks one render; a check that cannot run counts as a refusal (the gate never passes
    /// what it did not see pass, itself or through [`runtime_equivalent`]).
    pub async fn verdict(&self, render: &Arc<Bundle>) -> Verdict {
        let passed = self.passed.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(p) = passed {
            let (p, r) = (p.clone(), render.clone());
            let same = tokio::task::spawn_blocking(move || runtime_equivalent(&p, &r)).await.unwrap_or(false);
            if same {
                tracing::debug!(plan = %render.plan_id().short(), "gate: differs from a passed render only at runtime");
                self.remember(render);
                return Verdict::Pass;
            }
        }
        let v = match self.check(render).await {
            Ok(v) => v,
            Err(e) => Verdict::Refused(Refused::CouldNotRun(e.to_string())),
        };
        if v == Verdict::Pass {
            self.remember(render);
        }
        v
    }

    fn remember(&self, render: &Arc<Bundle>) {
        *self.passed.lock().unwrap_or_else(|e| e.into_inner()) = Some(render.clone());
    }
}

/// The gate's verdict on a contained run over the render in `root`, as
/// [`haptic_haproxy::check_output::summarize`] reads it: a pass on exit code 0, a refusal with
/// HAProxy's alerts and warnings, `Err` when it did not finish in time.
fn verdict_of(out: &haptic_sandbox::Outcome, root: &Path) -> Result<Verdict, Error> {
    use haptic_haproxy::check_output::{summarize, Checked, Summary};
    let summary = summarize(Checked::Config, ending(&out.end), &out.output, Some(&root.to_string_lossy()));
    let timed_out = matches!(summary, Summary::TimedOut(_));
    match summary.into_result() {
        Ok(_) => Ok(Verdict::Pass),
        Err(why) if timed_out => Err(Error::Gate(why)),
        Err(why) => Ok(Verdict::Refused(Refused::Haproxy(why))),
    }
}

/// How a contained run ended, in `haptic_haproxy::check_output`'s terms.
pub(crate) fn ending(end: &haptic_sandbox::End) -> haptic_haproxy::check_output::Ending {
    use haptic_haproxy::check_output::Ending;
    match end {
        haptic_sandbox::End::Exited(s) => Ending::Exited(*s),
        haptic_sandbox::End::TimedOut(d) => Ending::TimedOut(*d),
        haptic_sandbox::End::TooMuchOutput(n) => Ending::TooMuchOutput(*n),
    }
}

/// The path rules the agents enforce (`haptic_haproxy::paths::check_paths`), over a render: every file the config makes
/// HAProxy read resolves inside the tree or under the default allowed prefixes, and `global` has
/// `default-path config`. Sockets are left to the agents, which know their socket directory.
/// `Some(violations)` when the render breaks them. Pure.
pub fn path_refusal(render: &Bundle) -> Option<Vec<PathViolation>> {
    use haptic_haproxy::paths::{check_paths, file_refs, PathPolicy, RefKind};
    let read = |p: &str| -> Option<String> {
        let rel = haptic_protocol::RelPath::new(p).ok()?;
        render.bytes(&rel).map(|b| String::from_utf8_lossy(b).into_owned())
    };
    let refs: Vec<_> = file_refs(render.cfg_text(), &read).into_iter().filter(|r| r.kind != RefKind::Socket).collect();
    let policy =
        PathPolicy { allowed: PathPolicy::DEFAULT_ALLOWED.iter().map(|s| s.to_string()).collect(), socket_dir: None };
    check_paths(render.cfg_text(), &refs, &policy).err()
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_protocol::Digest;

    #[test]
    fn precheck_wants_default_path_config_in_global() {
        let r = |cfg: &str| Bundle::from_texts([("haproxy.cfg", cfg)]).unwrap();
        assert_eq!(precheck(&r("global\n  default-path config\ndefaults\n  mode http\n")), None);
        assert_eq!(precheck(&r("global\n    default-path   config # relative paths\n")), None);
        for bad in [
            "global\n  maxconn 10\n",
            "global\n  default-path current\n",
            "global\n  # default-path config\n",
            "defaults\n  default-path config\n",
        ] {
            assert_eq!(precheck(&r(bad)), Some(Refused::NoDefaultPath), "{bad:?}");
        }
    }

    #[test]
    fn paths_outside_the_tree_are_refused_by_the_gate() {
        let ok = "global\n    default-path config\nfrontend f\n    bind :80\n    http-request set-var(txn.x) req.hdr(host),map(maps/a.map,none)\n";
        assert_eq!(path_refusal(&Bundle::from_texts([("haproxy.cfg", ok), ("maps/a.map", "k v\n")]).unwrap()), None);
        let bad = ok.replace("maps/a.map", "/etc/passwd");
        let why = path_refusal(&Bundle::from_texts([("haproxy.cfg", bad.as_str())]).unwrap()).unwrap();
        let r = why.iter().find_map(PathViolation::reference).unwrap();
        assert_eq!((r.line, r.directive.as_str(), r.path.as_str()), (5, "map()", "/etc/passwd"), "{why:?}");
        let nodp = ok.replace("    default-path config\n", "");
        let why = path_refusal(&Bundle::from_texts([("haproxy.cfg", nodp.as_str()), ("maps/a.map", "k v\n")]).unwrap());
        assert_eq!(why, Some(vec![PathViolation::NoDefaultPath]));
    }

    #[test]
    fn the_gate_gets_only_the_variables_named() {
        let names = vec!["FRONT_PORT".to_string(), "NOT_SET".to_string(), String::new()];
        let lookup = |n: &str| (n == "FRONT_PORT" || n == "OTHER").then(|| OsString::from("8443"));
        let (found, missing) = named_env(&names, lookup);
        assert_eq!(found, vec![(OsString::from("FRONT_PORT"), OsString::from("8443"))]);
        assert_eq!(missing, vec!["NOT_SET".to_string()]);
    }

    /// On every version: a render binding its frontend from a variable is refused by a checker
    /// without it (the controller's own environment never reaches the check) and passes with it.
    #[tokio::test]
    async fn the_gate_check_sees_only_the_variables_it_is_given() {
        let cfg = "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 1s\n    \
                   timeout client 1s\n    timeout server 1s\nfrontend f\n    bind \"127.0.0.1:${FRONT_PORT}\"\n";
        let render = Bundle::from_texts([("haproxy.cfg", cfg)]).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        for bin in haptic_e2e::haproxy_bins() {
            let bare = Checker::new(&bin.path, Duration::from_secs(30));
            assert!(matches!(bare.check(&render).await.unwrap(), Verdict::Refused(_)), "{}", bin.label());
            let env = vec![(OsString::from("FRONT_PORT"), OsString::from(port.to_string()))];
            let with = Checker::new(&bin.path, Duration::from_secs(30)).with_env(env);
            assert_eq!(with.check(&render).await.unwrap(), Verdict::Pass, "{}", bin.label());
        }
    }

    /// With a real `haproxy -c` (which would load `/etc/passwd` as a map and pass): refused.
    #[tokio::test]
    async fn the_gate_refuses_before_haproxy_reads_outside_the_tree() {
        let Some(bin) = haptic_e2e::haproxy_bins().into_iter().next() else { return };
        let cfg = "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 1s\n    timeout client 1s\n    timeout server 1s\nfrontend f\n    bind 127.0.0.1:0\n    http-request set-var(txn.x) req.hdr(host),map(/etc/passwd,none)\n    http-request return status 200\n";
        let c = Checker::new(&bin.path, Duration::from_secs(30));
        match c.check(&Bundle::from_texts([("haproxy.cfg", cfg)]).unwrap()).await.unwrap() {
            Verdict::Refused(Refused::PathRules(why)) => {
                let r = why.iter().find_map(PathViolation::reference).unwrap();
                assert_eq!((r.line, r.path.as_str()), (10, "/etc/passwd"), "{why:?}");
            }
            Verdict::Refused(other) => panic!("refused, but not by the path rules: {other}"),
            Verdict::Pass => panic!("a map outside the tree passed the gate"),
        }
    }

    /// A config that loads a file outside the render, named so the path rules may not see it
    /// (quoted), is refused by the contained check without the file's content in the verdict,
    /// on every version; the benign twin (the file inside the render) passes. A verdict is kept
    /// by content: the same render is not checked again.
    #[tokio::test]
    async fn the_gate_check_reads_nothing_outside_the_render() {
        let base = tempfile::tempdir().unwrap();
        let secret = base.path().join("token");
        std::fs::write(&secret, "s3cr3t-token\n").unwrap();
        let quoted = format!("'/'{}", secret.display().to_string().trim_start_matches('/'));
        let cfg = |file: &str| {
            format!(
                "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 1s\n    \
                 timeout client 1s\n    timeout server 1s\nfrontend f\n    bind 127.0.0.1:8080\n    \
                 acl x src -f {file}\n    http-request deny if x\n"
            )
        };
        for bin in haptic_e2e::haproxy_bins() {
            let c = Checker::new(&bin.path, Duration::from_secs(30));
            let bad = Bundle::from_texts([("haproxy.cfg", cfg(&quoted).as_str())]).unwrap();
            match c.check(&bad).await.unwrap() {
                Verdict::Refused(why) => assert!(!why.to_string().contains("s3cr3t"), "{}: {why}", bin.label()),
                Verdict::Pass => panic!("{}: a file outside the render was loaded", bin.label()),
            }
            let good =
                Bundle::from_texts([("haproxy.cfg", cfg("acl/ips.lst").as_str()), ("acl/ips.lst", "10.0.0.1\n")])
                    .unwrap();
            assert_eq!(c.check(&good).await.unwrap(), Verdict::Pass, "{}", bin.label());
            let cached = Checker { bin: "/nonexistent/haproxy".into(), ..c.clone() };
            assert_eq!(cached.check(&good).await.unwrap(), Verdict::Pass, "{}: kept by content", bin.label());
        }
    }

    #[test]
    fn runtime_equivalence() {
        let cfg = |addr: &str, extra: &str| {
            format!("global\n    default-path config\nbackend b\n    server s1 {addr} weight 10\n{extra}")
        };
        let r = |c: String, map: &str| Bundle::from_texts([("haproxy.cfg", c.as_str()), ("maps/a.map", map)]).unwrap();
        let a = r(cfg("10.0.0.1:80", ""), "k v\n");
        assert!(runtime_equivalent(&a, &a));
        assert!(runtime_equivalent(&a, &r(cfg("10.0.0.2:81", ""), "k v\n")));
        assert!(!runtime_equivalent(&a, &r(cfg("10.0.0.1:80", ""), "k w\n")), "a changed file needs the check");
        assert!(!runtime_equivalent(&a, &r(cfg("10.0.0.1:80", "    timeout server 1s\n"), "k v\n")));
        assert!(!runtime_equivalent(&a, &r(cfg("backend.example:80", ""), "k v\n")), "a hostname is not runtime");
    }

    #[test]
    fn latch_moves() {
        let (a, b) = (PlanId(Digest::of(b"a")), PlanId(Digest::of(b"b")));
        let mut l = Latch::new(GateMode::Optimistic);
        assert!(l.dispatch_before_verdict());
        l.on_verdict(a, &Verdict::Pass);
        assert_eq!(l.last_good, Some(a));
        l.on_verdict(b, &Verdict::Refused(Refused::Haproxy("bad".into())));
        assert!(l.pinned && !l.dispatch_before_verdict());
        assert_eq!(l.last_good, Some(a), "a refusal never replaces the last good render");
        l.on_verdict(b, &Verdict::Pass);
        assert!(!l.pinned && l.dispatch_before_verdict());
        let mut p = Latch::new(GateMode::Pessimistic);
        p.on_verdict(a, &Verdict::Pass);
        assert!(!p.dispatch_before_verdict());
    }
}
