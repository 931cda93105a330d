//! The floors: what any correct tool must do at least, done directly against a plain HAProxy
//! (durable writes, `haproxy -c`, master CLI commands and verified reloads), plus the read-backs
//! both sides are verified with. It must never go through the agent.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use haptic_e2e::{Haproxy, HaproxyBin, HaproxyOpts};

use crate::error::{BenchError, Result};
use crate::workload::map_chunks;

/// The largest payload per `add map` (the agent's limit: 12 KiB a chunk).
pub const MAX_PAYLOAD: usize = 12 * 1024;

/// Writes `bytes` to `path` durably: temp file, fsync, rename over, fsync of the directory.
pub fn durable_write(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("f")));
    let mut f = File::create(&tmp).map_err(BenchError::io(format!("create {}", tmp.display())))?;
    f.write_all(bytes).map_err(BenchError::io("write"))?;
    f.sync_all().map_err(BenchError::io("fsync"))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(BenchError::io("rename"))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(BenchError::io("fsync dir"))
}

/// A plain HAProxy (no agent) on a config in its own temp dir: the floor's target.
#[derive(Debug)]
pub struct Plain {
    /// The running HAProxy (killed on drop, before the dir is removed).
    pub hap: Haproxy,
    /// The directory holding `haproxy.cfg` and its aux files.
    pub dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Plain {
    /// Writes `files` (relative path → bytes) and starts HAProxy on `haproxy.cfg`.
    pub async fn start(bin: &HaproxyBin, files: &[(&str, &[u8])]) -> Result<Self> {
        let tmp =
            tempfile::Builder::new().prefix("haptic-bench-floor-").tempdir().map_err(BenchError::io("tempdir"))?;
        let dir = tmp.path().to_path_buf();
        for (p, b) in files {
            let path = dir.join(p);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(BenchError::io("mkdir"))?;
            }
            std::fs::write(&path, b).map_err(BenchError::io(format!("write {}", path.display())))?;
        }
        let hap = Haproxy::start(bin, HaproxyOpts::new(&dir)).await?;
        Ok(Self { hap, dir, _tmp: tmp })
    }

    /// The config path.
    pub fn cfg(&self) -> PathBuf {
        self.dir.join("haproxy.cfg")
    }
}

/// `haproxy -c -f haproxy.cfg` in `dir` (as the agent runs it); an error carries HAProxy's words.
pub async fn haproxy_check(bin: &Path, dir: &Path) -> Result<()> {
    let out = tokio::process::Command::new(bin)
        .arg("-c")
        .arg("-f")
        .arg("haproxy.cfg")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(BenchError::io("run haproxy -c"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BenchError::Unexpected(format!("haproxy -c failed: {}", String::from_utf8_lossy(&out.stderr))))
    }
}

/// `(addr, port)` of `backend/server` from `@1 show servers state <backend>`.
pub async fn server_addr(hap: &Haproxy, backend: &str, server: &str) -> Result<(String, u16)> {
    let text = hap.worker_cmd(&format!("show servers state {backend}")).await?;
    parse_server_addr(&text, server).ok_or_else(|| {
        BenchError::Unexpected(format!("server {backend}/{server} not in show servers state: {text:.300}"))
    })
}

/// Finds a server's address and port in `show servers state` output (columns named by its header).
pub fn parse_server_addr(text: &str, server: &str) -> Option<(String, u16)> {
    let header: Vec<&str> =
        text.lines().find(|l| l.starts_with("# be_id"))?.trim_start_matches("# ").split(' ').collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (n, a, p) = (col("srv_name")?, col("srv_addr")?, col("srv_port")?);
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(n) == Some(&server)).then(|| Some((f.get(a)?.to_string(), f.get(p)?.parse().ok()?)))?
    })
}

/// The `description` HAProxy's current worker reports (`@1 show info`).
pub async fn description(hap: &Haproxy) -> Result<String> {
    Ok(hap.show_info().await?.description().unwrap_or_default().to_string())
}

/// Payloads per master-CLI connection in the floor's map transaction: HAProxy's best case. The
/// agent sends one per connection, because HAProxy 3.4 once answered a second pipelined `add map`
/// itself ("Unknown command") under the propagate_routes bench case.
pub const PAYLOADS_PER_CONNECTION: usize = 32;

/// The floor of a map replacement: `prepare map`, chunked `add map @ver` payloads sent several to
/// a master-CLI connection (the fewest round trips HAProxy allows while still checking every
/// payload's reply before the commit), then `commit map`.
pub async fn map_transaction(hap: &Haproxy, name: &str, entries: &[(String, String)]) -> Result<()> {
    let reply = hap.worker_cmd(&format!("prepare map {name}")).await?;
    let ver: u32 = reply
        .split_whitespace()
        .last()
        .and_then(|v| v.parse().ok())
        .filter(|_| reply.contains("New version created"))
        .ok_or_else(|| BenchError::Unexpected(format!("prepare map: {reply}")))?;
    let chunks = map_chunks(entries, MAX_PAYLOAD);
    for group in chunks.chunks(PAYLOADS_PER_CONNECTION) {
        let mut data = String::new();
        for chunk in group {
            data.push_str(&format!("@1 add map @{ver} {name} <<\n{}\n\n", chunk.trim_end_matches('\n')));
        }
        // `cli_cmd` adds the final newline.
        data.pop();
        let reply = hap.master_cmd_timeout(&data, Duration::from_secs(30)).await?;
        if !reply.trim().is_empty() {
            return Err(BenchError::Unexpected(format!("add map: {reply:.300}")));
        }
    }
    let reply = hap.worker_cmd(&format!("commit map @{ver} {name}")).await?;
    if !reply.trim().is_empty() {
        return Err(BenchError::Unexpected(format!("commit map: {reply}")));
    }
    Ok(())
}

/// Every `key value` of a live map (`@1 show map <name>`), in HAProxy's order.
pub async fn show_map(hap: &Haproxy, name: &str) -> Result<Vec<(String, String)>> {
    let text = hap.master_cmd_timeout(&format!("@1 show map {name}"), Duration::from_secs(60)).await?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ' ');
            let _ptr = f.next()?;
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect())
}

/// `sha256sum` over `files` in `dir`; returns `(relative path, hex digest)` per file.
pub fn sha256sum(dir: &Path, files: &[String]) -> Result<Vec<(String, String)>> {
    let out = Command::new("sha256sum")
        .args(files)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(BenchError::io("run sha256sum"))?;
    if !out.status.success() {
        return Err(BenchError::Unexpected(format!("sha256sum: {}", String::from_utf8_lossy(&out.stderr))));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (d, p) = l.split_once("  ")?;
            Some((p.to_string(), d.to_string()))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_show_servers_state() {
        let text = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n\
                    3 be_0 1 s0 127.0.0.2 2 0 100 100 5 1 0 2 0 0 0 0 - 8081 - 0 0 - - 0\n\
                    3 be_0 2 s1 127.0.0.1 2 0 100 100 5 1 0 2 0 0 0 0 - 9 - 0 0 - - 0\n\n";
        assert_eq!(parse_server_addr(text, "s0"), Some(("127.0.0.2".into(), 8081)));
        assert_eq!(parse_server_addr(text, "s1"), Some(("127.0.0.1".into(), 9)));
        assert_eq!(parse_server_addr(text, "s9"), None);
    }

    #[test]
    fn durable_write_replaces_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("haproxy.cfg");
        durable_write(&p, b"one").unwrap();
        durable_write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
