//! On HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: bad input → 400 / 401 / 413 (and a planted symlink
//! → 409 missing_parts), with no file change and no reload.

mod common;
use haptic_e2e::on_each_version;

use common::*;
use haptic_e2e::pod::{AgentClient, PodOpts};
use haptic_e2e::HaproxyBin;
use haptic_protocol::{Digest, Mode};
use serde_json::{json, Value};

/// An empty password (or user) in the credentials file is refused at start, with a clear message.
#[test]
fn empty_password_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for line in ["haptic:", ":secret", "haptic:\n"] {
        let creds = dir.path().join("creds");
        std::fs::write(&creds, line).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_haptic-agent"))
            .args(["run", "--listen", "127.0.0.1:0", "--master-socket", "/nonexistent.sock"])
            .args(["--haproxy-bin", "/usr/sbin/haproxy", "--root"])
            .arg(dir.path().join("root"))
            .arg("--credentials-file")
            .arg(&creds)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{line:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("must not be empty"), "{line:?}: {err}");
    }
}

on_each_version!(bad_input_changes_nothing);
#[allow(clippy::too_many_lines)] // one scenario, each bad input in turn
async fn bad_input_changes_nothing(bin: HaproxyBin) {
    let label = bin.label();
    let pod = pod_with(&bin, PodOpts { max_body: Some("64KiB".into()), ..Default::default() }).await;
    let fe = port();
    let mut files = only_cfg(&cfg(pod.health_bind(), fe, &[("s1", 9)], ""));
    files.insert("maps/a.map".into(), b"k v\n".to_vec());
    let p1 = pid(&files);
    apply_ok(&pod, &request((1, 1), None, Mode::Reload, &files, |_| true, vec![])).await;
    let before = state(&pod, true).await;
    let reloads = master_reloads(&pod).await;
    let mut seq = 2;
    let mut next = || {
        seq += 1;
        seq
    };
    let good = |seq: u64| request((1, seq), Some(p1), Mode::Reload, &files, |_| true, vec![]);
    let with_path = |seq: u64, path: &str| {
        let mut v = good(seq);
        v["files"][0]["path"] = json!(path);
        v
    };

    let mut cases: Vec<(&str, String)> = Vec::new();
    for bad in [
        "../x".to_string(),
        "/etc/passwd".into(),
        "a/./b".into(),
        "a//b".into(),
        "a\u{0}b".into(),
        "a".repeat(256),
        format!("{}/x", ["abcdefghij"; 110].join("/")),
        "a/b/c/d/e/f/g/h/i".into(),
    ] {
        cases.push(("bad path", with_path(next(), &bad).to_string()));
    }
    // A duplicate path.
    let mut dup = good(next());
    let first = dup["files"][0].clone();
    dup["files"].as_array_mut().unwrap().push(first);
    cases.push(("duplicate path", dup.to_string()));
    // A part whose digest differs.
    let mut wrong = good(next());
    wrong["parts"]["maps/a.map"] = json!({"utf8": "k X\n"});
    cases.push(("part digest", wrong.to_string()));
    // Truncated JSON.
    let full = good(next()).to_string();
    cases.push(("truncated", full[..full.len() / 2].to_string()));
    // A missing haproxy.cfg.
    let mut nocfg = files.clone();
    nocfg.remove("haproxy.cfg");
    let mut v = good(next());
    v["files"] = json!(entries(&nocfg));
    v["parts"] = json!({});
    cases.push(("no haproxy.cfg", v.to_string()));
    // plan_id not matching files.
    let mut v = good(next());
    v["plan_id"] = json!(Digest::of(b"x"));
    cases.push(("plan id", v.to_string()));

    // A file that another file needs as a directory.
    // (A plan id cannot be computed for it, so the request carries the good one.)
    let mut v = good(next());
    let clash = Files::from([("files/a".into(), b"1".to_vec()), ("files/a/b".into(), b"2".to_vec())]);
    for (e, (path, bytes)) in entries(&clash).into_iter().zip(&clash) {
        v["files"].as_array_mut().unwrap().push(json!(e));
        v["parts"][path] = json!({"utf8": String::from_utf8(bytes.clone()).unwrap()});
    }
    cases.push(("file/directory clash", v.to_string()));
    // Runtime ops whose names or addresses a CLI line cannot carry.
    for (what, op) in [
        (
            "server.add hostname",
            json!({"op": "server.add", "backend": "be_app", "server": "s2", "addr": "app.local", "port": 80, "state": "ready"}),
        ),
        (
            "server.add bad name",
            json!({"op": "server.add", "backend": "be app", "server": "s2", "addr": "127.0.0.1", "port": 80, "state": "ready"}),
        ),
        (
            "server.add port 0",
            json!({"op": "server.add", "backend": "be_app", "server": "s2", "addr": "127.0.0.1", "port": 0, "state": "ready"}),
        ),
        ("server.del bad name", json!({"op": "server.del", "backend": "be_app", "server": "s;2"})),
    ] {
        let mut v = good(next());
        v["mode"] = json!("runtime");
        v["batches"] = json!([[op]]);
        cases.push((what, v.to_string()));
    }
    // A holder over 253 bytes.
    let mut v = good(next());
    v["fence"]["holder"] = json!("h".repeat(254));
    cases.push(("long holder", v.to_string()));

    let fence_before = state(&pod, false).await.fence;
    for (what, body) in &cases {
        let (st, text) = pod.client().post_json("/v1/apply", body).await.unwrap();
        assert_eq!(st, 400, "{label} {what}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{label} {what}: {text}"));
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty() && !e.contains('\n')), "{label} {what}: {v}");
    }

    // No or wrong credentials.
    let body = good(next()).to_string();
    let anon = AgentClient { addr: pod.addr(), auth: None };
    let wrongpw = AgentClient { addr: pod.addr(), auth: Some(("haptic".into(), "nope".into())) };
    for (who, c) in [("none", &anon), ("wrong", &wrongpw)] {
        let (st, text) = c.post_json("/v1/apply", &body).await.unwrap();
        assert_eq!(st, 401, "{label} {who}: {text}");
        assert!(serde_json::from_str::<Value>(&text).unwrap()["error"].is_string());
        assert_eq!(c.get("/v1/state").await.unwrap().0, 401, "{label} {who}");
    }
    assert_eq!(anon.get("/healthz").await.unwrap().0, 200);
    assert_eq!(anon.get("/readyz").await.unwrap().0, 200);
    assert_eq!(anon.get("/metrics").await.unwrap().0, 200);

    assert_eq!(state(&pod, false).await.fence, fence_before, "{label}: a 400 does not raise the fence");

    // Every answer is JSON: 405, bad query strings, unknown /v1 paths (after auth).
    let authed = pod.client();
    for (method, path, want) in [
        ("GET", "/v1/apply", 405),
        ("DELETE", "/v1/state", 405),
        ("GET", "/v1/state?verify=maybe", 400),
        ("GET", "/v1/state?verify=1&x=2", 400),
        ("GET", "/v1/nope", 404),
        ("GET", "/v1", 404),
        ("GET", "/nope", 404),
    ] {
        let (st, text) = authed.request(method, path, None).await.unwrap();
        assert_eq!(st, want, "{label} {method} {path}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{label} {method} {path}: {text}"));
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{label} {method} {path}: {v}");
    }
    // Unknown /v1 paths say nothing without credentials.
    let (st, text) = anon.get("/v1/nope").await.unwrap();
    assert_eq!(st, 401, "{label}: {text}");
    assert!(serde_json::from_str::<Value>(&text).unwrap()["error"].is_string());

    // A body over --max-body.
    let mut big = files.clone();
    big.insert("files/big.bin".into(), vec![b'x'; 100 * 1024]);
    let (st, v) = apply(&pod, &request((1, next()), Some(p1), Mode::Reload, &big, |_| true, vec![])).await;
    assert_eq!(st, 413, "{label}: {v}");
    assert!(v["error"].is_string());

    // A symlink planted inside the tree is never followed: the file must be sent again.
    let outside = pod.root().join("outside.map");
    std::fs::write(&outside, b"k v\n").unwrap();
    std::fs::remove_file(live(&pod, "maps/a.map")).unwrap();
    std::os::unix::fs::symlink(&outside, live(&pod, "maps/a.map")).unwrap();
    let (st, v) =
        apply(&pod, &request((1, next()), Some(p1), Mode::Reload, &files, |p| p == "haproxy.cfg", vec![])).await;
    assert_eq!(st, 409, "{label}: {v}");
    assert_eq!(v["missing"], json!(["maps/a.map"]), "{label}: {v}");
    // Drift is visible: the symlink is listed as not regular, a deleted file as missing.
    let marked = |v: &Value, path: &str| -> Value {
        v["files"].as_array().unwrap().iter().find(|f| f["path"] == path).cloned().unwrap_or(Value::Null)
    };
    let (_, text) = pod.client().get("/v1/state?verify=1").await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let f = marked(&v, "maps/a.map");
    assert_eq!(f["not_regular"], true, "{label}: {v}");
    assert_eq!(f["digest"], json!(Digest::of(b"")), "{label}: a symlink is not a tree file: {v}");
    std::fs::remove_file(live(&pod, "maps/a.map")).unwrap();
    let (_, text) = pod.client().get("/v1/state?verify=1").await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(marked(&v, "maps/a.map")["missing"], true, "{label}: {v}");
    assert!(marked(&v, "haproxy.cfg").get("missing").is_none(), "{label}: {v}");
    std::fs::write(live(&pod, "maps/a.map"), b"k v\n").unwrap();

    // Nothing changed, nothing reloaded.
    let after = state(&pod, true).await;
    assert_eq!(after.files, before.files, "{label}");
    assert_eq!(after.applied.unwrap().plan_id, p1);
    assert_eq!(master_reloads(&pod).await, reloads, "{label}: no reload");
    let metrics = anon.get("/metrics").await.unwrap().1;
    assert!(metrics.contains("haptic_agent_applies_total"), "{metrics}");
    println!("{label}: bad input ok");
}
