//! The controller crate's one error type.
//!
//! Owns [`Error`], the failures the controller's library surface reports to `main.rs` and to
//! tests. It must never carry transient per-pod failures (those are status, not errors).

use std::path::PathBuf;

/// Everything that can go wrong at the controller's boundary.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory could not be read or written. The I/O error is part of the message,
    /// not a `source`, so a printed chain says it once.
    #[error("{}: {cause}", .path.display())]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        cause: std::io::Error,
    },
    /// A setting is unusable; names the flag (or environment variable) it came from.
    #[error("{flag}: {inner}")]
    Flag {
        /// The flag, e.g. `--credentials-file`.
        flag: &'static str,
        /// What is wrong with it.
        inner: Box<Error>,
    },
    /// A render directory does not form a valid render.
    #[error("render {dir}: {why}")]
    ConfigDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        why: String,
    },
    /// A credentials file is unusable.
    #[error("{path}: {why}")]
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
    pub fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        Error::Io { path: path.into(), cause }
    }

    /// Names the flag a bad setting came from.
    pub fn flag(flag: &'static str) -> impl FnOnce(Error) -> Error {
        move |inner| Error::Flag { flag, inner: Box::new(inner) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cause_is_said_once_and_the_flag_is_named() {
        let e = Error::io("/x/creds", std::io::Error::from(std::io::ErrorKind::NotFound));
        let e = Error::flag("--credentials-file")(e);
        let chain = format!("{:#}", anyhow::Error::from(e));
        assert_eq!(chain.matches("not found").count(), 1, "{chain}");
        assert!(chain.starts_with("--credentials-file: /x/creds: "), "{chain}");
    }
}
