//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: an apply with a mode from a newer minor version is
//! not refused: the agent lands it as a checked reload and says why.

mod common;
use haptic_e2e::on_each_version;

use common::*;
use haptic_e2e::HaproxyBin;
use haptic_protocol::Mode;

on_each_version!(unknown_mode_lands_as_a_checked_reload);
async fn unknown_mode_lands_as_a_checked_reload(bin: HaproxyBin) {
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

on_each_version!(warnings_of_a_landed_config_are_kept);
/// On HAProxy 2.6, 3.0, 3.2 and 3.4: a config that loads with warnings lands, and
/// HAProxy's warnings are kept in `last_warnings` until a checked apply without warnings.
async fn warnings_of_a_landed_config_are_kept(bin: HaproxyBin) {
    let label = bin.label();
    let pod = pod(&bin).await;
    let fe = port();
    let warn = "frontend fe_warn\n    bind 127.0.0.1:0\n    use_backend be_app\n    http-request deny if { path /x }\n";
    let w = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9001)], "").replace(
        "frontend fe_main",
        &format!("{}frontend fe_main", warn.replace("127.0.0.1:0", &format!("127.0.0.1:{}", port()))),
    ));
    let ack = apply_ok(&pod, &request((1, 1), None, Mode::Reload, &w, |_| true, vec![])).await;
    assert_eq!(ack["reload"]["state"], "done", "{label}: {ack}");
    let s = state(&pod, false).await;
    assert!(
        s.last_warnings.iter().any(|l| l.contains("'http-request' rule placed after a 'use_backend' rule")),
        "{label}: {:?}",
        s.last_warnings
    );
    let clean = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9002)], ""));
    apply_ok(&pod, &request((1, 2), Some(pid(&w)), Mode::Reload, &clean, |_| true, vec![])).await;
    assert!(state(&pod, false).await.last_warnings.is_empty(), "{label}");
    println!("{label}: warnings kept");
}
