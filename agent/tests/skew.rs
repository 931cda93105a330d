//! Issue 9 item 12 on HAProxy 2.6 and 3.0: an apply with a mode from a newer minor version is
//! not refused: the agent lands it as a checked reload and says why.

mod common;

use common::*;
use haptic_e2e::haproxy_bins;
use haptic_protocol::Mode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_mode_lands_as_a_checked_reload_on_every_version() {
    for bin in haproxy_bins() {
        let label = bin.label();
        let pod = pod(&bin).await;
        let v1 = only_cfg(&cfg(pod.health_bind(), port(), &[("s1", 9001)], ""));
        let mut req = request((1, 1), None, Mode::Reload, &v1, |_| true, vec![]);
        req["mode"] = serde_json::json!("turbo");
        let ack = apply_ok(&pod, &req).await;
        assert_eq!(ack["mode"], "reload", "{label}: {ack}");
        assert!(ack["reasons"].to_string().contains("does not know"), "{label}: {ack}");
        assert_eq!(ack["running"], serde_json::json!(pid(&v1)), "{label}: {ack}");
        println!("{label}: unknown mode → checked reload");
    }
}
