//! A Gateway API render is a configuration real HAProxy accepts: on HAProxy 2.6 and 3.0 (one
//! test case per version), `haproxy -c` accepts the render of the Gateway fixture (every match
//! kind, filters, a redirect, weights, 500, TLS with a real certificate).

mod common;

use std::net::IpAddr;

use haptic_render::gateway::{GatewayObjects, GatewaySettings};

fn tls_secret(dir: &std::path::Path) -> k8s_openapi::api::core::v1::Secret {
    let (c, k) = (dir.join("c.pem"), dir.join("k.pem"));
    let ok = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=site.example.com", "-days", "1"])
        .arg("-keyout")
        .arg(&k)
        .arg("-out")
        .arg(&c)
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let mut s = k8s_openapi::api::core::v1::Secret::default();
    s.metadata.name = Some("site".into());
    s.metadata.namespace = Some("edge".into());
    s.type_ = Some("kubernetes.io/tls".into());
    s.data = Some(
        [
            ("tls.crt".to_string(), k8s_openapi::ByteString(std::fs::read(c).unwrap())),
            ("tls.key".to_string(), k8s_openapi::ByteString(std::fs::read(k).unwrap())),
        ]
        .into(),
    );
    s
}

haptic_e2e::on_each_version!(sync haproxy_accepts_the_gateway_render);
fn haproxy_accepts_the_gateway_render(bin: haptic_e2e::HaproxyBin) {
    let dir = tempfile::tempdir().unwrap();
    let mut objects: GatewayObjects = serde_saphyr::from_str(include_str!("fixtures/gateway.yaml")).unwrap();
    objects.secrets = vec![tls_secret(dir.path())];
    let settings = GatewaySettings {
        bind_address: IpAddr::from([127, 0, 0, 1]),
        first_bind_port: 40000,
        min_slots: 4,
        ..Default::default()
    };
    let input = objects.input("haptic", settings);
    let (render, _) = haptic_render::render_gateway(&input, &Default::default()).unwrap();
    let tree = dir.path().join("tree");
    common::write_tree(&render, &tree);
    let out = std::process::Command::new(&bin.path).arg("-c").arg("-f").arg(tree.join("haproxy.cfg")).output().unwrap();
    assert!(
        out.status.success(),
        "haproxy {} -c refused the render:\n{}\n{}\n{}",
        bin.version_string,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&render.files["haproxy.cfg"])
    );
}
