//! The render of a fixture set is a configuration real HAProxy accepts (`haproxy -c`), on each
//! version in `HAPTIC_HAPROXY_BINS` (one test per version; a missing version fails).

use haptic_render::ingress::{IngressInput, Settings, INGRESS_CONTROLLER};
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass, IngressClassSpec};

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct Fixture {
    ingresses: Vec<Ingress>,
    services: Vec<Service>,
    endpoint_slices: Vec<EndpointSlice>,
    secrets: Vec<Secret>,
}

fn input() -> IngressInput {
    let f: Fixture = serde_saphyr::from_str(include_str!("fixtures/basic.yaml")).unwrap();
    let mut class = IngressClass::default();
    class.metadata.name = Some("haptic".into());
    class.spec = Some(IngressClassSpec { controller: Some(INGRESS_CONTROLLER.into()), ..Default::default() });
    IngressInput {
        class,
        ingresses: f.ingresses,
        services: f.services,
        endpoint_slices: f.endpoint_slices,
        secrets: f.secrets,
        previous_slots: Default::default(),
        settings: Settings { bind_address: [127, 0, 0, 1].into(), min_slots: 4, ..Settings::default() },
    }
}

fn check(version: &str) {
    let bins = haptic_e2e::haproxy_bins();
    let bin = bins
        .iter()
        .find(|b| b.version_string.starts_with(version))
        .unwrap_or_else(|| panic!("no HAProxy {version} in HAPTIC_HAPROXY_BINS: {bins:?}"));
    let render = haptic_render::render(&input(), &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (path, bytes) in &render.files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
    }
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
