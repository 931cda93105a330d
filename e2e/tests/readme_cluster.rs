//! The README's commands, as written, on the real cluster of `scripts/cluster.sh`
//! (`HAPTIC_E2E_CLUSTER=real`, `KUBECONFIG`, `HAPTIC_E2E_VALUES`, `HAPTIC_HELM`): every fenced
//! block of `README.md` is either run here or named in [`ELSEWHERE`] with where it runs, so a new
//! block fails this test until it is one or the other. A YAML block is saved under the name the
//! prose before it gives; a command with output shown under it is repeated (as a reader would)
//! until it succeeds and its output is the one shown, under a deadline. Two placeholders are
//! filled in: the registry and tag of the images `scripts/cluster.sh load` loaded.
//! Without `HAPTIC_E2E_CLUSTER=real` only the block inventory is checked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use haptic_e2e::readme::{self, Block, Step};
use haptic_e2e::workspace_root;

/// Blocks `.ci/run` runs, by their first command, with the text of the `.ci/run` line that runs
/// each (kind.sh up checks both answers it prints; the tour's `--once` exits with its verdict).
const ELSEWHERE: &[(&str, &str)] = &[
    ("scripts/kind.sh up", "scripts/kind.sh up --name haptic-ci"),
    ("scripts/demo.sh", "HAPTIC_DEMO_PROFILE=debug scripts/demo.sh --once"),
    ("scripts/test.sh", "scripts/test.sh"),
];

/// How long a shown output may take to appear (pods starting, statuses written).
const SHOWN_WITHIN: Duration = Duration::from_secs(240);

/// What the README shows as a `$ ` or plain command, and what this test does with it.
enum Plan {
    Run(Vec<Step>),
    Elsewhere(&'static str),
    File(String),
}

fn plan(b: &Block) -> Plan {
    if b.lang == "yaml" {
        return Plan::File(
            readme::yaml_name(b).unwrap_or_else(|| panic!("a YAML block without a `NAME.yaml` before it:\n{}", b.body)),
        );
    }
    let steps = readme::steps(b);
    let first = steps.first().map(|s| s.command.as_str()).unwrap_or_default();
    match ELSEWHERE.iter().find(|(cmd, _)| first == *cmd) {
        Some((_, where_)) => Plan::Elsewhere(where_),
        None => Plan::Run(steps),
    }
}

fn readme_blocks() -> Vec<Block> {
    let text = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    readme::blocks(&text)
}

#[test]
fn every_readme_block_is_run_here_or_named_with_where_it_runs() {
    let blocks = readme_blocks();
    assert!(!blocks.is_empty());
    let ci = std::fs::read_to_string(workspace_root().join(".ci/run")).unwrap();
    for (_, line) in ELSEWHERE {
        assert!(
            ci.lines().any(|l| l.contains(line) && !l.trim_start().starts_with('#')),
            ".ci/run does not run `{line}`"
        );
    }
    let mut files = BTreeSet::new();
    let mut applied = BTreeSet::new();
    for b in &blocks {
        assert!(["console", "sh", "yaml"].contains(&b.lang.as_str()), "a {:?} block nobody runs:\n{}", b.lang, b.body);
        match plan(b) {
            Plan::File(name) => assert!(files.insert(name.clone()), "two YAML blocks named {name}"),
            Plan::Elsewhere(_) => {}
            Plan::Run(steps) => {
                assert!(!steps.is_empty(), "a block with no command:\n{}", b.body);
                applied.extend(steps.iter().flat_map(|s| yaml_args(&s.command)));
            }
        }
    }
    assert_eq!(files, applied, "every YAML block is applied by a command, and every applied file is a block");
}

fn yaml_args(command: &str) -> Vec<String> {
    command.split_whitespace().filter(|w| w.ends_with(".yaml") || w.ends_with(".yml")).map(str::to_string).collect()
}

/// Everything the README's commands started or installed, undone on drop (also on panic).
struct Cleanup {
    background: Vec<Child>,
    releases: Vec<(String, String)>,
    files: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &mut self.background {
            let _ = c.kill();
            let _ = c.wait();
        }
        for f in self.files.iter().rev() {
            let _ = shell(&format!("kubectl delete --ignore-not-found --wait=true --timeout=120s -f {}", f.display()));
        }
        for (release, ns) in self.releases.iter().rev() {
            let _ = shell(&format!("helm uninstall {release} --namespace {ns} --wait --timeout 3m"));
            let _ = shell(&format!("kubectl delete namespace {ns} --ignore-not-found --timeout=120s"));
        }
    }
}

/// The release and namespace a `helm install` or `scripts/cluster.sh install` installs.
fn release_of(command: &str) -> Option<(String, String)> {
    let w: Vec<&str> = command.split_whitespace().collect();
    let after = |flag: &str| w.iter().position(|x| *x == flag).and_then(|i| w.get(i + 1)).map(|s| s.to_string());
    match w.as_slice() {
        ["helm", "install", release, ..] => {
            Some((release.to_string(), after("--namespace").or_else(|| after("-n")).unwrap_or("default".into())))
        }
        ["scripts/cluster.sh", "install", ..] => {
            let r = after("--release").unwrap_or("haptic".into());
            Some((r.clone(), r))
        }
        _ => None,
    }
}

fn bash(command: &str) -> Command {
    static PATH: LazyLock<String> = LazyLock::new(path_with_tools);
    let mut c = Command::new("bash");
    c.args(["-c", command]).current_dir(workspace_root()).env("PATH", &*PATH);
    c
}

fn shell(command: &str) -> Output {
    bash(command).output().unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The placeholders the README writes for a user's own registry and release.
fn placeholders() -> Vec<(String, String)> {
    let values = std::env::var("HAPTIC_E2E_VALUES").expect("HAPTIC_E2E_VALUES (scripts/cluster.sh load writes it)");
    let values = std::fs::read_to_string(values).unwrap();
    let tag = values
        .lines()
        .find_map(|l| l.split("tag: \"").nth(1))
        .and_then(|t| t.split('"').next())
        .expect("a tag in the values");
    vec![("REGISTRY/".into(), "localhost/".into()), ("tag=0.1.0".into(), format!("tag={tag}"))]
}

/// The README's tools on PATH: kubectl of `scripts/install-k8s.sh --cluster`, helm of `HAPTIC_HELM`.
fn path_with_tools() -> String {
    let k8s = Command::new(workspace_root().join("scripts/install-k8s.sh")).arg("--cluster").output().unwrap();
    let apiserver = PathBuf::from(text(&k8s).lines().next().expect("install-k8s.sh prints its binaries"));
    let helm = PathBuf::from(std::env::var("HAPTIC_HELM").expect("HAPTIC_HELM"));
    let dirs = [apiserver.parent().unwrap(), helm.parent().unwrap()];
    format!("{}:{}:{}", dirs[0].display(), dirs[1].display(), std::env::var("PATH").unwrap_or_default())
}

/// Fields drop in this order: the cleanup first, while `dir` still holds the YAML files it
/// deletes the objects of.
struct Run {
    cleanup: Cleanup,
    dir: tempfile::TempDir,
    placeholders: Vec<(String, String)>,
    seen: BTreeMap<String, String>,
}

impl Run {
    fn command(&self, step: &Step) -> String {
        let mut c = readme::substitute(&step.command, &self.seen);
        for (from, to) in &self.placeholders {
            c = c.replace(from.as_str(), to);
        }
        for f in yaml_args(&c) {
            c = c.replace(&f, &self.dir.path().join(&f).display().to_string());
        }
        c
    }

    fn step(&mut self, step: &Step) {
        let command = self.command(step);
        println!("$ {command}");
        if let Some(r) = release_of(&command) {
            self.cleanup.releases.push(r);
        }
        self.cleanup.files.extend(yaml_args(&command).into_iter().map(PathBuf::from));
        if step.background {
            let child = bash(&format!("exec {command}")).stdout(Stdio::null()).spawn().unwrap();
            self.cleanup.background.push(child);
            return;
        }
        if step.shown.is_empty() {
            let o = shell(&command);
            assert!(o.status.success(), "`{command}` failed: {}\n{}", text(&o), String::from_utf8_lossy(&o.stderr));
            return;
        }
        let deadline = Instant::now() + SHOWN_WITHIN;
        loop {
            let o = shell(&command);
            let verdict = readme::matches(&step.shown, &text(&o));
            match verdict {
                Ok(seen) if o.status.success() => {
                    println!("{}", text(&o).trim_end());
                    self.seen.extend(seen);
                    return;
                }
                _ if Instant::now() > deadline => panic!(
                    "`{command}` did not show what the README shows within {SHOWN_WITHIN:?} ({verdict:?}):\n{}{}",
                    text(&o),
                    String::from_utf8_lossy(&o.stderr)
                ),
                _ => std::thread::sleep(Duration::from_secs(1)),
            }
        }
    }
}

/// After `kubectl scale deployment web --replicas 12` (12 endpoints over 8 slots), the block's
/// last `curl` reaches more than the first 2 pods: the new endpoints serve.
fn new_endpoints_serve(run: &Run, curl: &Step) {
    let command = run.command(curl);
    let deadline = Instant::now() + SHOWN_WITHIN;
    let mut answers = BTreeSet::new();
    for _ in 0..2000 {
        let o = shell(&format!("{command} --max-time 5"));
        if o.status.success() {
            answers.insert(text(&o).trim().to_string());
        }
        if answers.len() > 2 {
            println!("    after the scale-out: answers from {} pods", answers.len());
            return;
        }
        assert!(Instant::now() < deadline, "after the scale-out only {answers:?} answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("after the scale-out only {answers:?} answered in 2,000 requests");
}

#[test]
fn every_readme_command_on_a_real_cluster() {
    if std::env::var("HAPTIC_E2E_CLUSTER").as_deref() != Ok("real") {
        println!("HAPTIC_E2E_CLUSTER is not real: the README's commands need the real cluster");
        return;
    }
    let mut run = Run {
        cleanup: Cleanup { background: Vec::new(), releases: Vec::new(), files: Vec::new() },
        dir: tempfile::tempdir().unwrap(),
        placeholders: placeholders(),
        seen: BTreeMap::new(),
    };
    for b in readme_blocks() {
        match plan(&b) {
            Plan::File(name) => std::fs::write(run.dir.path().join(name), &b.body).unwrap(),
            Plan::Elsewhere(line) => println!("(.ci/run runs `{line}`)"),
            Plan::Run(steps) => run_block(&mut run, &steps),
        }
    }
}

fn run_block(run: &mut Run, steps: &[Step]) {
    for (i, step) in steps.iter().enumerate() {
        run.step(step);
        if step.command.starts_with("kubectl scale deployment") {
            let curl =
                steps[..i].iter().rev().find(|s| s.command.starts_with("curl ")).expect("a curl before the scale");
            new_endpoints_serve(run, curl);
        }
    }
}
