//! Real HAProxy on 127.0.0.1 serving HTTPRoute timeouts (every HAProxy version): a rule with
//! `timeouts.backendRequest` answers 504 once its backend has not answered for that long, while a
//! rule without one, to the same hung backend, is still waiting; the timeout follows the rule,
//! not the backend. The timeout is an entry of `maps/policy_timeouts.map` that the backends'
//! defaults section reads, never a line of the backend, so a later route with a timeout to a
//! Service the render has not served yet adds a plain backend section and map entries only: a
//! change HAProxy 3.4 takes at runtime (`add backend … from haptic_backends`); and the first
//! timeout of a render that had none changes its maps only, never the config text.

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_haproxy::claim::diff_cfg;
use haptic_render::gateway::GatewayObjects;

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: web}
    spec:
      gatewayClassName: haptic
      listeners: [{name: http, port: 80, protocol: HTTP}]
routes:
  - metadata: {name: quick, namespace: web, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [t.test]
      rules:
        - matches: [{path: {type: PathPrefix, value: /quick}}]
          timeouts: {backendRequest: 400ms}
          backendRefs: [{name: hung, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /patient}}]
          backendRefs: [{name: hung, port: 80}]
services:
  - metadata: {name: hung, namespace: web}
    spec: {ports: [{port: 80}]}
  - metadata: {name: later, namespace: web}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: hung, namespace: web, labels: {kubernetes.io/service-name: hung}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: later, namespace: web, labels: {kubernetes.io/service-name: later}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// A route to Service `later` with a timeout, added after the first render.
const LATER: &str = r#"
metadata: {name: later, namespace: web, creationTimestamp: "2026-01-02T00:00:00Z"}
spec:
  parentRefs: [{name: gw}]
  hostnames: [later.test]
  rules:
    - timeouts: {request: 700ms}
      backendRefs: [{name: later, port: 80}]
"#;

/// The status of `GET path` for `t.test` on 127.0.0.1:`port`, or curl's exit code when nothing
/// came back within `max_s` seconds.
fn get(port: u16, path: &str, max_s: u32) -> Result<u16, i32> {
    let out = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", &max_s.to_string()])
        .args(["-H", "Host: t.test", &format!("http://127.0.0.1:{port}{path}")])
        .output()
        .unwrap();
    match out.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout).parse().unwrap()),
        code => Err(code.unwrap_or(-1)),
    }
}

haptic_e2e::on_each_version!(a_routes_timeout_is_a_map_entry_its_backend_does_not_carry);
async fn a_routes_timeout_is_a_map_entry_its_backend_does_not_carry(bin: haptic_e2e::HaproxyBin) {
    // A backend that takes connections and never answers: the kernel completes each handshake
    // into the listener's backlog, and nothing reads.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let settings = common::loopback_gateway(free_port());
    let input_of = |yaml: &str| {
        let mut objects: GatewayObjects = serde_saphyr::from_str(yaml).unwrap();
        for s in &mut objects.endpoint_slices {
            s.ports.as_mut().unwrap()[0].port = Some(hung.local_addr().unwrap().port().into());
        }
        objects.input("haptic", settings.clone())
    };
    let input = input_of(OBJECTS);
    let (render, out) = haptic_render::render_gateway(&input, &Default::default()).unwrap();
    assert!(common::accepted(&out, "quick").status, "{:?}", out.routes);
    let cfg = String::from_utf8(render.files["haproxy.cfg"].clone()).unwrap();
    assert!(!cfg.contains("set-timeout server 400"), "the timeout is a backend line:\n{cfg}");
    let tree = tempfile::tempdir().unwrap();
    common::write_tree(&render, tree.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(tree.path())).await.unwrap();
    let port = out.gateways[0].service.ports[0].1;

    assert_eq!(get(port, "/quick", 20), Ok(504), "the rule with a 400 ms timeout");
    // The same backend from the rule without a timeout: still waiting after 3 s (curl's exit
    // code 28 is its own timeout; the defaults' server timeout is far longer).
    assert_eq!(get(port, "/patient", 3), Err(28), "the rule without a timeout");

    // A route with a timeout to a Service never served before: a plain backend and maps.
    let mut next = input.clone();
    next.routes.push(std::sync::Arc::new(serde_saphyr::from_str(LATER).unwrap()));
    next.previous_slots = render.slots.clone();
    let (later, _) = haptic_render::render_gateway(&next, &Default::default()).unwrap();
    let later_cfg = String::from_utf8(later.files["haproxy.cfg"].clone()).unwrap();
    let d = diff_cfg(&cfg, &later_cfg);
    assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
    let added: Vec<(&str, &str)> = d.backends_added.iter().map(|b| (b.backend.as_str(), b.defaults.as_str())).collect();
    assert_eq!(added.len(), 1, "{added:?}");
    assert_eq!(added[0].1, "haptic_backends", "{added:?}");
    assert!(added[0].0.contains("later"), "{added:?}");
    let timeouts = String::from_utf8(later.files["maps/policy_timeouts.map"].clone()).unwrap();
    assert!(timeouts.lines().any(|l| l.ends_with(" 700")), "{timeouts}");

    // The first timeout of a render that had none changes maps only: no line of the config.
    let untimed = input_of(&OBJECTS.replace("          timeouts: {backendRequest: 400ms}\n", ""));
    let (before, _) = haptic_render::render_gateway(&untimed, &Default::default()).unwrap();
    let before_cfg = String::from_utf8(before.files["haproxy.cfg"].clone()).unwrap();
    assert_ne!(before.files["maps/policy_timeouts.map"], render.files["maps/policy_timeouts.map"]);
    assert_eq!(before_cfg, cfg, "a route's first timeout changed the config text");
    drop(hung);
}
