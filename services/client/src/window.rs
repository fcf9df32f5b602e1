//! Memory windows: bytes of the application that peers WRITE to and READ
//! from by `uid@address`, served by the session's dispatcher.
//!
//! A session's windows share its UID's address space: the first starts at
//! address 0, each next one at the following 4 KiB boundary, so a single
//! window is addressed by plain offsets. A request must fall inside one
//! window; otherwise it is answered with [`Status::OutOfRange`] and no
//! byte changes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;
use uniplane_dataplane::wire::{Header, MemoryParams, Params, ReqType, Request, Status};
use uniplane_dataplane::{MemoryAddress, Message};

use crate::session::Shared;

/// Bytes of one window, shared by the application and the dispatcher.
pub(crate) type Memory = Arc<Mutex<Vec<u8>>>;

fn lock(memory: &Memory) -> MutexGuard<'_, Vec<u8>> {
    memory.lock().unwrap_or_else(|e| e.into_inner())
}

/// Windows are placed at multiples of this.
const ALIGN: u64 = 4096;

/// The windows of one session, by base address.
#[derive(Default)]
pub(crate) struct Windows {
    /// Base address → (length, bytes); the length is kept here so a
    /// lookup never locks a window's bytes under the session's lock.
    by_base: BTreeMap<u64, (usize, Memory)>,
    next_base: u64,
}

impl Windows {
    /// Places a zeroed window of `len` bytes; its base address and memory.
    fn add(&mut self, len: usize) -> (u64, Memory) {
        let base = self.next_base;
        let memory: Memory = Arc::new(Mutex::new(vec![0; len]));
        self.by_base.insert(base, (len, memory.clone()));
        let end = base.saturating_add(len as u64);
        self.next_base = end.div_ceil(ALIGN).saturating_mul(ALIGN).max(end);
        (base, memory)
    }

    fn remove(&mut self, base: u64) {
        self.by_base.remove(&base);
    }

    /// The window holding `len` bytes at `addr`, and `addr`'s offset in it.
    pub(crate) fn find(&self, addr: u64, len: usize) -> Option<(Memory, usize)> {
        let (base, (window_len, memory)) = self.by_base.range(..=addr).next_back()?;
        let offset = usize::try_from(addr - base).ok()?;
        let end = offset.checked_add(len)?;
        (end <= *window_len).then(|| (memory.clone(), offset))
    }
}

/// The answer to a peer's one-sided request for this session: WRTE →
/// WRTE_CMPL, READ → READ_CMPL with the bytes, FLSH → FLSH_CMPL; a range
/// outside every window → the completion with `OutOfRange`, nothing
/// touched; any other request → `BadRequest`. `find` looks a range up
/// (and must not hold a lock the caller needs).
pub(crate) fn serve(
    m: &Message,
    find: impl FnOnce(u64, usize) -> Option<(Memory, usize)>,
) -> Option<Message> {
    let h = m.header();
    match (h.request.kind(), *h.request.params()) {
        (ReqType::Write, Params::Memory(p)) => {
            let Some((memory, offset)) = find(p.addr, m.payload().len()) else {
                return m.error_answer(Status::OutOfRange);
            };
            lock(&memory)[offset..offset + m.payload().len()].copy_from_slice(m.payload());
            completion(h, ReqType::WriteCmpl, p.length, p.addr, Bytes::new())
        }
        (ReqType::Read, Params::Read(p)) => {
            let len = usize::from(p.length);
            let Some((memory, offset)) = find(p.src_addr, len) else {
                return m.error_answer(Status::OutOfRange);
            };
            let data = Bytes::copy_from_slice(&lock(&memory)[offset..offset + len]);
            completion(h, ReqType::ReadCmpl, p.length, p.dst_addr, data)
        }
        // Writes land in the window at once: nothing to flush.
        (ReqType::Flush, _) => m.error_answer(Status::Ok),
        _ => m.error_answer(Status::BadRequest),
    }
}

/// A successful memory completion answering `h`.
fn completion(
    h: &Header,
    kind: ReqType,
    length: u16,
    addr: u64,
    payload: Bytes,
) -> Option<Message> {
    let params = Params::Memory(MemoryParams {
        flag: 0,
        length,
        addr,
    });
    let mut reply = Header::new(h.dst, h.src, Request::new(kind, params).ok()?);
    reply.seqnum = h.seqnum;
    Message::new(reply, payload).ok()
}

/// A memory window of a session: bytes the application reads and writes
/// here, and peers WRITE to and READ from at [`Window::at`]. It stays
/// registered until dropped.
pub struct Window {
    address: MemoryAddress,
    memory: Memory,
    session: Weak<Shared>,
}

impl Window {
    pub(crate) fn register(session: &Arc<Shared>, len: usize) -> Window {
        let (base, memory) = session.routes().windows.add(len);
        Window {
            address: session.uid.at(base),
            memory,
            session: Arc::downgrade(session),
        }
    }

    /// Where the window starts in the session's address space.
    pub fn address(&self) -> MemoryAddress {
        self.address
    }

    /// The address of byte `offset` of the window, for peers' WRITE/READ.
    pub fn at(&self, offset: u64) -> MemoryAddress {
        self.address.uid.at(self.address.addr + offset)
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        lock(&self.memory).len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of `len` bytes at `offset`, or `None` past the end.
    pub fn read(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        let memory = lock(&self.memory);
        let end = offset.checked_add(len)?;
        memory.get(offset..end).map(<[u8]>::to_vec)
    }

    /// Writes `data` at `offset`; false (nothing written) past the end.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        let mut memory = lock(&self.memory);
        let Some(end) = offset.checked_add(data.len()) else {
            return false;
        };
        match memory.get_mut(offset..end) {
            Some(dst) => {
                dst.copy_from_slice(data);
                true
            }
            None => false,
        }
    }

    /// A copy of the whole window.
    pub fn to_vec(&self) -> Vec<u8> {
        lock(&self.memory).clone()
    }

    /// Runs `f` on the window's bytes. Peers' requests wait meanwhile, so
    /// keep it short.
    pub fn with<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut lock(&self.memory))
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(session) = self.session.upgrade() {
            session.routes().windows.remove(self.address.addr);
        }
    }
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("address", &self.address)
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uniplane_dataplane::Uid;

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    #[test]
    fn windows_are_placed_on_4k_boundaries_from_zero() {
        let mut w = Windows::default();
        assert_eq!(w.add(10).0, 0);
        assert_eq!(w.add(4096).0, 4096);
        assert_eq!(w.add(1).0, 8192);
        assert!(w.find(4096, 4096).is_some());
        assert!(w.find(4096, 4097).is_none(), "spans two windows");
        assert!(w.find(10, 1).is_none(), "in the gap after the first");
        assert_eq!(w.find(8192, 1).map(|(_, o)| o), Some(0));
    }

    #[test]
    fn a_write_inside_a_window_lands_and_is_completed() {
        let mut w = Windows::default();
        let (_, memory) = w.add(16);
        let m = Message::write(
            uid("10.0.0.1:2"),
            uid("10.0.0.1:3").at(4),
            Bytes::from("abcd"),
        )
        .unwrap();
        let reply = serve(&m, |a, l| w.find(a, l)).unwrap();
        assert_eq!(reply.kind(), ReqType::WriteCmpl);
        assert_eq!(reply.header().status(), Status::Ok);
        assert_eq!(reply.header().dst, uid("10.0.0.1:2"));
        assert_eq!(&lock(&memory)[4..8], b"abcd");
    }

    #[test]
    fn an_out_of_range_write_is_refused_and_changes_nothing() {
        let mut w = Windows::default();
        let (_, memory) = w.add(16);
        let m = Message::write(
            uid("10.0.0.1:2"),
            uid("10.0.0.1:3").at(14),
            Bytes::from("abcd"),
        )
        .unwrap();
        let reply = serve(&m, |a, l| w.find(a, l)).unwrap();
        assert_eq!(reply.kind(), ReqType::WriteCmpl);
        assert_eq!(reply.header().status(), Status::OutOfRange);
        assert_eq!(*lock(&memory), vec![0; 16]);
    }

    #[test]
    fn a_read_returns_the_bytes_or_out_of_range() {
        let mut w = Windows::default();
        let (_, memory) = w.add(8);
        lock(&memory).copy_from_slice(b"01234567");
        let me = uid("10.0.0.1:2");
        let ok = Message::read(me.at(0), uid("10.0.0.1:3").at(2), 3).unwrap();
        let reply = serve(&ok, |a, l| w.find(a, l)).unwrap();
        assert_eq!(reply.kind(), ReqType::ReadCmpl);
        assert_eq!(reply.payload().as_ref(), b"234");
        let past = Message::read(me.at(0), uid("10.0.0.1:3").at(6), 3).unwrap();
        let reply = serve(&past, |a, l| w.find(a, l)).unwrap();
        assert_eq!(reply.header().status(), Status::OutOfRange);
        assert!(reply.payload().is_empty());
    }
}
