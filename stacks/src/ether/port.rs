//! [`EtherPort`]: the datagram port over raw Ethernet, so the LTL
//! transport runs unchanged on frames.
//!
//! ```text
//!  | dst MAC | src MAC | EtherType | length (16) | datagram … | padding |
//! ```
//!
//! The two-byte length makes the datagram's end explicit: a network card
//! pads frames shorter than 60 bytes with zeros, and an LTL frame must end
//! where its header says.

use std::io;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use uniplane_frame::eth::{self, EthernetFrame, MacAddr};
use uniplane_frame::{AsyncDevice, FrameDevice, RxQueue, TxQueue};

use crate::datagram::{Datagram, DatagramPort, PortStats, TxBatch};

/// Bytes of the length prefix.
pub const LENGTH_LEN: usize = 2;
/// Receive memory set aside at a time; datagrams are slices of it.
const RX_CHUNK: usize = 1 << 20;

/// Counters of an [`EtherPort`] beyond [`PortStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EtherPortStats {
    /// The common counters.
    pub port: PortStats,
    /// Frames dropped: wrong EtherType, too short, or a length that runs
    /// past the frame.
    pub malformed: u64,
}

/// Datagrams in Ethernet frames of one EtherType, on one device.
pub struct EtherPort<D: FrameDevice> {
    dev: AsyncDevice<D>,
    ethertype: u16,
    local: MacAddr,
    mtu: usize,
    rx_buf: BytesMut,
    stats: EtherPortStats,
}

impl<D: FrameDevice> EtherPort<D> {
    /// A port for frames of `ethertype` on `dev`; must be called inside a
    /// tokio runtime.
    pub fn new(dev: D, ethertype: u16) -> io::Result<Self> {
        let local = dev.mac();
        let mtu = dev.mtu();
        Ok(EtherPort {
            dev: AsyncDevice::new(dev)?,
            ethertype,
            local,
            mtu,
            rx_buf: BytesMut::new(),
            stats: EtherPortStats::default(),
        })
    }

    /// All counters.
    pub fn ether_stats(&self) -> EtherPortStats {
        self.stats
    }

    /// The device.
    pub fn device(&self) -> &D {
        self.dev.get_ref()
    }
}

/// The datagram a frame carries, if the frame is well formed.
pub(crate) fn datagram_of(frame: &[u8], ethertype: u16) -> Option<(MacAddr, &[u8])> {
    let e = EthernetFrame::new_checked(frame).ok()?;
    if eth::ethertype(&e) != ethertype {
        return None;
    }
    let src = eth::src(&e);
    let p = &frame[eth::HEADER_LEN..];
    if p.len() < LENGTH_LEN {
        return None;
    }
    let len = u16::from_be_bytes([p[0], p[1]]) as usize;
    let data = p.get(LENGTH_LEN..LENGTH_LEN + len)?;
    Some((src, data))
}

impl<D: FrameDevice> DatagramPort for EtherPort<D> {
    type Addr = MacAddr;

    fn local_addr(&self) -> MacAddr {
        self.local
    }

    fn max_datagram_size(&self) -> usize {
        self.mtu - LENGTH_LEN
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Datagram<MacAddr>>,
        max: usize,
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.dev.poll_rx(cx))?;
        let (rx, _) = self.dev.get_mut().queues();
        let mut n = 0;
        let mut bad = 0;
        let ethertype = self.ethertype;
        let buf = &mut self.rx_buf;
        while n < max {
            let got = rx.take(|f| match datagram_of(f, ethertype) {
                Some((peer, data)) => {
                    if buf.capacity() - buf.len() < data.len() {
                        *buf = BytesMut::with_capacity(RX_CHUNK.max(data.len()));
                    }
                    buf.extend_from_slice(data);
                    let bytes: Bytes = buf.split().freeze();
                    Some(Datagram { peer, data: bytes })
                }
                None => None,
            });
            match got {
                Some(Some(d)) => {
                    out.push(d);
                    n += 1;
                }
                Some(None) => bad += 1,
                None => break,
            }
        }
        self.stats.malformed += bad;
        self.stats.port.rx_datagrams += n as u64;
        self.stats.port.rx_calls += 1;
        if n == 0 {
            // Only bad frames: look again (the device may have more).
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Poll::Ready(Ok(n))
    }

    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut TxBatch<MacAddr>,
    ) -> Poll<io::Result<()>> {
        let src = self.local;
        let ethertype = self.ethertype;
        loop {
            let mut pushed = 0;
            {
                let (_, tx) = self.dev.get_mut().queues();
                while let Some((dst, data)) = batch.get(pushed) {
                    let len = eth::HEADER_LEN + LENGTH_LEN + data.len();
                    if len > tx.frame_capacity() {
                        // Larger than the device carries: lost, as on a wire.
                        pushed += 1;
                        continue;
                    }
                    let ok = tx.push(len, |f| {
                        eth::write_header(f, dst, src, ethertype);
                        let at = eth::HEADER_LEN;
                        f[at..at + LENGTH_LEN].copy_from_slice(&(data.len() as u16).to_be_bytes());
                        f[at + LENGTH_LEN..].copy_from_slice(data);
                    });
                    if ok.is_none() {
                        break;
                    }
                    pushed += 1;
                }
                tx.flush()?;
            }
            batch.mark_sent(pushed);
            self.stats.port.tx_datagrams += pushed as u64;
            self.stats.port.tx_calls += 1;
            if batch.is_empty() {
                return Poll::Ready(Ok(()));
            }
            std::task::ready!(self.dev.poll_tx_room(cx))?;
        }
    }

    fn stats(&self) -> PortStats {
        self.stats.port
    }
}
