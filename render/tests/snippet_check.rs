//! An allowed snippet is checked by real `haproxy -c` in its own backend before it joins the
//! render: one that HAProxy does not parse (but that passes the deny list) refuses only its own
//! Ingress, the render then passes `haproxy -c`, and the other Ingress's snippet serves. Without
//! the check the same render fails as a whole. The test plays the controller's shell: it runs
//! `haproxy -c` over each of `snippet_checks` and hands the refused ones back to the render.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_haproxy::check_output::check_words;
use haptic_render::annotations::Allowed;
use haptic_render::ingress::Settings;

mod common;

const YAML: &str = r#"
ingresses:
  - metadata:
      name: good
      namespace: shop
      annotations:
        nginx.ingress.kubernetes.io/configuration-snippet: "http-response set-header X-Good yes"
    spec:
      ingressClassName: haptic
      rules:
        - host: good.example.com
          http:
            paths:
              - {path: /, pathType: Prefix, backend: {service: {name: good, port: {number: 80}}}}
  - metadata:
      name: broken
      namespace: shop
      annotations:
        nginx.ingress.kubernetes.io/configuration-snippet: "http-response set-header X-Only-A-Name"
    spec:
      ingressClassName: haptic
      rules:
        - host: broken.example.com
          http:
            paths:
              - {path: /, pathType: Prefix, backend: {service: {name: broken, port: {number: 80}}}}
services:
  - metadata: {name: good, namespace: shop}
    spec: {ports: [{port: 80, targetPort: 8080}]}
  - metadata: {name: broken, namespace: shop}
    spec: {ports: [{port: 80, targetPort: 8080}]}
endpointSlices:
  - metadata: {name: good-1, namespace: shop, labels: {kubernetes.io/service-name: good}}
    addressType: IPv4
    ports: [{port: 8080}]
    endpoints:
      - {addresses: [127.0.0.1]}
  - metadata: {name: broken-1, namespace: shop, labels: {kubernetes.io/service-name: broken}}
    addressType: IPv4
    ports: [{port: 8080}]
    endpoints:
      - {addresses: [127.0.0.1]}
"#;

/// `haproxy -c` over one snippet's check config: `Err` with HAProxy's output when refused.
fn haproxy_c(bin: &HaproxyBin, config: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("check.cfg"), config).unwrap();
    let out =
        std::process::Command::new(&bin.path).arg("-c").arg("-f").arg(dir.path().join("check.cfg")).output().unwrap();
    if haptic_haproxy::snippet::check_passed(out.status.code()) {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

haptic_e2e::on_each_version!(a_snippet_haproxy_refuses_refuses_only_its_ingress);
async fn a_snippet_haproxy_refuses_refuses_only_its_ingress(bin: HaproxyBin) {
    let http_port = free_port();
    let mut input = common::input(
        YAML,
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    input.allowed = Allowed { snippets: true };
    let web = common::backend("web");
    common::endpoints_on_loopback(&mut input, |_| web);

    // Unchecked, the broken snippet fails the whole render.
    let unchecked = haptic_render::render(&input, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&unchecked, dir.path());
    let whole =
        std::process::Command::new(&bin.path).arg("-c").arg("-f").arg(dir.path().join("haproxy.cfg")).output().unwrap();
    assert!(!whole.status.success(), "the broken snippet must fail an unchecked render");

    // The shell: each snippet checked alone; the refused ones handed back.
    let checks = haptic_render::snippet_checks(&input);
    assert_eq!(checks.len(), 2);
    for c in &checks {
        match haproxy_c(&bin, &c.config) {
            Ok(()) => assert_eq!(c.object.name, "good", "{c:?}"),
            Err(out) => {
                assert_eq!(c.object.name, "broken", "{out}");
                input.refused_snippets.insert(c.snippet.clone(), check_words(&out));
            }
        }
    }
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let broken = render.verdicts.iter().find(|v| v.object.name == "broken").unwrap();
    assert_eq!(broken.refusals[0].cause, haptic_render::Cause::GateRefused, "{broken:?}");
    // What people read: haproxy -c's words, with the line of the snippet.
    assert!(input.refused_snippets.values().all(|why| why.contains("line 8")), "{:?}", input.refused_snippets);
    assert!(render.verdicts.iter().find(|v| v.object.name == "good").unwrap().accepted());
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let r = common::raw(addr, &get("good.example.com")).await;
    assert!(r.to_ascii_lowercase().contains("\r\nx-good: yes\r\n") && r.ends_with("web"), "{r}");
    let r = common::raw(addr, &get("broken.example.com")).await;
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
}
