//! Real HAProxy on 127.0.0.1 speaking TLS to a real TLS backend (another HAProxy) as
//! BackendTLSPolicies ask: verified against the ConfigMap's CA for the policy's hostname, sent
//! as SNI; a backend whose certificate carries another name, or that another CA signed, answers
//! 503; so does a Service whose policy names no usable CA (it is never spoken to in plain text),
//! and one checked against the system's CAs (`System`), which do not know the test CA.
//! Of two policies on one Service port the older applies and the newer is Conflicted. The
//! attacks: a policy of another namespace naming a Service of the same name, and a policy naming
//! a ConfigMap that exists only in another namespace, change nothing of the victim's: its
//! Service stays plain HTTP, the other's CA is not read. Each policy's status names the Gateway
//! whose route reaches its Service.

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::gateway::GatewayObjects;

mod common;

const OBJECTS: &str = r#"
gateways:
  - metadata: {name: gw, namespace: shop}
    spec:
      gatewayClassName: haptic
      listeners: [{name: web, port: 80, protocol: HTTP}]
routes:
  - metadata: {name: r, namespace: shop}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [app.example.com]
      rules:
        - matches: [{path: {type: Exact, value: /ok}}]
          backendRefs: [{name: ok, port: 443}]
        - matches: [{path: {type: Exact, value: /mismatch}}]
          backendRefs: [{name: mismatch, port: 443}]
        - matches: [{path: {type: Exact, value: /wrong-ca}}]
          backendRefs: [{name: wrongca, port: 443}]
        - matches: [{path: {type: Exact, value: /no-ca}}]
          backendRefs: [{name: noca, port: 443}]
        - matches: [{path: {type: Exact, value: /conflict}}]
          backendRefs: [{name: conflict, port: 443}]
        - matches: [{path: {type: Exact, value: /plain}}]
          backendRefs: [{name: plain, port: 80}]
        - matches: [{path: {type: Exact, value: /system}}]
          backendRefs: [{name: sys, port: 443}]
backendTlsPolicies:
  - metadata: {name: system, namespace: shop}
    spec:
      targetRefs: [{group: "", kind: Service, name: sys}]
      validation: {wellKnownCACertificates: System, hostname: abc.example.com}
  - metadata: {name: ok, namespace: shop, generation: 3}
    spec:
      targetRefs: [{group: "", kind: Service, name: ok, sectionName: btls}]
      validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}], hostname: abc.example.com}
  - metadata: {name: mismatch, namespace: shop}
    spec:
      targetRefs: [{group: "", kind: Service, name: mismatch}]
      validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}], hostname: other.example.com}
  - metadata: {name: wrong-ca, namespace: shop}
    spec:
      targetRefs: [{group: "", kind: Service, name: wrongca}]
      validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: other-ca}], hostname: abc.example.com}
  - metadata: {name: no-ca, namespace: shop}
    spec:
      targetRefs: [{group: "", kind: Service, name: noca}]
      validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: theirs}], hostname: abc.example.com}
  - metadata: {name: secret-ca, namespace: shop}
    spec:
      targetRefs: [{group: "", kind: Service, name: unused}]
      validation: {caCertificateRefs: [{group: "", kind: Secret, name: ca}], hostname: abc.example.com}
  - metadata: {name: conflict-old, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      targetRefs: [{group: "", kind: Service, name: conflict}]
      validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}], hostname: abc.example.com}
  - metadata: {name: conflict-new, namespace: shop, creationTimestamp: "2026-02-01T00:00:00Z"}
    spec:
      targetRefs: [{group: "", kind: Service, name: conflict}]
      validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: other-ca}], hostname: abc.example.com}
  - metadata: {name: thief, namespace: other}
    spec:
      targetRefs: [{group: "", kind: Service, name: plain}]
      validation: {caCertificateRefs: [{group: "", kind: ConfigMap, name: theirs}], hostname: abc.example.com}
services:
  - metadata: {name: ok, namespace: shop}
    spec: {ports: [{name: btls, port: 443}]}
  - metadata: {name: mismatch, namespace: shop}
    spec: {ports: [{name: btls, port: 443, appProtocol: HTTPS}]}
  - metadata: {name: wrongca, namespace: shop}
    spec: {ports: [{name: btls, port: 443}]}
  - metadata: {name: noca, namespace: shop}
    spec: {ports: [{name: btls, port: 443}]}
  - metadata: {name: conflict, namespace: shop}
    spec: {ports: [{name: btls, port: 443}]}
  - metadata: {name: plain, namespace: shop}
    spec: {ports: [{name: web, port: 80}]}
  - metadata: {name: sys, namespace: shop}
    spec: {ports: [{name: btls, port: 443}]}
"#;

/// An EndpointSlice of `svc` in `shop`: one endpoint on 127.0.0.1:`port`, its port named `name`.
fn slice(svc: &str, name: &str, port: u16) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": svc, "namespace": "shop", "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": name, "port": port}],
        "endpoints": [{"addresses": ["127.0.0.1"]}],
    }))
    .unwrap()
}

haptic_e2e::on_each_version!(backends_are_spoken_to_as_their_policies_ask);
async fn backends_are_spoken_to_as_their_policies_ask(bin: haptic_e2e::HaproxyBin) {
    let (pki, other, backend_dir) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    haptic_e2e::tls::make_ca_for(pki.path(), "srv", "DNS:abc.example.com");
    haptic_e2e::tls::make_ca(other.path(), "x");
    let (_backend, tls_port) =
        common::tls_backend(&bin, pki.path(), backend_dir.path(), ("", "tls-ok sni=%[ssl_fc_sni]")).await;
    let plain_port = common::backend("plain");

    let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
    for svc in ["ok", "mismatch", "wrongca", "noca", "conflict", "sys"] {
        objects.endpoint_slices.push(slice(svc, "btls", tls_port));
    }
    objects.endpoint_slices.push(slice("plain", "web", plain_port));
    let ca = std::fs::read(pki.path().join("ca.pem")).unwrap();
    let other_ca = std::fs::read(other.path().join("ca.pem")).unwrap();
    objects.config_maps = vec![
        common::ca_config_map("shop", "ca", &ca),
        common::ca_config_map("shop", "other-ca", &other_ca),
        common::ca_config_map("other", "theirs", &ca),
    ];
    let (render, out) = haptic_render::render_gateway(
        &objects.input("haptic", common::loopback_gateway(free_port())),
        &Default::default(),
    )
    .unwrap();
    assert!(common::accepted(&out, "r").status, "{:?}", out.routes);

    // Status: one ancestor (the Gateway) per policy whose Service a route reaches.
    let policy = |name: &str| out.policies.iter().find(|p| p.object.name == name).unwrap_or_else(|| panic!("{name}"));
    let conds = |name: &str| -> Vec<(&str, bool, &str)> {
        let p = policy(name);
        assert_eq!(p.ancestors.len(), 1, "{p:?}");
        assert_eq!(
            (p.ancestors[0].parent_ref.name.as_str(), p.ancestors[0].parent_ref.namespace.as_deref()),
            ("gw", Some("shop"))
        );
        p.ancestors[0].conditions.iter().map(|c| (c.type_, c.status, c.reason)).collect()
    };
    let good = [("Accepted", true, "Accepted"), ("ResolvedRefs", true, "ResolvedRefs")];
    for name in ["ok", "mismatch", "wrong-ca", "conflict-old", "system"] {
        assert_eq!(conds(name), good, "{name}");
    }
    assert_eq!(policy("ok").ancestors[0].conditions[0].observed_generation, 3);
    assert_eq!(conds("conflict-new")[0], ("Accepted", false, "Conflicted"));
    assert_eq!(
        conds("no-ca"),
        [("Accepted", false, "NoValidCACertificate"), ("ResolvedRefs", false, "InvalidCACertificateRef")]
    );
    // No route reaches these Services: no ancestor to write under.
    assert!(policy("secret-ca").ancestors.is_empty() && policy("thief").ancestors.is_empty());

    // Only the CA files an applied policy names.
    let ca_files: Vec<&String> = render.files.keys().filter(|k| k.starts_with("certs/backendtls_")).collect();
    assert_eq!(ca_files.len(), 4, "{ca_files:?}");
    assert!(
        !ca_files.iter().any(|f| f.contains("theirs") || f.contains("no-ca") || f.contains("thief")),
        "{ca_files:?}"
    );

    let tree = tempfile::tempdir().unwrap();
    common::write_tree(&render, tree.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(tree.path())).await.unwrap();
    let port = out.gateways[0].service.ports.iter().find(|p| p.0 == 80).unwrap().1;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: app.example.com\r\nConnection: close\r\n\r\n");
    for path in ["/ok", "/conflict"] {
        let r = common::raw(addr, &get(path)).await;
        assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("tls-ok sni=abc.example.com"), "{path}: {r}");
    }
    // The test CA is not among the system's: refused like any other CA's stranger.
    for path in ["/mismatch", "/wrong-ca", "/no-ca", "/system"] {
        let r = common::raw(addr, &get(path)).await;
        assert!(r.starts_with("HTTP/1.1 503"), "{path}: {r}");
    }
    // Another namespace's policy on a Service of the same name: still plain HTTP.
    let r = common::raw(addr, &get("/plain")).await;
    assert!(r.starts_with("HTTP/1.1 200") && r.ends_with("plain"), "{r}");
}

/// What cannot be checked in HAProxy is refused in the policy's status, and its Service gets no
/// servers rather than unverified TLS: a URI subject alternative name, two names, a name that is
/// not a DNS name (an attempt to smuggle words into the server line among them).
#[test]
fn policies_haproxy_cannot_check_are_refused() {
    let bad = [
        (
            "uri",
            r#"{hostname: abc.example.com, caCertificateRefs: [{kind: ConfigMap, name: ca}], subjectAltNames: [{type: URI, uri: "spiffe://a/b"}]}"#,
        ),
        (
            "two",
            r#"{hostname: abc.example.com, caCertificateRefs: [{kind: ConfigMap, name: ca}], subjectAltNames: [{type: Hostname, hostname: a.example.com}, {type: Hostname, hostname: b.example.com}]}"#,
        ),
        ("blank", r#"{hostname: "abc.example.com verify none", caCertificateRefs: [{kind: ConfigMap, name: ca}]}"#),
        (
            "system-and-refs",
            r#"{hostname: abc.example.com, wellKnownCACertificates: System, caCertificateRefs: [{kind: ConfigMap, name: ca}]}"#,
        ),
    ];
    for (name, validation) in bad {
        let yaml = OBJECTS.split("backendTlsPolicies:").next().unwrap().to_string()
            + &format!(
                "backendTlsPolicies:\n  - metadata: {{name: p, namespace: shop}}\n    spec:\n      targetRefs: [{{group: \"\", kind: Service, name: ok}}]\n      validation: {validation}\n"
            )
            + "services:\n  - metadata: {name: ok, namespace: shop}\n    spec: {ports: [{name: btls, port: 443}]}\n";
        let mut objects: GatewayObjects = serde_saphyr::from_str(&yaml).unwrap();
        objects.endpoint_slices.push(slice("ok", "btls", 8443));
        objects.config_maps = vec![common::ca_config_map("shop", "ca", b"-----BEGIN CERTIFICATE-----\n")];
        let (render, out) = haptic_render::render_gateway(
            &objects.input("haptic", common::loopback_gateway(20000)),
            &Default::default(),
        )
        .unwrap();
        let p = &out.policies[0];
        let accepted = &p.ancestors[0].conditions[0];
        assert_eq!((accepted.status, accepted.reason), (false, "Invalid"), "{name}: {p:?}");
        let cfg = String::from_utf8(render.files["haproxy.cfg"].clone()).unwrap();
        assert!(!cfg.contains("127.0.0.1:8443"), "{name}: the Service has no servers\n{cfg}");
        assert!(!cfg.contains("verify none"), "{name}\n{cfg}");
    }
}

/// A rotated CA (the ConfigMap's new `ca.crt`) changes the CA file only: `haproxy.cfg` is
/// byte-identical, so the controller replaces the file at runtime (`cafile.set`), no reload.
#[test]
fn a_rotated_ca_changes_only_its_file() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    haptic_e2e::tls::make_ca(one.path(), "x");
    haptic_e2e::tls::make_ca(two.path(), "x");
    let render_with = |ca: &std::path::Path| {
        let mut objects: GatewayObjects = serde_saphyr::from_str(OBJECTS).unwrap();
        objects.endpoint_slices.push(slice("ok", "btls", 8443));
        objects.config_maps = vec![common::ca_config_map("shop", "ca", &std::fs::read(ca.join("ca.pem")).unwrap())];
        haptic_render::render_gateway(&objects.input("haptic", common::loopback_gateway(20000)), &Default::default())
            .unwrap()
            .0
    };
    let (a, b) = (render_with(one.path()), render_with(two.path()));
    assert_eq!(a.files["haproxy.cfg"], b.files["haproxy.cfg"]);
    let changed: Vec<&String> = a.files.keys().filter(|k| a.files.get(*k) != b.files.get(*k)).collect();
    // The CA files of the three applied policies that name the ConfigMap `ca`.
    assert_eq!(
        changed,
        [
            "certs/backendtls_shop_conflict-old_ca.pem",
            "certs/backendtls_shop_mismatch_ca.pem",
            "certs/backendtls_shop_ok_ca.pem"
        ]
    );
}
