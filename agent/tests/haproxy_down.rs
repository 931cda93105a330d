//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: HAProxy gone (`kill -9` of the master, or of the worker,
//! after which the master exits) is not a config rejection. The agent reports `running: null` and `haproxy.running: false`, answers applies with
//! 503 `haproxy_unavailable` after writing the tree, and picks a new HAProxy up again (new master,
//! new pids) without a restart of its own; the next apply lands and clears `last_error`.

mod common;
use haptic_e2e::on_each_version;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use haptic_e2e::{pid_alive, Haproxy, HaproxyBin};
use haptic_protocol::Mode;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Which process the test kills with SIGKILL.
#[derive(Debug, Clone, Copy)]
enum Victim {
    Master,
    /// The master sees its worker die and exits (exit-on-failure), taking everything down.
    Worker,
}

on_each_version!(haproxy_gone_is_503_and_picked_up_again);
async fn haproxy_gone_is_503_and_picked_up_again(bin: HaproxyBin) {
    gone_and_back(bin, Victim::Master).await;
}

on_each_version!(worker_killed_master_exits_is_503_and_picked_up_again);
async fn worker_killed_master_exits_is_503_and_picked_up_again(bin: HaproxyBin) {
    gone_and_back(bin, Victim::Worker).await;
}

async fn gone_and_back(bin: HaproxyBin, victim: Victim) {
    let label = format!("{} ({victim:?} killed)", bin.label());
    let pod = pod(&bin).await;
    let (a, b) = (backend("A").await, backend("B").await);
    let fe = port();
    let fe_addr = SocketAddr::from(([127, 0, 0, 1], fe));
    let v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    let p1 = pid(&v1);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    wait_body(fe_addr, "/", "A").await;

    // kill -9 of the master (its workers follow it) or of the worker (the master exits).
    let mut pids = pod.haproxy().known_pids();
    let w = worker(&pod).await;
    pids.push(w);
    let target = match victim {
        Victim::Master => pod.haproxy().master_pid(),
        Victim::Worker => w,
    };
    kill(Pid::from_raw(target as i32), Signal::SIGKILL).unwrap();
    eventually(&format!("{label}: HAProxy processes gone with their master"), Duration::from_secs(30), || async {
        match pids.iter().find(|p| pid_alive(**p)) {
            Some(p) => Err(format!("pid {p} alive")),
            None => Ok(()),
        }
    })
    .await;
    // The agent says HAProxy is gone, then why: waited for together.
    let s = wait_state(&pod, "HAProxy seen gone, and why", |s| {
        !s.haproxy.running
            && s.running.is_none()
            && s.last_error.as_deref().is_some_and(|e| e.contains("HAProxy not running"))
    })
    .await;
    assert_eq!((s.haproxy.master_pid, s.haproxy.worker_pid), (None, None), "{label}: no dead pids");

    // An apply: 503, not a rejection, and the tree is written for HAProxy's next start.
    let v2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", b.port)], ""));
    let p2 = pid(&v2);
    let (st, v) = apply(&pod, &request((1, 2), Some(p1), Mode::Reload, &v2, |_| true, vec![])).await;
    assert_eq!(st, 503, "{label}: {v}");
    assert_eq!(v["error"], "haproxy_unavailable", "{label}: {v}");
    assert!(v["reason"].as_str().is_some_and(|r| r.contains("HAProxy not running")), "{label}: {v}");
    assert!(v.get("rejected").is_none(), "{label}: {v}");
    let s = state(&pod, true).await;
    assert_eq!(s.applied.as_ref().map(|a| a.plan_id), Some(p2), "{label}");
    assert_eq!(s.files, entries(&v2), "{label}: the latest tree is live on disk");
    assert!(s.running.is_none() && !s.haproxy.running, "{label}: {s:?}");

    // HAProxy's container restarts: a new master on the same socket, on the latest tree.
    let hap2 = Haproxy::start(&bin, pod.haproxy().opts().clone()).await.unwrap();
    wait_body(fe_addr, "/", "B").await;
    let s = wait_state(&pod, "HAProxy picked up again", |s| {
        s.haproxy.running
            && s.haproxy.master_pid == Some(hap2.master_pid())
            && s.running.as_ref().map(|r| r.plan_id) == Some(p2)
    })
    .await;
    assert!(s.haproxy.worker_pid.is_some(), "{label}: {s:?}");

    // The next apply lands normally and clears last_error.
    let v3 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    let ack = apply_ok(&pod, &request((1, 3), Some(p2), Mode::Reload, &v3, |_| true, vec![])).await;
    assert_eq!(ack["running"], serde_json::json!(pid(&v3)), "{label}: {ack}");
    wait_body(fe_addr, "/", "A").await;
    assert_eq!(state(&pod, false).await.last_error, None, "{label}");
    drop(hap2);
    println!("{label}: HAProxy gone → 503, picked up again");
}
