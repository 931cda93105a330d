//! Secrets reach HAProxy only as parsed, re-encoded PEM: on HAProxy 2.6, 3.0, 3.2 and 3.4 (one test case
//! per version), a Secret whose `tls.crt` wraps its PEM blocks in Lua text is served on SNI from
//! a file holding only the re-encoded blocks, while an Ingress in another namespace whose
//! Secret pairs a certificate with another certificate's key is refused in its own verdict and
//! the first still serves.

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::Settings;
use k8s_openapi::api::core::v1::Secret;

mod common;

const YAML: &str = r#"
ingresses:
  - metadata: {name: shop, namespace: alpha}
    spec:
      ingressClassName: haptic
      tls: [{hosts: [good.example.com], secretName: site}]
      rules:
        - host: good.example.com
          http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
  - metadata: {name: shop, namespace: beta}
    spec:
      ingressClassName: haptic
      tls: [{hosts: [bad.example.com], secretName: site}]
      rules:
        - host: bad.example.com
          http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}
services:
  - metadata: {name: web, namespace: alpha}
    spec: {ports: [{port: 80}]}
  - metadata: {name: web, namespace: beta}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: web, namespace: alpha, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
  - metadata: {name: web, namespace: beta, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

fn tls(ns: &str, crt: Vec<u8>, key: Vec<u8>) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some("site".into());
    s.metadata.namespace = Some(ns.into());
    s.type_ = Some("kubernetes.io/tls".into());
    s.data =
        Some([("tls.crt", crt), ("tls.key", key)].map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v))).into());
    s
}

haptic_e2e::on_each_version!(a_polyglot_is_served_re_encoded_and_a_mismatched_key_refuses_its_ingress);
async fn a_polyglot_is_served_re_encoded_and_a_mismatched_key_refuses_its_ingress(bin: HaproxyBin) {
    let pki = tempfile::tempdir().unwrap();
    haptic_e2e::tls::make_ca(pki.path(), "srv");
    haptic_e2e::tls::make_host_cert(pki.path(), "good", "good.example.com");
    haptic_e2e::tls::make_host_cert(pki.path(), "bad", "bad.example.com");
    let read = |f: &str| std::fs::read(pki.path().join(f)).unwrap();
    let lua = b"core.register_init(function() os.execute('touch /tmp/pwned') end)\n--[[\n".to_vec();
    let polyglot = [lua.clone(), read("good.pem"), lua.clone(), read("ca.pem"), b"]]\n".to_vec(), lua.clone()].concat();

    let web = common::backend("web");
    let (http_port, https_port) = (free_port(), free_port());
    let mut input = common::input(
        YAML,
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, https_port, min_slots: 2, ..Settings::default() },
    );
    common::endpoints_on_loopback(&mut input, |_| web);
    input.secrets = vec![
        tls("alpha", polyglot, [lua.clone(), read("good.key")].concat()),
        // beta's certificate with alpha's key.
        tls("beta", read("bad.pem"), read("good.key")),
    ]
    .into_iter()
    .map(std::sync::Arc::new)
    .collect();
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let verdict = |ns: &str| render.verdicts.iter().find(|v| v.object.namespace == ns).unwrap();
    assert!(verdict("alpha").accepted(), "{:?}", verdict("alpha"));
    let refusals = &verdict("beta").refusals;
    assert!(
        refusals.iter().any(|r| r.field == "spec.tls[0].secretName" && r.cause == haptic_render::Cause::Invalid),
        "{refusals:?}"
    );
    // The file holds the two certificates and the key, nothing of the Lua.
    let file = String::from_utf8(render.files["certs/alpha_site.pem"].clone()).unwrap();
    assert!(!file.contains("core.") && !file.contains("[["), "{file}");
    assert_eq!(file.matches("BEGIN CERTIFICATE").count(), 2);
    assert_eq!(file.matches("PRIVATE KEY-----").count(), 2);
    assert!(!render.files.contains_key("certs/beta_site.pem"));

    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let ca = pki.path().join("ca.pem");
    // good.example.com's certificate, verified against the CA for that name.
    let (code, body) = common::curl_tls("good.example.com", https_port, &ca).await;
    assert_eq!((code, body.as_str()), (Some(0), "web"), "{body}");
    // bad.example.com has no certificate of its own and no route: never its backend.
    let (code, body) = common::curl_tls("bad.example.com", https_port, &ca).await;
    assert!(code != Some(0) && body != "web", "{code:?} {body}");
}
