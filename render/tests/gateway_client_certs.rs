//! Real HAProxy on 127.0.0.1 checking clients' certificates as a Gateway's
//! `spec.tls.frontend` asks: on the default port only a certificate from the default CA gets an
//! answer (another CA's, or none, ends the handshake); a port of its own (`perPort`) checks
//! against its own CA, and with `AllowInsecureFallback` lets every client through (the Gateway
//! says so in a condition). The attack: a port whose CA ConfigMap lives in another namespace
//! without a ReferenceGrant there does not read it, and its listener is not accepted
//! (RefNotPermitted, NoValidCACertificate) rather than serving unchecked; its twin with the
//! grant serves, checked.

use std::path::Path;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::gateway::GatewayObjects;

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: shop}
    spec:
      gatewayClassName: haptic
      tls:
        frontend:
          default:
            validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: clients}]}
          perPort:
            - port: 8443
              tls: {validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: partners}], mode: AllowInsecureFallback}}
            - port: 9443
              tls: {validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: theirs, namespace: other}]}}
            - port: 9444
              tls: {validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: shared, namespace: granting}]}}
      listeners:
        - {name: default, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: site}]}}
        - {name: fallback, port: 8443, protocol: HTTPS, tls: {certificateRefs: [{name: site}]}}
        - {name: stolen, port: 9443, protocol: HTTPS, tls: {certificateRefs: [{name: site}]}}
        - {name: granted, port: 9444, protocol: HTTPS, tls: {certificateRefs: [{name: site}]}}
        - {name: web, port: 80, protocol: HTTP}
routes:
  - metadata: {name: r, namespace: shop}
    spec:
      parentRefs: [{name: gw}]
      rules: [{backendRefs: [{name: app, port: 80}]}]
grants:
  - metadata: {name: g, namespace: granting}
    spec:
      from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: shop}]
      to: [{group: "", kind: ConfigMap, name: shared}]
services:
  - metadata: {name: app, namespace: shop}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: app, namespace: shop, labels: {kubernetes.io/service-name: app}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// The ConfigMap `ns/name` holding the CA `ca.pem` of `dir`.
fn config_map(ns: &str, name: &str, dir: &Path) -> k8s_openapi::api::core::v1::ConfigMap {
    common::ca_config_map(ns, name, &std::fs::read(dir.join("ca.pem")).unwrap())
}

/// curl to https://app.example.com:`port` on 127.0.0.1, trusting `ca`, with the client
/// certificate `client` (`<dir>/<file>.pem` and `.key`) when given: the body, or "" when the
/// handshake or the request failed.
async fn fetch(port: u16, ca: &Path, client: Option<(&Path, &str)>) -> String {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-s", "--max-time", "20", "--cacert"]).arg(ca.join("ca.pem"));
    if let Some((dir, file)) = client {
        cmd.arg("--cert").arg(dir.join(format!("{file}.pem"))).arg("--key").arg(dir.join(format!("{file}.key")));
    }
    cmd.arg("--resolve")
        .arg(format!("app.example.com:{port}:127.0.0.1"))
        .arg(format!("https://app.example.com:{port}/"));
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    if out.status.success() {
        String::from_utf8_lossy(&out.stdout).into_owned()
    } else {
        String::new()
    }
}

haptic_e2e::on_each_version!(clients_are_checked_as_the_gateway_asks);
async fn clients_are_checked_as_the_gateway_asks(bin: haptic_e2e::HaproxyBin) {
    // The server's CA signs the site and the default port's client; two other CAs the
    // partners' client and a stranger's.
    let (site, partners, stranger) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    haptic_e2e::tls::make_ca_for(site.path(), "site", "DNS:app.example.com");
    haptic_e2e::tls::make_host_cert(site.path(), "client", "client.example.com");
    haptic_e2e::tls::make_ca_for(partners.path(), "partner", "DNS:partner.example.com");
    haptic_e2e::tls::make_ca_for(stranger.path(), "x", "DNS:x.example.com");
    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    objects.endpoint_slices[0].ports.as_mut().unwrap()[0].port = Some(common::backend("app").into());
    objects.secrets.push(common::tls_secret_from(site.path(), "site", "shop", "site"));
    objects.config_maps = vec![
        config_map("shop", "clients", site.path()),
        config_map("shop", "partners", partners.path()),
        config_map("other", "theirs", stranger.path()),
        config_map("granting", "shared", partners.path()),
    ];
    let (render, out) = haptic_render::render_gateway(
        &objects.input("haptic", common::loopback_gateway(free_port())),
        &Default::default(),
    )
    .unwrap();
    let gw = &out.gateways[0];
    let insecure = gw.conditions.iter().find(|c| c.type_ == "InsecureFrontendValidationMode").expect("the condition");
    assert_eq!((insecure.status, insecure.reason), (true, "ConfigurationChanged"));
    let conds = |name: &str| -> Vec<(&str, bool, &str)> {
        let l = gw.listeners.iter().find(|l| l.name == name).unwrap();
        l.conditions.iter().filter(|c| c.type_ != "Conflicted").map(|c| (c.type_, c.status, c.reason)).collect()
    };
    for name in ["default", "fallback", "granted", "web"] {
        assert!(conds(name).iter().all(|c| c.1), "{name}: {:?}", conds(name));
    }
    assert_eq!(
        conds("stolen"),
        [
            ("Accepted", false, "NoValidCACertificate"),
            ("ResolvedRefs", false, "RefNotPermitted"),
            ("Programmed", false, "Invalid")
        ]
    );
    let cfg = String::from_utf8(render.files["haproxy.cfg"].clone()).unwrap();
    assert_eq!(cfg.matches(" verify required").count(), 2, "{cfg}");
    assert_eq!(cfg.matches(" verify optional").count(), 1, "{cfg}");

    let tree = tempfile::tempdir().unwrap();
    common::write_tree(&render, tree.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(tree.path())).await.unwrap();
    let port = |p: u16| gw.service.ports.iter().find(|(l, _)| *l == p).map(|(_, b)| *b);
    let (default, fallback, granted) = (port(443).unwrap(), port(8443).unwrap(), port(9444).unwrap());
    assert_eq!(port(9443), None, "the refused listener has no port on the Service");
    let ca = site.path();
    assert_eq!(fetch(default, ca, Some((site.path(), "client"))).await, "app");
    assert_eq!(fetch(default, ca, Some((partners.path(), "partner"))).await, "", "another CA's client");
    assert_eq!(fetch(default, ca, None).await, "", "no client certificate");
    for client in [Some((partners.path(), "partner")), Some((stranger.path(), "x")), None] {
        assert_eq!(fetch(fallback, ca, client).await, "app", "insecure fallback: {client:?}");
    }
    assert_eq!(fetch(granted, ca, Some((partners.path(), "partner"))).await, "app");
    assert_eq!(fetch(granted, ca, Some((site.path(), "client"))).await, "", "the granted CA only");
}
