//! Real HAProxy on 127.0.0.1 talking TLS to a real TLS backend (another HAProxy) as the
//! `proxy-ssl-*` annotations ask: verified against the Secret's CA and the name asked (sent as
//! SNI), a backend whose certificate another CA signed or that carries another name answering
//! 503, and an Ingress asking to verify with a Secret that has no CA refused whole.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::Settings;
use k8s_openapi::api::core::v1::Secret;

mod common;

fn ingress(name: &str, svc: &str, secret: &str, ssl_name: &str) -> String {
    format!(
        r#"
  - metadata:
      name: {name}
      namespace: shop
      annotations:
        nginx.ingress.kubernetes.io/backend-protocol: HTTPS
        nginx.ingress.kubernetes.io/proxy-ssl-secret: {secret}
        nginx.ingress.kubernetes.io/proxy-ssl-verify: "on"
        nginx.ingress.kubernetes.io/proxy-ssl-name: {ssl_name}
        nginx.ingress.kubernetes.io/proxy-ssl-server-name: "on"
    spec:
      ingressClassName: haptic
      rules:
        - host: {name}.example.com
          http:
            paths:
              - {{path: /, pathType: Prefix, backend: {{service: {{name: {svc}, port: {{number: 443}}}}}}}}"#
    )
}

fn secret(name: &str, pairs: &[(&str, Vec<u8>)]) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some("shop".into());
    s.data = Some(pairs.iter().map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.clone()))).collect());
    s
}

haptic_e2e::on_each_version!(backends_are_verified_as_asked);
async fn backends_are_verified_as_asked(bin: HaproxyBin) {
    // The TLS backend: a certificate for backend.internal from one CA; another CA beside it.
    let pki = tempfile::tempdir().unwrap();
    haptic_e2e::tls::make_ca_for(pki.path(), "srv", "DNS:backend.internal");
    let other = tempfile::tempdir().unwrap();
    haptic_e2e::tls::make_ca(other.path(), "x");
    let read = |d: &std::path::Path, f: &str| std::fs::read(d.join(f)).unwrap();
    let backend_dir = tempfile::tempdir().unwrap();
    let mut bundle = read(pki.path(), "srv.pem");
    bundle.extend(read(pki.path(), "srv.key"));
    std::fs::write(backend_dir.path().join("srv.pem"), bundle).unwrap();
    let tls_port = free_port();
    std::fs::write(
        backend_dir.path().join("haproxy.cfg"),
        format!(
            "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
             frontend tls\n    bind 127.0.0.1:{tls_port} ssl crt srv.pem\n    http-request return status 200 content-type text/plain lf-string \"tls-ok sni=%[ssl_fc_sni]\"\n"
        ),
    )
    .unwrap();
    let _backend = Haproxy::start(&bin, HaproxyOpts::new(backend_dir.path())).await.unwrap();

    let mut yaml = String::from("ingresses:");
    yaml.push_str(&ingress("verified", "tls1", "upstream-ca", "backend.internal"));
    yaml.push_str(&ingress("wrong-ca", "tls2", "other-ca", "backend.internal"));
    yaml.push_str(&ingress("wrong-name", "tls3", "shop/upstream-ca", "other.internal"));
    yaml.push_str(&ingress("no-ca", "tls4", "client-only", "backend.internal"));
    yaml.push_str("\nservices:");
    for s in ["tls1", "tls2", "tls3", "tls4"] {
        yaml.push_str(&format!(
            "\n  - metadata: {{name: {s}, namespace: shop}}\n    spec: {{ports: [{{port: 443, targetPort: 8443}}]}}"
        ));
    }
    yaml.push_str("\nendpointSlices:");
    for s in ["tls1", "tls2", "tls3", "tls4"] {
        yaml.push_str(&format!(
            "\n  - metadata: {{name: {s}-1, namespace: shop, labels: {{kubernetes.io/service-name: {s}}}}}\n    addressType: IPv4\n    ports: [{{port: 8443}}]\n    endpoints:\n      - {{addresses: [127.0.0.1]}}"
        ));
    }
    yaml.push('\n');
    let http_port = free_port();
    let mut input = common::input(
        &yaml,
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    common::endpoints_on_loopback(&mut input, |_| tls_port);
    input.secrets.push(std::sync::Arc::new(secret("upstream-ca", &[("ca.crt", read(pki.path(), "ca.pem"))])));
    input.secrets.push(std::sync::Arc::new(secret("other-ca", &[("ca.crt", read(other.path(), "ca.pem"))])));
    input.secrets.push(std::sync::Arc::new(secret(
        "client-only",
        &[("tls.crt", read(other.path(), "x.pem")), ("tls.key", read(other.path(), "x.key"))],
    )));
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let v = |n: &str| render.verdicts.iter().find(|v| v.object.name == n).unwrap().clone();
    for n in ["verified", "wrong-ca", "wrong-name"] {
        assert!(v(n).accepted(), "{:?}", v(n));
    }
    let no_ca = &v("no-ca").refusals[0];
    assert_eq!(
        (no_ca.cause, no_ca.field.as_str()),
        (haptic_render::Cause::Invalid, "metadata.annotations[nginx.ingress.kubernetes.io/proxy-ssl-secret]"),
        "{no_ca:?}"
    );
    assert!(render.files.contains_key("certs/upstream_shop_upstream-ca_ca.pem"));
    assert!(
        !render.files.contains_key("certs/upstream_shop_client-only_client.pem"),
        "a refused Ingress's files stay out"
    );
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");

    let r = common::raw(addr, &get("verified.example.com")).await;
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("tls-ok sni=backend.internal"), "{r}");
    for host in ["wrong-ca.example.com", "wrong-name.example.com"] {
        let r = common::raw(addr, &get(host)).await;
        assert!(r.starts_with("HTTP/1.1 503"), "{host}: {r}");
    }
    let r = common::raw(addr, &get("no-ca.example.com")).await;
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
}
