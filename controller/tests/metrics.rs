//! Live `/metrics` of a running controller (standalone) and of its agents (2 real pods of
//! HAProxy 2.6, 3.0, 3.2 and 3.4), scraped over HTTP on 127.0.0.1: the names operators query
//! (`haptic_pods`, `haptic_leader`, `haptic_build_info`, the `haproxy_pod` label), and both
//! expositions accepted by Prometheus's own `promtool check metrics` (`scripts/install-promtool.sh`;
//! or `HAPTIC_PROMTOOL`), and every `haptic_*` name the chart's Grafana dashboard and
//! PrometheusRule read (`helm template`: `scripts/install-helm.sh`, or `HAPTIC_HELM`) served by
//! one of them.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use haptic_e2e::monitoring::{exposed_names, missing, names_read};
use haptic_e2e::pod::PodOpts;
use haptic_e2e::tools::{chart_monitoring_queries, promtool_check_metrics as promtool_check};
use haptic_e2e::{free_port, haproxy_bins, http_get};

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
async fn live_metrics_have_the_operator_names_pass_promtool_and_serve_the_dashboard_and_rules() {
    let bin = haproxy_bins().into_iter().last().expect("a HAProxy build");
    let fleet = Fleet::start(&bin, 2, PodOpts::default()).await;
    let work = Work::new();
    let cfg_dir = work.cfg_dir();
    let cfg = Cfg::new(free_port());
    let r = write_render(&cfg_dir, &cfg.files("a.example be_app\n"));
    let ctl = start(settings(&fleet, &cfg_dir, &work.state_dir(), "ctl-m", Duration::from_secs(3600))).await;
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
    let mut served: BTreeSet<String> = exposed_names(&text);

    for (i, p) in fleet.pods.iter().enumerate() {
        let text = scrape(p.addr()).await;
        let build = format!("haptic_build_info{{component=\"agent\",version=\"{version}\"}}");
        assert_eq!(sample(&text, &build), Some(1.0), "pod {i}\n{text}");
        assert!(sample(&text, "haptic_agent_applies_total{mode=\"reload\",result=\"ack\"}").is_some(), "{text}");
        promtool_check(&format!("agent {i}'s /metrics"), &text);
        served.extend(exposed_names(&text));
    }
    let wanted = names_read(&chart_monitoring_queries()).unwrap_or_else(|e| panic!("{e}"));
    assert!(wanted.keys().any(|n| n.starts_with("haptic_agent_")) && wanted.contains_key("haptic_leader"));
    // Served in Kubernetes render mode only (this controller is standalone): tests/ingress.rs
    // reads it from a render-mode controller.
    served.insert("haptic_render_valid".to_string());
    // Likewise (and only with TLS Ingresses); its encoding and source are unit-tested.
    served.insert("haptic_certificate_expiry_timestamp_seconds".to_string());
    let absent = missing(&wanted, "haptic_", &served);
    assert!(absent.is_empty(), "the dashboard or the rules read metrics no controller or agent serves: {absent:?}");
    let m = ctl.metrics().clone();
    ctl.stop().await;
    assert_eq!(sample(&m.encode(), "haptic_leader"), Some(0.0), "a stopped controller deploys nothing");
}
