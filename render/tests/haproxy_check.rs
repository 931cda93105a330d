//! The render of a fixture set is a configuration real HAProxy accepts (`haproxy -c`), on each
//! version in `HAPTIC_HAPROXY_BINS` (one test per version; a missing version fails).

mod common;

use haptic_render::ingress::Settings;

fn input() -> haptic_render::ingress::IngressInput {
    common::basic_input(Settings { bind_address: [127, 0, 0, 1].into(), min_slots: 4, ..Settings::default() })
}

fn check(version: &str) {
    let bins = haptic_e2e::haproxy_bins();
    let bin = bins
        .iter()
        .find(|b| b.version_string.starts_with(version))
        .unwrap_or_else(|| panic!("no HAProxy {version} in HAPTIC_HAPROXY_BINS: {bins:?}"));
    let render = haptic_render::render(&input(), &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let out =
        std::process::Command::new(&bin.path).arg("-c").arg("-f").arg(dir.path().join("haproxy.cfg")).output().unwrap();
    assert!(
        out.status.success(),
        "haproxy {version} -c refused the render:\n{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&render.files["haproxy.cfg"])
    );
}

#[test]
fn haproxy_2_6_accepts_the_render() {
    check("2.6");
}

#[test]
fn haproxy_3_0_accepts_the_render() {
    check("3.0");
}
