//! [`PgasError`]: why an operation failed.

use uniplane_client::ClientError;

use crate::Refusal;

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PgasError {
    /// The target refused the request; nothing was written.
    #[error("rank {rank} refused the request: {refusal}")]
    Refused {
        /// The target.
        rank: usize,
        /// Why.
        refusal: Refusal,
    },
    /// The client library failed (attach, listen, connect).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A connection to this rank closed.
    #[error("the connection to rank {0} closed")]
    Closed(usize),
    /// The endpoint has not joined a group yet.
    #[error("the endpoint has not joined a group")]
    NotJoined,
    /// The group has no such rank.
    #[error("the group has no rank {0}")]
    NoRank(usize),
    /// The endpoint's UID is not a member of the group it was to join.
    #[error("this endpoint is not a member of the group")]
    NotMember,
    /// The request cannot be sent as asked (a bad shape, too large,
    /// a reserved handler ID).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A deadline passed.
    #[error("timed out {0}")]
    Timeout(&'static str),
}
