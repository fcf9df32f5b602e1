//! Co-simulation of uniplane's RTL.
//!
//! Rust drives a Verilator model of `hw/rtl/uniplane_top.v` cycle by cycle
//! through a small C ABI (`csrc/shim.h`, built by `build.rs`):
//!
//! - [`Sim`] is the raw model: set inputs, evaluate, sample, tick.
//! - [`RtlDevice`] puts traffic around it (messages in, messages out, with
//!   idle and backpressure patterns) and an AXI-Lite master on its
//!   register port, and implements [`uniplane_overlay::ForwardingPlane`]
//!   over the register map, so the host programs the RTL exactly as it
//!   programs the software engine.
//! - [`RtlPlane`] runs the device as a forwarding plane: each attached
//!   port bridged to rings, control batches served every pass, on a
//!   thread of its own behind an [`RtlPlaneHandle`] (what the host daemon
//!   holds with `--plane rtl`).
//! - [`regs`] is the register map and the discovery of its
//!   self-describing blocks.
//!
//! See `docs/hw.md` for the data path, the register map and the
//! equivalence the tests check against `uniplane_overlay::Engine`.

#![deny(missing_docs)]

mod device;
mod ffi;
mod plane;
pub mod regs;
mod runtime;
mod sim;

pub use device::{beats_of, Accepted, BusError, Delivered, RtlDevice, Traffic};
pub use plane::{UnderlayCounters, UnderlayError};
pub use runtime::{RtlPlane, RtlPlaneConfig, RtlPlaneHandle, FEED_BEATS};
pub use sim::{AxilIn, AxilOut, Beat, Model, Sim, Stream};
