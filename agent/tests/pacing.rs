//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: a failing runtime op falls back to a reload from
//! the tree at once when no reload is pending (with one pending, it joins that paced reload:
//! `running_truth.rs`); a burst of reload-needing applies costs at most two verified reloads; a runtime
//! apply while a reload is scheduled lands at once and survives the reload; an unverifiable
//! runtime claim takes the checked reload path.

mod common;
use haptic_e2e::on_each_version;

use std::net::SocketAddr;
use std::time::Instant;

use common::*;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::HaproxyBin;
use haptic_protocol::{Mode, Op, PlanId};
use serde_json::json;

fn server_set(server: &str, port: u16) -> Op {
    serde_json::from_value(
        json!({"op": "server.set", "backend": "be_app", "server": server, "addr": "127.0.0.1", "port": port}),
    )
    .unwrap()
}

fn paced(interval: &str) -> PodOpts {
    PodOpts { min_reload_interval: interval.into(), ..Default::default() }
}

fn running_is(s: &haptic_protocol::StateResponse, p: PlanId) -> bool {
    s.running.as_ref().is_some_and(|r| r.plan_id == p) && s.pending_reload.is_none()
}

on_each_version!(failing_op_falls_back_to_a_reload);
async fn failing_op_falls_back_to_a_reload(bin: HaproxyBin) {
    let label = bin.label();
    // An interval no test run reaches: "done" below is the fallback ignoring the pacer, never
    // machine speed.
    let pod = pod_with(&bin, paced("1h")).await;
    let (a, b) = (backend("A").await, backend("B").await);
    let fe = port();
    let f0 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port), ("s9", a.port)], ""));
    let p0 = pid(&f0);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &f0, |_| true, vec![])).await;
    wait_state(&pod, "f0 running", |s| running_is(s, p0)).await;
    // The worker loses s9 behind the agent's back (no reload is pending): the next op on it is
    // refused with "No such server".
    let h = pod.haproxy();
    h.worker_cmd("set server be_app/s9 state maint").await.unwrap();
    let gone = h.worker_cmd("del server be_app/s9").await.unwrap();
    assert!(gone.to_lowercase().contains("deleted"), "{label}: {gone}");
    // A verified runtime claim whose op HAProxy refuses.
    let f1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port), ("s9", b.port)], ""));
    let req = request((1, 2), Some(p0), Mode::Runtime, &f1, |_| true, vec![vec![server_set("s9", b.port)]]);
    let ack = apply_ok(&pod, &req).await;
    assert_eq!(ack["mode"], "reload", "{label}: {ack}");
    // The fallback reload ran at once (not paced to the end of the hour), and `running` names it.
    assert_eq!(ack["reload"]["state"], "done", "{label}: {ack}");
    assert_eq!(ack["running"], json!(pid(&f1)), "{label}: {ack}");
    let reasons = ack["reasons"].to_string();
    assert!(reasons.contains("server.set be_app/s9"), "{label}: reason names the op: {reasons}");
    assert!(reasons.to_lowercase().contains("no such server"), "{label}: reason has HAProxy's reply: {reasons}");
    // The tree's config goes live.
    let p1 = pid(&f1);
    wait_state(&pod, "running == the fallback plan", |s| running_is(s, p1)).await;
    let servers = h.worker_cmd("show servers state be_app").await.unwrap();
    let s9 = servers.lines().find(|l| l.split_whitespace().nth(3) == Some("s9")).unwrap_or_else(|| panic!("{servers}"));
    assert!(s9.contains(&b.port.to_string()), "{label}: s9 points to B: {s9}");
    println!("{label}: op failure fell back to a reload: {reasons}");
}

on_each_version!(a_burst_costs_at_most_two_reloads);
async fn a_burst_costs_at_most_two_reloads(bin: HaproxyBin) {
    let label = bin.label();
    let pod = pod_with(&bin, paced("2s")).await;
    let fe = port();
    let before = master_reloads(&pod).await;
    let started = Instant::now();
    let mut last = None;
    let mut baseline = None;
    for i in 0..20u16 {
        let f = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 20000 + i)], ""));
        let p = pid(&f);
        let ack = apply_ok(&pod, &request((1, u64::from(i) + 1), baseline, Mode::Reload, &f, |_| true, vec![])).await;
        match ack["reload"]["state"].as_str() {
            Some("done") => assert_eq!(ack["running"], json!(p), "{label} #{i}: done means running: {ack}"),
            Some("scheduled") => {
                assert_ne!(ack["running"], json!(p), "{label} #{i}: {ack}");
                assert!(ack["reload"]["due_in_ms"].as_u64().unwrap() <= 2000, "{label} #{i}: {ack}");
                // Scheduled: the plan is applied; the reload is pending or already under way.
                let s = state(&pod, false).await;
                assert_eq!(s.applied.as_ref().unwrap().plan_id, p, "{label} #{i}");
            }
            other => panic!("{label} #{i}: reload state {other:?}: {ack}"),
        }
        baseline = Some(p);
        last = Some(p);
    }
    let burst = started.elapsed();
    let last = last.unwrap();
    wait_state(&pod, "the last plan runs", |s| running_is(s, last)).await;
    let reloads = master_reloads(&pod).await - before;
    // Each reload start is ≥ 2 s after the previous one: a burst under 2 s costs ≤ 2.
    let bound = 2 + (burst.as_millis() / 2000) as u32;
    assert!(reloads <= bound, "{label}: {reloads} reloads for a burst of {burst:?}");
    if burst.as_millis() < 2000 {
        assert!(reloads <= 2, "{label}: {reloads} reloads");
    }
    println!("{label}: 20 applies in {burst:?} cost {reloads} verified reloads");
}

on_each_version!(runtime_apply_lands_while_a_reload_is_scheduled);
async fn runtime_apply_lands_while_a_reload_is_scheduled(bin: HaproxyBin) {
    let label = bin.label();
    // Long enough that the second apply is always inside the interval, short enough to wait for.
    let pod = pod_with(&bin, paced("10s")).await;
    let (a, b) = (backend("A").await, backend("B").await);
    let fe = port();
    let fe_addr = SocketAddr::from(([127, 0, 0, 1], fe));
    let hdr = "    http-response set-header X-Plan p1\n";
    let f0 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &f0, |_| true, vec![])).await;
    wait_body(fe_addr, "/", "A").await;
    let w0 = worker(&pod).await;
    let f1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], hdr));
    let ack1 = apply_ok(&pod, &request((1, 2), Some(pid(&f0)), Mode::Reload, &f1, |_| true, vec![])).await;
    assert_eq!(ack1["reload"]["state"], "scheduled", "{label}: {ack1}");

    // Runtime on top: applied at once, by the old worker.
    let f2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", b.port)], hdr));
    let p2 = pid(&f2);
    let req = request((1, 3), Some(pid(&f1)), Mode::Runtime, &f2, |_| true, vec![vec![server_set("s1", b.port)]]);
    let ack = apply_ok(&pod, &req).await;
    assert_eq!(ack["mode"], "runtime", "{label}: {ack}");
    assert!(ack["reload"].is_null(), "{label}: {ack}");
    wait_body(fe_addr, "/", "B").await;
    assert_eq!(worker(&pod).await, w0, "{label}: no reload ran for the runtime apply");
    let s = state(&pod, false).await;
    assert_eq!(s.applied.as_ref().unwrap().plan_id, p2);
    assert_eq!(s.pending_reload.as_ref().map(|p| p.plan_id), Some(p2), "{label}: the pending reload loads the latest");

    // The scheduled reload lands and the runtime change is still in effect.
    wait_state(&pod, "the scheduled reload", |s| running_is(s, p2)).await;
    assert_ne!(worker(&pod).await, w0, "{label}: reloaded");
    assert_eq!(get(fe_addr, "/").await, (200, "B".into()), "{label}");

    // A runtime claim with a non-server change is not trusted.
    let f3 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], "    http-response set-header X-Plan p3\n"));
    let req = request((1, 4), Some(p2), Mode::Runtime, &f3, |_| true, vec![vec![server_set("s1", a.port)]]);
    let ack = apply_ok(&pod, &req).await;
    assert_eq!(ack["mode"], "reload", "{label}: {ack}");
    assert!(ack["reasons"].to_string().contains("runtime claim not verified"), "{label}: {ack}");
    wait_state(&pod, "the checked reload", |s| running_is(s, pid(&f3))).await;
    wait_body(fe_addr, "/", "A").await;
    println!("{label}: runtime apply during a scheduled reload ok");
}
