//! A regex path cannot take another host's requests: real HAProxy 2.6, 3.0, 3.2 and 3.4, eleven hosts. The
//! attacker's host carries the regex path `/?\d*/account`, which under a key of the form
//! `^h1(?i:…)` matched the lookup string `h11/account` of another host when host ids were
//! positional (`h1`…`h11`); with ids of one width that end at `~`, the victim's requests must
//! reach the victim's backend, and the attacker's regex paths (and a benign one) still route on
//! the attacker's own host.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::Settings;

mod common;

/// The attacker `a.example.com` (regex paths), fillers `b`…`j`, the victim `k.example.com`.
fn yaml() -> String {
    let mut s = String::from(
        r#"ingresses:
  - metadata:
      name: attacker
      namespace: evil
      annotations: {nginx.ingress.kubernetes.io/use-regex: "true"}
    spec:
      ingressClassName: haptic
      rules:
        - host: a.example.com
          http:
            paths:
              - {path: '/?\d*/account', pathType: ImplementationSpecific, backend: {service: {name: attacker, port: {number: 80}}}}
              - {path: '/v[0-9]+/x', pathType: ImplementationSpecific, backend: {service: {name: attacker, port: {number: 80}}}}
  - metadata: {name: victim, namespace: shop}
    spec:
      ingressClassName: haptic
      rules:
        - host: k.example.com
          http:
            paths:
              - {path: /account, pathType: Prefix, backend: {service: {name: victim, port: {number: 80}}}}
  - metadata: {name: filler, namespace: shop}
    spec:
      ingressClassName: haptic
      rules:
"#,
    );
    for h in 'b'..='j' {
        s.push_str(&format!(
            "        - host: {h}.example.com\n          http:\n            paths:\n              - {{path: /, pathType: Prefix, backend: {{service: {{name: filler, port: {{number: 80}}}}}}}}\n"
        ));
    }
    s.push_str("services:\n");
    for (ns, n) in [("evil", "attacker"), ("shop", "victim"), ("shop", "filler")] {
        s.push_str(&format!(
            "  - metadata: {{name: {n}, namespace: {ns}}}\n    spec: {{ports: [{{port: 80, targetPort: 8080}}]}}\n"
        ));
    }
    s.push_str("endpointSlices:\n");
    for (ns, n) in [("evil", "attacker"), ("shop", "victim"), ("shop", "filler")] {
        s.push_str(&format!(
            "  - metadata: {{name: {n}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {n}}}}}\n    addressType: IPv4\n    ports: [{{port: 8080}}]\n    endpoints:\n      - {{addresses: [127.0.0.1]}}\n"
        ));
    }
    s
}

haptic_e2e::on_each_version!(a_regex_path_never_takes_another_hosts_requests);
async fn a_regex_path_never_takes_another_hosts_requests(bin: HaproxyBin) {
    let http_port = free_port();
    let mut input = common::input(
        &yaml(),
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    let (attacker, victim, filler) =
        (common::backend("attacker"), common::backend("victim"), common::backend("filler"));
    common::endpoints_on_loopback(&mut input, |svc| match svc {
        "attacker" => attacker,
        "victim" => victim,
        _ => filler,
    });
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    assert!(render.verdicts.iter().all(|v| v.accepted()), "{:?}", render.verdicts);
    let hosts = String::from_utf8(render.files["maps/hosts.map"].clone()).unwrap();
    let id = |host: &str| hosts.lines().find_map(|l| l.strip_prefix(&format!("{host} "))).unwrap().to_string();
    let (a, k) = (id("a.example.com"), id("k.example.com"));
    assert!(a != k && a.len() == k.len(), "{hosts}");
    let regex = String::from_utf8(render.files["maps/paths_regex.map"].clone()).unwrap();
    assert!(regex.contains(&format!("^{a}~(?i:/?\\d*/account) ")), "{regex}");

    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |host: &str, path: &str| format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    for (host, path, want) in [
        ("k.example.com", "/account", "victim"),
        ("k.example.com", "/account/settings", "victim"),
        ("K.example.com", "/account", "victim"),
        ("a.example.com", "/account", "attacker"),
        ("a.example.com", "/12/account", "attacker"),
        ("a.example.com", "/v12/x", "attacker"),
        ("b.example.com", "/account", "filler"),
    ] {
        let r = common::raw(addr, &get(host, path)).await;
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with(want), "{host}{path} -> {r}");
    }
    let r = common::raw(addr, &get("k.example.com", "/v12/x")).await;
    assert_eq!(common::status(&r), 404, "{r}");
}
