//! A Gateway API render is a configuration real HAProxy accepts: on HAProxy 2.6, 3.0, 3.2 and 3.4 (one
//! test case per version), `haproxy -c` accepts the render of the Gateway fixture (every match
//! kind, filters, a redirect, weights, 500, TLS with a real certificate).

mod common;

use std::net::IpAddr;

use haptic_render::gateway::{GatewayObjects, GatewaySettings};

haptic_e2e::on_each_version!(sync haproxy_accepts_the_gateway_render);
fn haproxy_accepts_the_gateway_render(bin: haptic_e2e::HaproxyBin) {
    let dir = tempfile::tempdir().unwrap();
    let mut objects: GatewayObjects = serde_saphyr::from_str(include_str!("fixtures/gateway.yaml")).unwrap();
    objects.secrets = vec![common::tls_secret(dir.path(), "edge", "site")];
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
