//! Real HAProxy on 127.0.0.1 serving a fixture render routes by host and path to local
//! backends and answers 503 for a Service that does not exist.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};

use haptic_e2e::net::{free_port, http_request};
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::ingress::{IngressInput, Settings, INGRESS_CONTROLLER};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass, IngressClassSpec};

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Fixture {
    ingresses: Vec<Ingress>,
    services: Vec<Service>,
    endpoint_slices: Vec<EndpointSlice>,
    secrets: Vec<Secret>,
}

/// A backend answering every request with `name` (a thread per listener, ended with the test
/// process).
fn backend(name: &'static str) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}", name.len());
        }
    });
    port
}

async fn route(bin: &haptic_e2e::HaproxyBin) {
    let (web, api) = (backend("web"), backend("api"));
    let f: Fixture = serde_saphyr::from_str(include_str!("fixtures/basic.yaml")).unwrap();
    let mut slices = f.endpoint_slices;
    for s in &mut slices {
        let port = if s.metadata.name.as_deref() == Some("web-1") { web } else { api };
        for p in s.ports.iter_mut().flatten() {
            p.port = Some(port.into());
        }
        for e in &mut s.endpoints {
            e.addresses = vec!["127.0.0.1".into()];
        }
    }
    let mut class = IngressClass::default();
    class.metadata.name = Some("haptic".into());
    class.spec = Some(IngressClassSpec { controller: Some(INGRESS_CONTROLLER.into()), ..Default::default() });
    let http_port = free_port();
    let input = IngressInput {
        class,
        ingresses: f.ingresses,
        services: f.services,
        endpoint_slices: slices,
        secrets: f.secrets,
        previous_slots: Default::default(),
        settings: Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    };
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (path, bytes) in &render.files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
    }
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
}

#[tokio::test]
async fn routes_on_haproxy_2_6() {
    let bins = haptic_e2e::haproxy_bins();
    route(bins.iter().find(|b| b.version_string.starts_with("2.6")).expect("HAProxy 2.6")).await;
}

#[tokio::test]
async fn routes_on_haproxy_3_0() {
    let bins = haptic_e2e::haproxy_bins();
    route(bins.iter().find(|b| b.version_string.starts_with("3.0")).expect("HAProxy 3.0")).await;
}
