//! Real HAProxy on 127.0.0.1 serving TLSRoutes on a Gateway's TLS Passthrough listener, beside
//! an HTTPRoute on its HTTP listener: a connection goes, undecrypted, by its SNI to its route's
//! backend (curl verifies the backend's own certificate, and the backend sees the SNI); an
//! exact host wins over a wildcard one; a name no route takes, or whose route's backends do not
//! exist, is closed. A TLS Terminate listener on the same port (mixed): its host's connections
//! are decrypted with the listener's certificate and reach a plain backend; one whose
//! certificate does not resolve closes its connections, never passing them through. The attack: a TLSRoute
//! of another namespace naming the same host on a listener that allows only its own namespace
//! is refused in its own status, and the host still reaches its owner. The backends are HAProxy
//! too, each terminating TLS with its own certificate.

use std::path::Path;
use std::process::Command;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::gateway::GatewayObjects;

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: shop}
    spec:
      gatewayClassName: haptic
      listeners:
        - {name: tls, port: 443, protocol: TLS, hostname: "*.example.com", tls: {mode: Passthrough}}
        - name: term
          port: 443
          protocol: TLS
          hostname: t.example.com
          tls: {mode: Terminate, certificateRefs: [{name: t-cert}]}
        - name: broken
          port: 8443
          protocol: TLS
          hostname: x.example.com
          tls: {mode: Terminate, certificateRefs: [{name: no-such-secret}]}
        - {name: web, port: 80, protocol: HTTP}
routes:
  - metadata: {name: page, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, sectionName: web}]
      rules: [{backendRefs: [{name: page, port: 80}]}]
tlsRoutes:
  - metadata: {name: thief, namespace: other, creationTimestamp: "2025-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, namespace: shop}]
      hostnames: [a.example.com]
      rules: [{backendRefs: [{name: grab, port: 443}]}]
  - metadata: {name: a, namespace: shop, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, sectionName: tls}]
      hostnames: [a.example.com]
      rules: [{backendRefs: [{name: a, port: 443}]}]
  - metadata: {name: wild, namespace: shop, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, sectionName: tls}]
      hostnames: ["*.example.com"]
      rules: [{backendRefs: [{name: b, port: 443}]}]
  - metadata: {name: plain, namespace: shop, creationTimestamp: "2026-01-05T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, sectionName: term}]
      hostnames: [t.example.com]
      rules: [{backendRefs: [{name: page, port: 80}]}]
  - metadata: {name: undecryptable, namespace: shop, creationTimestamp: "2026-01-06T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, sectionName: broken}]
      hostnames: [x.example.com]
      rules: [{backendRefs: [{name: page, port: 80}]}]
  - metadata: {name: gone, namespace: shop, creationTimestamp: "2026-01-04T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [gone.example.com]
      rules: [{backendRefs: [{name: nothing, port: 443}]}]
services:
  - metadata: {name: page, namespace: shop}
    spec: {ports: [{port: 80}]}
  - metadata: {name: a, namespace: shop}
    spec: {ports: [{port: 443}]}
  - metadata: {name: b, namespace: shop}
    spec: {ports: [{port: 443}]}
  - metadata: {name: grab, namespace: other}
    spec: {ports: [{port: 443}]}
endpointSlices:
  - metadata: {name: page, namespace: shop, labels: {kubernetes.io/service-name: page}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: a, namespace: shop, labels: {kubernetes.io/service-name: a}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: b, namespace: shop, labels: {kubernetes.io/service-name: b}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: grab, namespace: other, labels: {kubernetes.io/service-name: grab}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// An HAProxy terminating TLS on `port` with `<name>.pem`/`<name>.key` of `pki`, answering
/// `<name> sni=<SNI>`.
async fn tls_backend(bin: &HaproxyBin, pki: &Path, name: &str, port: u16) -> (tempfile::TempDir, Haproxy) {
    let dir = tempfile::tempdir().unwrap();
    let mut bundle = std::fs::read(pki.join(format!("{name}.pem"))).unwrap();
    bundle.extend(std::fs::read(pki.join(format!("{name}.key"))).unwrap());
    std::fs::write(dir.path().join("own.pem"), bundle).unwrap();
    let cfg = format!(
        "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    \
         timeout server 30s\nfrontend tls\n    bind 127.0.0.1:{port} ssl crt own.pem\n    \
         http-request return status 200 content-type text/plain lf-string \"{name} sni=%[ssl_fc_sni]\"\n"
    );
    std::fs::write(dir.path().join("haproxy.cfg"), cfg).unwrap();
    let h = Haproxy::start(bin, HaproxyOpts::new(dir.path())).await.unwrap();
    (dir, h)
}

haptic_e2e::on_each_version!(tls_routes_pass_connections_through_by_sni);
async fn tls_routes_pass_connections_through_by_sni(bin: HaproxyBin) {
    let pki = tempfile::tempdir().unwrap();
    haptic_e2e::tls::make_ca_for(pki.path(), "a", "DNS:a.example.com");
    for (name, host) in [("b", "b.example.com"), ("grab", "a.example.com"), ("t", "t.example.com")] {
        haptic_e2e::tls::make_host_cert(pki.path(), name, host);
    }
    let (a, b, grab) = (free_port(), free_port(), free_port());
    let _a = tls_backend(&bin, pki.path(), "a", a).await;
    let _b = tls_backend(&bin, pki.path(), "b", b).await;
    let _grab = tls_backend(&bin, pki.path(), "grab", grab).await;
    let page = common::echo_backend("page");
    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    objects.secrets.push(common::tls_secret_from(pki.path(), "t", "shop", "t-cert"));
    for s in &mut objects.endpoint_slices {
        let port = match s.metadata.name.as_deref() {
            Some("a") => a,
            Some("b") => b,
            Some("grab") => grab,
            _ => page,
        };
        s.ports.as_mut().unwrap()[0].port = Some(port.into());
    }
    let settings = common::loopback_gateway(free_port());
    let (render, out) = haptic_render::render_gateway(&objects.input("haptic", settings), &Default::default()).unwrap();
    let accepted = |name: &str| common::accepted(&out, name);
    for name in ["a", "wild", "page", "plain"] {
        assert!(accepted(name).status, "{name}: {:?}", out.routes);
    }
    let thief = accepted("thief");
    assert_eq!((thief.status, thief.reason), (false, "NotAllowedByListeners"), "{thief:?}");
    let listeners = &out.gateways[0].listeners;
    let kinds: Vec<&str> = listeners[0].supported_kinds.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!((kinds, listeners[0].attached_routes), (vec!["TLSRoute"], 3), "{listeners:?}");
    let gone = out.routes.iter().find(|r| r.object.name == "gone").unwrap();
    let resolved = gone.parents[0].conditions.iter().find(|c| c.type_ == "ResolvedRefs").unwrap();
    assert_eq!((resolved.status, resolved.reason), (false, "BackendNotFound"), "{resolved:?}");
    assert_eq!(listeners[1].attached_routes, 1, "{listeners:?}");
    let unresolved = listeners[2].conditions.iter().find(|c| c.type_ == "ResolvedRefs").unwrap();
    assert_eq!((unresolved.status, unresolved.reason), (false, "InvalidCertificateRef"), "{listeners:?}");
    let kinds: Vec<&str> = listeners[3].supported_kinds.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!((kinds, listeners[3].attached_routes), (vec!["HTTPRoute", "GRPCRoute"], 1), "{listeners:?}");
    let port_of = |listener: u16| out.gateways[0].service.ports.iter().find(|p| p.0 == listener).unwrap().1;
    let (tls, web, broken) = (port_of(443), port_of(80), port_of(8443));
    let tree = tempfile::tempdir().unwrap();
    common::write_tree(&render, tree.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(tree.path())).await.unwrap();
    let ca = pki.path().join("ca.pem");

    // Through, undecrypted: curl verifies each backend's own certificate.
    assert_eq!(common::curl_tls("a.example.com", tls, &ca).await, (Some(0), "a sni=a.example.com".into()));
    assert_eq!(common::curl_tls("b.example.com", tls, &ca).await, (Some(0), "b sni=b.example.com".into()));
    // Decrypted here with the Terminate listener's certificate (curl verifies it), then plain.
    let (code, body) = common::curl_tls("t.example.com", tls, &ca).await;
    assert_eq!(code, Some(0), "{body}");
    assert!(body.starts_with("page\nGET / HTTP/1.1"), "{body}");
    // A name no route takes, and one whose route has no backend: closed, never answered (an
    // HTTP answer would be a "wrong version number" from curl's TLS).
    // And a Terminate listener without a certificate: closed, never passed through undecrypted.
    for (host, port) in [("a.example.org", tls), ("gone.example.com", tls), ("x.example.com", broken)] {
        let (code, body) = common::curl_tls(host, port, &ca).await;
        assert_ne!(code, Some(0), "{host}: {body}");
        assert!(!body.contains("wrong version number"), "{host}: {body}");
    }
    // The HTTPRoute beside them.
    let out = Command::new("curl").args(["-s", &format!("http://127.0.0.1:{web}/x")]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("page\nGET /x HTTP/1.1"), "{out:?}");
}

/// A TLSRoute host added to a TLS listener, to a Service a TLSRoute already uses, changes the
/// maps only: the config is byte for byte the same, so the change is runtime (no reload).
#[test]
fn a_new_tls_host_changes_maps_only() {
    let objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    let settings = || common::loopback_gateway(20000);
    let t = Default::default();
    let (before, out) = haptic_render::render_gateway(&objects.clone().input("haptic", settings()), &t).unwrap();
    let mut more = objects;
    let mut extra = more.tls_routes.iter().find(|r| r.metadata.name.as_deref() == Some("a")).unwrap().clone();
    extra.metadata.name = Some("c".into());
    extra.spec.hostnames = vec!["c.example.com".into()];
    more.tls_routes.push(extra);
    let mut input = more.input("haptic", settings());
    input.previous_slots = out.slots;
    let (after, out) = haptic_render::render_gateway(&input, &t).unwrap();
    let c = out.routes.iter().find(|r| r.object.name == "c").unwrap();
    assert!(c.parents[0].conditions.iter().any(|c| c.type_ == "Accepted" && c.status), "{c:?}");
    assert_eq!(
        String::from_utf8_lossy(&before.files["haproxy.cfg"]),
        String::from_utf8_lossy(&after.files["haproxy.cfg"]),
        "a new TLS host changes maps only"
    );
    assert_ne!(before.files["maps/hosts.map"], after.files["maps/hosts.map"]);
}
