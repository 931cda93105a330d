//! `haptic_haproxy::words::split` against real HAProxy 2.6, 3.0, 3.2 and 3.4: for random config words
//! built from quotes, escapes, `#` and blanks that `split` reads as one word, HAProxy serves that
//! exact word as a `string` body (`http-request return … string <word>`). So what the snippet
//! check judges is what HAProxy runs.

use std::net::SocketAddr;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_haproxy::words::split;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

mod common;

/// Pieces of one config word as written.
fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "a",
        "Z",
        "9",
        "/",
        "%",
        "'b c'",
        "'#'",
        "\"d e\"",
        "\"f#g\"",
        "\\ ",
        "\\#",
        "\\\\",
        "\\'",
        "\\\"",
        "\\x41",
        "\\x2f",
        "'\\x2f'",
        "'\\'",
        "\"\\x20\"",
        "'\"'",
        "\"'\"",
        "''",
        "\"\"",
        "#",
        " ",
        "\\t",
        "'$'",
        "{",
        "}",
    ])
}

haptic_e2e::on_each_version!(split_reads_words_as_haproxy_does);
async fn split_reads_words_as_haproxy_does(bin: HaproxyBin) {
    // Words `split` reads as exactly one non-empty word without blanks at its ends (an HTTP
    // client cannot tell those apart) and without a tab, with their written forms.
    let mut runner = TestRunner::new(Config { cases: 64, ..Config::default() });
    let mut words: Vec<(String, String)> = Vec::new();
    let strategy = prop::collection::vec(piece(), 1..8).prop_map(|v| v.concat());
    while words.len() < 60 {
        let written = strategy.new_tree(&mut runner).unwrap().current();
        // The word must leave the rest of the line to be read (no comment, no blank after it).
        if let Ok(w) = split(&format!("{written} if")) {
            if w.len() == 2 && w[1] == "if" && !w[0].is_empty() && w[0].trim() == w[0] && !w[0].contains('\t') {
                words.push((written, w[0].clone()));
            }
        }
    }
    let port = free_port();
    let mut cfg = format!(
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 5s\n    timeout server 5s\n\nfrontend f\n    bind 127.0.0.1:{port}\n"
    );
    for (i, (written, _)) in words.iter().enumerate() {
        cfg.push_str(&format!(
            "    http-request return status 200 content-type text/plain string {written} if {{ path /{i} }}\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("haproxy.cfg"), &cfg).unwrap();
    let _h = Haproxy::start(&bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    for (i, (written, word)) in words.iter().enumerate() {
        let r = common::raw(addr, &format!("GET /{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).await;
        let body = r.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        assert_eq!(body, word, "{written:?} read by split as {word:?}, by HAProxy as {body:?}\n{cfg}");
    }
}
