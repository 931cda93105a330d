//! No object text can change the structure of `haproxy.cfg`: every string field of an Ingress
//! that reaches the render (hosts, paths, regex paths under `use-regex`, Service and port names,
//! Secret names, annotation values, each with the annotations it needs beside it and a canary
//! with the Ingress it joins) is fed hostile values (line breaks, NUL, quotes, backslashes, `#`, blanks, sample
//! fetches, braces, `$` expansions, a very long value, a catastrophic regex). For each, either the
//! Ingress is refused in its own verdict and the value is nowhere in the render, or the render
//! passes real `haproxy -c` with exactly the structure (sections and directives) of the same
//! render with a harmless value; a redirect target then arrives byte for byte in `Location`.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::annotations::{Allowed, NGINX_PREFIX};
use haptic_render::ingress::{IngressInput, Settings};
use k8s_openapi::api::networking::v1::Ingress;

mod common;

/// Around every hostile value, so its presence in a render can be searched for.
const MARK: &str = "zqx";

fn hostile() -> Vec<String> {
    let mut v: Vec<String> = [
        "a\nb",
        "a\rb",
        "a\0b",
        "a'b",
        "a\"b",
        "a\\b",
        "a#b",
        "a b",
        "a\tb",
        "%[env(HOME)]",
        "%{+Q}o",
        "a}b",
        "a{b",
        "}",
        "$HOME",
        "${HOME}",
        "(a+)+$",
        "a\u{2028}b",
        "\u{feff}",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    v.push("a".repeat(70_000));
    v
}

/// Where a value goes in the one Ingress of the corpus's input.
#[derive(Debug, Clone, Copy)]
enum Field {
    Host,
    Path,
    ServiceName,
    PortName,
    SecretName,
    DefaultBackendName,
    /// The path, under `use-regex: true`.
    RegexPath,
    Annotation(&'static str),
}

const FIELDS: &[Field] = &[
    Field::Host,
    Field::Path,
    Field::ServiceName,
    Field::PortName,
    Field::SecretName,
    Field::DefaultBackendName,
    Field::RegexPath,
    Field::Annotation("permanent-redirect"),
    Field::Annotation("app-root"),
    Field::Annotation("whitelist-source-range"),
    Field::Annotation("proxy-body-size"),
    Field::Annotation("proxy-read-timeout"),
    Field::Annotation("backend-protocol"),
    Field::Annotation("rewrite-target"),
    Field::Annotation("use-regex"),
    Field::Annotation("upstream-vhost"),
    Field::Annotation("server-alias"),
    Field::Annotation("affinity"),
    Field::Annotation("session-cookie-name"),
    Field::Annotation("session-cookie-path"),
    Field::Annotation("session-cookie-max-age"),
    Field::Annotation("session-cookie-expires"),
    Field::Annotation("affinity-mode"),
    Field::Annotation("canary"),
    Field::Annotation("canary-weight-total"),
    Field::Annotation("canary-weight"),
    Field::Annotation("canary-by-header"),
    Field::Annotation("canary-by-header-value"),
    Field::Annotation("canary-by-header-pattern"),
    Field::Annotation("canary-by-cookie"),
    Field::Annotation("enable-cors"),
    Field::Annotation("cors-allow-origin"),
    Field::Annotation("cors-allow-methods"),
    Field::Annotation("cors-allow-headers"),
    Field::Annotation("cors-expose-headers"),
    Field::Annotation("cors-max-age"),
    Field::Annotation("cors-allow-credentials"),
    Field::Annotation("limit-rps"),
    Field::Annotation("limit-burst-multiplier"),
    Field::Annotation("limit-connections"),
    Field::Annotation("auth-type"),
    Field::Annotation("auth-secret"),
    Field::Annotation("auth-realm"),
    Field::Annotation("auth-secret-type"),
    Field::Annotation("proxy-ssl-secret"),
    Field::Annotation("proxy-ssl-name"),
    Field::Annotation("proxy-ssl-verify"),
    Field::Annotation("proxy-ssl-server-name"),
    Field::Annotation("ssl-passthrough"),
    Field::Annotation("default-backend"),
];

const YAML: &str = r#"
ingresses:
  - metadata: {name: target, namespace: shop}
    spec:
      ingressClassName: haptic
      tls: [{hosts: [t.example.com], secretName: tls}]
      defaultBackend: {service: {name: web, port: {number: 80}}}
      rules:
        - host: t.example.com
          http:
            paths:
              - {path: /p, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
services:
  - metadata: {name: web, namespace: shop}
    spec: {ports: [{name: http, port: 80, targetPort: 8080}]}
endpointSlices:
  - metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{name: http, port: 8080}]
    endpoints:
      - {addresses: [127.0.0.1]}
"#;

fn base() -> IngressInput {
    let mut i =
        common::input(YAML, Settings { bind_address: [127, 0, 0, 1].into(), min_slots: 2, ..Settings::default() });
    i.allowed = Allowed { snippets: true };
    i.secrets.push(tls_secret("tls"));
    i
}

fn tls_secret(name: &str) -> k8s_openapi::api::core::v1::Secret {
    static PEM: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let (cert, key) = PEM
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            haptic_e2e::tls::make_ca(dir.path(), "srv");
            let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
            (read("srv.pem"), read("srv.key"))
        })
        .clone();
    let mut s = k8s_openapi::api::core::v1::Secret::default();
    s.metadata.name = Some(name.into());
    s.metadata.namespace = Some("shop".into());
    s.type_ = Some("kubernetes.io/tls".into());
    s.data = Some(
        [("tls.crt", cert), ("tls.key", key)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.into_bytes())))
            .collect(),
    );
    s
}

/// Puts `value` into `field` of `ing` (and, for a Secret name, a Secret of that name).
fn set(input: &mut IngressInput, field: Field, value: &str) {
    let ing: &mut Ingress = &mut input.ingresses[0];
    let spec = ing.spec.as_mut().unwrap();
    let rule = &mut spec.rules.as_mut().unwrap()[0];
    let path = &mut rule.http.as_mut().unwrap().paths[0];
    match field {
        Field::Host => rule.host = Some(value.into()),
        Field::Path => path.path = Some(format!("/{value}")),
        Field::ServiceName => path.backend.service.as_mut().unwrap().name = value.into(),
        Field::PortName => path.backend.service.as_mut().unwrap().port.as_mut().unwrap().name = Some(value.into()),
        Field::SecretName => {
            spec.tls.as_mut().unwrap()[0].secret_name = Some(value.into());
            let s = tls_secret(value);
            input.secrets.push(s);
        }
        Field::DefaultBackendName => {
            spec.default_backend.as_mut().unwrap().service.as_mut().unwrap().name = value.into()
        }
        Field::RegexPath => {
            path.path = Some(format!("/{value}"));
            ing.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(format!("{NGINX_PREFIX}use-regex"), "true".into());
        }
        Field::Annotation(key) => {
            let v = match key {
                "permanent-redirect" => format!("https://x.example/{value}"),
                "app-root" | "rewrite-target" | "session-cookie-path" => format!("/{value}"),
                _ => value.to_string(),
            };
            // The annotations each needs beside it to mean anything.
            let mut with = vec![(key, v)];
            if key.starts_with("session-cookie-") || key == "affinity-mode" {
                with.push(("affinity", "cookie".into()));
            }
            if key.starts_with("proxy-ssl-") {
                with.push(("backend-protocol", "HTTPS".into()));
                for (k, v) in
                    [("proxy-ssl-secret", "upstream"), ("proxy-ssl-name", "b.internal"), ("proxy-ssl-verify", "on")]
                {
                    if k != key {
                        with.push((k, v.into()));
                    }
                }
            }
            if key.starts_with("cors-") {
                with.push(("enable-cors", "true".into()));
            }
            if key == "limit-burst-multiplier" {
                with.push(("limit-rps", "5".into()));
            }
            if key.starts_with("auth-") {
                for (k, v) in [("auth-type", "basic"), ("auth-secret", "users")] {
                    if k != key {
                        with.push((k, v.into()));
                    }
                }
            }
            if key.starts_with("canary") && key != "canary" {
                with.push(("canary", "true".into()));
                if key == "canary-by-header-value" || key == "canary-by-header-pattern" {
                    with.push(("canary-by-header", "X-Canary".into()));
                }
            }
            let a = ing.metadata.annotations.get_or_insert_with(Default::default);
            for (k, v) in with {
                a.insert(format!("{NGINX_PREFIX}{k}"), v);
            }
            if key.starts_with("proxy-ssl-") {
                // The CA's Secret, under the name the annotation gives.
                let name = if key == "proxy-ssl-secret" { value } else { "upstream" };
                let mut s = tls_secret(name);
                let ca = s.data.as_ref().unwrap()["tls.crt"].clone();
                s.data = Some([("ca.crt".to_string(), ca)].into_iter().collect());
                input.secrets.push(s);
            }
            if key.starts_with("auth-") {
                // The users' Secret, under the name the annotation gives.
                let name = if key == "auth-secret" { value } else { "users" };
                let mut s = k8s_openapi::api::core::v1::Secret::default();
                s.metadata.name = Some(name.into());
                s.metadata.namespace = Some("shop".into());
                s.data = Some(
                    [("auth".to_string(), k8s_openapi::ByteString(b"u:$6$salt$hash".to_vec()))].into_iter().collect(),
                );
                input.secrets.push(s);
            }
            if key.starts_with("canary") {
                // The Ingress a canary joins (after the target among the verdicts).
                let mut main = input.ingresses[0].clone();
                main.metadata.name = Some("z-main".into());
                main.metadata.annotations = None;
                main.spec.as_mut().unwrap().rules.as_mut().unwrap()[0].http.as_mut().unwrap().paths[0]
                    .backend
                    .service
                    .as_mut()
                    .unwrap()
                    .name = "main".into();
                input.ingresses.push(main);
                let mut svc = input.services[0].clone();
                svc.metadata.name = Some("main".into());
                input.services.push(svc);
            }
        }
    }
}

/// The config's structure: each section's header words, and each line's first word.
fn structure(cfg: &str) -> Vec<(String, Vec<String>)> {
    haptic_haproxy::cfg::parse(cfg)
        .sections
        .iter()
        .map(|s| (s.header.clone(), s.lines.iter().map(|l| l[0].clone()).collect()))
        .collect()
}

fn haproxy_c(bin: &HaproxyBin, render: &haptic_render::Render) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(render, dir.path());
    let out =
        std::process::Command::new(&bin.path).arg("-c").arg("-f").arg(dir.path().join("haproxy.cfg")).output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

fn contains(render: &haptic_render::Render, needle: &str) -> bool {
    render.files.values().any(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
}

haptic_e2e::on_each_version!(sync hostile_values_are_refused_or_stay_values);
fn hostile_values_are_refused_or_stay_values(bin: HaproxyBin) {
    let mut accepted = 0;
    for &field in FIELDS {
        let mut harmless = base();
        set(&mut harmless, field, &format!("{MARK}x{MARK}"));
        let harmless = haptic_render::render(&harmless, &Default::default()).unwrap();
        for v in hostile() {
            let marked = format!("{MARK}{v}{MARK}");
            let mut input = base();
            set(&mut input, field, &marked);
            let render = haptic_render::render(&input, &Default::default())
                .unwrap_or_else(|e| panic!("{field:?} = {v:?}: the render failed as a whole: {e}"));
            let verdict = &render.verdicts[0];
            let what = format!("{field:?} = {:?}", v.chars().take(40).collect::<String>());
            if !verdict.refusals.is_empty() {
                // Refused: its own verdict says so, and the value is nowhere.
                assert!(!contains(&render, &marked), "{what}: refused, yet in the render");
                continue;
            }
            accepted += 1;
            haproxy_c(&bin, &render).unwrap_or_else(|e| {
                panic!(
                    "{what}: accepted, but haproxy -c refuses the render: {e}\n{}",
                    String::from_utf8_lossy(&render.files["haproxy.cfg"])
                )
            });
            let cfg = String::from_utf8_lossy(&render.files["haproxy.cfg"]);
            let want = String::from_utf8_lossy(&harmless.files["haproxy.cfg"]);
            assert_eq!(structure(&cfg), structure(&want), "{what}: the structure changed\n{cfg}");
        }
    }
    // Some values are fine where they land (a quote in a path, a brace in a redirect target).
    assert!(accepted > 0);
}

haptic_e2e::on_each_version!(redirect_targets_arrive_literally);
async fn redirect_targets_arrive_literally(bin: HaproxyBin) {
    let http_port = free_port();
    let mut input = base();
    input.settings.http_port = http_port;
    // One Ingress per accepted target, each on its own host.
    let template = input.ingresses[0].clone();
    input.ingresses.clear();
    let mut want = Vec::new();
    for (i, v) in hostile().into_iter().enumerate() {
        let mut ing = template.clone();
        ing.metadata.name = Some(format!("r{i}"));
        ing.spec.as_mut().unwrap().tls = None;
        ing.spec.as_mut().unwrap().default_backend = None;
        let host = format!("r{i}.example.com");
        ing.spec.as_mut().unwrap().rules.as_mut().unwrap()[0].host = Some(host.clone());
        let target = format!("https://x.example/{v}");
        ing.metadata.annotations = Some([(format!("{NGINX_PREFIX}permanent-redirect"), target.clone())].into());
        input.ingresses.push(ing);
        want.push((i, host, target));
    }
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let mut checked = 0;
    for (i, host, target) in want {
        let v = render.verdicts.iter().find(|v| v.object.name == format!("r{i}")).unwrap();
        if !v.refusals.is_empty() {
            continue;
        }
        let r = common::raw(addr, &format!("GET /p HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")).await;
        let location = r
            .split("\r\n\r\n")
            .next()
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("location: ").or_else(|| l.strip_prefix("Location: ")))
            .unwrap_or_else(|| panic!("{host}: no Location in {r:?}"));
        assert_eq!(location, target, "{host}");
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} targets were accepted");
}
