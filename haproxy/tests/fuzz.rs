//! Bounded property-based "fuzzing" (cargo-fuzz needs a nightly toolchain and libfuzzer, which
//! this project does not require): the config parser, diff, runtime claim, path list and rules,
//! and the master CLI reply parsers never panic on arbitrary input, and keep their invariants.
//! `scripts/fuzz.sh` runs the same targets with many more cases (`PROPTEST_CASES`).

use haptic_haproxy::cfg::{parse, parse_acl_file, parse_map_file, tcp_binds, tokenize};
use haptic_haproxy::claim::{diff_cfg, verify_runtime_claim, ChangedFile};
use haptic_haproxy::cli::{check_reply, parse_reload_reply, parse_show_info, parse_show_proc, parse_version, Expect};
use haptic_haproxy::paths::{check_paths, file_refs, PathPolicy};
use haptic_protocol::{Op, RelPath};
use proptest::prelude::*;

/// Config-looking text: HAProxy keywords, paths, quotes, comments and noise, line by line.
fn config_text() -> impl Strategy<Value = String> {
    let word = prop::sample::select(vec![
        "global",
        "defaults",
        "frontend",
        "backend",
        "listen",
        "server",
        "bind",
        "crt",
        "crt-list",
        "ca-file",
        "errorfile",
        "map(",
        "map_str(",
        ")",
        ",",
        "-f",
        "default-path",
        "config",
        "stats",
        "socket",
        "..",
        "/etc/passwd",
        "maps/a.map",
        "\"",
        "'",
        "\\",
        "#",
        "unix@/run/x.sock",
        "127.0.0.1:80",
        ":443",
        "weight",
        "10",
        "disabled",
        "lua-load",
        "http-request",
        "return",
        "file",
        "%[",
        "]",
        "{",
        "}",
        "if",
        "ssl",
    ]);
    let token = prop_oneof![word.prop_map(String::from), "[ -~]{0,12}", any::<String>()];
    let line = prop::collection::vec(token, 0..8).prop_map(|t| t.join(" "));
    prop::collection::vec(line, 0..30).prop_map(|l| l.join("\n"))
}

fn policy() -> PathPolicy {
    PathPolicy { allowed: vec!["/etc/ssl/certs".into()], socket_dir: Some("/run/haptic".into()) }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn config_parser_diff_claim_and_paths_never_panic(old in config_text(), new in config_text()) {
        for line in new.lines() {
            let _ = tokenize(line);
        }
        let cfg = parse(&new);
        let _ = tcp_binds(&cfg);
        let _ = diff_cfg(&old, &new);
        let _ = parse_map_file(&new);
        let _ = parse_acl_file(&new);
        let refs = file_refs(&new, &|p| (p.len() % 2 == 0).then(|| old.clone()));
        for r in &refs {
            // Every reference points at a line of the text.
            prop_assert!(r.line >= 1 && r.line <= new.lines().count(), "{r:?}");
        }
        let verdict = check_paths(&new, &refs, &policy());
        // A path climbing out of the tree never passes.
        if refs.iter().any(|r| r.path.starts_with("../")) {
            prop_assert!(verdict.is_err());
        }
        let map = RelPath::new("maps/a.map").unwrap();
        let changed = [ChangedFile { path: &map, new: Some(new.as_bytes()) }];
        let ops: Vec<Op> = vec![];
        let _ = verify_runtime_claim(&old, &new, &changed, &ops);
        // A config compared with itself is always a valid runtime claim with no ops and no files.
        prop_assert!(verify_runtime_claim(&new, &new, &[], &ops).is_ok());
    }

    #[test]
    fn cli_reply_parsers_never_panic(text in any::<String>(), noise in "[ -~\n]{0,200}") {
        for t in [&text, &noise] {
            let _ = parse_show_proc(t);
            let _ = parse_reload_reply(t);
            let _ = parse_show_info(t);
            let _ = parse_version(t);
            let _ = check_reply(t, Expect::Empty);
            let _ = check_reply(t, Expect::Starts(&["New version created:"]));
            let _ = check_reply(t, Expect::LastLine("Success!"));
        }
    }

    #[test]
    fn show_proc_shaped_noise_never_panics(rows in prop::collection::vec((any::<u32>(), "[a-z]{0,8}", any::<u16>(), "[0-9a-z]{0,10}"), 0..6), failed in any::<u8>()) {
        let mut t = String::from("#<PID>          <type>          <reloads>       <uptime>        <version>\n");
        for (i, (pid, ty, reloads, up)) in rows.iter().enumerate() {
            if i == 1 {
                t.push_str("# workers\n");
            }
            t.push_str(&format!("{pid} {ty} {reloads} [failed: {failed}] {up} 2.6.12\n"));
        }
        let _ = parse_show_proc(&t);
    }
}
