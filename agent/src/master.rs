//! Async client of HAProxy's master CLI socket.
//!
//! This module owns the wire exchange with the master CLI: one connection per command, write the
//! line (and payload), half-close (`shutdown(SHUT_WR)`, without which the master never closes),
//! read until EOF, all under a timeout. One command per connection also sidesteps HAProxy 2.6's
//! replies that lack the blank-line terminator. It knows nothing of what commands look like nor
//! what replies *mean*; that is `haptic_haproxy::cli`, used by `reload` and `runtime`.
//!
//! It must never send signals, never keep a connection open between commands (a session opened
//! before a reload keeps talking to the old worker, and 2.6 allows only 10 master connections), and
//! never send a payload that contains a blank line or exceeds [`MAX_PAYLOAD`].

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use haptic_haproxy::cli::command;
pub use haptic_haproxy::cli::command::MAX_PAYLOAD;

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
}

impl CliError {
    /// Whether this looks like "the master is busy reloading or gone" rather than a reply problem:
    /// a refused, reset or missing socket (2.6 refuses or resets connections during a reload).
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
            CliError::Timeout => false,
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

    /// Runs `cmd` on the current worker (`@1 <cmd>`, no severity tags) and returns its raw reply.
    pub async fn worker(&self, cmd: &str) -> Result<String, CliError> {
        self.send(&command::worker(cmd), self.timeout).await
    }

    /// Whether the master answers `show version` within the timeout (used by `/readyz`).
    pub async fn ping(&self) -> bool {
        matches!(self.master(command::SHOW_VERSION).await, Ok(reply) if !reply.trim().is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
