//! [`ClientError`]: why a client call failed.

use uniplane_dataplane::wire::Status;
use uniplane_dataplane::LinkError;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon could not be reached.
    #[error("cannot reach uniplaned at {path}: {source}")]
    Unreachable {
        /// The socket tried.
        path: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The daemon answered with an error.
    #[error("{kind}: {message}")]
    Daemon {
        /// Machine-readable kind.
        kind: String,
        /// What happened.
        message: String,
    },
    /// The daemon's answer made no sense.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The data path failed.
    #[error("data path: {0}")]
    Link(#[from] LinkError),
    /// An operation got an error completion.
    #[error("request failed: {0:?}")]
    Status(Status),
    /// No answer came in time.
    #[error("timed out")]
    Timeout,
    /// The runtime directory is not safe: another user could have put the
    /// control socket there.
    #[error(transparent)]
    RuntimeDir(#[from] crate::RuntimeDirError),
}
