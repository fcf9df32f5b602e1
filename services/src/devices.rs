//! Devices the daemon hosts itself: an echo device to try things with, a
//! memory resource served by one-sided WRTE/READ, and a relay that puts
//! what it receives back into the overlay (a hop of multi-hop routes).
//!
//! Each runs either as a task on the daemon's runtime, attached to the
//! engine as a device port over a ring link ([`run`]), handling whole
//! bursts per wake-up; or inside the engine thread itself
//! ([`inline_port`]): what the engine writes to the device is handled at
//! once and the answers become the port's input, with no queue hop, no
//! task and no wake-up in between.
//!
//! A memory device keeps its bytes in host memory ([`Memory`]) or, with
//! `backend = "gpu"`, in GPU memory ([`gpu::GpuMemory`]); both answer
//! through [`handle`] by way of [`MemoryStore`]. A GPU device never runs
//! in the engine thread (a copy blocks for microseconds): it has a thread
//! of its own on a ring link ([`gpu::spawn`]).

use std::collections::VecDeque;

use bytes::Bytes;
use std::task::{Context, Poll};
use uniplane_client::protocol::{CLOSE_ACK, CLOSE_FIN};
use uniplane_dataplane::wire::{
    Header, MemoryParams, MsgFlags, Params, PortParams, ReqType, Request, Status,
};

use uniplane_dataplane::{Link, LinkExt, Message, PortClosed, PortIo};

use crate::config::DeviceKind;

pub mod gpu;
pub mod kernel;
pub mod region;

use region::{HostRegion, RegionView};
use std::sync::Arc;

/// Byte storage a memory device serves: what [`handle`] needs of host or
/// GPU memory.
pub trait MemoryStore {
    /// Writes `data` at `addr`, or says why not (nothing written):
    /// [`Status::OutOfRange`] outside the memory, [`Status::PeerFailed`]
    /// when the memory failed.
    fn store(&mut self, addr: u64, data: &[u8]) -> Result<(), Status>;

    /// The `len` bytes at `addr`, or why not (as [`MemoryStore::store`]).
    fn load(&mut self, addr: u64, len: usize) -> Result<Bytes, Status>;

    /// Whether an access can go now; false only while lent memory is
    /// being taken back, and then `waker` is woken once it is over.
    fn ready(&mut self, _waker: Option<&std::task::Waker>) -> bool {
        true
    }
}

/// The device's memory: bounds-checked byte access.
#[derive(Debug)]
pub struct Memory {
    bytes: Vec<u8>,
}

impl Memory {
    /// `size` zeroed bytes.
    pub fn new(size: usize) -> Self {
        Memory {
            bytes: vec![0; size],
        }
    }

    fn range(&self, addr: u64, len: usize) -> Option<std::ops::Range<usize>> {
        let start = usize::try_from(addr).ok()?;
        let end = start.checked_add(len)?;
        (end <= self.bytes.len()).then_some(start..end)
    }

    /// Writes `data` at `addr`; false (and nothing written) when it does not
    /// fit inside the memory.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> bool {
        match self.range(addr, data.len()) {
            Some(r) => {
                self.bytes[r].copy_from_slice(data);
                true
            }
            None => false,
        }
    }

    /// The `len` bytes at `addr`, or `None` when outside the memory.
    pub fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.range(addr, len).map(|r| &self.bytes[r])
    }
}

impl MemoryStore for Memory {
    fn store(&mut self, addr: u64, data: &[u8]) -> Result<(), Status> {
        self.write(addr, data)
            .then_some(())
            .ok_or(Status::OutOfRange)
    }

    fn load(&mut self, addr: u64, len: usize) -> Result<Bytes, Status> {
        self.read(addr, len)
            .map(Bytes::copy_from_slice)
            .ok_or(Status::OutOfRange)
    }
}

/// What a device answers to one message (`None`: nothing).
pub fn handle<M: MemoryStore + ?Sized>(
    kind: DeviceKind,
    memory: &mut M,
    m: Message,
) -> Option<Message> {
    if kind == DeviceKind::Relay {
        return Some(m);
    }
    let h = *m.header();
    match (h.request.kind(), *h.request.params()) {
        (ReqType::Send | ReqType::Push, Params::Port(p)) if kind == DeviceKind::Echo => {
            let mut reply = Header::new(
                h.dst,
                h.src,
                Request::new(
                    h.request.kind(),
                    Params::Port(PortParams {
                        flag: 0,
                        src_port: p.dst_port,
                        dst_port: p.src_port,
                    }),
                )
                .ok()?,
            );
            reply.seqnum = h.seqnum;
            reply.flags = h.flags;
            Message::new(reply, m.payload().clone()).ok()
        }
        (ReqType::Write, Params::Memory(p)) => {
            if let Err(status) = memory.store(p.addr, m.payload()) {
                return m.error_answer(status);
            }
            let request = Request::new(
                ReqType::WriteCmpl,
                Params::Memory(MemoryParams {
                    flag: 0,
                    length: p.length,
                    addr: p.addr,
                }),
            )
            .ok()?;
            let mut reply = Header::new(h.dst, h.src, request);
            reply.seqnum = h.seqnum;
            Message::new(reply, Bytes::new()).ok()
        }
        (ReqType::Read, Params::Read(p)) => {
            let data = match memory.load(p.src_addr, p.length as usize) {
                Ok(data) => data,
                Err(status) => return m.error_answer(status),
            };
            let request = Request::new(
                ReqType::ReadCmpl,
                Params::Memory(MemoryParams {
                    flag: 0,
                    length: p.length,
                    addr: p.dst_addr,
                }),
            )
            .ok()?;
            let mut reply = Header::new(h.dst, h.src, request);
            reply.seqnum = h.seqnum;
            Message::new(reply, data).ok()
        }
        (ReqType::Flush, _) => m.error_answer(Status::Ok),
        // A process closing its connection in band: the device holds no
        // state per connection, so it acknowledges at once and the
        // process goes on to ask the daemon to close.
        (ReqType::Close, Params::Port(p))
            if p.flag == CLOSE_FIN && !h.flags.contains(MsgFlags::ERROR) =>
        {
            let request = Request::new(
                ReqType::Close,
                Params::Port(PortParams {
                    flag: CLOSE_ACK,
                    src_port: p.dst_port,
                    dst_port: p.src_port,
                }),
            )
            .ok()?;
            Message::new(Header::new(h.dst, h.src, request), Bytes::new()).ok()
        }
        // Connection control and answers need no reply from a device (nor
        // the daemon's NOTIFY that a connection ended: these devices keep
        // nothing per connection).
        (k, _)
            if k.is_answer()
                || matches!(k, ReqType::Connect | ReqType::Close | ReqType::Notify) =>
        {
            None
        }
        _ => m.error_answer(Status::BadRequest),
    }
}

/// A device's memory: private bytes, or (a host memory device) a region
/// the daemon can lend to processes by mapping.
#[derive(Debug)]
pub enum Store {
    /// Bytes only the device touches.
    Private(Memory),
    /// A region processes may map ([`HostRegion`]).
    Region(RegionView),
}

impl Store {
    /// `memory_bytes` of private memory, or a view of `region`.
    pub fn new(memory_bytes: usize, region: Option<&Arc<HostRegion>>) -> Store {
        match region {
            Some(r) => Store::Region(r.view()),
            None => Store::Private(Memory::new(memory_bytes)),
        }
    }
}

impl MemoryStore for Store {
    fn store(&mut self, addr: u64, data: &[u8]) -> Result<(), Status> {
        match self {
            Store::Private(m) => m.store(addr, data),
            Store::Region(v) => v.store(addr, data),
        }
    }

    fn load(&mut self, addr: u64, len: usize) -> Result<Bytes, Status> {
        match self {
            Store::Private(m) => m.load(addr, len),
            Store::Region(v) => v.load(addr, len),
        }
    }

    fn ready(&mut self, waker: Option<&std::task::Waker>) -> bool {
        match self {
            Store::Private(_) => true,
            Store::Region(v) => v.ready(waker),
        }
    }
}

/// Runs a device on `link` until the link closes; its memory is `region`
/// when given, else `memory_bytes` of its own.
pub async fn run<L: Link>(
    kind: DeviceKind,
    memory_bytes: usize,
    region: Option<Arc<HostRegion>>,
    link: L,
) {
    serve(kind, &mut Store::new(memory_bytes, region.as_ref()), link).await
}

/// Serves `memory` as a `kind` device on `link` until the link closes,
/// a burst of messages per wake-up.
pub async fn serve<M: MemoryStore + ?Sized, L: Link>(
    kind: DeviceKind,
    memory: &mut M,
    mut link: L,
) {
    let mut inbox = Vec::with_capacity(64);
    let mut outbox = VecDeque::with_capacity(64);
    loop {
        inbox.clear();
        match link.recv_batch(&mut inbox, 64).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        // Memory being taken back from its borrowers: wait (without
        // blocking the thread) until it has moved.
        std::future::poll_fn(|cx| {
            if memory.ready(Some(cx.waker())) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        outbox.extend(inbox.drain(..).filter_map(|m| handle(kind, memory, m)));
        if !outbox.is_empty() && link.send_batch(&mut outbox).await.is_err() {
            return;
        }
    }
}

/// Answers an inline device holds for the engine by default.
pub const INLINE_ANSWERS: usize = 256;

/// A device run inside the engine thread: a [`PortIo`] whose output is the
/// device's [`handle`] and whose input is the device's answers.
///
/// Lossless: every message pushed yields at most one answer, and the port
/// takes a message only while its answer queue has room, so a full answer
/// queue (the engine not reading the device's answers, because their
/// destinations are full) makes [`PortIo::free`] 0 and the engine's
/// queues hold the rest: backpressure, never a drop.
#[derive(Debug)]
pub struct InlinePort {
    kind: DeviceKind,
    memory: Store,
    answers: VecDeque<Message>,
    capacity: usize,
}

impl InlinePort {
    /// A `kind` device with `memory_bytes` of memory (or `region`'s)
    /// whose answer queue holds `capacity` messages (at least 1).
    pub fn new(
        kind: DeviceKind,
        memory_bytes: usize,
        region: Option<&Arc<HostRegion>>,
        capacity: usize,
    ) -> Self {
        let capacity = capacity.max(1);
        InlinePort {
            kind,
            memory: Store::new(memory_bytes, region),
            answers: VecDeque::with_capacity(capacity),
            capacity,
        }
    }
}

/// A `kind` device with `memory_bytes` of memory (or `region`'s), ready
/// to attach with `Engine::attach_io` (or `PlaneOp::AttachIo`) as a
/// device port: the device runs inside the engine thread.
pub fn inline_port(
    kind: DeviceKind,
    memory_bytes: usize,
    region: Option<&Arc<HostRegion>>,
) -> Box<dyn PortIo> {
    Box::new(InlinePort::new(kind, memory_bytes, region, INLINE_ANSWERS))
}

impl PortIo for InlinePort {
    fn peek(&mut self) -> Option<&Message> {
        self.answers.front()
    }

    fn pop(&mut self) -> Option<Message> {
        self.answers.pop_front()
    }

    fn available(&mut self) -> usize {
        self.answers.len()
    }

    fn release(&mut self) {}

    /// Answers appear only when the engine itself pushes, so there is
    /// nothing to wait for from elsewhere.
    fn poll_available(&mut self, _cx: &mut Context<'_>) -> Poll<bool> {
        if self.answers.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(true)
        }
    }

    /// 0 while the device's region is being taken back (the engine's
    /// queues hold its messages until it has moved).
    fn free(&mut self) -> usize {
        if !self.memory.ready(None) {
            return 0;
        }
        self.capacity - self.answers.len()
    }

    fn push(&mut self, m: Message) -> Result<(), Message> {
        if self.answers.len() >= self.capacity || !self.memory.ready(None) {
            return Err(m);
        }
        if let Some(answer) = handle(self.kind, &mut self.memory, m) {
            self.answers.push_back(answer);
        }
        Ok(())
    }

    fn flush(&mut self) {}

    /// Room appears when the engine itself reads answers, or when a
    /// region taken back has moved (which wakes `cx`).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PortClosed>> {
        if !self.memory.ready(Some(cx.waker())) {
            return Poll::Pending;
        }
        if self.free() > 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn is_closed(&mut self) -> bool {
        false
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
    fn echo_answers_a_send_with_the_same_payload_back() {
        let mut mem = Memory::new(16);
        let mut m = Message::send(
            uid("1.1.1.1:5").port(9),
            uid("1.1.1.1:1").port(7),
            Bytes::from_static(b"hi"),
        )
        .unwrap();
        m.set_seqnum(3);
        let r = handle(DeviceKind::Echo, &mut mem, m).unwrap();
        assert_eq!(
            (r.header().src, r.header().dst),
            (uid("1.1.1.1:1"), uid("1.1.1.1:5"))
        );
        assert_eq!(r.header().request.ports(), Some((7, 9)));
        assert_eq!(r.payload().as_ref(), b"hi");
        assert_eq!(r.header().seqnum, 3);
    }

    #[test]
    fn a_device_acknowledges_an_in_band_close_and_nothing_else_of_connection_control() {
        let close = |flag| {
            let params = Params::Port(PortParams {
                flag,
                src_port: 9,
                dst_port: 7,
            });
            let h = Header::new(
                uid("1.1.1.1:5"),
                uid("1.1.1.1:1"),
                Request::new(ReqType::Close, params).unwrap(),
            );
            Message::new(h, Bytes::new()).unwrap()
        };
        for kind in [DeviceKind::Echo, DeviceKind::Memory] {
            let mut mem = Memory::new(16);
            let ack = handle(kind, &mut mem, close(CLOSE_FIN)).unwrap();
            let h = ack.header();
            assert_eq!((h.src, h.dst), (uid("1.1.1.1:1"), uid("1.1.1.1:5")));
            assert_eq!(h.request.kind(), ReqType::Close);
            assert_eq!(h.request.params().flag(), CLOSE_ACK);
            assert_eq!(h.request.ports(), Some((7, 9)));
            // An acknowledgment is not acknowledged: no ping-pong.
            assert!(handle(kind, &mut mem, close(CLOSE_ACK)).is_none());
        }
    }

    #[test]
    fn writes_and_reads_are_bounds_checked() {
        let mut mem = Memory::new(16);
        let w = Message::write(
            uid("1.1.1.1:5"),
            uid("1.1.1.1:1").at(4),
            Bytes::from_static(b"abcd"),
        )
        .unwrap();
        assert_eq!(
            handle(DeviceKind::Memory, &mut mem, w).unwrap().kind(),
            ReqType::WriteCmpl
        );
        let r = Message::read(uid("1.1.1.1:5").at(0x100), uid("1.1.1.1:1").at(4), 4).unwrap();
        let data = handle(DeviceKind::Memory, &mut mem, r).unwrap();
        assert_eq!(data.kind(), ReqType::ReadCmpl);
        assert_eq!(data.payload().as_ref(), b"abcd");

        let outside = Message::write(
            uid("1.1.1.1:5"),
            uid("1.1.1.1:1").at(14),
            Bytes::from_static(b"abcd"),
        )
        .unwrap();
        let answer = handle(DeviceKind::Memory, &mut mem, outside).unwrap();
        assert_eq!(answer.header().status(), Status::OutOfRange);
        assert_eq!(mem.read(12, 4).unwrap(), &[0, 0, 0, 0], "nothing touched");
        let far =
            Message::read(uid("1.1.1.1:5").at(0), uid("1.1.1.1:1").at(u64::MAX - 1), 4).unwrap();
        assert_eq!(
            handle(DeviceKind::Memory, &mut mem, far)
                .unwrap()
                .header()
                .status(),
            Status::OutOfRange
        );
    }

    #[test]
    fn an_inline_echo_answers_at_once_and_holds_back_when_its_answers_are_full() {
        let mut port = InlinePort::new(DeviceKind::Echo, 0, None, 2);
        let m = |i| {
            let mut m = Message::send(
                uid("1.1.1.1:5").port(9),
                uid("1.1.1.1:1").port(7),
                Bytes::new(),
            )
            .unwrap();
            m.set_seqnum(i);
            m
        };
        assert_eq!(port.free(), 2);
        port.push(m(1)).unwrap();
        port.push(m(2)).unwrap();
        assert_eq!(port.free(), 0, "two answers wait: the port is full");
        let refused = port.push(m(3)).unwrap_err();
        assert_eq!(refused.header().seqnum, 3, "given back, never dropped");
        assert_eq!(port.available(), 2);
        assert_eq!(port.pop().unwrap().header().seqnum, 1);
        assert_eq!(port.free(), 1);
        port.push(refused).unwrap();
        let order: Vec<u32> = std::iter::from_fn(|| port.pop())
            .map(|a| a.header().seqnum)
            .collect();
        assert_eq!(order, [2, 3]);
    }

    /// Memory that has failed, as a GPU whose copy failed answers.
    struct Failed;

    impl MemoryStore for Failed {
        fn store(&mut self, _: u64, _: &[u8]) -> Result<(), Status> {
            Err(Status::PeerFailed)
        }

        fn load(&mut self, _: u64, _: usize) -> Result<Bytes, Status> {
            Err(Status::PeerFailed)
        }
    }

    #[test]
    fn failed_memory_answers_the_caller_with_its_status() {
        let w = Message::write(
            uid("1.1.1.1:5"),
            uid("1.1.1.1:1").at(0),
            Bytes::from_static(b"abcd"),
        )
        .unwrap();
        let r = Message::read(uid("1.1.1.1:5").at(0), uid("1.1.1.1:1").at(0), 4).unwrap();
        for m in [w, r] {
            let answer = handle(DeviceKind::Memory, &mut Failed, m).unwrap();
            assert_eq!(answer.header().status(), Status::PeerFailed);
            assert_eq!(answer.header().dst, uid("1.1.1.1:5"), "back to the caller");
        }
    }

    #[test]
    fn answers_get_no_reply() {
        let mut mem = Memory::new(16);
        let m = Message::send(
            uid("1.1.1.1:5").port(9),
            uid("1.1.1.1:1").port(7),
            Bytes::new(),
        )
        .unwrap();
        let cmpl = m.error_answer(Status::Ok).unwrap();
        assert!(handle(DeviceKind::Echo, &mut mem, cmpl).is_none());
    }
}
