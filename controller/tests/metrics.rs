//! Live `/metrics` of a running controller (standalone) and of its agents (2 real pods of
//! HAProxy 2.6 and 3.0), scraped over HTTP on 127.0.0.1: the names operators query
//! (`haptic_pods`, `haptic_leader`, `haptic_build_info`, the `haproxy_pod` label), and both
//! expositions accepted by Prometheus's own `promtool check metrics` (`scripts/install-promtool.sh`;
//! or `HAPTIC_PROMTOOL`).

mod common;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::{free_port, haproxy_bins, http_get};

const PROMTOOL_VERSION: &str = "v0.316.0";

fn promtool() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = std::env::var_os("HAPTIC_PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(format!("target/promtool/{PROMTOOL_VERSION}/promtool")));
    assert!(
        path.is_file(),
        "promtool is missing at {}: run scripts/install-promtool.sh (or set HAPTIC_PROMTOOL)",
        path.display()
    );
    path
}

/// `promtool check metrics` on `text` (stdin); panics with its words when it finds a problem.
///
/// Both `/metrics` are OpenMetrics (prometheus-client encodes nothing else): a counter family
/// `x` has `# HELP x` and samples `x_total`. promtool reads the classic text format, where the
/// HELP line would name `x_total`, so it reports "x_total no help text" for every counter. Only
/// that report, and only for a family whose `# HELP x` and `# TYPE x counter` are present, is
/// set aside; anything else promtool says fails the test.
fn promtool_check(what: &str, text: &str) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let openmetrics_counter = |line: &str| {
        line.strip_suffix(" no help text").and_then(|n| n.strip_suffix("_total")).is_some_and(|family| {
            text.contains(&format!("# HELP {family} ")) && text.contains(&format!("# TYPE {family} counter"))
        })
    };
    let problems: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty() && !openmetrics_counter(l)).collect();
    assert!(
        out.status.success() || said.lines().all(|l| l.trim().is_empty() || openmetrics_counter(l)),
        "promtool check metrics refused {what}:\n{said}\n--- the exposition:\n{text}"
    );
    assert!(
        problems.is_empty(),
        "promtool check metrics on {what}:\n{}\n--- the exposition:\n{text}",
        problems.join("\n")
    );
}

/// The value of the sample `series` (exact name and labels) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn scrape(addr: SocketAddr) -> String {
    let (status, body) = http_get(addr, "/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_metrics_have_the_operator_names_and_pass_promtool() {
    let bin = haproxy_bins().into_iter().last().expect("a HAProxy build");
    let fleet = Fleet::start(&bin, 2, PodOpts::default()).await;
    let work = tempfile::tempdir().unwrap();
    let cfg_dir = work.path().join("render");
    std::fs::create_dir(&cfg_dir).unwrap();
    let cfg = Cfg::new(free_port());
    let r = write_render(&cfg_dir, &cfg.files("a.example be_app\n"));
    let ctl = start(settings(&fleet, &cfg_dir, &work.path().join("state"), "ctl-m", Duration::from_secs(3600))).await;
    converged(&ctl, &fleet, r.plan_id()).await;

    let admin = SocketAddr::from(([127, 0, 0, 1], ctl.admin_addr().port()));
    let text = scrape(admin).await;
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(sample(&text, "haptic_pods"), Some(2.0), "{text}");
    assert_eq!(sample(&text, "haptic_pods_converged"), Some(2.0), "{text}");
    assert_eq!(sample(&text, "haptic_leader"), Some(1.0), "standalone mode always deploys\n{text}");
    let build = format!("haptic_build_info{{component=\"controller\",version=\"{version}\"}}");
    assert_eq!(sample(&text, &build), Some(1.0), "{text}");
    assert!(!text.contains("haptic_pods_total"), "a gauge has no _total suffix\n{text}");
    assert!(!text.contains("{pod="), "per-pod series use haproxy_pod\n{text}");
    promtool_check("the controller's /metrics", &text);

    for (i, p) in fleet.pods.iter().enumerate() {
        let text = scrape(p.addr()).await;
        let build = format!("haptic_build_info{{component=\"agent\",version=\"{version}\"}}");
        assert_eq!(sample(&text, &build), Some(1.0), "pod {i}\n{text}");
        assert!(sample(&text, "haptic_agent_applies_total{mode=\"reload\",result=\"ack\"}").is_some(), "{text}");
        promtool_check(&format!("agent {i}'s /metrics"), &text);
    }
    let m = ctl.metrics().clone();
    ctl.stop().await;
    assert_eq!(sample(&m.encode(), "haptic_leader"), Some(0.0), "a stopped controller deploys nothing");
}
