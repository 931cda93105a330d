//! Issue 9 item 3 on HAProxy 2.6 and 3.0: `/v1/state?verify=1` is never torn. While applies land
//! one after another, every verified read's `files` hash to its own `applied.plan_id`.

mod common;

use common::*;
use haptic_e2e::haproxy_bins;
use haptic_protocol::Mode;

const APPLIES: u64 = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_state_is_never_torn_on_every_version() {
    for bin in haproxy_bins() {
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
        let writer = {
            let client = pod.client();
            let reqs: Vec<String> = (2..=APPLIES)
                .map(|i| request((1, i), None, Mode::FileOnly, &plan(i), |_| true, vec![]).to_string())
                .collect();
            tokio::spawn(async move {
                for body in reqs {
                    let (st, text) = client.post_json("/v1/apply", &body).await.unwrap();
                    assert_eq!(st, 200, "{text}");
                }
            })
        };
        let mut reads = 0;
        while !writer.is_finished() {
            let s = state(&pod, true).await;
            let applied = s.applied.as_ref().unwrap().plan_id;
            assert_eq!(haptic_protocol::plan_id(&s.files).unwrap(), applied, "{label} read {reads}: torn: {s:?}");
            reads += 1;
        }
        writer.await.unwrap();
        assert!(reads > 0, "{label}");
        println!("{label}: {reads} verified reads during {APPLIES} applies, none torn");
    }
}
