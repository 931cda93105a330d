//! The agent's HAProxy-facing modules (`master`, `reload`, `runtime`) against real HAProxy 2.6, 3.0,
//! 3.2 and 3.4: verified reloads (success, refused config, port conflict), and every runtime op kind with
//! its effect checked from outside (HTTP traffic, `get map`, TLS handshakes) and no reload.

mod common;
use haptic_e2e::on_each_version;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use haptic_agent::master::MasterCli;
use haptic_agent::reload::{probe, reload_verified, ReloadError};
use haptic_agent::runtime::{capabilities, run_ops};
use haptic_e2e::net::Responder;
use haptic_e2e::{assert_no_stray, free_port, http_get, Haproxy, HaproxyBin, HaproxyOpts};
use haptic_protocol::{Op, OpKind, RelPath, ServerAdd, ServerDel, ServerSet, ServerState};

const CLI_TIMEOUT: Duration = Duration::from_secs(5);
const RELOAD_TIMEOUT: Duration = Duration::from_secs(20);

/// The global and defaults sections every test config starts with.
fn head() -> String {
    "global\n    default-path config\n    stats timeout 30s\n\n\
     defaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\n"
        .to_string()
}

/// A temp dir laid out like a tree (haproxy.cfg, maps/, certs/) with HAProxy running on it.
struct Rig {
    dir: tempfile::TempDir,
    hap: Haproxy,
    cli: MasterCli,
    label: String,
    version: (u32, u32, u32),
}

impl Rig {
    async fn start(bin: &HaproxyBin, cfg: &str, files: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for (path, body) in files {
            write(dir.path(), path, body);
        }
        write(dir.path(), "haproxy.cfg", cfg);
        let hap = Haproxy::start(bin, HaproxyOpts::new(dir.path()))
            .await
            .unwrap_or_else(|e| panic!("{} failed to start: {e}", bin.label()));
        let cli = MasterCli::new(hap.master_socket(), CLI_TIMEOUT);
        Self { dir, hap, cli, label: bin.label(), version: bin.version }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// (worker pid, master reload count), to prove that nothing reloaded.
    async fn generation(&self) -> (u32, u64) {
        let p = probe(&self.cli).await.unwrap_or_else(|e| panic!("{}: probe: {e}", self.label));
        (p.worker_pid.expect("a worker"), p.reloads)
    }

    async fn worker(&self, cmd: &str) -> String {
        self.cli.worker(cmd).await.unwrap_or_else(|e| panic!("{}: `{cmd}`: {e}", self.label))
    }

    fn stop(mut self) {
        let pids = self.hap.kill();
        assert_no_stray(&pids);
    }
}

fn write(root: &Path, path: &str, body: &str) {
    let p = root.join(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, body).unwrap();
}

fn rel(p: &str) -> RelPath {
    p.parse().unwrap_or_else(|e| panic!("{p}: {e:?}"))
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A tiny HTTP responder on 127.0.0.1 answering `200 <name>` to every request: its port, and
/// the responder (it stops when dropped).
async fn responder(name: &'static str) -> (u16, Responder) {
    let r = Responder::start(name).await;
    (r.port, r)
}

/// Polls `GET /` on `port` until `want(status, body)` holds; panics with the last answer after 10 s.
async fn wait_http(port: u16, what: &str, want: impl Fn(u16, &str) -> bool) {
    wait_http_path(port, "/", what, want).await;
}

/// Polls `GET path` on `port` until `want(status, body)` holds; panics with the last answer after 10 s.
async fn wait_http_path(port: u16, path: &str, what: &str, want: impl Fn(u16, &str) -> bool) {
    let want = &want;
    common::eventually(what, Duration::from_secs(10), || async move {
        match http_get(addr(port), path).await {
            Ok((status, body)) if want(status, &body) => Ok(()),
            got => Err(format!("{got:?}")),
        }
    })
    .await;
}

/// Whether the old worker `pid` still serves (`@1 show info` answers with it) and HTTP works.
async fn assert_still_serving(rig: &Rig, pid: u32, port: u16) {
    let info = haptic_haproxy::cli::parse_show_info(&rig.worker("show info").await);
    assert_eq!(info.pid(), Some(pid), "{}: the old worker must keep serving", rig.label);
    wait_http(port, &rig.label, |s, _| s == 200).await;
}

fn reload_cfg(http: u16, extra: &str) -> String {
    format!(
        "{}frontend fe_main\n    bind 127.0.0.1:{http}\n    http-request return status 200 content-type text/plain string ok\n{extra}\n",
        head()
    )
}

on_each_version!(verified_reload_success_refusal_and_port_conflict);
async fn verified_reload_success_refusal_and_port_conflict(bin: HaproxyBin) {
    let bin = &bin;
    let http = free_port();
    let rig = Rig::start(bin, &reload_cfg(http, ""), &[]).await;
    let label = rig.label.clone();
    assert!(rig.cli.ping().await, "{label}: ping");

    // Probe: the version the binary reports, the pids the harness sees.
    let p = probe(&rig.cli).await.unwrap();
    assert_eq!(p.version, bin.version, "{label}");
    assert_eq!(p.version_string, bin.version_string, "{label}");
    assert_eq!(p.master_pid, rig.hap.master_pid(), "{label}");
    let w0 = p.worker_pid.unwrap();
    let caps = (p.version, capabilities(p.version));
    // Every op kind advertised is backed by commands HAProxy itself lists in its `help`.
    let help = rig.cli.worker("help").await.unwrap();
    for op in &capabilities(p.version).ops {
        let needs: &[&str] = match op.as_str() {
            "server.set" => &["set server"],
            "server.add" => &["add server", "enable health"],
            "server.del" => &["del server"],
            "map.replace" | "map.load" => &["prepare map", "add map", "commit map"],
            "acl.replace" => &["prepare acl", "add acl", "commit acl"],
            "cert.set" => &["set ssl cert", "commit ssl cert"],
            "cafile.set" => &["set ssl ca-file", "commit ssl ca-file"],
            "backend.add" => &["add backend", "publish backend"],
            other => panic!("{label}: no command list for advertised op {other}"),
        };
        for cmd in needs {
            assert!(help.contains(cmd), "{label}: {op} advertised but HAProxy's help has no `{cmd}`:\n{help}");
        }
    }

    // Success: a new worker answers.
    let ok = reload_verified(&rig.cli, p.version, RELOAD_TIMEOUT).await.unwrap_or_else(|e| {
        panic!("{label}: reload: {e}\n{}", rig.hap.stderr_text());
    });
    assert_eq!(ok.old_worker, Some(w0), "{label}");
    assert_ne!(ok.new_worker, w0, "{label}");
    let (w1, reloads1) = rig.generation().await;
    assert_eq!(w1, ok.new_worker, "{label}");
    if bin.has_reload_status() {
        assert!(ok.logs.contains("Loading success"), "{label}: {}", ok.logs);
    }
    wait_http(http, &label, |s, b| s == 200 && b == "ok").await;
    println!("{label}: reloaded {w0} -> {w1} in {:?}", ok.took);

    // A config HAProxy refuses: Failed with HAProxy's words; the old worker keeps serving.
    let good = std::fs::read_to_string(rig.hap.cfg_path()).unwrap();
    write(rig.path(), "haproxy.cfg", &format!("{good}\nbackend be_bad\n    balance nonsense\n"));
    match reload_verified(&rig.cli, p.version, RELOAD_TIMEOUT).await {
        Err(ReloadError::Failed { output }) => {
            if bin.has_reload_status() {
                assert!(output.contains("[ALERT]") && output.contains("balance"), "{label}: {output}");
            } else {
                assert!(output.contains("reload failed") && output.contains("haproxy -c"), "{label}: {output}");
            }
            println!("{label}: refused config -> {output}");
        }
        other => panic!("{label}: broken config: {other:?}"),
    }
    assert_still_serving(&rig, w1, http).await;

    // A bind on a port another socket holds passes `-c` but fails on reload.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_port = held.local_addr().unwrap().port();
    write(rig.path(), "haproxy.cfg", &format!("{good}\nfrontend fe_conflict\n    bind 127.0.0.1:{held_port}\n"));
    match reload_verified(&rig.cli, p.version, RELOAD_TIMEOUT).await {
        Err(ReloadError::Failed { output }) => {
            if bin.has_reload_status() {
                assert!(output.contains("[ALERT]"), "{label}: {output}");
            }
            println!("{label}: port conflict -> {output}");
        }
        other => panic!("{label}: port conflict: {other:?}"),
    }
    assert_still_serving(&rig, w1, http).await;
    drop(held);

    // Back to the good config: reloads again.
    write(rig.path(), "haproxy.cfg", &good);
    let ok = reload_verified(&rig.cli, p.version, RELOAD_TIMEOUT).await.unwrap();
    assert_eq!(ok.old_worker, Some(w1), "{label}");
    let (w2, reloads2) = rig.generation().await;
    assert_eq!(w2, ok.new_worker);
    assert_eq!(reloads2, reloads1 + 3, "{label}: three more reloads (two failed) counted by the master");
    let sock = rig.cli.clone();
    rig.stop();
    assert!(!sock.ping().await, "{label}: ping after HAProxy stopped");
    // Capabilities: every version runs every op kind but backend.add, which 3.4 runs too.
    let (v, c) = &caps;
    assert!(c.runtime_batches, "{v:?}");
    for k in OpKind::ALL {
        assert_eq!(c.supports(k), k != OpKind::BackendAdd || *v >= (3, 4, 0), "{v:?} {k}");
    }
}

on_each_version!(server_set_moves_a_slot_without_reload);
async fn server_set_moves_a_slot_without_reload(bin: HaproxyBin) {
    let (port_a, task_a) = responder("A").await;
    let (port_b, task_b) = responder("B").await;
    let bin = &bin;
    let http = free_port();
    let cfg = format!(
        "{}frontend fe_main\n    bind 127.0.0.1:{http}\n    default_backend be_app\n\n\
         backend be_app\n    server-template s 1-2 127.0.0.1:1 disabled\n",
        head()
    );
    let rig = Rig::start(bin, &cfg, &[]).await;
    let label = rig.label.clone();
    let gen0 = rig.generation().await;
    wait_http(http, &label, |s, _| s == 503).await;

    let set = |addr: Option<&str>, port: Option<u16>, weight: Option<u32>, state: Option<ServerState>| {
        Op::ServerSet(ServerSet {
            backend: "be_app".into(),
            server: "s1".into(),
            addr: addr.map(str::to_string),
            port,
            weight,
            state,
        })
    };
    // Address, port, weight and state in one op: traffic reaches A.
    let ops = [set(Some("127.0.0.1"), Some(port_a), Some(10), Some(ServerState::Ready))];
    let report = run_ops(&rig.cli, rig.version, rig.path(), &ops).await.unwrap();
    assert_eq!(report.counts.get(&OpKind::ServerSet), Some(&1), "{label}");
    wait_http(http, &label, |s, b| s == 200 && b == "A").await;
    assert!(rig.worker("get weight be_app/s1").await.starts_with("10 "), "{label}");

    // Move it to B (address and port), reweight: traffic reaches B.
    let ops = [set(Some("127.0.0.1"), Some(port_b), Some(50), None)];
    run_ops(&rig.cli, rig.version, rig.path(), &ops).await.unwrap();
    wait_http(http, &label, |s, b| s == 200 && b == "B").await;
    assert!(rig.worker("get weight be_app/s1").await.starts_with("50 "), "{label}");
    // The same address again is a success too ("no need to change" / "nothing changed").
    run_ops(&rig.cli, rig.version, rig.path(), &ops).await.unwrap();

    // Maintenance takes it out, ready brings it back; drain is accepted.
    run_ops(&rig.cli, rig.version, rig.path(), &[set(None, None, None, Some(ServerState::Maint))]).await.unwrap();
    wait_http(http, &label, |s, _| s == 503).await;
    run_ops(&rig.cli, rig.version, rig.path(), &[set(None, None, None, Some(ServerState::Drain))]).await.unwrap();
    run_ops(&rig.cli, rig.version, rig.path(), &[set(None, None, None, Some(ServerState::Ready))]).await.unwrap();
    wait_http(http, &label, |s, b| s == 200 && b == "B").await;

    // No reload happened: same worker, same master reload count.
    assert_eq!(rig.generation().await, gen0, "{label}: server.set must not reload");

    // An unknown server: OpError naming the op with HAProxy's words; the batch stops there.
    let bad = Op::ServerSet(ServerSet {
        backend: "be_app".into(),
        server: "nope".into(),
        addr: None,
        port: None,
        weight: Some(5),
        state: None,
    });
    let after = Op::ServerSet(ServerSet {
        backend: "be_app".into(),
        server: "s2".into(),
        addr: None,
        port: None,
        weight: Some(77),
        state: None,
    });
    let err = run_ops(&rig.cli, rig.version, rig.path(), &[bad, after]).await.unwrap_err();
    assert_eq!(err.op, "server.set be_app/nope", "{label}");
    assert_eq!(err.index, 0);
    assert!(err.reply.contains("No such server"), "{label}: {err}");
    assert!(rig.worker("get weight be_app/s2").await.starts_with("1 "), "{label}: the batch stopped");
    // An out-of-range weight: HAProxy's words.
    let err = run_ops(&rig.cli, rig.version, rig.path(), &[set(None, None, Some(300), None)]).await.unwrap_err();
    assert!(err.reply.contains("256"), "{label}: {err}");
    println!("{label}: unknown server -> {}", run_ops_err_text(&rig).await);

    // A following reload of a tree that says the same keeps B.
    let cfg2 = format!(
        "{}frontend fe_main\n    bind 127.0.0.1:{http}\n    default_backend be_app\n\n\
         backend be_app\n    server s1 127.0.0.1:{port_b} weight 50\n    server s2 127.0.0.1:1 disabled\n",
        head()
    );
    write(rig.path(), "haproxy.cfg", &cfg2);
    reload_verified(&rig.cli, rig.version, RELOAD_TIMEOUT).await.unwrap();
    wait_http(http, &label, |s, b| s == 200 && b == "B").await;
    rig.stop();
    drop((task_a, task_b));
}

/// The server names of `backend` in `show servers state`.
async fn server_names(rig: &Rig, backend: &str) -> Vec<String> {
    let text = rig.worker(&format!("show servers state {backend}")).await;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
        .collect()
}

on_each_version!(server_add_and_del_change_a_backend_without_reload);
async fn server_add_and_del_change_a_backend_without_reload(bin: HaproxyBin) {
    let (port_a, task_a) = responder("A").await;
    let (port_b, task_b) = responder("B").await;
    let http = free_port();
    let cfg = |servers: &str| {
        format!(
            "{}frontend fe_main\n    bind 127.0.0.1:{http}\n    default_backend be_app\n\n\
             backend be_app\n    balance roundrobin\n{servers}",
            head()
        )
    };
    let rig = Rig::start(&bin, &cfg(&format!("    server s1 127.0.0.1:{port_a}\n")), &[]).await;
    let label = rig.label.clone();
    let gen0 = rig.generation().await;
    wait_http(http, &label, |s, b| s == 200 && b == "A").await;
    let add = |server: &str, port: u16, state, params: &[&str]| ServerAdd {
        backend: "be_app".into(),
        server: server.into(),
        addr: "127.0.0.1".parse().unwrap(),
        port,
        weight: Some(10),
        state,
        params: params.iter().map(|p| p.to_string()).collect(),
    };
    let del = |server: &str| Op::ServerDel(ServerDel { backend: "be_app".into(), server: server.into() });

    // s2 takes traffic at once; s3 (checked) is added in maintenance, as `disabled` says.
    let ops = [
        Op::ServerAdd(add("s2", port_b, ServerState::Ready, &[])),
        Op::ServerAdd(add("s3", port_b, ServerState::Maint, &["check", "inter", "1s"])),
    ];
    let report = run_ops(&rig.cli, rig.version, rig.path(), &ops).await.unwrap();
    assert_eq!(report.counts.get(&OpKind::ServerAdd), Some(&2), "{label}");
    assert_eq!(server_names(&rig, "be_app").await, ["s1", "s2", "s3"], "{label}");
    wait_http(http, &label, |s, b| s == 200 && b == "B").await;
    wait_http(http, &label, |s, b| s == 200 && b == "A").await;

    // Deleting s1 (in use a moment ago): only B answers afterwards.
    run_ops(&rig.cli, rig.version, rig.path(), &[del("s1")]).await.unwrap();
    assert_eq!(server_names(&rig, "be_app").await, ["s2", "s3"], "{label}");
    for _ in 0..6 {
        assert_eq!(http_get(addr(http), "/").await.unwrap(), (200, "B".to_string()), "{label}");
    }
    assert_eq!(rig.generation().await, gen0, "{label}: server.add / server.del must not reload");

    // Bad input changes nothing. A parameter `add server` cannot take: refused before anything is
    // sent, even the good op before it.
    let before = server_names(&rig, "be_app").await;
    let bad_param = Op::ServerAdd(add("s4", port_a, ServerState::Ready, &["cookie", "c4"]));
    let good = Op::ServerAdd(add("s5", port_a, ServerState::Ready, &[]));
    let err = run_ops(&rig.cli, rig.version, rig.path(), &[good.clone(), bad_param]).await.unwrap_err();
    assert_eq!((err.index, err.command.as_str()), (1, ""), "{label}: {err}");
    assert!(err.reply.contains("\"cookie\""), "{label}: {err}");
    // An unknown backend: HAProxy's words, and the batch stops there.
    let nope = Op::ServerAdd(ServerAdd { backend: "be_nope".into(), ..add("s4", port_a, ServerState::Ready, &[]) });
    let err = run_ops(&rig.cli, rig.version, rig.path(), &[nope, good]).await.unwrap_err();
    assert_eq!((err.op.clone(), err.index), (format!("server.add be_nope/s4 127.0.0.1:{port_a}"), 0), "{label}");
    assert!(err.reply.contains("No such backend"), "{label}: {err}");
    assert!(err.command.starts_with("add server be_nope/s4"), "{label}: {err}");
    // A name already taken, and a server that does not exist.
    let err = run_ops(&rig.cli, rig.version, rig.path(), &[Op::ServerAdd(add("s2", port_a, ServerState::Ready, &[]))])
        .await
        .unwrap_err();
    assert!(err.reply.contains("Already exists"), "{label}: {err}");
    let err = run_ops(&rig.cli, rig.version, rig.path(), &[del("s9")]).await.unwrap_err();
    assert!(err.reply.contains("No such server"), "{label}: {err}");
    assert_eq!(server_names(&rig, "be_app").await, before, "{label}: bad input changed the servers");
    assert_eq!(rig.generation().await, gen0, "{label}");
    for _ in 0..4 {
        assert_eq!(http_get(addr(http), "/").await.unwrap(), (200, "B".to_string()), "{label}");
    }

    // A reload of a tree that says the same keeps the servers.
    write(
        rig.path(),
        "haproxy.cfg",
        &cfg(&format!("    server s2 127.0.0.1:{port_b} weight 10\n    server s3 127.0.0.1:{port_b} weight 10 disabled check inter 1s\n")),
    );
    reload_verified(&rig.cli, rig.version, RELOAD_TIMEOUT).await.unwrap();
    assert_eq!(server_names(&rig, "be_app").await, ["s2", "s3"], "{label}");
    wait_http(http, &label, |s, b| s == 200 && b == "B").await;
    rig.stop();
    drop((task_a, task_b));
}

async fn run_ops_err_text(rig: &Rig) -> String {
    let op = Op::ServerSet(ServerSet {
        backend: "be_nope".into(),
        server: "x".into(),
        addr: None,
        port: None,
        weight: None,
        state: Some(ServerState::Ready),
    });
    run_ops(&rig.cli, rig.version, rig.path(), &[op]).await.unwrap_err().to_string()
}

on_each_version!(map_and_acl_replace_swap_atomically_without_reload);
async fn map_and_acl_replace_swap_atomically_without_reload(bin: HaproxyBin) {
    let bin = &bin;
    let http = free_port();
    let cfg = format!(
        "{}frontend fe_main\n    bind 127.0.0.1:{http}\n\
         \x20   acl listed path -f maps/paths.acl\n\
         \x20   http-request return status 403 if listed\n\
         \x20   http-request return status 200 content-type text/plain lf-string \"%[path,map(maps/hosts.map,none)]\"\n",
        head()
    );
    // The old versions hold duplicate keys and patterns.
    let files = [("maps/hosts.map", "dup 1\ndup 2\n/old 3\n"), ("maps/paths.acl", "/x\n/x\n/y\n")];
    let rig = Rig::start(bin, &cfg, &files).await;
    let label = rig.label.clone();
    let gen0 = rig.generation().await;
    wait_http_path(http, "/old", &label, |s, b| s == 200 && b == "3").await;

    // 50,000 entries: many ≤ 12 KiB chunks, one commit.
    let entries: Vec<(String, String)> = (0..50_000).map(|i| (format!("/k{i}"), format!("v{i}"))).collect();
    let op = Op::MapReplace { path: rel("maps/hosts.map"), entries: entries.clone() };
    let report = run_ops(&rig.cli, rig.version, rig.path(), &[op]).await.unwrap();
    assert_eq!(report.counts.get(&OpKind::MapReplace), Some(&1));
    println!("{label}: map.replace 50k entries in {:?}", report.took);
    let listing = rig.worker("show map").await;
    let line = listing.lines().find(|l| l.contains("(maps/hosts.map)")).unwrap_or_else(|| panic!("{listing}"));
    assert!(line.contains("entry_cnt=50000"), "{label}: {line}");
    for k in ["/k0", "/k12345", "/k49999"] {
        let got = rig.worker(&format!("get map maps/hosts.map {k}")).await;
        let v = &k[2..];
        assert!(got.contains("found=yes") && got.contains(&format!("value=\"v{v}\"")), "{label}: {k}: {got}");
    }
    for k in ["dup", "/old"] {
        let got = rig.worker(&format!("get map maps/hosts.map {k}")).await;
        assert!(got.contains("found=no"), "{label}: old key {k} must be gone: {got}");
    }
    let (s, b) = http_get(addr(http), "/old").await.unwrap();
    assert_eq!((s, b.as_str()), (200, "none"), "{label}");
    let (s, b) = http_get(addr(http), "/k777").await.unwrap();
    assert_eq!((s, b.as_str()), (200, "v777"), "{label}");

    // Replace again with a small set that has a duplicate key: exactly the new set.
    let small = vec![("/a".to_string(), "1".to_string()), ("/a".into(), "2".into()), ("/b".into(), "x y".into())];
    let op = Op::MapReplace { path: rel("maps/hosts.map"), entries: small };
    run_ops(&rig.cli, rig.version, rig.path(), &[op]).await.unwrap();
    let listing = rig.worker("show map maps/hosts.map").await;
    let rows: Vec<String> = listing.lines().filter_map(|l| l.split_once(' ').map(|(_, kv)| kv.to_string())).collect();
    assert_eq!(rows, ["/a 1", "/a 2", "/b x y"], "{label}");
    let (s, b) = http_get(addr(http), "/b").await.unwrap();
    assert_eq!((s, b.as_str()), (200, "x y"), "{label}");

    // map.load: the entries are the map file's in the tree (the op carries none).
    std::fs::write(rig.path().join("maps/hosts.map"), "/c 3\n/c 4\n# note\n/d  x y\n").unwrap();
    let op = Op::MapLoad { path: rel("maps/hosts.map") };
    let report = run_ops(&rig.cli, rig.version, rig.path(), &[op]).await.unwrap();
    assert_eq!(report.counts.get(&OpKind::MapLoad), Some(&1));
    let listing = rig.worker("show map maps/hosts.map").await;
    let rows: Vec<String> = listing.lines().filter_map(|l| l.split_once(' ').map(|(_, kv)| kv.to_string())).collect();
    assert_eq!(rows, ["/c 3", "/c 4", "/d x y"], "{label}");
    let (s, b) = http_get(addr(http), "/d").await.unwrap();
    assert_eq!((s, b.as_str()), (200, "x y"), "{label}");

    // ACL: the duplicates of the old version vanish; tricky characters survive the CLI.
    let tricky = "/a b;c\\d#e\"f'g";
    let patterns = vec!["/deny".to_string(), "/deny2".into(), tricky.to_string()];
    let op = Op::AclReplace { path: rel("maps/paths.acl"), patterns };
    run_ops(&rig.cli, rig.version, rig.path(), &[op]).await.unwrap();
    let listing = rig.worker("show acl maps/paths.acl").await;
    let rows: Vec<String> = listing.lines().filter_map(|l| l.split_once(' ').map(|(_, p)| p.to_string())).collect();
    assert_eq!(rows, ["/deny", "/deny2", tricky], "{label}");
    let (s, _) = http_get(addr(http), "/deny").await.unwrap();
    assert_eq!(s, 403, "{label}");
    let (s, _) = http_get(addr(http), "/x").await.unwrap();
    assert_eq!(s, 200, "{label}: /x left the ACL");

    // A map the config does not load: HAProxy's words.
    let op = Op::MapReplace { path: rel("maps/unknown.map"), entries: vec![("k".into(), "v".into())] };
    let err = run_ops(&rig.cli, rig.version, rig.path(), &[op]).await.unwrap_err();
    assert!(err.reply.contains("Unknown map identifier"), "{label}: {err}");

    assert_eq!(rig.generation().await, gen0, "{label}: map/acl replace must not reload");
    rig.stop();
}

/// A self-signed certificate and key for `cn`, as one PEM (cert, a blank line, key).
fn make_cert(dir: &Path, cn: &str) -> String {
    let key = dir.join(format!("{cn}.key"));
    let crt = dir.join(format!("{cn}.crt"));
    let out = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", &format!("/CN={cn}")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .expect("run openssl");
    assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    let crt = std::fs::read_to_string(crt).unwrap();
    let key = std::fs::read_to_string(key).unwrap();
    format!("{crt}\n{key}")
}

/// The subject of the certificate served on `port` for SNI `x`.
async fn served_subject(port: u16) -> String {
    let script = format!(
        "openssl s_client -connect 127.0.0.1:{port} -servername x </dev/null 2>/dev/null | openssl x509 -noout -subject"
    );
    let out = tokio::process::Command::new("sh").arg("-c").arg(script).output().await.expect("run openssl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

on_each_version!(cert_set_swaps_the_served_certificate_without_reload);
async fn cert_set_swaps_the_served_certificate_without_reload(bin: HaproxyBin) {
    let certs = tempfile::tempdir().unwrap();
    let old_pem = make_cert(certs.path(), "old-cert");
    let new_pem = make_cert(certs.path(), "new-cert");
    let bin = &bin;
    let tls = free_port();
    let cfg = format!(
        "{}frontend fe_tls\n    bind 127.0.0.1:{tls} ssl crt certs/site.pem\n\
         \x20   http-request return status 200 content-type text/plain string tls\n",
        head()
    );
    let files = [("certs/site.pem", old_pem.as_str()), ("certs/other.pem", old_pem.as_str())];
    let rig = Rig::start(bin, &cfg, &files).await;
    let label = rig.label.clone();
    let gen0 = rig.generation().await;
    assert!(served_subject(tls).await.contains("old-cert"), "{label}");
    // HAProxy names the certificate as written in the config, which is its tree path.
    assert!(rig.worker("show ssl cert").await.lines().any(|l| l == "certs/site.pem"), "{label}");

    // The tree gets the new PEM (with a blank line, stripped before sending); then cert.set.
    write(rig.path(), "certs/site.pem", &new_pem);
    let report =
        run_ops(&rig.cli, rig.version, rig.path(), &[Op::CertSet { path: rel("certs/site.pem") }]).await.unwrap();
    assert_eq!(report.counts.get(&OpKind::CertSet), Some(&1));
    common::eventually(&format!("{label}: the new certificate served"), Duration::from_secs(10), || async {
        let subject = served_subject(tls).await;
        if subject.contains("new-cert") {
            Ok(())
        } else {
            Err(format!("still serving {subject:?}"))
        }
    })
    .await;
    assert!(rig.worker("show ssl cert certs/site.pem").await.contains("CN=new-cert"), "{label}");

    // A certificate the config does not load: HAProxy's words, and no transaction left over.
    let err =
        run_ops(&rig.cli, rig.version, rig.path(), &[Op::CertSet { path: rel("certs/other.pem") }]).await.unwrap_err();
    assert_eq!(err.op, "cert.set certs/other.pem");
    assert!(err.reply.contains("not referenced"), "{label}: {err}");
    // A PEM HAProxy cannot load: refused, and the served certificate is unchanged.
    write(rig.path(), "certs/site.pem", "garbage\n");
    let err =
        run_ops(&rig.cli, rig.version, rig.path(), &[Op::CertSet { path: rel("certs/site.pem") }]).await.unwrap_err();
    assert!(err.reply.contains("Can't"), "{label}: {err}");
    assert!(!rig.worker("show ssl cert").await.contains("*certs/"), "{label}: no transaction left");
    assert!(served_subject(tls).await.contains("new-cert"), "{label}");

    assert_eq!(rig.generation().await, gen0, "{label}: cert.set must not reload");
    rig.stop();
}

/// curl to 127.0.0.1:`port` over TLS (the server not checked) with the client certificate
/// `<dir>/<file>.pem` and `.key`: whether it got an answer.
async fn answered_with_client_cert(port: u16, dir: &Path, file: &str) -> bool {
    let out = tokio::process::Command::new("curl")
        .args(["-sk", "--max-time", "10", "--cert"])
        .arg(dir.join(format!("{file}.pem")))
        .arg("--key")
        .arg(dir.join(format!("{file}.key")))
        .arg(format!("https://127.0.0.1:{port}/"))
        .output()
        .await
        .expect("run curl");
    out.status.success() && String::from_utf8_lossy(&out.stdout) == "in"
}

on_each_version!(cafile_set_swaps_the_clients_ca_without_reload);
async fn cafile_set_swaps_the_clients_ca_without_reload(bin: HaproxyBin) {
    // Two CAs, each with a client certificate; the bind first trusts the first.
    let (a, b, srv) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    haptic_e2e::tls::make_ca_for(a.path(), "client", "DNS:a.example");
    haptic_e2e::tls::make_ca_for(b.path(), "client", "DNS:b.example");
    let site = make_cert(srv.path(), "site");
    let ca = |d: &Path| std::fs::read_to_string(d.join("ca.pem")).unwrap();
    let bin = &bin;
    let tls = free_port();
    let cfg = format!(
        "{}frontend fe_tls\n    bind 127.0.0.1:{tls} ssl crt certs/site.pem ca-file certs/clients.pem verify required\n\
         \x20   http-request return status 200 content-type text/plain string in\n",
        head()
    );
    let first_ca = ca(a.path());
    let files = [("certs/site.pem", site.as_str()), ("certs/clients.pem", first_ca.as_str())];
    let rig = Rig::start(bin, &cfg, &files).await;
    let label = rig.label.clone();
    let gen0 = rig.generation().await;
    assert!(answered_with_client_cert(tls, a.path(), "client").await, "{label}");
    assert!(!answered_with_client_cert(tls, b.path(), "client").await, "{label}");

    // The tree gets the other CA; then cafile.set: new handshakes check against it.
    write(rig.path(), "certs/clients.pem", &ca(b.path()));
    let ops = [Op::CaFileSet { path: rel("certs/clients.pem") }];
    let report = run_ops(&rig.cli, rig.version, rig.path(), &ops).await.unwrap();
    assert_eq!(report.counts.get(&OpKind::CaFileSet), Some(&1));
    common::eventually(&format!("{label}: the new CA checks clients"), Duration::from_secs(10), || async {
        match (
            answered_with_client_cert(tls, b.path(), "client").await,
            answered_with_client_cert(tls, a.path(), "client").await,
        ) {
            (true, false) => Ok(()),
            other => Err(format!("(new CA's client, old CA's client) answered: {other:?}")),
        }
    })
    .await;

    // A file HAProxy cannot load as a CA: refused, no transaction left, the CA unchanged.
    write(rig.path(), "certs/clients.pem", "garbage\n");
    let err = run_ops(&rig.cli, rig.version, rig.path(), &ops).await.unwrap_err();
    assert_eq!(err.op, "cafile.set certs/clients.pem");
    assert!(!rig.worker("show ssl ca-file").await.contains("*certs/"), "{label}: no transaction left");
    assert!(answered_with_client_cert(tls, b.path(), "client").await, "{label}");

    assert_eq!(rig.generation().await, gen0, "{label}: cafile.set must not reload");
    rig.stop();
}

on_each_version!(worker_dying_after_fork_is_reported);
async fn worker_dying_after_fork_is_reported(bin: HaproxyBin) {
    let bin = &bin;
    let http = free_port();
    let rig = Rig::start(bin, &reload_cfg(http, ""), &[]).await;
    let label = rig.label.clone();
    let (w0, _) = rig.generation().await;
    // `chroot /nonexistent` passes `-c` but the new worker exits at once.
    let good = std::fs::read_to_string(rig.hap.cfg_path()).unwrap();
    write(rig.path(), "haproxy.cfg", &good.replacen("global\n", "global\n    chroot /nonexistent\n", 1));
    let res = reload_verified(&rig.cli, rig.version, RELOAD_TIMEOUT).await;
    println!("{label}: worker dies after fork -> {res:?}");
    match res {
        // exit-on-failure takes the master down: a total outage the agent must see.
        Err(ReloadError::MasterGone) => assert!(!rig.cli.ping().await, "{label}"),
        // Or, racing a stray SIGTTOU, leaves it alive but hung with its CLI closed: a live
        // master is waited for until the deadline, and the reload is not verified.
        Err(ReloadError::Timeout) => assert!(!rig.cli.ping().await, "{label}"),
        // Or the master lives on with no current worker (the old one stopping).
        Err(ReloadError::NoWorker { show_proc }) => assert!(show_proc.contains("# workers"), "{label}"),
        // A version that keeps the old worker must say the reload failed, and still serve.
        Err(ReloadError::Failed { .. }) => assert_still_serving(&rig, w0, http).await,
        other => panic!(
            "{label}: a worker that cannot start must not count as a reload: {other:?}\n{:?}\n{:?}",
            rig.cli.master("show proc").await,
            rig.cli.worker("show info").await
        ),
    }
    rig.stop();
}
