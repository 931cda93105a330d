//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: a plan that adds a backend (a plain
//! section after the named `defaults` it inherits from) and the map entry that routes to it.
//! On 3.4 it lands at runtime through `/v1/apply` (`backend.add`: same worker, no reload), the
//! host is served by the new backend, the tree on disk holds the section, and a later reload
//! of the tree (a cold load of the file) serves it the same. Before 3.4 the agent does not
//! advertise `backend.add`, so the same runtime claim lands as a checked reload and the host is
//! served all the same.

mod common;
use haptic_e2e::on_each_version;

use std::net::SocketAddr;

use common::*;
use haptic_e2e::net::http_request;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::HaproxyBin;
use haptic_haproxy::claim::diff_cfg;
use haptic_protocol::{Mode, Op, OpKind, RelPath};
use serde_json::json;

const MAP: &str = "maps/hosts.map";

/// A config routing by Host through `maps/hosts.map`, with `backends` (name, server port) after
/// a `defaults haptic` section, and the map's entries (host, backend).
fn files(health: &str, fe: u16, backends: &[(&str, u16)], hosts: &[(&str, &str)], extra: &str) -> Files {
    let mut cfg = format!(
        "global\n    default-path config\n    stats timeout 30s\n\n\
         defaults haptic\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\n\
         frontend health\n    bind {health}\n\
         \x20   http-request return status 200 content-type text/plain string \"ok\" if {{ path /healthz }}\n\
         \x20   http-request return status 200 content-type text/plain string \"ready\" if {{ path /ready }}\n\n\
         frontend fe_main\n    bind 127.0.0.1:{fe}\n{extra}\
         \x20   http-request set-var(txn.be) req.hdr(host),lower,map({MAP},be_none)\n\
         \x20   use_backend %[var(txn.be)]\n    default_backend be_none\n\n\
         backend be_none\n    http-request return status 404\n"
    );
    for (name, port) in backends {
        cfg.push_str(&format!(
            "\nbackend {name}\n    server SRV_1 127.0.0.1:{port}\n    server SRV_2 127.0.0.1:1 disabled\n"
        ));
    }
    let map: String = hosts.iter().map(|(h, b)| format!("{h} {b}\n")).collect();
    let mut f = only_cfg(&cfg);
    f.insert(MAP.to_string(), map.into_bytes());
    f
}

/// The batch the controller's diff sends from `old` to `new`: the `backend.add` ops, then the map.
fn backend_batch(old: &Files, new: &Files) -> Vec<Op> {
    let text = |f: &Files| String::from_utf8(f["haproxy.cfg"].clone()).unwrap();
    let d = diff_cfg(&text(old), &text(new));
    assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
    let mut batch = d.backend_ops();
    batch.push(Op::MapLoad { path: RelPath::new(MAP).unwrap() });
    batch
}

/// One GET of `/` with `Host: host` → (status, body).
async fn get_host(fe: u16, host: &str) -> (u16, String) {
    let addr = SocketAddr::from(([127, 0, 0, 1], fe));
    http_request(addr, &format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"))
        .await
        .unwrap_or((0, String::new()))
}

on_each_version!(a_new_backend_lands_at_runtime_on_3_4_and_by_reload_before);
async fn a_new_backend_lands_at_runtime_on_3_4_and_by_reload_before(bin: HaproxyBin) {
    let label = bin.label();
    let adds_backends = bin.version >= (3, 4, 0);
    let pod = pod(&bin).await;
    let fe = port();
    let (a, b) = (backend("A").await, backend("B").await);
    let v1 = files(pod.health_bind(), fe, &[("be_a", a.port)], &[("a.example", "be_a")], "");
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    assert_eq!(get_host(fe, "a.example").await, (200, "A".into()), "{label}");
    assert_eq!(get_host(fe, "b.example").await.0, 404, "{label}");
    let (w0, m0) = (worker(&pod).await, master_reloads(&pod).await);

    // A second Service: a backend section and its map entry, as the controller's diff sends it.
    let hosts = [("a.example", "be_a"), ("b.example", "be_b")];
    let v2 = files(pod.health_bind(), fe, &[("be_a", a.port), ("be_b", b.port)], &hosts, "");
    let batch = backend_batch(&v1, &v2);
    assert_eq!(batch.iter().filter_map(Op::kind).collect::<Vec<_>>(), [OpKind::BackendAdd, OpKind::MapLoad]);
    let ack = apply_ok(&pod, &request((1, 2), Some(pid(&v1)), Mode::Runtime, &v2, |_| true, vec![batch])).await;
    assert_eq!(ack["running"], json!(pid(&v2)), "{label}: {ack}");
    if adds_backends {
        assert_eq!(ack["mode"], "runtime", "{label}: {ack}\n{}", pod.agent_log());
        assert_eq!(get_host(fe, "b.example").await, (200, "B".into()), "{label}");
        assert_eq!((worker(&pod).await, master_reloads(&pod).await), (w0, m0), "{label}: backend.add reloaded");
        let listed = pod.haproxy().worker_cmd("show backend").await.unwrap();
        assert!(listed.lines().any(|l| l == "be_b"), "{label}: {listed}");
        let servers = pod.haproxy().worker_cmd("show servers state be_b").await.unwrap();
        // SRV_1 ready (admin state 0), SRV_2 parked in maintenance (the config's `disabled`).
        let mut admin: Vec<(&str, &str)> = servers
            .lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w.get(1) == Some(&"be_b")).then(|| Some((*w.get(3)?, *w.get(6)?))).flatten()
            })
            .collect();
        admin.sort();
        assert_eq!(admin, [("SRV_1", "0"), ("SRV_2", "1")], "{label}: {servers}");
    } else {
        assert_eq!(ack["mode"], "reload", "{label}: {ack}");
        assert!(ack["reasons"].to_string().contains("op kind backend.add is not supported here"), "{label}: {ack}");
        wait_state(&pod, "v2 runs", |s| s.running.as_ref().map(|r| r.plan_id) == Some(pid(&v2))).await;
        assert_eq!(get_host(fe, "b.example").await, (200, "B".into()), "{label}");
        assert_ne!(worker(&pod).await, w0, "{label}: the checked reload ran");
    }
    let on_disk = std::fs::read_to_string(live(&pod, "haproxy.cfg")).unwrap();
    assert!(on_disk.contains("\nbackend be_b\n"), "{label}: {on_disk}");
    assert_eq!(state(&pod, true).await.files, state(&pod, false).await.files, "{label}: the index matches the disk");

    // A reload of the tree: the section in the file gives the same backend.
    let v3 = files(pod.health_bind(), fe, &[("be_a", a.port), ("be_b", b.port)], &hosts, "    timeout client 6s\n");
    let ack = apply_ok(&pod, &request((1, 3), Some(pid(&v2)), Mode::Reload, &v3, |_| true, vec![])).await;
    assert_eq!(ack["mode"], "reload", "{label}: {ack}");
    wait_state(&pod, "v3 runs", |s| s.running.as_ref().map(|r| r.plan_id) == Some(pid(&v3))).await;
    assert_eq!(get_host(fe, "b.example").await, (200, "B".into()), "{label}");
    assert_eq!(get_host(fe, "a.example").await, (200, "A".into()), "{label}");
    println!("{label}: a new backend landed {}", if adds_backends { "at runtime" } else { "by a checked reload" });
}

/// Kill trials per version of [`kill_9_during_backend_adds_loses_nothing`].
const KILL_TRIALS: u16 = 8;

on_each_version!(kill_9_during_backend_adds_loses_nothing);
/// `kill -9` of the agent at random moments during runtime applies that add a backend (on 3.4
/// `backend.add`, before it a checked reload): after each restart the agent converges (running
/// == applied, by a reload from the tree when the ops did not all run), the applied plan is the
/// previous or the new one, and every host its map names is served by its backend.
async fn kill_9_during_backend_adds_loses_nothing(bin: HaproxyBin) {
    let label = bin.label();
    let mut pod = pod(&bin).await;
    let fe = port();
    let mut servers = Vec::new();
    for i in 0..=KILL_TRIALS + 1 {
        servers.push(backend(&format!("S{i}")).await);
    }
    let mut backends = vec![("be_0".to_string(), servers[0].port)];
    let mut hosts = vec![("h0.example".to_string(), "be_0".to_string())];
    let health = pod.health_bind().to_string();
    let make = |backends: &[(String, u16)], hosts: &[(String, String)]| {
        let b: Vec<(&str, u16)> = backends.iter().map(|(n, p)| (n.as_str(), *p)).collect();
        let h: Vec<(&str, &str)> = hosts.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        files(&health, fe, &b, &h, "")
    };
    let mut cur = make(&backends, &hosts);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &cur, |_| true, vec![])).await;
    // Trial 0 is not killed: it times one such apply (not asserted: it only scales the delays).
    let mut span_ms = 1;
    let (mut landed_new, mut kept_prev) = (0u32, 0u32);
    let mut rng = rand::rng();
    for trial in 1..=KILL_TRIALS + 1 {
        let name = format!("be_{trial}");
        let mut nb = backends.clone();
        nb.push((name.clone(), servers[usize::from(trial)].port));
        let mut nh = hosts.clone();
        nh.push((format!("h{trial}.example"), name));
        let next = make(&nb, &nh);
        let batch = backend_batch(&cur, &next);
        let req = request((1, 1 + u64::from(trial)), Some(pid(&cur)), Mode::Runtime, &next, |_| true, vec![batch]);
        if trial == 1 {
            let t0 = std::time::Instant::now();
            apply_ok(&pod, &req).await;
            span_ms = (t0.elapsed().as_millis() as u64).max(1) * 3 / 2;
            wait_state(&pod, "trial 0 runs", |s| s.running.as_ref().map(|r| r.plan_id) == Some(pid(&next))).await;
            (backends, hosts, cur) = (nb, nh, next);
            continue;
        }
        let client = pod.client();
        let body = req.to_string();
        let inflight = tokio::spawn(async move { client.post_json("/v1/apply", &body).await });
        let delay = rand::RngExt::random_range(&mut rng, 0..=span_ms);
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        pod.kill_agent_9();
        let _ = inflight.await;
        pod.restart_agent().await.unwrap_or_else(|e| panic!("{label} trial {trial}: restart: {e}"));
        let s = wait_state(&pod, "running == applied after the restart", |s| {
            s.applied.is_some() && s.applied.as_ref().map(|a| a.plan_id) == s.running.as_ref().map(|r| r.plan_id)
        })
        .await;
        let applied = s.applied.map(|a| a.plan_id);
        if applied == Some(pid(&next)) {
            landed_new += 1;
            (backends, hosts, cur) = (nb, nh, next);
        } else {
            assert_eq!(applied, Some(pid(&cur)), "{label} trial {trial} (kill after {delay} ms)");
            kept_prev += 1;
        }
        for (host, backend) in &hosts {
            let got = get_host(fe, host).await;
            assert_eq!(
                got,
                (200, backend.replace("be_", "S")),
                "{label} trial {trial} (kill after {delay} ms): {host}\n{}",
                pod.agent_log()
            );
        }
    }
    println!("{label}: {KILL_TRIALS} kill -9 trials during backend adds: {landed_new} landed, {kept_prev} kept the previous plan");
}

/// On HAProxy 3.4 with `--runtime-backends false`: the agent leaves `backend.add` out of its
/// capabilities, and the same runtime claim lands as a checked reload that serves the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_backends_off_reloads_on_3_4() {
    let bin = haptic_e2e::haproxy_bin(3, 4);
    let opts = PodOpts { extra_args: vec!["--runtime-backends".into(), "false".into()], ..PodOpts::default() };
    let pod = pod_with(&bin, opts).await;
    let caps = state(&pod, false).await.capabilities;
    assert!(caps.supports(OpKind::ServerAdd) && !caps.supports(OpKind::BackendAdd), "{caps:?}");
    let fe = port();
    let (a, b) = (backend("A").await, backend("B").await);
    let v1 = files(pod.health_bind(), fe, &[("be_a", a.port)], &[("a.example", "be_a")], "");
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    let hosts = [("a.example", "be_a"), ("b.example", "be_b")];
    let v2 = files(pod.health_bind(), fe, &[("be_a", a.port), ("be_b", b.port)], &hosts, "");
    let batch = backend_batch(&v1, &v2);
    let ack = apply_ok(&pod, &request((1, 2), Some(pid(&v1)), Mode::Runtime, &v2, |_| true, vec![batch])).await;
    assert_eq!(ack["mode"], "reload", "{ack}");
    assert!(ack["reasons"].to_string().contains("op kind backend.add is not supported here"), "{ack}");
    wait_state(&pod, "v2 runs", |s| s.running.as_ref().map(|r| r.plan_id) == Some(pid(&v2))).await;
    assert_eq!(get_host(fe, "b.example").await, (200, "B".into()));
}

/// `files` with a second, named `defaults` section before the backends whose HTTP rule sets
/// the server timeout from `maps/timeouts.map` by Host (as the render's `defaults
/// haptic_backends` reads a route's timeout from a map), and that map's entries.
fn files_with_backend_rules(
    health: &str,
    fe: u16,
    backends: &[(&str, u16)],
    hosts: &[(&str, &str)],
    timeouts: &str,
) -> Files {
    let mut f = files(health, fe, backends, hosts, "");
    let cfg = String::from_utf8(f["haproxy.cfg"].clone()).unwrap();
    let defaults = "\ndefaults haptic_backends\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    \
                    timeout server 5s\n    http-request set-timeout server req.hdr(host),map(maps/timeouts.map) \
                    if { req.hdr(host),map(maps/timeouts.map) -m found }\n\nbackend be_none\n";
    let cfg = cfg.replacen("\nbackend be_none\n", defaults, 1);
    f.insert("haproxy.cfg".into(), cfg.into_bytes());
    f.insert("maps/timeouts.map".into(), timeouts.as_bytes().to_vec());
    f
}

/// On HAProxy 3.4: a backend added at runtime from a `defaults` section holding an HTTP rule
/// runs that rule, as the same section loaded cold from the file does: the map's 300 ms server
/// timeout answers 504 for a backend that never answers, where the section's own timeout is 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_added_at_runtime_runs_its_defaults_rules_on_3_4() {
    let bin = haptic_e2e::haproxy_bin(3, 4);
    let pod = pod(&bin).await;
    let fe = port();
    let a = backend("A").await;
    // Takes connections into its backlog and never answers.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_port = hung.local_addr().unwrap().port();
    let v1 = files_with_backend_rules(pod.health_bind(), fe, &[("be_a", a.port)], &[("a.example", "be_a")], "");
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    let (w0, m0) = (worker(&pod).await, master_reloads(&pod).await);

    let hosts = [("a.example", "be_a"), ("slow.example", "be_slow")];
    let backends = [("be_a", a.port), ("be_slow", hung_port)];
    let v2 = files_with_backend_rules(pod.health_bind(), fe, &backends, &hosts, "slow.example 300\n");
    let mut batch = backend_batch(&v1, &v2);
    assert_eq!(d_defaults(&batch), ["haptic_backends"]);
    batch.insert(0, Op::MapLoad { path: RelPath::new("maps/timeouts.map").unwrap() });
    let ack = apply_ok(&pod, &request((1, 2), Some(pid(&v1)), Mode::Runtime, &v2, |_| true, vec![batch])).await;
    assert_eq!(ack["mode"], "runtime", "{ack}\n{}", pod.agent_log());
    assert_eq!((worker(&pod).await, master_reloads(&pod).await), (w0, m0), "backend.add reloaded");
    let (code, _) = tokio::time::timeout(std::time::Duration::from_secs(3), get_host(fe, "slow.example"))
        .await
        .expect("no answer within 3 s: the map's 300 ms timeout did not apply");
    assert_eq!(code, 504);
    assert_eq!(get_host(fe, "a.example").await, (200, "A".into()));
    drop(hung);
}

/// The `defaults` each `backend.add` of `batch` names.
fn d_defaults(batch: &[Op]) -> Vec<&str> {
    batch
        .iter()
        .filter_map(|o| match o {
            Op::BackendAdd(b) => Some(b.defaults.as_str()),
            _ => None,
        })
        .collect()
}

/// `files` with a frontend that speaks only HTTP/2 in clear (`proto h2`) on `h2`, answering
/// `H2`, and the backends `extra` (each `(name, server line parameters)`, one server to it).
fn files_with_h2_upstream(health: &str, fe: u16, h2: u16, hosts: &[(&str, &str)], extra: &[(&str, &str)]) -> Files {
    let mut f = files(health, fe, &[], hosts, "");
    let mut cfg = String::from_utf8(f["haproxy.cfg"].clone()).unwrap();
    let upstream = format!(
        "\nfrontend fe_h2only\n    bind 127.0.0.1:{h2} proto h2\n\
         \x20   http-request return status 200 content-type text/plain string \"H2\"\n\nbackend be_none\n"
    );
    cfg = cfg.replacen("\nbackend be_none\n", &upstream, 1);
    for (name, params) in extra {
        cfg.push_str(&format!("\nbackend {name}\n    server SRV_1 127.0.0.1:{h2}{params}\n"));
    }
    f.insert("haproxy.cfg".into(), cfg.into_bytes());
    f
}

/// On HAProxy 3.4: a backend whose server speaks HTTP/2 in clear (`proto h2`, as the render
/// writes it for an h2c or gRPC backend) is added at runtime with no reload, and its server
/// really speaks HTTP/2: an upstream that takes only HTTP/2 answers through it, where the same
/// server without `proto h2` (added in the same batch) gets no 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_of_h2_servers_is_added_at_runtime_on_3_4() {
    let bin = haptic_e2e::haproxy_bin(3, 4);
    let pod = pod(&bin).await;
    let (fe, h2) = (port(), port());
    let v1 = files_with_h2_upstream(pod.health_bind(), fe, h2, &[], &[]);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;
    let (w0, m0) = (worker(&pod).await, master_reloads(&pod).await);

    let hosts = [("h2.example", "be_h2"), ("h1.example", "be_h1")];
    let v2 = files_with_h2_upstream(pod.health_bind(), fe, h2, &hosts, &[("be_h2", " proto h2"), ("be_h1", "")]);
    let batch = backend_batch(&v1, &v2);
    assert_eq!(d_defaults(&batch), ["haptic", "haptic"]);
    let ack = apply_ok(&pod, &request((1, 2), Some(pid(&v1)), Mode::Runtime, &v2, |_| true, vec![batch])).await;
    assert_eq!(ack["mode"], "runtime", "{ack}\n{}", pod.agent_log());
    assert_eq!((worker(&pod).await, master_reloads(&pod).await), (w0, m0), "backend.add reloaded");
    assert_eq!(get_host(fe, "h2.example").await, (200, "H2".into()));
    assert_ne!(get_host(fe, "h1.example").await.0, 200, "an HTTP/1 server got 200 from an HTTP/2-only upstream");
}
