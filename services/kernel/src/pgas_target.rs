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
//! A connection's first frame must be the endpoint's `Hello` (its rank,
//! and in `arg` its credit window); a frame before it is counted
//! malformed and answered nothing. The rank in the `Hello` is what the
//! ACL checks: the daemon's connection admission decides who may
//! connect at all, the kernel does not see the caller's UID.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use uniplane_pgas_core::access::{atomic_at, Access, Acl, AtomicOp, SegmentId, Width};
use uniplane_pgas_core::stats::{HardwareStats, STATS_BYTES, STATS_SEGMENT};
use uniplane_pgas_core::target::{
    AmCall, HandlerId, Inbound, Refusal, Reply, Target, TargetCounters, HANDLER_COUNTER,
    HANDLER_NONE,
};
use uniplane_pgas_core::wire::{charge, Head, Kind, HEADER_LEN, MAX_FRAME};

use crate::library::{only, parsed_or, Params, Spec};
use crate::{Emit, Kernel};

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
    /// By kernel connection.
    conns: Vec<Option<Conn>>,
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
            replies: Vec::with_capacity(4),
            scratch: BytesMut::with_capacity(MAX_FRAME),
        }
    }

    /// Its memory and counters.
    pub fn target(&self) -> &DeviceTarget {
        &self.target
    }

    /// A connection's `Hello`: its state starts afresh (a kernel
    /// connection slot may be reused by a new connection) and it is
    /// answered `Ready`.
    fn hello(&mut self, conn: u16, head: &Head, out: &mut dyn Emit) {
        let window = if head.arg == 0 {
            DEFAULT_CREDIT
        } else {
            head.arg
        };
        let state = Conn {
            inbound: Inbound::new(head.len as usize, MAX_MEDIUM, self.target.counters.clone()),
            owed: 0,
            threshold: usize::try_from(window / 4).unwrap_or(usize::MAX),
        };
        let i = usize::from(conn);
        if self.conns.len() <= i {
            self.conns.resize_with(i + 1, || None);
        }
        self.conns[i] = Some(state);
        self.scratch.clear();
        Head::new(Kind::Ready).put(&mut self.scratch);
        out.answer(conn, &self.scratch);
    }
}

impl Kernel for PgasTarget {
    fn name(&self) -> &'static str {
        SPEC.name
    }

    fn on_message(&mut self, conn: u16, payload: &[u8], out: &mut dyn Emit) {
        if let Ok((head, _)) = Head::parse(payload) {
            if head.kind() == Some(Kind::Hello) {
                self.hello(conn, &head, out);
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

    fn hello(rank: u32, window: u64) -> Vec<u8> {
        frame(
            Head {
                len: rank,
                arg: window,
                ..Head::new(Kind::Hello)
            },
            &[],
            &[],
        )
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
        k.on_message(3, &hello(1, 1 << 20), &mut out);
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
        k.on_message(0, &hello(1, 0), &mut out);
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
        k.on_message(0, &hello(0, 256 * 1024), &mut out);
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
        k.on_message(0, &hello(0, 0), &mut out);
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
