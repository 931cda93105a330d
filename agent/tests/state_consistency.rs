//! `/v1/state?verify=1` is never torn, on HAProxy 2.6, 3.0, 3.2 and 3.4 (each its own test case): while
//! applies land one after another, every verified read's `files` hash to its own
//! `applied.plan_id`, and the reads see every applied plan (the writer waits, after each ACK,
//! for two reads to finish, so the second began after the ACK and before the next apply).

mod common;
use haptic_e2e::on_each_version;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use haptic_e2e::HaproxyBin;
use haptic_protocol::Mode;

const APPLIES: u64 = 40;

async fn verified_state_is_never_torn(bin: HaproxyBin) {
    let label = bin.label();
    let pod = pod(&bin).await;
    let base = cfg(pod.health_bind(), port(), &[("s1", 9001)], "");
    let plan = |i: u64| {
        let mut f = only_cfg(&base);
        for k in 0..8 {
            f.insert(format!("files/f{k}.txt"), format!("apply {i} file {k}\n").into_bytes());
        }
        f
    };
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &plan(1), |_| true, vec![])).await;
    let reads = Arc::new(AtomicU64::new(0));
    let writer = {
        let client = pod.client();
        let reads = reads.clone();
        let reqs: Vec<String> = (2..=APPLIES)
            .map(|i| request((1, i), None, Mode::FileOnly, &plan(i), |_| true, vec![]).to_string())
            .collect();
        tokio::spawn(async move {
            for body in reqs {
                let (st, text) = client.post_json("/v1/apply", &body).await.unwrap();
                assert_eq!(st, 200, "{text}");
                let after = reads.load(Ordering::SeqCst);
                eventually("two verified reads after the ACK", Duration::from_secs(30), || {
                    let n = reads.load(Ordering::SeqCst);
                    async move {
                        if n >= after + 2 {
                            Ok(())
                        } else {
                            Err(format!("{} reads since", n - after))
                        }
                    }
                })
                .await;
            }
        })
    };
    let mut seen = BTreeSet::new();
    while !writer.is_finished() {
        let s = state(&pod, true).await;
        let applied = s.applied.as_ref().unwrap().plan_id;
        let n = reads.load(Ordering::SeqCst);
        assert_eq!(haptic_protocol::plan_id(&s.files).unwrap(), applied, "{label} read {n}: torn: {s:?}");
        seen.insert(applied);
        reads.fetch_add(1, Ordering::SeqCst);
    }
    writer.await.unwrap();
    let n = reads.load(Ordering::SeqCst);
    assert!(seen.len() as u64 >= APPLIES - 1, "{label}: {n} reads saw only {} of {APPLIES} plans", seen.len());
    println!("{label}: {n} verified reads saw {} plans during {APPLIES} applies, none torn", seen.len());
}

on_each_version!(verified_state_is_never_torn);
