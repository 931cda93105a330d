//! Shared helpers for the agent's integration tests: configs, apply requests, tiny HTTP
//! backends, polling. Real HAProxy, real agent binary, real HTTP on 127.0.0.1.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use haptic_e2e::pod::{Pod, PodOpts};
use haptic_e2e::{free_port, http_get, HaproxyBin};
use haptic_protocol::{plan_id, Digest, FileEntry, Mode, Op, Part, PlanId, RelPath, StateResponse};
use serde_json::{json, Value};

/// A desired tree: path → bytes.
pub type Files = BTreeMap<String, Vec<u8>>;

/// A config with the health frontend (`/ready` 200), a main frontend on `fe` and `be_app` with `servers`.
pub fn cfg(health: &str, fe: u16, servers: &[(&str, u16)], extra: &str) -> String {
    let mut s = format!(
        "global\n    default-path config\n    stats timeout 30s\n\n\
         defaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\n\
         frontend health\n    bind {health}\n\
         \x20   http-request return status 200 content-type text/plain string \"ok\" if {{ path /healthz }}\n\
         \x20   http-request return status 200 content-type text/plain string \"ready\" if {{ path /ready }}\n\n\
         frontend fe_main\n    bind 127.0.0.1:{fe}\n    default_backend be_app\n\n\
         backend be_app\n    balance roundrobin\n"
    );
    for (name, port) in servers {
        s.push_str(&format!("    server {name} 127.0.0.1:{port}\n"));
    }
    s.push_str(extra);
    s
}

/// The file entries of `files`.
pub fn entries(files: &Files) -> Vec<FileEntry> {
    files
        .iter()
        .map(|(p, b)| FileEntry { path: RelPath::new(p.clone()).unwrap(), digest: Digest::of(b), size: b.len() as u64 })
        .collect()
}

/// The plan id of `files`.
pub fn pid(files: &Files) -> PlanId {
    plan_id(&entries(files)).unwrap()
}

/// A complete apply request as JSON; `send` picks which parts are included.
pub fn request(
    fence: (u64, u64),
    baseline: Option<PlanId>,
    mode: Mode,
    files: &Files,
    send: impl Fn(&str) -> bool,
    batches: Vec<Vec<Op>>,
) -> Value {
    let parts: BTreeMap<String, Part> =
        files.iter().filter(|(p, _)| send(p)).map(|(p, b)| (p.clone(), Part::from_bytes(b))).collect();
    json!({
        "fence": {"epoch": fence.0, "seq": fence.1, "holder": "test"},
        "baseline": baseline,
        "plan_id": pid(files),
        "mode": mode,
        "reasons": ["test"],
        "files": entries(files),
        "parts": parts,
        "batches": batches,
        "blob": {"test": true},
    })
}

/// Files with just `haproxy.cfg`.
pub fn only_cfg(text: &str) -> Files {
    BTreeMap::from([("haproxy.cfg".to_string(), text.as_bytes().to_vec())])
}

/// POSTs `/v1/apply` → (status, JSON body).
pub async fn apply(pod: &Pod, req: &Value) -> (u16, Value) {
    let (st, body) = pod.client().post_json("/v1/apply", &req.to_string()).await.expect("apply request");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("non-JSON apply answer {st}: {body}"));
    (st, v)
}

/// Applies and asserts a 200 ACK.
pub async fn apply_ok(pod: &Pod, req: &Value) -> Value {
    let (st, v) = apply(pod, req).await;
    assert_eq!(st, 200, "apply refused: {v}\n--- agent log ---\n{}", pod.agent_log());
    v
}

/// `GET /v1/state[?verify=1]`.
pub async fn state(pod: &Pod, verify: bool) -> StateResponse {
    let path = if verify { "/v1/state?verify=1" } else { "/v1/state" };
    let (st, body) = pod.client().get(path).await.expect("state request");
    assert_eq!(st, 200, "state: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("bad state {e}: {body}"))
}

/// Polls state until `f` holds, or panics after 30 s.
pub async fn wait_state(pod: &Pod, what: &str, f: impl Fn(&StateResponse) -> bool) -> StateResponse {
    let f = &f;
    eventually(what, Duration::from_secs(30), || async move {
        let s = state(pod, false).await;
        if f(&s) {
            Ok(s)
        } else {
            Err(format!("state {s:?}\n{}", pod.agent_log()))
        }
    })
    .await
}

/// The health address of the pod's bootstrap / test configs.
pub fn health(pod: &Pod) -> SocketAddr {
    pod.health_bind().parse().unwrap()
}

/// A tiny HTTP backend on 127.0.0.1 answering `200 <name>` to every request.
pub type Backend = haptic_e2e::net::Responder;

/// Starts a [`Backend`].
pub async fn backend(name: &str) -> Backend {
    Backend::start(name).await
}

/// Polls `GET path` on `addr` until it answers 200 with `body` (30 s).
pub async fn wait_body(addr: SocketAddr, path: &str, body: &str) {
    haptic_e2e::wait_http_body(addr, path, body, Duration::from_secs(30)).await;
}

/// One GET through HAProxy.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_get(addr, path).await.unwrap_or((0, String::new()))
}

/// Starts a pod with default options.
pub async fn pod(bin: &HaproxyBin) -> Pod {
    pod_with(bin, PodOpts::default()).await
}

/// Makes the pod harness run the agent binary Cargo built for these tests, never a possibly
/// stale sibling binary.
pub fn use_this_agent() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("HAPTIC_AGENT_BIN", env!("CARGO_BIN_EXE_haptic-agent")));
}

/// Starts a pod.
pub async fn pod_with(bin: &HaproxyBin, opts: PodOpts) -> Pod {
    use_this_agent();
    Pod::start(bin, opts).await.unwrap_or_else(|e| panic!("{}: pod did not start: {e}", bin.label()))
}

/// The master's reload counter.
pub async fn master_reloads(pod: &Pod) -> u32 {
    pod.haproxy().show_proc().await.unwrap().master_reloads()
}

/// The current worker pid.
pub async fn worker(pod: &Pod) -> u32 {
    pod.haproxy().worker_pid().await.unwrap()
}

/// The number of directories under `ROOT/.trees`.
pub fn tree_count(pod: &Pod) -> usize {
    std::fs::read_dir(pod.root().join(".trees")).map(|d| d.count()).unwrap_or(0)
}

/// A fresh free port for frontends.
pub fn port() -> u16 {
    free_port()
}

/// `ROOT/current/<path>`.
pub fn live(pod: &Pod, path: &str) -> std::path::PathBuf {
    pod.root().join("current").join(path)
}

/// A wrapper of the real HAProxy that, while `dir/gate` exists, holds every `-c` run until a line
/// is written to `dir/fifo`. Everything else runs the real binary at once.
/// Opens the gate of [`gated`] for one held `haproxy -c` (blocks until one reads).
pub fn release_one(dir: &std::path::Path) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new().write(true).open(dir.join("fifo")).unwrap();
    f.write_all(b"go\n").unwrap();
}

/// A pod running the [`gated`] wrapper of `bin`: its contained `haproxy -c` may run the real
/// binary, from `bin`'s directory.
pub async fn gated_pod(bin: &HaproxyBin, dir: &std::path::Path) -> Pod {
    let real_dir = bin.path.parent().unwrap().display().to_string();
    let opts = PodOpts { extra_args: vec![format!("--check-exec-path={real_dir}")], ..Default::default() };
    pod_with(&gated(bin, dir), opts).await
}

pub fn gated(bin: &HaproxyBin, dir: &std::path::Path) -> HaproxyBin {
    let script = dir.join("haproxy-gated");
    let text = format!(
        "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = \"-c\" ] && [ -e '{d}/gate' ]; then read _ < '{d}/fifo'; break; fi\ndone\nexec '{real}' \"$@\"\n",
        d = dir.display(),
        real = bin.path.display()
    );
    std::fs::write(&script, text).unwrap();
    let mode = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
    std::fs::set_permissions(&script, mode).unwrap();
    nix::unistd::mkfifo(&dir.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    HaproxyBin { path: script, ..bin.clone() }
}

/// A CA and a server certificate for 127.0.0.1 signed by it: `ca.pem`, `agent.key`, `agent.pem`.
pub fn make_ca(dir: &std::path::Path) {
    haptic_e2e::tls::make_ca(dir, "agent");
}

pub use haptic_e2e::wait::eventually;
