//! What can go wrong in a test environment.

use std::path::PathBuf;

/// Errors of the test environment.
#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    /// A binary is missing.
    #[error("{name} not found at {path}: run scripts/test-env.sh first")]
    MissingBinary {
        /// The binary.
        name: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A process exited before it was ready.
    #[error("{name} exited before it was ready ({status}); last log lines:\n{log_tail}")]
    Exited {
        /// The process.
        name: String,
        /// Its exit status.
        status: String,
        /// The end of its log.
        log_tail: String,
    },
    /// A process did not become ready in time.
    #[error("{name} not ready after {secs}s; last log lines:\n{log_tail}")]
    Timeout {
        /// The process.
        name: String,
        /// Seconds waited.
        secs: u64,
        /// The end of its log.
        log_tail: String,
    },
    /// An API server with this name exists already.
    #[error("an API server named {0} exists already")]
    Duplicate(String),
    /// No API server has this name.
    #[error("no API server named {0}")]
    NoServer(String),
    /// Talking to an API server failed.
    #[error("{context}: {source}")]
    Kube {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: kube::Error,
    },
    /// A kubeconfig could not be built or loaded.
    #[error("kubeconfig for {name}: {message}")]
    Kubeconfig {
        /// The API server.
        name: String,
        /// What went wrong.
        message: String,
    },
}

/// Turns an I/O error into [`TestEnvError::Io`], saying what was being done.
pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestEnvError {
    let context = context.into();
    move |source| TestEnvError::Io { context, source }
}

impl TestEnvError {
    /// Whether the process exited because its port was taken.
    pub(super) fn port_taken(&self) -> bool {
        matches!(self, TestEnvError::Exited { log_tail, .. } if log_tail.contains("address already in use"))
    }
}
