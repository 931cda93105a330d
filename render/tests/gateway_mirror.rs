//! Real HAProxy on 127.0.0.1 serving HTTPRoutes with the RequestMirror filter (every HAProxy
//! version): a copy of each request, as its backend gets it (the rule's header changes made),
//! reaches the mirror's Service with its method, path, query and body, while the request itself
//! is answered by its own backend; a rule with two mirrors copies to both; a share of 0 copies
//! nothing. The request never waits for its copy: it is answered while the copy's backend
//! still holds the copy unanswered. The attacks: a client naming another tenant's backend or
//! another method in the headers the copy travels with reaches nothing but the mirror the route
//! names, with the request's own method; a mirror to another namespace's Service without a
//! ReferenceGrant is refused in the route's status (ResolvedRefs) and copies nothing, while
//! the route still serves.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::gateway::GatewayObjects;

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: web}
    spec:
      gatewayClassName: haptic
      listeners: [{name: http, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: All}}}]
routes:
  - metadata: {name: mirrored, namespace: web, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [mirror.test]
      rules:
        - matches: [{path: {type: PathPrefix, value: /one}}]
          filters:
            - type: RequestHeaderModifier
              requestHeaderModifier: {set: [{name: x-set, value: by-route}], remove: [x-drop]}
            - type: RequestMirror
              requestMirror: {backendRef: {name: copy, port: 80}}
          backendRefs: [{name: app, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /two}}]
          filters:
            - type: RequestMirror
              requestMirror: {backendRef: {name: copy, port: 80}}
            - type: RequestMirror
              requestMirror: {backendRef: {name: held, port: 80}, fraction: {numerator: 1, denominator: 1}}
          backendRefs: [{name: app, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /none}}]
          filters:
            - type: RequestMirror
              requestMirror: {backendRef: {name: copy, port: 80}, percent: 0}
          backendRefs: [{name: app, port: 80}]
  - metadata: {name: steal, namespace: web, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [steal.test]
      rules:
        - filters:
            - type: RequestMirror
              requestMirror: {backendRef: {name: secret, namespace: other, port: 80}}
          backendRefs: [{name: app, port: 80}]
  - metadata: {name: private, namespace: other, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, namespace: web}]
      hostnames: [private.test]
      rules: [{backendRefs: [{name: secret, port: 80}]}]
services:
  - metadata: {name: app, namespace: web}
    spec: {ports: [{port: 80}]}
  - metadata: {name: copy, namespace: web}
    spec: {ports: [{port: 80}]}
  - metadata: {name: held, namespace: web}
    spec: {ports: [{port: 80}]}
  - metadata: {name: secret, namespace: other}
    spec: {ports: [{port: 80}]}
"#;

/// A request as an upstream received it: the request line, the header lines (names lowercased)
/// and the body.
#[derive(Debug)]
struct Seen {
    line: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// One request from `s`: its head and its Content-Length body.
fn read_request(s: &mut TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.lines();
    let line = lines.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let len: usize = headers.iter().find(|(k, _)| k == "content-length").map_or(0, |(_, v)| v.parse().unwrap_or(0));
    let mut body = buf[head_end + 4..].to_vec();
    let whole = |b: &[u8]| if chunked { b.ends_with(b"0\r\n\r\n") } else { b.len() >= len };
    while !whole(&body) {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let body = if chunked { dechunk(&body) } else { body };
    Some(Seen { line, headers, body: String::from_utf8_lossy(&body).into_owned() })
}

/// A chunked body's data.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..i]).trim(), 16).unwrap_or(0);
        if size == 0 || b.len() < i + 2 + size {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + size]);
        b = &b[(i + 4 + size).min(b.len())..];
    }
    out
}

/// An upstream sending each request it receives to the returned channel and answering `200`
/// with `name`; when `hold`, it answers nothing and keeps each connection open in the returned
/// list instead (threads end with the test process).
fn upstream(
    name: &'static str,
    hold: bool,
) -> (u16, mpsc::Receiver<Seen>, std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let Some(seen) = read_request(&mut s) else { continue };
            let _ = tx.send(seen);
            if hold {
                keep.lock().unwrap().push(s);
            } else {
                let _ =
                    write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}", name.len());
            }
        }
    });
    (port, rx, held)
}

/// `curl` to `host`: the status code and body.
fn call(port: u16, host: &str, args: &[&str], path: &str) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "-H", &format!("Host: {host}")])
        .args(args)
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.parse().unwrap_or(0), body.to_string())
}

/// The next request `rx` receives, or a failure after a deadline.
fn next(rx: &mpsc::Receiver<Seen>, what: &str) -> Seen {
    rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("no {what} arrived"))
}

/// Whether the peer of `s` still holds the connection open (nothing to read, no end of file).
fn still_open(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    matches!(s.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

fn slice(ns: &str, svc: &str, port: u16) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": svc, "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"port": port}],
        "endpoints": [{"addresses": ["127.0.0.1"]}],
    })
}

haptic_e2e::on_each_version!(requests_are_copied_to_their_mirrors_without_waiting_for_them);
async fn requests_are_copied_to_their_mirrors_without_waiting_for_them(bin: haptic_e2e::HaproxyBin) {
    let (app, app_rx, _) = upstream("app", false);
    let (copy, copy_rx, _) = upstream("copy", false);
    let (held, held_rx, held_conns) = upstream("held", true);
    let (secret, secret_rx, _) = upstream("secret", false);
    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    for (ns, svc, port) in
        [("web", "app", app), ("web", "copy", copy), ("web", "held", held), ("other", "secret", secret)]
    {
        objects.endpoint_slices.push(serde_json::from_value(slice(ns, svc, port)).unwrap());
    }
    let bind = free_port();
    let (render, out) =
        haptic_render::render_gateway(&objects.input("haptic", common::loopback_gateway(bind)), &Default::default())
            .unwrap();
    assert!(common::accepted(&out, "mirrored").status && common::accepted(&out, "steal").status, "{:?}", out.routes);
    let steal = out.routes.iter().find(|r| r.object.name == "steal").unwrap();
    let refs = steal.parents[0].conditions.iter().find(|c| c.type_ == "ResolvedRefs").unwrap();
    assert_eq!((refs.status, refs.reason), (false, "RefNotPermitted"), "{refs:?}");
    let tree = tempfile::tempdir().unwrap();
    common::write_tree(&render, tree.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(tree.path())).await.unwrap();

    // A copy of the request as its backend gets it; the answer is the backend's own.
    let (code, body) =
        call(bind, "mirror.test", &["-X", "PUT", "-H", "x-drop: 1", "--data-binary", "payload"], "/one/a?q=1");
    assert_eq!((code, body.as_str()), (200, "app"));
    let primary = next(&app_rx, "request");
    let copied = next(&copy_rx, "copy");
    assert_eq!(copied.line, "PUT /one/a?q=1 HTTP/1.1", "{copied:?}");
    assert_eq!(primary.line, copied.line);
    assert_eq!((copied.header("x-set"), copied.header("x-drop")), (Some("by-route"), None), "{copied:?}");
    assert_eq!((copied.header("host"), copied.body.as_str()), (Some("mirror.test"), "payload"), "{copied:?}");
    assert!(copied.header("x-haptic-mirror").is_none() && copied.header("x-haptic-mirror-method").is_none());

    // Two mirrors: both get the copy; the held one never answers, and the request is answered
    // while it still holds the copy open. The headers the copy travels with, sent by a client,
    // choose nothing.
    let attack = ["-H", "x-haptic-mirror: other_secret_80", "-H", "x-haptic-mirror-method: DELETE"];
    let (code, body) = call(bind, "mirror.test", &attack, "/two");
    assert_eq!((code, body.as_str()), (200, "app"));
    next(&app_rx, "request");
    assert_eq!(next(&copy_rx, "copy").line, "GET /two HTTP/1.1");
    assert_eq!(next(&held_rx, "held copy").line, "GET /two HTTP/1.1");
    assert!(held_conns.lock().unwrap().iter().all(still_open), "the held copy is still unanswered");

    // A share of 0, and a mirror to a Service the route may not use: nothing copied, the
    // request served. Then a request the other tenant's route is for reaches its backend: the
    // first request its backend sees is that one.
    assert_eq!(call(bind, "mirror.test", &[], "/none"), (200, "app".to_string()));
    assert_eq!(call(bind, "steal.test", &[], "/x"), (200, "app".to_string()));
    assert_eq!(call(bind, "private.test", &[], "/mine"), (200, "secret".to_string()));
    assert_eq!(next(&secret_rx, "request").line, "GET /mine HTTP/1.1");
    // And a last copy shows the mirror still copies: the copies before it were all there were.
    assert_eq!(call(bind, "mirror.test", &[], "/one/last"), (200, "app".to_string()));
    assert_eq!(next(&copy_rx, "copy").line, "GET /one/last HTTP/1.1");
    assert!(copy_rx.try_recv().is_err() && secret_rx.try_recv().is_err() && held_rx.try_recv().is_err());
}
