//! The controller crate's one error type.
//!
//! Owns [`Error`], the failures the controller's library surface reports to `main.rs` and to
//! tests. It must never carry transient per-pod failures (those are status, not errors).

use std::path::PathBuf;

/// Everything that can go wrong at the controller's boundary.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A render directory does not form a valid render.
    #[error("render {dir}: {why}")]
    Render {
        /// The directory.
        dir: PathBuf,
        /// Why.
        why: String,
    },
    /// A credentials file is unusable.
    #[error("credentials file {path}: {why}")]
    Credentials {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The fence state file is unusable.
    #[error("fence state {path}: {why}")]
    FenceState {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The gate could not run `haproxy -c` at all (not a refusal).
    #[error("gate: {0}")]
    Gate(String),
    /// An agent URL or HTTP client setting is invalid.
    #[error("agent client: {0}")]
    Client(String),
    /// The admin endpoint could not be reached or answered badly.
    #[error("admin {url}: {why}")]
    Admin {
        /// The URL asked.
        url: String,
        /// Why.
        why: String,
    },
}

impl Error {
    /// Wraps an I/O error with its path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}
