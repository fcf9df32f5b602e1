//! The `ether` stack: overlay messages directly in Ethernet frames, with no
//! IP underneath, on any device of the frame layer (`AF_PACKET` rings by
//! default, TAP, or DPDK through the `dpdk` stack).
//!
//! - **EtherType** 0x88B5 (IEEE local experimental 1) by default; the
//!   reliable mode runs LTL in frames of a second EtherType, 0x88B6.
//! - **Jumbo-aware**: a frame carries as many messages as fit the
//!   device's MTU (1500, or 9000 on a jumbo interface); a message larger
//!   than the MTU is refused with [`LinkError::TooLarge`](uniplane_dataplane::LinkError).
//! - **Addresses**: `connect(Locator::Mac)` reaches a MAC on the configured
//!   interface; `connect(Locator::Socket(ip:port))` looks the server's IPv4
//!   up in the neighbour table (static entries, [`EtherStack::add_neighbour`]).
//!   `listen(Locator::Name(iface))` accepts links on an interface.
//! - **Unreliable** by default: a link per peer MAC, as lossy as the wire;
//!   frames that do not decode are counted in [`EtherStats::malformed`] and
//!   dropped whole. **Reliable** with [`EtherConfig::reliable`]: the LTL
//!   endpoint (the same sans-IO core as the `ltl` stack) over an
//!   [`EtherPort`], the datagram port of raw Ethernet.

mod link;
mod port;

pub use link::{EtherLink, EtherListener, EtherPeer, EtherStats};
pub use port::{EtherPort, EtherPortStats, LENGTH_LEN};

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};

use uniplane_dataplane::{
    BoxLink, BoxListener, Capabilities, Locator, Stack, StackError, StackFuture,
};
use uniplane_frame::eth::MacAddr;
use uniplane_frame::FrameDevice;
pub use uniplane_frame::{DeviceOpener, PacketOpener};

use crate::ltl::{spawn_endpoint, LtlConfig, LtlHandle};
use link::{Counters, SharedDevice};

/// Default EtherType of overlay messages (IEEE 802 local experimental 1,
/// 0x88B5).
pub const ETHERTYPE: u16 = libc::ETH_P_802_EX1 as u16;
/// Default EtherType of LTL frames (IEEE 802 local experimental 2,
/// 0x88B6: the one after the first; `libc` names only the first).
pub const LTL_ETHERTYPE: u16 = ETHERTYPE + 1;

/// How the `ether` stack behaves.
#[derive(Clone, Debug)]
pub struct EtherConfig {
    /// Interface `connect` uses; `None` takes the interface of the first
    /// `listen`.
    pub interface: Option<String>,
    /// EtherType of overlay messages.
    pub ethertype: u16,
    /// EtherType of LTL frames (reliable mode).
    pub ltl_ethertype: u16,
    /// Run LTL underneath: reliable, ordered links.
    pub reliable: bool,
    /// The LTL endpoint's configuration (its `max_frame` follows the MTU).
    pub ltl: LtlConfig,
    /// Pack many messages into one frame (unreliable mode).
    pub pack: bool,
    /// Server IPv4 → MAC, for `connect(Locator::Socket)`.
    pub neighbours: HashMap<Ipv4Addr, MacAddr>,
    /// Most peers one interface serves at once.
    pub max_connections: usize,
    /// The MTU the stack reports before a device is open.
    pub mtu_hint: usize,
}

impl Default for EtherConfig {
    fn default() -> Self {
        EtherConfig {
            interface: None,
            ethertype: ETHERTYPE,
            ltl_ethertype: LTL_ETHERTYPE,
            reliable: false,
            ltl: LtlConfig::default(),
            pack: true,
            neighbours: HashMap::new(),
            max_connections: 4096,
            mtu_hint: 1500,
        }
    }
}

/// What is open on one interface.
struct Iface<D: FrameDevice> {
    plain: Option<Arc<SharedDevice<D>>>,
    ltl: Option<Arc<LtlHandle<MacAddr>>>,
}

/// The `ether` stack over devices `O` opens (`AF_PACKET` by default).
pub struct EtherStack<O: DeviceOpener = PacketOpener> {
    config: EtherConfig,
    opener: O,
    ifaces: Mutex<HashMap<String, Iface<O::Device>>>,
    first_iface: Mutex<Option<String>>,
    neighbours: Mutex<HashMap<Ipv4Addr, MacAddr>>,
    counters: Arc<Counters>,
}

impl Default for EtherStack {
    fn default() -> Self {
        Self::new()
    }
}

impl EtherStack {
    /// An unreliable stack over `AF_PACKET` with the default configuration.
    pub fn new() -> Self {
        Self::with_config(EtherConfig::default())
    }

    /// A stack over `AF_PACKET` configured by `config`.
    pub fn with_config(config: EtherConfig) -> Self {
        Self::with_opener(config, PacketOpener::default())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ ((std::process::id() as u64) << 32)
}

impl<O: DeviceOpener> EtherStack<O> {
    /// A stack configured by `config` over devices `opener` opens.
    pub fn with_opener(config: EtherConfig, opener: O) -> Self {
        EtherStack {
            neighbours: Mutex::new(config.neighbours.clone()),
            config,
            opener,
            ifaces: Mutex::new(HashMap::new()),
            first_iface: Mutex::new(None),
            counters: Arc::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EtherConfig {
        &self.config
    }

    /// Adds (or replaces) a static neighbour: the server `ip` is at `mac`.
    pub fn add_neighbour(&self, ip: Ipv4Addr, mac: MacAddr) {
        lock(&self.neighbours).insert(ip, mac);
    }

    /// The MAC of server `ip`, if known.
    pub fn neighbour(&self, ip: Ipv4Addr) -> Option<MacAddr> {
        lock(&self.neighbours).get(&ip).copied()
    }

    /// Counters of the unreliable links.
    pub fn stats(&self) -> EtherStats {
        self.counters.snapshot()
    }

    fn connect_iface(&self) -> Result<String, StackError> {
        if let Some(i) = &self.config.interface {
            return Ok(i.clone());
        }
        lock(&self.first_iface).clone().ok_or_else(|| {
            StackError::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ether: no interface configured and none listening",
            ))
        })
    }

    fn peer_mac(&self, peer: &Locator) -> Result<MacAddr, StackError> {
        match peer {
            Locator::Mac(m) => Ok(MacAddr(*m)),
            Locator::Socket(sa) => match sa.ip() {
                IpAddr::V4(ip) => self
                    .neighbour(ip)
                    .ok_or_else(|| StackError::Refused(peer.clone())),
                IpAddr::V6(_) => Err(self.unsupported(peer)),
            },
            other => Err(self.unsupported(other)),
        }
    }

    fn unsupported(&self, locator: &Locator) -> StackError {
        StackError::UnsupportedLocator {
            stack: "ether",
            locator: locator.clone(),
        }
    }

    /// The unreliable endpoint of `iface`, opened on first use.
    fn plain(&self, iface: &str) -> Result<Arc<SharedDevice<O::Device>>, StackError> {
        let mut all = lock(&self.ifaces);
        let entry = all.entry(iface.to_owned()).or_insert(Iface {
            plain: None,
            ltl: None,
        });
        if let Some(ep) = &entry.plain {
            return Ok(ep.clone());
        }
        let dev = self.opener.open(iface, self.config.ethertype)?;
        let ep = SharedDevice::new(
            dev,
            self.config.ethertype,
            self.config.pack,
            self.config.max_connections,
            self.counters.clone(),
        )?;
        entry.plain = Some(ep.clone());
        Ok(ep)
    }

    /// The LTL endpoint of `iface`, started on first use.
    pub fn ltl_handle(&self, iface: &str) -> Result<Arc<LtlHandle<MacAddr>>, StackError> {
        let mut all = lock(&self.ifaces);
        let entry = all.entry(iface.to_owned()).or_insert(Iface {
            plain: None,
            ltl: None,
        });
        if let Some(h) = &entry.ltl {
            return Ok(h.clone());
        }
        let dev = self.opener.open(iface, self.config.ltl_ethertype)?;
        let port = EtherPort::new(dev, self.config.ltl_ethertype)?;
        let mut cfg = self.config.ltl.clone();
        cfg.max_frame = crate::datagram::DatagramPort::max_datagram_size(&port);
        let h = Arc::new(spawn_endpoint(port, cfg, seed()));
        entry.ltl = Some(h.clone());
        Ok(h)
    }

    fn note_iface(&self, iface: &str) {
        let mut f = lock(&self.first_iface);
        if f.is_none() {
            *f = Some(iface.to_owned());
        }
    }

    /// Opens an unreliable link to `peer` now; must be called inside a
    /// tokio runtime.
    pub fn connect_now(&self, peer: &Locator) -> Result<EtherLink<O::Device>, StackError> {
        let mac = self.peer_mac(peer)?;
        let iface = self.connect_iface()?;
        self.plain(&iface)?.attach(mac)
    }

    /// Listens for unreliable links on interface `iface`; must be called
    /// inside a tokio runtime.
    pub fn listen_now(&self, iface: &str) -> Result<EtherListener<O::Device>, StackError> {
        let l = self.plain(iface)?.listen()?;
        self.note_iface(iface);
        Ok(l)
    }

    /// The address of `iface` as the stack uses it (opening its device).
    pub fn local_mac(&self, iface: &str) -> Result<MacAddr, StackError> {
        if self.config.reliable {
            Ok(self.ltl_handle(iface)?.local_addr())
        } else {
            Ok(self.plain(iface)?.local_mac())
        }
    }

    fn iface_of(&self, local: &Locator) -> Result<String, StackError> {
        match local {
            Locator::Name(n) => Ok(n.clone()),
            other => Err(self.unsupported(other)),
        }
    }

    fn max_message(&self) -> usize {
        if self.config.reliable {
            self.config
                .mtu_hint
                .saturating_sub(LENGTH_LEN + crate::ltl::wire::HEADER_LEN)
        } else {
            self.config.mtu_hint
        }
    }
}

impl<O: DeviceOpener> Stack for EtherStack<O> {
    fn name(&self) -> &'static str {
        "ether"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reliable: self.config.reliable,
            ordered: self.config.reliable,
            mtu: self.max_message(),
            one_sided: self.config.reliable,
            max_connections: self.config.max_connections,
        }
    }

    fn connect(&self, peer: &Locator) -> StackFuture<'_, BoxLink> {
        let peer = peer.clone();
        Box::pin(async move {
            if !self.config.reliable {
                return self.connect_now(&peer).map(|l| Box::new(l) as BoxLink);
            }
            let mac = self.peer_mac(&peer)?;
            let iface = self.connect_iface()?;
            let h = self.ltl_handle(&iface)?;
            let link = h.connect(mac).await?;
            Ok(Box::new(link) as BoxLink)
        })
    }

    fn listen(&self, local: &Locator) -> StackFuture<'_, BoxListener> {
        let local = local.clone();
        Box::pin(async move {
            let iface = self.iface_of(&local)?;
            if self.config.reliable {
                let h = self.ltl_handle(&iface)?;
                self.note_iface(&iface);
                let l = h.listen();
                return Ok(Box::pin(futures_util::StreamExt::map(l, |r| {
                    r.map(|l| Box::new(l) as BoxLink)
                })) as BoxListener);
            }
            let l = self.listen_now(&iface)?;
            Ok(Box::pin(futures_util::StreamExt::map(l, |r| {
                r.map(|l| Box::new(l) as BoxLink)
            })) as BoxListener)
        })
    }
}
