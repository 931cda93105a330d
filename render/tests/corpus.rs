//! No object text can change the structure of `haproxy.cfg`: every string field of an Ingress
//! that reaches the render (hosts, paths, regex paths under `use-regex`, Service and port names,
//! Secret names, annotation values, each with the annotations it needs beside it and a canary
//! with the Ingress it joins) is fed hostile values (line breaks, NUL, quotes, backslashes, `#`, blanks, sample
//! fetches, braces, `$` expansions, a very long value, a catastrophic regex). For each, either the
//! Ingress is refused in its own verdict and the value is nowhere in the render, or the render
//! passes real `haproxy -c` with exactly the structure (sections and directives) of the same
//! render with a harmless value; a redirect target then arrives byte for byte in `Location`.
//!
//! The same corpus goes through the Gateway API translator into every string field of an
//! HTTPRoute (hostnames, the listener name a parentRef names, rule names, paths of every match
//! type, methods, header and query parameter names and values, the names and values of request,
//! response and backend header filters, URLRewrite and RequestRedirect hostnames and paths,
//! timeouts, backend names with a Service of that name): refused in the route's own status (a
//! refusal, or a parent condition False) and nowhere in the render, or accepted with `haproxy -c`
//! passing and the structure unchanged (and likewise through a GRPCRoute's hostname, service,
//! method, header match and backend name). Each accepted header value then arrives byte for byte:
//! a request carrying it in a header matches, the backend receives the request and backend filter
//! headers set to it, the client the response headers, and a redirect's `Location` ends in it.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::annotations::{Allowed, NGINX_PREFIX};
use haptic_render::gateway::{GatewayInput, GatewayObjects, GatewayOutput, GatewaySettings};
use haptic_render::ingress::{IngressInput, Settings};
use k8s_openapi::api::networking::v1::Ingress;

mod common;
/// The tenant attack corpus.
#[path = "corpus/tenants.rs"]
mod tenants;

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
    Field::Annotation("session-cookie-secure"),
    Field::Annotation("session-cookie-samesite"),
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
    Field::Annotation("limit-rpm"),
    Field::Annotation("limit-whitelist"),
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
    Field::Annotation("custom-http-errors"),
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
    i.secrets.push(std::sync::Arc::new(tls_secret("tls")));
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
    let ing: &mut Ingress = std::sync::Arc::make_mut(&mut input.ingresses[0]);
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
            input.secrets.push(std::sync::Arc::new(s));
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
        Field::Annotation(key) => set_annotation(input, key, value),
    }
}

/// Puts `value` into annotation `key` of the first Ingress, with the annotations it needs beside
/// it and the objects they name (Secrets, the Ingress a canary joins and its Service).
fn set_annotation(input: &mut IngressInput, key: &'static str, value: &str) {
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
        for (k, v) in [("proxy-ssl-secret", "upstream"), ("proxy-ssl-name", "b.internal"), ("proxy-ssl-verify", "on")] {
            if k != key {
                with.push((k, v.into()));
            }
        }
    }
    if key.starts_with("cors-") {
        with.push(("enable-cors", "true".into()));
    }
    if key == "limit-burst-multiplier" || key == "limit-whitelist" {
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
    let a = std::sync::Arc::make_mut(&mut input.ingresses[0]).metadata.annotations.get_or_insert_with(Default::default);
    for (k, v) in with {
        a.insert(format!("{NGINX_PREFIX}{k}"), v);
    }
    if key.starts_with("proxy-ssl-") {
        // The CA's Secret, under the name the annotation gives.
        let name = if key == "proxy-ssl-secret" { value } else { "upstream" };
        let mut s = tls_secret(name);
        let ca = s.data.as_ref().unwrap()["tls.crt"].clone();
        s.data = Some([("ca.crt".to_string(), ca)].into_iter().collect());
        input.secrets.push(std::sync::Arc::new(s));
    }
    if key.starts_with("auth-") {
        // The users' Secret, under the name the annotation gives.
        let name = if key == "auth-secret" { value } else { "users" };
        let mut s = k8s_openapi::api::core::v1::Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("shop".into());
        s.data =
            Some([("auth".to_string(), k8s_openapi::ByteString(b"u:$6$salt$hash".to_vec()))].into_iter().collect());
        input.secrets.push(std::sync::Arc::new(s));
    }
    if key.starts_with("canary") {
        // The Ingress a canary joins (after the target among the verdicts).
        let mut main = (*input.ingresses[0]).clone();
        main.metadata.name = Some("z-main".into());
        main.metadata.annotations = None;
        main.spec.as_mut().unwrap().rules.as_mut().unwrap()[0].http.as_mut().unwrap().paths[0]
            .backend
            .service
            .as_mut()
            .unwrap()
            .name = "main".into();
        input.ingresses.push(std::sync::Arc::new(main));
        let mut svc = (*input.services[0]).clone();
        svc.metadata.name = Some("main".into());
        input.services.push(std::sync::Arc::new(svc));
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
    let template = (*input.ingresses[0]).clone();
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
        input.ingresses.push(std::sync::Arc::new(ing));
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

// The same corpus through the Gateway API translator: every string field of an HTTPRoute.

/// Where a value goes in the HTTPRoute `target` of [`ROUTE_YAML`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RouteField {
    Hostname,
    RuleName,
    ParentSection,
    PathPrefix,
    PathExact,
    PathRegex,
    Method,
    HeaderMatchName,
    HeaderMatchValue,
    HeaderMatchRegex,
    QueryName,
    QueryValue,
    QueryRegex,
    RequestSetName,
    RequestSetValue,
    RequestAddName,
    RequestAddValue,
    RequestRemove,
    ResponseSetName,
    ResponseSetValue,
    ResponseAddName,
    ResponseAddValue,
    ResponseRemove,
    RewriteHostname,
    RewritePrefix,
    RewriteFullPath,
    RedirectHostname,
    RedirectPrefix,
    RedirectFullPath,
    RequestTimeout,
    BackendName,
    BackendFilterName,
    BackendFilterValue,
}

const ROUTE_FIELDS: &[RouteField] = &[
    RouteField::Hostname,
    RouteField::RuleName,
    RouteField::ParentSection,
    RouteField::PathPrefix,
    RouteField::PathExact,
    RouteField::PathRegex,
    RouteField::Method,
    RouteField::HeaderMatchName,
    RouteField::HeaderMatchValue,
    RouteField::HeaderMatchRegex,
    RouteField::QueryName,
    RouteField::QueryValue,
    RouteField::QueryRegex,
    RouteField::RequestSetName,
    RouteField::RequestSetValue,
    RouteField::RequestAddName,
    RouteField::RequestAddValue,
    RouteField::RequestRemove,
    RouteField::ResponseSetName,
    RouteField::ResponseSetValue,
    RouteField::ResponseAddName,
    RouteField::ResponseAddValue,
    RouteField::ResponseRemove,
    RouteField::RewriteHostname,
    RouteField::RewritePrefix,
    RouteField::RewriteFullPath,
    RouteField::RedirectHostname,
    RouteField::RedirectPrefix,
    RouteField::RedirectFullPath,
    RouteField::RequestTimeout,
    RouteField::BackendName,
    RouteField::BackendFilterName,
    RouteField::BackendFilterValue,
];

/// One Gateway and the route `target`, whose rules use every filter: rule 0 matches a path
/// prefix, a header and a query parameter and modifies request and response headers, rewrites
/// host and prefix, and has a backend with its own header filter; rule 1 an exact path with a
/// full-path rewrite; rules 2 and 3 redirect (prefix with a hostname, full path).
const ROUTE_YAML: &str = r#"
gateways:
  - metadata: {name: gw, namespace: web}
    spec:
      gatewayClassName: haptic
      listeners: [{name: http, port: 80, protocol: HTTP}]
routes:
  - metadata: {name: target, namespace: web, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw, sectionName: http}]
      hostnames: [t.example.com]
      rules:
        - name: r0
          matches:
            - path: {type: PathPrefix, value: /p}
              method: GET
              headers: [{name: X-M, value: m}]
              queryParams: [{name: q, value: v}]
          filters:
            - type: RequestHeaderModifier
              requestHeaderModifier:
                set: [{name: X-Set, value: s}]
                add: [{name: X-Add, value: a}]
                remove: [X-Drop]
            - type: ResponseHeaderModifier
              responseHeaderModifier:
                set: [{name: X-RSet, value: s}]
                add: [{name: X-RAdd, value: a}]
                remove: [X-RDrop]
            - type: URLRewrite
              urlRewrite: {hostname: rw.example.com, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}
          timeouts: {request: 10s}
          backendRefs:
            - name: web
              port: 80
              filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-B, value: b}]}}]
        - matches: [{path: {type: Exact, value: /e}}]
          filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /full}}}]
          backendRefs: [{name: web, port: 80}]
        - matches: [{path: {type: PathPrefix, value: /r}}]
          filters:
            - type: RequestRedirect
              requestRedirect: {hostname: to.example.com, path: {type: ReplacePrefixMatch, replacePrefixMatch: /to}}
        - matches: [{path: {type: PathPrefix, value: /f}}]
          filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplaceFullPath, replaceFullPath: /full}}}]
services:
  - metadata: {name: web, namespace: web}
    spec: {ports: [{name: http, port: 80}]}
endpointSlices:
  - metadata: {name: web-1, namespace: web, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{name: http, port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

fn route_objects() -> GatewayObjects {
    serde_saphyr::from_str(ROUTE_YAML).unwrap()
}

fn route_input(objects: GatewayObjects, bind: u16) -> GatewayInput {
    let settings = GatewaySettings {
        bind_address: [127, 0, 0, 1].into(),
        first_bind_port: bind,
        min_slots: 2,
        ..Default::default()
    };
    objects.input("haptic", settings)
}

/// Puts `value` into `field` of the route `target` (and, for a backend name, a Service of that
/// name with an endpoint, so the name reaches the translator's own checks).
fn set_route(objects: &mut GatewayObjects, field: RouteField, value: &str) {
    use haptic_render::gateway_api::{HttpPathMatch, HttpPathModifier, MatchType, PathMatchType, PathModifierType};
    let spec = &mut objects.routes[0].spec;
    let path = format!("/{value}");
    let rules = &mut spec.rules;
    let m0 = &mut rules[0].matches[0];
    match field {
        RouteField::Hostname => spec.hostnames = vec![value.into()],
        RouteField::RuleName => rules[0].name = Some(value.into()),
        RouteField::ParentSection => {
            // The listener's name too: the section a route names.
            spec.parent_refs[0].section_name = Some(value.into());
            objects.gateways[0].spec.listeners[0].name = value.into();
        }
        RouteField::PathPrefix => m0.path.as_mut().unwrap().value = Some(path),
        RouteField::PathExact => rules[1].matches[0].path.as_mut().unwrap().value = Some(path),
        RouteField::PathRegex => {
            rules[1].matches[0].path =
                Some(HttpPathMatch { type_: Some(PathMatchType::RegularExpression), value: Some(path) })
        }
        RouteField::Method => m0.method = Some(value.into()),
        RouteField::HeaderMatchName => m0.headers[0].name = value.into(),
        RouteField::HeaderMatchValue => m0.headers[0].value = value.into(),
        RouteField::HeaderMatchRegex => {
            m0.headers[0].type_ = Some(MatchType::RegularExpression);
            m0.headers[0].value = value.into();
        }
        RouteField::QueryName => m0.query_params[0].name = value.into(),
        RouteField::QueryValue => m0.query_params[0].value = value.into(),
        RouteField::QueryRegex => {
            m0.query_params[0].type_ = Some(MatchType::RegularExpression);
            m0.query_params[0].value = value.into();
        }
        RouteField::RequestSetName
        | RouteField::RequestSetValue
        | RouteField::RequestAddName
        | RouteField::RequestAddValue
        | RouteField::RequestRemove => {
            let f = rules[0].filters[0].request_header_modifier.as_mut().unwrap();
            match field {
                RouteField::RequestSetName => f.set[0].name = value.into(),
                RouteField::RequestSetValue => f.set[0].value = value.into(),
                RouteField::RequestAddName => f.add[0].name = value.into(),
                RouteField::RequestAddValue => f.add[0].value = value.into(),
                _ => f.remove[0] = value.into(),
            }
        }
        RouteField::ResponseSetName
        | RouteField::ResponseSetValue
        | RouteField::ResponseAddName
        | RouteField::ResponseAddValue
        | RouteField::ResponseRemove => {
            let f = rules[0].filters[1].response_header_modifier.as_mut().unwrap();
            match field {
                RouteField::ResponseSetName => f.set[0].name = value.into(),
                RouteField::ResponseSetValue => f.set[0].value = value.into(),
                RouteField::ResponseAddName => f.add[0].name = value.into(),
                RouteField::ResponseAddValue => f.add[0].value = value.into(),
                _ => f.remove[0] = value.into(),
            }
        }
        RouteField::RewriteHostname => rules[0].filters[2].url_rewrite.as_mut().unwrap().hostname = Some(value.into()),
        RouteField::RewritePrefix => {
            rules[0].filters[2].url_rewrite.as_mut().unwrap().path.as_mut().unwrap().replace_prefix_match = Some(path)
        }
        RouteField::RewriteFullPath => {
            rules[1].filters[0].url_rewrite.as_mut().unwrap().path.as_mut().unwrap().replace_full_path = Some(path)
        }
        RouteField::RedirectHostname => {
            rules[2].filters[0].request_redirect.as_mut().unwrap().hostname = Some(value.into())
        }
        RouteField::RedirectPrefix => {
            rules[2].filters[0].request_redirect.as_mut().unwrap().path = Some(HttpPathModifier {
                type_: PathModifierType::ReplacePrefixMatch,
                replace_full_path: None,
                replace_prefix_match: Some(path),
            })
        }
        RouteField::RedirectFullPath => {
            rules[3].filters[0].request_redirect.as_mut().unwrap().path.as_mut().unwrap().replace_full_path = Some(path)
        }
        RouteField::RequestTimeout => rules[0].timeouts.as_mut().unwrap().request = Some(value.into()),
        RouteField::BackendName => {
            rules[0].backend_refs[0].name = value.into();
            add_service_like_the_first(objects, value);
        }
        RouteField::BackendFilterName | RouteField::BackendFilterValue => {
            let h = &mut rules[0].backend_refs[0].filters[0].request_header_modifier.as_mut().unwrap().set[0];
            if field == RouteField::BackendFilterName {
                h.name = value.into();
            } else {
                h.value = value.into();
            }
        }
    }
}

/// A Service `name` with an EndpointSlice, copies of the first ones of `objects`, so a backend
/// name reaches the translator's own checks.
fn add_service_like_the_first(objects: &mut GatewayObjects, name: &str) {
    let mut svc = objects.services[0].clone();
    svc.metadata.name = Some(name.into());
    objects.services.push(svc);
    let mut slice = objects.endpoint_slices[0].clone();
    slice.metadata.name = Some(format!("{name}-1"));
    slice.metadata.labels = Some([("kubernetes.io/service-name".to_string(), name.to_string())].into());
    objects.endpoint_slices.push(slice);
}

/// Like [`structure`], with `marked` written as `harmless` in section headers (a backend's name
/// is one), and the sections in order of their headers (a backend's place follows its name).
fn route_structure(cfg: &str, marked: &str, harmless: &str) -> Vec<(String, Vec<String>)> {
    let mut s: Vec<(String, Vec<String>)> =
        structure(cfg).into_iter().map(|(h, lines)| (h.replace(marked, harmless), lines)).collect();
    s.sort();
    s
}

/// Whether any file of `render` contains `needle`, ASCII case ignored (hosts, methods and
/// header names are written in one case).
fn contains_any_case(render: &haptic_render::Render, needle: &str) -> bool {
    let n = needle.as_bytes();
    render.files.values().any(|b| b.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n)))
}

/// Whether the route's own status refuses something: a refusal in its verdict, or a parent
/// condition (Accepted, ResolvedRefs) that is False.
fn route_refused(render: &haptic_render::Render, out: &GatewayOutput) -> Option<String> {
    let v = render.verdicts.iter().find(|v| v.object.kind == "HTTPRoute" && v.object.name == "target").unwrap();
    let route = out.routes.iter().find(|r| r.object.name == "target").unwrap();
    let falses: Vec<String> = route
        .parents
        .iter()
        .flat_map(|p| &p.conditions)
        .filter(|c| !c.status)
        .map(|c| format!("{} {}: {}", c.type_, c.reason, c.message))
        .collect();
    if v.refusals.is_empty() && falses.is_empty() {
        None
    } else {
        Some(format!("{:?} {falses:?}", v.refusals))
    }
}

haptic_e2e::on_each_version!(sync route_hostile_values_are_refused_or_stay_values);
fn route_hostile_values_are_refused_or_stay_values(bin: HaproxyBin) {
    let harmless_value = format!("{MARK}x{MARK}");
    let (mut accepted, mut refused) = (0, 0);
    for &field in ROUTE_FIELDS {
        let mut objects = route_objects();
        set_route(&mut objects, field, &harmless_value);
        let (harmless, out) = haptic_render::render_gateway(&route_input(objects, 20000), &Default::default()).unwrap();
        // Regular-expression matches are not supported, and a duration is digits and units:
        // these are refused whatever the marked value.
        let never = matches!(
            field,
            RouteField::PathRegex | RouteField::HeaderMatchRegex | RouteField::QueryRegex | RouteField::RequestTimeout
        );
        assert_eq!(route_refused(&harmless, &out).is_some(), never, "{field:?}: {:?}", route_refused(&harmless, &out));
        let harmless_cfg = String::from_utf8_lossy(&harmless.files["haproxy.cfg"]).into_owned();
        for v in hostile() {
            let marked = format!("{MARK}{v}{MARK}");
            let mut objects = route_objects();
            set_route(&mut objects, field, &marked);
            let what = format!("{field:?} = {:?}", v.chars().take(40).collect::<String>());
            let (render, out) = haptic_render::render_gateway(&route_input(objects, 20000), &Default::default())
                .unwrap_or_else(|e| panic!("{what}: the render failed as a whole: {e}"));
            if route_refused(&render, &out).is_some() {
                // Refused in its own status: the value is nowhere.
                assert!(!contains_any_case(&render, &marked), "{what}: refused, yet in the render");
                refused += 1;
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
            assert_eq!(
                route_structure(&cfg, &marked, &harmless_value),
                route_structure(&harmless_cfg, &harmless_value, &harmless_value),
                "{what}: the structure changed\n{cfg}"
            );
        }
    }
    // Some values are fine where they land (a quote in a header value), most are not.
    assert!(accepted > 0 && refused > 0, "{accepted} accepted, {refused} refused");
}

/// The fields of a GRPCRoute the corpus is fed into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrpcField {
    Hostname,
    Service,
    Method,
    HeaderName,
    HeaderValue,
    BackendName,
}

/// One Gateway and the GRPCRoute `target`: a service and method with a header match, and a
/// service alone.
const GRPC_YAML: &str = r#"
gateways:
  - metadata: {name: gw, namespace: web}
    spec:
      gatewayClassName: haptic
      listeners: [{name: http, port: 80, protocol: HTTP}]
grpcRoutes:
  - metadata: {name: target, namespace: web, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      hostnames: [g.example.com]
      rules:
        - matches: [{method: {service: pkg.Svc, method: Call}, headers: [{name: X-M, value: m}]}]
          backendRefs: [{name: web, port: 80}]
        - matches: [{method: {service: pkg.Other}}]
          backendRefs: [{name: web, port: 80}]
services:
  - metadata: {name: web, namespace: web}
    spec: {ports: [{name: http, port: 80}]}
endpointSlices:
  - metadata: {name: web-1, namespace: web, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{name: http, port: 1}]
    endpoints: [{addresses: [127.0.0.1]}]
"#;

/// Puts `value` into `field` of the GRPCRoute `target` (a backend name with its Service).
fn set_grpc(objects: &mut GatewayObjects, field: GrpcField, value: &str) {
    let spec = &mut objects.grpc_routes[0].spec;
    let m0 = &mut spec.rules[0].matches[0];
    match field {
        GrpcField::Hostname => spec.hostnames = vec![value.into()],
        GrpcField::Service => m0.method.as_mut().unwrap().service = Some(value.into()),
        GrpcField::Method => m0.method.as_mut().unwrap().method = Some(value.into()),
        GrpcField::HeaderName => m0.headers[0].name = value.into(),
        GrpcField::HeaderValue => m0.headers[0].value = value.into(),
        GrpcField::BackendName => {
            spec.rules[0].backend_refs[0].name = value.into();
            add_service_like_the_first(objects, value);
        }
    }
}

/// Whether the GRPCRoute's own status refuses something.
fn grpc_refused(render: &haptic_render::Render, out: &GatewayOutput) -> bool {
    let v = render.verdicts.iter().find(|v| v.object.kind == "GRPCRoute" && v.object.name == "target").unwrap();
    let route = out.routes.iter().find(|r| r.object.kind == "GRPCRoute").unwrap();
    !v.refusals.is_empty() || route.parents.iter().flat_map(|p| &p.conditions).any(|c| !c.status)
}

// The corpus through a GRPCRoute: each value is refused in the route's own status and nowhere
// in the render, or accepted with `haproxy -c` passing and the structure unchanged.
haptic_e2e::on_each_version!(sync grpc_route_hostile_values_are_refused_or_stay_values);
fn grpc_route_hostile_values_are_refused_or_stay_values(bin: HaproxyBin) {
    use GrpcField::*;
    let harmless_value = format!("{MARK}x{MARK}");
    let (mut accepted, mut refused) = (0, 0);
    for field in [Hostname, Service, Method, HeaderName, HeaderValue, BackendName] {
        let input = |value: &str| {
            let mut objects: GatewayObjects = serde_saphyr::from_str(GRPC_YAML).unwrap();
            set_grpc(&mut objects, field, value);
            route_input(objects, 20000)
        };
        let (harmless, out) = haptic_render::render_gateway(&input(&harmless_value), &Default::default()).unwrap();
        assert!(!grpc_refused(&harmless, &out), "{field:?}: the harmless value is refused");
        let harmless_cfg = String::from_utf8_lossy(&harmless.files["haproxy.cfg"]).into_owned();
        for v in hostile() {
            let marked = format!("{MARK}{v}{MARK}");
            let what = format!("{field:?} = {:?}", v.chars().take(40).collect::<String>());
            let (render, out) = haptic_render::render_gateway(&input(&marked), &Default::default())
                .unwrap_or_else(|e| panic!("{what}: the render failed as a whole: {e}"));
            if grpc_refused(&render, &out) {
                assert!(!contains_any_case(&render, &marked), "{what}: refused, yet in the render");
                refused += 1;
                continue;
            }
            accepted += 1;
            haproxy_c(&bin, &render).unwrap_or_else(|e| panic!("{what}: accepted, but haproxy -c refuses it: {e}"));
            let cfg = String::from_utf8_lossy(&render.files["haproxy.cfg"]);
            assert_eq!(
                route_structure(&cfg, &marked, &harmless_value),
                route_structure(&harmless_cfg, &harmless_value, &harmless_value),
                "{what}: the structure changed\n{cfg}"
            );
        }
    }
    assert!(accepted > 0 && refused > 0, "{accepted} accepted, {refused} refused");
}

/// Values a request can carry in a header: no CR, LF or NUL (refused by the translator anyway),
/// and short enough for HAProxy's buffer (`tune.bufsize`, 16 kB).
fn sendable(v: &str) -> bool {
    !v.contains(['\r', '\n', '\0']) && v.len() < 4096
}

haptic_e2e::on_each_version!(route_header_values_arrive_literally);
async fn route_header_values_arrive_literally(bin: HaproxyBin) {
    let echo = common::echo_backend("web");
    let bind = free_port();
    let mut objects = route_objects();
    objects.endpoint_slices[0].ports.as_mut().unwrap()[0].port = Some(echo.into());
    // One route per hostile value, on its own host: every header value of the route is the
    // value (the header match, request set and add, the backend's set, response set and add),
    // and rule 3's redirect goes to the value as a path.
    let template = objects.routes[0].clone();
    objects.routes.clear();
    let values = hostile();
    for (i, v) in values.iter().enumerate() {
        let marked = format!("{MARK}{v}{MARK}");
        let mut one = GatewayObjects { routes: vec![template.clone()], ..Default::default() };
        for f in [
            RouteField::HeaderMatchValue,
            RouteField::RequestSetValue,
            RouteField::RequestAddValue,
            RouteField::BackendFilterValue,
            RouteField::ResponseSetValue,
            RouteField::ResponseAddValue,
            RouteField::RedirectFullPath,
        ] {
            set_route(&mut one, f, &marked);
        }
        let mut r = one.routes.remove(0);
        r.metadata.name = Some(format!("r{i}"));
        r.spec.hostnames = vec![format!("r{i}.example.com")];
        objects.routes.push(r);
    }
    let (render, out) = haptic_render::render_gateway(&route_input(objects, bind), &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], bind));
    let mut checked = 0;
    for (i, v) in values.iter().enumerate() {
        let marked = format!("{MARK}{v}{MARK}");
        let route = out.routes.iter().find(|r| r.object.name == format!("r{i}")).unwrap();
        let verdict = out.verdicts.iter().find(|x| x.object.name == format!("r{i}")).unwrap();
        let accepted =
            verdict.refusals.is_empty() && route.parents.iter().flat_map(|p| &p.conditions).all(|c| c.status);
        if !accepted {
            assert!(!sendable(v) || v == "}" || v.len() > 1000, "{v:?}: refused, yet a request could carry it");
            continue;
        }
        if !sendable(v) {
            continue;
        }
        let host = format!("r{i}.example.com");
        let mut req = format!("GET /p?q=v HTTP/1.1\r\nHost: {host}\r\nX-M: ").into_bytes();
        req.extend_from_slice(marked.as_bytes());
        req.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        let r = raw_bytes(addr, &req).await;
        let (head, body) = r.split_once("\r\n\r\n").unwrap_or((&r, ""));
        assert!(head.starts_with("HTTP/1.1 200"), "{host}: the header match did not take {v:?}: {r}");
        let mut lines = body.lines();
        assert_eq!(lines.next(), Some("web"), "{host}: {r}");
        let sent: Vec<&str> = lines.collect();
        for name in ["x-set", "x-add", "x-b"] {
            let want = format!("{name}: {marked}");
            assert!(sent.contains(&want.as_str()), "{host}: no {want:?} at the backend: {sent:?}");
        }
        let got: Vec<String> = head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(": "))
            .map(|(k, val)| format!("{}: {val}", k.to_ascii_lowercase()))
            .collect();
        for name in ["x-rset", "x-radd"] {
            let want = format!("{name}: {marked}");
            assert!(got.contains(&want), "{host}: no {want:?} in the response: {head}");
        }
        // The redirect's path arrives in Location as it is.
        let r =
            raw_bytes(addr, format!("GET /f HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes()).await;
        let head = r.split("\r\n\r\n").next().unwrap_or_default();
        let location = head
            .lines()
            .find_map(|l| l.strip_prefix("location: ").or_else(|| l.strip_prefix("Location: ")))
            .unwrap_or_else(|| panic!("{host}: no Location in {r:?}"));
        assert_eq!(location, format!("http://{host}/{marked}"), "{host}");
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} values were checked");
}

/// Sends `req` and returns the whole response as text.
async fn raw_bytes(addr: SocketAddr, req: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(req).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}
