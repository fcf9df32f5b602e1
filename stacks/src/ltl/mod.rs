//! The `ltl` stack: a reliable, ordered transport in the spirit of
//! Catapult's Lightweight Transport Layer (Caulfield et al., MICRO'16),
//! over any [`DatagramPort`](crate::datagram::DatagramPort).
//!
//! - [`wire`]: the frame header, a checked zero-copy view with a CRC-32C.
//! - [`core`]: the sans-IO endpoint — connection table, sequence numbers,
//!   cumulative ACKs, NACKs with a selective bitmap, RFC 6298 timers,
//!   credit, setup, teardown, keepalives and peer-failure detection.
//! - [`cookie`]: the SYN cookies with which a listener answers a SYN without
//!   keeping anything until the handshake completes.
//! - the async driver (this module): one task per port runs the endpoint;
//!   links exchange messages with it in batches.

pub mod cookie;
pub mod core;
mod crc;
pub mod wire;

pub use self::core::{ConnError, ConnId, Event, LtlConfig, LtlEndpoint, LtlStats, Recv, SendError};
pub use cookie::COOKIE_EPOCH;
pub use crc::{crc32c, Crc32c};

mod driver;

pub use driver::{spawn_endpoint, Addr, LtlConnection, LtlHandle, LtlLink, LtlListener, LtlStack};
