//! Real HAProxy on 127.0.0.1 with the `default-backend` annotation: while the routed Service
//! has no ready endpoint its backup servers (the default backend's endpoints) answer; a
//! Service with endpoints answers itself.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::Settings;

mod common;

const YAML: &str = r#"
ingresses:
  - metadata:
      name: down
      namespace: shop
      annotations:
        nginx.ingress.kubernetes.io/default-backend: errors
    spec:
      ingressClassName: haptic
      rules:
        - host: down.example.com
          http:
            paths:
              - {path: /, pathType: Prefix, backend: {service: {name: empty, port: {number: 80}}}}
  - metadata:
      name: up
      namespace: shop
      annotations:
        nginx.ingress.kubernetes.io/default-backend: errors
    spec:
      ingressClassName: haptic
      rules:
        - host: up.example.com
          http:
            paths:
              - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
services:
  - metadata: {name: empty, namespace: shop}
    spec: {ports: [{port: 80, targetPort: 8080}]}
  - metadata: {name: web, namespace: shop}
    spec: {ports: [{port: 80, targetPort: 8080}]}
  - metadata: {name: errors, namespace: shop}
    spec: {ports: [{name: http, port: 80, targetPort: 8080}]}
endpointSlices:
  - metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{port: 8080}]
    endpoints:
      - {addresses: [127.0.0.1]}
  - metadata: {name: errors-1, namespace: shop, labels: {kubernetes.io/service-name: errors}}
    addressType: IPv4
    ports: [{name: http, port: 8080}]
    endpoints:
      - {addresses: [127.0.0.1]}
"#;

haptic_e2e::on_each_version!(a_service_without_endpoints_falls_back);
async fn a_service_without_endpoints_falls_back(bin: HaproxyBin) {
    let (web, errors) = (common::backend("web"), common::backend("errors"));
    let http_port = free_port();
    let mut input = common::input(
        YAML,
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    common::endpoints_on_loopback(&mut input, |svc| if svc == "errors" { errors } else { web });
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    assert!(render.verdicts.iter().all(|v| v.accepted()), "{:?}", render.verdicts);
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    for _ in 0..3 {
        let r = common::raw(addr, &get("down.example.com")).await;
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("errors"), "{r}");
        let r = common::raw(addr, &get("up.example.com")).await;
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("web"), "{r}");
    }
}
