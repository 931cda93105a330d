//! The external tools tests check the chart, the metrics and the CI workflows with: the real
//! `helm`, Prometheus's `promtool` and `actionlint`, found at the pinned versions the install
//! scripts put under `target/` (or at `HAPTIC_HELM` / `HAPTIC_PROMTOOL` / `HAPTIC_ACTIONLINT`).
//!
//! Owns running them and reading their verdicts. It must never soften a verdict: the one report
//! it sets aside is named and explained where it is.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::bins::workspace_root;

/// The helm version `scripts/install-helm.sh` installs.
pub const HELM_VERSION: &str = "v3.22.0";
/// The promtool version `scripts/install-promtool.sh` builds.
pub const PROMTOOL_VERSION: &str = "v0.316.0";
/// The actionlint version `scripts/install-actionlint.sh` builds.
pub const ACTIONLINT_VERSION: &str = "v1.7.12";

/// The helm binary: `HAPTIC_HELM`, else what `scripts/install-helm.sh` installs. Panics when missing.
pub fn helm_bin() -> PathBuf {
    let path = std::env::var_os("HAPTIC_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(format!("target/helm/{HELM_VERSION}/helm")));
    assert!(path.is_file(), "helm is missing at {}: run scripts/install-helm.sh (or set HAPTIC_HELM)", path.display());
    path
}

/// The promtool binary: `HAPTIC_PROMTOOL`, else what `scripts/install-promtool.sh` builds. Panics
/// when missing.
pub fn promtool_bin() -> PathBuf {
    let path = std::env::var_os("HAPTIC_PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(format!("target/promtool/{PROMTOOL_VERSION}/promtool")));
    assert!(
        path.is_file(),
        "promtool is missing at {}: run scripts/install-promtool.sh (or set HAPTIC_PROMTOOL)",
        path.display()
    );
    path
}

/// The actionlint binary: `HAPTIC_ACTIONLINT`, else what `scripts/install-actionlint.sh` builds.
/// Panics when missing.
pub fn actionlint_bin() -> PathBuf {
    let path = std::env::var_os("HAPTIC_ACTIONLINT")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(format!("target/actionlint/{ACTIONLINT_VERSION}/actionlint")));
    assert!(
        path.is_file(),
        "actionlint is missing at {}: run scripts/install-actionlint.sh (or set HAPTIC_ACTIONLINT)",
        path.display()
    );
    path
}

/// `charts/haptic`.
pub fn chart_dir() -> PathBuf {
    workspace_root().join("charts/haptic")
}

/// Runs helm with private cache/config/data homes; returns (success, stdout, stderr).
pub fn helm(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(helm_bin())
        .args(args)
        .env("HELM_CACHE_HOME", std::env::temp_dir().join("haptic-helm-cache"))
        .env("HELM_CONFIG_HOME", std::env::temp_dir().join("haptic-helm-config"))
        .env("HELM_DATA_HOME", std::env::temp_dir().join("haptic-helm-data"))
        .output()
        .expect("helm runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `helm template <release> charts/haptic --namespace <namespace> <extra>`: the rendered objects
/// (empty documents dropped). Panics when helm fails.
pub fn render_chart(release: &str, namespace: &str, extra: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec!["template", release, chart.to_str().unwrap(), "--namespace", namespace];
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm {args:?} failed:\n{err}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&out).unwrap_or_else(|e| panic!("rendered YAML: {e}\n{out}"));
    docs.into_iter().filter(|d| d.is_object()).collect()
}

/// Runs promtool with `args` and `stdin`; returns (success, stdout and stderr together).
pub fn promtool(args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = Command::new(promtool_bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), said)
}

/// `promtool check metrics` (parsing and every lint) on an exposition of ours; panics with
/// promtool's words when it finds a problem.
///
/// haptic's `/metrics` are OpenMetrics (prometheus-client encodes nothing else): a counter family
/// `x` has `# HELP x` and samples `x_total`. promtool reads the classic text format, where the
/// HELP line would name `x_total`, so it reports "x_total no help text" for every counter. Only
/// that report, and only for a family whose `# HELP x` and `# TYPE x counter` are present, is
/// set aside; anything else promtool says fails the check.
pub fn promtool_check_metrics(what: &str, text: &str) {
    let (ok, said) = promtool(&["check", "metrics"], text);
    let openmetrics_counter = |line: &str| {
        line.strip_suffix(" no help text").and_then(|n| n.strip_suffix("_total")).is_some_and(|family| {
            text.contains(&format!("# HELP {family} ")) && text.contains(&format!("# TYPE {family} counter"))
        })
    };
    let problems: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty() && !openmetrics_counter(l)).collect();
    assert!(ok || problems.is_empty(), "promtool check metrics refused {what}:\n{said}\n--- the exposition:\n{text}");
    assert!(
        problems.is_empty(),
        "promtool check metrics on {what}:\n{}\n--- the exposition:\n{text}",
        problems.join("\n")
    );
}

/// Every PromQL query the chart ships: the Grafana dashboard's and the PrometheusRule's, from a
/// `helm template` with both enabled.
pub fn chart_monitoring_queries() -> Vec<crate::monitoring::Query> {
    let objs = render_chart(
        "names",
        "names",
        &["--set", "metrics.dashboard.enabled=true", "--set", "metrics.prometheusRule.enabled=true"],
    );
    let cm = objs
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["data"]["haptic.json"].is_string())
        .expect("the chart rendered the dashboard ConfigMap");
    let dashboard: Value = serde_json::from_str(cm["data"]["haptic.json"].as_str().unwrap()).expect("dashboard JSON");
    let mut queries = crate::monitoring::dashboard_queries(&dashboard);
    let rule = objs.iter().find(|o| o["kind"] == "PrometheusRule").expect("the chart rendered the PrometheusRule");
    queries.extend(crate::monitoring::rule_queries(rule));
    queries
}
