//! Real HAProxy on 127.0.0.1 serving a render of Ingresses with ingress-nginx annotations: each
//! annotation's behaviour seen in real responses (source ranges 403, body size 413, `app-root`
//! and redirects with their codes and a location arriving literally, an allowed snippet's header).

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::annotations::Allowed;
use haptic_render::ingress::Settings;

mod common;

fn header<'a>(resp: &'a str, name: &str) -> Option<&'a str> {
    let head = resp.split("\r\n\r\n").next().unwrap_or_default();
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

haptic_e2e::on_each_version!(each_annotation_behaves);
async fn each_annotation_behaves(bin: HaproxyBin) {
    let (web, api, snip) = (common::backend("web"), common::backend("api"), common::backend("snip"));
    let http_port = free_port();
    let mut input = common::input(
        include_str!("fixtures/annotations.yaml"),
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    input.allowed = Allowed { snippets: true };
    // The test's client is 127.0.0.1: `guarded` lets it in, `open` denies it.
    for ing in &mut input.ingresses {
        let ing = std::sync::Arc::make_mut(ing);
        let a = ing.metadata.annotations.get_or_insert_with(Default::default);
        if let Some(v) = a.get_mut("nginx.ingress.kubernetes.io/whitelist-source-range") {
            *v = "10.0.0.0/8, 127.0.0.0/8".into();
        }
        if let Some(v) = a.get_mut("nginx.ingress.kubernetes.io/denylist-source-range") {
            *v = "127.0.0.1".into();
        }
    }
    common::endpoints_on_loopback(&mut input, |svc| match svc {
        "web" => web,
        "api" => api,
        _ => snip,
    });
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |host: &str, path: &str| format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");

    // guarded: the source range lets 127.0.0.1 in; `/` goes to app-root; a body over 1k is 413.
    let r = common::raw(addr, &get("guarded.example.com", "/")).await;
    assert_eq!((common::status(&r), header(&r, "location")), (302, Some("/app")), "{r}");
    assert!(common::raw(addr, &get("guarded.example.com", "/app")).await.ends_with("web"));
    let body = "x".repeat(2000);
    let post = |len: usize| {
        format!(
            "POST /app HTTP/1.1\r\nHost: guarded.example.com\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{}",
            &body[..len]
        )
    };
    assert_eq!(common::status(&common::raw(addr, &post(2000)).await), 413);
    assert!(common::raw(addr, &post(100)).await.ends_with("web"));
    // open: 127.0.0.1 is denied.
    assert_eq!(common::status(&common::raw(addr, &get("open.example.com", "/")).await), 403);
    // moved-ok: 308 to a location with a sample-fetch lookalike, arriving literally.
    let r = common::raw(addr, &get("older.example.com", "/x")).await;
    assert_eq!(common::status(&r), 308, "{r}");
    assert_eq!(header(&r, "location"), Some("https://new.example.com/?q=%[env(HOME)]"), "{r}");
    // moved was refused (a blank in its target): its host is not routed (404).
    assert_eq!(common::status(&common::raw(addr, &get("old.example.com", "/")).await), 404);
    // secure: plain HTTP is redirected to HTTPS, the path kept.
    let r = common::raw(addr, &get("secure.example.com", "/p?q=1")).await;
    assert_eq!((common::status(&r), header(&r, "location")), (308, Some("https://secure.example.com/p?q=1")), "{r}");
    // The allowed snippet's header, from its own backend only.
    let r = common::raw(addr, &get("snippet.example.com", "/")).await;
    assert_eq!((header(&r, "x-snippet"), r.ends_with("snip")), (Some("yes"), true), "{r}");
    assert_eq!(header(&common::raw(addr, &get("guarded.example.com", "/app")).await, "x-snippet"), None);
}
