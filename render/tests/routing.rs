//! Real HAProxy on 127.0.0.1 serving a fixture render routes by host and path to local
//! backends and answers 503 for a Service that does not exist.

use std::net::SocketAddr;

use haptic_e2e::net::{free_port, http_request};
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::ingress::Settings;

mod common;

haptic_e2e::on_each_version!(routes_by_host_and_path);
async fn routes_by_host_and_path(bin: haptic_e2e::HaproxyBin) {
    let bin = &bin;
    let (web, api) = (common::backend("web"), common::backend("api"));
    let (http_port, health_port) = (free_port(), free_port());
    let mut input = common::basic_input(Settings {
        bind_address: [127, 0, 0, 1].into(),
        http_port,
        min_slots: 2,
        health_port: Some(health_port),
        ..Settings::default()
    });
    common::endpoints_on_loopback(&mut input, |svc| if svc == "web" { web } else { api });
    // The Ingress with TLS serves plain HTTP too (else it is redirected to HTTPS).
    let young = input.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some("young")).unwrap();
    std::sync::Arc::make_mut(young).metadata.annotations =
        Some([("nginx.ingress.kubernetes.io/ssl-redirect".to_string(), "false".to_string())].into());
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |host: &'static str, path: &'static str| async move {
        http_request(addr, &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")).await.unwrap()
    };
    assert_eq!(get("shop.example.com", "/api/x").await, (200, "api".into()));
    assert_eq!(get("SHOP.example.com:80", "/api").await, (200, "api".into()));
    // Segment-wise: /apix is not under /api, so the default backend (web) answers.
    assert_eq!(get("shop.example.com", "/apix").await, (200, "web".into()));
    assert_eq!(get("shop.example.com", "/exact").await, (200, "web".into()));
    assert_eq!(get("any.example.com", "/whatever").await, (200, "web".into()));
    assert_eq!(get("shop.example.com", "/gone/x").await.0, 503);
    let health = SocketAddr::from(([127, 0, 0, 1], health_port));
    assert_eq!(haptic_e2e::net::http_get(health, "/healthz").await.unwrap(), (200, "ok".into()));
    assert_eq!(haptic_e2e::net::http_get(health, "/ready").await.unwrap(), (200, "ready".into()));
}
