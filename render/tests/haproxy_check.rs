//! The render of a fixture set is a configuration real HAProxy accepts (`haproxy -c`), on HAProxy
//! 2.6, 3.0, 3.2 and 3.4 (one test case per version; a missing version fails).

mod common;

use haptic_render::ingress::Settings;

fn input() -> haptic_render::ingress::IngressInput {
    common::basic_input(Settings { bind_address: [127, 0, 0, 1].into(), min_slots: 4, ..Settings::default() })
}

haptic_e2e::on_each_version!(sync haproxy_accepts_the_render);
fn haproxy_accepts_the_render(bin: haptic_e2e::HaproxyBin) {
    let render = haptic_render::render(&input(), &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let out =
        std::process::Command::new(&bin.path).arg("-c").arg("-f").arg(dir.path().join("haproxy.cfg")).output().unwrap();
    assert!(
        out.status.success(),
        "haproxy {} -c refused the render:\n{}\n{}\n{}",
        bin.version_string,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&render.files["haproxy.cfg"])
    );
}
