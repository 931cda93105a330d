//! Real HAProxy on 127.0.0.1 serving HTTPRoutes with the CORS filter (every HAProxy version):
//! a preflight from an allowed origin (exact, or `*.` any number of labels) is answered here
//! with the origin, methods, headers, exposed headers, max age and credentials; a wildcard
//! route answers with what the preflight asked for; an actual request gets the origin (and
//! credentials) on the backend's response; an origin not allowed gets no CORS header, and its
//! preflight is answered here too, never reaching the backend. The attack: an origin that would inject a header or config
//! (a CR LF, a space, a `%[` format) refuses its own route, and the other route still answers.

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
  - metadata: {name: listed, namespace: web, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [cors.test]
      rules:
        - matches: [{path: {type: PathPrefix, value: /listed}}]
          filters:
            - type: CORS
              cors:
                allowOrigins: ["https://www.foo.com", "https://*.bar.com"]
                allowMethods: [GET, OPTIONS]
                allowHeaders: [x-header-1, x-header-2]
                exposeHeaders: [x-header-3]
                allowCredentials: true
                maxAge: 3600
          backendRefs: [{name: app, port: 80}]
  - metadata: {name: wild, namespace: web, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [cors.test]
      rules:
        - matches: [{path: {type: PathPrefix, value: /wild}}]
          filters:
            - type: CORS
              cors: {allowOrigins: ["*"], allowMethods: ["*"], allowHeaders: ["*"], allowCredentials: true}
          backendRefs: [{name: app, port: 80}]
  - metadata: {name: inject, namespace: web, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [cors.test]
      rules:
        - matches: [{path: {type: PathPrefix, value: /inject}}]
          filters:
            - type: CORS
              cors: {allowOrigins: ["https://a.test\r\nx-evil: 1", "https://b.test %[src]"]}
          backendRefs: [{name: app, port: 80}]
services:
  - metadata: {name: app, namespace: web}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: app, namespace: web, labels: {kubernetes.io/service-name: app}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// `curl` with Host `cors.test`: the status line's code, the response headers (names
/// lowercased) and the body.
fn call(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>, String) {
    let mut c = std::process::Command::new("curl");
    c.args(["-s", "-i", "-X", method, "-H", "Host: cors.test"]);
    for (k, v) in headers {
        c.arg("-H").arg(format!("{k}: {v}"));
    }
    let out = c.arg(format!("http://127.0.0.1:{port}{path}")).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let code = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let hdrs = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (code, hdrs, body.to_string())
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

haptic_e2e::on_each_version!(cors_preflights_are_answered_and_responses_carry_the_origin);
async fn cors_preflights_are_answered_and_responses_carry_the_origin(bin: haptic_e2e::HaproxyBin) {
    let app = common::echo_backend("app");
    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    objects.endpoint_slices[0].ports.as_mut().unwrap()[0].port = Some(app.into());
    let bind = free_port();
    let settings = common::loopback_gateway(bind);
    let (render, out) = haptic_render::render_gateway(&objects.input("haptic", settings), &Default::default()).unwrap();
    let accepted = |name: &str| common::accepted(&out, name);
    assert!(accepted("listed").status && accepted("wild").status, "{:?}", out.routes);
    let inject = accepted("inject");
    assert_eq!((inject.status, inject.reason), (false, "UnsupportedValue"), "{inject:?}");
    let cfg = String::from_utf8_lossy(&render.files["haproxy.cfg"]).into_owned();
    assert!(!cfg.contains("x-evil") && !cfg.contains("b.test"), "a refused route's values never reach the config");
    let tree = tempfile::tempdir().unwrap();
    common::write_tree(&render, tree.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(tree.path())).await.unwrap();

    let ask = [("access-control-request-method", "GET"), ("access-control-request-headers", "x-header-1, x-header-2")];
    for origin in ["https://www.foo.com", "https://a.b.bar.com"] {
        let (code, h, _) = call(bind, "OPTIONS", "/listed", &[&[("Origin", origin)][..], &ask].concat());
        assert_eq!(code, 204, "{h:?}");
        assert_eq!(header(&h, "access-control-allow-origin"), Some(origin));
        assert_eq!(header(&h, "access-control-allow-methods"), Some("GET, OPTIONS"));
        assert_eq!(header(&h, "access-control-allow-headers"), Some("x-header-1, x-header-2"));
        assert_eq!(header(&h, "access-control-expose-headers"), Some("x-header-3"));
        assert_eq!(header(&h, "access-control-max-age"), Some("3600"));
        assert_eq!(header(&h, "access-control-allow-credentials"), Some("true"));
    }
    // Not allowed: no CORS header, the preflight answered here, the actual request served.
    let (code, h, body) = call(bind, "OPTIONS", "/listed", &[&[("Origin", "https://foobar.com")][..], &ask].concat());
    assert_eq!((code, header(&h, "access-control-allow-origin"), body.as_str()), (204, None, ""), "{h:?}");
    let (code, h, body) = call(bind, "GET", "/listed", &[("Origin", "https://foobar.com")]);
    assert_eq!((code, header(&h, "access-control-allow-origin")), (200, None), "{h:?}");
    assert!(body.starts_with("app\nGET /listed"), "{body}");
    // An actual request: the backend's response with the origin and credentials.
    let (code, h, body) = call(bind, "GET", "/listed", &[("Origin", "https://www.foo.com")]);
    assert_eq!((code, header(&h, "access-control-allow-origin")), (200, Some("https://www.foo.com")), "{h:?}");
    assert_eq!(header(&h, "access-control-allow-credentials"), Some("true"));
    assert!(body.starts_with("app\nGET /listed"), "{body}");
    // Wildcards with credentials: what the preflight asked for, the origin echoed.
    let wild = [("Origin", "https://other.foo.com"), ("access-control-request-method", "PUT"), ask[1]];
    let (code, h, _) = call(bind, "OPTIONS", "/wild", &wild);
    assert_eq!(code, 204, "{h:?}");
    assert_eq!(header(&h, "access-control-allow-origin"), Some("https://other.foo.com"));
    assert_eq!(header(&h, "access-control-allow-methods"), Some("PUT"));
    assert_eq!(header(&h, "access-control-allow-headers"), Some("x-header-1, x-header-2"));
    assert_eq!(header(&h, "access-control-allow-credentials"), Some("true"));
    // The refused route routes nothing.
    let (code, h, _) = call(bind, "OPTIONS", "/inject", &[("Origin", "https://a.test")]);
    assert_eq!((code, header(&h, "access-control-allow-origin")), (404, None), "{h:?}");
}
