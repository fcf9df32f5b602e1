//! uniplane's transports, each behind the [`Stack`](uniplane_dataplane::Stack)
//! and [`Link`](uniplane_dataplane::Link) traits.
//!
//! - [`inproc`]: in-process links over bounded lock-free queues (the stack
//!   named `mem` in configurations).
//! - [`udp`]: overlay messages packed into UDP datagrams; unreliable,
//!   unordered; epoll (`recvmmsg`/`sendmmsg`, GSO/GRO) or io_uring.
//! - [`tcp`]: overlay messages framed on TCP streams; reliable, ordered.
//! - [`ltl`]: a reliable, ordered transport in the spirit of Catapult's
//!   Lightweight Transport Layer, over any [`datagram::DatagramPort`].
//! - [`datagram`]: the frame-level port trait datagram stacks share, and a
//!   seeded impaired path for tests.
//! - [`ether`]: overlay messages directly in Ethernet frames over the
//!   frame layer (`uniplane-frame`), unreliable or with LTL underneath;
//!   `dpdk` (feature `dpdk`) is the same stack on DPDK ports.
//! - `smoltcp` (crate `uniplane-smoltcp`): TCP and UDP from a user-space
//!   TCP/IP stack on the frame layer.
//! - `shm` ([`uniplane_shm::ShmStack`]): links between processes of one
//!   server over shared-memory rings; the locator is a Unix socket path.
//!
//! Stacks are found by name through [`by_name`], which is how configuration
//! files pick them.

#![deny(missing_docs)]

pub mod alloc;
pub mod datagram;
pub mod ether;
pub mod inproc;
pub mod ltl;
pub mod tcp;
pub mod udp;

use std::sync::Arc;

use uniplane_dataplane::Stack;

/// Names of the stacks this build provides.
#[cfg(not(feature = "dpdk"))]
pub const STACK_NAMES: &[&str] = &["mem", "udp", "tcp", "ltl", "ether", "smoltcp", "shm"];
/// Names of the stacks this build provides.
#[cfg(feature = "dpdk")]
pub const STACK_NAMES: &[&str] = &[
    "mem", "udp", "tcp", "ltl", "ether", "smoltcp", "shm", "dpdk",
];

/// A new instance of the stack called `name`, or `None` for an unknown name.
pub fn by_name(name: &str) -> Option<Arc<dyn Stack>> {
    match name {
        "mem" => Some(Arc::new(inproc::InProcessStack::new())),
        "ltl" => Some(Arc::new(ltl::LtlStack::new())),
        "udp" => Some(Arc::new(udp::UdpStack::new())),
        "tcp" => Some(Arc::new(tcp::TcpStack::new())),
        "ether" => Some(Arc::new(ether::EtherStack::new())),
        "smoltcp" => Some(Arc::new(uniplane_smoltcp::SmoltcpStack::new())),
        "shm" => Some(Arc::new(uniplane_shm::ShmStack::new())),
        #[cfg(feature = "dpdk")]
        "dpdk" => Some(Arc::new(ether::EtherStack::with_opener(
            ether::EtherConfig::default(),
            uniplane_dpdk::DpdkOpener::default(),
        ))),
        _ => None,
    }
}
