//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: the agent's HTTP resources are bounded. Slow headers
//! and slow bodies are cut by timeouts, idle connections beyond `--max-connections` never pile up
//! file descriptors, a declared `Content-Length` over `--max-body` gets its 413 before any body
//! byte is sent, and only one apply runs with one waiting (the rest: 429, `Retry-After`, JSON).

mod common;
use haptic_e2e::on_each_version;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use haptic_e2e::pod::{Pod, PodOpts};
use haptic_e2e::HaproxyBin;
use haptic_protocol::Mode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const DEADLINE: Duration = Duration::from_secs(30);

fn auth(pod: &Pod) -> String {
    let (u, p) = pod.credentials();
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}")))
}

/// Reads until EOF (or an error) within [`DEADLINE`]; returns what arrived. Panics when the
/// server keeps the connection open past the deadline.
async fn read_until_closed(s: &mut TcpStream, what: &str) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut chunk)).await {
            Err(_) => panic!("{what}: the agent kept the connection open; got {:?}", String::from_utf8_lossy(&buf)),
            Ok(Ok(0)) | Ok(Err(_)) => return String::from_utf8_lossy(&buf).into_owned(),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Reads one response head and body (up to the end of the JSON) within [`DEADLINE`].
async fn read_response(s: &mut TcpStream, what: &str) -> (u16, String, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + DEADLINE;
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head.lines().find_map(|l| {
                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap())
            });
            if len.is_some_and(|n| body.len() >= n) {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                return (status, head.to_string(), body.to_string());
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut chunk)).await {
            Err(_) => panic!("{what}: no answer; got {text:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => panic!("{what}: closed without an answer; got {text:?}"),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

on_each_version!(http_resources_are_bounded);
async fn http_resources_are_bounded(bin: HaproxyBin) {
    let label = bin.label();
    let opts = PodOpts {
        max_body: Some("1MiB".into()),
        extra_args: ["--header-timeout=1s", "--body-timeout=1s", "--max-connections=8"].map(String::from).to_vec(),
        ..Default::default()
    };
    let pod = pod_with(&bin, opts).await;
    let addr = pod.addr();

    // Headers sent halfway, then nothing: the connection is closed.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    read_until_closed(&mut s, &format!("{label} slow headers")).await;

    // An idle connection is closed too.
    let mut s = TcpStream::connect(addr).await.unwrap();
    read_until_closed(&mut s, &format!("{label} idle connection")).await;

    // A body that stops arriving: 408, JSON.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/apply HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"fence\"",
        auth(&pod)
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let (st, _, body) = read_response(&mut s, &format!("{label} slow body")).await;
    assert_eq!(st, 408, "{label}: {body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string(), "{label}: {body}");

    // A declared body over --max-body: 413 before a byte of it is sent.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/apply HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        auth(&pod),
        300u64 << 20
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let (st, _, body) = read_response(&mut s, &format!("{label} declared too large")).await;
    assert_eq!(st, 413, "{label}: {body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string(), "{label}: {body}");

    // 40 idle connections: the agent holds at most --max-connections of them, and serves
    // again once its idle ones are closed.
    let agent = pod.agent_pid().unwrap();
    let base = open_fds(agent);
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut most = 0;
    for s in idle.iter_mut() {
        // Each one is either closed at once (over the cap) or later (idle timeout).
        let _ = s.write_all(b"G").await;
        most = most.max(open_fds(agent));
    }
    assert!(most <= base + 8 + 2, "{label}: {most} fds open (base {base}, cap 8)");
    for s in idle.iter_mut() {
        read_until_closed(s, &format!("{label} idle flood")).await;
    }
    drop(idle);
    eventually(&format!("{label}: /healthz answering again"), DEADLINE, || async {
        match pod.client().get("/healthz").await {
            Ok((200, _)) => Ok(()),
            got => Err(format!("{got:?}")),
        }
    })
    .await;
    println!("{label}: timeouts, connection cap and early 413 ok");
}

on_each_version!(a_stalled_body_frees_its_connection_a_slow_one_lands);
/// A body that stops arriving is answered 408 and its connection closed after
/// `--body-stall-timeout`, long before `--body-timeout`; a body that keeps arriving, slower in
/// total than the stall bound, still lands.
async fn a_stalled_body_frees_its_connection_a_slow_one_lands(bin: HaproxyBin) {
    let label = bin.label();
    let opts = PodOpts {
        extra_args: ["--body-stall-timeout=2s", "--body-timeout=600s"].map(String::from).to_vec(),
        ..Default::default()
    };
    let pod = pod_with(&bin, opts).await;

    // Headers and part of the body, then nothing: closed (the deadline of `read_until_closed`,
    // 30 s, is far below the 600 s body timeout).
    let mut s = TcpStream::connect(pod.addr()).await.unwrap();
    let head = format!(
        "POST /v1/apply HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"fence\"",
        auth(&pod)
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let got = read_until_closed(&mut s, &format!("{label} stalled body")).await;
    assert!(got.starts_with("HTTP/1.1 408"), "{label}: {got}");

    // The same apply sent in 12 pieces 250 ms apart (3 s in all, over the 2 s stall bound).
    let fe = port();
    let files = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9001)], ""));
    let body = request((1, 1), None, Mode::Reload, &files, |_| true, vec![]).to_string();
    let mut s = TcpStream::connect(pod.addr()).await.unwrap();
    let head = format!(
        "POST /v1/apply HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        auth(&pod),
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let piece = body.len().div_ceil(12);
    for chunk in body.as_bytes().chunks(piece) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        s.write_all(chunk).await.unwrap();
    }
    let (st, _, answer) = read_response(&mut s, &format!("{label} slow body")).await;
    assert_eq!(st, 200, "{label}: {answer}");
    println!("{label}: a stalled body is cut after the stall bound, a slow one lands");
}

on_each_version!(one_apply_runs_one_waits_the_rest_get_429);
async fn one_apply_runs_one_waits_the_rest_get_429(bin: HaproxyBin) {
    let label = bin.label();
    let dir = tempfile::tempdir().unwrap();
    let pod = gated_pod(&bin, dir.path()).await;
    let fe = port();
    let v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9001)], ""));
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;

    // Apply 2 is held in its `haproxy -c`. Of three more sent at once, one is admitted (it
    // waits for the apply lock) and two are told to retry.
    std::fs::write(dir.path().join("gate"), b"").unwrap();
    let send = |seq: u64| {
        let files = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9000 + seq as u16)], ""));
        let body = request((1, seq), None, Mode::Reload, &files, |_| true, vec![]).to_string();
        let (addr, auth) = (pod.addr(), auth(&pod));
        tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "POST /v1/apply HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            read_response(&mut s, "apply").await
        })
    };
    let held = send(2);
    wait_state(&pod, "apply 2 in flight", |s| s.fence.as_ref().is_some_and(|f| f.seq == 2)).await;
    let mut more: Vec<_> = (3..6).map(send).collect();
    eventually(&format!("{label}: two of three applies refused at once"), DEADLINE, || {
        let n = more.iter().filter(|h| h.is_finished()).count();
        async move {
            if n >= 2 {
                Ok(())
            } else {
                Err(format!("{n} finished"))
            }
        }
    })
    .await;
    let (done, waiting): (Vec<_>, Vec<_>) = more.drain(..).partition(|h| h.is_finished());
    assert_eq!(waiting.len(), 1, "{label}: exactly one apply waits");
    for h in done {
        let (st, head, body) = h.await.unwrap();
        assert_eq!(st, 429, "{label}: {body}");
        assert!(head.to_ascii_lowercase().contains("retry-after: 1"), "{label}: {head}");
        assert!(serde_json::from_str::<Value>(&body).unwrap()["error"].is_string(), "{label}: {body}");
    }

    // Release the held check: both admitted applies complete.
    std::fs::remove_file(dir.path().join("gate")).unwrap();
    release_one(dir.path());
    for h in std::iter::once(held).chain(waiting) {
        let (st, _, body) = h.await.unwrap();
        assert_eq!(st, 200, "{label}: {body}");
    }
    println!("{label}: one apply running, one waiting, 429 for the rest");
}

on_each_version!(readers_answer_while_an_apply_is_held);
/// `/v1/state`, `/v1/state?verify=1`, `/healthz` and `/readyz` while an apply is held in the
/// middle of its pipeline (its `haproxy -c` waits on a FIFO, with the apply lock held): each
/// answers, within a deadline, while the apply is still held.
async fn readers_answer_while_an_apply_is_held(bin: HaproxyBin) {
    let label = bin.label();
    let dir = tempfile::tempdir().unwrap();
    let pod = gated_pod(&bin, dir.path()).await;
    let fe = port();
    let v1 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9001)], ""));
    let p1 = pid(&v1);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &v1, |_| true, vec![])).await;

    std::fs::write(dir.path().join("gate"), b"").unwrap();
    let v2 = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9002)], ""));
    let body = request((1, 2), Some(p1), Mode::Reload, &v2, |_| true, vec![]).to_string();
    let client = pod.client();
    let held = tokio::spawn(async move { client.post_json("/v1/apply", &body).await });
    // The fence is persisted under the apply lock, before staging: once it shows, the apply
    // holds the lock, and it keeps it until its gated `haproxy -c` is released below. Every
    // read here is bounded: a reader that waits behind the apply fails the test.
    eventually(&format!("{label}: the apply's fence shown"), DEADLINE, || async {
        let got = tokio::time::timeout(DEADLINE, pod.client().get("/v1/state")).await;
        let (_, text) = got.unwrap_or_else(|_| panic!("{label}: /v1/state waited behind the held apply")).unwrap();
        let s: Value = serde_json::from_str(&text).unwrap();
        if s["fence"]["seq"] == 2 {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
    for path in ["/v1/state", "/v1/state?verify=1", "/healthz", "/readyz"] {
        let got = tokio::time::timeout(DEADLINE, pod.client().get(path)).await;
        let (st, text) = got.unwrap_or_else(|_| panic!("{label}: {path} waited behind the held apply")).unwrap();
        assert_eq!(st, 200, "{label}: {path}: {text}");
        if path.starts_with("/v1/state") {
            let s: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(s["applied"]["plan_id"], serde_json::json!(p1), "{label}: {path}: {text}");
            assert_eq!(s["fence"]["seq"], 2, "{label}: the held apply's fence is visible: {text}");
        }
    }
    assert!(!held.is_finished(), "{label}: the apply must still be held while the readers answered");
    std::fs::remove_file(dir.path().join("gate")).unwrap();
    release_one(dir.path());
    let (st, text) = held.await.unwrap().unwrap();
    assert_eq!(st, 200, "{label}: {text}");
    println!("{label}: readers answered while an apply was held");
}

/// `(VmRSS, VmHWM)` of `pid` in bytes.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
            * 1024
    };
    (kib("VmRSS:"), kib("VmHWM:"))
}

/// Bytes that do not compress and are not UTF-8 (sent as base64, the heavier encoding).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out[0] = 0xff;
    out
}

on_each_version!(apply_memory_stays_near_the_largest_file);
/// A 50 MiB apply (binary files of 20, 20 and 10 MiB: 67 MiB of base64 JSON): the agent's
/// resident memory grows by at most twice the largest file, measured from `/proc` of the real
/// agent process (peak RSS after the apply, reset before it, minus the idle RSS). Seen here:
/// about 1.33 × the largest file (its base64 text, serde_json's string buffer) plus ~6 MiB.
async fn apply_memory_stays_near_the_largest_file(bin: HaproxyBin) {
    const FILE: usize = 20 << 20;
    let label = bin.label();
    let pod = pod(&bin).await;
    let agent = pod.agent_pid().unwrap();
    let fe = port();
    let cfg_text = cfg(pod.health_bind(), fe, &[("s1", 9001)], "");
    let mut small = only_cfg(&cfg_text);
    small.insert("files/warm".into(), noise(64 << 10, 7));
    let p0 = pid(&small);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &small, |_| true, vec![])).await;

    let mut big = only_cfg(&cfg_text);
    for (i, len) in [FILE, FILE, FILE / 2].into_iter().enumerate() {
        big.insert(format!("files/blob{i}"), noise(len, 11 + i as u64));
    }
    let body = request((1, 2), Some(p0), Mode::FileOnly, &big, |_| true, vec![]).to_string();
    drop(big);
    let (idle, _) = rss(agent);
    // Resets VmHWM to the current RSS (Linux ≥ 4.0), so the peak is this apply's.
    std::fs::write(format!("/proc/{agent}/clear_refs"), b"5").unwrap();
    let (st, text) = pod.client().post_json("/v1/apply", &body).await.unwrap();
    assert_eq!(st, 200, "{label}: {text}");
    let (_, peak) = rss(agent);
    let grew = peak.saturating_sub(idle);
    println!(
        "{label}: body {} MiB, idle RSS {} MiB, peak {} MiB, +{} MiB",
        body.len() >> 20,
        idle >> 20,
        peak >> 20,
        grew >> 20
    );
    assert!(grew <= 2 * FILE as u64, "{label}: RSS grew by {} MiB for a 20 MiB largest file", grew >> 20);
    assert!(
        std::fs::read_dir(pod.root().join(".incoming")).map(|d| d.count()).unwrap_or(0) == 0,
        "{label}: spool left behind"
    );
}
