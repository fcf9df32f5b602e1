//! One-sided WRTE and READ to a memory resource: a window of a shared
//! region (host memory, device memory) that has a UID of its own.
//!
//! [`MemoryResource::handle`] is the target's whole behaviour, sans-IO: it
//! takes a request message and returns the answer to send back. Every
//! address is checked against the window before a byte moves; a request
//! that reaches outside gets `Message::error_answer(Status::OutOfRange)`
//! and touches nothing.

use std::sync::Arc;

use bytes::BytesMut;
use uniplane_dataplane::wire::{Header, MemoryParams, Params, ReqType, Request, Status};
use uniplane_dataplane::{Message, Uid};

use crate::device::DeviceRegion;
use crate::sys::SharedMemory;

/// A memory window reachable by UID and address.
#[derive(Clone, Debug)]
pub struct MemoryResource {
    uid: Uid,
    mem: Arc<SharedMemory>,
    offset: usize,
    len: usize,
}

/// Counters of a memory resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes written by WRTE.
    pub written: u64,
    /// Bytes returned by READ.
    pub read: u64,
    /// Requests refused (range, type, destination).
    pub refused: u64,
}

impl MemoryResource {
    /// The `len` bytes at `offset` of `mem` as resource `uid`; `None` when
    /// the window is not inside the mapping.
    pub fn new(uid: Uid, mem: Arc<SharedMemory>, offset: usize, len: usize) -> Option<Self> {
        mem.contains(offset, len).then_some(MemoryResource {
            uid,
            mem,
            offset,
            len,
        })
    }

    /// A device's memory as resource `uid`.
    pub fn device(uid: Uid, dev: &DeviceRegion) -> MemoryResource {
        let (offset, len) = dev.memory_window();
        MemoryResource {
            uid,
            mem: dev.memory().clone(),
            offset,
            len,
        }
    }

    /// The resource's UID.
    pub fn uid(&self) -> Uid {
        self.uid
    }

    /// Bytes in the window.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn range(&self, addr: u64, len: usize) -> Option<usize> {
        let addr = usize::try_from(addr).ok()?;
        (addr.checked_add(len)? <= self.len).then_some(self.offset + addr)
    }

    /// Performs `req` and returns the answer for its sender: WRTE_CMPL after
    /// a write, READ_CMPL carrying the bytes after a read, an error answer
    /// (`OutOfRange`, `BadRequest`, `NoRoute`) otherwise. `None` for
    /// messages that are answers themselves.
    pub fn handle(&self, req: &Message, stats: &mut MemoryStats) -> Option<Message> {
        let refuse = |stats: &mut MemoryStats, status| {
            stats.refused += 1;
            req.error_answer(status)
        };
        if req.header().dst != self.uid {
            return refuse(stats, Status::NoRoute);
        }
        match (req.kind(), *req.header().request.params()) {
            (ReqType::Write, Params::Memory(p)) => {
                let data = req.payload();
                let Some(at) = self.range(p.addr, data.len()) else {
                    return refuse(stats, Status::OutOfRange);
                };
                self.mem.write(at, data);
                stats.written += data.len() as u64;
                req.error_answer(Status::Ok)
            }
            (ReqType::Read, Params::Read(p)) => {
                let len = p.length as usize;
                let Some(at) = self.range(p.src_addr, len) else {
                    return refuse(stats, Status::OutOfRange);
                };
                let mut data = BytesMut::with_capacity(len);
                self.mem.read_into(at, len, &mut data);
                let request = Request::new(
                    ReqType::ReadCmpl,
                    Params::Memory(MemoryParams {
                        flag: 0,
                        length: p.length,
                        addr: p.dst_addr,
                    }),
                )
                .ok()?;
                let mut header = Header::new(self.uid, req.header().src, request);
                header.seqnum = req.header().seqnum;
                stats.read += len as u64;
                Message::new(header, data.freeze()).ok()
            }
            _ => refuse(stats, Status::BadRequest),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::memfd_name;
    use bytes::Bytes;
    use std::net::Ipv4Addr;
    use uniplane_dataplane::wire::MsgFlags;

    fn resource() -> MemoryResource {
        let mem = Arc::new(SharedMemory::create(&memfd_name("mem-test"), 8192).unwrap());
        MemoryResource::new(Uid::new(Ipv4Addr::LOCALHOST, 5), mem, 4096, 4096).unwrap()
    }

    fn me() -> Uid {
        Uid::new(Ipv4Addr::LOCALHOST, 1)
    }

    #[test]
    fn a_write_then_a_read_return_the_bytes() {
        let r = resource();
        let mut st = MemoryStats::default();
        let w = Message::write(me(), r.uid().at(100), Bytes::from_static(b"abcdef")).unwrap();
        let ack = r.handle(&w, &mut st).unwrap();
        assert_eq!(ack.kind(), ReqType::WriteCmpl);
        assert!(!ack.header().flags.contains(MsgFlags::ERROR));
        let rd = Message::read(me().at(0x40), r.uid().at(102), 3).unwrap();
        let answer = r.handle(&rd, &mut st).unwrap();
        assert_eq!(answer.kind(), ReqType::ReadCmpl);
        assert_eq!(answer.payload().as_ref(), b"cde");
        assert_eq!(answer.header().dst, me());
        assert_eq!((st.written, st.read, st.refused), (6, 3, 0));
    }

    #[test]
    fn a_write_past_the_window_is_out_of_range_and_touches_nothing() {
        let r = resource();
        let mut st = MemoryStats::default();
        let w = Message::write(me(), r.uid().at(4094), Bytes::from_static(b"xyz")).unwrap();
        let answer = r.handle(&w, &mut st).unwrap();
        assert_eq!(answer, w.error_answer(Status::OutOfRange).unwrap());
        let mut tail = [9u8; 2];
        r.mem.read(4096 + 4094, &mut tail);
        assert_eq!(tail, [0, 0]);
        let w = Message::write(me(), r.uid().at(u64::MAX), Bytes::from_static(b"x")).unwrap();
        assert_eq!(
            r.handle(&w, &mut st).unwrap().header().status(),
            Status::OutOfRange
        );
        assert_eq!(st.refused, 2);
    }

    #[test]
    fn a_read_past_the_window_is_out_of_range() {
        let r = resource();
        let mut st = MemoryStats::default();
        let rd = Message::read(me().at(0), r.uid().at(4000), 200).unwrap();
        let answer = r.handle(&rd, &mut st).unwrap();
        assert_eq!(answer.header().status(), Status::OutOfRange);
        assert!(answer.payload().is_empty());
    }

    #[test]
    fn requests_for_another_uid_or_of_another_type_are_refused() {
        let r = resource();
        let mut st = MemoryStats::default();
        let other = Uid::new(Ipv4Addr::LOCALHOST, 6);
        let w = Message::write(me(), other.at(0), Bytes::from_static(b"x")).unwrap();
        assert_eq!(
            r.handle(&w, &mut st).unwrap().header().status(),
            Status::NoRoute
        );
        let s = Message::send(me().port(1), r.uid().port(2), Bytes::new()).unwrap();
        assert_eq!(
            r.handle(&s, &mut st).unwrap().header().status(),
            Status::BadRequest
        );
    }
}
