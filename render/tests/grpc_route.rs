//! Real HAProxy on 127.0.0.1 serving GRPCRoutes beside an HTTPRoute on one listener (every HAProxy
//! version): a call (an HTTP/2 `POST` in clear, as gRPC sends it) goes by its
//! service and method to its rule's backend, spoken to in HTTP/2; a service's other methods go
//! to the service's rule (whose filters set a request header and add a response header), an
//! unknown service nowhere; the HTTPRoute's HTTP/1 path still answers. Over TLS (an HTTPS
//! listener, HTTP/2 by ALPN, curl verifying the listener's certificate) the same call goes the
//! same way.
//! A GRPCRoute the translator cannot lower (a method without its service) is refused in its own
//! status and routes nothing. The backends are HAProxy too, answering with the HTTP version and
//! path they received.

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::gateway::GatewayObjects;

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: web}
    spec:
      gatewayClassName: haptic
      listeners:
        - {name: http, port: 80, protocol: HTTP}
        - {name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: grpc-cert}]}}
routes:
  - metadata: {name: page, namespace: web, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [grpc.test]
      rules:
        - matches: [{path: {type: PathPrefix, value: /web}}]
          backendRefs: [{name: page, port: 80}]
grpcRoutes:
  - metadata: {name: echo, namespace: web, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [grpc.test]
      rules:
        - matches: [{method: {service: pkg.v1.Echo, method: Say}}]
          backendRefs: [{name: say, port: 80}]
        - matches: [{method: {service: pkg.v1.Echo}}]
          filters:
            - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-tenant, value: web}]}}
            - {type: ResponseHeaderModifier, responseHeaderModifier: {add: [{name: x-served-by, value: echo-rule}]}}
          backendRefs: [{name: echo, port: 80}]
  - metadata: {name: method-only, namespace: web, creationTimestamp: "2026-01-03T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [other.test]
      rules:
        - matches: [{method: {method: Say}}]
          backendRefs: [{name: say, port: 80}]
services:
  - metadata: {name: page, namespace: web}
    spec: {ports: [{port: 80}]}
  - metadata: {name: say, namespace: web}
    spec: {ports: [{port: 80}]}
  - metadata: {name: echo, namespace: web}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: page, namespace: web, labels: {kubernetes.io/service-name: page}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: say, namespace: web, labels: {kubernetes.io/service-name: say}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: echo, namespace: web, labels: {kubernetes.io/service-name: echo}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// An HAProxy speaking HTTP/2 in clear on `port`, answering `<name> <version> <path>`.
async fn h2c_backend(bin: &haptic_e2e::HaproxyBin, dir: &std::path::Path, name: &str, port: u16) -> Haproxy {
    let cfg = format!(
        "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    \
         timeout server 5s\nfrontend h2c\n    bind 127.0.0.1:{port} proto h2\n    \
         http-request return status 200 content-type text/plain lf-string \"{name} %HV %[path]%[req.hdr(x-tenant)]\"\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("haproxy.cfg"), cfg).unwrap();
    Haproxy::start(bin, HaproxyOpts::new(dir)).await.unwrap()
}

/// `curl` to the render on `port` with Host `grpc.test`: `POST` in HTTP/2 without upgrade (as a
/// gRPC client) or `GET` in HTTP/1.1; the status and the body.
fn call(port: u16, path: &str, h2: bool) -> String {
    let mut c = std::process::Command::new("curl");
    c.args(["-s", "-w", " %{http_code}%header{x-served-by}", "-H", "Host: grpc.test"]);
    if h2 {
        c.args(["--http2-prior-knowledge", "-X", "POST", "-H", "content-type: application/grpc"]);
    }
    let out = c.arg(format!("http://127.0.0.1:{port}{path}")).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A gRPC call (`POST` in HTTP/2, offered by ALPN) over TLS to `grpc.test` on `port`, trusting
/// only `ca`: the status and the body.
fn call_tls(port: u16, path: &str, ca: &std::path::Path) -> String {
    let out = std::process::Command::new("curl")
        .args(["-s", "-w", " %{http_code}", "--http2", "-X", "POST", "-H", "content-type: application/grpc"])
        .arg("--cacert")
        .arg(ca)
        .args(["--resolve", &format!("grpc.test:{port}:127.0.0.1")])
        .arg(format!("https://grpc.test:{port}{path}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

haptic_e2e::on_each_version!(grpc_calls_go_by_service_and_method_in_http2);
async fn grpc_calls_go_by_service_and_method_in_http2(bin: haptic_e2e::HaproxyBin) {
    let dir = tempfile::tempdir().unwrap();
    let page = common::echo_backend("page");
    let (say, echo) = (free_port(), free_port());
    let _say = h2c_backend(&bin, &dir.path().join("say"), "say", say).await;
    let _echo = h2c_backend(&bin, &dir.path().join("echo"), "echo", echo).await;
    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    let pki = tempfile::tempdir().unwrap();
    haptic_e2e::tls::make_ca_for(pki.path(), "grpc", "DNS:grpc.test");
    objects.secrets.push(common::tls_secret_from(pki.path(), "grpc", "web", "grpc-cert"));
    for s in &mut objects.endpoint_slices {
        let port = match s.metadata.name.as_deref() {
            Some("say") => say,
            Some("echo") => echo,
            _ => page,
        };
        s.ports.as_mut().unwrap()[0].port = Some(port.into());
    }
    let settings = common::loopback_gateway(free_port());
    let (render, out) = haptic_render::render_gateway(&objects.input("haptic", settings), &Default::default()).unwrap();
    let accepted = |name: &str| common::accepted(&out, name);
    assert!(accepted("echo").status && accepted("page").status, "{:?}", out.routes);
    let refused = accepted("method-only");
    assert_eq!((refused.status, refused.reason), (false, "UnsupportedValue"), "{refused:?}");
    let v = out.verdicts.iter().find(|v| v.object.name == "method-only").unwrap();
    assert_eq!(v.object.kind, "GRPCRoute");
    let listener = &out.gateways[0].listeners[0];
    let kinds: Vec<&str> = listener.supported_kinds.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!((kinds, listener.attached_routes), (vec!["HTTPRoute", "GRPCRoute"], 2));
    let port_of = |listener: u16| out.gateways[0].service.ports.iter().find(|p| p.0 == listener).unwrap().1;
    let (bind, tls) = (port_of(80), port_of(443));
    let tree = dir.path().join("tree");
    common::write_tree(&render, &tree);
    let _h = Haproxy::start(&bin, HaproxyOpts::new(&tree)).await.unwrap();
    assert_eq!(call(bind, "/pkg.v1.Echo/Say", true), "say HTTP/2.0 /pkg.v1.Echo/Say 200");
    // The service's rule sets a request header and adds a response header.
    assert_eq!(call(bind, "/pkg.v1.Echo/Shout", true), "echo HTTP/2.0 /pkg.v1.Echo/Shoutweb 200echo-rule");
    assert!(call(bind, "/pkg.v1.Other/Say", true).ends_with(" 404"), "no rule for another service");
    assert!(call(bind, "/pkg.v1.EchoX/Say", true).ends_with(" 404"), "a service is matched whole");
    assert!(call(bind, "/web/x", false).starts_with("page\nGET /web/x HTTP/1.1"), "the HTTPRoute beside it");
    // Over TLS: HTTP/2 by ALPN, the same rules.
    let ca = pki.path().join("ca.pem");
    assert_eq!(call_tls(tls, "/pkg.v1.Echo/Say", &ca), "say HTTP/2.0 /pkg.v1.Echo/Say 200");
    assert!(call_tls(tls, "/pkg.v1.Other/Say", &ca).ends_with(" 404"), "no rule for another service");
}
