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

/// Runs `<bin> -c -f haproxy.cfg` in `tree_dir`; `Ok` only on exit code 0.
pub async fn check_tree(bin: &Path, tree_dir: &Path) -> Result<(), CheckFailed> {
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
        return Ok(());
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
