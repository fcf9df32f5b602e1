//! MPI-style collectives over uniplane (ACCL+ on DUA): communicators of
//! resources named by UID, eager and rendezvous transfers, and every MPI
//! collective on typed buffers.
//!
//! ```text
//!   rank 0 ─┐                    uniplaned                 ┌─ rank 2
//!   rank 1 ─┼─ sessions ══ shm ══ engine ══ shm ══ sessions ┼─ rank 3
//!           └─ one connection per pair of ranks, one-sided writes for rendezvous
//! ```
//!
//! Each rank is a session of the host daemon. Ranks find each other
//! through the daemon ([`world`]), keep one connection per pair, and move
//! every message eagerly (buffered at the receiver, flow-controlled by
//! credits) or, above a threshold tunable at run time, by rendezvous
//! (the receiver registers a memory window, the sender writes it
//! one-sided and says so). Collectives pick an algorithm per call from a
//! [`Tuning`] table by size and rank count.
//!
//! Calls also come in a streaming form ([`stream`]: input as chunks that
//! arrive over time, results segment by segment), and can be sent through
//! operator endpoints, each a resource with its own UID: a reduction
//! operator ([`operator`]) for allreduce and reduce, and a compression
//! pair ([`compress`]) for data messages.
//!
//! # Example
//!
//! ```no_run
//! # async fn example() -> Result<(), uniplane_collectives::Error> {
//! use uniplane_collectives::{world, Op};
//!
//! // Rank and size from uniplane-run, mpirun, Hydra or srun.
//! let comm = world::init().await?;
//! let sum = comm.allreduce(&[comm.rank() as i32, 1], Op::Sum).await?;
//! assert_eq!(sum[1], comm.size() as i32);
//! comm.finalize().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Run it with `uniplane-run -n 4 PROGRAM` (this crate's launcher) or any
//! MPI launcher, with `uniplaned` running.

#![deny(missing_docs)]

mod comm;
pub mod compress;
pub mod datatype;
mod endpoint;
pub mod frame;
pub mod operator;
pub mod stream;
pub mod transport;
pub mod tuning;
pub mod world;

pub use comm::Communicator;
pub use compress::{CompressionOperator, CompressionStats};
pub use datatype::{Datatype, Element, Op};
pub use operator::{OperatorStats, ReductionOperator};
pub use stream::ChunkStream;
pub use transport::Stats;
pub use tuning::{Algorithm, Collective, Rule, Tuning};
pub use world::{init, join, Options, WorldSpec};

use uniplane_client::ClientError;

/// Why a collective call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon or the data path refused or failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A peer did not answer in time.
    #[error("rank {peer} (world) did not send {what} in time")]
    Timeout {
        /// The peer's world rank.
        peer: usize,
        /// What was awaited.
        what: &'static str,
    },
    /// A peer's connection ended.
    #[error("rank {peer} (world) is gone: {reason}")]
    PeerGone {
        /// The peer's world rank.
        peer: usize,
        /// Why.
        reason: String,
    },
    /// A peer sent something this call did not expect (mismatched calls).
    #[error("protocol: {0}")]
    Protocol(String),
    /// Joining the world failed.
    #[error("setup: {0}")]
    Setup(String),
    /// The call's arguments are inconsistent.
    #[error("argument: {0}")]
    Argument(String),
}

#[cfg(test)]
mod tests {
    /// Applications link this crate: it must not pull in the daemon.
    #[test]
    fn the_crate_does_not_depend_on_the_daemon() {
        let manifest = include_str!("../Cargo.toml");
        let deps = manifest
            .split("[dependencies]")
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .unwrap_or_default();
        assert!(!deps.contains("uniplane-services"), "{deps}");
    }
}
