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
//! - [`pcap`]: link middleware that captures what a link carries into a
//!   pcap file, each message in an Ethernet frame as the `ether` stack
//!   sends it.
//!
//! Stacks are found by name through [`by_name`], or [`build`] with the
//! options a configuration file gives (interface, LTL underneath, address).

#![deny(missing_docs)]

pub mod alloc;
pub mod datagram;
pub mod ether;
pub mod inproc;
pub mod ltl;
pub mod pcap;
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

/// How a stack that sits on a network interface is set up, from a
/// daemon's configuration; stacks over sockets ignore it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackOptions {
    /// The interface (`ether`, `smoltcp`, `dpdk`).
    pub interface: Option<String>,
    /// `ether`, `dpdk`: LTL underneath (reliable, ordered links).
    pub reliable: bool,
    /// `smoltcp`: its own IPv4 address and prefix length.
    pub address: Option<(std::net::Ipv4Addr, u8)>,
    /// `smoltcp`: UDP links instead of TCP.
    pub datagrams: bool,
    /// `udp`, `ltl`: the largest datagram; `ether`, `dpdk`: the MTU.
    pub mtu: Option<usize>,
    /// `udp`: segmentation and receive offload (GSO/GRO); `None` keeps the
    /// stack's default (on).
    pub gso: Option<bool>,
    /// `udp`, `ltl`: io_uring instead of epoll (opening a socket fails
    /// where the kernel refuses io_uring).
    pub io_uring: bool,
    /// `dpdk`: the EAL's arguments, the vdevs among them; empty: one
    /// `net_af_packet` vdev on the kernel interface `interface`, no
    /// hugepages, one lcore.
    pub eal: Vec<String>,
}

/// The DPDK port the `dpdk` stack set up by `options` uses, and the EAL
/// arguments it starts with.
pub fn dpdk_port(options: &StackOptions) -> (String, Vec<String>) {
    if !options.eal.is_empty() {
        return (
            options.interface.clone().unwrap_or_default(),
            options.eal.clone(),
        );
    }
    let iface = options.interface.clone().unwrap_or_default();
    let args = [
        "--no-huge".to_string(),
        "-m".into(),
        "512".into(),
        "--no-pci".into(),
        "--no-shconf".into(),
        "--no-telemetry".into(),
        format!("--file-prefix=uniplane-{}", std::process::id()),
        "-l".into(),
        "0".into(),
        "--log-level=lib.eal:error".into(),
        format!("--vdev=net_af_packet0,iface={iface}"),
    ];
    ("net_af_packet0".into(), args.to_vec())
}

/// A new instance of the stack called `name` set up by `options`, or
/// `None` for an unknown name.
pub fn build(name: &str, options: &StackOptions) -> Option<Arc<dyn Stack>> {
    let ether = || {
        let d = ether::EtherConfig::default();
        ether::EtherConfig {
            interface: options.interface.clone(),
            reliable: options.reliable,
            mtu_hint: options.mtu.unwrap_or(d.mtu_hint),
            ..d
        }
    };
    let udp = || {
        let d = udp::UdpConfig::default();
        let gso = options.gso.unwrap_or(d.gso);
        udp::UdpConfig {
            backend: if options.io_uring {
                udp::Backend::IoUring
            } else {
                d.backend
            },
            max_datagram: options.mtu.unwrap_or(d.max_datagram),
            gso,
            gro: gso,
            ..d
        }
    };
    match name {
        "udp" => Some(Arc::new(udp::UdpStack::with_config(udp()))),
        "ltl" => Some(Arc::new(ltl::LtlStack::with_config(
            ltl::LtlConfig::default(),
            udp(),
        ))),
        "ether" => Some(Arc::new(ether::EtherStack::with_config(ether()))),
        "smoltcp" => {
            let mut host = uniplane_smoltcp::HostConfig::default();
            if let Some((addr, prefix_len)) = options.address {
                host.addr = addr;
                host.prefix_len = prefix_len;
            }
            Some(Arc::new(uniplane_smoltcp::SmoltcpStack::with_config(
                uniplane_smoltcp::SmoltcpConfig {
                    interface: options.interface.clone(),
                    host,
                    transport: if options.datagrams {
                        uniplane_smoltcp::Transport::Udp
                    } else {
                        uniplane_smoltcp::Transport::Tcp
                    },
                },
            )))
        }
        #[cfg(feature = "dpdk")]
        "dpdk" => {
            let (port, eal_args) = dpdk_port(options);
            Some(Arc::new(Renamed(
                "dpdk",
                ether::EtherStack::with_opener(
                    ether::EtherConfig {
                        interface: Some(port),
                        ..ether()
                    },
                    uniplane_dpdk::DpdkOpener {
                        eal_args,
                        config: uniplane_dpdk::DpdkConfig {
                            pool_mbufs: 2047,
                            ..uniplane_dpdk::DpdkConfig::default()
                        },
                    },
                ),
            )))
        }
        other => by_name(other),
    }
}

/// A stack under another name: `dpdk` is the `ether` stack on DPDK ports,
/// and a configuration finds it by the name it gave.
#[cfg(feature = "dpdk")]
struct Renamed<S>(&'static str, S);

#[cfg(feature = "dpdk")]
impl<S: Stack> Stack for Renamed<S> {
    fn name(&self) -> &'static str {
        self.0
    }

    fn capabilities(&self) -> uniplane_dataplane::Capabilities {
        self.1.capabilities()
    }

    fn connect(
        &self,
        peer: &uniplane_dataplane::Locator,
    ) -> uniplane_dataplane::StackFuture<'_, uniplane_dataplane::BoxLink> {
        self.1.connect(peer)
    }

    fn listen(
        &self,
        local: &uniplane_dataplane::Locator,
    ) -> uniplane_dataplane::StackFuture<'_, uniplane_dataplane::BoxListener> {
        self.1.listen(local)
    }
}

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
