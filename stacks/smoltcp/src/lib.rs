//! The `smoltcp` stack: TCP and UDP from the smoltcp crate, a user-space
//! TCP/IP stack, running on uniplane's frame layer (`AF_PACKET` rings,
//! TAP, or DPDK), so the overlay can reach a server's kernel TCP without
//! the local kernel's stack.
//!
//! - [`phy::Phy`]: smoltcp's `phy::Device` over any
//!   [`FrameDevice`](uniplane_frame::FrameDevice), lending the device's
//!   own slots (no allocation or copy per frame in the glue).
//! - [`host::Host`]: an interface (MAC, IPv4 address, routes) with its
//!   sockets, driven by one task; [`host::TcpLink`] frames messages on a
//!   TCP stream, [`host::UdpLink`] packs them into datagrams.
//! - [`SmoltcpStack`]: the [`Stack`] that opens the host on the configured
//!   interface on first use and carries links over TCP (default) or UDP.
//!
//! The host needs an address of its own: on an interface the local kernel
//! also uses, give smoltcp another IP and (by default) the interface's
//! MAC, or a MAC of its own with [`PacketConfig::promiscuous`](uniplane_frame::packet::PacketConfig)
//! on a real NIC.

#![deny(missing_docs)]

pub mod host;
pub mod phy;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use uniplane_dataplane::{
    BoxLink, BoxListener, Capabilities, Locator, Stack, StackError, StackFuture,
};
use uniplane_frame::{packet::ETH_P_ALL, DeviceOpener, PacketOpener};

pub use host::{
    Host, HostConfig, HostStats, TcpLink, TcpListener, TcpSocketIo, UdpLink, UdpListener, UdpPeerIo,
};

/// Which transport links use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// Reliable, ordered: messages framed on a TCP stream.
    #[default]
    Tcp,
    /// Unreliable: messages packed into UDP datagrams.
    Udp,
}

/// How the `smoltcp` stack is set up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmoltcpConfig {
    /// The interface smoltcp takes frames from; required before use.
    pub interface: Option<String>,
    /// The host's addresses and buffers.
    pub host: HostConfig,
    /// TCP or UDP links.
    pub transport: Transport,
}

/// The `smoltcp` stack over devices `O` opens (`AF_PACKET` by default).
pub struct SmoltcpStack<O: DeviceOpener = PacketOpener> {
    config: SmoltcpConfig,
    opener: O,
    host: Mutex<Option<Arc<Host<O::Device>>>>,
}

impl Default for SmoltcpStack {
    fn default() -> Self {
        Self::new()
    }
}

impl SmoltcpStack {
    /// A stack with the default configuration (no interface yet: every
    /// operation fails until one is configured).
    pub fn new() -> Self {
        Self::with_config(SmoltcpConfig::default())
    }

    /// A stack over `AF_PACKET` configured by `config`.
    pub fn with_config(config: SmoltcpConfig) -> Self {
        Self::with_opener(config, PacketOpener::default())
    }
}

impl<O: DeviceOpener> SmoltcpStack<O> {
    /// A stack configured by `config` over devices `opener` opens.
    pub fn with_opener(config: SmoltcpConfig, opener: O) -> Self {
        SmoltcpStack {
            config,
            opener,
            host: Mutex::new(None),
        }
    }

    /// The running host, started on first use; must be called inside a
    /// tokio runtime.
    pub fn host(&self) -> Result<Arc<Host<O::Device>>, StackError> {
        let mut g = self.host.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = &*g {
            return Ok(h.clone());
        }
        let iface = self.config.interface.as_deref().ok_or_else(|| {
            StackError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "smoltcp: no interface configured",
            ))
        })?;
        let dev = self.opener.open(iface, ETH_P_ALL)?;
        let h = Arc::new(Host::spawn(dev, self.config.host.clone())?);
        *g = Some(h.clone());
        Ok(h)
    }

    fn socket_addr(locator: &Locator) -> Result<SocketAddr, StackError> {
        match locator {
            Locator::Socket(s) => Ok(*s),
            other => Err(StackError::UnsupportedLocator {
                stack: "smoltcp",
                locator: other.clone(),
            }),
        }
    }
}

impl<O: DeviceOpener> Stack for SmoltcpStack<O> {
    fn name(&self) -> &'static str {
        "smoltcp"
    }

    fn capabilities(&self) -> Capabilities {
        let tcp = self.config.transport == Transport::Tcp;
        Capabilities {
            reliable: tcp,
            ordered: tcp,
            mtu: if tcp {
                uniplane_dataplane::wire::EXTENDED_HEADER_LEN
                    + uniplane_dataplane::Message::MAX_PAYLOAD
            } else {
                1500 - 28
            },
            one_sided: tcp,
            max_connections: 1024,
        }
    }

    fn connect(&self, peer: &Locator) -> StackFuture<'_, BoxLink> {
        let peer = peer.clone();
        Box::pin(async move {
            let addr = Self::socket_addr(&peer)?;
            let host = self.host()?;
            match self.config.transport {
                Transport::Tcp => Ok(Box::new(host.connect_tcp(addr).await?) as BoxLink),
                Transport::Udp => Ok(Box::new(host.connect_udp(addr)?) as BoxLink),
            }
        })
    }

    fn listen(&self, local: &Locator) -> StackFuture<'_, BoxListener> {
        let local = local.clone();
        Box::pin(async move {
            let addr = Self::socket_addr(&local)?;
            let host = self.host()?;
            match self.config.transport {
                Transport::Tcp => {
                    let l = host.listen_tcp(addr.port())?;
                    Ok(Box::pin(futures_util::StreamExt::map(l, |r| {
                        r.map(|l| Box::new(l) as BoxLink)
                    })) as BoxListener)
                }
                Transport::Udp => {
                    let l = host.listen_udp(addr.port())?;
                    Ok(Box::pin(futures_util::StreamExt::map(l, |r| {
                        r.map(|l| Box::new(l) as BoxLink)
                    })) as BoxListener)
                }
            }
        })
    }
}
