//! Real HAProxy on 127.0.0.1 with `ssl-passthrough`: a TLS connection whose SNI names a
//! passthrough host reaches its backend undecrypted (curl verifies the backend's own
//! certificate, and the backend sees the SNI), while another host's TLS is still terminated by
//! HAProxy with that host's certificate and routed as HTTP; passthrough alone (no certificate
//! at all) still binds the HTTPS port.

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::Settings;
use k8s_openapi::api::core::v1::Secret;

mod common;

const YAML: &str = r#"
ingresses:
  - metadata:
      name: pt
      namespace: shop
      annotations:
        nginx.ingress.kubernetes.io/ssl-passthrough: "true"
    spec:
      ingressClassName: haptic
      rules:
        - host: pt.example.com
          http:
            paths:
              - {path: /, pathType: Prefix, backend: {service: {name: tlsb, port: {number: 443}}}}
  - metadata:
      name: web
      namespace: shop
    spec:
      ingressClassName: haptic
      tls: [{hosts: [web.example.com], secretName: web-tls}]
      rules:
        - host: web.example.com
          http:
            paths:
              - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
services:
  - metadata: {name: tlsb, namespace: shop}
    spec: {ports: [{port: 443, targetPort: 8443}]}
  - metadata: {name: web, namespace: shop}
    spec: {ports: [{port: 80, targetPort: 8080}]}
endpointSlices:
  - metadata: {name: tlsb-1, namespace: shop, labels: {kubernetes.io/service-name: tlsb}}
    addressType: IPv4
    ports: [{port: 8443}]
    endpoints:
      - {addresses: [127.0.0.1]}
  - metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{port: 8080}]
    endpoints:
      - {addresses: [127.0.0.1]}
"#;

haptic_e2e::on_each_version!(tls_passes_through_by_sni);
async fn tls_passes_through_by_sni(bin: HaproxyBin) {
    let pki = tempfile::tempdir().unwrap();
    haptic_e2e::tls::make_ca_for(pki.path(), "pt", "DNS:pt.example.com");
    haptic_e2e::tls::make_host_cert(pki.path(), "web", "web.example.com");
    let read = |f: &str| std::fs::read(pki.path().join(f)).unwrap();
    // The passthrough backend terminates TLS itself, with its own certificate.
    let backend_dir = tempfile::tempdir().unwrap();
    let mut bundle = read("pt.pem");
    bundle.extend(read("pt.key"));
    std::fs::write(backend_dir.path().join("pt.pem"), bundle).unwrap();
    let tls_port = free_port();
    std::fs::write(
        backend_dir.path().join("haproxy.cfg"),
        format!(
            "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n\
             frontend tls\n    bind 127.0.0.1:{tls_port} ssl crt pt.pem\n    http-request return status 200 content-type text/plain lf-string \"backend sni=%[ssl_fc_sni]\"\n"
        ),
    )
    .unwrap();
    let _backend = Haproxy::start(&bin, HaproxyOpts::new(backend_dir.path())).await.unwrap();

    let web = common::backend("web");
    let (http_port, https_port) = (free_port(), free_port());
    let mut input = common::input(
        YAML,
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, https_port, min_slots: 2, ..Settings::default() },
    );
    common::endpoints_on_loopback(&mut input, |svc| if svc == "tlsb" { tls_port } else { web });
    let mut s = Secret::default();
    s.metadata.name = Some("web-tls".into());
    s.metadata.namespace = Some("shop".into());
    s.type_ = Some("kubernetes.io/tls".into());
    s.data = Some(
        [("tls.crt", read("web.pem")), ("tls.key", read("web.key"))]
            .into_iter()
            .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v)))
            .collect(),
    );
    input.secrets.push(std::sync::Arc::new(s));
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    assert!(render.verdicts.iter().all(|v| v.accepted()), "{:?}", render.verdicts);
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let ca = pki.path().join("ca.pem");

    // Passed through: curl verifies the backend's own certificate for pt.example.com.
    let (code, body) = common::curl_tls("pt.example.com", https_port, &ca).await;
    assert_eq!((code, body.as_str()), (Some(0), "backend sni=pt.example.com"), "{body}");
    // Terminated by HAProxy with web.example.com's certificate, routed as HTTP.
    let (code, body) = common::curl_tls("web.example.com", https_port, &ca).await;
    assert_eq!((code, body.as_str()), (Some(0), "web"), "{body}");

    // Passthrough alone (no certificate to terminate with): the HTTPS port is still bound.
    let (http_port, https_port) = (free_port(), free_port());
    let mut only = input.clone();
    only.ingresses.retain(|i| i.metadata.name.as_deref() == Some("pt"));
    only.secrets.clear();
    only.settings.http_port = http_port;
    only.settings.https_port = https_port;
    let render = haptic_render::render(&only, &Default::default()).unwrap();
    assert!(!String::from_utf8_lossy(&render.files["haproxy.cfg"]).contains("haptic_tls_terminate"));
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h2 = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let (code, body) = common::curl_tls("pt.example.com", https_port, &ca).await;
    assert_eq!((code, body.as_str()), (Some(0), "backend sni=pt.example.com"), "{body}");
}
