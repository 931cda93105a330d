//! Contained `haproxy -c` runs with the real HAProxy binaries (2.6, 3.0, 3.2 and 3.4): a file outside the
//! render is not readable (its content never appears in the output), a file inside is, endless
//! files and endless output are cut, and the environment is cleared.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use haptic_sandbox::{run, End, Run};

/// `HAPTIC_HAPROXY_BINS` (colon-separated) or the four installed binaries.
fn bins() -> Vec<PathBuf> {
    let v = std::env::var("HAPTIC_HAPROXY_BINS").unwrap_or_default();
    let mut out: Vec<PathBuf> = v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect();
    if out.is_empty() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
        out = std::iter::once(PathBuf::from("/usr/sbin/haproxy"))
            .chain(["3.0", "3.2", "3.4"].map(|v| root.join("target/haproxy").join(v).join("haproxy")))
            .collect();
    }
    for b in &out {
        assert!(b.exists(), "HAProxy binary {} is missing: run scripts/install-haproxy.sh", b.display());
    }
    out
}

const SECRET: &str = "s3cr3t-token-value";

fn cfg(acl_file: &str) -> String {
    format!(
        "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 1s\n    timeout client 1s\n    \
         timeout server 1s\nfrontend f\n    bind 127.0.0.1:8080\n    acl x src -f {acl_file}\n    \
         http-request deny if x\n    http-request return status 200\n"
    )
}

/// A render dir holding `haproxy.cfg` = `text(secret file)` and an in-tree ACL file, next to a
/// secret file outside it.
fn render(text: impl Fn(&Path) -> String) -> (tempfile::TempDir, PathBuf) {
    let base = tempfile::tempdir().unwrap();
    let secret = base.path().join("token");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    let dir = base.path().join("render");
    std::fs::create_dir_all(dir.join("acl")).unwrap();
    std::fs::write(dir.join("acl/ips.lst"), "10.0.0.1\n").unwrap();
    std::fs::write(dir.join("haproxy.cfg"), text(&secret)).unwrap();
    (base, dir)
}

fn passed(out: &haptic_sandbox::Outcome) -> bool {
    matches!(out.end, End::Exited(s) if s.success())
}

#[test]
fn a_file_outside_the_render_is_not_read_and_one_inside_is() {
    assert!(haptic_sandbox::landlock_active(), "this kernel has Landlock: the test needs it enforced");
    for bin in bins() {
        // The secret, read as an ACL of addresses, would be echoed as "not a valid address".
        let (_base, dir) = render(|secret| cfg(&secret.display().to_string()));
        let out = run(Run::check(&bin, &dir, "haproxy.cfg", Duration::from_secs(20))).unwrap();
        assert!(out.contained);
        assert!(!passed(&out), "{}: passed: {}", bin.display(), out.output);
        assert!(!out.output.contains(SECRET), "{}: the secret leaked: {}", bin.display(), out.output);
        // Unconfined, the same check reads the file and echoes it: the containment is what hides it.
        let bare =
            std::process::Command::new(&bin).args(["-c", "-f", "haproxy.cfg"]).current_dir(&dir).output().unwrap();
        let bare = format!("{}{}", String::from_utf8_lossy(&bare.stdout), String::from_utf8_lossy(&bare.stderr));
        assert!(bare.contains(SECRET), "{}: without containment the file is echoed: {bare}", bin.display());

        let (_base, dir) = render(|_| cfg("acl/ips.lst"));
        let out = run(Run::check(&bin, &dir, "haproxy.cfg", Duration::from_secs(20))).unwrap();
        assert_eq!(out.code(), Some(0), "{}: the in-tree ACL file must load: {}", bin.display(), out.output);
    }
}

#[test]
fn the_service_account_token_and_proc_are_not_readable() {
    for bin in bins() {
        for outside in ["/etc/passwd", "/proc/self/environ", "/var/run/secrets/kubernetes.io/serviceaccount/token"] {
            let (_base, dir) = render(|_| cfg(outside));
            let out = run(Run::check(&bin, &dir, "haproxy.cfg", Duration::from_secs(20))).unwrap();
            assert!(!passed(&out), "{}: {outside} loaded: {}", bin.display(), out.output);
            assert!(!out.output.contains("root:x:0"), "{}: {}", bin.display(), out.output);
        }
    }
}

#[test]
fn an_endless_file_fails_fast() {
    for bin in bins() {
        let (_base, dir) = render(|_| cfg("/dev/zero"));
        let started = Instant::now();
        let out = run(Run::check(&bin, &dir, "haproxy.cfg", Duration::from_secs(60))).unwrap();
        assert!(matches!(out.end, End::Exited(s) if !s.success()), "{}: {:?} {}", bin.display(), out.end, out.output);
        // Refused on open, not by the 60 s deadline.
        assert!(started.elapsed() < Duration::from_secs(60), "{}", bin.display());
    }
}

#[test]
fn time_and_output_are_bounded_and_the_environment_is_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let sh = PathBuf::from("/bin/sh");
    let mut r = Run::check(&sh, dir.path(), "", Duration::from_millis(300));
    r.args = vec!["-c".into(), "exec /bin/sleep 30".into()];
    assert_eq!(run(r.clone()).unwrap().end, End::TimedOut(Duration::from_millis(300)));
    r.timeout = Duration::from_secs(30);
    r.max_output = 1000;
    r.args = vec!["-c".into(), "exec /usr/bin/yes".into()];
    let out = run(r.clone()).unwrap();
    assert_eq!((out.end, out.output.len()), (End::TooMuchOutput(1000), 1000));
    // A variable this process has (cargo sets it for every test run); setting one here would
    // race with the other tests' spawns.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    r.args = vec!["-c".into(), "/usr/bin/env; pwd; /bin/cat".into()];
    let out = run(r.clone()).unwrap();
    assert!(out.output.contains(&format!("PATH={}", haptic_sandbox::FIXED_PATH)), "{}", out.output);
    assert!(!out.output.contains("CARGO_MANIFEST_DIR"), "{}", out.output);
    assert!(out.output.contains(dir.path().to_str().unwrap()), "{}", out.output);
    // The variables the caller names reach the process, and nothing else does; its PATH stays fixed.
    r.env = vec![("FRONT_PORT".into(), "8443".into()), ("PATH".into(), "/nowhere".into())];
    let out = run(r).unwrap();
    assert!(out.output.contains("FRONT_PORT=8443\n"), "{}", out.output);
    assert!(out.output.contains(&format!("PATH={}\n", haptic_sandbox::FIXED_PATH)), "{}", out.output);
    assert!(!out.output.contains("CARGO_MANIFEST_DIR") && !out.output.contains("/nowhere"), "{}", out.output);
}

#[test]
fn the_readable_paths_are_the_render_the_binary_and_the_libraries() {
    let rules = haptic_sandbox::readable_paths(Path::new("/opt/hap/sbin/haproxy"), Path::new("/tmp/r"), &[], &[]);
    let paths: Vec<&str> = rules.iter().map(|(p, _)| p.to_str().unwrap()).collect();
    assert_eq!(paths[0], "/tmp/r");
    assert!(paths.contains(&"/opt/hap/sbin"));
    for never in ["/", "/etc", "/proc", "/var", "/var/run/secrets", "/dev", "/tmp", "/etc/passwd"] {
        assert!(!paths.contains(&never), "{never} is readable");
    }
}
