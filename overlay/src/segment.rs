//! Segmentation and reassembly: messages larger than a path's MTU travel
//! as FIRST … LAST segments and are put back together at the receiving
//! connector.
//!
//! Segments of one message keep its header (sequence number included) and
//! carry consecutive slices of its payload, without copying: each is a
//! `Bytes::slice`. One-sided writes (WRTE, READ_CMPL, COPY_WRTE) are cut
//! into self-contained writes — each segment's address and length are its
//! own — so the far side applies them as they come and never reassembles.
//!
//! Reassembly expects the segments of a message in order, as every
//! ordered path delivers them; segments of different messages and
//! sources may interleave freely. Memory for messages under reassembly is
//! bounded, and [`Reassembler::expire`] reports messages whose segments
//! stopped coming.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rustc_hash::FxHashMap;
use uniplane_dataplane::wire::{Header, MemoryParams, MsgFlags, ParamForm, Params, Request};
use uniplane_dataplane::{Message, Uid};

/// Cuts `message` into segments of at most `max_payload` payload bytes and
/// hands each to `emit`. A message that fits is handed over unchanged.
/// Returns the number of segments.
pub fn segment(message: Message, max_payload: usize, mut emit: impl FnMut(Message)) -> usize {
    let max = max_payload.max(1);
    if message.payload().len() <= max {
        emit(message);
        return 1;
    }
    let (header, payload) = message.into_parts();
    let memory = matches!(header.request.params(), Params::Memory(_));
    let count = payload.len().div_ceil(max);
    for i in 0..count {
        let start = i * max;
        let end = (start + max).min(payload.len());
        let mut h = header;
        // ERROR stays on every segment; PUSH marks the end, with LAST.
        let mut flags = header
            .flags
            .without(MsgFlags::WHOLE)
            .without(MsgFlags::PUSH);
        if i == 0 {
            flags = flags.with(MsgFlags::FIRST);
        }
        if i + 1 == count {
            flags = flags.with(MsgFlags::LAST);
            if header.flags.contains(MsgFlags::PUSH) {
                flags = flags.with(MsgFlags::PUSH);
            }
        }
        h.flags = flags;
        if memory {
            if let Params::Memory(p) = *header.request.params() {
                let params = Params::Memory(MemoryParams {
                    addr: p.addr.wrapping_add(start as u64),
                    ..p
                });
                if let Ok(r) = Request::new(header.request.kind(), params) {
                    h.request = r;
                }
            }
        }
        match Message::new(h, payload.slice(start..end)) {
            Ok(m) => emit(m),
            Err(_) => unreachable!("a slice of a valid payload with the original header is valid"),
        }
    }
    count
}

/// Number of segments `len` payload bytes take at `max_payload` per segment.
pub fn segments_needed(len: usize, max_payload: usize) -> usize {
    if len <= max_payload {
        // The common case, without a division per message.
        return 1;
    }
    len.div_ceil(max_payload.max(1)).max(1)
}

/// What identifies the message a segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct SegKey {
    src: Uid,
    dst: Uid,
    kind: u8,
    ports: (u16, u16),
    seqnum: u32,
}

impl SegKey {
    fn of(h: &Header) -> SegKey {
        SegKey {
            src: h.src,
            dst: h.dst,
            kind: h.request.kind().to_u8(),
            ports: h.request.ports().unwrap_or((0, 0)),
            seqnum: h.seqnum,
        }
    }
}

struct Partial {
    header: Header,
    data: BytesMut,
    started: Duration,
}

/// Counters of a reassembler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReassemblyStats {
    /// Messages put back together.
    pub completed: u64,
    /// Messages abandoned: timed out, or replaced by a new FIRST.
    pub incomplete: u64,
    /// Segments with no message open for them (lost FIRST).
    pub orphans: u64,
    /// Messages refused because reassembly memory was full.
    pub overflow: u64,
    /// Reassembled messages too long to be one message.
    pub too_long: u64,
}

/// A message whose segments stopped coming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incomplete {
    /// Header of its first segment.
    pub header: Header,
    /// Payload bytes received.
    pub received: usize,
}

/// Puts segmented messages back together.
pub struct Reassembler {
    open: FxHashMap<SegKey, Partial>,
    /// Open messages in the order they started, for expiry.
    order: VecDeque<(Duration, SegKey)>,
    max_bytes: usize,
    bytes: usize,
    timeout: Duration,
    stats: ReassemblyStats,
}

impl Reassembler {
    /// A reassembler holding at most `max_bytes` of partial payload, giving
    /// up on a message `timeout` after its first segment.
    pub fn new(max_bytes: usize, timeout: Duration) -> Self {
        Reassembler {
            open: FxHashMap::default(),
            order: VecDeque::new(),
            max_bytes,
            bytes: 0,
            timeout,
            stats: ReassemblyStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    /// Messages under reassembly.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// Bytes held for messages under reassembly.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Takes one arriving message or segment at time `now`; returns a whole
    /// message when one is complete. Whole messages and one-sided writes
    /// pass straight through.
    #[inline]
    pub fn push(&mut self, m: Message, now: Duration) -> Option<Message> {
        if Self::passes(&m) {
            return Some(m);
        }
        let flags = m.header().flags;
        self.push_segment(m, flags, now)
    }

    /// Whether `m` passes straight through [`Reassembler::push`]: a
    /// whole message or a one-sided write. A caller that asks first
    /// moves a whole message nowhere.
    #[inline]
    pub fn passes(m: &Message) -> bool {
        m.header().flags.contains(MsgFlags::WHOLE) || m.kind().form() == ParamForm::Memory
    }

    /// A segment: opens, extends or completes its message.
    #[inline(never)]
    fn push_segment(&mut self, m: Message, flags: MsgFlags, now: Duration) -> Option<Message> {
        let key = SegKey::of(m.header());
        if flags.contains(MsgFlags::FIRST) {
            if let Some(old) = self.open.remove(&key) {
                self.bytes -= old.data.len();
                self.stats.incomplete += 1;
            }
            let len = m.payload().len();
            if self.bytes + len > self.max_bytes {
                self.stats.overflow += 1;
                return None;
            }
            let (header, payload) = m.into_parts();
            let mut data = BytesMut::with_capacity(len * 2);
            data.extend_from_slice(&payload);
            self.bytes += len;
            self.open.insert(
                key,
                Partial {
                    header,
                    data,
                    started: now,
                },
            );
            self.order.push_back((now, key));
            return None;
        }
        let Some(partial) = self.open.get_mut(&key) else {
            self.stats.orphans += 1;
            return None;
        };
        let len = m.payload().len();
        if self.bytes + len > self.max_bytes {
            let p = self.open.remove(&key).map(|p| p.data.len()).unwrap_or(0);
            self.bytes -= p;
            self.stats.overflow += 1;
            return None;
        }
        partial.data.extend_from_slice(m.payload());
        self.bytes += len;
        if !flags.contains(MsgFlags::LAST) {
            return None;
        }
        let partial = self.open.remove(&key)?;
        self.bytes -= partial.data.len();
        let mut header = partial.header;
        header.flags = flags.with(MsgFlags::FIRST);
        match Message::new(header, Bytes::from(partial.data)) {
            Ok(whole) => {
                self.stats.completed += 1;
                Some(whole)
            }
            Err(_) => {
                self.stats.too_long += 1;
                None
            }
        }
    }

    /// Abandons messages whose first segment came more than the timeout
    /// before `now`, handing each to `report`.
    pub fn expire(&mut self, now: Duration, mut report: impl FnMut(Incomplete)) {
        while let Some(&(started, key)) = self.order.front() {
            if now.saturating_sub(started) < self.timeout {
                break;
            }
            self.order.pop_front();
            // The entry may be gone (completed) or newer (a later FIRST).
            let stale = self.open.get(&key).is_some_and(|p| p.started == started);
            if stale {
                if let Some(p) = self.open.remove(&key) {
                    self.bytes -= p.data.len();
                    self.stats.incomplete += 1;
                    report(Incomplete {
                        header: p.header,
                        received: p.data.len(),
                    });
                }
            }
        }
        // Entries completed long ago leave keys in `order`; drop them when
        // the queue outgrows the open set.
        if self.order.len() > 4 * self.open.len() + 64 {
            let open = &self.open;
            self.order
                .retain(|(t, k)| open.get(k).is_some_and(|p| p.started == *t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uniplane_dataplane::SplitMix64;

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    fn big(src: u16, seq: u32, len: usize) -> Message {
        let payload: Vec<u8> = (0..len)
            .map(|i| (i as u8) ^ (src as u8) ^ (seq as u8))
            .collect();
        let mut m = Message::send(
            Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), src).port(1),
            uid("10.0.0.2:1").port(2),
            Bytes::from(payload),
        )
        .unwrap();
        m.set_seqnum(seq);
        m
    }

    #[test]
    fn small_messages_pass_whole() {
        let mut out = Vec::new();
        assert_eq!(segment(big(1, 1, 100), 1000, |m| out.push(m)), 1);
        assert_eq!(out[0], big(1, 1, 100));
    }

    #[test]
    fn segments_share_the_payload_and_mark_first_and_last() {
        let m = big(1, 7, 2500);
        let mut out = Vec::new();
        assert_eq!(segment(m.clone(), 1000, |s| out.push(s)), 3);
        let flags: Vec<_> = out.iter().map(|s| s.header().flags).collect();
        assert_eq!(flags[0], MsgFlags::FIRST);
        assert_eq!(flags[1], MsgFlags::EMPTY);
        assert_eq!(flags[2], MsgFlags::LAST);
        assert_eq!(out[2].payload().len(), 500);
        // No copy: the segment points into the original payload.
        assert_eq!(out[1].payload().as_ptr(), m.payload()[1000..].as_ptr());
    }

    #[test]
    fn write_segments_are_self_contained_writes() {
        let w = Message::write(
            uid("1.1.1.1:1"),
            uid("1.1.1.1:2").at(0x1000),
            Bytes::from(vec![1u8; 3000]),
        )
        .unwrap();
        let mut out = Vec::new();
        segment(w, 1024, |s| out.push(s));
        let addrs: Vec<u64> = out
            .iter()
            .map(|s| match s.header().request.params() {
                Params::Memory(p) => {
                    assert_eq!(p.length as usize, s.payload().len());
                    p.addr
                }
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(addrs, vec![0x1000, 0x1400, 0x1800]);
        let mut r = Reassembler::new(1 << 20, Duration::from_secs(1));
        assert!(out.into_iter().all(|s| r.push(s, Duration::ZERO).is_some()));
    }

    #[test]
    fn interleaved_segments_from_64_sources_reassemble() {
        let mut rng = SplitMix64::new(64);
        let originals: Vec<Message> = (0..64u16)
            .map(|s| big(s, s as u32 * 3, 1000 + 37 * s as usize))
            .collect();
        let mut streams: Vec<VecDeque<Message>> = originals
            .iter()
            .map(|m| {
                let mut v = VecDeque::new();
                segment(m.clone(), 128, |s| v.push_back(s));
                v
            })
            .collect();
        let mut r = Reassembler::new(1 << 20, Duration::from_secs(1));
        let mut done = Vec::new();
        // Pick a random source each time: order within a source holds.
        while streams.iter().any(|s| !s.is_empty()) {
            let i = rng.below(64) as usize;
            if let Some(seg) = streams[i].pop_front() {
                if let Some(m) = r.push(seg, Duration::ZERO) {
                    done.push(m);
                }
            }
        }
        assert_eq!(done.len(), 64);
        for m in &done {
            let src = m.header().src.device() as usize;
            assert_eq!(m, &originals[src]);
        }
        assert_eq!(r.bytes(), 0);
        assert_eq!(r.stats().completed, 64);
    }

    #[test]
    fn memory_is_bounded_and_overflow_is_counted() {
        let mut r = Reassembler::new(1500, Duration::from_secs(1));
        let mut segs = Vec::new();
        segment(big(1, 1, 4000), 1000, |s| segs.push(s));
        for s in segs {
            assert!(r.push(s, Duration::ZERO).is_none());
        }
        assert!(r.bytes() <= 1500);
        assert_eq!(r.stats().overflow, 1);
        assert!(r.stats().orphans >= 1);
    }

    #[test]
    fn stalled_messages_expire_and_are_reported() {
        let mut r = Reassembler::new(1 << 20, Duration::from_millis(10));
        let mut segs = Vec::new();
        segment(big(1, 1, 3000), 1000, |s| segs.push(s));
        r.push(segs.remove(0), Duration::ZERO);
        let mut reported = Vec::new();
        r.expire(Duration::from_millis(5), |i| reported.push(i));
        assert!(reported.is_empty());
        r.expire(Duration::from_millis(10), |i| reported.push(i));
        assert_eq!(reported.len(), 1);
        assert_eq!(reported[0].received, 1000);
        assert_eq!(r.open(), 0);
        assert_eq!(r.bytes(), 0);
        assert_eq!(r.stats().incomplete, 1);
        // The rest of it is now orphaned.
        assert!(r.push(segs.remove(0), Duration::from_millis(11)).is_none());
        assert_eq!(r.stats().orphans, 1);
    }
}
