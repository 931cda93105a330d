//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: a plan that adds servers to a backend, and a
//! later one that deletes some, land at runtime through `/v1/apply` (same worker, no reload),
//! traffic reaches exactly the servers the tree names, the tree on disk says so, and a following
//! reload keeps them. An apply whose `server.add` names a backend the config lacks is not run.

mod common;
use haptic_e2e::on_each_version;

use std::collections::BTreeSet;

use common::*;
use haptic_e2e::pod::Pod;
use haptic_e2e::HaproxyBin;
use haptic_haproxy::claim::diff_cfg;
use haptic_protocol::{Mode, Op, ServerAdd, ServerState};
use serde_json::json;

/// The sum of `haptic_agent_reloads_total` over its results.
async fn agent_reloads(pod: &Pod) -> f64 {
    let (_, text) = pod.client().get("/metrics").await.unwrap();
    text.lines()
        .filter(|l| l.starts_with("haptic_agent_reloads_total"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// Sends requests until every body in `want` has answered (at most 200 requests), and checks
/// that nothing else answered.
async fn answered_by(pod: &Pod, fe: u16, want: &[&str], label: &str) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], fe));
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let mut seen = BTreeSet::new();
    for _ in 0..200 {
        let (st, body) = get(addr, "/").await;
        assert_eq!(st, 200, "{label}: {body}\n{}", pod.agent_log());
        assert!(want.contains(&body), "{label}: {body:?} answered, only {want:?} may");
        seen.insert(body);
        if seen == want {
            return;
        }
    }
    panic!("{label}: only {seen:?} of {want:?} answered in 200 requests");
}

/// The runtime ops that bring `old` to `new`, as the controller's diff makes them.
fn ops(old: &Files, new: &Files) -> Vec<Op> {
    let text = |f: &Files| String::from_utf8(f["haproxy.cfg"].clone()).unwrap();
    let d = diff_cfg(&text(old), &text(new));
    assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
    d.server_ops()
}

on_each_version!(servers_added_and_deleted_land_at_runtime);
async fn servers_added_and_deleted_land_at_runtime(bin: HaproxyBin) {
    let label = bin.label();
    let pod = pod(&bin).await;
    let fe = port();
    let (a, b, c, d) = (backend("A").await, backend("B").await, backend("C").await, backend("D").await);
    let files = |servers: &[(&str, u16)], extra: &str| only_cfg(&cfg(pod.health_bind(), fe, servers, extra));
    let v1 = files(&[("s1", a.port)], "");
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    answered_by(&pod, fe, &["A"], &label).await;
    let (w0, m0, r0) = (worker(&pod).await, master_reloads(&pod).await, agent_reloads(&pod).await);

    // Three servers more: three server.add ops, runtime, the same worker.
    let v2 = files(&[("s1", a.port), ("s2", b.port), ("s3", c.port), ("s4", d.port)], "");
    let batch = ops(&v1, &v2);
    assert_eq!(batch.iter().filter(|o| matches!(o, Op::ServerAdd(_))).count(), 3, "{batch:?}");
    let ack =
        apply_ok(&pod, &request((1, 2), Some(pid(&v1)), Mode::Runtime, &v2, |p| p == "haproxy.cfg", vec![batch])).await;
    assert_eq!(ack["mode"], "runtime", "{label}: {ack}");
    assert_eq!(ack["running"], json!(pid(&v2)), "{label}: {ack}");
    answered_by(&pod, fe, &["A", "B", "C", "D"], &label).await;
    assert_eq!((worker(&pod).await, master_reloads(&pod).await), (w0, m0), "{label}: a server.add reloaded");
    assert_eq!(agent_reloads(&pod).await, r0, "{label}");
    let on_disk = std::fs::read_to_string(live(&pod, "haproxy.cfg")).unwrap();
    assert!(on_disk.contains(&format!("server s4 127.0.0.1:{}", d.port)), "{label}: {on_disk}");
    assert_eq!(state(&pod, true).await.files, state(&pod, false).await.files, "{label}: the index matches the disk");

    // Two deleted: two server.del ops, runtime, and they get no more traffic.
    let v3 = files(&[("s3", c.port), ("s4", d.port)], "");
    let batch = ops(&v2, &v3);
    assert_eq!(batch.iter().filter(|o| matches!(o, Op::ServerDel(_))).count(), 2, "{batch:?}");
    let ack =
        apply_ok(&pod, &request((1, 3), Some(pid(&v2)), Mode::Runtime, &v3, |p| p == "haproxy.cfg", vec![batch])).await;
    assert_eq!(ack["mode"], "runtime", "{label}: {ack}");
    answered_by(&pod, fe, &["C", "D"], &label).await;
    assert_eq!((worker(&pod).await, master_reloads(&pod).await), (w0, m0), "{label}: a server.del reloaded");
    assert_eq!(agent_reloads(&pod).await, r0, "{label}");
    let servers = pod.haproxy().worker_cmd("show servers state be_app").await.unwrap();
    let names: Vec<&str> =
        servers.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_whitespace().nth(3)).collect();
    assert_eq!(names, ["s3", "s4"], "{label}: {servers}");

    // A server.add naming a backend the config lacks is never run: the claim does not verify, the
    // apply says why and lands as a checked reload of its tree instead.
    let nope = Op::ServerAdd(ServerAdd {
        backend: "be_nope".into(),
        server: "s9".into(),
        addr: "127.0.0.1".parse().unwrap(),
        port: a.port,
        weight: None,
        state: ServerState::Ready,
        params: vec![],
    });
    let v3b = files(&[("s3", c.port), ("s4", d.port)], "    timeout server 6s\n");
    let ack =
        apply_ok(&pod, &request((1, 4), Some(pid(&v3)), Mode::Runtime, &v3b, |p| p == "haproxy.cfg", vec![vec![nope]]))
            .await;
    assert_eq!(ack["mode"], "reload", "{label}: {ack}");
    assert!(
        ack["reasons"].to_string().contains("server.add be_nope/s9: no backend be_nope in the new config"),
        "{ack}"
    );
    let m_after =
        wait_state(&pod, "the reload ran", |s| s.running.as_ref().map(|r| r.plan_id) == Some(pid(&v3b))).await;
    assert!(m_after.last_error.is_none(), "{label}: {:?}", m_after.last_error);

    // A reload of the tree keeps the servers it names: they are in the file.
    answered_by(&pod, fe, &["C", "D"], &label).await;
    assert_ne!(worker(&pod).await, w0, "{label}: the checked reload ran");
    let v4 = files(&[("s3", c.port), ("s4", d.port)], "    timeout server 7s\n");
    let ack = apply_ok(&pod, &request((1, 5), Some(pid(&v3b)), Mode::Reload, &v4, |_| true, vec![])).await;
    assert_eq!(ack["mode"], "reload", "{label}: {ack}");
    wait_state(&pod, "v4 runs", |s| s.running.as_ref().map(|r| r.plan_id) == Some(pid(&v4))).await;
    answered_by(&pod, fe, &["C", "D"], &label).await;
    println!("{label}: 3 servers added, 2 deleted at runtime; reload kept them");
}
