//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: the raised fence is persisted before staging
//! (check the fence, persist it, then stage), so while `haproxy -c` runs (held here by a gate in front of the real binary) and after
//! a `kill -9` of the agent at that moment, `/v1/state` shows the fence the agent enforces. A
//! runtime apply's raised fence is written with its intent record: after its ACK, or after a
//! refusal, it survives a `kill -9`.

mod common;
use haptic_e2e::on_each_version;

use common::*;
use haptic_e2e::HaproxyBin;
use haptic_protocol::Mode;

on_each_version!(fence_is_persisted_before_staging);
async fn fence_is_persisted_before_staging(bin: HaproxyBin) {
    let label = bin.label();
    let dir = tempfile::tempdir().unwrap();
    let mut pod = gated_pod(&bin, dir.path()).await;
    let fe = port();
    let v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9001)], ""));
    let p1 = pid(&v1);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;

    // The next apply's `haproxy -c` is held: the apply is in flight, past the fence step.
    std::fs::write(dir.path().join("gate"), b"").unwrap();
    let v2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9002)], ""));
    let client = pod.client();
    let body = request((1, 2), Some(p1), Mode::Reload, &v2, |_| true, vec![]).to_string();
    let inflight = tokio::spawn(async move { client.post_json("/v1/apply", &body).await });
    let s = wait_state(&pod, "the in-flight apply's fence", |s| s.fence.as_ref().is_some_and(|f| f.seq == 2)).await;
    assert_eq!(s.applied.as_ref().unwrap().plan_id, p1, "{label}: nothing swapped yet");

    // A crash right there: the fence survives it.
    pod.kill_agent_9();
    let _ = inflight.await;
    std::fs::remove_file(dir.path().join("gate")).unwrap();
    pod.restart_agent().await.unwrap();
    let s = state(&pod, false).await;
    assert_eq!(s.fence.as_ref().map(|f| (f.epoch, f.seq)), Some((1, 2)), "{label}: {s:?}");
    assert_eq!(s.applied.as_ref().unwrap().plan_id, p1, "{label}");

    // The agent enforces exactly that fence: another plan at seq 2 is stale, seq 3 lands.
    let v3 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9003)], ""));
    let (st, v) = apply(&pod, &request((1, 2), Some(p1), Mode::Reload, &v3, |_| true, vec![])).await;
    assert_eq!((st, v["conflict"].as_str()), (409, Some("stale_epoch")), "{label}: {v}");
    apply_ok(&pod, &request((1, 3), Some(p1), Mode::Reload, &v3, |_| true, vec![])).await;
    println!("{label}: fence persisted before staging");
}

on_each_version!(runtime_fence_is_written_with_the_intent);
async fn runtime_fence_is_written_with_the_intent(bin: HaproxyBin) {
    let label = bin.label();
    let mut pod = pod(&bin).await;
    let fe = port();
    let v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9001)], ""));
    let p1 = pid(&v1);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;

    // A runtime apply raises the fence in the same write as its intent: ACKed, it survives a
    // `kill -9` right after the answer.
    let v2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9002)], ""));
    let p2 = pid(&v2);
    let op: haptic_protocol::Op = serde_json::from_value(serde_json::json!(
        {"op": "server.set", "backend": "be_app", "server": "s1", "addr": "127.0.0.1", "port": 9002}
    ))
    .unwrap();
    let ack = apply_ok(&pod, &request((1, 2), Some(p1), Mode::Runtime, &v2, |_| true, vec![vec![op]])).await;
    assert_eq!(ack["mode"], "runtime", "{label}: {ack}");
    pod.kill_agent_9();
    pod.restart_agent().await.unwrap();
    let s = state(&pod, false).await;
    assert_eq!(s.fence.as_ref().map(|f| (f.epoch, f.seq)), Some((1, 2)), "{label}: {s:?}");
    assert_eq!(s.applied.as_ref().unwrap().plan_id, p2, "{label}");

    // A refused runtime apply (its baseline is not the applied plan) wrote its raised fence
    // before the refusal was answered.
    let v3 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9003)], ""));
    let (st, v) = apply(&pod, &request((1, 3), Some(p1), Mode::Runtime, &v3, |_| true, vec![])).await;
    assert_eq!(st, 409, "{label}: {v}");
    pod.kill_agent_9();
    pod.restart_agent().await.unwrap();
    let s = state(&pod, false).await;
    assert_eq!(s.fence.as_ref().map(|f| (f.epoch, f.seq)), Some((1, 3)), "{label}: {s:?}");
    assert_eq!(s.applied.as_ref().unwrap().plan_id, p2, "{label}");
    let (st, v) = apply(&pod, &request((1, 2), Some(p2), Mode::Reload, &v3, |_| true, vec![])).await;
    assert_eq!((st, v["conflict"].as_str()), (409, Some("stale_epoch")), "{label}: {v}");
    println!("{label}: runtime fence written with the intent");
}
