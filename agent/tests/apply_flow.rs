//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: bootstrap, complete-state apply,
//! traffic, state digests, parts for new files only, missing parts, baselines, a config HAProxy
//! refuses, and a file edited behind the agent's back.

mod common;
use haptic_e2e::on_each_version;

use common::*;
use haptic_e2e::HaproxyBin;
use haptic_protocol::{Digest, Mode, PlanId};

on_each_version!(apply_flow);
async fn apply_flow(bin: HaproxyBin) {
    let label = bin.label();
    let pod = pod(&bin).await;
    let h = health(&pod);

    // Test 1: bootstrap answers /healthz 200 and /ready 503.
    assert_eq!(get(h, "/healthz").await.0, 200, "{label}");
    assert_eq!(get(h, "/ready").await.0, 503, "{label}");
    let s0 = state(&pod, false).await;
    assert!(s0.applied.is_none() && s0.running.is_none() && s0.fence.is_none(), "{label}: {s0:?}");
    assert!(s0.haproxy.running && s0.haproxy.worker_pid.is_some(), "{label}: {s0:?}");

    // Test 4b: a fresh root with a non-null baseline → unknown_baseline.
    let a = backend("A").await;
    let fe = port();
    let files1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    let bogus = PlanId(Digest::of(b"nothing"));
    let (st, v) = apply(&pod, &request((1, 1), Some(bogus), Mode::Reload, &files1, |_| true, vec![])).await;
    assert_eq!(st, 409, "{label}: {v}");
    assert_eq!(v["conflict"], "unknown_baseline", "{label}: {v}");
    assert!(v["actual_baseline"].is_null(), "{label}: {v}");

    // Test 1: a complete-state apply → ACK done; traffic reaches the backend; state agrees.
    let w0 = worker(&pod).await;
    let ack = apply_ok(&pod, &request((1, 2), None, Mode::Reload, &files1, |_| true, vec![])).await;
    let p1 = pid(&files1);
    assert_eq!(ack["applied"], serde_json::json!(p1), "{label}: {ack}");
    assert_eq!(ack["running"], serde_json::json!(p1), "{label}: {ack}");
    assert_eq!(ack["reload"]["state"], "done", "{label}: {ack}");
    assert_ne!(worker(&pod).await, w0, "{label}: a new worker");
    let fe_addr = std::net::SocketAddr::from(([127, 0, 0, 1], fe));
    wait_body(fe_addr, "/", "A").await;
    assert_eq!(get(h, "/ready").await, (200, "ready".into()), "{label}");
    let s1 = state(&pod, true).await;
    assert_eq!(s1.applied.as_ref().unwrap().plan_id, p1, "{label}");
    assert_eq!(s1.running.as_ref().unwrap().plan_id, p1, "{label}");
    assert_eq!(s1.files, entries(&files1), "{label}: digests match the files on disk");
    assert_eq!(s1.applied.as_ref().unwrap().blob, serde_json::json!({"test": true}));
    assert!(s1.verified);

    // Test 2: parts only for new files → ACK (file_only: the config loads none of them).
    let mut files2 = files1.clone();
    files2.insert("files/notes.txt".into(), b"hello\n".to_vec());
    files2.insert("maps/hosts.map".into(), b"a.example 1\n".to_vec());
    let req2 = request((1, 3), Some(p1), Mode::FileOnly, &files2, |p| p != "haproxy.cfg", vec![]);
    let ack2 = apply_ok(&pod, &req2).await;
    let p2 = pid(&files2);
    assert_eq!(ack2["mode"], "file_only", "{label}: {ack2}");
    assert_eq!(ack2["running"], serde_json::json!(p2), "{label}: {ack2}");
    assert!(ack2["reload"].is_null(), "{label}: {ack2}");
    assert_eq!(state(&pod, true).await.files, entries(&files2), "{label}");

    // A missing part → 409 naming exactly those paths; nothing changes.
    let w2 = worker(&pod).await;
    let mut files3 = files2.clone();
    files3.insert("maps/new.map".into(), b"x 1\n".to_vec());
    files3.insert("certs/missing.pem".into(), b"pem".to_vec());
    files3.insert("files/notes.txt".into(), b"changed\n".to_vec());
    let (st, v) = apply(&pod, &request((1, 4), Some(p2), Mode::FileOnly, &files3, |_| false, vec![])).await;
    assert_eq!(st, 409, "{label}: {v}");
    assert_eq!(v["conflict"], "missing_parts");
    assert_eq!(
        v["missing"],
        serde_json::json!(["certs/missing.pem", "files/notes.txt", "maps/new.map"]),
        "{label}: {v}"
    );
    let s = state(&pod, true).await;
    assert_eq!(s.applied.unwrap().plan_id, p2);
    assert_eq!(s.files, entries(&files2));
    assert_eq!(worker(&pod).await, w2);

    // Test 4: a wrong baseline → prev_mismatch with actual_baseline.
    let (st, v) = apply(&pod, &request((1, 5), Some(p1), Mode::Reload, &files1, |_| true, vec![])).await;
    assert_eq!(st, 409, "{label}: {v}");
    assert_eq!(v["conflict"], "prev_mismatch");
    assert_eq!(v["actual_baseline"], serde_json::json!(p2));

    // Test 5: a config HAProxy refuses → 422 with HAProxy's [ALERT]; nothing changes.
    let bad = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], "    balance no-such-algorithm\n"));
    let (st, v) = apply(&pod, &request((1, 6), None, Mode::Reload, &bad, |_| true, vec![])).await;
    assert_eq!(st, 422, "{label}: {v}");
    assert_eq!(v["rejected"], true);
    assert!(v["haproxy_output"].as_str().unwrap().contains("[ALERT]"), "{label}: {v}");
    assert_eq!(worker(&pod).await, w2, "{label}: worker unchanged");
    let s = state(&pod, true).await;
    assert_eq!(s.files, entries(&files2), "{label}: digests unchanged");
    assert_eq!(s.applied.unwrap().plan_id, p2);
    assert_eq!(tree_count(&pod), 1, "{label}: the refused tree was removed");

    // Test 8: a file edited behind the agent's back shows with verify=1 only.
    std::fs::write(live(&pod, "files/notes.txt"), b"tampered\n").unwrap();
    let plain = state(&pod, false).await;
    let verified = state(&pod, true).await;
    let digest = |s: &haptic_protocol::StateResponse| {
        s.files.iter().find(|f| f.path.as_str() == "files/notes.txt").unwrap().digest
    };
    assert_eq!(digest(&plain), Digest::of(b"hello\n"), "{label}: plain state shows the index");
    assert_eq!(digest(&verified), Digest::of(b"tampered\n"), "{label}: verify=1 re-hashes");
    assert!(verified.verified && !plain.verified);
    // Carrying the tampered file is refused: it must be sent again.
    let mut files4 = files2.clone();
    files4.insert("files/other.txt".into(), b"o\n".to_vec());
    let (st, v) =
        apply(&pod, &request((1, 7), Some(p2), Mode::FileOnly, &files4, |p| p == "files/other.txt", vec![])).await;
    assert_eq!(st, 409, "{label}: {v}");
    assert_eq!(v["missing"], serde_json::json!(["files/notes.txt"]), "{label}: {v}");
    let ack =
        apply_ok(&pod, &request((1, 8), Some(p2), Mode::FileOnly, &files4, |p| p.starts_with("files/"), vec![])).await;
    assert_eq!(ack["mode"], "file_only");
    assert_eq!(state(&pod, true).await.files, entries(&files4), "{label}: drift repaired");
    println!("{label}: apply flow ok");
}

on_each_version!(the_pods_variables_reach_the_check);
/// A config that binds its frontend from a pod variable (`bind "127.0.0.1:${FRONT_PORT}"`, the
/// variable set for HAProxy and the agent alike) passes the agent's contained `haproxy -c`, is
/// reloaded and serves: the check sees the pod's environment as the HAProxy beside it does.
async fn the_pods_variables_reach_the_check(bin: HaproxyBin) {
    let label = bin.label();
    let fe = port();
    let opts = haptic_e2e::pod::PodOpts { env: vec![("FRONT_PORT".into(), fe.to_string())], ..Default::default() };
    let pod = pod_with(&bin, opts).await;
    let a = backend("A").await;
    let text = cfg(pod.health_bind(), fe, &[("s1", a.port)], "")
        .replace(&format!("bind 127.0.0.1:{fe}\n"), "bind \"127.0.0.1:${FRONT_PORT}\"\n");
    assert!(text.contains("${FRONT_PORT}"), "{text}");
    let ack = apply_ok(&pod, &request((1, 1), None, Mode::Reload, &only_cfg(&text), |_| true, vec![])).await;
    assert_eq!(ack["reload"]["state"], "done", "{label}: {ack}");
    wait_body(std::net::SocketAddr::from(([127, 0, 0, 1], fe)), "/", "A").await;
}

on_each_version!(fences_survive_kill_9);
async fn fences_survive_kill_9(bin: HaproxyBin) {
    let label = bin.label();
    let mut pod = pod(&bin).await;
    let fe = port();
    let files1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9)], ""));
    let files2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 10)], ""));
    let ack = apply_ok(&pod, &request((5, 17), None, Mode::Reload, &files1, |_| true, vec![])).await;

    // An exact retry → the same ACK.
    let again = apply_ok(&pod, &request((5, 17), None, Mode::Reload, &files1, |_| true, vec![])).await;
    assert_eq!(again, ack, "{label}");
    // Lower epoch; same epoch with seq ≤ seen (another plan).
    for (e, s) in [(4, 100), (5, 17), (5, 16)] {
        let (st, v) = apply(&pod, &request((e, s), None, Mode::Reload, &files2, |_| true, vec![])).await;
        assert_eq!(st, 409, "{label} {e}/{s}: {v}");
        assert_eq!(v["conflict"], "stale_epoch");
        assert_eq!(v["fence"]["epoch"], 5);
        assert_eq!(v["fence"]["seq"], 17);
    }
    // A higher epoch → accepted.
    apply_ok(&pod, &request((6, 0), None, Mode::Reload, &files2, |_| true, vec![])).await;

    // kill -9 and restart: the high-water mark survived.
    pod.kill_agent_9();
    pod.restart_agent().await.unwrap();
    let (st, v) = apply(&pod, &request((5, 99), None, Mode::Reload, &files1, |_| true, vec![])).await;
    assert_eq!(st, 409, "{label}: {v}");
    assert_eq!(v["conflict"], "stale_epoch");
    let s = state(&pod, false).await;
    assert_eq!(s.fence.unwrap().epoch, 6);
    assert_eq!(s.applied.unwrap().plan_id, pid(&files2));
    // SIGTERM: exits 0.
    let status = pod.stop_agent().await.expect("agent exited");
    assert!(status.success(), "{label}: {status:?}");
    println!("{label}: fences ok");
}
