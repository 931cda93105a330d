//! The edge on real HAProxy 2.6, 3.0, 3.2 and 3.4: what the backend learns of the client
//! (`X-Forwarded-*`, which a client cannot forge unless trusted), the PROXY protocol, one access
//! log line per request (HTTP and JSON), the stats and exporter frontend, and HTTP/2 on an
//! Ingress's TLS bind.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::edge::{AccessLog, Edge, Forwarded};
use haptic_render::ingress::Settings;

mod common;

/// An Ingress `site.example.com/` → Service `web`, with TLS from the Secret `site` when `tls`.
fn objects(tls: bool) -> String {
    annotated(tls, "{}")
}

/// [`objects`] with the Ingress's `annotations` (a YAML flow mapping).
fn annotated(tls: bool, annotations: &str) -> String {
    let tls = if tls { "\n      tls: [{hosts: [site.example.com], secretName: site}]" } else { "" };
    format!(
        r#"
ingresses:
  - metadata: {{name: site, namespace: web, annotations: {annotations}}}
    spec:
      ingressClassName: haptic{tls}
      rules:
        - host: site.example.com
          http:
            paths:
              - {{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}
services:
  - metadata: {{name: web, namespace: web}}
    spec: {{ports: [{{port: 80}}]}}
endpointSlices:
  - metadata: {{name: web-1, namespace: web, labels: {{kubernetes.io/service-name: web}}}}
    addressType: IPv4
    ports: [{{port: 1}}]
    endpoints: [{{addresses: [127.0.0.1]}}]
"#
    )
}

/// A running render of [`objects`] with `edge`, its HTTP address and HAProxy.
struct Site {
    http: SocketAddr,
    https: u16,
    stats: SocketAddr,
    haproxy: Haproxy,
    _dir: tempfile::TempDir,
}

async fn site(bin: &haptic_e2e::HaproxyBin, edge: Edge, tls: bool) -> Site {
    let web = common::echo_backend("web");
    let (http_port, https_port, stats) = (free_port(), free_port(), SocketAddr::from(([127, 0, 0, 1], free_port())));
    let settings = Settings {
        bind_address: [127, 0, 0, 1].into(),
        http_port,
        https_port,
        min_slots: 1,
        edge: Edge { stats: Some(stats), ..edge },
        ..Settings::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut input = common::input(&objects(tls), settings);
    if tls {
        input.secrets.push(std::sync::Arc::new(common::tls_secret(dir.path(), "web", "site")));
    }
    common::endpoints_on_loopback(&mut input, |_| web);
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    assert!(render.verdicts.iter().all(|v| v.accepted()), "{:?}", render.verdicts);
    let tree = dir.path().join("tree");
    common::write_tree(&render, &tree);
    let haproxy = Haproxy::start(bin, HaproxyOpts::new(&tree)).await.unwrap();
    Site { http: SocketAddr::from(([127, 0, 0, 1], http_port)), https: https_port, stats, haproxy, _dir: dir }
}

/// The request head the backend saw (names lower-cased), after `GET /` with `extra` headers.
async fn seen(addr: SocketAddr, extra: &str) -> String {
    common::raw(addr, &format!("GET /x HTTP/1.1\r\nHost: site.example.com\r\n{extra}Connection: close\r\n\r\n")).await
}

/// The values of header `name` in a head the echo backend returned.
fn values(head: &str, name: &str) -> Vec<String> {
    let prefix = format!("{name}:");
    head.lines().filter_map(|l| l.strip_prefix(&prefix)).map(|v| v.trim().to_string()).collect()
}

haptic_e2e::on_each_version!(a_client_cannot_forge_its_forwarded_headers);
async fn a_client_cannot_forge_its_forwarded_headers(bin: haptic_e2e::HaproxyBin) {
    let s = site(&bin, Edge::default(), false).await;
    // The benign request: the backend learns the client's address, scheme, host and port.
    let head = seen(s.http, "").await;
    assert_eq!(values(&head, "x-forwarded-for"), ["127.0.0.1"], "{head}");
    assert_eq!(values(&head, "x-forwarded-proto"), ["http"]);
    assert_eq!(values(&head, "x-forwarded-host"), ["site.example.com"]);
    // HAProxy's own port is not the one the client used behind a Service (8080 for port 80): the
    // port is the Host header's, else the scheme's.
    assert_eq!(values(&head, "x-forwarded-port"), ["80"]);
    let req = format!("GET /x HTTP/1.1\r\nHost: site.example.com:{}\r\nConnection: close\r\n\r\n", s.http.port());
    let head = common::raw(s.http, &req).await;
    assert_eq!(values(&head, "x-forwarded-port"), [s.http.port().to_string()], "{head}");
    // The attack: an untrusted client's own headers are dropped, never passed on.
    let forged = "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: bank.example\r\n\
                  X-Forwarded-Port: 443\r\n";
    let head = seen(s.http, forged).await;
    assert_eq!(values(&head, "x-forwarded-for"), ["127.0.0.1"], "{head}");
    assert_eq!(values(&head, "x-forwarded-proto"), ["http"]);
    assert_eq!(values(&head, "x-forwarded-host"), ["site.example.com"]);
    assert_eq!(values(&head, "x-forwarded-port"), ["80"]);
}

haptic_e2e::on_each_version!(a_trusted_proxy_keeps_its_forwarded_headers);
async fn a_trusted_proxy_keeps_its_forwarded_headers(bin: haptic_e2e::HaproxyBin) {
    let edge = Edge {
        forwarded: Forwarded { enabled: true, trusted: vec!["127.0.0.0/8".parse().unwrap()] },
        ..Edge::default()
    };
    let s = site(&bin, edge, false).await;
    let head = seen(s.http, "X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\n").await;
    // HAProxy appends its own header line: the chain is the proxy's client, then the proxy.
    assert_eq!(values(&head, "x-forwarded-for"), ["203.0.113.9", "127.0.0.1"], "{head}");
    assert_eq!(values(&head, "x-forwarded-proto"), ["https"]);
    // A trusted proxy that sent none still gets them set.
    let head = seen(s.http, "").await;
    assert_eq!(values(&head, "x-forwarded-proto"), ["http"]);
}

haptic_e2e::on_each_version!(the_proxy_protocol_gives_the_real_client);
async fn the_proxy_protocol_gives_the_real_client(bin: haptic_e2e::HaproxyBin) {
    let s = site(&bin, Edge { proxy_protocol: true, ..Edge::default() }, false).await;
    // A connection without the PROXY header is closed unanswered: no client passes for another.
    let head = {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(s.http).await.unwrap();
        let req = "GET /x HTTP/1.1\r\nHost: site.example.com\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n";
        let mut out = Vec::new();
        let _ = c.write_all(req.as_bytes()).await;
        let _ = c.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    };
    assert_eq!(head, "", "a connection without the PROXY header");
    let req = "PROXY TCP4 198.51.100.7 127.0.0.1 40000 80\r\n\
               GET /x HTTP/1.1\r\nHost: site.example.com\r\nConnection: close\r\n\r\n";
    let head = common::raw(s.http, req).await;
    assert_eq!(values(&head, "x-forwarded-for"), ["198.51.100.7"], "{head}");
    assert_eq!(values(&head, "x-forwarded-port"), ["80"]);
}

haptic_e2e::on_each_version!(one_access_log_line_per_request);
async fn one_access_log_line_per_request(bin: haptic_e2e::HaproxyBin) {
    for log in [AccessLog::Http, AccessLog::Json] {
        let s = site(&bin, Edge { access_log: log, ..Edge::default() }, false).await;
        for i in 0..3 {
            let head = common::raw(
                s.http,
                &format!("GET /n{i}?q=\"x\" HTTP/1.1\r\nHost: site.example.com\r\nConnection: close\r\n\r\n"),
            )
            .await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        }
        // The line is written when the stream ends, a moment after the response.
        let lines = haptic_e2e::wait::eventually("three access log lines", std::time::Duration::from_secs(10), || {
            let out = s.haproxy.stderr_text();
            let lines: Vec<String> = out.lines().filter(|l| l.contains("/n")).map(str::to_string).collect();
            let n = lines.len();
            async move {
                if n >= 3 {
                    Ok(lines)
                } else {
                    Err(format!("{n} lines"))
                }
            }
        })
        .await;
        assert_eq!(lines.len(), 3, "{lines:?}");
        if log == AccessLog::Json {
            // Each line is written when its stream ends: not necessarily in request order.
            let mut paths = Vec::new();
            for l in &lines {
                let start = l.find('{').unwrap();
                let v: serde_json::Value = serde_json::from_str(&l[start..]).unwrap_or_else(|e| panic!("{e}: {l}"));
                assert_eq!(v["status"], 200, "{l}");
                assert_eq!(v["host"], "site.example.com");
                assert_eq!(v["method"], "GET");
                paths.push(v["path"].as_str().unwrap().to_string());
            }
            paths.sort();
            assert_eq!(paths, (0..3).map(|i| format!("/n{i}?q=\"x\"")).collect::<Vec<_>>());
        } else {
            assert!(lines.iter().all(|l| l.contains(" 200 ") && l.contains("GET /n")), "{lines:?}");
        }
    }
}

haptic_e2e::on_each_version!(stats_and_exporter_answer);
async fn stats_and_exporter_answer(bin: haptic_e2e::HaproxyBin) {
    let s = site(&bin, Edge::default(), false).await;
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let metrics = common::raw(s.stats, &get("/metrics")).await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains("haproxy_process_"), "the exporter's metrics");
    assert!(common::raw(s.stats, &get("/stats")).await.starts_with("HTTP/1.1 200"));
}

haptic_e2e::on_each_version!(an_ingress_tls_bind_speaks_http2);
async fn an_ingress_tls_bind_speaks_http2(bin: haptic_e2e::HaproxyBin) {
    let s = site(&bin, Edge::default(), true).await;
    let out = std::process::Command::new("curl")
        .args(["-sk", "-w", "\n%{http_code} %{http_version}", "--http2", "--max-time", "10"])
        .arg("--resolve")
        .arg(format!("site.example.com:{}:127.0.0.1", s.https))
        .arg(format!("https://site.example.com:{}/", s.https))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.ends_with("200 2"), "{out}");
    // Over TLS the backend is told so, and the port the client named (h2's :authority).
    assert_eq!(values(&out, "x-forwarded-proto"), ["https"], "{out}");
    assert_eq!(values(&out, "x-forwarded-port"), [s.https.to_string()], "{out}");
}

/// A backend answering `web` after `delay` (a thread per connection), and how many requests
/// it has read.
fn slow_backend(delay: std::time::Duration) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                counter.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(delay);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nweb");
            });
        }
    });
    (port, seen)
}

haptic_e2e::on_each_version!(a_soft_stop_finishes_requests_and_hard_stop_after_bounds_it);
async fn a_soft_stop_finishes_requests_and_hard_stop_after_bounds_it(bin: haptic_e2e::HaproxyBin) {
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let ((slow, slow_seen), (stuck, stuck_seen)) =
        (slow_backend(Duration::from_secs(1)), slow_backend(Duration::from_secs(3600)));
    let http_port = free_port();
    let settings = Settings {
        bind_address: [127, 0, 0, 1].into(),
        http_port,
        min_slots: 1,
        edge: Edge { drain_seconds: Some(3), ..Edge::default() },
        ..Settings::default()
    };
    let yaml = objects(false).replace("path: /, pathType: Prefix", "path: /slow, pathType: Prefix");
    let mut input = common::input(&yaml, settings);
    let mut ing = (*input.ingresses[0]).clone();
    ing.metadata.name = Some("stuck".into());
    let stuck_path = serde_json::json!({"path": "/stuck", "pathType": "Prefix",
        "backend": {"service": {"name": "stuck", "port": {"number": 80}}}});
    ing.spec.as_mut().unwrap().rules.as_mut().unwrap()[0].http.as_mut().unwrap().paths =
        vec![serde_json::from_value(stuck_path).unwrap()];
    input.ingresses.push(std::sync::Arc::new(ing));
    let mut svc = (*input.services[0]).clone();
    svc.metadata.name = Some("stuck".into());
    input.services.push(std::sync::Arc::new(svc));
    let mut slice = (*input.endpoint_slices[0]).clone();
    slice.metadata.name = Some("stuck-1".into());
    slice.metadata.labels = Some([("kubernetes.io/service-name".to_string(), "stuck".to_string())].into());
    input.endpoint_slices.push(std::sync::Arc::new(slice));
    common::endpoints_on_loopback(&mut input, |svc| if svc == "stuck" { stuck } else { slow });
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    assert!(render.verdicts.iter().all(|v| v.accepted()), "{:?}", render.verdicts);
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |path: &'static str| async move {
        let req = format!("GET {path} HTTP/1.1\r\nHost: site.example.com\r\nConnection: close\r\n\r\n");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(addr).await?;
        c.write_all(req.as_bytes()).await?;
        let mut out = Vec::new();
        c.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
    };
    let (slow_req, stuck_req) = (tokio::spawn(get("/slow")), tokio::spawn(get("/stuck")));
    // Both requests reached their backends before HAProxy is told to stop.
    haptic_e2e::wait::eventually("both requests at their backends", Duration::from_secs(10), || {
        let (a, b) = (slow_seen.load(Ordering::SeqCst), stuck_seen.load(Ordering::SeqCst));
        async move {
            if a == 1 && b == 1 {
                Ok(())
            } else {
                Err(format!("slow {a}, stuck {b}"))
            }
        }
    })
    .await;
    let stopped_at = std::time::Instant::now();
    let kill = std::process::Command::new("kill").args(["-USR1", &h.master_pid().to_string()]).status().unwrap();
    assert!(kill.success());
    // The request in flight is answered by the stopping worker.
    let answer = slow_req.await.unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("web"), "{answer}");
    // The stuck one is cut at `hard-stop-after`, and the master leaves with its last worker.
    let cut = stuck_req.await.unwrap();
    let held = stopped_at.elapsed();
    assert!(!cut.as_deref().unwrap_or_default().starts_with("HTTP/1.1 200"), "{cut:?}");
    assert!(held >= Duration::from_secs(3), "the stuck request was held until hard-stop-after: {held:?}");
    haptic_e2e::wait::eventually("the master to exit", Duration::from_secs(10), || {
        let alive = h.master_alive();
        async move {
            if alive {
                Err("alive".to_string())
            } else {
                Ok(())
            }
        }
    })
    .await;
}

haptic_e2e::on_each_version!(plain_http_to_a_tls_ingress_is_redirected_unless_it_says_not);
async fn plain_http_to_a_tls_ingress_is_redirected_unless_it_says_not(bin: haptic_e2e::HaproxyBin) {
    let s = site(&bin, Edge::default(), true).await;
    let head = seen(s.http, "").await;
    assert!(head.starts_with("HTTP/1.1 308"), "{head}");
    assert!(head.to_ascii_lowercase().contains("location: https://site.example.com/x"), "{head}");
    drop(s);
    let web = common::echo_backend("web");
    let dir = tempfile::tempdir().unwrap();
    let http_port = free_port();
    let yaml = annotated(true, r#"{nginx.ingress.kubernetes.io/ssl-redirect: "false"}"#);
    let settings = Settings {
        bind_address: [127, 0, 0, 1].into(),
        http_port,
        https_port: free_port(),
        min_slots: 1,
        ..Settings::default()
    };
    let mut input = common::input(&yaml, settings);
    input.secrets.push(std::sync::Arc::new(common::tls_secret(dir.path(), "web", "site")));
    common::endpoints_on_loopback(&mut input, |_| web);
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    assert!(render.verdicts.iter().all(|v| v.accepted()), "{:?}", render.verdicts);
    let tree = dir.path().join("tree");
    common::write_tree(&render, &tree);
    let _h = Haproxy::start(&bin, HaproxyOpts::new(&tree)).await.unwrap();
    let head = seen(SocketAddr::from(([127, 0, 0, 1], http_port)), "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "ssl-redirect: \"false\" serves plain HTTP: {head}");
}

/// A self-signed certificate for `cn` and its key, as a default certificate.
fn default_certificate(dir: &std::path::Path, cn: &str) -> haptic_render::edge::DefaultCertificate {
    let (crt, key) = common::self_signed(dir, "default", cn, &[]);
    let file = haptic_render::pem::certified(&crt, &key).unwrap();
    haptic_render::edge::DefaultCertificate { pem: file.pem, not_after: file.not_after }
}

/// The subject of the certificate the TLS port `port` serves to SNI `sni` (none: no SNI).
fn served_subject(port: u16, sni: Option<&str>) -> String {
    let mut c = std::process::Command::new("openssl");
    c.args(["s_client", "-connect", &format!("127.0.0.1:{port}")]);
    match sni {
        Some(s) => c.args(["-servername", s]),
        None => c.arg("-noservername"),
    };
    let out = c.stdin(std::process::Stdio::null()).output().unwrap();
    let pem = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut x = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-subject"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    x.stdin.take().unwrap().write_all(pem.as_bytes()).unwrap();
    String::from_utf8_lossy(&x.wait_with_output().unwrap().stdout).trim().to_string()
}

haptic_e2e::on_each_version!(an_unknown_name_gets_the_default_certificate_never_a_tenants);
async fn an_unknown_name_gets_the_default_certificate_never_a_tenants(bin: haptic_e2e::HaproxyBin) {
    let dir = tempfile::tempdir().unwrap();
    let edge = Edge { default_certificate: Some(default_certificate(dir.path(), "haptic default")), ..Edge::default() };
    let s = site(&bin, edge, true).await;
    // The tenant's own name still gets its certificate.
    assert!(served_subject(s.https, Some("site.example.com")).contains("site.example.com"));
    // Any other name, or none, gets the default one: never the tenant's.
    assert!(served_subject(s.https, Some("bank.example")).contains("haptic default"));
    assert!(served_subject(s.https, None).contains("haptic default"));
}

haptic_e2e::on_each_version!(a_tls_entry_without_a_secret_is_served_the_default_certificate);
async fn a_tls_entry_without_a_secret_is_served_the_default_certificate(bin: haptic_e2e::HaproxyBin) {
    let dir = tempfile::tempdir().unwrap();
    let web = common::echo_backend("web");
    let (http_port, https_port) = (free_port(), free_port());
    let edge = Edge { default_certificate: Some(default_certificate(dir.path(), "haptic default")), ..Edge::default() };
    let settings = Settings {
        bind_address: [127, 0, 0, 1].into(),
        http_port,
        https_port,
        min_slots: 1,
        edge,
        ..Settings::default()
    };
    let yaml = objects(true).replace(", secretName: site}", "}");
    let mut input = common::input(&yaml, settings);
    common::endpoints_on_loopback(&mut input, |_| web);
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let v = &render.verdicts[0];
    assert!(v.accepted(), "{v:?}");
    assert_eq!(v.warnings.len(), 1, "the entry's Event says it: {v:?}");
    assert_eq!(v.warnings[0].field, "spec.tls[0].secretName");
    let tree = dir.path().join("tree");
    common::write_tree(&render, &tree);
    let _h = Haproxy::start(&bin, HaproxyOpts::new(&tree)).await.unwrap();
    assert!(served_subject(https_port, Some("site.example.com")).contains("haptic default"));
}

#[test]
fn a_render_tells_when_each_served_certificate_expires() {
    let dir = tempfile::tempdir().unwrap();
    let mut input = common::input(&objects(true), Settings::default());
    input.secrets.push(std::sync::Arc::new(common::tls_secret(dir.path(), "web", "site")));
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let [c] = &render.certificates[..] else { panic!("{:?}", render.certificates) };
    assert_eq!(
        (c.source.kind.as_str(), c.source.namespace.as_str(), c.source.name.as_str()),
        ("Secret", "web", "site")
    );
    // `openssl req -days 1`: valid for about a day from now.
    assert!(c.not_after > now && c.not_after <= now + 2 * 86_400, "{c:?}");
}
