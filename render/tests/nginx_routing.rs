//! Real HAProxy on 127.0.0.1 serving the ingress-nginx annotations that change where and how a
//! request goes, seen from a real backend that echoes what it receives: a regex path with
//! `rewrite-target` capture groups (case-insensitive, query kept), a regex path whose `\.` means
//! a dot, `upstream-vhost`, `server-alias` hosts, and cookie affinity (the inserted cookie keeps
//! a client on one of two servers); canaries by weight (a share of 1,000 requests), header and
//! cookie.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::Settings;

mod common;

/// A backend answering every request with a body naming itself, then the request head it got.
fn echo(name: &'static str) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // Bounded: a request head is read until its blank line or 64 KiB.
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 65_536 {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let body = format!("{name}\n{}", String::from_utf8_lossy(&buf));
            let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    port
}

/// The body's lines: the backend's name, then the request line it got, then its headers.
fn body(resp: &str) -> Vec<String> {
    let b = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    b.lines().map(|l| l.trim_end_matches('\r').to_string()).collect()
}

haptic_e2e::on_each_version!(regex_rewrite_vhost_alias_and_affinity);
async fn regex_rewrite_vhost_alias_and_affinity(bin: HaproxyBin) {
    let (web, one, two) = (echo("web"), echo("one"), echo("two"));
    let http_port = free_port();
    let mut input = common::input(
        include_str!("fixtures/nginx.yaml"),
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    for s in &mut input.endpoint_slices {
        let s = std::sync::Arc::make_mut(s);
        let port = match s.metadata.name.as_deref() {
            Some("pair-1") => one,
            Some("pair-2") => two,
            _ => web,
        };
        for p in s.ports.iter_mut().flatten() {
            p.port = Some(port.into());
        }
        for e in &mut s.endpoints {
            e.addresses = vec!["127.0.0.1".into()];
        }
    }
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let get = |host: &str, path: &str, extra: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
    };
    let request_line = |r: &str| body(r).get(1).cloned().unwrap_or_default();

    // rewrite-target /$2 on /foo(/|$)(.*): the second group, case-insensitive, query kept.
    for (path, want) in [
        ("/foo/bar/baz?x=1", "GET /bar/baz?x=1 HTTP/1.1"),
        ("/FOO/Bar", "GET /Bar HTTP/1.1"),
        ("/foo", "GET / HTTP/1.1"),
    ] {
        let r = common::raw(addr, &get("rw.example.com", path, "")).await;
        assert_eq!((common::status(&r), request_line(&r)), (200, want.to_string()), "{path}: {r}");
    }
    // No regex matches: nothing else is routed on that host.
    assert_eq!(common::status(&common::raw(addr, &get("rw.example.com", "/foobar", "")).await), 404);
    // The Exact path is rewritten too, by its literal self.
    let r = common::raw(addr, &get("rw.example.com", "/exact", "")).await;
    assert_eq!(request_line(&r), "GET / HTTP/1.1", "{r}");

    // A regex path's `\.` is a dot, `$` the end.
    let r = common::raw(addr, &get("re.example.com", "/static/a/b.css", "")).await;
    assert_eq!((common::status(&r), request_line(&r)), (200, "GET /static/a/b.css HTTP/1.1".to_string()), "{r}");
    assert_eq!(common::status(&common::raw(addr, &get("re.example.com", "/static/bxcss", "")).await), 404);
    assert_eq!(common::status(&common::raw(addr, &get("re.example.com", "/static/b.css.map", "")).await), 404);

    // The refused regex is not routed; its Ingress's other path is.
    assert_eq!(common::status(&common::raw(addr, &get("bad.example.com", "/aaaa", "")).await), 404);
    assert_eq!(common::status(&common::raw(addr, &get("bad.example.com", "/ok", "")).await), 200);

    // upstream-vhost: the backend sees the Host asked for; the aliases route the same way.
    for host in ["vhost.example.com", "alias.example.com", "x.alias.example.org"] {
        let r = common::raw(addr, &get(host, "/p", "")).await;
        let b = body(&r);
        assert_eq!(common::status(&r), 200, "{host}: {r}");
        assert!(b.iter().any(|l| l.eq_ignore_ascii_case("host: internal.example")), "{host}: {b:?}");
    }
    assert_eq!(common::status(&common::raw(addr, &get("y.x.alias.example.org", "/p", "")).await), 404);

    // Cookie affinity: the first answer sets `route`, with its attributes; sent back, it keeps
    // the client on that server (both servers take new clients).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let r = common::raw(addr, &get("sticky.example.com", "/", "")).await;
        let head = r.split("\r\n\r\n").next().unwrap().to_string();
        let set = head
            .lines()
            .find_map(|l| l.strip_prefix("set-cookie: ").or_else(|| l.strip_prefix("Set-Cookie: ")))
            .unwrap_or_else(|| panic!("no Set-Cookie: {r}"))
            .to_string();
        assert!(set.contains("Max-Age=60") && set.contains("Path=/") && set.contains("HttpOnly"), "{set}");
        assert!(set.contains("SameSite=Strict") && set.contains("Secure"), "{set}");
        let cookie = set.split(';').next().unwrap().to_string();
        let server = body(&r)[0].clone();
        seen.insert(server.clone());
        for _ in 0..5 {
            let again = common::raw(addr, &get("sticky.example.com", "/", &format!("Cookie: {cookie}\r\n"))).await;
            assert_eq!(body(&again)[0], server, "{cookie}: {again}");
            // The cookie is HAProxy's: it never reaches the server.
            assert!(!body(&again).iter().any(|l| l.to_ascii_lowercase().starts_with("cookie:")), "{again}");
        }
    }
    assert_eq!(seen.len(), 2, "round robin gives new clients both servers: {seen:?}");
}

haptic_e2e::on_each_version!(a_canary_takes_its_share_and_its_selected_requests);
async fn a_canary_takes_its_share_and_its_selected_requests(bin: HaproxyBin) {
    let (stable, preview) = (echo("stable"), echo("preview"));
    let http_port = free_port();
    let mut input = common::input(
        include_str!("fixtures/canary.yaml"),
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    common::endpoints_on_loopback(&mut input, |svc| if svc == "preview" { preview } else { stable });
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let who = |host: &'static str, extra: &'static str| async move {
        let r = common::raw(addr, &format!("GET / HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")).await;
        assert_eq!(common::status(&r), 200, "{r}");
        body(&r)[0].clone()
    };

    // canary-weight 20: 20 % ± 5 % of 1,000 requests.
    let mut to_preview = 0;
    for _ in 0..1000 {
        if who("canary.example.com", "").await == "preview" {
            to_preview += 1;
        }
    }
    assert!((150..=250).contains(&to_preview), "{to_preview} of 1000 went to the canary");
    // The header decides first (always / never), then the cookie.
    for _ in 0..10 {
        assert_eq!(who("canary.example.com", "X-Canary: always\r\n").await, "preview");
        assert_eq!(who("canary.example.com", "X-Canary: never\r\n").await, "stable");
        assert_eq!(who("canary.example.com", "Cookie: canary=always\r\n").await, "preview");
        assert_eq!(who("canary.example.com", "Cookie: canary=never\r\n").await, "stable");
        assert_eq!(who("canary.example.com", "X-Canary: never\r\nCookie: canary=always\r\n").await, "stable");
        // By value: only that value, and at weight 0 nothing else.
        assert_eq!(who("hv.example.com", "X-Env: staging\r\n").await, "preview");
        assert_eq!(who("hv.example.com", "X-Env: prod\r\n").await, "stable");
        assert_eq!(who("hv.example.com", "").await, "stable");
        // By pattern: a matching value goes to the canary, others by weight (0 here).
        assert_eq!(who("pattern.example.com", "X-Beta: alice\r\n").await, "preview");
        assert_eq!(who("pattern.example.com", "X-Beta: mallory\r\n").await, "stable");
        assert_eq!(who("pattern.example.com", "X-Beta: alice2\r\n").await, "stable");
    }
    // The refused canary's host is not routed.
    let r = common::raw(addr, "GET / HTTP/1.1\r\nHost: nowhere.example.com\r\nConnection: close\r\n\r\n").await;
    assert_eq!(common::status(&r), 404, "{r}");
}
