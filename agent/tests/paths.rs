//! Issue 9 item 5 on HAProxy 2.6 and 3.0: paths stay inside the tree (BRIEF §2). A config that
//! makes HAProxy read a file outside the tree (absolute, or climbing out with `..`), a socket
//! outside the socket dir, or that lacks `default-path config` is refused with 422 naming the
//! directive and the line, before `haproxy -c` reads anything; nothing changes.

mod common;

use common::*;
use haptic_e2e::haproxy_bins;
use haptic_protocol::Mode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_outside_the_tree_are_refused_on_every_version() {
    for bin in haproxy_bins() {
        let label = bin.label();
        let pod = pod(&bin).await;
        let fe = port();
        let good = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9001)], ""));
        let p1 = pid(&good);
        apply_ok(&pod, &request((1, 1), None, Mode::Reload, &good, |_| true, vec![])).await;
        let reloads = master_reloads(&pod).await;
        let mut seq = 1;
        let extra_line = cfg(pod.health_bind(), fe, &[("s1", 9001)], "").lines().count() + 1;
        for (extra, directive) in [
            ("    http-request set-var(txn.x) req.hdr(host),map(/etc/passwd,none)\n", "map()"),
            ("    http-request set-var(txn.x) req.hdr(host),map(../../.state/state.json,none)\n", "map()"),
            ("    errorfile 503 ../../x\n", "errorfile"),
            ("    acl bad src -f /etc/hosts\n    http-request deny if bad\n", "-f"),
        ] {
            seq += 1;
            let bad = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9001)], extra));
            let (st, v) = apply(&pod, &request((1, seq), Some(p1), Mode::Reload, &bad, |_| true, vec![])).await;
            assert_eq!(st, 422, "{label} {directive}: {v}");
            let reason = v["reason"].as_str().unwrap();
            assert!(reason.contains(&format!("line {extra_line}")) && reason.contains(directive), "{label}: {v}");
        }
        // A socket outside the socket dir.
        seq += 1;
        let sock = cfg(pod.health_bind(), fe, &[("s1", 9001)], "")
            .replace("    stats timeout 30s\n", "    stats timeout 30s\n    stats socket /tmp/haptic-evil.sock\n");
        let (st, v) = apply(&pod, &request((1, seq), Some(p1), Mode::Reload, &only_cfg(&sock), |_| true, vec![])).await;
        assert_eq!(st, 422, "{label}: {v}");
        assert!(v["reason"].as_str().unwrap().contains("stats socket"), "{label}: {v}");
        // No `default-path config`: refused with a clear reason.
        seq += 1;
        let nodp = cfg(pod.health_bind(), fe, &[("s1", 9001)], "").replace("    default-path config\n", "");
        let (st, v) = apply(&pod, &request((1, seq), Some(p1), Mode::Reload, &only_cfg(&nodp), |_| true, vec![])).await;
        assert_eq!(st, 422, "{label}: {v}");
        assert!(v["reason"].as_str().unwrap().contains("default-path config"), "{label}: {v}");

        let s = state(&pod, true).await;
        assert_eq!(s.applied.unwrap().plan_id, p1, "{label}: nothing changed");
        assert_eq!(s.files, entries(&good), "{label}");
        assert_eq!(master_reloads(&pod).await, reloads, "{label}: no reload");
        println!("{label}: paths outside the tree refused");
    }
}
