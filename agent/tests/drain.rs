//! On HAProxy 2.6, 3.0, 3.2 and 3.4: the pod stops. The agent, told to stop (SIGUSR1, the image's stop
//! signal, as HAProxy gets), refuses every apply from then on with a 503 that claims nothing was
//! written, keeps answering `/v1/state` while HAProxy drains, and exits only once HAProxy's
//! master is gone (`--drain-wait`).

mod common;
use haptic_e2e::on_each_version;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use haptic_e2e::pod::PodOpts;
use haptic_protocol::Mode;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

on_each_version!(a_stopping_agent_refuses_applies_and_waits_for_haproxy);
async fn a_stopping_agent_refuses_applies_and_waits_for_haproxy(bin: haptic_e2e::HaproxyBin) {
    let label = bin.label();
    let mut pod = pod_with(&bin, PodOpts { extra_args: vec!["--drain-wait=60s".into()], ..PodOpts::default() }).await;
    let (a, b) = (backend("A").await, backend("B").await);
    let fe = port();
    let fe_addr = SocketAddr::from(([127, 0, 0, 1], fe));
    let v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", a.port)], ""));
    let p1 = pid(&v1);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    wait_body(fe_addr, "/", "A").await;

    let agent = Pid::from_raw(i32::try_from(pod.agent_pid().unwrap()).unwrap());
    kill(agent, Signal::SIGUSR1).unwrap();
    // From now on applies are refused, and nothing of theirs is written.
    let v2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", b.port)], ""));
    let refused =
        haptic_e2e::wait::eventually(&format!("{label}: applies refused"), Duration::from_secs(30), || async {
            match apply(&pod, &request((1, 2), Some(p1), Mode::Reload, &v2, |_| true, vec![])).await {
                (503, v) => Ok(v),
                (st, v) => Err(format!("{st} {v}")),
            }
        })
        .await;
    assert_ne!(
        refused["error"], "haproxy_unavailable",
        "{label}: not the 'HAProxy down, tree written' answer: {refused}"
    );
    assert!(refused.get("applied").is_none(), "{label}: {refused}");
    let s = state(&pod, true).await;
    assert_eq!(s.applied.as_ref().map(|a| a.plan_id), Some(p1), "{label}: the tree is untouched");
    assert_eq!(get(fe_addr, "/").await, (200, "A".to_string()), "{label}: HAProxy still serves");

    // HAProxy's soft stop: its master leaves, then the agent, on its own.
    kill(Pid::from_raw(i32::try_from(pod.haproxy().master_pid()).unwrap()), Signal::SIGUSR1).unwrap();
    haptic_e2e::wait::eventually(
        &format!("{label}: the agent gone after HAProxy"),
        Duration::from_secs(30),
        || async {
            match pod.client().get("/v1/state").await {
                Err(_) => Ok(()),
                Ok((st, _)) => Err(format!("still answering {st}")),
            }
        },
    )
    .await;
    assert!(!pod.haproxy_running(), "{label}");
    let status = pod.stop_agent().await.expect("the agent exited");
    assert!(status.success(), "{label}: {status:?}\n{}", pod.agent_log());
}
