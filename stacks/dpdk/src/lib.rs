//! DPDK as a backend of uniplane's frame layer, behind the `dpdk` feature.
//!
//! The bindings are our own: bindgen reads DPDK 22.11's headers (Debian's
//! `libdpdk-dev`, found by pkg-config) at build time, and a small C shim
//! (`csrc/shim.c`) wraps the static-inline hot paths — `rte_eth_rx_burst`,
//! `rte_eth_tx_burst`, mbuf allocation and freeing — one call per burst.
//! The published `dpdk-sys` crate targets DPDK 17 (musl only) and does not
//! link against a current DPDK.
//!
//! - [`Eal`]: the environment abstraction layer, initialised once per
//!   process with the arguments given (`--no-huge -m 1024 --no-pci
//!   --file-prefix X --vdev=net_ring0` runs without hardware).
//! - [`DpdkDevice`]: one port, one queue pair, a mempool; implements
//!   [`FrameDevice`](uniplane_frame::FrameDevice) in poll mode: received
//!   frames are lent in place in their mbufs, transmitted ones are written
//!   in place into mbufs allocated in bulk.
//! - [`DpdkOpener`]: opens ports by name (`net_ring0`, `0000:01:00.0`) for
//!   the `ether` and `smoltcp` stacks.
//!
//! Without the feature the crate is empty and builds with nothing
//! installed.

#![deny(missing_docs)]

#[cfg(feature = "dpdk")]
mod device;
#[cfg(feature = "dpdk")]
mod eal;
#[cfg(feature = "dpdk")]
#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

#[cfg(feature = "dpdk")]
pub use device::{DpdkConfig, DpdkDevice, DpdkOpener, DpdkRx, DpdkTx};
#[cfg(feature = "dpdk")]
pub use eal::Eal;

/// Whether this build carries DPDK.
pub const ENABLED: bool = cfg!(feature = "dpdk");
