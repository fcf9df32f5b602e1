//! The filter: the control plane's rules on what a stack may send.
//!
//! [`FilterRules`] say which sources may send, how long a message may be,
//! which request types are allowed and which memory windows one-sided
//! accesses may touch. [`FilterRules::check`] is the pure test; [`Filter`]
//! wraps the rules with counters and a bounded queue of
//! [`ViolationEvent`]s the control plane drains. A full event queue counts
//! the event as lost and moves on: the data path never waits for the
//! control plane.

use std::collections::VecDeque;

use uniplane_dataplane::wire::{Header, Params, ReqType};
use uniplane_dataplane::{Message, Uid};

use crate::{Nanos, TypeSet, UidMatch};

/// A range of memory addresses one-sided accesses may touch, on the
/// resources a UID pattern matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressWindow {
    uid: UidMatch,
    base: u64,
    /// Last address inside the window (inclusive), so the window may reach
    /// the top of the 64-bit space.
    last: u64,
}

/// Why an [`AddressWindow`] cannot be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// A window of zero bytes would grant nothing.
    #[error("address window of zero bytes")]
    Empty,
    /// `base + len` lies beyond the 64-bit address space.
    #[error("address window {base:#x}+{len:#x} ends beyond the 64-bit address space")]
    Overflow {
        /// First address.
        base: u64,
        /// Length in bytes.
        len: u64,
    },
}

impl AddressWindow {
    /// The window `[base, base + len)` on the resources `uid` matches.
    pub const fn new(uid: UidMatch, base: u64, len: u64) -> Result<AddressWindow, WindowError> {
        if len == 0 {
            return Err(WindowError::Empty);
        }
        // base + len may equal 2^64: the window then ends at the top.
        match base.checked_add(len - 1) {
            Some(last) => Ok(AddressWindow { uid, base, last }),
            None => Err(WindowError::Overflow { base, len }),
        }
    }

    /// The whole 64-bit address space of the resources `uid` matches.
    pub const fn everything(uid: UidMatch) -> AddressWindow {
        AddressWindow {
            uid,
            base: 0,
            last: u64::MAX,
        }
    }

    /// The resources the window applies to.
    pub const fn uid(&self) -> UidMatch {
        self.uid
    }

    /// First address inside.
    pub const fn base(&self) -> u64 {
        self.base
    }

    /// Last address inside (inclusive).
    pub const fn last(&self) -> u64 {
        self.last
    }

    /// Whether the access of `len` bytes at `addr` of `uid` lies entirely
    /// inside. An access of zero bytes counts as one byte at `addr`.
    #[inline]
    pub const fn contains(&self, uid: Uid, addr: u64, len: u16) -> bool {
        let span = if len == 0 { 0 } else { len as u64 - 1 };
        // addr + span may pass 2^64: such an access wraps and is never inside.
        self.uid.matches(uid)
            && addr >= self.base
            && match addr.checked_add(span) {
                Some(end) => end <= self.last,
                None => false,
            }
    }
}

/// The rules a [`Filter`] applies; replaced as a whole at run time.
///
/// Every field is a whitelist: a message passes only when each rule allows
/// it. [`FilterRules::allow_all`] allows everything; `Default` allows
/// nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilterRules {
    /// Sources allowed to send: a message passes when any pattern matches
    /// its `src_uid`. Empty: no source may send.
    pub sources: Vec<UidMatch>,
    /// Largest message allowed, header and payload together, in bytes.
    pub max_len: usize,
    /// Request types allowed.
    pub types: TypeSet,
    /// Memory one-sided accesses may touch: a WRTE (`dst_addr`,
    /// `req_length` at `dst_uid`), a READ (`src_addr` of the second beat at
    /// `dst_uid`) and a COPY (the same read, and the write at `dst_addr` of
    /// `req_uid`) pass only when every access lies entirely inside one
    /// window whose pattern matches the accessed UID. Empty: no memory
    /// access passes.
    pub windows: Vec<AddressWindow>,
}

impl FilterRules {
    /// Rules that let every message through.
    pub fn allow_all() -> FilterRules {
        FilterRules {
            sources: vec![UidMatch::ANY],
            max_len: usize::MAX,
            types: TypeSet::ALL,
            windows: vec![AddressWindow::everything(UidMatch::ANY)],
        }
    }

    /// Checks `msg` against the rules: sources, then types, then length,
    /// then memory windows; the first rule broken is the answer.
    #[inline]
    pub fn check(&self, msg: &Message) -> Result<(), Violation> {
        let header = msg.header();
        if !self.sources.iter().any(|s| s.matches(header.src)) {
            return Err(Violation::SourceDenied { src: header.src });
        }
        let kind = header.request.kind();
        if !self.types.contains(kind) {
            return Err(Violation::TypeDenied { req_type: kind });
        }
        let len = msg.encoded_len();
        if len > self.max_len {
            return Err(Violation::TooLong {
                len,
                max: self.max_len,
            });
        }
        self.check_windows(header)
    }

    /// The memory-window rule alone.
    #[inline]
    fn check_windows(&self, header: &Header) -> Result<(), Violation> {
        match (header.request.kind(), header.request.params()) {
            (ReqType::Write, Params::Memory(p)) => self.check_access(header.dst, p.addr, p.length),
            (ReqType::Read, Params::Read(p)) => self.check_access(header.dst, p.src_addr, p.length),
            (ReqType::Copy, Params::Copy(p)) => {
                self.check_access(header.dst, p.src_addr, p.length)?;
                self.check_access(p.target, p.dst_addr, p.length)
            }
            _ => Ok(()),
        }
    }

    #[inline]
    fn check_access(&self, uid: Uid, addr: u64, len: u16) -> Result<(), Violation> {
        if self.windows.iter().any(|w| w.contains(uid, addr, len)) {
            Ok(())
        } else {
            Err(Violation::OutOfWindow { uid, addr, len })
        }
    }
}

/// Which rule a message broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Violation {
    /// No source pattern matches `src_uid`.
    #[error("source {src} may not send on this interface")]
    SourceDenied {
        /// The message's source.
        src: Uid,
    },
    /// The request type is not allowed.
    #[error("request type {req_type} is not allowed on this interface")]
    TypeDenied {
        /// The message's type.
        req_type: ReqType,
    },
    /// Header and payload exceed the maximum length.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    TooLong {
        /// Header and payload bytes.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// A one-sided access reaches outside every window granted for the
    /// resource it touches.
    #[error("access of {len} bytes at {uid}@{addr:#x} lies outside every granted window")]
    OutOfWindow {
        /// The resource accessed.
        uid: Uid,
        /// First address accessed.
        addr: u64,
        /// Bytes accessed.
        len: u16,
    },
}

impl Violation {
    /// The rule broken, without the details.
    pub const fn reason(&self) -> Reason {
        match self {
            Violation::SourceDenied { .. } => Reason::SourceDenied,
            Violation::TypeDenied { .. } => Reason::TypeDenied,
            Violation::TooLong { .. } => Reason::TooLong,
            Violation::OutOfWindow { .. } => Reason::OutOfWindow,
        }
    }
}

/// The rules of [`FilterRules`], as counters name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// [`Violation::SourceDenied`].
    SourceDenied,
    /// [`Violation::TypeDenied`].
    TypeDenied,
    /// [`Violation::TooLong`].
    TooLong,
    /// [`Violation::OutOfWindow`].
    OutOfWindow,
}

impl Reason {
    /// Every reason, in check order.
    pub const ALL: [Reason; 4] = [
        Reason::SourceDenied,
        Reason::TypeDenied,
        Reason::TooLong,
        Reason::OutOfWindow,
    ];

    /// A short name for logs and tables (`source_denied`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Reason::SourceDenied => "source_denied",
            Reason::TypeDenied => "type_denied",
            Reason::TooLong => "too_long",
            Reason::OutOfWindow => "out_of_window",
        }
    }
}

/// A dropped message, as reported to the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViolationEvent {
    /// When the message was dropped.
    pub at: Nanos,
    /// The input (stack queue) it came from.
    pub input: usize,
    /// Its source UID.
    pub src: Uid,
    /// Its destination UID.
    pub dst: Uid,
    /// Its request type.
    pub req_type: ReqType,
    /// Its sequence number.
    pub seqnum: u32,
    /// The rule it broke.
    pub violation: Violation,
}

/// What a [`Filter`] has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterCounters {
    /// Messages that passed.
    pub passed: u64,
    /// Dropped: source not allowed.
    pub source_denied: u64,
    /// Dropped: request type not allowed.
    pub type_denied: u64,
    /// Dropped: longer than allowed.
    pub too_long: u64,
    /// Dropped: memory access outside the windows.
    pub out_of_window: u64,
    /// Violations whose event found the event queue full.
    pub lost_events: u64,
}

impl FilterCounters {
    /// Messages dropped for `reason`.
    pub const fn dropped(&self, reason: Reason) -> u64 {
        match reason {
            Reason::SourceDenied => self.source_denied,
            Reason::TypeDenied => self.type_denied,
            Reason::TooLong => self.too_long,
            Reason::OutOfWindow => self.out_of_window,
        }
    }

    /// Messages dropped for any reason.
    pub const fn dropped_total(&self) -> u64 {
        self.source_denied + self.type_denied + self.too_long + self.out_of_window
    }

    fn count(&mut self, reason: Reason) {
        let c = match reason {
            Reason::SourceDenied => &mut self.source_denied,
            Reason::TypeDenied => &mut self.type_denied,
            Reason::TooLong => &mut self.too_long,
            Reason::OutOfWindow => &mut self.out_of_window,
        };
        *c += 1;
    }
}

/// [`FilterRules`] with counters and a bounded event queue.
#[derive(Debug, Clone)]
pub struct Filter {
    rules: FilterRules,
    counters: FilterCounters,
    events: VecDeque<ViolationEvent>,
    event_capacity: usize,
}

impl Filter {
    /// A filter applying `rules` that keeps up to `event_capacity`
    /// undrained events (the queue is allocated now, never on the data path).
    pub fn new(rules: FilterRules, event_capacity: usize) -> Filter {
        Filter {
            rules,
            counters: FilterCounters::default(),
            events: VecDeque::with_capacity(event_capacity),
            event_capacity,
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> &FilterRules {
        &self.rules
    }

    /// Replaces the rules; the next message is checked against the new ones.
    /// Counters and undrained events are kept.
    pub fn set_rules(&mut self, rules: FilterRules) {
        self.rules = rules;
    }

    /// Checks `msg`, which came from `input`, at time `now`. A violation is
    /// counted and reported as an event (or counted as a lost event when
    /// the queue is full); the caller drops the message.
    #[inline]
    pub fn check(&mut self, input: usize, msg: &Message, now: Nanos) -> Result<(), Violation> {
        match self.rules.check(msg) {
            Ok(()) => {
                self.counters.passed += 1;
                Ok(())
            }
            Err(violation) => {
                self.report(input, msg.header(), violation, now);
                Err(violation)
            }
        }
    }

    #[cold]
    fn report(&mut self, input: usize, header: &Header, violation: Violation, now: Nanos) {
        self.counters.count(violation.reason());
        if self.events.len() >= self.event_capacity {
            self.counters.lost_events += 1;
            return;
        }
        self.events.push_back(ViolationEvent {
            at: now,
            input,
            src: header.src,
            dst: header.dst,
            req_type: header.request.kind(),
            seqnum: header.seqnum,
            violation,
        });
    }

    /// The counters.
    pub fn counters(&self) -> &FilterCounters {
        &self.counters
    }

    /// The oldest undrained event.
    pub fn pop_event(&mut self) -> Option<ViolationEvent> {
        self.events.pop_front()
    }

    /// Takes every undrained event, oldest first.
    pub fn drain_events(&mut self) -> impl Iterator<Item = ViolationEvent> + '_ {
        self.events.drain(..)
    }

    /// Events waiting to be drained.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use uniplane_dataplane::wire::{CopyParams, Request};

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    fn send(src: &str, dst: &str, len: usize) -> Message {
        Message::send(
            uid(src).port(1),
            uid(dst).port(2),
            Bytes::from(vec![0u8; len]),
        )
        .unwrap()
    }

    fn write(dst: &str, addr: u64, len: usize) -> Message {
        Message::write(
            uid("10.0.0.1:1"),
            uid(dst).at(addr),
            Bytes::from(vec![0u8; len]),
        )
        .unwrap()
    }

    fn read(dst: &str, addr: u64, len: u16) -> Message {
        Message::read(uid("10.0.0.1:1").at(0x100), uid(dst).at(addr), len).unwrap()
    }

    fn copy(dst: &str, src_addr: u64, target: &str, dst_addr: u64, len: u16) -> Message {
        let params = Params::Copy(CopyParams {
            flag: 0,
            length: len,
            target: uid(target),
            src_addr,
            dst_addr,
        });
        let request = Request::new(ReqType::Copy, params).unwrap();
        Message::new(
            Header::new(uid("10.0.0.1:1"), uid(dst), request),
            Bytes::new(),
        )
        .unwrap()
    }

    /// Everything allowed except what the test narrows.
    fn filter(edit: impl FnOnce(&mut FilterRules)) -> Filter {
        let mut rules = FilterRules::allow_all();
        edit(&mut rules);
        Filter::new(rules, 8)
    }

    /// Checks that `msg` is dropped for `reason`, counted once and reported.
    fn assert_dropped(f: &mut Filter, msg: &Message, reason: Reason) {
        let before = f.counters().dropped(reason);
        let err = f.check(3, msg, 77).unwrap_err();
        assert_eq!(err.reason(), reason, "{err}");
        assert_eq!(f.counters().dropped(reason), before + 1);
        let event = f.drain_events().last().expect("an event");
        assert_eq!(
            (event.at, event.input, event.violation),
            (77, 3, err),
            "{event:?}"
        );
        assert_eq!(event.src, msg.header().src);
        assert_eq!(event.req_type, msg.kind());
    }

    #[test]
    fn allow_all_passes_every_kind_of_message() {
        let mut f = Filter::new(FilterRules::allow_all(), 1);
        for msg in [
            send("1.1.1.1:1", "2.2.2.2:2", 100),
            write("2.2.2.2:2", u64::MAX, 1),
            read("2.2.2.2:2", u64::MAX - 9, 10),
            copy("2.2.2.2:2", 0, "3.3.3.3:3", u64::MAX, 1),
        ] {
            assert_eq!(f.check(0, &msg, 0), Ok(()));
        }
        assert_eq!(f.counters().passed, 4);
    }

    #[test]
    fn default_rules_deny_everything() {
        let mut f = Filter::new(FilterRules::default(), 1);
        assert_dropped(
            &mut f,
            &send("1.1.1.1:1", "2.2.2.2:2", 1),
            Reason::SourceDenied,
        );
    }

    #[test]
    fn a_source_inside_a_pattern_passes_and_one_outside_is_dropped() {
        let mut f = filter(|r| {
            r.sources = vec![
                UidMatch::server("10.0.0.1".parse().unwrap()),
                UidMatch::exact(uid("10.0.0.9:4")),
            ]
        });
        assert!(f.check(0, &send("10.0.0.1:77", "2.2.2.2:2", 1), 0).is_ok());
        assert!(f.check(0, &send("10.0.0.9:4", "2.2.2.2:2", 1), 0).is_ok());
        assert_dropped(
            &mut f,
            &send("10.0.0.9:5", "2.2.2.2:2", 1),
            Reason::SourceDenied,
        );
        assert_eq!(f.counters().passed, 2);
    }

    #[test]
    fn an_allowed_type_passes_and_another_is_dropped() {
        let mut f = filter(|r| r.types = TypeSet::of(&[ReqType::Send]));
        assert!(f.check(0, &send("1.1.1.1:1", "2.2.2.2:2", 1), 0).is_ok());
        assert_dropped(&mut f, &write("2.2.2.2:2", 0, 1), Reason::TypeDenied);
    }

    #[test]
    fn the_length_limit_counts_header_and_payload() {
        let mut f = filter(|r| r.max_len = 32 + 100);
        assert!(f.check(0, &send("1.1.1.1:1", "2.2.2.2:2", 100), 0).is_ok());
        let long = send("1.1.1.1:1", "2.2.2.2:2", 101);
        assert_dropped(&mut f, &long, Reason::TooLong);
        assert_eq!(
            f.rules().check(&long),
            Err(Violation::TooLong { len: 133, max: 132 })
        );
        // READ has a 64-byte header.
        f.set_rules(FilterRules {
            max_len: 63,
            ..FilterRules::allow_all()
        });
        assert_dropped(&mut f, &read("2.2.2.2:2", 0, 1), Reason::TooLong);
    }

    fn windowed() -> Filter {
        filter(|r| {
            r.windows = vec![
                AddressWindow::new(UidMatch::exact(uid("2.2.2.2:2")), 0x1000, 0x1000).unwrap(),
                AddressWindow::new(UidMatch::server("3.3.3.3".parse().unwrap()), 0, 0x10).unwrap(),
            ]
        })
    }

    #[test]
    fn a_write_inside_a_window_passes_and_one_reaching_outside_is_dropped() {
        let mut f = windowed();
        assert!(f.check(0, &write("2.2.2.2:2", 0x1000, 0x1000), 0).is_ok());
        assert!(f.check(0, &write("2.2.2.2:2", 0x1fff, 1), 0).is_ok());
        assert_dropped(&mut f, &write("2.2.2.2:2", 0x1fff, 2), Reason::OutOfWindow);
        assert_dropped(&mut f, &write("2.2.2.2:2", 0xfff, 1), Reason::OutOfWindow);
        assert_dropped(&mut f, &write("2.2.2.9:2", 0x1000, 1), Reason::OutOfWindow);
    }

    #[test]
    fn a_read_is_checked_at_the_source_address_of_its_second_beat() {
        let mut f = windowed();
        assert!(f.check(0, &read("2.2.2.2:2", 0x1800, 0x800), 0).is_ok());
        assert_dropped(
            &mut f,
            &read("2.2.2.2:2", 0x1801, 0x800),
            Reason::OutOfWindow,
        );
    }

    #[test]
    fn a_copy_is_checked_where_it_reads_and_where_it_writes() {
        let mut f = windowed();
        assert!(f
            .check(0, &copy("2.2.2.2:2", 0x1000, "3.3.3.3:1", 0, 16), 0)
            .is_ok());
        assert_dropped(
            &mut f,
            &copy("2.2.2.2:2", 0x1000, "3.3.3.3:1", 1, 16),
            Reason::OutOfWindow,
        );
        let err = f
            .rules()
            .check(&copy("2.2.2.2:2", 0x2000, "3.3.3.3:1", 0, 16))
            .unwrap_err();
        assert_eq!(
            err,
            Violation::OutOfWindow {
                uid: uid("2.2.2.2:2"),
                addr: 0x2000,
                len: 16
            }
        );
    }

    #[test]
    fn sends_are_not_subject_to_windows() {
        let mut f = filter(|r| r.windows.clear());
        assert!(f.check(0, &send("1.1.1.1:1", "2.2.2.2:2", 10), 0).is_ok());
        assert_dropped(&mut f, &write("2.2.2.2:2", 0, 1), Reason::OutOfWindow);
    }

    #[test]
    fn accesses_that_wrap_the_address_space_are_outside() {
        let w = AddressWindow::everything(UidMatch::ANY);
        assert!(w.contains(uid("1.1.1.1:1"), u64::MAX, 1));
        assert!(!w.contains(uid("1.1.1.1:1"), u64::MAX, 2));
        assert!(w.contains(uid("1.1.1.1:1"), u64::MAX, 0));
    }

    #[test]
    fn windows_refuse_zero_length_and_overflow() {
        let any = UidMatch::ANY;
        assert_eq!(AddressWindow::new(any, 5, 0), Err(WindowError::Empty));
        assert_eq!(
            AddressWindow::new(any, u64::MAX, 2),
            Err(WindowError::Overflow {
                base: u64::MAX,
                len: 2
            })
        );
        let top = AddressWindow::new(any, u64::MAX, 1).unwrap();
        assert_eq!((top.base(), top.last()), (u64::MAX, u64::MAX));
    }

    #[test]
    fn a_full_event_queue_counts_lost_events_and_still_drops() {
        let mut f = Filter::new(FilterRules::default(), 2);
        let msg = send("1.1.1.1:1", "2.2.2.2:2", 1);
        for _ in 0..5 {
            assert!(f.check(0, &msg, 0).is_err());
        }
        assert_eq!(f.counters().source_denied, 5);
        assert_eq!(f.counters().lost_events, 3);
        assert_eq!(f.pending_events(), 2);
        assert!(f.pop_event().is_some());
        assert!(f.check(0, &msg, 0).is_err());
        assert_eq!(f.pending_events(), 2);
        assert_eq!(f.counters().lost_events, 3);
    }

    #[test]
    fn replacing_the_rules_applies_to_the_next_message() {
        let mut f = Filter::new(FilterRules::allow_all(), 4);
        let msg = send("1.1.1.1:1", "2.2.2.2:2", 1);
        assert!(f.check(0, &msg, 0).is_ok());
        f.set_rules(FilterRules::default());
        assert!(f.check(0, &msg, 1).is_err());
        f.set_rules(FilterRules::allow_all());
        assert!(f.check(0, &msg, 2).is_ok());
        assert_eq!((f.counters().passed, f.counters().dropped_total()), (2, 1));
    }
}
