//! Real HAProxy on 127.0.0.1 serving TCPRoutes on a Gateway's TCP listeners: each connection
//! goes to its listener's route, by server weight among the rule's backends (weight 0: never);
//! of two routes on one listener the older one takes every connection, both attached. The
//! attack: a TCPRoute of another namespace on a listener that allows only its own namespace is
//! refused in its own status and takes nothing. The backends are HTTP servers on 127.0.0.1; the
//! bytes pass through as they are.

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::gateway::GatewayObjects;

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: db}
    spec:
      gatewayClassName: haptic
      listeners:
        - {name: split, port: 9000, protocol: TCP}
        - {name: one, port: 9001, protocol: TCP}
tcpRoutes:
  - metadata: {name: thief, namespace: other, creationTimestamp: "2025-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, namespace: db, sectionName: one}]
      rules: [{backendRefs: [{name: grab, port: 80}]}]
  - metadata: {name: weighted, namespace: db, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, sectionName: split}]
      rules:
        - backendRefs: [{name: a, port: 80, weight: 3}, {name: b, port: 80, weight: 1}, {name: c, port: 80, weight: 0}]
  - metadata: {name: older, namespace: db, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, sectionName: one}]
      rules: [{backendRefs: [{name: c, port: 80}]}]
  - metadata: {name: newer, namespace: db, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, sectionName: one}]
      rules: [{backendRefs: [{name: a, port: 80}]}]
services:
  - metadata: {name: a, namespace: db}
    spec: {ports: [{port: 80}]}
  - metadata: {name: b, namespace: db}
    spec: {ports: [{port: 80}]}
  - metadata: {name: c, namespace: db}
    spec: {ports: [{port: 80}]}
  - metadata: {name: grab, namespace: other}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: a, namespace: db, labels: {kubernetes.io/service-name: a}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: b, namespace: db, labels: {kubernetes.io/service-name: b}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: c, namespace: db, labels: {kubernetes.io/service-name: c}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: grab, namespace: other, labels: {kubernetes.io/service-name: grab}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// The name of the backend that answered one connection to 127.0.0.1:`port` (its body's first
/// line), or "" when the connection was closed without an answer.
fn who(port: u16) -> String {
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "10", &format!("http://127.0.0.1:{port}/")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().to_string()
}

haptic_e2e::on_each_version!(tcp_routes_pass_connections_by_weight_and_age);
async fn tcp_routes_pass_connections_by_weight_and_age(bin: haptic_e2e::HaproxyBin) {
    let ports: Vec<(&str, u16)> = ["a", "b", "c", "grab"].into_iter().map(|n| (n, common::echo_backend(n))).collect();
    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    for s in &mut objects.endpoint_slices {
        let name = s.metadata.name.as_deref().unwrap();
        let port = ports.iter().find(|(n, _)| *n == name).unwrap().1;
        s.ports.as_mut().unwrap()[0].port = Some(port.into());
    }
    let settings = common::loopback_gateway(free_port());
    let input = objects.input("haptic", settings.clone());
    let (render, out) = haptic_render::render_gateway(&input, &Default::default()).unwrap();
    let accepted = |name: &str| common::accepted(&out, name);
    for name in ["weighted", "older", "newer"] {
        assert!(accepted(name).status, "{name}: {:?}", out.routes);
    }
    let thief = accepted("thief");
    assert_eq!((thief.status, thief.reason), (false, "NotAllowedByListeners"), "{thief:?}");
    let one = &out.gateways[0].listeners[1];
    let kinds: Vec<&str> = one.supported_kinds.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!((kinds, one.attached_routes), (vec!["TCPRoute"], 2), "{one:?}");
    let port_of = |listener: u16| out.gateways[0].service.ports.iter().find(|p| p.0 == listener).unwrap().1;
    let tree = tempfile::tempdir().unwrap();
    common::write_tree(&render, tree.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(tree.path())).await.unwrap();

    // Weights 3:1:0 as server weights of one backend: 40 connections, bounded by count.
    let split = port_of(9000);
    let seen: Vec<String> = (0..40).map(|_| who(split)).collect();
    let count = |n: &str| seen.iter().filter(|s| *s == n).count();
    assert_eq!(count("a") + count("b"), 40, "{seen:?}");
    assert!(count("b") >= 1 && count("a") > count("b"), "{seen:?}");
    // The older route of the listener takes every connection; the other namespace's none.
    let one = port_of(9001);
    for _ in 0..10 {
        assert_eq!(who(one), "c");
    }

    // The older route retargeted to a Service never served before: a plain backend after
    // `defaults haptic_tcp_backends` (no `mode` line of its own) and map entries, a change
    // HAProxy 3.4 makes at runtime (`add backend … from haptic_tcp_backends`).
    let retargeted = OBJECTS
        .replace("rules: [{backendRefs: [{name: c, port: 80}]}]", "rules: [{backendRefs: [{name: d, port: 80}]}]")
        .replace("\nendpointSlices:\n", "\n  - metadata: {name: d, namespace: db}\n    spec: {ports: [{port: 80}]}\nendpointSlices:\n")
        + "  - metadata: {name: d, namespace: db, labels: {kubernetes.io/service-name: d}}\n    addressType: IPv4\n    \
           ports: [{port: 1}]\n    endpoints: [{addresses: [127.0.0.1]}]\n";
    let mut next = serde_saphyr::from_str::<GatewayObjects>(&retargeted).unwrap().input("haptic", settings);
    next.previous_slots = render.slots.clone();
    let (later, _) = haptic_render::render_gateway(&next, &Default::default()).unwrap();
    let text = |r: &haptic_render::Render| String::from_utf8(r.files["haproxy.cfg"].clone()).unwrap();
    let d = haptic_haproxy::claim::diff_cfg(&text(&render), &text(&later));
    assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
    let added: Vec<(&str, &str)> = d.backends_added.iter().map(|b| (b.backend.as_str(), b.defaults.as_str())).collect();
    assert_eq!(added, [("db_d_80.tcp", "haptic_tcp_backends")], "{}", text(&later));
}
