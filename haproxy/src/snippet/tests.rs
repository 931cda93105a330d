use super::*;
use proptest::prelude::*;

fn backend(text: &str) -> Result<(), SnippetError> {
    check(text, Section::Backend)
}

fn denied(text: &str) -> Why {
    match backend(text) {
        Err(SnippetError::Denied { why, .. }) => why,
        other => panic!("{text:?} must be denied, got {other:?}"),
    }
}

/// Each attack seen against the old deny-list, refused; its benign twin accepted.
#[test]
fn each_reported_attack_is_refused_and_its_twin_accepted() {
    for ws in ['\u{b}', '\u{c}', '\r'] {
        let t = format!("{ws}global\n    stats socket ipv4@0.0.0.0:9999 level admin");
        assert!(
            matches!(backend(&t), Err(SnippetError::Words { line: 1, error: WordsError::Control { .. } })),
            "{t:?}"
        );
        let t = format!("http-request deny{ws}");
        assert!(matches!(backend(&t), Err(SnippetError::Words { line: 1, .. })), "{t:?}");
    }
    assert!(matches!(
        backend("master-worker\nprogram x\n  command /bin/sh -c id"),
        Err(SnippetError::Directive { line: 1, .. })
    ));
    assert!(matches!(backend("'program' x"), Err(SnippetError::Directive { line: 1, .. })));
    assert_eq!(denied("http-request set-map(maps/hosts.map) a.example.com h9"), Why::ChangesSharedState);
    assert!(matches!(
        backend(".if defined(HAPROXY_MWORKER_REEXEC)\nhttp-request deny\n.endif"),
        Err(SnippetError::Preprocessor { line: 1, .. })
    ));
    assert!(matches!(backend("'.if' defined(X)"), Err(SnippetError::Preprocessor { .. })));
    assert!(matches!(backend("setenv X 1"), Err(SnippetError::Directive { .. })));
    assert!(matches!(backend("lua-load certs/shop_tls.pem"), Err(SnippetError::Directive { .. })));
    for file in ["/etc/passwd", "'/'etc/passwd", "\\x2fetc/passwd", "\"/etc\"/passwd"] {
        assert_eq!(denied(&format!("acl leak path -f {file}")), Why::ReadsAFile, "{file}");
        assert_eq!(denied(&format!("http-request return status 200 'file' {file}")), Why::ReadsAFile, "{file}");
        assert_eq!(denied(&format!("http-request return status 200 \"lf-file\" {file}")), Why::ReadsAFile, "{file}");
        assert_eq!(denied(&format!("http-request deny errorfile {file}")), Why::ReadsAFile, "{file}");
        assert_eq!(denied(&format!("acl x path -M {file}")), Why::ReadsAFile, "{file}");
    }
    // The benign twins.
    for text in [
        "http-response set-header X-Snippet yes",
        "\thttp-request set-header X-Tab yes",
        "timeout server 30s\nhttp-request deny if { path_beg /admin }",
        "http-request set-var(txn.host) req.hdr(host)",
        "http-request set-header X-Path '/'etc/passwd",
        "http-request set-header X-Path \\x2fetc/passwd",
        "acl internal src 10.0.0.0/8",
        "acl p path -m beg /x",
        "http-request return status 200 content-type text/plain string ok hdr X-A b if { path /ok }",
        "http-request set-header X-Price '$5'",
        "# a comment with lua-load and global in it\ntimeout connect 3s",
    ] {
        assert_eq!(backend(text), Ok(()), "{text:?}");
    }
}

#[test]
fn directives_off_the_allow_list_are_refused() {
    for text in [
        "global",
        "backend other",
        "frontend f",
        "server s 1.2.3.4:80",
        "stats enable",
        "errorfile 503 /etc/passwd",
        "external-check command /bin/sh",
        "filter spoe engine e config /etc/spoe.conf",
        "use-server s if TRUE",
        "http-check send meth GET",
        "cookie SRV insert",
        "stick-table type ip size 1m",
        "tcp-request content accept",
        "no option redispatch",
        "HTTP-REQUEST deny",
        "''",
    ] {
        assert!(matches!(backend(text), Err(SnippetError::Directive { line: 1, .. })), "{text:?}: {:?}", backend(text));
    }
}

#[test]
fn actions_and_arguments_off_the_allow_list_are_refused() {
    for text in [
        "http-request use-service prometheus-exporter",
        "http-request lua.hello",
        "http-request set-dst ipv4(1.2.3.4)",
        "http-request track-sc0 src",
        "http-request sc-inc-gpc0(0)",
        "http-request capture req.hdr(x) len 10",
        "http-request cache-use c",
        "http-request do-resolve(txn.ip,dns) str(a)",
        "http-request set-var(proc.limit) int(0)",
        "http-request set-var-fmt(proc.who) %[src]",
        "http-request unset-var(proc.x)",
        "http-request set-var(txn) int(1)",
        "http-request set-header(x) a b",
        "http-response set-path /x",
        "http-after-response deny",
        "http-request",
        "timeout client 5s",
        "timeout server",
        "timeout server 5s 6s",
        "option external-check",
        "option httpchk",
        "balance hdr(a) x",
        "balance uri-whatever",
        "hash-type consistent lua",
        "retries x",
        "retry-on 'a b'",
        "acl only-a-name",
    ] {
        assert!(
            matches!(backend(text), Err(SnippetError::Argument { line: 1, .. } | SnippetError::Denied { .. })),
            "{text:?}: {:?}",
            backend(text)
        );
    }
}

#[test]
fn denied_words_inside_allowed_lines_are_refused() {
    for (text, why) in [
        ("http-request set-header X %[env(HAPTIC_PASSWORD)]", Why::ReadsTheEnvironment),
        ("http-request set-header X %[ENV(PATH)]", Why::ReadsTheEnvironment),
        ("http-request set-header X %[str(a),lua.conv]", Why::LoadsCode),
        ("http-request set-header X %[path,map(maps/hosts.map)]", Why::ReadsAFile),
        ("http-request set-header X %[path,map_str(maps/hosts.map)]", Why::ReadsAFile),
        ("acl a path,map_beg(maps/paths_prefix.map) -m found", Why::ReadsAFile),
        ("http-request set-header X %[var(proc.x)]", Why::ChangesSharedState),
        ("http-request set-header X %[src,table_gpc0(other)]", Why::ReadsOtherObjects),
        ("http-request set-header X %[sc_inc_gpc0(0)]", Why::ChangesSharedState),
        ("http-request set-header X %[src_clr_gpc(0,t)]", Why::ChangesSharedState),
        ("acl ok http_auth(admins)", Why::ReadsOtherObjects),
        ("acl a path -m reg '(a+)+$'", Why::UncheckedRegex),
        ("acl a path_reg '(a+)+$'", Why::UncheckedRegex),
        ("http-request set-path %[path,regsub(^/a,/b)]", Why::UncheckedRegex),
        ("http-request deny if { hdr_reg(x) a }", Why::UncheckedRegex),
        ("http-request return status 200 errorfiles x", Why::ReadsAFile),
        ("http-request return status 503 default-errorfiles", Why::ReadsAFile),
    ] {
        assert_eq!(denied(text), why, "{text:?}");
    }
    // `lua.` inside a longer name is not a Lua call.
    assert_eq!(backend("http-request set-header X-Koala value.lua.example"), Ok(()));
    assert!(!uses_name("tualua.com", "lua."));
}

#[test]
fn replace_patterns_must_be_accepted_regexes() {
    assert_eq!(backend("http-request replace-path /api/(.*) '/\\1'"), Ok(()));
    assert_eq!(backend("http-request replace-header X-A ^foo(.*) 'bar\\1'"), Ok(()));
    for text in [
        "http-request replace-path '(a+)+$' /x",
        "http-request replace-pathq /a*a*a*a*[0-9] /x",
        "http-response replace-value X-A (?i)x y",
    ] {
        assert!(matches!(backend(text), Err(SnippetError::Regex { line: 1, .. })), "{text:?}: {:?}", backend(text));
    }
}

#[test]
fn words_that_read_uncertainly_are_refused() {
    for text in [
        "http-request set-header X \"${HOME}\"",
        "http-request set-header X $HOME",
        "http-request set-header X \\$HOME",
        "http-request set-header X a\\",
        "http-request set-header X 'open",
        "http-request set-header X \\q",
        "http-request set-header X \\r",
        "http-request set-header X \\x0b",
        "http-request deny\0",
        "http-request deny\u{7f}",
        "http-request deny\u{85}",
    ] {
        assert!(matches!(backend(text), Err(SnippetError::Words { line: 1, .. })), "{text:?}: {:?}", backend(text));
    }
    assert!(matches!(backend("acl a always_true\nglobal"), Err(SnippetError::Directive { line: 2, .. })));
}

#[test]
fn every_entry_of_the_deny_list_is_refused() {
    for (m, why) in DENIED {
        let word = match m {
            Match::Word(w) | Match::CaseWord(w) | Match::Inside(w) => w.to_string(),
            Match::Name(n) => format!("%[{n}x)]"),
        };
        let text = format!("http-request set-header X-A {}", crate::quote::config_arg(&word).unwrap());
        assert_eq!(denied(&text), *why, "{text:?}");
    }
}

#[test]
fn a_check_without_listener_passes() {
    assert!(check_passed(Some(0)) && check_passed(Some(2)));
    assert!(!check_passed(Some(1)) && !check_passed(None));
}

#[test]
fn check_config_holds_the_snippet_in_one_backend() {
    let c = check_config("    timeout server 5s");
    assert!(c.ends_with("backend snippet_check\n    timeout server 5s\n"), "{c}");
}

/// Pieces of snippet text: allowed lines, hostile bytes, quotes, escapes, section and
/// preprocessor words.
fn piece() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "http-request set-header X-A b",
        "http-response set-header X-B c",
        "timeout server 5s",
        "acl a src 10.0.0.0/8",
        " ",
        "\t",
        "\n",
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
        "global",
        "backend b",
        "program p",
        ".if",
        ".endif",
        "lua-load",
        "-f",
        "/etc/passwd",
        "set-map(x)",
        "env(",
        "%[",
        "]",
        "(",
        ")",
        "file",
        "setenv",
        "\u{a0}",
    ])
    .prop_map(str::to_string)
}

proptest! {
    /// Whatever an accepted snippet holds, every line's first word is an allowed directive and
    /// no line holds a control byte but `\t`.
    #[test]
    fn accepted_snippets_hold_only_allowed_directives(pieces in prop::collection::vec(piece(), 0..10)) {
        let text = pieces.concat();
        if backend(&text).is_ok() {
            for line in text.split('\n') {
                prop_assert!(!line.chars().any(|c| c.is_control() && c != '\t'), "{:?}", line);
                let words = crate::words::split(line).unwrap();
                if let Some(first) = words.first() {
                    prop_assert!(allowed_directives(Section::Backend).contains(&first.as_str()), "{:?}", line);
                }
                let cfg_first = crate::cfg::tokenize(line).into_iter().next();
                if let Some(f) = cfg_first {
                    prop_assert!(!crate::cfg::SECTION_KEYWORDS.contains(&f.as_str()), "{:?}", line);
                }
            }
        }
    }
}
