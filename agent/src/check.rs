//! `haproxy -c` of a staged tree with the pod's own binary.
//!
//! Owns running the check with the tree directory as working directory (so relative paths under
//! `default-path config` resolve) and capturing HAProxy's words. It must never modify the tree
//! or talk to the running HAProxy.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// The longest a check may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a check failed: HAProxy's own output (its `[ALERT]` lines), or why it could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("haproxy -c failed: {output}")]
pub struct CheckFailed {
    /// HAProxy's stderr and stdout.
    pub output: String,
}

/// HAProxy's `[WARNING]` lines in `text`, without the `(pid)` that differs between runs. Pure.
pub fn warnings(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("[WARNING]")?.trim_start();
            // `(1234) : config : ...` -> `config : ...`
            let rest = match rest.strip_prefix('(').and_then(|r| r.split_once(')')) {
                Some((pid, r)) if pid.chars().all(|c| c.is_ascii_digit()) => {
                    r.trim_start().trim_start_matches(':').trim_start()
                }
                _ => rest,
            };
            Some(rest.to_string())
        })
        .collect()
}

/// Runs `<bin> -c -f haproxy.cfg` in `tree_dir`; `Ok` only on exit code 0, with HAProxy's
/// warnings (a valid config may still have some).
pub async fn check_tree(bin: &Path, tree_dir: &Path) -> Result<Vec<String>, CheckFailed> {
    let mut cmd = Command::new(bin);
    cmd.arg("-c")
        .arg("-f")
        .arg("haproxy.cfg")
        .current_dir(tree_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(CHECK_TIMEOUT, cmd.output()).await {
        Err(_) => return Err(CheckFailed { output: format!("haproxy -c did not finish within {CHECK_TIMEOUT:?}") }),
        Ok(Err(e)) => return Err(CheckFailed { output: format!("cannot run {}: {e}", bin.display()) }),
        Ok(Ok(out)) => out,
    };
    if out.status.success() {
        return Ok(warnings(&String::from_utf8_lossy(&out.stderr)));
    }
    let mut text = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.trim().is_empty() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(stdout.trim_end());
    }
    if text.is_empty() {
        text = format!("haproxy -c exited with {}", out.status);
    }
    Err(CheckFailed { output: text })
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

    #[test]
    fn warning_lines_lose_their_pid() {
        let text =
            "[NOTICE]   (1) : x\n[WARNING]  (2726) : config : parsing [haproxy.cfg:11] : a rule.\n[ALERT] (3) : y\n";
        assert_eq!(warnings(text), vec!["config : parsing [haproxy.cfg:11] : a rule.".to_string()]);
        assert!(warnings("").is_empty());
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
