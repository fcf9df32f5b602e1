//! The target side of a software endpoint: [`SoftTarget`], the segments
//! and handlers of this process behind the protocol core's
//! [`Inbound`] (`uniplane-pgas-core`, shared with hardware endpoints).

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use rustc_hash::FxHashMap;

pub use uniplane_pgas_core::target::*;

use crate::segment::{Access, AtomicOp, SegmentId, SegmentMemory, Width};
use crate::Progress;

/// A user handler. It runs on the endpoint's receive task, in the order
/// messages arrive from each sender, so it must be short and must not
/// block. What it returns is the answer to a get-medium (at most
/// [`MAX_GET`] bytes) and ignored otherwise.
pub type Handler = Arc<dyn Fn(AmCall<'_>) -> Bytes + Send + Sync>;

/// The software target: an endpoint's segments and handlers in this
/// process.
pub struct SoftTarget {
    pub(crate) segments: RwLock<FxHashMap<SegmentId, Arc<SegmentMemory>>>,
    pub(crate) handlers: RwLock<FxHashMap<HandlerId, Handler>>,
    progress: Arc<Progress>,
}

impl SoftTarget {
    pub(crate) fn new(progress: Arc<Progress>) -> SoftTarget {
        SoftTarget {
            segments: RwLock::default(),
            handlers: RwLock::default(),
            progress,
        }
    }

    fn segment(&self, id: SegmentId) -> Result<Arc<SegmentMemory>, Refusal> {
        self.segments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
            .ok_or(Refusal::NoSegment)
    }
}

impl Target for SoftTarget {
    fn check(
        &self,
        source: usize,
        segment: SegmentId,
        access: Access,
        end: u64,
    ) -> Result<(), Refusal> {
        let s = self.segment(segment)?;
        if !s.acl.allows(source, access) {
            return Err(Refusal::Denied);
        }
        if end > s.lock().len() as u64 {
            return Err(Refusal::OutOfBounds);
        }
        Ok(())
    }

    fn land(&self, segment: SegmentId, f: &mut dyn FnMut(&mut [u8])) -> Result<(), Refusal> {
        let s = self.segment(segment)?;
        f(&mut s.lock());
        Ok(())
    }

    fn read(&self, segment: SegmentId, offset: u64, len: usize) -> Result<Bytes, Refusal> {
        let s = self.segment(segment)?;
        let bytes = s.lock();
        let start = usize::try_from(offset).map_err(|_| Refusal::OutOfBounds)?;
        start
            .checked_add(len)
            .and_then(|end| bytes.get(start..end))
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
        let s = self.segment(segment)?;
        if !s.acl.allows(source, Access::Write) {
            return Err(Refusal::Denied);
        }
        s.atomic(offset, width, op)
    }

    fn has_handler(&self, id: HandlerId) -> bool {
        id == HANDLER_NONE
            || id == HANDLER_COUNTER
            || self
                .handlers
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&id)
    }

    fn landed(&self, bytes: u64) {
        self.progress.mem.fetch_add(bytes, Ordering::AcqRel);
        self.progress.notify.notify_waiters();
    }

    fn shares(&self, segment: SegmentId) -> bool {
        // A sender writes directly only under a live grant, so the bytes
        // it announces are in the segment even when it has since been
        // withdrawn.
        self.segment(segment).is_ok()
    }

    fn invoke(&self, id: HandlerId, call: AmCall<'_>) -> Result<Bytes, Refusal> {
        match id {
            HANDLER_NONE => Ok(Bytes::new()),
            HANDLER_COUNTER => {
                *self
                    .progress
                    .counter_from
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(call.source)
                    .or_insert(0) += call.arg;
                self.progress.counter.fetch_add(call.arg, Ordering::AcqRel);
                self.progress.notify.notify_waiters();
                Ok(Bytes::new())
            }
            id => {
                let h = self
                    .handlers
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&id)
                    .cloned()
                    .ok_or(Refusal::NoHandler)?;
                Ok(h(call))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::Acl;
    use bytes::BytesMut;
    use uniplane_pgas_core::wire::{Head, Kind, Shape, FLAG_ASYNC, HEADER_LEN};

    fn setup() -> (SoftTarget, Inbound, Arc<SegmentMemory>, Arc<TargetCounters>) {
        let progress = Arc::new(Progress::default());
        let target = SoftTarget::new(progress.clone());
        let seg = Arc::new(SegmentMemory::new(64, Acl::ReadWrite));
        target.segments.write().unwrap().insert(0, seg.clone());
        let counters = Arc::new(TargetCounters::default());
        let inbound = Inbound::new(1, 1 << 20, counters.clone());
        (target, inbound, seg, counters)
    }

    fn long(token: u32, offset: u64, len: u32, part: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        Head {
            token,
            len,
            ..Head::new(Kind::Long)
        }
        .put(&mut b);
        Shape::Contiguous { offset }.put(&mut b);
        b.extend_from_slice(part);
        b.to_vec()
    }

    fn cont(part: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        Head::new(Kind::Cont).put(&mut b);
        b.extend_from_slice(part);
        b.to_vec()
    }

    #[test]
    fn a_long_message_in_three_frames_lands_and_replies_once() {
        let (target, mut inbound, seg, _) = setup();
        let mut out = Vec::new();
        inbound.on_frame(&target, &long(7, 10, 6, b"ab"), &mut out);
        inbound.on_frame(&target, &cont(b"cd"), &mut out);
        assert!(out.is_empty(), "no reply before the last frame");
        inbound.on_frame(&target, &cont(b"ef"), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].token, out[0].refusal), (7, None));
        assert_eq!(&seg.lock()[10..16], b"abcdef");
    }

    #[test]
    fn garbage_and_stray_continuations_are_counted_and_dropped() {
        let (target, mut inbound, seg, counters) = setup();
        let mut out = Vec::new();
        inbound.on_frame(&target, &[1, 2, 3], &mut out);
        inbound.on_frame(&target, &[200; 40], &mut out);
        inbound.on_frame(&target, &cont(b"zz"), &mut out);
        assert!(out.is_empty(), "no token to answer");
        assert_eq!(counters.snapshot().malformed, 3);
        assert_eq!(*seg.lock(), vec![0; 64]);
    }

    #[test]
    fn a_truncated_descriptor_is_refused_as_malformed_with_its_token() {
        let (target, mut inbound, seg, counters) = setup();
        let mut out = Vec::new();
        let mut frame = long(9, 0, 4, b"abcd");
        frame.truncate(HEADER_LEN + 5);
        inbound.on_frame(&target, &frame, &mut out);
        assert_eq!(
            (out[0].token, out[0].refusal),
            (9, Some(Refusal::Malformed))
        );
        assert_eq!(counters.snapshot().malformed, 1);
        assert_eq!(*seg.lock(), vec![0; 64]);
    }

    #[test]
    fn a_message_cut_short_by_the_next_is_refused_and_the_next_still_runs() {
        let (target, mut inbound, seg, _) = setup();
        let mut out = Vec::new();
        inbound.on_frame(&target, &long(1, 0, 8, b"abcd"), &mut out);
        inbound.on_frame(&target, &long(2, 32, 2, b"xy"), &mut out);
        assert_eq!(
            (out[0].token, out[0].refusal),
            (1, Some(Refusal::Malformed))
        );
        assert_eq!((out[1].token, out[1].refusal), (2, None));
        assert_eq!(&seg.lock()[32..34], b"xy");
    }

    #[test]
    fn more_payload_than_announced_is_malformed_and_lands_nothing_more() {
        let (target, mut inbound, seg, _) = setup();
        let mut out = Vec::new();
        inbound.on_frame(&target, &long(3, 0, 4, b"ab"), &mut out);
        inbound.on_frame(&target, &cont(b"cdef"), &mut out);
        assert_eq!(out[0].refusal, Some(Refusal::Malformed));
        assert_eq!(&seg.lock()[..4], b"ab\0\0");
    }

    #[test]
    fn the_rest_of_a_refused_message_is_discarded_not_run() {
        let (target, mut inbound, seg, counters) = setup();
        let mut out = Vec::new();
        // 100 bytes at 0 do not fit 64: refused at the first frame.
        inbound.on_frame(&target, &long(4, 0, 100, &[1; 50]), &mut out);
        inbound.on_frame(&target, &cont(&[2; 50]), &mut out);
        inbound.on_frame(&target, &long(5, 0, 1, b"k"), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0].token, out[0].refusal),
            (4, Some(Refusal::OutOfBounds))
        );
        assert_eq!((out[1].token, out[1].refusal), (5, None));
        assert_eq!(
            counters.snapshot().malformed,
            0,
            "the discarded rest is not malformed"
        );
        assert_eq!(&seg.lock()[..2], b"k\0");
    }

    #[test]
    fn an_async_request_replies_only_when_refused() {
        let (target, mut inbound, _, _) = setup();
        let mut out = Vec::new();
        let mut ok = long(6, 0, 1, b"a");
        ok[1] = FLAG_ASYNC;
        inbound.on_frame(&target, &ok, &mut out);
        assert!(out.is_empty());
        let mut bad = long(8, 64, 1, b"a");
        bad[1] = FLAG_ASYNC;
        inbound.on_frame(&target, &bad, &mut out);
        assert_eq!(
            (out[0].token, out[0].refusal),
            (8, Some(Refusal::OutOfBounds))
        );
    }
}
