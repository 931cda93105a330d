//! Real HAProxy on 127.0.0.1 serving the ingress-nginx annotations that answer or refuse
//! requests themselves: CORS preflights and response headers (any origin; a list with a
//! wildcard, a foreign origin getting none), `limit-rps` (503 once a client is over its rate),
//! `limit-rpm` (the same over a minute), `limit-whitelist` (an exempt client is never refused),
//! `limit-connections` (503 while a client's one allowed request is in flight), basic
//! authentication (401 without or with a wrong password, 200 with the right one) and an Ingress
//! whose auth Secret is missing (refused whole: its host is not served).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::Settings;

mod common;

/// `openssl passwd -6 -salt hapticsalt s3cret`.
const HASH: &str =
    "$6$hapticsalt$yr1hq82rX5T7SaQ8ljUbtW9xkO1rW4pBKrgsbzwxTkC7JbuId/IoZnrE3QGYwD3OD1jTBEJoQ6wOhpOqAYzof/";

fn header<'a>(resp: &'a str, name: &str) -> Option<&'a str> {
    let head = resp.split("\r\n\r\n").next().unwrap_or_default();
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A backend that tells `accepted` of each request it reads, then answers only once `release`
/// says so (or after 20 s), so a request stays in flight as long as a test needs.
fn hold(accepted: mpsc::Sender<()>, release: mpsc::Receiver<()>) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = [0u8; 8192];
            let _ = s.read(&mut buf);
            let _ = accepted.send(());
            let _ = release.recv_timeout(Duration::from_secs(20));
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nhold");
        }
    });
    port
}

haptic_e2e::on_each_version!(cors_limits_and_basic_auth);
async fn cors_limits_and_basic_auth(bin: HaproxyBin) {
    let web = common::backend("web");
    let (accepted_tx, accepted) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let held = hold(accepted_tx, release_rx);
    let http_port = free_port();
    let mut input = common::input(
        include_str!("fixtures/policies.yaml"),
        Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 2, ..Settings::default() },
    );
    common::endpoints_on_loopback(&mut input, |svc| if svc == "hold" { held } else { web });
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("basic".into());
    secret.metadata.namespace = Some("shop".into());
    secret.data = Some([("auth".to_string(), k8s_openapi::ByteString(format!("alice:{HASH}\n").into_bytes()))].into());
    input.secrets.push(std::sync::Arc::new(secret));
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let no_secret = render.verdicts.iter().find(|v| v.object.name == "no-secret").unwrap();
    assert_eq!(no_secret.refusals[0].cause, haptic_render::Cause::Missing, "{no_secret:?}");
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    let req = |method: &str, host: &str, extra: &str| {
        format!("{method} / HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
    };

    // CORS, any origin: a preflight answers 204 with the headers; a GET carries them.
    let r = common::raw(addr, &req("OPTIONS", "cors.example.com", "Origin: https://x.example\r\n")).await;
    assert_eq!(common::status(&r), 204, "{r}");
    assert_eq!(header(&r, "access-control-allow-origin"), Some("*"), "{r}");
    assert_eq!(header(&r, "access-control-allow-methods"), Some("GET, PUT, POST, DELETE, PATCH, OPTIONS"), "{r}");
    assert_eq!(header(&r, "access-control-max-age"), Some("1728000"), "{r}");
    assert_eq!(header(&r, "access-control-allow-credentials"), Some("true"), "{r}");
    let r = common::raw(addr, &req("GET", "cors.example.com", "Origin: https://x.example\r\n")).await;
    assert_eq!((common::status(&r), header(&r, "access-control-allow-origin")), (200, Some("*")), "{r}");
    assert!(r.ends_with("web"), "{r}");
    // Without an Origin, no CORS at all (an OPTIONS goes to the backend).
    let r = common::raw(addr, &req("OPTIONS", "cors.example.com", "")).await;
    assert_eq!((common::status(&r), header(&r, "access-control-allow-origin")), (200, None), "{r}");

    // CORS, a list: the request's own origin echoed when it matches, nothing otherwise.
    for origin in ["https://a.example", "https://x.b.example", "https://y.x.b.example"] {
        let r = common::raw(addr, &req("GET", "cors2.example.com", &format!("Origin: {origin}\r\n"))).await;
        assert_eq!(header(&r, "access-control-allow-origin"), Some(origin), "{r}");
        assert_eq!(header(&r, "access-control-expose-headers"), Some("X-Total"), "{r}");
        assert_eq!(header(&r, "access-control-allow-credentials"), None, "{r}");
    }
    for origin in ["https://evil.example", "http://a.example", "https://b.example", "https://a.example.evil"] {
        let r = common::raw(addr, &req("OPTIONS", "cors2.example.com", &format!("Origin: {origin}\r\n"))).await;
        assert_eq!((common::status(&r), header(&r, "access-control-allow-origin")), (200, None), "{origin}: {r}");
    }

    // limit-rps 1 over 60 s: 60 requests pass, the next ones (well within 60 s) get 503.
    let mut codes = Vec::new();
    for _ in 0..65 {
        codes.push(common::status(&common::raw(addr, &req("GET", "rps.example.com", "")).await));
    }
    assert!(codes[..60].iter().all(|c| *c == 200), "{codes:?}");
    assert!(codes[60..].iter().all(|c| *c == 503), "{codes:?}");

    // limit-rpm 5 (limit-whitelist 10.0.0.0/8, not this client): 5 requests pass, the next
    // ones (well within 60 s) get 503.
    let mut codes = Vec::new();
    for _ in 0..8 {
        codes.push(common::status(&common::raw(addr, &req("GET", "rpm.example.com", "")).await));
    }
    assert_eq!(codes, [200, 200, 200, 200, 200, 503, 503, 503]);
    // limit-rpm 2 and limit-rps 1 over 1 s, with limit-whitelist 127.0.0.0/8: this client is
    // neither counted nor refused.
    for i in 0..10 {
        let r = common::raw(addr, &req("GET", "exempt.example.com", "")).await;
        assert_eq!(common::status(&r), 200, "request {i}: {r}");
    }

    // limit-connections 1: while one request is in flight, the next gets 503.
    let held_req = req("GET", "conn.example.com", "");
    let first = tokio::spawn(async move { common::raw(addr, &held_req).await });
    tokio::task::spawn_blocking(move || accepted.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the held request never reached its backend");
    let r = common::raw(addr, &req("GET", "conn.example.com", "")).await;
    assert_eq!(common::status(&r), 503, "{r}");
    release.send(()).unwrap();
    let r = first.await.unwrap();
    assert_eq!(common::status(&r), 200, "{r}");

    // Basic auth: none or a wrong password 401 with the realm; the right one 200.
    let r = common::raw(addr, &req("GET", "auth.example.com", "")).await;
    assert_eq!(common::status(&r), 401, "{r}");
    assert_eq!(header(&r, "www-authenticate"), Some("Basic realm=\"Shop staff\""), "{r}");
    let basic = |b64: &str| format!("Authorization: Basic {b64}\r\n");
    // alice:wrong, bob:s3cret, alice: (base64).
    for b64 in ["YWxpY2U6d3Jvbmc=", "Ym9iOnMzY3JldA==", "YWxpY2U6"] {
        let r = common::raw(addr, &req("GET", "auth.example.com", &basic(b64))).await;
        assert_eq!(common::status(&r), 401, "{b64}: {r}");
    }
    // alice:s3cret.
    let r = common::raw(addr, &req("GET", "auth.example.com", &basic("YWxpY2U6czNjcmV0"))).await;
    assert_eq!(common::status(&r), 200, "{r}");
    assert!(r.ends_with("web"), "{r}");
    // The Ingress whose Secret is missing is not served at all (never open).
    assert_eq!(common::status(&common::raw(addr, &req("GET", "open.example.com", "")).await), 404);
}
