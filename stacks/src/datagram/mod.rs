//! The datagram port: the frame layer under datagram stacks.
//!
//! A [`DatagramPort`] moves bursts of datagrams to and from peer addresses
//! and knows nothing of messages or connections, as Demikernel keeps the
//! frame layer apart from socket semantics. UDP implements it today (with an
//! epoll or an io_uring backend); raw Ethernet (AF_PACKET, DPDK) implements
//! it later with MAC addresses, and the LTL transport runs unchanged over
//! any of them.
//!
//! Bursts, not datagrams, are the unit: [`DatagramPort::poll_recv`] appends
//! many received datagrams, each a [`Bytes`] slice of one large receive
//! buffer, and [`DatagramPort::poll_send`] drains a [`TxBatch`], one
//! contiguous buffer holding many datagrams, in as few system calls as the
//! backend allows.

pub mod fault;

use std::fmt::Debug;
use std::hash::Hash;
use std::io;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};

/// One received datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram<A> {
    /// Who sent it.
    pub peer: A,
    /// Its bytes, usually a slice of a larger receive buffer.
    pub data: Bytes,
}

/// Datagrams waiting to be sent: one contiguous buffer and where each
/// datagram starts, so a backend can hand the kernel many of them (and
/// segmentation offload a run of equal-sized ones) in one call.
#[derive(Debug)]
pub struct TxBatch<A> {
    buf: BytesMut,
    /// Start offset and destination of every datagram, in order.
    items: Vec<(usize, A)>,
    /// Datagrams already handed to the kernel.
    sent: usize,
}

impl<A: Copy + Eq> TxBatch<A> {
    /// An empty batch with room for `bytes` bytes and `datagrams` datagrams
    /// before it first grows.
    pub fn with_capacity(bytes: usize, datagrams: usize) -> Self {
        TxBatch {
            buf: BytesMut::with_capacity(bytes),
            items: Vec::with_capacity(datagrams),
            sent: 0,
        }
    }

    /// Starts a new datagram to `dst`; write its bytes with
    /// [`TxBatch::buffer_mut`].
    pub fn push(&mut self, dst: A) {
        self.items.push((self.buf.len(), dst));
    }

    /// Lets `write` append one datagram to the buffer and name its
    /// destination; `None` appends nothing. Returns whether one was added.
    pub fn push_with(&mut self, write: impl FnOnce(&mut BytesMut) -> Option<A>) -> bool {
        let start = self.buf.len();
        match write(&mut self.buf) {
            Some(dst) => {
                self.items.push((start, dst));
                true
            }
            None => {
                self.buf.truncate(start);
                false
            }
        }
    }

    /// Appends a complete datagram to `dst`.
    pub fn push_datagram(&mut self, dst: A, data: &[u8]) {
        self.push(dst);
        self.buf.extend_from_slice(data);
    }

    /// The buffer the last datagram started with [`TxBatch::push`] is
    /// written to; everything appended belongs to that datagram.
    pub fn buffer_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes in the last datagram, or `None` when the batch is empty.
    pub fn last_len(&self) -> Option<usize> {
        self.items.last().map(|&(start, _)| self.buf.len() - start)
    }

    /// Destination of the last datagram.
    pub fn last_dst(&self) -> Option<A> {
        self.items.last().map(|&(_, dst)| dst)
    }

    /// Datagrams not yet sent.
    pub fn pending(&self) -> usize {
        self.items.len() - self.sent
    }

    /// Bytes not yet sent.
    pub fn pending_bytes(&self) -> usize {
        match self.items.get(self.sent) {
            Some(&(start, _)) => self.buf.len() - start,
            None => 0,
        }
    }

    /// Whether every datagram has been sent.
    pub fn is_empty(&self) -> bool {
        self.pending() == 0
    }

    /// The `i`-th unsent datagram: its destination and bytes.
    pub fn get(&self, i: usize) -> Option<(A, &[u8])> {
        let at = self.sent + i;
        let &(start, dst) = self.items.get(at)?;
        let end = self.items.get(at + 1).map_or(self.buf.len(), |&(s, _)| s);
        Some((dst, &self.buf[start..end]))
    }

    /// The bytes of `count` unsent datagrams from the `i`-th on, back to
    /// back as they lie in the buffer.
    pub fn run(&self, i: usize, count: usize) -> Option<&[u8]> {
        let at = self.sent + i;
        let last = at.checked_add(count)?.checked_sub(1)?;
        let &(start, _) = self.items.get(at)?;
        self.items.get(last)?;
        let end = self.items.get(last + 1).map_or(self.buf.len(), |&(s, _)| s);
        Some(&self.buf[start..end])
    }

    /// Marks the first `n` unsent datagrams as sent; the batch empties
    /// itself (keeping its memory) once all are.
    pub fn mark_sent(&mut self, n: usize) {
        self.sent = (self.sent + n).min(self.items.len());
        if self.sent == self.items.len() {
            self.clear();
        }
    }

    /// Forgets every datagram, keeping the memory.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.items.clear();
        self.sent = 0;
    }
}

/// Counters every port keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Datagrams sent.
    pub tx_datagrams: u64,
    /// Receive system calls (or ring submissions) that returned data.
    pub rx_calls: u64,
    /// Send system calls (or ring submissions).
    pub tx_calls: u64,
    /// Received datagrams dropped on purpose before delivery, by an
    /// impairment such as [`fault::LossyPort`]; they are counted in
    /// `rx_datagrams` too.
    pub rx_dropped: u64,
}

/// A frame-level port: bursts of datagrams to and from peer addresses.
///
/// Implementations never block: `Pending` means the kernel (or the device)
/// has nothing to give or no room to take, and the task will be woken.
pub trait DatagramPort: Send + Unpin + 'static {
    /// A peer address: a socket address for UDP, a MAC for raw Ethernet.
    type Addr: Copy + Eq + Hash + Debug + Send + Sync + Unpin + 'static;

    /// The address this port receives at.
    fn local_addr(&self) -> Self::Addr;

    /// Largest datagram payload the port sends and receives.
    fn max_datagram_size(&self) -> usize;

    /// Appends up to `max` received datagrams to `out`, `Ready(Ok(n))` with
    /// `n > 0`, or `Pending` when none is waiting.
    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Datagram<Self::Addr>>,
        max: usize,
    ) -> Poll<io::Result<usize>>;

    /// Sends datagrams from the front of `batch` until it is empty
    /// (`Ready(Ok(()))`) or the port is full (`Pending`, the rest kept).
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut TxBatch<Self::Addr>,
    ) -> Poll<io::Result<()>>;

    /// Counters so far.
    fn stats(&self) -> PortStats;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_keeps_datagram_boundaries_and_empties_when_sent() {
        let mut b: TxBatch<u8> = TxBatch::with_capacity(64, 4);
        b.push_datagram(1, b"abc");
        b.push(2);
        b.buffer_mut().extend_from_slice(b"de");
        b.buffer_mut().extend_from_slice(b"f");
        assert_eq!(b.pending(), 2);
        assert_eq!(b.last_len(), Some(3));
        assert_eq!(b.get(0), Some((1, &b"abc"[..])));
        assert_eq!(b.get(1), Some((2, &b"def"[..])));
        assert_eq!(b.run(0, 2), Some(&b"abcdef"[..]));
        assert_eq!(b.run(1, 2), None);
        b.mark_sent(1);
        assert_eq!(b.get(0), Some((2, &b"def"[..])));
        assert_eq!(b.pending_bytes(), 3);
        b.mark_sent(1);
        assert!(b.is_empty());
        assert_eq!(b.last_len(), None);
    }
}
