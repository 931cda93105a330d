//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: `running` always names what the worker runs.
//!
//! - A runtime apply made while a reload is pending never puts its ops into the worker: when that
//!   pending reload then fails (a port held by another socket, with the bind pre-check off), the
//!   worker serves exactly the last good plan that `running` names.
//! - A runtime apply whose op addresses a backend only the pending plan has (the worker, still on
//!   the older plan, answers "No such backend") lands with that pending reload, still paced:
//!   no reload at once, and the worker then serves the new plan.
//! - A reload that is not verified within `--reload-timeout` does not swap the last good tree back
//!   under a HAProxy that may still be reading the new one: the tree stays, `running` is unknown
//!   (`null`), and a verifying reload is scheduled that settles it.

mod common;
use haptic_e2e::on_each_version;

use std::net::SocketAddr;

use common::*;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::HaproxyBin;
use haptic_protocol::{Mode, Op, ServerSet};

/// `server.set` of `backend/s1` to 127.0.0.1:`port`.
fn server_set(backend: &str, port: u16) -> Op {
    Op::ServerSet(ServerSet {
        backend: backend.into(),
        server: "s1".into(),
        addr: Some("127.0.0.1".into()),
        port: Some(port),
        weight: None,
        state: None,
    })
}

fn conflict_frontend(port: u16) -> String {
    format!("\nfrontend fe_conflict\n    bind 127.0.0.1:{port}\n    default_backend be_app\n")
}

on_each_version!(failed_pending_reload_leaves_no_runtime_ops_in_the_worker);
async fn failed_pending_reload_leaves_no_runtime_ops_in_the_worker(bin: HaproxyBin) {
    let label = bin.label();
    let opts = PodOpts {
        // Long enough that v2's apply is always inside v1's interval (so its reload is paced).
        min_reload_interval: "10s".into(),
        extra_args: vec!["--bind-precheck=false".into()],
        ..Default::default()
    };
    let pod = pod_with(&bin, opts).await;
    let (a, b) = (backend("A").await, backend("B").await);
    let fe = port();
    let fe_addr = SocketAddr::from(([127, 0, 0, 1], fe));
    let v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    let p1 = pid(&v1);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    wait_state(&pod, "v1 running", |s| s.running.as_ref().map(|r| r.plan_id) == Some(p1)).await;
    wait_body(fe_addr, "/", "A").await;

    // v2 binds a port another socket holds: its reload is paced (v1's reload just ran) and
    // will fail.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_addr = held.local_addr().unwrap().to_string();
    let extra = conflict_frontend(held.local_addr().unwrap().port());
    let v2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], &extra));
    let p2 = pid(&v2);
    let ack = apply_ok(&pod, &request((1, 2), Some(p1), Mode::Reload, &v2, |_| true, vec![])).await;
    assert_eq!(ack["reload"]["state"], "scheduled", "{label}: {ack}");

    // v3 moves s1 to B: a runtime change on top of v2, while the worker still runs v1.
    let v3 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", b.port)], &extra));
    let op = server_set("be_app", b.port);
    let ack = apply_ok(&pod, &request((1, 3), Some(p2), Mode::Runtime, &v3, |_| true, vec![vec![op]])).await;
    assert_eq!(ack["running"], serde_json::json!(p1), "{label}: {ack}");

    // The pending reload (of v3's tree) fails: the last good plan, v1, is restored, and
    // `running` names it.
    let s = wait_state(&pod, "the pending reload failed and v1 runs", |s| {
        s.pending_reload.is_none()
            && s.last_error.is_some()
            && s.applied.as_ref().map(|a| a.plan_id) == Some(p1)
            && s.running.as_ref().map(|r| r.plan_id) == Some(p1)
    })
    .await;
    // `running` says v1: the worker must serve v1 (s1 → A), with none of v3's ops.
    for _ in 0..4 {
        assert_eq!(get(fe_addr, "/").await, (200, "A".into()), "{label}: running names v1, the worker must run v1");
    }
    assert!(s.last_error.as_deref().is_some_and(|e| e.contains(&held_addr)), "{label}: HAProxy's words: {s:?}");
    drop(held);
    println!("{label}: a failed pending reload left no runtime op in the worker");
}

on_each_version!(a_runtime_op_on_a_backend_the_pending_plan_adds_lands_with_that_reload);
async fn a_runtime_op_on_a_backend_the_pending_plan_adds_lands_with_that_reload(bin: HaproxyBin) {
    let label = bin.label();
    // Long enough that v2's and v3's applies are always inside v1's interval (both paced).
    let opts = PodOpts { min_reload_interval: "10s".into(), ..Default::default() };
    let pod = pod_with(&bin, opts).await;
    let (a, b) = (backend("A").await, backend("B").await);
    let (fe, fe_new) = (port(), port());
    let v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    let p1 = pid(&v1);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    wait_state(&pod, "v1 running", |s| s.running.as_ref().map(|r| r.plan_id) == Some(p1)).await;
    let worker = pod.haproxy().worker_pid().await.unwrap();

    // v2 adds a frontend and the backend be_new: its reload is paced (v1's just ran).
    let new = |port: u16| {
        format!("\nfrontend fe_new\n    bind 127.0.0.1:{fe_new}\n    default_backend be_new\n\nbackend be_new\n    server s1 127.0.0.1:{port}\n")
    };
    let v2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], &new(a.port)));
    let p2 = pid(&v2);
    let ack = apply_ok(&pod, &request((1, 2), Some(p1), Mode::Reload, &v2, |_| true, vec![])).await;
    assert_eq!(ack["reload"]["state"], "scheduled", "{label}: {ack}");

    // v3 moves be_new's server: a runtime op on a backend the worker (still on v1) lacks.
    let v3 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], &new(b.port)));
    let p3 = pid(&v3);
    let op = server_set("be_new", b.port);
    let ack = apply_ok(&pod, &request((1, 3), Some(p2), Mode::Runtime, &v3, |_| true, vec![vec![op]])).await;
    assert_eq!((&ack["mode"], &ack["reload"]["state"]), (&"reload".into(), &"scheduled".into()), "{label}: {ack}");
    assert_eq!(
        pod.haproxy().worker_pid().await.unwrap(),
        worker,
        "{label}: no reload at once, the pending one is paced"
    );

    // The pending reload lands v3: be_new serves B.
    wait_state(&pod, "v3 running", |s| s.running.as_ref().map(|r| r.plan_id) == Some(p3)).await;
    wait_body(SocketAddr::from(([127, 0, 0, 1], fe_new)), "/", "B").await;
    wait_body(SocketAddr::from(([127, 0, 0, 1], fe)), "/", "A").await;
    println!("{label}: a runtime op on a backend of the pending plan landed with its paced reload");
}

on_each_version!(reload_timeout_keeps_the_tree_and_running_unknown);
async fn reload_timeout_keeps_the_tree_and_running_unknown(bin: HaproxyBin) {
    let label = bin.label();
    // No pacing: v2's reload must start inside its apply (and time out there), however soon
    // after v1's reload the apply arrives. The verifying reload is scheduled a reload timeout
    // after the failed one, whatever the interval.
    let opts = PodOpts {
        min_reload_interval: "0s".into(),
        reload_timeout: "1s".into(),
        extra_args: vec!["--bind-precheck=false".into()],
        ..Default::default()
    };
    let pod = pod_with(&bin, opts).await;
    let a = backend("A").await;
    let fe = port();
    let fe_addr = SocketAddr::from(([127, 0, 0, 1], fe));
    let v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    let p1 = pid(&v1);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    wait_state(&pod, "v1 running", |s| s.running.as_ref().map(|r| r.plan_id) == Some(p1)).await;

    // A held port makes HAProxy retry its binds for ≈2.2 s, longer than the 1 s timeout.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let extra = conflict_frontend(held.local_addr().unwrap().port());
    let v2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], &extra));
    let p2 = pid(&v2);
    let (st, ack) = apply(&pod, &request((1, 2), Some(p1), Mode::Reload, &v2, |_| true, vec![])).await;
    assert_eq!(st, 200, "{label}: an unverified reload is not a rejection: {ack}\n{}", pod.agent_log());
    assert_eq!(ack["reload"]["state"], "scheduled", "{label}: {ack}");
    assert!(ack["reasons"].to_string().contains("not verified"), "{label}: {ack}");

    // Right after the timeout: the tree was not swapped back, and nothing claims to run.
    let s = state(&pod, true).await;
    assert_eq!(s.applied.as_ref().map(|a| a.plan_id), Some(p2), "{label}: the tree stays: {s:?}");
    assert_eq!(s.files, entries(&v2), "{label}: v2's tree is live on disk");
    assert!(s.running.is_none(), "{label}: the running plan is unknown: {s:?}");

    // Once the port is free, the verifying reload settles what runs (v2, or v1 restored if it
    // ran before the port was freed); either way `running` is known and is the applied plan.
    drop(held);
    let s = wait_state(&pod, "the verifying reload", |s| {
        s.pending_reload.is_none()
            && s.running.is_some()
            && s.running.as_ref().map(|r| r.plan_id) == s.applied.as_ref().map(|a| a.plan_id)
    })
    .await;
    wait_body(fe_addr, "/", "A").await;
    println!("{label}: reload timeout kept the tree; then running = {:?}", s.running.map(|r| r.plan_id.short()));
}
