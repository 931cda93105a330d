//! Real HAProxy on 127.0.0.1 presenting a Gateway's client certificate
//! (`spec.tls.backend.clientCertificateRef`) to a real TLS backend (another HAProxy) that
//! requires one, for the backends a BackendTLSPolicy has it speak TLS to. One route attached to
//! three Gateways: through the Gateway with the certificate the backend answers and sees it;
//! through a Gateway without one, and through a Gateway naming another namespace's Secret
//! without a ReferenceGrant (the attack: its `ResolvedRefs` is False and that Secret is never
//! read), the backend refuses the connection (502 or 503).

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::gateway::GatewayObjects;

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      gatewayClassName: haptic
      listeners: [{name: web, port: 80, protocol: HTTP}]
      tls: {backend: {clientCertificateRef: {group: "", kind: Secret, name: client}}}
  - metadata: {name: bare, namespace: shop, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      gatewayClassName: haptic
      listeners: [{name: web, port: 80, protocol: HTTP}]
  - metadata: {name: stranger, namespace: shop, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      gatewayClassName: haptic
      listeners: [{name: web, port: 80, protocol: HTTP}]
      tls: {backend: {clientCertificateRef: {name: client, namespace: other}}}
routes:
  - metadata: {name: r, namespace: shop}
    spec:
      parentRefs: [{name: gw}, {name: bare}, {name: stranger}]
      hostnames: [app.example.com]
      rules:
        - backendRefs: [{name: secure, port: 443}]
backendTlsPolicies:
  - metadata: {name: secure, namespace: shop}
    spec:
      targetRefs: [{group: "", kind: Service, name: secure}]
      validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}], hostname: abc.example.com}
services:
  - metadata: {name: secure, namespace: shop}
    spec: {ports: [{name: btls, port: 443}]}
"#;

haptic_e2e::on_each_version!(a_gateway_presents_its_client_certificate_to_tls_backends);
async fn a_gateway_presents_its_client_certificate_to_tls_backends(bin: haptic_e2e::HaproxyBin) {
    let (pki, theirs, backend_dir) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    haptic_e2e::tls::make_ca_for(pki.path(), "srv", "DNS:abc.example.com");
    haptic_e2e::tls::make_host_cert(pki.path(), "cli", "client.example.com");
    // Another namespace's Secret, signed by the same CA: only a ReferenceGrant could lend it.
    haptic_e2e::tls::make_host_cert(pki.path(), "theirs", "theirs.example.com");
    std::fs::copy(pki.path().join("theirs.pem"), theirs.path().join("theirs.pem")).unwrap();
    std::fs::copy(pki.path().join("theirs.key"), theirs.path().join("theirs.key")).unwrap();
    // Requires a client certificate that CA signed, and answers with its common name.
    let mutual = ("ca-file ca.pem verify required", "cn=%[ssl_c_s_dn(CN)]");
    let (_backend, tls_port) = common::tls_backend(&bin, pki.path(), backend_dir.path(), mutual).await;

    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    objects.endpoint_slices.push(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "secure", "namespace": "shop", "labels": {"kubernetes.io/service-name": "secure"}},
            "addressType": "IPv4",
            "ports": [{"name": "btls", "port": tls_port}],
            "endpoints": [{"addresses": ["127.0.0.1"]}],
        }))
        .unwrap(),
    );
    let ca = std::fs::read(pki.path().join("ca.pem")).unwrap();
    objects.config_maps = vec![common::ca_config_map("shop", "ca", &ca)];
    objects.secrets = vec![
        common::tls_secret_from(pki.path(), "cli", "shop", "client"),
        common::tls_secret_from(theirs.path(), "theirs", "other", "client"),
    ];
    let (render, out) = haptic_render::render_gateway(
        &objects.input("haptic", common::loopback_gateway(free_port())),
        &Default::default(),
    )
    .unwrap();
    assert!(common::accepted(&out, "r").status, "{:?}", out.routes);
    let gw = |name: &str| out.gateways.iter().find(|g| g.object.name == name).unwrap();
    let cond = |name: &str, t: &str| {
        let c = gw(name).conditions.iter().find(|c| c.type_ == t).unwrap_or_else(|| panic!("{name} {t}"));
        (c.status, c.reason)
    };
    assert_eq!(cond("gw", "ResolvedRefs"), (true, "ResolvedRefs"));
    assert_eq!(cond("bare", "ResolvedRefs"), (true, "ResolvedRefs"));
    assert_eq!(cond("stranger", "ResolvedRefs"), (false, "RefNotPermitted"));
    assert_eq!(cond("stranger", "Accepted"), (true, "Accepted"), "a Gateway still serves without it");
    let files: Vec<&String> = render.files.keys().filter(|k| k.starts_with("certs/backendclient_")).collect();
    assert_eq!(files, ["certs/backendclient_shop_client.pem"], "another namespace's Secret is never read");
    let cfg = String::from_utf8(render.files["haproxy.cfg"].clone()).unwrap();
    assert_eq!(cfg.matches(" crt 'certs/backendclient_shop_client.pem'").count(), 2, "one backend's slots:\n{cfg}");

    let tree = tempfile::tempdir().unwrap();
    common::write_tree(&render, tree.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(tree.path())).await.unwrap();
    let get = |name: &str| {
        let port = gw(name).service.ports[0].1;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        async move { common::raw(addr, "GET / HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n").await }
    };
    let r = get("gw").await;
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("cn=client.example.com"), "{r}");
    // The backend refuses the connection: 502 (with TLS 1.3 the server reports the missing
    // certificate after the handshake) or 503, never its answer.
    for name in ["bare", "stranger"] {
        let r = get(name).await;
        assert!(r.starts_with("HTTP/1.1 502") || r.starts_with("HTTP/1.1 503"), "{name}: {r}");
    }
}
