//! Real HAProxy on 127.0.0.1: a request path is normalised before it is routed, so the spellings
//! of a protected path that a browser or a proxy would treat as the same (`//admin`,
//! `/%61dmin`, `/./admin`, `/x/../admin`) reach the `/admin` route and its backend, not the `/`
//! catch-all; the backend receives the normalised path. With `PathNormalization::Off` the same
//! spellings miss `/admin`, as the client sent them. (Every frontend of the built-in template,
//! Ingress and Gateway API alike, has the same lines.)

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::Settings;
use haptic_render::model::PathNormalization;

mod common;

const FIXTURE: &str = r#"
ingresses:
  - metadata: {name: site, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      ingressClassName: haptic
      rules:
        - host: app.example.com
          http:
            paths:
              - {path: /admin, pathType: Prefix, backend: {service: {name: admin, port: {number: 80}}}}
              - {path: /, pathType: Prefix, backend: {service: {name: public, port: {number: 80}}}}
services:
  - metadata: {name: admin, namespace: shop}
    spec: {ports: [{port: 80}]}
  - metadata: {name: public, namespace: shop}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: admin-1, namespace: shop, labels: {kubernetes.io/service-name: admin}}
    addressType: IPv4
    ports: [{port: 80}]
    endpoints: [{addresses: [10.0.0.1]}]
  - metadata: {name: public-1, namespace: shop, labels: {kubernetes.io/service-name: public}}
    addressType: IPv4
    ports: [{port: 80}]
    endpoints: [{addresses: [10.0.0.2]}]
"#;

/// The spellings of `/admin/x` a client may send, and what the admin backend must receive.
const SPELLINGS: &[&str] = &["//admin/x", "/%61dmin/x", "/./admin/x", "/x/../admin/x", "/admin//x", "/%2e%2e/admin/x"];

/// Serves the fixture with `paths` and returns, for each request path, the backend that
/// answered and the request line it received.
async fn serve(bin: &HaproxyBin, paths: PathNormalization, requests: &[&str]) -> Vec<(String, String)> {
    let (admin, public) = (common::echo_backend("admin"), common::echo_backend("public"));
    let http_port = free_port();
    let settings =
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 1, paths, ..Settings::default() };
    let mut input = common::input(FIXTURE, settings);
    common::endpoints_on_loopback(&mut input, |svc| if svc == "admin" { admin } else { public });
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let h = Haproxy::start(bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let mut out = Vec::new();
    for p in requests {
        let r =
            common::raw(addr, &format!("GET {p} HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n")).await;
        assert_eq!(r.split(' ').nth(1), Some("200"), "{p}: {r:?}\nHAProxy said: {}", h.stderr_text());
        let body: Vec<&str> = r.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default().lines().collect();
        out.push((body[0].to_string(), body.get(1).copied().unwrap_or_default().to_string()));
    }
    out
}

haptic_e2e::on_each_version!(every_spelling_of_a_protected_path_reaches_its_route);
async fn every_spelling_of_a_protected_path_reaches_its_route(bin: HaproxyBin) {
    let mut requests = SPELLINGS.to_vec();
    // The benign twins: the path itself, and paths that only look alike.
    requests.extend(["/admin/x", "/adminx", "/x/%2fadmin"]);
    let got = serve(&bin, PathNormalization::Normalize, &requests).await;
    for (p, (backend, line)) in requests.iter().zip(&got) {
        let want = match *p {
            "/adminx" => ("public", "GET /adminx HTTP/1.1"),
            // An encoded slash is not an unreserved character: it stays encoded, one segment.
            "/x/%2fadmin" => ("public", "GET /x/%2Fadmin HTTP/1.1"),
            _ => ("admin", "GET /admin/x HTTP/1.1"),
        };
        assert_eq!((backend.as_str(), line.as_str()), want, "{p}");
    }
}

haptic_e2e::on_each_version!(with_normalisation_off_the_path_is_routed_as_sent);
async fn with_normalisation_off_the_path_is_routed_as_sent(bin: HaproxyBin) {
    let got = serve(&bin, PathNormalization::Off, &["//admin/x", "/%61dmin/x", "/admin/x"]).await;
    assert_eq!(got[0], ("public".to_string(), "GET //admin/x HTTP/1.1".to_string()));
    assert_eq!(got[1], ("public".to_string(), "GET /%61dmin/x HTTP/1.1".to_string()));
    assert_eq!(got[2], ("admin".to_string(), "GET /admin/x HTTP/1.1".to_string()));
}

#[test]
fn normalisation_is_on_by_default_and_needs_the_experimental_directives() {
    let input = common::input(FIXTURE, Settings::default());
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let cfg = String::from_utf8(render.files["haproxy.cfg"].clone()).unwrap();
    assert!(cfg.contains("\n    expose-experimental-directives\n"), "{cfg}");
    assert!(cfg.contains("http-request normalize-uri path-merge-slashes"), "{cfg}");
    let off = common::input(FIXTURE, Settings { paths: PathNormalization::Off, ..Settings::default() });
    let cfg = String::from_utf8(haptic_render::render(&off, &Default::default()).unwrap().files["haproxy.cfg"].clone())
        .unwrap();
    assert!(!cfg.contains("normalize-uri") && !cfg.contains("expose-experimental-directives"), "{cfg}");
}
