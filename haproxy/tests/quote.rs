//! The quoting functions against real HAProxy 2.6, 3.0, 3.2 and 3.4: a config built from arbitrary strings
//! through them passes `haproxy -c`, and the running HAProxy serves exactly the original strings
//! over real HTTP on 127.0.0.1 (as a `string` body, a `lf-string` body and a header, a map value
//! looked up by its key, and the rule whose literal regex matches).
//!
//! Each HAProxy version is its own test case. The binaries come from `HAPTIC_HAPROXY_BINS`
//! (colon-separated; default `/usr/sbin/haproxy` and `target/haproxy/{3.0,3.2,3.4}/haproxy`, all
//! put there by `scripts/install-haproxy.sh`). Work is bounded by count: a few configs per version,
//! each carrying a batch of values.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use haptic_haproxy::cli::parse_version;
use haptic_haproxy::quote::{config_arg, log_format_arg, map_line, regex_literal};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Values per config.
const BATCH: usize = 40;
/// Configs per version.
const CONFIGS: u32 = 3;

fn haproxy(major: u32, minor: u32) -> PathBuf {
    let listed = std::env::var("HAPTIC_HAPROXY_BINS").unwrap_or_else(|_| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/haproxy");
        let installed = ["3.0", "3.2", "3.4"].map(|v| root.join(v).join("haproxy").display().to_string());
        format!("/usr/sbin/haproxy:{}", installed.join(":"))
    });
    let found = listed.split(':').filter(|p| !p.is_empty()).map(PathBuf::from).find(|bin| {
        Command::new(bin)
            .arg("-v")
            .output()
            .ok()
            .and_then(|o| parse_version(&String::from_utf8_lossy(&o.stdout)).ok())
            .is_some_and(|(ma, mi, _)| (ma, mi) == (major, minor))
    });
    found.unwrap_or_else(|| panic!("no HAProxy {major}.{minor} among {listed:?} (run scripts/install-haproxy.sh)"))
}

/// A running HAProxy in the foreground, killed (and reaped) on drop.
struct Running {
    child: Child,
    port: u16,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn check(bin: &Path, dir: &Path) -> Result<(), String> {
    let out = Command::new(bin)
        .args(["-c", "-q", "-f", "haproxy.cfg"])
        .current_dir(dir)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

fn start(bin: &Path, dir: &Path, port: u16) -> Running {
    let child = Command::new(bin)
        .args(["-db", "-f", "haproxy.cfg"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start haproxy");
    let run = Running { child, port };
    // Waits for the listener (state), with a deadline.
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "HAProxy did not listen on 127.0.0.1:{port} within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    run
}

/// One HTTP/1.1 GET: the status, the raw header lines and the body, byte for byte.
fn get(port: u16, path: &str) -> (u16, Vec<Vec<u8>>, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).expect("read the response");
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = &buf[..split];
    let mut lines = head.split(|b| *b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l).to_vec());
    let status_line = lines.next().unwrap_or_default();
    let status = String::from_utf8_lossy(&status_line).split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, lines.collect(), buf[split + 4..].to_vec())
}

fn header<'a>(headers: &'a [Vec<u8>], name: &str) -> Option<&'a [u8]> {
    let prefix = format!("{}: ", name.to_ascii_lowercase());
    headers.iter().find_map(|h| {
        let lower: Vec<u8> = h.iter().map(u8::to_ascii_lowercase).collect();
        lower.starts_with(prefix.as_bytes()).then(|| &h[prefix.len()..])
    })
}

fn url_encode(s: &str) -> String {
    s.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// Characters HAProxy's config, log-format and regex readers treat specially, and some others.
fn value() -> impl Strategy<Value = String> {
    let special = prop::sample::select(vec![
        '\'',
        '"',
        '\\',
        '#',
        '$',
        '%',
        '[',
        ']',
        '{',
        '}',
        '(',
        ')',
        ' ',
        '\t',
        ';',
        ',',
        '&',
        '?',
        '*',
        '+',
        '.',
        '^',
        '|',
        '~',
        '=',
        ':',
        '/',
        'x',
        'X',
        '0',
        '\u{1}',
        '\u{b}',
        '\u{c}',
        '\u{7f}',
        'é',
        '€',
        '\u{10348}',
    ]);
    let any = any::<char>().prop_filter("no NUL, CR or LF", |c| !matches!(c, '\0' | '\r' | '\n'));
    prop::collection::vec(prop_oneof![4 => special, 1 => any], 0..14).prop_map(|v| v.into_iter().collect())
}

fn values() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(value(), BATCH).prop_map(|mut v| {
        // Always among them: the empty string (refused as a word), a lone quote, an environment variable and `%[`.
        v[0] = String::new();
        v[1] = "'".into();
        v[2] = "$HOME ${HOME} \"$HOME\"".into();
        v[3] = "%[src] %ci %% %{+Q}o".into();
        v
    })
}

fn ensure(cond: bool, why: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(why()))
    }
}

/// Builds one config from `values`, checks it, runs it and reads every value back.
fn round_trip(bin: &Path, values: &[String]) -> Result<(), TestCaseError> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let port = free_port();
    std::fs::create_dir(dir.join("maps")).unwrap();
    // Map keys: each value made a valid, unique key (no whitespace, no leading `#`).
    let keys: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("k{i}~{}", v.replace(|c: char| c.is_ascii_whitespace() || c == '\u{b}', "_")))
        .collect();
    // Map values: leading and trailing blanks cannot be written (`v.` and `.v` keep the rest).
    // They are read back through a log-format sample (`%[…]`), whose output HAProxy escapes
    // for control characters (`\x7f` arrives as `%7F`): those are left out of map values.
    let map_values: Vec<String> =
        values.iter().map(|v| format!("v.{}.v", v.replace(|c: char| c.is_ascii_control(), "_"))).collect();
    let mut map = String::new();
    for (k, v) in keys.iter().zip(&map_values) {
        map.push_str(&map_line(k, v).map_err(|e| TestCaseError::fail(e.to_string()))?);
    }
    std::fs::write(dir.join("maps/m.map"), map).unwrap();

    let mut cfg = format!(
        "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 1s\n    timeout client 20s\n    \
         timeout server 20s\nfrontend f\n    bind 127.0.0.1:{port}\n"
    );
    let q =
        |r: Result<String, _>| r.map_err(|e: haptic_haproxy::quote::Inexpressible| TestCaseError::fail(e.to_string()));
    for (i, v) in values.iter().enumerate() {
        if v.is_empty() {
            // HAProxy reads an empty word as a missing argument: refused, never written.
            ensure(config_arg(v).is_err() && log_format_arg(v).is_err(), || "the empty word was not refused".into())?;
        } else {
            let (c, lf) = (q(config_arg(v))?, q(log_format_arg(v))?);
            cfg.push_str(&format!(
                "    http-request return status 200 content-type text/plain string {c} if {{ path /c/{i} }}\n\
                 \x20   http-request return status 200 content-type text/plain lf-string {lf} hdr X-T {lf} if {{ path /l/{i} }}\n"
            ));
        }
        let re = q(config_arg(&format!("^{}$", q(regex_literal(v))?)))?;
        cfg.push_str(&format!(
            "    http-request return status 200 content-type text/plain string {i} if {{ path /r }} {{ url_param(k),url_dec -m reg {re} }}\n"
        ));
    }
    cfg.push_str(
        "    http-request return status 200 content-type text/plain lf-string \"%[url_param(k),url_dec,map(maps/m.map,NOT-IN-MAP)]\" if { path /m }\n\
         \x20   http-request return status 404 content-type text/plain string none\n",
    );
    std::fs::write(dir.join("haproxy.cfg"), &cfg).unwrap();
    check(bin, dir).map_err(|e| TestCaseError::fail(format!("haproxy -c refused the config: {e}\n{cfg}")))?;

    let run = start(bin, dir, port);
    for (i, v) in values.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
        let (status, _, body) = get(run.port, &format!("/c/{i}"));
        ensure(status == 200 && body == v.as_bytes(), || {
            format!("string {v:?}: {status} {:?}", String::from_utf8_lossy(&body))
        })?;
        let (status, headers, body) = get(run.port, &format!("/l/{i}"));
        ensure(status == 200 && body == v.as_bytes(), || {
            format!("lf-string {v:?}: {status} {:?}", String::from_utf8_lossy(&body))
        })?;
        let hdr = header(&headers, "X-T");
        ensure(hdr == Some(v.as_bytes()), || format!("header {v:?}: {:?}", hdr.map(String::from_utf8_lossy)))?;
    }
    for (i, v) in values.iter().enumerate() {
        let first = values.iter().position(|w| w == v).unwrap_or(i);
        let (status, _, body) = get(run.port, &format!("/r?k={}", url_encode(v)));
        ensure(status == 200 && body == first.to_string().as_bytes(), || {
            format!("regex of {v:?}: {status} {:?}, expected rule {first}", String::from_utf8_lossy(&body))
        })?;
        let longer = format!("{v}~");
        if !values.contains(&longer) {
            let (status, _, _) = get(run.port, &format!("/r?k={}", url_encode(&longer)));
            ensure(status == 404, || format!("the regex of {v:?} matched {longer:?} too"))?;
        }
        let (status, _, body) = get(run.port, &format!("/m?k={}", url_encode(&keys[i])));
        ensure(status == 200 && body == map_values[i].as_bytes(), || {
            format!("map {:?} -> {:?}: {status} {:?}", keys[i], map_values[i], String::from_utf8_lossy(&body))
        })?;
    }
    Ok(())
}

fn run_on(major: u32, minor: u32) {
    let bin = haproxy(major, minor);
    let mut runner = TestRunner::new(Config { cases: CONFIGS, max_shrink_iters: 32, ..Config::default() });
    if let Err(e) = runner.run(&values(), |v| round_trip(&bin, &v)) {
        panic!("HAProxy {major}.{minor} ({}): {e}", bin.display());
    }
}

#[test]
fn quoted_values_reach_http_exactly_on_2_6() {
    run_on(2, 6);
}

#[test]
fn quoted_values_reach_http_exactly_on_3_0() {
    run_on(3, 0);
}

#[test]
fn quoted_values_reach_http_exactly_on_3_2() {
    run_on(3, 2);
}

#[test]
fn quoted_values_reach_http_exactly_on_3_4() {
    run_on(3, 4);
}
