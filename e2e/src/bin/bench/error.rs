//! The bench's one error type: setup and I/O failures that stop a case (as opposed to a wrong
//! answer, which is a result with `correct: false`). It must never swallow HAProxy's words.

use haptic_e2e::HarnessError;

/// Why a case could not produce a result at all.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The HAProxy harness failed (start, CLI, reload).
    #[error(transparent)]
    Harness(#[from] HarnessError),
    /// An HTTP request to an agent or the controller failed.
    #[error("HTTP {what}: {source}")]
    Http {
        /// The request.
        what: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// A peer answered with an unexpected status or body.
    #[error("{0}")]
    Unexpected(String),
    /// Waiting for something exceeded its deadline.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The local Kubernetes control plane, or a request to it, failed.
    #[error("kubernetes: {0}")]
    Kubernetes(String),
}

impl BenchError {
    /// An I/O error with context.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| BenchError::Io { what, source }
    }

    /// An HTTP error with context.
    pub fn http(what: impl Into<String>) -> impl FnOnce(reqwest::Error) -> Self {
        let what = what.into();
        move |source| BenchError::Http { what, source }
    }
}

/// The bench's result type.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;
