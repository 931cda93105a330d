//! The agent crate's error type at its boundary.
//!
//! Owns [`AgentError`]: disk, state-file and setup failures that are not an answer to a client.
//! Client-facing refusals (400/409/422) are values of [`crate::apply::Refusal`], never this type.

use std::io;
use std::path::Path;

/// A failure of the agent itself (not a refusal of a request).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A file-system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The persisted state under `ROOT/.state` cannot be read.
    #[error("state file {path}: {why}")]
    State {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// The tree root is not initialised or is inconsistent.
    #[error("tree: {0}")]
    Tree(String),
    /// The credentials file is missing or malformed.
    #[error("credentials: {0}")]
    Credentials(String),
    /// The TLS certificate or key cannot be used.
    #[error("tls: {0}")]
    Tls(String),
}

impl AgentError {
    /// Wraps an I/O error with what was done to which path.
    pub fn io(what: &str, path: &Path, source: io::Error) -> Self {
        AgentError::Io { what: format!("{what} {}", path.display()), source }
    }
}

/// Adds context to `io::Result`s.
pub(crate) trait IoContext<T> {
    /// Wraps the error with `what` and `path`.
    fn ctx(self, what: &str, path: &Path) -> Result<T, AgentError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, what: &str, path: &Path) -> Result<T, AgentError> {
        self.map_err(|e| AgentError::io(what, path, e))
    }
}
