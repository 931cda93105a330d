//! Snippets by allow-list, end to end. A property: whatever snippet the check accepts, the
//! rendered config keeps its sections and every line outside the snippet (and every map) as the
//! render without it has them. Real HAProxy 2.6, 3.0, 3.2 and 3.4: an allowed snippet renders, passes
//! `haproxy -c` and its header is seen on a real request; each attack seen against the old
//! deny-list refuses its own Ingress and never reaches the rendered config.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_haproxy::cfg;
use haptic_render::annotations::Allowed;
use haptic_render::ingress::{IngressInput, Settings};
use proptest::prelude::*;

mod common;

const SNIPPET_KEY: &str = "nginx.ingress.kubernetes.io/configuration-snippet";

/// One Ingress per `(name, host)`, each to its own Service, in namespace `shop`.
fn yaml(hosts: &[(&str, &str)]) -> String {
    let mut ing = String::from("ingresses:\n");
    let mut svc = String::from("services:\n");
    let mut eps = String::from("endpointSlices:\n");
    for (name, host) in hosts {
        ing.push_str(&format!(
            "  - metadata: {{name: {name}, namespace: shop}}\n    spec:\n      ingressClassName: haptic\n      rules:\n        - host: {host}\n          http:\n            paths:\n              - {{path: /, pathType: Prefix, backend: {{service: {{name: {name}, port: {{number: 80}}}}}}}}\n"
        ));
        svc.push_str(&format!(
            "  - metadata: {{name: {name}, namespace: shop}}\n    spec: {{ports: [{{port: 80, targetPort: 8080}}]}}\n"
        ));
        eps.push_str(&format!(
            "  - metadata: {{name: {name}-1, namespace: shop, labels: {{kubernetes.io/service-name: {name}}}}}\n    addressType: IPv4\n    ports: [{{port: 8080}}]\n    endpoints:\n      - {{addresses: [127.0.0.1]}}\n"
        ));
    }
    format!("{ing}{svc}{eps}")
}

fn input_with(hosts: &[(&str, &str)], http_port: u16) -> IngressInput {
    let mut input = common::input(
        &yaml(hosts),
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    input.allowed = Allowed { snippets: true };
    input
}

fn set_snippet(input: &mut IngressInput, name: &str, snippet: &str) {
    let ing = std::sync::Arc::make_mut(
        input.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some(name)).unwrap(),
    );
    ing.metadata.annotations.get_or_insert_with(Default::default).insert(SNIPPET_KEY.into(), snippet.into());
}

/// Lines of snippet text: allowed lines, and fragments with hostile bytes, quotes, escapes,
/// section keywords and preprocessor words.
fn snippet() -> impl Strategy<Value = String> {
    let line = prop::sample::select(vec![
        "http-request set-header X-A b",
        "http-response set-header X-B 'c d'",
        "timeout server 5s",
        "acl a src 10.0.0.0/8",
        "http-request deny if { path_beg /admin }",
        "  http-request set-var(txn.x) str(y)",
        "option forwardfor",
    ]);
    let frag = prop::sample::select(vec![
        "",
        " ",
        "\t",
        "\u{b}",
        "\u{c}",
        "\r",
        "\0",
        "'",
        "\"",
        "\\",
        "\\x2f",
        "\\n",
        "\\ ",
        "#",
        "$",
        "${X}",
        " global",
        " 'backend' b",
        "\nbackend b",
        "\nprogram p",
        "\n.if defined(X)",
        "\n.endif",
        " lua-load",
        " -f",
        " /etc/passwd",
        " set-map(x)",
        " %[env(X)]",
        " 'x\ny'",
        " \"a # b\"",
        " '#'",
        "\nfrontend f",
        "\u{a0}",
        "\nlisten l",
        "\n\u{b}global",
        " \\'global\\'",
    ]);
    prop::collection::vec((line, frag), 1..5)
        .prop_map(|v| v.into_iter().map(|(l, f)| format!("{l}{f}")).collect::<Vec<_>>().join("\n"))
}

/// The tokens of the lines a snippet adds to its backend, as `cfg::parse` reads them.
fn snippet_lines(text: &str) -> Vec<Vec<String>> {
    text.split('\n').map(|l| cfg::tokenize(l.trim_matches([' ', '\t']))).filter(|t| !t.is_empty()).collect()
}

proptest! {
    // About one generated snippet in eight passes the check: room for the rejects of 128 cases
    // (the default 1,024 ran out in some runs).
    #![proptest_config(ProptestConfig { cases: 128, max_global_rejects: 8192, ..ProptestConfig::default() })]

    /// For any snippet the check accepts: the same sections in the same order with the same
    /// headers, the same lines in every section but the Ingress's backend, and there exactly
    /// the snippet's lines added in one block; every map unchanged.
    #[test]
    fn an_accepted_snippet_changes_only_its_own_lines(text in snippet()) {
        prop_assume!(haptic_haproxy::snippet::check(&text, haptic_haproxy::snippet::Section::Backend).is_ok());
        let hosts = [("good", "good.example.com"), ("other", "other.example.com")];
        let base = haptic_render::render(&input_with(&hosts, 8080), &Default::default()).unwrap();
        let mut input = input_with(&hosts, 8080);
        set_snippet(&mut input, "good", &text);
        let with = haptic_render::render(&input, &Default::default()).unwrap();
        prop_assert!(with.verdicts.iter().all(|v| v.accepted()), "{:?}", with.verdicts);
        for (path, bytes) in &base.files {
            if path != "haproxy.cfg" {
                prop_assert_eq!(Some(bytes), with.files.get(path), "{}", path);
            }
        }
        let text_of = |r: &haptic_render::Render| String::from_utf8(r.files["haproxy.cfg"].clone()).unwrap();
        let (b, w) = (cfg::parse(&text_of(&base)), cfg::parse(&text_of(&with)));
        prop_assert_eq!(&b.preamble, &w.preamble);
        prop_assert_eq!(b.sections.len(), w.sections.len(), "{}", text_of(&with));
        let added = snippet_lines(&text);
        let mut changed = 0;
        for (bs, ws) in b.sections.iter().zip(&w.sections) {
            prop_assert_eq!(&bs.header, &ws.header);
            if bs.lines == ws.lines {
                continue;
            }
            changed += 1;
            prop_assert!(bs.kind == "backend" && bs.name.as_deref().is_some_and(|n| n.contains("good")), "{}", bs.header);
            let at = bs.lines.iter().zip(&ws.lines).take_while(|(x, y)| x == y).count();
            prop_assert_eq!(&ws.lines[at..at + added.len()], &added[..]);
            prop_assert_eq!(&ws.lines[at + added.len()..], &bs.lines[at..]);
        }
        prop_assert!(changed <= 1);
    }
}

/// The attacks seen against the old deny-list, one Ingress each, and what each would put in
/// the config.
fn attacks(admin_port: u16) -> Vec<(String, &'static str)> {
    vec![
        (format!("\u{b}global\n    stats socket ipv4@127.0.0.1:{admin_port} level admin"), "stats socket"),
        (format!("\u{c}global\n    stats socket ipv4@127.0.0.1:{admin_port} level admin"), "stats socket"),
        (format!("\rglobal\n    stats socket ipv4@127.0.0.1:{admin_port} level admin"), "stats socket"),
        ("master-worker\nprogram x\n    command /bin/sh -c id".into(), "program"),
        ("http-request set-map(maps/hosts.map) good.example.com h9".into(), "set-map"),
        (".if defined(HAPROXY_MWORKER_REEXEC)\nhttp-request deny\n.endif".into(), ".if"),
        ("setenv X 1".into(), "setenv"),
        ("lua-load certs/shop_tls.pem".into(), "lua-load"),
        ("acl leak path -f /etc/passwd".into(), "/etc/passwd"),
        ("acl leak path -f '/'etc/passwd".into(), "etc/passwd"),
        ("acl leak path -f \\x2fetc/passwd".into(), "etc/passwd"),
        ("http-request return status 200 'file' /etc/hostname".into(), "/etc/hostname"),
    ]
}

haptic_e2e::on_each_version!(an_allowed_snippet_serves_and_attacks_never_reach_the_config);
async fn an_allowed_snippet_serves_and_attacks_never_reach_the_config(bin: HaproxyBin) {
    let http_port = free_port();
    let admin_port = free_port();
    let attacks = attacks(admin_port);
    let names: Vec<String> = (0..attacks.len()).map(|i| format!("evil{i}")).collect();
    let hosts_owned: Vec<(String, String)> = names.iter().map(|n| (n.clone(), format!("{n}.example.com"))).collect();
    let mut hosts: Vec<(&str, &str)> = vec![("good", "good.example.com")];
    hosts.extend(hosts_owned.iter().map(|(n, h)| (n.as_str(), h.as_str())));
    let mut input = input_with(&hosts, http_port);
    set_snippet(&mut input, "good", "http-response set-header X-Snippet yes");
    for (name, (text, _)) in names.iter().zip(&attacks) {
        set_snippet(&mut input, name, text);
    }
    let web = common::backend("web");
    common::endpoints_on_loopback(&mut input, |_| web);
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let cfg_text = String::from_utf8(render.files["haproxy.cfg"].clone()).unwrap();
    for (name, (text, mark)) in names.iter().zip(&attacks) {
        let v = render.verdicts.iter().find(|v| v.object.name == *name).unwrap();
        assert!(!v.accepted(), "{text:?} must refuse its Ingress: {v:?}");
        assert!(v.refusals.iter().any(|r| r.field.contains("configuration-snippet")), "{v:?}");
        assert!(!cfg_text.contains(mark), "{text:?} reached the config:\n{cfg_text}");
    }
    assert!(render.verdicts.iter().find(|v| v.object.name == "good").unwrap().accepted());
    assert!(cfg_text.contains("    http-response set-header X-Snippet yes\n"), "{cfg_text}");

    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let c =
        std::process::Command::new(&bin.path).arg("-c").arg("-f").arg(dir.path().join("haproxy.cfg")).output().unwrap();
    assert!(c.status.success(), "{}{}", String::from_utf8_lossy(&c.stdout), String::from_utf8_lossy(&c.stderr));
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let r = common::raw(addr, &get("good.example.com")).await;
    assert!(r.to_ascii_lowercase().contains("\r\nx-snippet: yes\r\n") && r.ends_with("web"), "{r}");
    for name in &names {
        let r = common::raw(addr, &get(&format!("{name}.example.com"))).await;
        assert_eq!(common::status(&r), 404, "{name}: {r}");
    }
    // No admin socket was opened.
    assert!(std::net::TcpStream::connect(("127.0.0.1", admin_port)).is_err());
}
