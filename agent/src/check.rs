//! `haproxy -c` of a staged tree with the pod's own binary, contained.
//!
//! Owns running the check through [`haptic_sandbox`] (an environment of only the pod's own
//! variables, [`haproxy_env`], the tree directory as
//! working directory so relative paths under `default-path config` resolve, stdin null, bounded
//! time and output, and where the kernel has Landlock nothing readable outside the tree and the
//! allowed prefixes) and reading its outcome through `haptic_haproxy::check_output::summarize`. It must never modify the tree or talk to the running HAProxy.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use haptic_haproxy::check_output::{summarize, Checked, Ending};
use haptic_sandbox::End;

/// The longest a check may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a check failed: HAProxy's own output (its `[ALERT]` lines), or why it could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("haproxy -c failed: {output}")]
pub struct CheckFailed {
    /// HAProxy's alerts and warnings, one a line, without process ids or the tree's path.
    pub output: String,
}

/// Runs `<bin> -c -f haproxy.cfg` contained in `tree_dir`, which (with the `allowed` path
/// prefixes) is all it may read, and may run programs only from the binary's directory, `exec`
/// and the system's; `Ok` only on exit code 0, with HAProxy's warnings (a valid config may still
/// have some) as `file line N: message`. The check sees `env` (see [`haproxy_env`]) and a fixed
/// `PATH`, nothing else.
pub async fn check_tree(
    bin: &Path,
    tree_dir: &Path,
    allowed: &[String],
    exec: &[PathBuf],
    env: &[(OsString, OsString)],
) -> Result<Vec<String>, CheckFailed> {
    let mut run = haptic_sandbox::Run::check(bin, tree_dir, "haproxy.cfg", CHECK_TIMEOUT);
    run.extra_read = allowed.iter().map(PathBuf::from).collect();
    run.extra_exec = exec.to_vec();
    run.env = env.to_vec();
    let failed = |output: String| CheckFailed { output };
    let out = match tokio::task::spawn_blocking(move || haptic_sandbox::run(run)).await {
        Err(e) => return Err(failed(format!("the check task failed: {e}"))),
        Ok(Err(e)) => return Err(failed(e.to_string())),
        Ok(Ok(out)) => out,
    };
    let ending = match out.end {
        End::Exited(s) => Ending::Exited(s),
        End::TimedOut(d) => Ending::TimedOut(d),
        End::TooMuchOutput(n) => Ending::TooMuchOutput(n),
    };
    summarize(Checked::Config, ending, &out.output, Some(&tree_dir.to_string_lossy()))
        .into_result()
        .map(|warnings| warnings.iter().map(ToString::to_string).collect())
        .map_err(failed)
}

/// The variables a check of the pod's config gets: the pod's environment as the agent has it (a
/// config may name them, `bind "${ADDR}"`, and the HAProxy beside the agent has the same pod
/// variables), without the agent's own settings (`HAPTIC_AGENT_*`, its flags' variables) and
/// without `PATH` (the check's is fixed).
pub fn haproxy_env(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Vec<(OsString, OsString)> {
    vars.into_iter()
        .filter(|(k, _)| {
            let k = k.as_encoded_bytes();
            k != b"PATH" && !k.starts_with(b"HAPTIC_AGENT_")
        })
        .collect()
}

/// Best-effort pre-check of the TCP ports a reload of `new_cfg` would newly bind (ports
/// `old_cfg` does not listen on). A port another socket already holds makes HAProxy pause every
/// listener for about two seconds of bind retries and then fail the reload (seen on 2.6 and 3.0), so such a
/// config is refused up front. The probe binds the way HAProxy does on Linux (`SO_REUSEADDR` and
/// `SO_REUSEPORT`), so a port other HAProxy processes share is not a conflict. Only "address in
/// use" counts; anything else is left to HAProxy.
pub fn precheck_binds(old_cfg: &str, new_cfg: &str) -> Result<(), CheckFailed> {
    use haptic_haproxy::cfg;
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    let busy: Vec<String> = cfg::new_tcp_binds(&cfg::parse(old_cfg), &cfg::parse(new_cfg))
        .into_iter()
        .map(|b| SocketAddr::new(b.ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), b.port))
        .filter(|addr| matches!(probe_bind(*addr), Err(e) if e.kind() == std::io::ErrorKind::AddrInUse))
        .map(|addr| addr.to_string())
        .collect();
    if busy.is_empty() {
        return Ok(());
    }
    Err(CheckFailed {
        output: format!(
            "bind pre-check: {} already in use by another socket; a reload would pause every listener \
             for ~2 s of bind retries and then fail",
            busy.join(", ")
        ),
    })
}

/// Binds (and at once releases) a listening socket on `addr` with HAProxy's socket options.
fn probe_bind(addr: std::net::SocketAddr) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    s.listen(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On every HAProxy version: a tree whose config loads a file outside the tree is refused
    /// without the file's content in the output; the same config loading a file inside passes.
    #[tokio::test]
    async fn the_check_reads_nothing_outside_the_tree() {
        let base = tempfile::tempdir().unwrap();
        let secret = base.path().join("token");
        std::fs::write(&secret, "s3cr3t-value\n").unwrap();
        let tree = base.path().join("tree");
        std::fs::create_dir_all(tree.join("acl")).unwrap();
        std::fs::write(tree.join("acl/ips.lst"), "10.0.0.1\n").unwrap();
        let cfg = |file: &str| {
            format!(
                "global\n    default-path config\ndefaults\n    mode http\n    timeout connect 1s\n    \
                 timeout client 1s\n    timeout server 1s\nfrontend f\n    bind 127.0.0.1:8080\n    \
                 acl x src -f {file}\n    http-request deny if x\n"
            )
        };
        for bin in haptic_e2e::haproxy_bins() {
            std::fs::write(tree.join("haproxy.cfg"), cfg(&secret.display().to_string())).unwrap();
            let e = check_tree(&bin.path, &tree, &[], &[], &[]).await.unwrap_err();
            assert!(e.output.contains("[ALERT]") && !e.output.contains("s3cr3t"), "{}: {}", bin.label(), e.output);
            std::fs::write(tree.join("haproxy.cfg"), cfg("acl/ips.lst")).unwrap();
            assert_eq!(check_tree(&bin.path, &tree, &[], &[], &[]).await, Ok(vec![]), "{}", bin.label());
        }
    }

    /// On every HAProxy version: a config binding an address from an environment variable
    /// passes only when the check is given that variable (as the HAProxy that loads it has it).
    #[tokio::test]
    async fn the_check_sees_the_variables_it_is_given() {
        let tree = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cfg = "defaults\n    mode http\n    timeout connect 1s\n    timeout client 1s\n    \
                   timeout server 1s\nfrontend f\n    bind \"127.0.0.1:${FRONT_PORT}\"\n";
        std::fs::write(tree.path().join("haproxy.cfg"), cfg).unwrap();
        let env = haproxy_env([("FRONT_PORT".into(), port.to_string().into())]);
        for bin in haptic_e2e::haproxy_bins() {
            let e = check_tree(&bin.path, tree.path(), &[], &[], &[]).await.unwrap_err();
            assert!(e.output.contains("[ALERT]"), "{}: {}", bin.label(), e.output);
            assert_eq!(check_tree(&bin.path, tree.path(), &[], &[], &env).await, Ok(vec![]), "{}", bin.label());
        }
    }

    #[test]
    fn the_check_gets_the_pods_variables_but_not_the_agents_settings_or_path() {
        let vars = [
            ("PORT", "8443"),
            ("HAPTIC_AGENT_CREDENTIALS_FILE", "/c"),
            ("PATH", "/x"),
            ("HAPTIC_AGENT_POD_NAME", "p"),
            ("HAPTIC_BENCH_PORT", "9000"),
        ];
        let env = haproxy_env(vars.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
        let names: Vec<&str> = env.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(names, ["PORT", "HAPTIC_BENCH_PORT"]);
    }

    #[test]
    fn a_port_held_by_another_socket_is_refused() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let old = "frontend f\n  bind 127.0.0.1:1\n";
        let new = format!("frontend f\n  bind 127.0.0.1:1\n  bind 127.0.0.1:{port}\n");
        let err = precheck_binds(old, &new).unwrap_err();
        assert!(err.output.contains(&format!("127.0.0.1:{port}")), "{}", err.output);
        // A port the running config already listens on is HAProxy's own: not checked.
        assert_eq!(precheck_binds(&new, &new), Ok(()));
        drop(held);
        assert_eq!(precheck_binds(old, &new), Ok(()));
        // A port shared with SO_REUSEPORT (as HAProxy binds) is not a conflict: HAProxy can bind it too.
        let shared = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        shared.set_reuse_port(true).unwrap();
        shared.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], port)).into()).unwrap();
        shared.listen(1).unwrap();
        assert_eq!(precheck_binds(old, &new), Ok(()));
    }
}
