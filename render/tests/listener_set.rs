//! Real HAProxy on 127.0.0.1 serving a Gateway with a ListenerSet (HAProxy 2.6, 3.0, 3.2 and 3.4,
//! one case each): an HTTPRoute attached to the ListenerSet is served on its listeners' port and
//! hostnames only, beside the Gateway's own route; a ListenerSet from a namespace the Gateway does
//! not allow (claiming the Gateway's hostname, every hostname and a port of its own) and its route
//! change nothing in the config and get no request. HTTPS: a ListenerSet's listener on the
//! Gateway's port serves the certificate a ReferenceGrant to ListenerSets of its namespace lets it
//! use; one without that grant serves none and gets no request.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::gateway::GatewayObjects;
use haptic_render::gateway_api::{HttpRoute, ListenerSet};

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: edge, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      gatewayClassName: haptic
      allowedListeners: {namespaces: {from: Same}}
      listeners:
        - {name: http, port: 80, protocol: HTTP, hostname: site.test, allowedRoutes: {namespaces: {from: All}}}
listenerSets:
  - metadata: {name: team, namespace: edge, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRef: {name: gw}
      listeners:
        - {name: extra, port: 80, protocol: HTTP, hostname: extra.test}
        - {name: alt, port: 8080, protocol: HTTP, hostname: alt.test}
routes:
  - metadata: {name: site, namespace: edge, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      rules: [{backendRefs: [{name: v1, port: 80}]}]
  - metadata: {name: team, namespace: edge, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{kind: ListenerSet, group: gateway.networking.k8s.io, name: team}]
      rules: [{backendRefs: [{name: v2, port: 80}]}]
services:
  - metadata: {name: v1, namespace: edge}
    spec: {ports: [{port: 80}]}
  - metadata: {name: v2, namespace: edge}
    spec: {ports: [{port: 80}]}
  - metadata: {name: evil, namespace: tenant}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: v1, namespace: edge, labels: {kubernetes.io/service-name: v1}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: v2, namespace: edge, labels: {kubernetes.io/service-name: v2}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: evil, namespace: tenant, labels: {kubernetes.io/service-name: evil}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// A ListenerSet of namespace `tenant`, which the Gateway does not allow, older than every other
/// object, and its route.
const ATTACK: &str = r#"
- metadata: {name: grab, namespace: tenant, creationTimestamp: "2025-01-01T00:00:00Z"}
  spec:
    parentRef: {name: gw, namespace: edge}
    listeners:
      - {name: same, port: 80, protocol: HTTP, hostname: site.test, allowedRoutes: {namespaces: {from: All}}}
      - {name: any, port: 80, protocol: HTTP}
      - {name: own, port: 9000, protocol: HTTP}
"#;

const ATTACK_ROUTE: &str = r#"
- metadata: {name: steal, namespace: tenant, creationTimestamp: "2025-01-01T00:00:00Z"}
  spec:
    parentRefs: [{kind: ListenerSet, name: grab}]
    rules: [{backendRefs: [{name: evil, port: 80}]}]
"#;

haptic_e2e::on_each_version!(listener_set_routes_are_served_and_a_disallowed_one_changes_nothing);
async fn listener_set_routes_are_served_and_a_disallowed_one_changes_nothing(bin: haptic_e2e::HaproxyBin) {
    let ports: Vec<(&str, u16)> = ["v1", "v2", "evil"].into_iter().map(|n| (n, common::echo_backend(n))).collect();
    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    for s in &mut objects.endpoint_slices {
        let port = ports.iter().find(|(n, _)| s.metadata.name.as_deref() == Some(n)).unwrap().1;
        s.ports.as_mut().unwrap()[0].port = Some(port.into());
    }
    let (p80, p8080) = (free_port(), free_port());
    let mut input = objects.input("haptic", common::loopback_gateway(p80.min(p8080)));
    input.previous_slots.bind_ports = [("edge/gw:80".to_string(), p80), ("edge/gw:8080".to_string(), p8080)].into();
    let (render, out) = haptic_render::render_gateway(&input, &Default::default()).unwrap();
    assert!(common::accepted(&out, "team").status, "{:?}", out.routes);
    assert_eq!(out.gateways[0].attached_listener_sets, 1);
    assert_eq!(out.gateways[0].service.ports, [(80, p80), (8080, p8080)]);

    // The attack: the same config, with or without its route.
    let mut attacked = input.clone();
    let sets: Vec<ListenerSet> = serde_saphyr::from_str(ATTACK).unwrap();
    attacked.listener_sets.extend(sets.into_iter().map(std::sync::Arc::new));
    let (with_set, out2) = haptic_render::render_gateway(&attacked, &Default::default()).unwrap();
    let routes: Vec<HttpRoute> = serde_saphyr::from_str(ATTACK_ROUTE).unwrap();
    attacked.routes.extend(routes.into_iter().map(std::sync::Arc::new));
    let (with_route, out3) = haptic_render::render_gateway(&attacked, &Default::default()).unwrap();
    let text = |r: &haptic_render::Render| -> Vec<(String, String)> {
        r.files.iter().map(|(p, b)| (p.clone(), String::from_utf8_lossy(b).into_owned())).collect()
    };
    assert_eq!(text(&with_set), text(&render), "a disallowed ListenerSet changes no file");
    assert_eq!(text(&with_route), text(&render), "nor does a route attached to it");
    assert_eq!((&out2.gateways, &out3.gateways), (&out.gateways, &out.gateways));
    let grab = out3.listener_sets.iter().find(|s| s.object.name == "grab").unwrap();
    assert!(grab.conditions.iter().any(|c| c.type_ == "Accepted" && !c.status && c.reason == "NotAllowed"));
    assert!(!common::accepted(&out3, "steal").status);

    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&with_route, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let send = |port: u16, host: &'static str| async move {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        common::raw(addr, &format!("GET /x HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")).await
    };
    let served_by =
        |r: &str| r.split("\r\n\r\n").nth(1).unwrap_or_default().lines().next().unwrap_or_default().to_string();
    // The Gateway's own listener and route.
    assert_eq!(served_by(&send(p80, "site.test").await), "v1");
    // The ListenerSet's listeners: its hostnames, each on its own port.
    assert_eq!(served_by(&send(p80, "extra.test").await), "v2");
    assert_eq!(served_by(&send(p8080, "alt.test").await), "v2");
    assert_eq!(common::status(&send(p80, "alt.test").await), 404, "alt.test is on port 8080 only");
    assert_eq!(common::status(&send(p8080, "site.test").await), 404, "site.test is on port 80 only");
    assert_eq!(common::status(&send(p8080, "extra.test").await), 404);
    // The disallowed ListenerSet's catch-all gets nothing, and nothing reaches its backend.
    assert_eq!(common::status(&send(p80, "other.test").await), 404);
    for host in ["site.test", "extra.test", "other.test"] {
        assert_ne!(served_by(&send(p80, host).await), "evil", "{host}");
    }
}

const HTTPS_OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: edge, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      gatewayClassName: haptic
      allowedListeners: {namespaces: {from: All}}
      listeners:
        - {name: https, port: 443, protocol: HTTPS, hostname: gw.test, tls: {certificateRefs: [{name: gw}]}}
listenerSets:
  # Its certificate is in `pki`, granted to ListenerSets of `team`.
  - metadata: {name: team, namespace: team, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRef: {name: gw, namespace: edge}
      listeners:
        - {name: https, port: 443, protocol: HTTPS, hostname: team.test, tls: {certificateRefs: [{name: team, namespace: pki}]}}
  # The same certificate, not granted to ListenerSets of `other` (nor is a grant to its Gateways enough).
  - metadata: {name: other, namespace: other, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRef: {name: gw, namespace: edge}
      listeners:
        - {name: https, port: 443, protocol: HTTPS, hostname: other.test, tls: {certificateRefs: [{name: team, namespace: pki}]}}
grants:
  - metadata: {name: team, namespace: pki}
    spec:
      from: [{group: gateway.networking.k8s.io, kind: ListenerSet, namespace: team}, {group: gateway.networking.k8s.io, kind: Gateway, namespace: other}]
      to: [{group: "", kind: Secret}]
routes:
  - metadata: {name: gw, namespace: edge, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      rules: [{backendRefs: [{name: v1, port: 80}]}]
  - metadata: {name: team, namespace: team, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{kind: ListenerSet, name: team}]
      rules: [{backendRefs: [{name: v2, port: 80}]}]
  - metadata: {name: other, namespace: other, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{kind: ListenerSet, name: other}]
      rules: [{backendRefs: [{name: v3, port: 80}]}]
services:
  - metadata: {name: v1, namespace: edge}
    spec: {ports: [{port: 80}]}
  - metadata: {name: v2, namespace: team}
    spec: {ports: [{port: 80}]}
  - metadata: {name: v3, namespace: other}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: v1, namespace: edge, labels: {kubernetes.io/service-name: v1}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: v2, namespace: team, labels: {kubernetes.io/service-name: v2}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: v3, namespace: other, labels: {kubernetes.io/service-name: v3}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// A `kubernetes.io/tls` Secret `ns/name` with a fresh self-signed certificate for `host`, and the
/// certificate (a client's CA for it).
fn secret_for(
    dir: &std::path::Path,
    ns: &str,
    name: &str,
    host: &str,
) -> (k8s_openapi::api::core::v1::Secret, Vec<u8>) {
    let (c, k) = common::self_signed(dir, name, host, &[host]);
    let mut s = k8s_openapi::api::core::v1::Secret::default();
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some(ns.into());
    s.type_ = Some("kubernetes.io/tls".into());
    let data = [("tls.crt", c.clone()), ("tls.key", k)];
    s.data = Some(data.into_iter().map(|(f, b)| (f.to_string(), k8s_openapi::ByteString(b))).collect());
    (s, c)
}

haptic_e2e::on_each_version!(a_listener_set_serves_https_with_a_certificate_granted_to_it);
async fn a_listener_set_serves_https_with_a_certificate_granted_to_it(bin: haptic_e2e::HaproxyBin) {
    let ports: Vec<(&str, u16)> = ["v1", "v2", "v3"].into_iter().map(|n| (n, common::echo_backend(n))).collect();
    let mut objects: GatewayObjects = serde_saphyr::from_str(HTTPS_OBJECTS).unwrap();
    for s in &mut objects.endpoint_slices {
        let port = ports.iter().find(|(n, _)| s.metadata.name.as_deref() == Some(n)).unwrap().1;
        s.ports.as_mut().unwrap()[0].port = Some(port.into());
    }
    let certs = tempfile::tempdir().unwrap();
    let (gw_secret, gw_ca) = secret_for(certs.path(), "edge", "gw", "gw.test");
    let (team_secret, team_ca) = secret_for(certs.path(), "pki", "team", "team.test");
    objects.secrets = vec![gw_secret, team_secret];
    let bind = free_port();
    let (render, out) =
        haptic_render::render_gateway(&objects.input("haptic", common::loopback_gateway(bind)), &Default::default())
            .unwrap();
    assert!(common::accepted(&out, "team").status, "{:?}", out.routes);
    let other = out.listener_sets.iter().find(|s| s.object.name == "other").unwrap();
    assert!(other.listeners[0].conditions.iter().any(|c| c.type_ == "ResolvedRefs" && c.reason == "RefNotPermitted"));
    assert!(!common::accepted(&out, "other").status);
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let ca = |name: &str, pem: &[u8]| {
        let p = certs.path().join(format!("{name}-ca.pem"));
        std::fs::write(&p, pem).unwrap();
        p
    };
    let (gw_ca, team_ca) = (ca("gw", &gw_ca), ca("team", &team_ca));
    // The Gateway's listener with its certificate, the ListenerSet's with the one granted to it.
    let (code, body) = common::curl_tls("gw.test", bind, &gw_ca).await;
    assert!(code == Some(0) && body.starts_with("v1"), "{code:?} {body}");
    let (code, body) = common::curl_tls("team.test", bind, &team_ca).await;
    assert!(code == Some(0) && body.starts_with("v2"), "{code:?} {body}");
    // Not granted: no certificate for other.test and no route to its backend.
    let (code, body) = common::curl_tls("other.test", bind, &team_ca).await;
    assert!(code != Some(0) && !body.contains("v3"), "{code:?} {body}");
}
