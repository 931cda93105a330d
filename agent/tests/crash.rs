//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: `kill -9` of the agent at random moments during
//! applies (25 trials per version). After each restart `current` is a whole plan (the previous
//! or the new one), its digests match `.state`, HAProxy still serves, and staging garbage stays
//! bounded. The kill delays span one measured apply, and the test counts the trials that landed
//! the new plan and those that kept the previous one: both must occur, so the kills really hit
//! the window around the swap whatever the machine's speed.

mod common;
use haptic_e2e::on_each_version;

use std::time::Duration;

use common::*;
use haptic_e2e::HaproxyBin;
use haptic_protocol::{Mode, PlanId};
use rand::RngExt as _;

const TRIALS: u64 = 25;

on_each_version!(kill_9_during_applies_leaves_a_whole_plan);
async fn kill_9_during_applies_leaves_a_whole_plan(bin: HaproxyBin) {
    let label = bin.label();
    let mut pod = pod(&bin).await;
    let h = health(&pod);
    let fe = port();
    let mut rng = rand::rng();
    let (mut landed_new, mut kept_prev) = (0u32, 0u32);
    let mut seq = 0u64;
    // How long one apply takes here (not asserted: it only scales the kill delays).
    let warm = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 8998)], ""));
    seq += 1;
    let t0 = std::time::Instant::now();
    apply_ok(&pod, &request((1, seq), None, Mode::Reload, &warm, |_| true, vec![])).await;
    let span_ms = (t0.elapsed().as_millis() as u64).max(1) * 3 / 2;
    let mut prev: Option<PlanId> = Some(pid(&warm));
    for trial in 0..TRIALS {
        // A plan of a few files, every one different from the previous plan's.
        let mut files = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9000 + trial as u16)], ""));
        for i in 0..4 {
            files.insert(format!("files/f{i}.txt"), format!("trial {trial} file {i}\n").into_bytes());
        }
        let new = pid(&files);
        seq += 1;
        let mode = if trial % 3 == 0 { Mode::FileOnly } else { Mode::Reload };
        let req = request((1, seq), None, mode, &files, |_| true, vec![]);
        let client = pod.client();
        let body = req.to_string();
        let inflight = tokio::spawn(async move { client.post_json("/v1/apply", &body).await });
        let delay = rng.random_range(0..=span_ms);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        pod.kill_agent_9();
        let _ = inflight.await;
        pod.restart_agent().await.unwrap_or_else(|e| panic!("{label} trial {trial}: restart: {e}"));

        let s = state(&pod, false).await;
        let v = state(&pod, true).await;
        let applied = s.applied.as_ref().map(|a| a.plan_id);
        assert!(
            applied == Some(new) || applied == prev,
            "{label} trial {trial} (kill after {delay} ms): applied {applied:?} is neither new {new:?} nor previous {prev:?}"
        );
        assert_eq!(s.files, v.files, "{label} trial {trial}: .state index == digests on disk");
        if let Some(p) = applied {
            assert_eq!(
                haptic_protocol::plan_id(&v.files).unwrap(),
                p,
                "{label} trial {trial}: current is a whole plan"
            );
            if p == new {
                landed_new += 1;
            } else {
                kept_prev += 1;
            }
        }
        assert!(tree_count(&pod) <= 3, "{label} trial {trial}: {} trees", tree_count(&pod));
        // HAProxy serves. A reload the killed agent had asked for may still be handing the
        // listeners to a new worker: a refused or reset connection then is retried, and one is
        // reported, but HAProxy must answer 200 within the deadline.
        let at = label.as_str();
        let hz = haptic_e2e::wait::poll("HAProxy answering /healthz", Duration::from_secs(10), || async move {
            match haptic_e2e::net::http_get(h, "/healthz").await {
                Ok((200, _)) => Ok(()),
                other => {
                    println!("{at} trial {trial}: /healthz right after the restart: {other:?}");
                    Err(format!("{other:?}"))
                }
            }
        })
        .await;
        assert!(hz.is_ok(), "{label} trial {trial}: HAProxy serves: {hz:?}");
        assert!(!pod.root().join(".current.tmp").exists() || tree_count(&pod) <= 3);
        prev = applied;
    }
    // The agent converges, and a final apply lands normally after all those crashes.
    wait_state(&pod, "running == applied", |s| {
        s.applied.as_ref().map(|a| a.plan_id) == s.running.as_ref().map(|r| r.plan_id)
    })
    .await;
    let files = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 8999)], ""));
    let ack = apply_ok(&pod, &request((1, seq + 1), None, Mode::Reload, &files, |_| true, vec![])).await;
    assert_eq!(ack["running"], serde_json::json!(pid(&files)), "{label}: {ack}");
    assert!(tree_count(&pod) <= 2, "{label}");
    println!(
        "{label}: {TRIALS} kill -9 trials ok: {landed_new} landed the new plan, {kept_prev} kept the previous one"
    );
    assert!(
        landed_new > 0 && kept_prev > 0,
        "{label}: the kills missed the swap window ({landed_new} new, {kept_prev} previous)"
    );
}
