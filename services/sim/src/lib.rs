//! `uniplane-sim`: a deterministic simulation of a whole uniplane fabric.
//!
//! N servers, each the real sans-IO control core ([`uniplane_control::Control`])
//! and the real overlay engine, are driven on virtual time by one event
//! queue, connected by simulated peer channels and tunnels with latency,
//! bandwidth, loss, reordering, partitions, crashes and restarts. One
//! seed picks every random choice, so a seed is a replayable run. The
//! invariants are checked as the run goes; the first violation stops it
//! and the report carries the command that replays it. See `docs/sim.md`.

#![deny(missing_docs)]

pub mod config;
mod fabric;
mod plane;
pub mod report;
pub mod rng;

pub use crate::config::{Bug, Fault, SimConfig, Workload};
pub use crate::fabric::server_ip;
pub use crate::report::{Report, Violation};

/// Runs one simulation to its end and reports.
pub fn run(config: SimConfig) -> Report {
    fabric::Fabric::new(config).run()
}
