//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: a config that passes `haproxy -c` but fails on
//! reload (a port already held by another socket) → 422; the last good tree is live again and
//! HAProxy still serves the old config. With the bind pre-check (the default) the agent refuses
//! it before touching anything; without it, HAProxy's failed reload is rolled back, and its
//! answer names the held address on every version.

mod common;
use haptic_e2e::on_each_version;

use std::net::SocketAddr;

use common::*;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::HaproxyBin;
use haptic_protocol::Mode;

on_each_version!(failed_reload_restores_the_last_good_tree);
async fn failed_reload_restores_the_last_good_tree(bin: HaproxyBin) {
    let label = bin.label();
    let no_precheck = PodOpts { extra_args: vec!["--bind-precheck=false".into()], ..Default::default() };
    let pod = pod_with(&bin, no_precheck).await;
    let a = backend("A").await;
    let fe = port();
    let fe_addr = SocketAddr::from(([127, 0, 0, 1], fe));
    let good = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    let p1 = pid(&good);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &good, |_| true, vec![])).await;
    wait_body(fe_addr, "/", "A").await;
    let live_before = std::fs::read_link(pod.root().join("current")).unwrap();
    let w = worker(&pod).await;

    // Another socket holds this port: `-c` passes (it does not bind), the reload fails.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_port = held.local_addr().unwrap().port();
    let extra = format!("\nfrontend fe_conflict\n    bind 127.0.0.1:{held_port}\n    default_backend be_app\n");
    let bad = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], &extra));
    let (st, v) = apply(&pod, &request((1, 2), Some(p1), Mode::Reload, &bad, |_| true, vec![])).await;
    assert_eq!(st, 422, "{label}: {v}\n{}", pod.agent_log());
    assert_eq!(v["rejected"], true);
    // HAProxy's words name the address (≥ 2.7 on the master CLI; on 2.6, which prints them
    // only on the master's stderr, the agent's re-check of the refused tree names it).
    let output = v["haproxy_output"].as_str().unwrap();
    assert!(output.contains(&format!("127.0.0.1:{held_port}")), "{label}: {v}");
    let s = state(&pod, false).await;
    assert!(s.last_error.as_deref().is_some_and(|e| e.contains(&format!("127.0.0.1:{held_port}"))), "{label}: {s:?}");

    let s = state(&pod, true).await;
    assert_eq!(s.applied.as_ref().unwrap().plan_id, p1, "{label}: the last good plan is applied again");
    assert_eq!(s.running.as_ref().unwrap().plan_id, p1, "{label}");
    assert_eq!(s.files, entries(&good), "{label}: the last good tree is live");
    assert!(s.last_error.is_some(), "{label}: last_error records HAProxy's words");
    assert_eq!(std::fs::read_link(pod.root().join("current")).unwrap(), live_before, "{label}");
    assert_eq!(get(fe_addr, "/").await, (200, "A".into()), "{label}: still serving the old config");
    assert_eq!(worker(&pod).await, w, "{label}: the old worker serves");

    // SIGTERM while that slow failing reload is in flight: the apply finishes, then exit 0.
    let mut pod = pod;
    let client = pod.client();
    let body = request((1, 3), Some(p1), Mode::Reload, &bad, |_| true, vec![]).to_string();
    let inflight = tokio::spawn(async move { client.post_json("/v1/apply", &body).await });
    // The fence is persisted (and published) before staging, so seeing it means the apply is in flight.
    wait_state(&pod, "the apply's fence", |s| s.fence.as_ref().is_some_and(|f| f.seq == 3)).await;
    let status = pod.stop_agent().await.expect("agent exited");
    assert!(status.success(), "{label}: {status:?}");
    let (st, text) = inflight.await.unwrap().expect("the in-flight apply got its answer");
    assert_eq!(st, 422, "{label}: {text}");
    pod.restart_agent().await.unwrap();
    let s = state(&pod, true).await;
    assert_eq!(s.applied.as_ref().unwrap().plan_id, p1, "{label}");
    assert_eq!(s.files, entries(&good), "{label}");
    drop(held);

    // The next good apply lands normally.
    let good2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port), ("s2", a.port)], ""));
    let ack = apply_ok(&pod, &request((1, 4), Some(p1), Mode::Reload, &good2, |_| true, vec![])).await;
    assert_eq!(ack["reload"]["state"], "done", "{label}: {ack}");
    println!("{label}: failed reload restored");
}

on_each_version!(bind_precheck_refuses_a_held_port_without_reloading);
async fn bind_precheck_refuses_a_held_port_without_reloading(bin: HaproxyBin) {
    let label = bin.label();
    let pod = pod(&bin).await;
    let a = backend("A").await;
    let fe = port();
    let fe_addr = SocketAddr::from(([127, 0, 0, 1], fe));
    let good = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    let p1 = pid(&good);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &good, |_| true, vec![])).await;
    let (w, reloads) = (worker(&pod).await, master_reloads(&pod).await);

    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_port = held.local_addr().unwrap().port();
    let extra = format!("\nfrontend fe_conflict\n    bind 127.0.0.1:{held_port}\n    default_backend be_app\n");
    let bad = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], &extra));
    let (st, v) = apply(&pod, &request((1, 2), Some(p1), Mode::Reload, &bad, |_| true, vec![])).await;
    assert_eq!(st, 422, "{label}: {v}");
    assert!(v["reason"].as_str().unwrap().contains("bind pre-check"), "{label}: {v}");
    assert!(v["haproxy_output"].as_str().unwrap().contains(&format!("127.0.0.1:{held_port}")), "{label}: {v}");
    assert_eq!(master_reloads(&pod).await, reloads, "{label}: no reload was attempted");
    assert_eq!(worker(&pod).await, w, "{label}");
    let s = state(&pod, true).await;
    assert_eq!(s.applied.as_ref().unwrap().plan_id, p1, "{label}");
    assert_eq!(s.files, entries(&good), "{label}: nothing changed on disk");
    assert_eq!(get(fe_addr, "/").await, (200, "A".into()), "{label}");

    // Once the port is free, the same config lands.
    drop(held);
    let ack = apply_ok(&pod, &request((1, 3), Some(p1), Mode::Reload, &bad, |_| true, vec![])).await;
    assert_eq!(ack["reload"]["state"], "done", "{label}: {ack}");
    println!("{label}: bind pre-check refused a held port, then the config landed once it was free");
}
