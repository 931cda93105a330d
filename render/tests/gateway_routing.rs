//! Real HAProxy on 127.0.0.1 serving a Gateway API render (HAProxy 2.6, 3.0, 3.2 and 3.4, one case each):
//! precedence across exact, prefix, header, method and query matches, the filters as a backend
//! and a client see them (rewritten path and host, request and response headers), a redirect
//! with scheme, port and prefix replacement, backends with their own filters, and 500 for a
//! rule without a usable backend (and for a missing backend's share).

use std::net::{IpAddr, SocketAddr};

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::gateway::{GatewayObjects, GatewaySettings};

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: web}
    spec:
      gatewayClassName: haptic
      listeners: [{name: http, port: 80, protocol: HTTP}]
routes:
  - metadata: {name: shop, namespace: web, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [shop.test]
      rules:
        - backendRefs: [{name: v1, port: 80}]
        - matches: [{path: {type: Exact, value: /exact}}]
          backendRefs: [{name: v2, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /p}}]
          backendRefs: [{name: v2, port: 80}]
        - matches: [{headers: [{name: Version, value: two}]}]
          backendRefs: [{name: v2, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /m}, method: POST}]
          backendRefs: [{name: v2, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /q}, queryParams: [{name: q, value: "1"}]}]
          backendRefs: [{name: v2, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /rw}}]
          filters:
            - type: URLRewrite
              urlRewrite: {hostname: rewritten.test, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}
            - type: RequestHeaderModifier
              requestHeaderModifier:
                set: [{name: X-Set, value: "s %[src]"}]
                add: [{name: X-Add, value: a}]
                remove: [X-Drop]
            - type: ResponseHeaderModifier
              responseHeaderModifier: {set: [{name: X-Resp, value: r}]}
          backendRefs: [{name: v2, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /redir}}]
          filters:
            - type: RequestRedirect
              requestRedirect: {scheme: https, port: 8443, statusCode: 307, path: {type: ReplacePrefixMatch, replacePrefixMatch: /to}}
        - matches: [{path: {type: PathPrefix, value: /none}}]
          backendRefs: [{name: missing, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /split}}]
          backendRefs:
            - {name: v1, port: 80, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Backend, value: one}]}}]}
            - {name: v2, port: 80, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Backend, value: two}]}}]}
        - matches: [{path: {type: PathPrefix, value: /half}}]
          backendRefs: [{name: v1, port: 80}, {name: missing, port: 80}]
services:
  - metadata: {name: v1, namespace: web}
    spec: {ports: [{port: 80}]}
  - metadata: {name: v2, namespace: web}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: v1, namespace: web, labels: {kubernetes.io/service-name: v1}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: v2, namespace: web, labels: {kubernetes.io/service-name: v2}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

haptic_e2e::on_each_version!(gateway_routes_match_filter_and_redirect);
async fn gateway_routes_match_filter_and_redirect(bin: haptic_e2e::HaproxyBin) {
    let (v1, v2) = (common::echo_backend("v1"), common::echo_backend("v2"));
    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    for s in &mut objects.endpoint_slices {
        let port = if s.metadata.name.as_deref() == Some("v1") { v1 } else { v2 };
        s.ports.as_mut().unwrap()[0].port = Some(port.into());
    }
    let bind = free_port();
    let settings = GatewaySettings {
        bind_address: IpAddr::from([127, 0, 0, 1]),
        first_bind_port: bind,
        min_slots: 2,
        ..Default::default()
    };
    let (render, out) = haptic_render::render_gateway(&objects.input("haptic", settings), &Default::default()).unwrap();
    assert!(out.routes[0].parents[0].conditions[0].status, "{:?}", out.routes);
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], bind));
    let send = |method: &'static str, path: &'static str, extra: &'static str| async move {
        common::raw(addr, &format!("{method} {path} HTTP/1.1\r\nHost: shop.test\r\n{extra}Connection: close\r\n\r\n"))
            .await
    };
    let body_of = |r: &str| r.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    let served_by = |r: String| body_of(&r).lines().next().unwrap_or_default().to_string();
    assert_eq!(served_by(send("GET", "/", "").await), "v1");
    assert_eq!(served_by(send("GET", "/exact", "").await), "v2");
    assert_eq!(served_by(send("GET", "/exact/x", "").await), "v1");
    assert_eq!(served_by(send("GET", "/p/x", "").await), "v2");
    assert_eq!(served_by(send("GET", "/px", "").await), "v1", "a prefix matches whole segments");
    assert_eq!(served_by(send("GET", "/", "version: two\r\n").await), "v2");
    assert_eq!(served_by(send("GET", "/", "version: one\r\n").await), "v1");
    assert_eq!(served_by(send("POST", "/m", "Content-Length: 0\r\n").await), "v2");
    assert_eq!(served_by(send("GET", "/m", "").await), "v1");
    assert_eq!(served_by(send("GET", "/q?q=1", "").await), "v2");
    assert_eq!(served_by(send("GET", "/q?q=2", "").await), "v1");
    // The filters, as the backend and the client see them.
    let r = send("GET", "/rw/x?k=v", "X-Drop: gone\r\n").await;
    let body = body_of(&r);
    assert!(body.starts_with("v2\nGET /new/x?k=v HTTP/1.1"), "{r}");
    assert!(body.contains("host: rewritten.test"), "{r}");
    assert!(body.contains("x-set: s %[src]"), "a value arrives literally: {r}");
    assert!(body.contains("x-add: a") && !body.contains("x-drop"), "{r}");
    assert!(r.to_ascii_lowercase().contains("\r\nx-resp: r\r\n"), "{r}");
    let r = send("GET", "/rw", "").await;
    assert!(body_of(&r).starts_with("v2\nGET /new HTTP/1.1"), "{r}");
    // The redirect: scheme, port and the matched prefix replaced.
    let r = send("GET", "/redir/y", "").await;
    assert!(r.starts_with("HTTP/1.1 307"), "{r}");
    assert!(
        r.contains("\r\nlocation: https://shop.test:8443/to/y\r\n")
            || r.contains("\r\nLocation: https://shop.test:8443/to/y\r\n"),
        "{r}"
    );
    // Backends with their own filters, each request to one of them with its own header; a
    // missing backend's share answers 500.
    let (mut seen, mut codes) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    for _ in 0..40 {
        let r = send("GET", "/split", "").await;
        let body = body_of(&r);
        let who = body.lines().next().unwrap_or_default().to_string();
        let want = if who == "v1" { "backend: one" } else { "backend: two" };
        assert!(body.contains(want), "{r}");
        seen.insert(who);
        codes.insert(send("GET", "/half", "").await[9..12].to_string());
    }
    assert_eq!(seen.len(), 2, "both backends drawn in 40 requests");
    assert_eq!(codes.into_iter().collect::<Vec<_>>(), ["200", "500"]);
    // A rule whose only backend is missing answers 500; an unknown host 404.
    assert!(send("GET", "/none", "").await.starts_with("HTTP/1.1 500"));
    let other = common::raw(addr, "GET / HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n").await;
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
}

const TLS_OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: web}
    spec:
      gatewayClassName: haptic
      listeners:
        - {name: any, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: site}]}}
        - {name: a, port: 443, protocol: HTTPS, hostname: a.site.example.com, tls: {certificateRefs: [{name: site}]}}
        - {name: wild, port: 443, protocol: HTTPS, hostname: "*.w.site.example.com", tls: {certificateRefs: [{name: site}]}}
routes:
  - metadata: {name: all, namespace: web}
    spec:
      parentRefs: [{name: gw}]
      rules: [{backendRefs: [{name: v1, port: 80}]}]
services:
  - metadata: {name: v1, namespace: web}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: v1, namespace: web, labels: {kubernetes.io/service-name: v1}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

haptic_e2e::on_each_version!(https_listeners_answer_421_when_host_and_sni_differ);
async fn https_listeners_answer_421_when_host_and_sni_differ(bin: haptic_e2e::HaproxyBin) {
    let v1 = common::echo_backend("v1");
    let dir = tempfile::tempdir().unwrap();
    let mut objects: GatewayObjects = serde_saphyr::from_str(TLS_OBJECTS).unwrap();
    objects.endpoint_slices[0].ports.as_mut().unwrap()[0].port = Some(v1.into());
    objects.secrets = vec![common::tls_secret(dir.path(), "web", "site")];
    let bind = free_port();
    let settings = GatewaySettings {
        bind_address: IpAddr::from([127, 0, 0, 1]),
        first_bind_port: bind,
        min_slots: 2,
        ..Default::default()
    };
    let (render, _) = haptic_render::render_gateway(&objects.input("haptic", settings), &Default::default()).unwrap();
    let tree = dir.path().join("tree");
    common::write_tree(&render, &tree);
    let _h = Haproxy::start(&bin, HaproxyOpts::new(&tree)).await.unwrap();
    // curl: the SNI is the URL's host, the Host header the -H one; HTTP/2 where offered.
    let status = |sni: &str, host: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sk", "-o", "/dev/null", "-w", "%{http_code} %{http_version}", "--http2"])
            .arg("--resolve")
            .arg(format!("{sni}:{bind}:127.0.0.1"))
            .arg("-H")
            .arg(format!("Host: {host}"))
            .arg(format!("https://{sni}:{bind}/"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(status("a.site.example.com", "a.site.example.com"), "200 2");
    assert_eq!(status("other.site.example.com", "x.site.example.com"), "200 2", "both the any-host listener");
    assert_eq!(status("a.site.example.com", "other.site.example.com"), "421 2");
    assert_eq!(status("other.site.example.com", "a.site.example.com"), "421 2");
    assert_eq!(status("x.w.site.example.com", "y.w.site.example.com"), "200 2", "one wildcard listener");
    assert_eq!(status("x.w.site.example.com", "a.site.example.com"), "421 2");
}
