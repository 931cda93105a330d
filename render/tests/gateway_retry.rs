//! Real HAProxy on 127.0.0.1 serving HTTPRoutes with a rule `retry` (every HAProxy version): a
//! request answered with a status the rule retries is tried again, up to `attempts` more times,
//! and answered by the first try that succeeds, or with the last failure once the tries are
//! spent; a status the rule does not name is answered at once; a rule without `retry` tries
//! once, though it sends to the same Service. The refusals: a status `retry-on` cannot name, or
//! a wait between tries, refuses that route in its status, and the other routes still serve.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::gateway::GatewayObjects;

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: web}
    spec:
      gatewayClassName: haptic
      listeners: [{name: http, port: 80, protocol: HTTP}]
routes:
  - metadata: {name: retried, namespace: web, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [retry.test]
      rules:
        - matches: [{path: {type: PathPrefix, value: /three}}]
          retry: {codes: [500], attempts: 3}
          backendRefs: [{name: app, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /two}}]
          retry: {codes: [500, 502, 503, 504], attempts: 2, backoff: 0s}
          backendRefs: [{name: app, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /once}}]
          backendRefs: [{name: app, port: 80}]
  - metadata: {name: odd-code, namespace: web, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [odd.test]
      rules: [{retry: {codes: [599], attempts: 1}, backendRefs: [{name: app, port: 80}]}]
  - metadata: {name: backoff, namespace: web, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [backoff.test]
      rules: [{retry: {codes: [500], attempts: 1, backoff: 100ms}, backendRefs: [{name: app, port: 80}]}]
services:
  - metadata: {name: app, namespace: web}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: app, namespace: web, labels: {kubernetes.io/service-name: app}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// The status of a request to `path` with Host `host`.
async fn status_of(port: u16, host: &str, path: &str) -> u16 {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    common::status(
        &common::raw(addr, &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")).await,
    )
}

haptic_e2e::on_each_version!(a_rule_retries_the_statuses_it_names_up_to_its_attempts);
async fn a_rule_retries_the_statuses_it_names_up_to_its_attempts(bin: haptic_e2e::HaproxyBin) {
    // `/<prefix>/<status>/<failures>/<id>`: the first <failures> tries of <id> get <status>, the
    // next ones 200; every try is counted by id.
    let tries: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = tries.clone();
    let app = common::backend_by_path(move |path| {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (status, failures, id) = match parts[..] {
            [_, s, f, id] => (s.parse().unwrap_or(200), f.parse().unwrap_or(0), id.to_string()),
            _ => (200, 0, path.to_string()),
        };
        let mut t = seen.lock().unwrap();
        let n = t.entry(id).or_insert(0);
        *n += 1;
        if *n <= failures {
            (status, "failed".into())
        } else {
            (200, "ok".into())
        }
    });
    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    objects.endpoint_slices[0].ports.as_mut().unwrap()[0].port = Some(app.into());
    let bind = free_port();
    let (render, out) =
        haptic_render::render_gateway(&objects.input("haptic", common::loopback_gateway(bind)), &Default::default())
            .unwrap();
    assert!(common::accepted(&out, "retried").status, "{:?}", out.routes);
    for refused in ["odd-code", "backoff"] {
        let a = common::accepted(&out, refused);
        assert_eq!((a.status, a.reason), (false, "UnsupportedValue"), "{refused}: {a:?}");
    }
    let tree = tempfile::tempdir().unwrap();
    common::write_tree(&render, tree.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(tree.path())).await.unwrap();

    let cases = [
        // (path, status, tries the upstream saw)
        ("/three/500/2/a", 200, 3),
        ("/three/500/4/b", 500, 4),
        ("/three/503/2/c", 503, 1),
        ("/two/500/1/d", 200, 2),
        ("/two/502/3/e", 502, 3),
        ("/two/503/1/f", 200, 2),
        ("/two/504/3/g", 504, 3),
        ("/once/500/1/h", 500, 1),
    ];
    for (path, status, n) in cases {
        assert_eq!(status_of(bind, "retry.test", path).await, status, "{path}");
        let id = path.rsplit('/').next().unwrap();
        assert_eq!(tries.lock().unwrap().get(id).copied(), Some(n), "{path}: the tries the upstream saw");
    }
    // The refused routes serve nothing; the upstream never saw their requests.
    for host in ["odd.test", "backoff.test"] {
        assert_eq!(status_of(bind, host, "/x/500/1/refused").await, 404, "{host}");
    }
    assert_eq!(tries.lock().unwrap().get("refused"), None);
}
