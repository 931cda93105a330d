//! The `haptic-controller` command line: `validate` (against HAProxy 2.6, 3.0, 3.2 and 3.4), `diff`,
//! `status` (against a real admin server) and `run`'s refusals of bad settings.

use std::process::Command;
use std::sync::Arc;

use haptic_controller::admin::{self, AdminState};
use haptic_controller::gate::{GateMode, Latch};
use haptic_controller::metrics::Metrics;
use haptic_controller::status::{ControllerStatus, GateStatus, Phase, StatusBoard};
use haptic_e2e::{basic_config, free_port, on_each_version, HaproxyBin};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_haptic-controller"))
}

fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (p, body) in files {
        let target = d.path().join(p);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, body).unwrap();
    }
    d
}

fn good_config() -> String {
    basic_config(free_port(), "    http-request set-var(txn.x) str(y),map(maps/a.map,none)\n")
}

on_each_version!(sync validate_passes_good_and_refuses_bad_renders);

fn validate_passes_good_and_refuses_bad_renders(b: HaproxyBin) {
    let good = good_config();
    let bad = basic_config(free_port(), "    no-such-keyword here\n");
    let good_dir = dir_with(&[("haproxy.cfg", &good), ("maps/a.map", "k v\n")]);
    let bad_dir = dir_with(&[("haproxy.cfg", &bad)]);
    let missing_map = dir_with(&[("haproxy.cfg", &good)]);
    let out = bin().arg("validate").arg(good_dir.path()).arg("--haproxy-bin").arg(&b.path).output().unwrap();
    assert!(out.status.success(), "{}: {}", b.label(), String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid"));
    for d in [&bad_dir, &missing_map] {
        let out = bin().arg("validate").arg(d.path()).env("HAPTIC_CONTROLLER_HAPROXY_BIN", &b.path).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", b.label());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("ALERT") && err.contains("haproxy.cfg"), "{}: {err}", b.label());
        assert!(!err.contains("haptic-gate-"), "temp dir paths are hidden: {err}");
    }
    // A config without `default-path config` would load other files in the pod than here.
    let no_default_path =
        dir_with(&[("haproxy.cfg", &good.replace("default-path config", "")), ("maps/a.map", "k v\n")]);
    let out = bin().arg("validate").arg(no_default_path.path()).arg("--haproxy-bin").arg(&b.path).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", b.label());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no `default-path config`"), "{}: {err}", b.label());
}

#[test]
fn validate_names_a_missing_render_and_a_missing_haproxy_binary() {
    let out = bin().arg("validate").arg("/nonexistent-render").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    // A missing HAProxy binary names the flag it came from.
    let good_dir = dir_with(&[("haproxy.cfg", &good_config()), ("maps/a.map", "k v\n")]);
    let out =
        bin().arg("validate").arg(good_dir.path()).args(["--haproxy-bin", "/nonexistent/haproxy"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("haptic-controller: error: --haproxy-bin: "), "{err}");
}

#[test]
fn diff_shows_mode_reasons_and_batches() {
    let cfg = "global\n  default-path config\nfrontend fe\n  bind 127.0.0.1:8080\n  use_backend %[req.hdr(host),map(maps/h.map,be)]\nbackend be\n  server s1 10.0.0.1:80 weight 5\n";
    let old = dir_with(&[("haproxy.cfg", cfg), ("maps/h.map", "a be\n")]);
    let runtime = dir_with(&[("haproxy.cfg", &cfg.replace("10.0.0.1:80", "10.0.0.2:81")), ("maps/h.map", "b be\n")]);
    let out = bin().arg("diff").arg(old.path()).arg(runtime.path()).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("mode: runtime"), "{text}");
    assert!(text.contains("server.set") && text.contains("map.load") && text.contains("s1"), "{text}");
    let reload = dir_with(&[("haproxy.cfg", &cfg.replace("8080", "8081")), ("maps/h.map", "a be\n")]);
    let out = bin().args(["diff", "--output", "json"]).arg(old.path()).arg(reload.path()).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "reload");
    assert!(v["reasons"][0].as_str().unwrap().contains("frontend fe"), "{v}");
    assert_eq!(v["causes"], serde_json::json!(["listener"]), "{v}");
    let out = bin().arg("diff").arg(old.path()).arg(old.path()).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("identical"));
    // An added server is a server.add; one `add server` cannot take reloads, named, not counted.
    let added =
        dir_with(&[("haproxy.cfg", &format!("{cfg}  server s2 10.0.0.2:80 weight 5\n")), ("maps/h.map", "a be\n")]);
    let out = bin().arg("diff").arg(old.path()).arg(added.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("mode: runtime"), "{text}");
    assert!(text.contains("server.add") && text.contains("backend be: server s2 added (10.0.0.2:80)"), "{text}");
    let line = "server s2 10.0.0.2:80 weight 5 cookie c2";
    let added = dir_with(&[("haproxy.cfg", &format!("{cfg}  {line}\n")), ("maps/h.map", "a be\n")]);
    let out = bin().arg("diff").arg(old.path()).arg(added.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("mode: reload\nreload for: server\n"), "{text}");
    assert!(text.contains(&format!("backend be: added \"{line}\"")), "{text}");
    assert!(!text.contains("lines ->"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_a_table_and_json_from_the_admin_server() {
    let board = Arc::new(StatusBoard::new(
        GateStatus::from_latch(&Latch::new(GateMode::Optimistic), None),
        ControllerStatus { identity: "ctl".into(), epoch: 3, ..Default::default() },
    ));
    board.set_endpoints(&[("127.0.0.1:1".into(), "http://127.0.0.1:1".into())]);
    board.pod("127.0.0.1:1", |p| {
        p.phase = Phase::Rejected;
        p.last_error = Some("[ALERT] (1) : config : parsing [haproxy.cfg:9] : unknown keyword 'x'".into());
        p.haproxy_version = Some("3.0.11".into());
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AdminState { board, metrics: Arc::new(Metrics::new()) };
    let stop = tokio_util::sync::CancellationToken::new();
    let s2 = stop.clone();
    let server = tokio::spawn(admin::serve(listener, state, async move { s2.cancelled().await }));
    let admin = format!("http://{addr}");
    let out = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || bin().args(["status", "--admin", &admin]).output().unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("POD"), "{table}");
    assert!(table.contains("rejected") && table.contains("3.0.11") && table.contains("unknown keyword"), "{table}");
    assert!(table.contains("fleet: 0/1 converged"), "{table}");
    let out = tokio::task::spawn_blocking({
        let admin = admin.clone();
        move || bin().args(["status", "--output", "json"]).env("HAPTIC_CONTROLLER_ADMIN", &admin).output().unwrap()
    })
    .await
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["total"].as_u64(), v["converged"].as_u64()), (Some(1), Some(0)));
    assert_eq!(v["pods"][0]["phase"], "rejected");
    // A reader that has gone (`| head -1`, `| grep -m1`): a normal, quiet end.
    for args in [vec!["status", "--output", "json"], vec!["status"]] {
        let out = tokio::task::spawn_blocking({
            let admin = admin.clone();
            move || closed_stdout(bin().args(args).env("HAPTIC_CONTROLLER_ADMIN", &admin))
        })
        .await
        .unwrap();
        assert_quiet_end(&out);
    }
    stop.cancel();
    server.await.unwrap().unwrap();
    // Nobody listening: a clear error, exit 2.
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let out = bin().args(["status", "--admin", &nobody]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with(&format!("haptic-controller: error: --admin {nobody}: GET {nobody}/status: ")), "{err}");
    assert_eq!(err.matches(&nobody).count(), 2, "the URL is said once by the flag and once by the request: {err}");
    assert!(err.contains("Connection refused"), "{err}");
}

/// Runs `cmd` with a stdout pipe whose reading end is already closed: every write gets EPIPE.
fn closed_stdout(cmd: &mut Command) -> std::process::Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    cmd.stdout(writer).stderr(std::process::Stdio::piped()).output().unwrap()
}

fn assert_quiet_end(out: &std::process::Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "a closed stdout is a normal end: {:?}: {err}", out.status);
    assert!(err.is_empty(), "nothing said about a closed stdout: {err}");
}

#[test]
fn both_binaries_end_quietly_on_a_closed_stdout() {
    let agent = haptic_e2e::pod::agent_bin();
    let crd_out = closed_stdout(bin().arg("crd"));
    assert_quiet_end(&crd_out);
    let d = dir_with(&[("haproxy.cfg", "global\n")]);
    let diff_out = closed_stdout(bin().arg("diff").arg(d.path()).arg(d.path()));
    assert_quiet_end(&diff_out);
    for args in [["--help"], ["--version"]] {
        assert_quiet_end(&closed_stdout(bin().args(args)));
        assert_quiet_end(&closed_stdout(Command::new(&agent).args(args)));
    }
}

#[test]
fn run_refuses_bad_settings_clearly() {
    let d = dir_with(&[("haproxy.cfg", "global\n")]);
    let creds = d.path().join(".creds");
    std::fs::write(&creds, "u:p\n").unwrap();
    // Not standalone.
    let out = bin()
        .args(["run", "--agent", "http://127.0.0.1:1", "--config-dir"])
        .arg(d.path())
        .arg("--credentials-file")
        .arg(&creds)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--standalone"));
    // Every flag also from the environment; a bad agent URL is refused before anything runs.
    let out = bin()
        .args(["run"])
        .env("HAPTIC_CONTROLLER_STANDALONE", "true")
        .env("HAPTIC_CONTROLLER_CONFIG_DIR", d.path())
        .env("HAPTIC_CONTROLLER_AGENT", "127.0.0.1:1")
        .env("HAPTIC_CONTROLLER_CREDENTIALS_FILE", &creds)
        .env("HAPTIC_CONTROLLER_ADMIN_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must start with http://"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // An https:// agent without --agent-ca-file: refused at start, saying what to pass.
    let out = bin()
        .args([
            "run",
            "--standalone",
            "--agent",
            "https://127.0.0.1:1",
            "--admin-listen",
            "127.0.0.1:0",
            "--config-dir",
        ])
        .arg(d.path())
        .arg("--credentials-file")
        .arg(&creds)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--agent-ca-file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A fixed agent name without the CA to verify it with: refused at start.
    let out = bin()
        .args(["run", "--standalone", "--agent", "https://127.0.0.1:1", "--admin-listen", "127.0.0.1:0"])
        .args(["--agent-tls-server-name", "haptic-agent.edge.svc", "--config-dir"])
        .arg(d.path())
        .arg("--credentials-file")
        .arg(&creds)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--agent-tls-server-name needs --agent-ca-file"), "{err}");
    // --agent-tls-issue without --agent-tls-secret: a usage error.
    let out = bin().args(["run", "--kubernetes", "--config", "edge", "--agent-tls-issue"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    // A config dir that does not exist.
    let out = bin()
        .args(["run", "--standalone", "--agent", "http://127.0.0.1:1", "--admin-listen", "127.0.0.1:0"])
        .args(["--config-dir", "/nonexistent-dir", "--credentials-file"])
        .arg(&creds)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--config-dir") && err.contains("not a directory"), "{err}");
    // A missing credentials file: the flag, the path, and the cause once, on one line.
    let out = bin()
        .args(["run", "--standalone", "--agent", "http://127.0.0.1:1", "--admin-listen", "127.0.0.1:0"])
        .arg("--config-dir")
        .arg(d.path())
        .args(["--credentials-file", "/nonexistent/creds"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("haptic-controller: error: --credentials-file: /nonexistent/creds: "), "{err}");
    assert_eq!(err.matches("os error 2").count(), 1, "the cause is said once: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// The render fixture (`tests/fixtures/render`) in a temp dir, with the TLS Secret `shop/site`
/// (a fresh certificate from openssl) added as `site.json` (JSON is YAML).
fn render_fixture() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/render");
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.path().join(e.file_name())).unwrap();
    }
    let pki = tempfile::tempdir().unwrap();
    haptic_e2e::tls::make_ca(pki.path(), "site");
    let mut s = k8s_openapi::api::core::v1::Secret::default();
    s.metadata.name = Some("site".into());
    s.metadata.namespace = Some("shop".into());
    s.type_ = Some("kubernetes.io/tls".into());
    let read = |f: &str| k8s_openapi::ByteString(std::fs::read(pki.path().join(f)).unwrap());
    s.data = Some([("tls.crt".to_string(), read("site.pem")), ("tls.key".to_string(), read("site.key"))].into());
    let mut v = serde_json::to_value(&s).unwrap();
    v["apiVersion"] = "v1".into();
    v["kind"] = "Secret".into();
    std::fs::write(d.path().join("site.json.yaml"), v.to_string()).unwrap();
    d
}

#[test]
fn render_prints_the_files_and_one_verdict_per_ingress() {
    let d = render_fixture();
    let out = bin().args(["render", "--dir"]).arg(d.path()).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "an Ingress is refused in part: {stdout}{stderr}");
    assert!(stdout.contains("==> haproxy.cfg <==\n"), "{stdout}");
    assert!(stdout.contains("    timeout http-request 10s"), "the defaults snippet: {stdout}");
    assert!(stdout.contains("frontend health\n    bind '0.0.0.0:8404'\n"), "the probes' frontend: {stdout}");
    assert!(stdout.contains("server SRV_3 10.1.0.3:8080 weight 0"), "the draining endpoint: {stdout}");
    let h = shop_host_id();
    assert!(stdout.contains(&format!("==> maps/hosts.map <==\nshop.example.com {h}\n")), "{stdout}");
    assert!(stdout.contains("accepted Ingress shop/shop\n"), "{stdout}");
    assert!(
        stdout.contains(
            "refused Ingress shop/broken: spec.rules[0].http.paths[0].backend.service.port: Service shop/web has no port 81\n"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("==> certs/shop_site.pem <== ("), "{stdout}");
    assert!(!stdout.contains("PRIVATE KEY"), "a private key is never printed");
    assert!(stdout.lines().last().unwrap().starts_with("plan "), "{stdout}");
    assert!(stderr.contains("skipped Deployment web"), "{stderr}");
    assert!(stderr.contains("no IngressClass haptic"), "{stderr}");
}

/// The Gateway API fixture (`tests/fixtures/render-gateway`): a Gateway, a weighted HTTPRoute
/// and one the translator refuses.
const GATEWAY_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/render-gateway");

#[test]
fn render_serves_a_gateway_class_offline() {
    let out = bin().args(["render", "--dir", GATEWAY_FIXTURE]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "an HTTPRoute is refused: {stdout}{stderr}");
    assert!(stdout.contains("frontend gateway\n    bind '0.0.0.0:20000'\n"), "the listener's bind port: {stdout}");
    assert!(stdout.contains("==> maps/ports.map <==\n20000 80\n"), "{stdout}");
    // 90/10 over two endpoints and one: server weights in that proportion.
    assert!(stdout.contains("    server SRV_1 10.1.0.1:8080 weight 256\n"), "{stdout}");
    assert!(stdout.contains("    server SRV_3 10.1.1.1:8080 weight 57\n"), "{stdout}");
    assert!(stdout.contains("accepted HTTPRoute shop/split\n"), "{stdout}");
    assert!(stdout.contains("refused HTTPRoute shop/regex: "), "{stdout}");
    assert!(!stdout.contains("regex.example.com"), "a refused route is not rendered: {stdout}");
    assert!(stderr.contains("no GatewayClass haptic"), "{stderr}");
}

#[test]
fn render_refuses_what_it_cannot_render_and_changes_nothing() {
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("x.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n").unwrap();
    let out = bin().args(["render", "--dir"]).arg(empty.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no HAProxyConfig"));
    std::fs::write(empty.path().join("bad.yaml"), "kind: Ingress\nspec: [1, 2\n").unwrap();
    let out = bin().args(["render", "--dir"]).arg(empty.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.yaml"), "the file is named");
    // A non-empty --out is left alone.
    let d = render_fixture();
    let target = dir_with(&[("keep.txt", "mine")]);
    let out = bin().args(["render", "--dir"]).arg(d.path()).arg("--out").arg(target.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
    assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 1);
}

on_each_version!(sync render_output_passes_validate);

/// `render --out` then `validate` (real `haproxy -c`) on its output.
fn render_output_passes_validate(b: HaproxyBin) {
    let d = render_fixture();
    let out_dir = tempfile::tempdir().unwrap();
    let target = out_dir.path().join("render");
    let out = bin().args(["render", "--dir"]).arg(d.path()).arg("--out").arg(&target).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("==>"), "files go to --out: {stdout}");
    assert!(stdout.contains("accepted Ingress shop/shop"), "{stdout}");
    let pem = std::fs::read_to_string(target.join("certs/shop_site.pem")).unwrap();
    assert!(pem.contains("BEGIN CERTIFICATE") && pem.contains("PRIVATE KEY"));
    let exact = std::fs::read_to_string(target.join("maps/paths_exact.map")).unwrap();
    assert!(exact.contains(&format!("{}/health r", shop_host_id())), "{exact}");
    let v = bin().arg("validate").arg(&target).arg("--haproxy-bin").arg(&b.path).output().unwrap();
    assert!(v.status.success(), "{}: {}", b.label(), String::from_utf8_lossy(&v.stderr));
    assert!(String::from_utf8_lossy(&v.stdout).contains("valid"));
    // The same for a Gateway class.
    let target = out_dir.path().join("gateway");
    let out = bin().args(["render", "--dir", GATEWAY_FIXTURE]).arg("--out").arg(&target).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let v = bin().arg("validate").arg(&target).arg("--haproxy-bin").arg(&b.path).output().unwrap();
    assert!(v.status.success(), "{}: {}", b.label(), String::from_utf8_lossy(&v.stderr));
}

#[test]
fn migrate_names_each_annotation_and_exits_1_on_a_gap() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/examples/migrate");
    let out = bin().args(["migrate", "--dir", example]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "a refused Ingress is a gap: {text}");
    assert!(text.starts_with("Ingress web/shop (NOT served"), "{text}");
    assert!(text.contains("REFUSED       nginx.ingress.kubernetes.io/configuration-snippet="), "{text}");
    assert!(text.contains("NOT SUPPORTED nginx.ingress.kubernetes.io/proxy-buffering="), "{text}");
    assert!(text.contains("honoured      nginx.ingress.kubernetes.io/whitelist-source-range="), "{text}");
    assert!(text.contains("!{ src 10.0.0.0/8 192.168.0.0/16 }"), "{text}");
    // The documentation shows exactly this output.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/migrating-from-ingress-nginx.md"))
        .unwrap();
    assert!(doc.contains(text.trim_end()), "docs/migrating-from-ingress-nginx.md is stale:\n{text}");

    // A clean Ingress: no gap, exit 0; JSON names each status.
    let dir = dir_with(&[(
        "ing.yaml",
        concat!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\n",
            "metadata: {name: a, namespace: shop, annotations: {haptic.dev/app-root: /app}}\n",
            "spec: {ingressClassName: haptic}\n",
        ),
    )]);
    let out = bin().args(["migrate", "--output", "json", "--dir"]).arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["annotations"][0]["status"]["status"], "honoured");
    assert_eq!(v[0]["served"], true);
    // Nowhere to read from: a clear error, exit 2.
    let out = bin().arg("migrate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dir DIR or --kubernetes"));
}

/// The map id of the fixtures' host `shop.example.com`.
fn shop_host_id() -> String {
    let host = haptic_render::model::HostMatch::Exact("shop.example.com".into());
    haptic_render::ingress::host_id(&host, &Default::default())
}
