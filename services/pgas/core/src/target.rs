//! The target side of an endpoint: what happens to requests that arrive.
//!
//! [`Inbound`] is a sans-IO state machine, one per sending endpoint: it
//! takes the frames of that sender's data connection in order and
//! returns the replies to send. It decodes and validates every frame,
//! follows multi-frame messages (a refused first frame discards the rest
//! of its message), and asks a [`Target`] for everything that touches
//! memory or runs a handler. `SoftTarget` is the software target over
//! an endpoint's segments and handlers (in `uniplane-pgas`); the
//! `pgas-target` kernel of `uniplane-kernel` implements [`Target`] over
//! its own memory: a hardware endpoint.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::access::{Access, AtomicOp, SegmentId, Width};
use crate::wire::{self, Head, Kind, Shape, FLAG_ASYNC, HEADER_LEN, MAX_FRAME};

/// A handler's number; see [`HANDLER_NONE`], [`HANDLER_COUNTER`] and
/// [`FIRST_USER_HANDLER`].
pub type HandlerId = u16;

/// No handler: a long message only lands, a short one only replies.
pub const HANDLER_NONE: HandlerId = 0;
/// The built-in counter: adds the message's `arg` to the target's
/// counter (`uniplane_pgas::Endpoint::wait_counter` at a software
/// endpoint) once its payload landed.
pub const HANDLER_COUNTER: HandlerId = 1;
/// User handlers take IDs from here up; lower ones are built in.
pub const FIRST_USER_HANDLER: HandlerId = 16;

/// Why a target refused a request. Nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The access reaches past the end of the segment.
    #[error("out of the segment's bounds")]
    OutOfBounds,
    /// No segment has that ID.
    #[error("no such segment")]
    NoSegment,
    /// No handler has that ID.
    #[error("no such handler")]
    NoHandler,
    /// The segment's ACL does not allow this rank this access.
    #[error("denied by the segment's ACL")]
    Denied,
    /// An atomic's offset is not a multiple of its width.
    #[error("misaligned atomic")]
    Misaligned,
    /// The request's frames could not be decoded.
    #[error("malformed request")]
    Malformed,
    /// Larger than the target accepts (a medium payload, a handler's
    /// answer to a get).
    #[error("too large")]
    TooLarge,
}

impl Refusal {
    /// Its status code in a reply.
    pub fn code(self) -> u8 {
        match self {
            Refusal::OutOfBounds => 1,
            Refusal::NoSegment => 2,
            Refusal::NoHandler => 3,
            Refusal::Denied => 4,
            Refusal::Misaligned => 5,
            Refusal::Malformed => 6,
            Refusal::TooLarge => 7,
        }
    }

    /// The refusal of status `code` (an unknown code reads as malformed).
    pub fn from_code(code: u8) -> Option<Refusal> {
        Some(match code {
            0 => return None,
            1 => Refusal::OutOfBounds,
            2 => Refusal::NoSegment,
            3 => Refusal::NoHandler,
            4 => Refusal::Denied,
            5 => Refusal::Misaligned,
            7 => Refusal::TooLarge,
            _ => Refusal::Malformed,
        })
    }
}

/// What a handler is given.
#[derive(Debug)]
pub struct AmCall<'a> {
    /// The sender's rank.
    pub source: usize,
    /// The message's argument.
    pub arg: u64,
    /// A medium message's payload (empty for short and long ones).
    pub payload: &'a [u8],
    /// For a long message: the segment its payload landed in, and bytes.
    pub landed: Option<(SegmentId, u64)>,
}

/// The largest answer to one get frame (a get-long is split into as many
/// as it needs; a get-medium answer must fit one).
pub const MAX_GET: usize = MAX_FRAME - HEADER_LEN;

/// The memory and handlers behind an endpoint: the seam between the
/// protocol ([`Inbound`]) and what executes it, software in
/// `uniplane-pgas`, a kernel's own memory for hardware endpoints. Not
/// `Sync`: a hardware endpoint serves one request at a time.
pub trait Target: Send {
    /// Whether `source` may make `access` to bytes `[0, end)` of `segment`.
    fn check(
        &self,
        source: usize,
        segment: SegmentId,
        access: Access,
        end: u64,
    ) -> Result<(), Refusal>;
    /// Runs `f` on the bytes of `segment` (after [`Target::check`]).
    fn land(&self, segment: SegmentId, f: &mut dyn FnMut(&mut [u8])) -> Result<(), Refusal>;
    /// `len` bytes at `offset` of `segment` (after [`Target::check`]).
    fn read(&self, segment: SegmentId, offset: u64, len: usize) -> Result<Bytes, Refusal>;
    /// Runs an atomic on the word at `offset` of `segment`: the old value.
    fn atomic(
        &self,
        source: usize,
        segment: SegmentId,
        offset: u64,
        width: Width,
        op: AtomicOp,
    ) -> Result<u64, Refusal>;
    /// Whether handler `id` exists.
    fn has_handler(&self, id: HandlerId) -> bool;
    /// Runs handler `id`.
    fn invoke(&self, id: HandlerId, call: AmCall<'_>) -> Result<Bytes, Refusal>;
    /// A long message of `bytes` bytes finished landing (before its
    /// handler runs). Nothing by default.
    fn landed(&self, bytes: u64) {
        let _ = bytes;
    }
    /// Whether segment `segment` may be written by its senders
    /// themselves ([`wire::FLAG_LANDED`]): shared memory a hardware target
    /// does not have. None by default.
    fn shares(&self, segment: SegmentId) -> bool {
        let _ = segment;
        false
    }
}

/// What a target counted: frames taken and requests refused, by reason.
#[derive(Default, Debug)]
pub struct TargetCounters {
    frames: AtomicU64,
    malformed: AtomicU64,
    refused: [AtomicU64; 8],
}

/// A copy of [`TargetCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetStats {
    /// Data frames received.
    pub frames: u64,
    /// Frames that could not be decoded (dropped).
    pub malformed: u64,
    /// Requests refused for reaching out of bounds.
    pub out_of_bounds: u64,
    /// Requests refused for naming no segment.
    pub no_segment: u64,
    /// Requests refused for naming no handler.
    pub no_handler: u64,
    /// Requests the ACL denied.
    pub denied: u64,
    /// Misaligned atomics.
    pub misaligned: u64,
    /// Requests too large.
    pub too_large: u64,
}

impl TargetCounters {
    /// Counts a refusal: under `malformed` for [`Refusal::Malformed`],
    /// else under its reason.
    pub fn count_refused(&self, r: Refusal) {
        if r == Refusal::Malformed {
            self.malformed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.refused[usize::from(r.code())].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a frame that could not be decoded outside [`Inbound`]
    /// (a control frame, a stray hello).
    pub fn count_malformed(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot.
    pub fn snapshot(&self) -> TargetStats {
        let r = |c: Refusal| self.refused[usize::from(c.code())].load(Ordering::Relaxed);
        TargetStats {
            frames: self.frames.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
            out_of_bounds: r(Refusal::OutOfBounds),
            no_segment: r(Refusal::NoSegment),
            no_handler: r(Refusal::NoHandler),
            denied: r(Refusal::Denied),
            misaligned: r(Refusal::Misaligned),
            too_large: r(Refusal::TooLarge),
        }
    }
}

/// A reply to send to the request's sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The request's token.
    pub token: u32,
    /// The request's flags (the sender counts replies to non-async ones).
    pub flags: u8,
    /// `None` when it succeeded.
    pub refusal: Option<Refusal>,
    /// An atomic's old value.
    pub value: u64,
    /// A get's data.
    pub data: Bytes,
}

impl Reply {
    /// The reply frame, giving back `credit` bytes.
    pub fn encode(&self, credit: u32) -> Bytes {
        let mut b = BytesMut::with_capacity(HEADER_LEN + self.data.len());
        self.put(credit, &mut b);
        b.freeze()
    }

    /// Appends the reply frame, giving back `credit` bytes, to `b` (a
    /// buffer reused from reply to reply).
    pub fn put(&self, credit: u32, b: &mut BytesMut) {
        Head {
            token: self.token,
            flags: self.flags,
            status: self.refusal.map_or(0, Refusal::code),
            arg: self.value,
            credit,
            len: self.data.len() as u32,
            ..Head::new(Kind::Reply)
        }
        .put(b);
        b.extend_from_slice(&self.data);
    }
}

/// A message whose first frame came and whose payload is still coming.
enum Partial {
    /// A long message landing piece by piece.
    Landing {
        head: Head,
        shape: Shape,
        total: u64,
        /// Payload bytes still to come.
        remaining: u64,
        /// Current piece and bytes of it already written.
        piece: usize,
        within: u64,
    },
    /// A medium message's payload being gathered for its handler.
    Gathering {
        head: Head,
        buf: BytesMut,
        remaining: u64,
    },
    /// The rest of a refused message, dropped as it comes.
    Discarding { remaining: u64 },
}

/// The protocol state of one sender's data connection at the target.
pub struct Inbound {
    source: usize,
    partial: Option<Partial>,
    max_medium: usize,
    counters: Arc<TargetCounters>,
}

impl Inbound {
    /// The state for frames from rank `source`; medium payloads larger
    /// than `max_medium` are refused.
    pub fn new(source: usize, max_medium: usize, counters: Arc<TargetCounters>) -> Inbound {
        Inbound {
            source,
            partial: None,
            max_medium,
            counters,
        }
    }

    /// The sending rank.
    pub fn source(&self) -> usize {
        self.source
    }

    /// Takes one frame; replies go to `out`.
    pub fn on_frame(&mut self, target: &dyn Target, frame: &[u8], out: &mut Vec<Reply>) {
        self.counters.frames.fetch_add(1, Ordering::Relaxed);
        let (head, rest) = match Head::parse(frame) {
            Ok(x) => x,
            Err(_) => {
                self.counters.count_refused(Refusal::Malformed);
                self.abandon(out);
                return;
            }
        };
        if head.kind() == Some(Kind::Cont) {
            self.continue_with(target, rest, out);
            return;
        }
        // A new message while one is still coming: the old one was cut.
        self.abandon(out);
        if let Err(r) = self.start(target, head, rest, out) {
            self.counters.count_refused(r);
            let remaining = u64::from(head.len).saturating_sub(rest.len() as u64);
            if remaining > 0 && is_multi_frame(&head) {
                self.partial = Some(Partial::Discarding { remaining });
            }
            out.push(reply(&head, Some(r)));
        }
    }

    /// Ends a message in progress as malformed.
    fn abandon(&mut self, out: &mut Vec<Reply>) {
        match self.partial.take() {
            Some(Partial::Landing { head, .. }) | Some(Partial::Gathering { head, .. }) => {
                self.counters.count_refused(Refusal::Malformed);
                out.push(reply(&head, Some(Refusal::Malformed)));
            }
            Some(Partial::Discarding { .. }) | None => {}
        }
    }

    fn start(
        &mut self,
        target: &dyn Target,
        head: Head,
        rest: &[u8],
        out: &mut Vec<Reply>,
    ) -> Result<(), Refusal> {
        let kind = head.kind().ok_or(Refusal::Malformed)?;
        match kind {
            Kind::Short | Kind::Flush => {
                if kind == Kind::Short {
                    self.run_handler(target, &head, &[], None)?;
                }
                push_reply(out, &head, None, 0, Bytes::new());
            }
            Kind::Medium => {
                if !target.has_handler(head.handler) {
                    return Err(Refusal::NoHandler);
                }
                let total = u64::from(head.len);
                if total > self.max_medium as u64 {
                    return Err(Refusal::TooLarge);
                }
                if rest.len() as u64 > total {
                    return Err(Refusal::Malformed);
                }
                if rest.len() as u64 == total {
                    self.run_handler(target, &head, rest, None)?;
                    push_reply(out, &head, None, 0, Bytes::new());
                } else {
                    let mut buf = BytesMut::with_capacity(total as usize);
                    buf.extend_from_slice(rest);
                    self.partial = Some(Partial::Gathering {
                        head,
                        buf,
                        remaining: total - rest.len() as u64,
                    });
                }
            }
            Kind::Long | Kind::Strided | Kind::Vectored => {
                let (shape, payload) =
                    wire::parse_shape(&head, rest).map_err(|_| Refusal::Malformed)?;
                let total = u64::from(head.len);
                if payload.len() as u64 > total {
                    return Err(Refusal::Malformed);
                }
                if !target.has_handler(head.handler) {
                    return Err(Refusal::NoHandler);
                }
                let end = shape.end(total).ok_or(Refusal::Malformed)?;
                target.check(self.source, head.segment, Access::Write, end)?;
                if head.flags & wire::FLAG_LANDED != 0 {
                    // Written by the sender into shared bytes: nothing
                    // comes in frames, the rest is as for any long.
                    if kind != Kind::Long || !payload.is_empty() || !target.shares(head.segment) {
                        return Err(Refusal::Malformed);
                    }
                    let state = Partial::Landing {
                        head,
                        shape,
                        total,
                        remaining: 0,
                        piece: 0,
                        within: 0,
                    };
                    return self.finish_or_keep(target, state, out);
                }
                let mut state = Partial::Landing {
                    head,
                    shape,
                    total,
                    remaining: total,
                    piece: 0,
                    within: 0,
                };
                land(target, &mut state, payload)?;
                self.finish_or_keep(target, state, out)?;
            }
            Kind::GetMedium => {
                if !target.has_handler(head.handler) {
                    return Err(Refusal::NoHandler);
                }
                let data = self.run_handler(target, &head, rest, None)?;
                if data.len() > MAX_GET {
                    return Err(Refusal::TooLarge);
                }
                push_reply(out, &head, None, 0, data);
            }
            Kind::GetLong => {
                let [offset, _, _] =
                    wire::parse_words(&head, rest).map_err(|_| Refusal::Malformed)?;
                let len = head.len as usize;
                if len > MAX_GET {
                    return Err(Refusal::TooLarge);
                }
                let end = offset.checked_add(len as u64).ok_or(Refusal::OutOfBounds)?;
                target.check(self.source, head.segment, Access::Read, end)?;
                let data = target.read(head.segment, offset, len)?;
                push_reply(out, &head, None, 0, data);
            }
            Kind::Atomic => {
                let [offset, compare, _] =
                    wire::parse_words(&head, rest).map_err(|_| Refusal::Malformed)?;
                let width = Width::from_bytes(head.count).ok_or(Refusal::Malformed)?;
                let op = AtomicOp::decode(head.op, head.arg, compare).ok_or(Refusal::Malformed)?;
                let end = offset
                    .checked_add(width.bytes() as u64)
                    .ok_or(Refusal::OutOfBounds)?;
                target.check(self.source, head.segment, Access::Write, end)?;
                let old = target.atomic(self.source, head.segment, offset, width, op)?;
                push_reply(out, &head, None, old, Bytes::new());
            }
            // Control frames have no business on a data connection.
            Kind::Cont
            | Kind::Reply
            | Kind::Credit
            | Kind::BarrierEnter
            | Kind::BarrierRelease
            | Kind::Hello
            | Kind::Ready => return Err(Refusal::Malformed),
        }
        Ok(())
    }

    fn continue_with(&mut self, target: &dyn Target, data: &[u8], out: &mut Vec<Reply>) {
        let Some(mut state) = self.partial.take() else {
            // A continuation without a message.
            self.counters.count_refused(Refusal::Malformed);
            return;
        };
        let result = match &mut state {
            Partial::Discarding { remaining } => {
                *remaining = remaining.saturating_sub(data.len() as u64);
                if *remaining > 0 {
                    self.partial = Some(state);
                }
                return;
            }
            Partial::Gathering { buf, remaining, .. } => {
                if data.len() as u64 > *remaining {
                    Err(Refusal::Malformed)
                } else {
                    buf.extend_from_slice(data);
                    *remaining -= data.len() as u64;
                    Ok(())
                }
            }
            Partial::Landing { .. } => land(target, &mut state, data),
        };
        let head = match &state {
            Partial::Landing { head, .. } | Partial::Gathering { head, .. } => *head,
            Partial::Discarding { .. } => return,
        };
        if let Err(r) = result.and_then(|()| self.finish_or_keep(target, state, out)) {
            self.counters.count_refused(r);
            out.push(reply(&head, Some(r)));
        }
    }

    /// Completes `state` when its payload is all there, or keeps it.
    fn finish_or_keep(
        &mut self,
        target: &dyn Target,
        state: Partial,
        out: &mut Vec<Reply>,
    ) -> Result<(), Refusal> {
        match state {
            Partial::Landing {
                head,
                remaining: 0,
                total,
                ..
            } => {
                target.landed(total);
                if head.handler != HANDLER_NONE {
                    self.run_handler(target, &head, &[], Some((head.segment, total)))?;
                }
                push_reply(out, &head, None, 0, Bytes::new());
            }
            Partial::Gathering {
                head,
                buf,
                remaining: 0,
            } => {
                self.run_handler(target, &head, &buf, None)?;
                push_reply(out, &head, None, 0, Bytes::new());
            }
            other => self.partial = Some(other),
        }
        Ok(())
    }

    fn run_handler(
        &self,
        target: &dyn Target,
        head: &Head,
        payload: &[u8],
        landed: Option<(SegmentId, u64)>,
    ) -> Result<Bytes, Refusal> {
        if !target.has_handler(head.handler) {
            return Err(Refusal::NoHandler);
        }
        target.invoke(
            head.handler,
            AmCall {
                source: self.source,
                arg: head.arg,
                payload,
                landed,
            },
        )
    }
}

/// Whether a refused message of this kind may still have frames coming.
fn is_multi_frame(head: &Head) -> bool {
    matches!(
        head.kind(),
        Some(Kind::Medium | Kind::Long | Kind::Strided | Kind::Vectored)
    )
}

/// Writes `data`, the next bytes of a landing message, through its shape.
fn land(target: &dyn Target, state: &mut Partial, mut data: &[u8]) -> Result<(), Refusal> {
    let Partial::Landing {
        head,
        shape,
        total,
        remaining,
        piece,
        within,
    } = state
    else {
        return Err(Refusal::Malformed);
    };
    if data.len() as u64 > *remaining {
        return Err(Refusal::Malformed);
    }
    if data.is_empty() {
        return Ok(());
    }
    *remaining -= data.len() as u64;
    let pieces = shape.pieces(*total);
    let mut result = Ok(());
    target.land(head.segment, &mut |mem: &mut [u8]| {
        while !data.is_empty() && *piece < pieces {
            let (offset, len) = shape.piece(*piece, *total);
            let take = (len - *within).min(data.len() as u64) as usize;
            let start = (offset + *within) as usize;
            match mem.get_mut(start..start + take) {
                Some(dst) => dst.copy_from_slice(&data[..take]),
                None => {
                    result = Err(Refusal::OutOfBounds);
                    return;
                }
            }
            data = &data[take..];
            *within += take as u64;
            if *within == len {
                *piece += 1;
                *within = 0;
            }
        }
    })?;
    result
}

/// The reply a request gets: none for a successful asynchronous one.
fn push_reply(
    out: &mut Vec<Reply>,
    head: &Head,
    refusal: Option<Refusal>,
    value: u64,
    data: Bytes,
) {
    if head.flags & FLAG_ASYNC == 0 || refusal.is_some() {
        out.push(Reply {
            token: head.token,
            flags: head.flags,
            refusal,
            value,
            data,
        });
    }
}

fn reply(head: &Head, refusal: Option<Refusal>) -> Reply {
    Reply {
        token: head.token,
        flags: head.flags,
        refusal,
        value: 0,
        data: Bytes::new(),
    }
}
