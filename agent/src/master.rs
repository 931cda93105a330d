//! Async client of HAProxy's master CLI socket (FACTS §1).
//!
//! This module owns the wire exchange with the master CLI: one connection per command, write the
//! line (and payload), half-close (`shutdown(SHUT_WR)`, without which the master never closes),
//! read until EOF, all under a timeout. One command per connection also sidesteps HAProxy 2.6's
//! replies that lack the blank-line terminator. It knows nothing of what replies *mean*; that is
//! `reload` and `runtime`, through `haptic_haproxy::cli`.
//!
//! It must never send signals, never keep a connection open between commands (a session opened
//! before a reload keeps talking to the old worker, and 2.6 allows only 10 master connections), and
//! never send a payload that contains a blank line or exceeds [`MAX_PAYLOAD`].

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// The largest payload sent in one command (FACTS §1: 2.6 silently drops > 16 KB, 3.2.0 crashed).
pub const MAX_PAYLOAD: usize = 12 * 1024;

/// The largest reply read (a guard against a runaway reply; `show map <file>` is never read whole).
const MAX_REPLY: u64 = 64 * 1024 * 1024;

/// Why a master CLI exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The socket could not be connected (missing, refused: HAProxy 2.6 refuses during a reload).
    #[error("cannot connect to HAProxy master CLI {path}: {err}", path = .0.display(), err = .1)]
    Connect(PathBuf, #[source] io::Error),
    /// The master did not answer (and close) within the timeout.
    #[error("HAProxy master CLI did not answer in time")]
    Timeout,
    /// Writing or reading failed after connecting (e.g. reset during a 2.6 reload).
    #[error("HAProxy master CLI I/O error: {0}")]
    Io(#[source] io::Error),
    /// The payload cannot be sent as is (blank line, too large); nothing was sent.
    #[error("invalid CLI payload: {0}")]
    InvalidPayload(String),
}

impl CliError {
    /// Whether this looks like "the master is busy reloading or gone" rather than a reply problem:
    /// a refused, reset or missing socket (FACTS §2: 2.6 refuses or resets during a reload).
    pub fn is_unreachable(&self) -> bool {
        match self {
            CliError::Connect(..) => true,
            CliError::Io(e) => matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::NotFound
                    | io::ErrorKind::UnexpectedEof
            ),
            CliError::Timeout | CliError::InvalidPayload(_) => false,
        }
    }
}

/// A client of one master CLI socket. Cheap to clone; every call opens its own connection.
#[derive(Debug, Clone)]
pub struct MasterCli {
    socket: PathBuf,
    timeout: Duration,
}

impl MasterCli {
    /// A client of the master socket at `socket`; `timeout` bounds every ordinary command.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self { socket: socket.into(), timeout }
    }

    /// The master socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The timeout of ordinary commands.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `line` (a `\n` is appended when missing) as is and reads the reply until EOF.
    ///
    /// `line` may hold several `;`-separated commands and a `<<` payload; callers are responsible
    /// for its form. This is the one place that touches the socket.
    pub async fn send(&self, line: &str, timeout: Duration) -> Result<String, CliError> {
        let fut = async {
            let mut s =
                UnixStream::connect(&self.socket).await.map_err(|e| CliError::Connect(self.socket.clone(), e))?;
            let mut data = String::with_capacity(line.len() + 1);
            data.push_str(line);
            if !data.ends_with('\n') {
                data.push('\n');
            }
            s.write_all(data.as_bytes()).await.map_err(CliError::Io)?;
            s.shutdown().await.map_err(CliError::Io)?;
            let mut buf = Vec::new();
            (&mut s).take(MAX_REPLY).read_to_end(&mut buf).await.map_err(CliError::Io)?;
            Ok(String::from_utf8_lossy(&buf).into_owned())
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| CliError::Timeout)?
    }

    /// Runs a master command (e.g. `show proc`) and returns its raw reply.
    pub async fn master(&self, cmd: &str) -> Result<String, CliError> {
        self.send(cmd, self.timeout).await
    }

    /// Runs a master command with its own timeout (e.g. `reload` on ≥ 2.7, which answers when done).
    pub async fn master_timeout(&self, cmd: &str, timeout: Duration) -> Result<String, CliError> {
        self.send(cmd, timeout).await
    }

    /// Runs `cmd` on the current worker (`@1 <cmd>`) and returns its raw reply.
    pub async fn worker(&self, cmd: &str) -> Result<String, CliError> {
        self.send(&format!("@1 {cmd}"), self.timeout).await
    }

    /// Runs `@1 <cmd> <<` with `payload` (no blank lines, ≤ [`MAX_PAYLOAD`]) and returns the raw reply.
    pub async fn worker_payload(&self, cmd: &str, payload: &str) -> Result<String, CliError> {
        self.send(&payload_line(&format!("@1 {cmd}"), payload)?, self.timeout).await
    }

    /// Whether the master answers `show version` within the timeout (used by `/readyz`).
    pub async fn ping(&self) -> bool {
        matches!(self.master("show version").await, Ok(reply) if !reply.trim().is_empty())
    }
}

/// Builds `<cmd> <<\n<payload>\n\n`, refusing payloads HAProxy would cut short or choke on.
pub fn payload_line(cmd: &str, payload: &str) -> Result<String, CliError> {
    let body = payload.trim_end_matches(['\n', '\r']);
    if body.len() > MAX_PAYLOAD {
        return Err(CliError::InvalidPayload(format!("{} bytes is over the {MAX_PAYLOAD}-byte limit", body.len())));
    }
    if body.is_empty() || body.lines().any(|l| l.trim().is_empty()) {
        return Err(CliError::InvalidPayload("an empty payload, or a blank line that would end it early".into()));
    }
    Ok(format!("{cmd} <<\n{body}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_line_form() {
        assert_eq!(payload_line("@1 add map @1 m", "a 1\nb 2\n").unwrap(), "@1 add map @1 m <<\na 1\nb 2\n\n");
        assert_eq!(payload_line("x", "a").unwrap(), "x <<\na\n\n");
        assert!(matches!(payload_line("x", "a\n\nb"), Err(CliError::InvalidPayload(_))));
        assert!(matches!(payload_line("x", "a\n  \nb"), Err(CliError::InvalidPayload(_))));
        assert!(matches!(payload_line("x", ""), Err(CliError::InvalidPayload(_))));
        assert!(matches!(payload_line("x", &"k v\n".repeat(4000)), Err(CliError::InvalidPayload(_))));
    }

    #[tokio::test]
    async fn missing_socket_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let cli = MasterCli::new(dir.path().join("nope.sock"), Duration::from_secs(1));
        let err = cli.master("show proc").await.unwrap_err();
        assert!(err.is_unreachable(), "{err:?}");
        assert!(!cli.ping().await);
    }

    #[tokio::test]
    async fn half_closes_and_reads_to_eof() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = String::new();
            // Reads to EOF: only returns because the client half-closed.
            s.read_to_string(&mut got).await.unwrap();
            s.write_all(format!("echo:{got}").as_bytes()).await.unwrap();
        });
        let cli = MasterCli::new(&path, Duration::from_secs(5));
        assert_eq!(cli.worker("show info").await.unwrap(), "echo:@1 show info\n");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn silent_server_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            // Never answers nor closes, like a master that was not half-closed.
            let _keep = s;
            std::future::pending::<()>().await;
        });
        let cli = MasterCli::new(&path, Duration::from_millis(100));
        assert!(matches!(cli.master("show proc").await, Err(CliError::Timeout)));
        server.abort();
    }
}
