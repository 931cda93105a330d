//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: paths stay inside the tree. A config that
//! makes HAProxy read a file outside the tree (absolute, or climbing out with `..`), a socket
//! outside the socket dir, or that lacks `default-path config` is refused with 422 naming the
//! directive and the line, before `haproxy -c` reads anything; nothing changes.

mod common;
use haptic_e2e::on_each_version;

use common::*;
use haptic_e2e::HaproxyBin;
use haptic_protocol::Mode;

on_each_version!(paths_outside_the_tree_are_refused);
async fn paths_outside_the_tree_are_refused(bin: HaproxyBin) {
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

on_each_version!(a_file_loaded_through_a_crt_list_is_never_file_only);
/// The same path list decides `file_only`: a certificate HAProxy loads only through a `crt-list`
/// (the config never names it) is never `file_only`.
async fn a_file_loaded_through_a_crt_list_is_never_file_only(bin: HaproxyBin) {
    let (pki1, pki2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_ca(pki1.path());
    make_ca(pki2.path());
    let pem = |d: &std::path::Path| {
        let mut b = std::fs::read(d.join("agent.pem")).unwrap();
        b.extend(std::fs::read(d.join("agent.key")).unwrap());
        b
    };
    let label = bin.label();
    let pod = pod(&bin).await;
    let fe = port();
    let tls = format!(
        "frontend fe_tls\n    bind 127.0.0.1:{}   ssl crt-list lists/l.txt\n    default_backend be_app\n",
        port()
    );
    let mut v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9001)], &tls));
    v1.insert("lists/l.txt".into(), b"certs/site.pem\n".to_vec());
    v1.insert("certs/site.pem".into(), pem(pki1.path()));
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    let mut v2 = v1.clone();
    v2.insert("certs/site.pem".into(), pem(pki2.path()));
    let ack = apply_ok(&pod, &request((1, 2), Some(pid(&v1)), Mode::FileOnly, &v2, |_| true, vec![])).await;
    assert_eq!(ack["mode"], "reload", "{label}: {ack}");
    assert!(ack["reasons"].to_string().contains("loads certs/site.pem"), "{label}: {ack}");
    println!("{label}: crt-list entry is loaded, not file_only");
}
