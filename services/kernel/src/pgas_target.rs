//! `pgas-target`: a PGAS hardware endpoint (Shoal's GAScore) — segments
//! in the kernel's own memory and the built-in handlers, reached by
//! software endpoints of `uniplane-pgas` as a rank of their group.
//!
//! ```toml
//! [[devices]]
//! name = "halo"
//! kind = "kernel"
//! function = "pgas-target"
//! params = { segments = 2, segment_bytes = 262144, acl = "rw,0+2" }
//! ```
//!
//! ```text
//!  software rank r ── one connection, class 0 ──▶ on_message(conn, frame)
//!   Hello(rank r, credit window)                 ─▶ Ready
//!   request frames (put, get, atomic, flush …)   ─▶ Inbound(r) ─▶ DeviceTarget
//!                  ◀── answers on that connection: replies, credit ──┘
//! ```
//!
//! A kernel cannot dial out: it answers on the connection a message came
//! on. So a software endpoint dials a hardware rank one data connection
//! and takes that rank's replies and credit from the answers on it
//! (where a software target would reply on its own control connection).
//! Per kernel connection the kernel runs the protocol core's
//! [`Inbound`] — the same state machine as a software endpoint —, over
//! [`DeviceTarget`]: `segments` segments of `segment_bytes` bytes each
//! (IDs from 0) in one bounded memory, each with an ACL, and the built-in
//! handlers [`HANDLER_NONE`] and [`HANDLER_COUNTER`]; atomics run here
//! too. There are no user handlers: any other handler ID is refused
//! `NoHandler`. Segment [`STATS_SEGMENT`] is read-only and holds what
//! the target counted and the counter's total ([`HardwareStats`]).
//!
//! A connection's first frame must be the endpoint's `Hello`: its rank,
//! in `arg` its credit window, and as payload the group's members by
//! rank ([`put_members`]). A frame before it is counted malformed and
//! answered nothing. The daemon tells the kernel who each connection's
//! caller is ([`Kernel::on_open`], from the overlay connection, not from
//! anything the caller sends), and the `Hello` is refused (`Ready` with
//! status `Denied`, counted) unless the caller is the member at the rank
//! it claims, as a software endpoint checks its connectors. The first
//! accepted `Hello` sets the group; while any connection it admitted
//! lives, a `Hello` naming another group is refused, so one job's ranks
//! cannot be claimed by a second. The rank is what the ACL checks; the
//! daemon's connection admission still decides who may connect at all.

use std::cell::{Cell, RefCell};
use std::net::Ipv4Addr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use uniplane_pgas_core::access::{atomic_at, Access, Acl, AtomicOp, SegmentId, Width};
use uniplane_pgas_core::stats::{HardwareStats, STATS_BYTES, STATS_SEGMENT};
use uniplane_pgas_core::target::{
    AmCall, HandlerId, Inbound, Refusal, Reply, Target, TargetCounters, HANDLER_COUNTER,
    HANDLER_NONE,
};
use uniplane_pgas_core::wire::{charge, parse_members, Head, Kind, HEADER_LEN, MAX_FRAME};

use crate::library::{only, parsed_or, Params, Spec};
use crate::wire::Caller;
use crate::{Emit, Kernel};

#[cfg(doc)]
use uniplane_pgas_core::wire::put_members;

/// The library entry.
pub const SPEC: Spec = Spec {
    name: "pgas-target",
    about: "a PGAS hardware endpoint: segments in its own memory, counter and atomics built in",
    check: |params| Layout::from_params(params).map(|_| ()),
    build: |params| Ok(Box::new(PgasTarget::new(&Layout::from_params(params)?))),
};

const KNOWN: &[&str] = &["segments", "segment_bytes", "acl"];

/// Most segments.
pub const MAX_SEGMENTS: usize = 64;
/// Most bytes of all segments together: the kernel's memory.
pub const MAX_MEMORY: usize = 64 << 20;
/// The largest medium payload the kernel gathers for a built-in handler.
pub const MAX_MEDIUM: usize = 64 << 10;
/// The credit window assumed of a sender whose `Hello` names none.
const DEFAULT_CREDIT: u64 = 256 * 1024;

/// The segments a `pgas-target` kernel has, from its parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of each segment.
    pub segment_bytes: usize,
    /// Each segment's ACL, by segment ID.
    pub acls: Vec<Acl>,
}

impl Layout {
    /// Reads `segments` (1 to [`MAX_SEGMENTS`], default 1),
    /// `segment_bytes` (at least 8, default 64 KiB; all segments together
    /// at most [`MAX_MEMORY`]) and `acl` (default `rw`): one entry for
    /// every segment or a comma-separated entry per segment, each `rw`,
    /// `ro` (gets only) or ranks joined by `+` (`0+2`: only those read
    /// and write).
    pub fn from_params(params: &Params) -> Result<Layout, String> {
        only(params, KNOWN)?;
        let segments: usize = parsed_or(params, "segments", 1)?;
        if !(1..=MAX_SEGMENTS).contains(&segments) {
            return Err(format!(
                "parameter `segments` = {segments}: from 1 to {MAX_SEGMENTS}"
            ));
        }
        let segment_bytes: usize = parsed_or(params, "segment_bytes", 64 << 10)?;
        if segment_bytes < 8 {
            return Err(format!(
                "parameter `segment_bytes` = {segment_bytes}: at least 8 (one 64-bit word)"
            ));
        }
        if segment_bytes
            .checked_mul(segments)
            .is_none_or(|all| all > MAX_MEMORY)
        {
            return Err(format!(
                "{segments} segments of {segment_bytes} bytes exceed the kernel's {MAX_MEMORY} bytes of memory"
            ));
        }
        let text = params.get("acl").map_or("rw", String::as_str);
        let entries = text
            .split(',')
            .map(|e| parse_acl(e.trim()))
            .collect::<Result<Vec<Acl>, String>>()?;
        let acls = match entries.len() {
            1 => vec![entries[0].clone(); segments],
            n if n == segments => entries,
            n => {
                return Err(format!(
                    "parameter `acl` = `{text}`: {n} entries for {segments} segments (give one, or one per segment)"
                ))
            }
        };
        Ok(Layout {
            segment_bytes,
            acls,
        })
    }
}

fn parse_acl(entry: &str) -> Result<Acl, String> {
    match entry {
        "rw" => Ok(Acl::ReadWrite),
        "ro" => Ok(Acl::ReadOnly),
        ranks => ranks
            .split('+')
            .map(|r| r.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map(Acl::Ranks)
            .map_err(|_| {
                format!("parameter `acl`: `{entry}`: expected `rw`, `ro` or ranks like `0+2`")
            }),
    }
}

/// The memory and built-in handlers of a hardware endpoint: what
/// [`Inbound`] executes requests against. One request at a time (the
/// kernel's thread), so its memory needs no lock.
pub struct DeviceTarget {
    memory: RefCell<Vec<u8>>,
    segment_bytes: usize,
    acls: Vec<Acl>,
    counters: Arc<TargetCounters>,
    counter: Cell<u64>,
}

impl DeviceTarget {
    /// Zeroed segments as `layout` says.
    pub fn new(layout: &Layout) -> DeviceTarget {
        DeviceTarget {
            memory: RefCell::new(vec![0; layout.segment_bytes * layout.acls.len()]),
            segment_bytes: layout.segment_bytes,
            acls: layout.acls.clone(),
            counters: Arc::default(),
            counter: Cell::new(0),
        }
    }

    /// What it counted, and the counter handler's total.
    pub fn stats(&self) -> HardwareStats {
        HardwareStats {
            target: self.counters.snapshot(),
            counter: self.counter.get(),
        }
    }

    fn range(&self, segment: SegmentId) -> Result<std::ops::Range<usize>, Refusal> {
        let i = usize::from(segment);
        if i >= self.acls.len() {
            return Err(Refusal::NoSegment);
        }
        Ok(i * self.segment_bytes..(i + 1) * self.segment_bytes)
    }

    fn acl(&self, segment: SegmentId) -> Result<&Acl, Refusal> {
        self.acls
            .get(usize::from(segment))
            .ok_or(Refusal::NoSegment)
    }
}

impl Target for DeviceTarget {
    fn check(
        &self,
        source: usize,
        segment: SegmentId,
        access: Access,
        end: u64,
    ) -> Result<(), Refusal> {
        let (allowed, len) = if segment == STATS_SEGMENT {
            (access == Access::Read, STATS_BYTES)
        } else {
            (
                self.acl(segment)?.allows(source, access),
                self.segment_bytes,
            )
        };
        if !allowed {
            return Err(Refusal::Denied);
        }
        if end > len as u64 {
            return Err(Refusal::OutOfBounds);
        }
        Ok(())
    }

    fn land(&self, segment: SegmentId, f: &mut dyn FnMut(&mut [u8])) -> Result<(), Refusal> {
        if segment == STATS_SEGMENT {
            return Err(Refusal::Denied);
        }
        let range = self.range(segment)?;
        f(&mut self.memory.borrow_mut()[range]);
        Ok(())
    }

    fn read(&self, segment: SegmentId, offset: u64, len: usize) -> Result<Bytes, Refusal> {
        let start = usize::try_from(offset).map_err(|_| Refusal::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(Refusal::OutOfBounds)?;
        if segment == STATS_SEGMENT {
            let stats = self.stats().encode();
            return stats
                .get(start..end)
                .map(Bytes::copy_from_slice)
                .ok_or(Refusal::OutOfBounds);
        }
        let range = self.range(segment)?;
        self.memory.borrow()[range]
            .get(start..end)
            .map(Bytes::copy_from_slice)
            .ok_or(Refusal::OutOfBounds)
    }

    fn atomic(
        &self,
        source: usize,
        segment: SegmentId,
        offset: u64,
        width: Width,
        op: AtomicOp,
    ) -> Result<u64, Refusal> {
        if segment == STATS_SEGMENT || !self.acl(segment)?.allows(source, Access::Write) {
            return Err(Refusal::Denied);
        }
        let range = self.range(segment)?;
        atomic_at(&mut self.memory.borrow_mut()[range], offset, width, op)
    }

    fn has_handler(&self, id: HandlerId) -> bool {
        id == HANDLER_NONE || id == HANDLER_COUNTER
    }

    fn invoke(&self, id: HandlerId, call: AmCall<'_>) -> Result<Bytes, Refusal> {
        match id {
            HANDLER_NONE => Ok(Bytes::new()),
            HANDLER_COUNTER => {
                self.counter.set(self.counter.get().wrapping_add(call.arg));
                Ok(Bytes::new())
            }
            _ => Err(Refusal::NoHandler),
        }
    }
}

/// One software rank's connection to the kernel.
struct Conn {
    inbound: Inbound,
    /// Credit taken and not yet given back.
    owed: usize,
    /// Credit is given back on its own once this much is owed: a
    /// quarter of the sender's window, as a software target does.
    threshold: usize,
}

/// The `pgas-target` kernel: see the module documentation.
pub struct PgasTarget {
    target: DeviceTarget,
    /// By kernel connection: its state once its `Hello` was accepted.
    conns: Vec<Option<Conn>>,
    /// By kernel connection: its caller, as the daemon named it.
    callers: Vec<Option<Caller>>,
    /// The members (server, device) by rank of the group the accepted
    /// connections belong to; `None` while none lives.
    group: Option<Vec<(Ipv4Addr, u16)>>,
    /// Connections whose `Hello` was accepted and that still live.
    live: usize,
    /// Reused from frame to frame.
    replies: Vec<Reply>,
    scratch: BytesMut,
}

impl PgasTarget {
    /// A hardware endpoint with zeroed segments as `layout` says.
    pub fn new(layout: &Layout) -> PgasTarget {
        PgasTarget {
            target: DeviceTarget::new(layout),
            conns: Vec::new(),
            callers: Vec::new(),
            group: None,
            live: 0,
            replies: Vec::with_capacity(4),
            scratch: BytesMut::with_capacity(MAX_FRAME),
        }
    }

    /// Its memory and counters.
    pub fn target(&self) -> &DeviceTarget {
        &self.target
    }

    /// Forgets connection `conn`'s state (and the group once no
    /// accepted connection is left).
    fn drop_conn(&mut self, conn: u16) {
        if let Some(slot) = self.conns.get_mut(usize::from(conn)) {
            if slot.take().is_some() {
                self.live -= 1;
            }
        }
        if self.live == 0 {
            self.group = None;
        }
    }

    /// A connection's `Hello`: checked against its caller and the group
    /// (refused with `Ready` carrying the reason, counted), its state
    /// started afresh, answered `Ready`.
    fn hello(&mut self, conn: u16, head: &Head, members: &[u8], out: &mut dyn Emit) {
        self.drop_conn(conn);
        let verdict = self.admit(conn, head, members);
        self.scratch.clear();
        Head {
            status: verdict.err().map_or(0, Refusal::code),
            ..Head::new(Kind::Ready)
        }
        .put(&mut self.scratch);
        out.answer(conn, &self.scratch);
    }

    fn admit(&mut self, conn: u16, head: &Head, members: &[u8]) -> Result<(), Refusal> {
        let refuse = |r: Refusal| {
            self.target.counters.count_refused(r);
            Err(r)
        };
        let Some(members) = parse_members(members) else {
            return refuse(Refusal::Malformed);
        };
        let rank = head.len as usize;
        let caller = self.callers.get(usize::from(conn)).copied().flatten();
        let claimed = members.get(rank).copied();
        if caller.is_none() || caller.map(|c| (c.server, c.device)) != claimed {
            return refuse(Refusal::Denied);
        }
        if self.group.as_ref().is_some_and(|g| *g != members) {
            return refuse(Refusal::Denied);
        }
        let window = if head.arg == 0 {
            DEFAULT_CREDIT
        } else {
            head.arg
        };
        let state = Conn {
            inbound: Inbound::new(rank, MAX_MEDIUM, self.target.counters.clone()),
            owed: 0,
            threshold: usize::try_from(window / 4).unwrap_or(usize::MAX),
        };
        let i = usize::from(conn);
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, || None);
        }
        self.conns[i] = Some(state);
        self.live += 1;
        self.group = Some(members);
        Ok(())
    }
}

impl Kernel for PgasTarget {
    fn name(&self) -> &'static str {
        SPEC.name
    }

    fn on_open(&mut self, conn: u16, caller: Caller) {
        self.drop_conn(conn);
        let i = usize::from(conn);
        if self.callers.len() <= i {
            self.callers.resize(i + 1, None);
        }
        self.callers[i] = Some(caller);
    }

    fn on_close(&mut self, conn: u16) {
        self.drop_conn(conn);
        if let Some(c) = self.callers.get_mut(usize::from(conn)) {
            *c = None;
        }
    }

    fn on_message(&mut self, conn: u16, payload: &[u8], out: &mut dyn Emit) {
        if let Ok((head, members)) = Head::parse(payload) {
            if head.kind() == Some(Kind::Hello) {
                self.hello(conn, &head, members, out);
                return;
            }
        }
        let Some(Some(c)) = self.conns.get_mut(usize::from(conn)) else {
            // No hello: no rank to check the ACL against, no credit to give.
            self.target.counters.count_malformed();
            return;
        };
        c.owed += charge(payload.len());
        c.inbound.on_frame(&self.target, payload, &mut self.replies);
        for r in self.replies.drain(..) {
            self.scratch.clear();
            r.put(std::mem::take(&mut c.owed) as u32, &mut self.scratch);
            out.answer(conn, &self.scratch);
        }
        if c.owed >= c.threshold {
            self.scratch.clear();
            Head {
                credit: std::mem::take(&mut c.owed) as u32,
                ..Head::new(Kind::Credit)
            }
            .put(&mut self.scratch);
            out.answer(conn, &self.scratch[..HEADER_LEN]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KernelError;
    use uniplane_pgas_core::wire::{Shape, FLAG_ASYNC};

    #[derive(Default)]
    struct Collect(Vec<(u16, Vec<u8>)>);

    impl Emit for Collect {
        fn answer(&mut self, conn: u16, payload: &[u8]) {
            self.0.push((conn, payload.to_vec()));
        }
        fn error(&mut self, _conn: u16, error: KernelError) {
            panic!("pgas-target answers refusals in replies, not {error}");
        }
    }

    fn params(pairs: &[(&str, &str)]) -> Params {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn frame(head: Head, desc: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        head.put(&mut b);
        b.extend_from_slice(desc);
        b.extend_from_slice(payload);
        b.to_vec()
    }

    /// Member `r` of the groups below: its server and device.
    fn member(r: u16) -> (Ipv4Addr, u16) {
        (Ipv4Addr::new(10, 0, 0, 1 + r as u8), 100 + r)
    }

    fn caller(r: u16) -> Caller {
        let (server, device) = member(r);
        Caller {
            server,
            device,
            port: 4000,
        }
    }

    /// A hello as `rank` of a group of `n` members.
    fn hello_of(rank: u32, window: u64, n: u16) -> Vec<u8> {
        let mut members = BytesMut::new();
        uniplane_pgas_core::wire::put_members((0..n).map(member), &mut members);
        frame(
            Head {
                len: rank,
                arg: window,
                ..Head::new(Kind::Hello)
            },
            &[],
            &members,
        )
    }

    fn hello(rank: u32, window: u64) -> Vec<u8> {
        hello_of(rank, window, 3)
    }

    /// Opens `conn` for member `rank` and says its hello.
    fn greet(k: &mut PgasTarget, conn: u16, rank: u32, window: u64, out: &mut Collect) {
        k.on_open(conn, caller(rank as u16));
        k.on_message(conn, &hello(rank, window), out);
    }

    fn long(token: u32, segment: u16, offset: u64, data: &[u8]) -> Vec<u8> {
        let mut desc = BytesMut::new();
        Shape::Contiguous { offset }.put(&mut desc);
        frame(
            Head {
                token,
                segment,
                len: data.len() as u32,
                handler: HANDLER_COUNTER,
                arg: 1,
                ..Head::new(Kind::Long)
            },
            &desc,
            data,
        )
    }

    fn reply(bytes: &[u8]) -> (Head, Vec<u8>) {
        let (h, rest) = Head::parse(bytes).unwrap();
        (h, rest.to_vec())
    }

    fn kernel(pairs: &[(&str, &str)]) -> PgasTarget {
        PgasTarget::new(&Layout::from_params(&params(pairs)).unwrap())
    }

    #[test]
    fn a_hello_is_answered_ready_and_a_put_lands_counts_and_replies_with_credit() {
        let mut k = kernel(&[("segment_bytes", "64")]);
        let mut out = Collect::default();
        greet(&mut k, 3, 1, 1 << 20, &mut out);
        assert_eq!(reply(&out.0[0].1).0.kind(), Some(Kind::Ready));
        k.on_message(3, &long(9, 0, 60, b"abcd"), &mut out);
        let (h, _) = reply(&out.0[1].1);
        assert_eq!(
            (out.0[1].0, h.kind(), h.token, h.status),
            (3, Some(Kind::Reply), 9, 0)
        );
        assert_eq!(h.credit as usize, charge(HEADER_LEN + 8 + 4));
        assert_eq!(&k.target.memory.borrow()[60..64], b"abcd");
        assert_eq!(k.target.stats().counter, 1);
    }

    #[test]
    fn refusals_are_replied_counted_and_write_nothing() {
        let mut k = kernel(&[("segments", "2"), ("segment_bytes", "64"), ("acl", "rw,0")]);
        let mut out = Collect::default();
        greet(&mut k, 0, 1, 0, &mut out);
        k.on_message(0, &long(1, 0, 62, b"abcd"), &mut out); // past the end
        k.on_message(0, &long(2, 7, 0, b"abcd"), &mut out); // no segment 7
        k.on_message(0, &long(3, 1, 0, b"abcd"), &mut out); // rank 1 not in `0`
        k.on_message(0, &long(4, STATS_SEGMENT, 0, b"abcd"), &mut out);
        let mut bad = long(5, 0, 0, b"abcd");
        bad[2..4].copy_from_slice(&77u16.to_be_bytes()); // handler 77
        k.on_message(0, &bad, &mut out);
        let codes: Vec<u8> = out.0[1..].iter().map(|(_, r)| reply(r).0.status).collect();
        assert_eq!(
            codes,
            [
                Refusal::OutOfBounds.code(),
                Refusal::NoSegment.code(),
                Refusal::Denied.code(),
                Refusal::Denied.code(),
                Refusal::NoHandler.code()
            ]
        );
        assert!(k.target.memory.borrow().iter().all(|&b| b == 0));
        let s = k.target.stats();
        assert_eq!(
            (
                s.target.out_of_bounds,
                s.target.no_segment,
                s.target.denied,
                s.target.no_handler,
                s.counter
            ),
            (1, 1, 2, 1, 0)
        );
    }

    fn ready_status(out: &Collect) -> u8 {
        let (h, _) = reply(&out.0.last().unwrap().1);
        assert_eq!(h.kind(), Some(Kind::Ready));
        h.status
    }

    #[test]
    fn a_hello_must_come_from_the_member_at_its_rank() {
        let mut k = kernel(&[]);
        let mut out = Collect::default();
        // No caller named by the daemon: refused.
        k.on_message(0, &hello(0, 0), &mut out);
        assert_eq!(ready_status(&out), Refusal::Denied.code());
        // Member 2 claiming rank 1: refused, and its requests go nowhere.
        k.on_open(1, caller(2));
        k.on_message(1, &hello(1, 0), &mut out);
        assert_eq!(ready_status(&out), Refusal::Denied.code());
        let answered = out.0.len();
        k.on_message(1, &long(7, 0, 0, b"evil"), &mut out);
        assert_eq!(out.0.len(), answered, "a refused connection is not served");
        assert!(k.target.memory.borrow().iter().all(|&b| b == 0));
        // A hello whose members do not parse.
        k.on_open(2, caller(0));
        k.on_message(2, &frame(Head::new(Kind::Hello), &[], &[1, 2, 3]), &mut out);
        assert_eq!(ready_status(&out), Refusal::Malformed.code());
        let s = k.target.stats().target;
        assert_eq!((s.denied, s.malformed), (2, 2));
        // Member 2 as rank 2 is admitted.
        k.on_message(1, &hello(2, 0), &mut out);
        assert_eq!(ready_status(&out), 0);
    }

    #[test]
    fn one_group_at_a_time_while_its_connections_live() {
        let mut k = kernel(&[]);
        let mut out = Collect::default();
        greet(&mut k, 0, 0, 0, &mut out);
        assert_eq!(ready_status(&out), 0);
        // Another group (four members) while the first one's connection lives.
        k.on_open(1, caller(1));
        k.on_message(1, &hello_of(1, 0, 4), &mut out);
        assert_eq!(ready_status(&out), Refusal::Denied.code());
        // The same group is welcome.
        k.on_message(1, &hello(1, 0), &mut out);
        assert_eq!(ready_status(&out), 0);
        // Once both closed, the next job's group is taken.
        k.on_close(0);
        k.on_close(1);
        k.on_open(5, caller(3));
        k.on_message(5, &hello_of(3, 0, 4), &mut out);
        assert_eq!(ready_status(&out), 0);
    }

    #[test]
    fn a_reused_connection_starts_without_the_old_ones_hello() {
        let mut k = kernel(&[("segment_bytes", "64")]);
        let mut out = Collect::default();
        greet(&mut k, 4, 0, 0, &mut out);
        // The daemon gives slot 4 to a new connection: it must say hello.
        k.on_open(4, caller(1));
        let answered = out.0.len();
        k.on_message(4, &long(1, 0, 0, b"abcd"), &mut out);
        assert_eq!(out.0.len(), answered);
        assert_eq!(k.target.stats().target.malformed, 1);
        assert!(k.target.memory.borrow().iter().all(|&b| b == 0));
    }

    #[test]
    fn a_frame_before_the_hello_is_counted_and_not_answered() {
        let mut k = kernel(&[]);
        let mut out = Collect::default();
        k.on_message(2, &long(1, 0, 0, b"x"), &mut out);
        assert!(out.0.is_empty());
        assert_eq!(k.target.stats().target.malformed, 1);
    }

    #[test]
    fn async_puts_give_credit_back_on_their_own_at_a_quarter_of_the_window() {
        let mut k = kernel(&[("segment_bytes", "65536")]);
        let mut out = Collect::default();
        greet(&mut k, 0, 0, 256 * 1024, &mut out);
        let mut put = long(1, 0, 0, &[7; 16_400]);
        put[1] = FLAG_ASYNC;
        for _ in 0..4 {
            k.on_message(0, &put, &mut out);
        }
        // 3 × 16,440 bytes stay under 64 KiB, 4 reach it: one credit frame.
        assert_eq!(out.0.len(), 2);
        let (h, _) = reply(&out.0[1].1);
        assert_eq!(
            (h.kind(), h.credit),
            (Some(Kind::Credit), 4 * put.len() as u32)
        );
    }

    #[test]
    fn the_statistics_segment_reads_what_was_counted() {
        let mut k = kernel(&[]);
        let mut out = Collect::default();
        greet(&mut k, 0, 0, 0, &mut out);
        k.on_message(0, &long(1, 3, 0, b"x"), &mut out);
        let get = frame(
            Head {
                token: 2,
                segment: STATS_SEGMENT,
                len: STATS_BYTES as u32,
                ..Head::new(Kind::GetLong)
            },
            &0u64.to_be_bytes(),
            &[],
        );
        k.on_message(0, &get, &mut out);
        let (h, data) = reply(&out.0[2].1);
        assert_eq!(h.status, 0);
        let stats = HardwareStats::decode(&data).unwrap();
        assert_eq!((stats.target.frames, stats.target.no_segment), (2, 1));
    }

    #[test]
    fn bad_parameters_are_refused_with_the_reason() {
        let err = |pairs: &[(&str, &str)]| Layout::from_params(&params(pairs)).unwrap_err();
        assert!(err(&[("segments", "0")]).contains("segments"));
        assert!(err(&[("segments", "65")]).contains("segments"));
        assert!(err(&[("segment_bytes", "4")]).contains("segment_bytes"));
        assert!(err(&[("segments", "64"), ("segment_bytes", "2000000")]).contains("memory"));
        assert!(err(&[("acl", "rw,ro")]).contains("2 entries"));
        assert!(err(&[("acl", "everyone")]).contains("acl"));
        assert!(err(&[("colour", "blue")]).contains("unknown parameter"));
        let l = Layout::from_params(&params(&[("segments", "2"), ("acl", "ro, 1+3")])).unwrap();
        assert_eq!(l.acls, [Acl::ReadOnly, Acl::Ranks([1, 3].into())]);
        assert_eq!(l.segment_bytes, 64 << 10);
    }
}
