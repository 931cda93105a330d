//! The tenant attack corpus: a victim namespace's Ingresses beside an attacker namespace's, every
//! attack of the tenant model and families of variants of each (every whitespace byte and quoting
//! form before a section keyword, every section keyword and preprocessor directive, every
//! file-reading word, host ids of every width under a regex built to cross them, a wildcard over
//! the victim's host, the victim's host and paths claimed again from another namespace, a canary
//! and `ssl-passthrough` on them, a key that does not match its certificate, a regex that
//! backtracks without bound), each next to its benign twin. All of it is rendered into one config,
//! which must pass real `haproxy -c`, and served by real HAProxy: every victim host and path
//! (and every other spelling of them) is answered by the victim's backend, every attack meant to
//! take traffic or run something is refused in its own verdict and its text is nowhere in the
//! render, and every benign twin and accepted attacker object serves the attacker's own names.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::annotations::{Allowed, NGINX_PREFIX};
use haptic_render::ingress::{IngressInput, Settings};
use k8s_openapi::api::networking::v1::Ingress;
use serde_json::json;

use super::common;

const VICTIM: &str = "victim";
const ATTACKER: &str = "attacker";
/// The victim's hosts: enough that host ids of one and two digits both exist.
const VICTIM_HOSTS: usize = 12;

/// What an attacker object must come to.
#[derive(Debug, Clone)]
enum Expect {
    /// Refused in its own verdict.
    Refused,
    /// Accepted: `host` + `path` is answered by the attacker.
    Serves(String, String),
}

/// One attacker Ingress and what it must come to.
struct Case {
    name: String,
    ingress: Ingress,
    expect: Expect,
}

fn victim_host(i: usize) -> String {
    if i == 0 {
        "victim.example".into()
    } else {
        format!("v{i}.victim.example")
    }
}

/// An Ingress `ns/name` created at `created`, routing `host` `paths` (path, pathType) to the
/// Service `web` of `ns`, with ingress-nginx `annotations`.
fn ingress(
    ns: &str,
    name: &str,
    created: &str,
    host: &str,
    paths: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Ingress {
    let a: serde_json::Map<String, serde_json::Value> =
        annotations.iter().map(|(k, v)| (format!("{NGINX_PREFIX}{k}"), json!(v))).collect();
    let paths: Vec<_> = paths
        .iter()
        .map(
            |(p, t)| json!({"path": p, "pathType": t, "backend": {"service": {"name": "web", "port": {"number": 80}}}}),
        )
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": created, "annotations": a},
        "spec": {"ingressClassName": "haptic", "rules": [{"host": host, "http": {"paths": paths}}]}
    }))
    .unwrap()
}

/// Snippet attacks: each a `configuration-snippet` on a host of the attacker's own.
fn snippet_attacks() -> Vec<String> {
    let mut v = Vec::new();
    // Every whitespace byte HAProxy splits words on, before a section keyword.
    for ws in ["\u{b}", "\u{c}", "\r", "\t", " ", "\u{b}\u{c}"] {
        v.push(format!("{ws}global\n{ws}stats socket ipv4@0.0.0.0:9999 level admin"));
        v.push(format!("http-response set-header X-A 1\n{ws}master-worker\n{ws}program p\n{ws}command /bin/sh -c id"));
    }
    // Quoting forms of a section keyword.
    for w in ["'global'", "\"global\"", "gl'o'bal", "\\x67lobal", "glob\\al", "GLOBAL"] {
        v.push(format!("{w}\n    stats socket ipv4@0.0.0.0:9999 level admin"));
    }
    // Every section keyword.
    for kw in [
        "global",
        "defaults",
        "frontend",
        "backend",
        "listen",
        "program",
        "userlist",
        "peers",
        "resolvers",
        "mailers",
        "cache",
        "ring",
        "http-errors",
        "fcgi-app",
        "crt-store",
        "traces",
        "log-forward",
    ] {
        v.push(format!("{kw} x"));
    }
    // Every preprocessor directive (and the one every `haproxy -c` skips).
    for d in [
        ".if defined(HAPROXY_MWORKER_REEXEC)",
        ".elif 1",
        ".else",
        ".endif",
        ".diag x",
        ".notice x",
        ".warning x",
        ".alert x",
    ] {
        v.push(format!("{d}\nhttp-request return status 200 file certs/victim_tls.pem\n.endif"));
    }
    // File references, quoted and escaped every way, and the environment.
    for path in ["/etc/passwd", "'/'etc/passwd", "\\x2fetc/passwd", "/dev/zero", "certs/victim_tls.pem"] {
        v.push(format!("http-request deny if {{ path -f {path} }}"));
        v.push(format!("acl a path -f {path}"));
        v.push(format!("http-request return status 200 file {path}"));
        v.push(format!("http-request return status 200 'file' {path}"));
        v.push(format!("http-request return status 200 lf-file {path}"));
        v.push(format!("errorfile 503 {path}"));
        v.push(format!("http-request set-header X %[str(a),map({path})]"));
    }
    v.extend(
        [
            "setenv X 1",
            "lua-load certs/attacker_lua.pem",
            "http-request lua.f",
            "http-request set-header X %[env(HOME)]",
            "http-request set-header X \"${HOME}\"",
            "http-request set-map(maps/hosts.map) victim.example h1",
            "http-request add-acl(x) y",
            "http-request del-map(maps/hosts.map) victim.example",
            "http-request set-var(proc.x) int(1)",
            "http-request use-service prometheus-exporter",
            "filter spoe engine e config /etc/passwd",
            "option external-check\nexternal-check command /bin/sh",
            "http-request deny\\\nglobal",
        ]
        .map(String::from),
    );
    v
}

/// (name, host, paths as (path, pathType), annotations) of an Ingress claiming a victim's name.
type Claim =
    (&'static str, &'static str, &'static [(&'static str, &'static str)], &'static [(&'static str, &'static str)]);

/// Every attacker case, with its expectation.
fn cases() -> Vec<Case> {
    let t = "2026-02-01T00:00:00Z";
    let mut out = Vec::new();
    let mut case = |name: String, ing: Ingress, expect: Expect| out.push(Case { name, ingress: ing, expect });
    for (i, s) in snippet_attacks().iter().enumerate() {
        let host = format!("s{i}.attacker.example");
        case(
            format!("snippet-{i}"),
            ingress(ATTACKER, &format!("snippet-{i}"), t, &host, &[("/", "Prefix")], &[("configuration-snippet", s)]),
            Expect::Refused,
        );
    }
    // Benign twin: a snippet of the allow-list serves.
    let mut twin = ingress(
        ATTACKER,
        "snippet-ok",
        t,
        "ok.attacker.example",
        &[("/", "Prefix")],
        &[("configuration-snippet", "http-response set-header X-Snippet yes")],
    );
    // A snippet sets up its backend: this one has a Service of its own.
    let path = &mut twin.spec.as_mut().unwrap().rules.as_mut().unwrap()[0].http.as_mut().unwrap().paths[0];
    path.backend.service.as_mut().unwrap().name = "snip".into();
    case("snippet-ok".into(), twin, Expect::Serves("ok.attacker.example".into(), "/".into()));
    // The victim's host and paths claimed again, deeper, in another case, joined and passed through.
    let claims: &[Claim] = &[
        ("same-path", "victim.example", &[("/", "Prefix")], &[]),
        ("deeper-path", "victim.example", &[("/admin/x", "Prefix")], &[]),
        ("exact-path", "victim.example", &[("/admin", "Exact")], &[]),
        ("other-case", "VICTIM.example", &[("/account", "Prefix")], &[]),
        ("other-host", "v11.victim.example", &[("/new", "Prefix")], &[]),
        ("canary", "victim.example", &[("/", "Prefix")], &[("canary", "true"), ("canary-weight", "100")]),
        ("canary-header", "victim.example", &[("/admin", "Prefix")], &[("canary", "true"), ("canary-by-header", "x")]),
        ("passthrough", "victim.example", &[("/", "Prefix")], &[("ssl-passthrough", "true")]),
        ("redos", "redos.attacker.example", &[("/a*a*a*a*[0-9]", "ImplementationSpecific")], &[("use-regex", "true")]),
    ];
    for (name, host, paths, ann) in claims {
        case(name.to_string(), ingress(ATTACKER, name, t, host, paths, ann), Expect::Refused);
    }
    // A TLS Secret whose key is not its certificate's.
    let mut tls = ingress(ATTACKER, "bad-pair", t, "tls.attacker.example", &[("/", "Prefix")], &[]);
    tls.spec.as_mut().unwrap().tls = Some(vec![k8s_openapi::api::networking::v1::IngressTLS {
        hosts: Some(vec!["tls.attacker.example".into()]),
        secret_name: Some("bad-pair".into()),
    }]);
    case("bad-pair".into(), tls, Expect::Refused);
    // Benign twin: the attacker's own host.
    let own = ingress(ATTACKER, "own", t, "own.attacker.example", &[("/", "Prefix")], &[]);
    case("own".into(), own, Expect::Serves("own.attacker.example".into(), "/x".into()));
    // A wildcard over the victim's names: it serves the names nobody owns, never the victim's.
    let wild = ingress(ATTACKER, "wildcard", t, "*.victim.example", &[("/", "Prefix")], &[]);
    case("wildcard".into(), wild, Expect::Serves("nobody.victim.example".into(), "/".into()));
    // A regex path built to cross host ids, on hosts whose ids have every width the victim's have.
    for i in 0..VICTIM_HOSTS {
        let (name, host) = (format!("regex-{i}"), format!("r{i}.attacker.example"));
        let ing = ingress(
            ATTACKER,
            &name,
            t,
            &host,
            &[("/?[0-9]*/account", "ImplementationSpecific")],
            &[("use-regex", "true")],
        );
        case(name, ing, Expect::Serves(host, "/account".into()));
    }
    out
}

/// The victim's Ingress: its hosts, each with `/`, `/admin` and `/account`.
fn victim() -> Vec<Ingress> {
    (0..VICTIM_HOSTS)
        .map(|i| {
            let name = format!("site-{i}");
            ingress(
                VICTIM,
                &name,
                "2026-01-01T00:00:00Z",
                &victim_host(i),
                &[("/admin", "Prefix"), ("/account", "Prefix"), ("/", "Prefix")],
                &[],
            )
        })
        .collect()
}

const SERVICES: &str = r#"
services:
  - metadata: {name: web, namespace: victim}
    spec: {ports: [{port: 80}]}
  - metadata: {name: web, namespace: attacker}
    spec: {ports: [{port: 80}]}
  - metadata: {name: snip, namespace: attacker}
    spec: {ports: [{port: 80}]}
endpointSlices:
  - metadata: {name: web-1, namespace: victim, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{port: 80}]
    endpoints: [{addresses: [10.0.0.1]}]
  - metadata: {name: web-1, namespace: attacker, labels: {kubernetes.io/service-name: web}}
    addressType: IPv4
    ports: [{port: 80}]
    endpoints: [{addresses: [10.0.0.2]}]
  - metadata: {name: snip-1, namespace: attacker, labels: {kubernetes.io/service-name: snip}}
    addressType: IPv4
    ports: [{port: 80}]
    endpoints: [{addresses: [10.0.0.3]}]
"#;

fn input(http_port: u16, cases: &[Case], ports: (u16, u16)) -> IngressInput {
    let settings = Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 1, ..Settings::default() };
    let mut input = common::input(SERVICES, settings);
    input.allowed = Allowed { snippets: true };
    input.secrets.push(std::sync::Arc::new(mismatched_pair()));
    input.ingresses = victim().into_iter().map(std::sync::Arc::new).collect();
    input.ingresses.extend(cases.iter().map(|c| std::sync::Arc::new(c.ingress.clone())));
    for s in &mut input.endpoint_slices {
        let s = std::sync::Arc::make_mut(s);
        let port = if s.metadata.namespace.as_deref() == Some(VICTIM) { ports.0 } else { ports.1 };
        for p in s.ports.iter_mut().flatten() {
            p.port = Some(port.into());
        }
        for e in &mut s.endpoints {
            e.addresses = vec!["127.0.0.1".into()];
        }
    }
    input
}

/// The Secret `attacker/bad-pair`: one certificate with another's key.
fn mismatched_pair() -> k8s_openapi::api::core::v1::Secret {
    let dir = tempfile::tempdir().unwrap();
    let mut a = common::tls_secret(dir.path(), ATTACKER, "bad-pair");
    let b = common::tls_secret(dir.path(), ATTACKER, "other");
    let key = b.data.as_ref().unwrap()["tls.key"].clone();
    a.data.as_mut().unwrap().insert("tls.key".into(), key);
    a
}

/// Who answered: the first body line of a 200, or the status.
async fn who(addr: SocketAddr, host: &str, path: &str) -> String {
    let r = common::raw(addr, &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")).await;
    match common::status(&r) {
        200 => {
            r.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default().lines().next().unwrap_or_default().to_string()
        }
        code => format!("status {code}"),
    }
}

haptic_e2e::on_each_version!(no_attack_reaches_the_victim_and_every_twin_serves);
async fn no_attack_reaches_the_victim_and_every_twin_serves(bin: HaproxyBin) {
    let cases = cases();
    let ports = (common::echo_backend("victim"), common::echo_backend("attacker"));
    let http_port = free_port();
    let render = haptic_render::render(&input(http_port, &cases, ports), &Default::default()).unwrap();
    // Each verdict as expected; a refused object's text is nowhere in the render.
    let cfg = String::from_utf8_lossy(&render.files["haproxy.cfg"]).into_owned();
    for c in &cases {
        let v = render.verdicts.iter().find(|v| v.object.namespace == ATTACKER && v.object.name == c.name).unwrap();
        match &c.expect {
            Expect::Refused => {
                assert!(!v.accepted(), "{}: accepted: {:?}", c.name, c.ingress.metadata.annotations);
            }
            Expect::Serves(..) => assert!(v.accepted(), "{}: {v:?}", c.name),
        }
    }
    for v in render.verdicts.iter().filter(|v| v.object.namespace == VICTIM) {
        assert!(v.accepted(), "the victim's {v:?}");
    }
    for secret in
        ["stats socket", "master-worker", "program ", "set-map", "lua-load", "setenv", "/etc/passwd", "/dev/zero"]
    {
        assert!(!cfg.contains(secret), "{secret:?} reached the render:\n{cfg}");
    }
    // The gate: real haproxy -c over the whole render.
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let out =
        std::process::Command::new(&bin.path).arg("-c").arg("-f").arg(dir.path().join("haproxy.cfg")).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    for i in 0..VICTIM_HOSTS {
        let host = victim_host(i);
        for path in [
            "/",
            "/admin/x",
            "/admin",
            "/account",
            "/1/account",
            "/11/admin",
            "//admin",
            "/%61dmin/x",
            "/./account",
            "/new",
        ] {
            assert_eq!(who(addr, &host, path).await, VICTIM, "{host}{path}");
        }
        assert_eq!(who(addr, &host.to_uppercase(), "/account").await, VICTIM, "{host} upper case");
    }
    for c in &cases {
        if let Expect::Serves(host, path) = &c.expect {
            assert_eq!(who(addr, host, path).await, ATTACKER, "{}: {host}{path}", c.name);
        }
    }
}
