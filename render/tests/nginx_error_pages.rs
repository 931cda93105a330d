//! Real HAProxy on 127.0.0.1 with the `custom-http-errors` annotation: a backend response with
//! a listed status is replaced by HAProxy's page for it (the status kept), a status HAProxy has
//! no page for by an empty body, an unlisted status passes with the backend's body, and another
//! Ingress routing to the same Service without the annotation gets the backend's responses as
//! they are. With `default-backend` too, the pages are still HAProxy's (a Warning says so).

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::Settings;

mod common;

const YAML: &str = r#"
ingresses:
  - metadata:
      name: pages
      namespace: shop
      annotations:
        nginx.ingress.kubernetes.io/custom-http-errors: "503, 418"
    spec:
      ingressClassName: haptic
      rules:
        - host: pages.example.com
          http:
            paths:
              - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
  - metadata:
      name: plain
      namespace: shop
    spec:
      ingressClassName: haptic
      rules:
        - host: plain.example.com
          http:
            paths:
              - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
  - metadata:
      name: fallback
      namespace: shop
      annotations:
        haptic.dev/custom-http-errors: "404"
        nginx.ingress.kubernetes.io/default-backend: errors
    spec:
      ingressClassName: haptic
      rules:
        - host: fallback.example.com
          http:
            paths:
              - {path: /, pathType: Prefix, backend: {service: {name: other, port: {number: 80}}}}
services:
  - metadata: {name: web, namespace: shop}
    spec: {ports: [{port: 80, targetPort: 8080}]}
  - metadata: {name: other, namespace: shop}
    spec: {ports: [{port: 80, targetPort: 8080}]}
  - metadata: {name: errors, namespace: shop}
    spec: {ports: [{port: 80, targetPort: 8080}]}
endpointSlices:
  - metadata: {name: other-1, namespace: shop, labels: {kubernetes.io/service-name: other}}
    addressType: IPv4
    ports: [{port: 8080}]
    endpoints:
      - {addresses: [127.0.0.1]}
  - metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{port: 8080}]
    endpoints:
      - {addresses: [127.0.0.1]}
  - metadata: {name: errors-1, namespace: shop, labels: {kubernetes.io/service-name: errors}}
    addressType: IPv4
    ports: [{port: 8080}]
    endpoints:
      - {addresses: [127.0.0.1]}
"#;

/// A backend answering `/<status>` with that status and the body `backend <status>` (200 for
/// any other path).
fn status_backend() -> u16 {
    common::backend_by_path(|path| {
        let code: u16 = path.trim_start_matches('/').parse().unwrap_or(200);
        (code, format!("backend {code}"))
    })
}

fn body(resp: &str) -> &str {
    resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default()
}

haptic_e2e::on_each_version!(listed_statuses_get_haproxy_pages);
async fn listed_statuses_get_haproxy_pages(bin: HaproxyBin) {
    let (web, errors) = (status_backend(), common::backend("errors"));
    let http_port = free_port();
    let mut input = common::input(
        YAML,
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    common::endpoints_on_loopback(&mut input, |svc| if svc == "errors" { errors } else { web });
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    assert!(render.verdicts.iter().all(|v| v.accepted()), "{:?}", render.verdicts);
    let pages = render.verdicts.iter().find(|v| v.object.name == "pages").unwrap();
    assert!(pages.warnings.len() == 1 && pages.warnings[0].cause == haptic_render::Cause::Differs, "{pages:?}");
    let fallback = render.verdicts.iter().find(|v| v.object.name == "fallback").unwrap();
    assert_eq!(fallback.warnings.len(), 1, "{fallback:?}");
    assert_eq!(fallback.warnings[0].field, "metadata.annotations[haptic.dev/custom-http-errors]");
    assert_eq!(fallback.warnings[0].cause, haptic_render::Cause::Differs, "{fallback:?}");
    // Only integers of ours in the rules; the policy variable is set though no request rule needs it.
    let cfg = String::from_utf8_lossy(&render.files["haproxy.cfg"]);
    assert!(cfg.contains("    http-request set-var(txn.policy) var(txn.rule),map_str(maps/policies.map)\n"), "{cfg}");
    for l in [" 418 if { var(txn.policy) -m str p", " 503 default-errorfiles if { var(txn.policy) -m str p"] {
        assert!(cfg.contains(&format!("    http-response return status{l}")), "{l}: {cfg}");
    }
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |host: &str, path: &str| {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        async move { common::raw(addr, &req).await }
    };

    // Listed, with a HAProxy page: HAProxy's page, the status kept.
    let r = get("pages.example.com", "/503").await;
    assert_eq!(common::status(&r), 503, "{r}");
    assert!(body(&r).contains("<h1>503 Service Unavailable</h1>"), "{r}");
    assert!(!r.contains("backend"), "the backend's body is gone: {r}");
    // Listed, without a HAProxy page: the status kept, an empty body.
    let r = get("pages.example.com", "/418").await;
    assert_eq!(common::status(&r), 418, "{r}");
    assert_eq!(body(&r), "", "{r}");
    // Not listed: the backend's response as it is.
    let r = get("pages.example.com", "/404").await;
    assert_eq!((common::status(&r), body(&r)), (404, "backend 404"), "{r}");
    let r = get("pages.example.com", "/").await;
    assert_eq!((common::status(&r), body(&r)), (200, "backend 200"), "{r}");

    // Another Ingress routing to the same Service, without the annotation: untouched.
    let r = get("plain.example.com", "/503").await;
    assert_eq!((common::status(&r), body(&r)), (503, "backend 503"), "{r}");

    // With default-backend (a backend of its own: it is a backend option): the page is
    // HAProxy's, never the default backend's (the routed Service has endpoints and answers).
    let r = get("fallback.example.com", "/404").await;
    assert_eq!(common::status(&r), 404, "{r}");
    assert!(body(&r).contains("<h1>404 Not Found</h1>"), "{r}");
    assert!(!r.contains("errors") && !r.contains("backend"), "{r}");
    let r = get("fallback.example.com", "/503").await;
    assert_eq!((common::status(&r), body(&r)), (503, "backend 503"), "{r}");
}
