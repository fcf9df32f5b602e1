//! A programmed-I/O mailbox: messages written by the CPU straight into
//! cache-line slots the other side polls — no descriptors, no engine.
//!
//! Per direction, two 128-byte-aligned slots used alternately. A slot is
//! a sequence word, a length word and the payload inline; the producer
//! writes payload and length, then the sequence number with `Release`; the
//! consumer waits for the number it expects with `Acquire`, copies the
//! payload out and acknowledges the number in a line of its own. The
//! producer reuses a slot once the fragment before last is acknowledged,
//! so one fragment can be in flight while the other is being read.
//! Messages longer than a slot go as several fragments; the last one is
//! marked.
//!
//! ```text
//!  direction = [ slot 0 | slot 1 | ack | consumer flag+bell | producer flag+bell ]
//!  slot      = [ seq u32 | len u32 (bit 31: last) | payload … ]  (128 B aligned)
//! ```
//!
//! Waiting is a policy: [`WaitPolicy::BusyPoll`] spins (lowest latency, a
//! core per waiter) and [`WaitPolicy::SpinThenPark`] spins for a while and
//! then sleeps on a futex, after raising its *parked* flag; the other side
//! makes the futex call only when that flag is up. The futex is a *bell*
//! word the waker bumps, not the watched word itself: a waker may take the
//! flag for a value that does not yet satisfy the sleeper (one
//! acknowledgement when it needs two), and only a bell that changes after
//! the flag was taken keeps that wake-up from being lost. A region holds N
//! mailboxes for N pairs of threads in parallel.
//!
//! Everything read from the slots is checked (fragment length against the
//! slot, message length against the limit); a bad fragment is an error,
//! never an out-of-bounds copy.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sys::{futex_wait, futex_wake, memfd_name, SharedMemory};

/// Bytes of a slot by default: one 128-byte line pair, 120 payload bytes.
pub const DEFAULT_SLOT_BYTES: usize = 128;
/// Largest message by default.
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 20;

const MAGIC: u64 = u64::from_be_bytes(*b"UNIPMBX1");
const HEADER_BYTES: usize = 128;
const SLOT_HEADER: usize = 8;
const LAST: u32 = 1 << 31;
const LEN_MASK: u32 = (1 << 24) - 1;

/// How a side waits for the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Poll the word without pause: lowest latency, one busy core.
    BusyPoll,
    /// Poll for `spin`, then sleep on a futex until woken.
    SpinThenPark {
        /// How long to poll before sleeping.
        spin: Duration,
    },
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy::SpinThenPark {
            spin: Duration::from_micros(20),
        }
    }
}

/// Why a mailbox operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MailboxError {
    /// Nothing happened before the deadline.
    #[error("mailbox wait timed out")]
    Timeout,
    /// The message is longer than the mailbox carries.
    #[error("message of {0} bytes exceeds the mailbox limit")]
    TooLarge(usize),
    /// A slot holds a fragment that cannot be right.
    #[error("corrupt mailbox slot: {0}")]
    Corrupt(&'static str),
    /// Setting the region up failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Which end of a mailbox: A sends on direction 0 and receives on 1, B the
/// other way round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The first end.
    A,
    /// The second end.
    B,
}

/// A shared region of mailboxes.
#[derive(Clone, Debug)]
pub struct MailboxRegion {
    mem: Arc<SharedMemory>,
    count: usize,
    slot_bytes: usize,
}

impl MailboxRegion {
    fn direction_bytes(slot_bytes: usize) -> usize {
        2 * slot_bytes + 3 * 128
    }

    fn total(count: usize, slot_bytes: usize) -> Option<usize> {
        count
            .checked_mul(2 * Self::direction_bytes(slot_bytes))?
            .checked_add(HEADER_BYTES)
    }

    /// A region of `count` mailboxes whose slots are `slot_bytes` long (a
    /// multiple of 128, at least 128).
    pub fn create(count: usize, slot_bytes: usize) -> Result<MailboxRegion, MailboxError> {
        if count == 0 || slot_bytes < 128 || !slot_bytes.is_multiple_of(128) || slot_bytes > 1 << 20
        {
            return Err(MailboxError::Corrupt(
                "mailbox count or slot size out of range",
            ));
        }
        let total = Self::total(count, slot_bytes)
            .ok_or(MailboxError::Corrupt("mailbox region too large"))?;
        let mem = SharedMemory::create(&memfd_name("mailbox"), total)?;
        mem.write(0, &MAGIC.to_le_bytes());
        mem.write(8, &(count as u64).to_le_bytes());
        mem.write(16, &(slot_bytes as u64).to_le_bytes());
        Ok(MailboxRegion {
            mem: Arc::new(mem),
            count,
            slot_bytes,
        })
    }

    /// Opens a region received from another process, checking its header
    /// against its size.
    pub fn open(fd: std::os::fd::OwnedFd) -> Result<MailboxRegion, MailboxError> {
        let size = crate::sys::file_size(std::os::fd::AsFd::as_fd(&fd))? as usize;
        let mem = SharedMemory::open(fd, size)?;
        let mut h = [0u8; 24];
        if !mem.read(0, &mut h) {
            return Err(MailboxError::Corrupt("region smaller than its header"));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let count = usize::try_from(word(8)).unwrap_or(0);
        let slot_bytes = usize::try_from(word(16)).unwrap_or(0);
        if word(0) != MAGIC
            || slot_bytes < 128
            || slot_bytes % 128 != 0
            || Self::total(count, slot_bytes) != Some(size)
        {
            return Err(MailboxError::Corrupt(
                "mailbox header does not match the region",
            ));
        }
        Ok(MailboxRegion {
            mem: Arc::new(mem),
            count,
            slot_bytes,
        })
    }

    /// The shared mapping (to send its descriptor to another process).
    pub fn memory(&self) -> &Arc<SharedMemory> {
        &self.mem
    }

    /// Mailboxes in the region.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Payload bytes per slot (fragment).
    pub fn slot_payload(&self) -> usize {
        self.slot_bytes - SLOT_HEADER
    }

    fn direction(&self, index: usize, dir: usize) -> usize {
        HEADER_BYTES + (index * 2 + dir) * Self::direction_bytes(self.slot_bytes)
    }

    /// The sender and receiver of `side` of mailbox `index` (`None` if out of
    /// range). Each direction has one sender and one receiver in all.
    pub fn endpoint(
        &self,
        index: usize,
        side: Side,
        policy: WaitPolicy,
    ) -> Option<(MailboxSender, MailboxReceiver)> {
        if index >= self.count {
            return None;
        }
        let (tx, rx) = match side {
            Side::A => (0, 1),
            Side::B => (1, 0),
        };
        let dir = |d: usize| Direction {
            mem: self.mem.clone(),
            base: self.direction(index, d),
            slot_bytes: self.slot_bytes,
        };
        Some((
            MailboxSender {
                dir: dir(tx),
                next: 1,
                policy,
            },
            MailboxReceiver {
                dir: dir(rx),
                expect: 1,
                policy,
                max_message: DEFAULT_MAX_MESSAGE,
            },
        ))
    }
}

/// One direction's offsets.
#[derive(Debug)]
struct Direction {
    mem: Arc<SharedMemory>,
    base: usize,
    slot_bytes: usize,
}

impl Direction {
    fn slot(&self, seq: u32) -> usize {
        self.base + (seq as usize & 1) * self.slot_bytes
    }
    fn word(&self, off: usize) -> &AtomicU32 {
        self.mem
            .atomic_u32(off)
            .unwrap_or_else(|| unreachable!("mailbox words are inside the region"))
    }
    fn seq_word(&self, seq: u32) -> &AtomicU32 {
        self.word(self.slot(seq))
    }
    fn ack(&self) -> &AtomicU32 {
        self.word(self.base + 2 * self.slot_bytes)
    }
    /// Where the consumer sleeps: flag and bell in one line.
    fn consumer_bed(&self) -> Bed<'_> {
        let line = self.base + 2 * self.slot_bytes + 128;
        Bed {
            parked: self.word(line),
            bell: self.word(line + 4),
        }
    }
    /// Where the producer sleeps.
    fn producer_bed(&self) -> Bed<'_> {
        let line = self.base + 2 * self.slot_bytes + 256;
        Bed {
            parked: self.word(line),
            bell: self.word(line + 4),
        }
    }
}

/// A side's sleeping place: its *parked* flag and its bell, a counter the
/// waker bumps after it took the flag. The sleeper waits on the bell, not
/// on the word it watches, so a wake-up that lands between its last look
/// and its sleep changes the bell and the sleep returns at once.
#[derive(Clone, Copy)]
struct Bed<'a> {
    parked: &'a AtomicU32,
    bell: &'a AtomicU32,
}

/// Waits until `ready(word)`, by `policy`, until `deadline`.
fn wait_until(
    word: &AtomicU32,
    bed: Bed<'_>,
    policy: WaitPolicy,
    deadline: Option<Instant>,
    ready: impl Fn(u32) -> bool,
) -> Result<u32, MailboxError> {
    let v = word.load(Ordering::Acquire);
    if ready(v) {
        return Ok(v);
    }
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let v = word.load(Ordering::Acquire);
        if ready(v) {
            return Ok(v);
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(256) {
            std::hint::spin_loop();
            continue;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(MailboxError::Timeout);
        }
        match policy {
            WaitPolicy::BusyPoll => std::hint::spin_loop(),
            WaitPolicy::SpinThenPark { spin } if now.duration_since(start) < spin => {
                std::hint::spin_loop()
            }
            WaitPolicy::SpinThenPark { .. } => {
                bed.parked.store(1, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                let bell = bed.bell.load(Ordering::SeqCst);
                let v = word.load(Ordering::SeqCst);
                if ready(v) {
                    bed.parked.store(0, Ordering::Relaxed);
                    return Ok(v);
                }
                // A waker took the flag for a value that was not enough:
                // raise it again before sleeping, or nobody will ring.
                if bed.parked.load(Ordering::SeqCst) == 0 {
                    continue;
                }
                // The nap is only a safety net: wake-ups are not lost.
                let nap = deadline
                    .map(|d| d.saturating_duration_since(now))
                    .unwrap_or(Duration::from_secs(1))
                    .min(Duration::from_secs(1));
                futex_wait(bed.bell, bell, Some(nap));
            }
        }
    }
}

/// Wakes the other side if it parked: takes its flag, bumps its bell and
/// wakes the bell's sleeper.
#[inline]
fn wake_if_parked(bed: Bed<'_>) {
    fence(Ordering::SeqCst);
    if bed.parked.load(Ordering::SeqCst) != 0 && bed.parked.swap(0, Ordering::SeqCst) != 0 {
        bed.bell.fetch_add(1, Ordering::SeqCst);
        futex_wake(bed.bell, 1);
    }
}

/// The writing end of one direction of a mailbox.
#[derive(Debug)]
pub struct MailboxSender {
    dir: Direction,
    /// Sequence number of the next fragment.
    next: u32,
    policy: WaitPolicy,
}

impl MailboxSender {
    /// Payload bytes per fragment.
    pub fn slot_payload(&self) -> usize {
        self.dir.slot_bytes - SLOT_HEADER
    }

    /// Sends `msg`, waiting (by the policy) for free slots.
    pub fn send(&mut self, msg: &[u8]) -> Result<(), MailboxError> {
        self.send_deadline(msg, None)
    }

    /// Sends `msg`, giving up at `deadline` (fragments already written stay
    /// written: the receiver sees a truncated message only if the sender
    /// gives up midway, which a deadline per message avoids in practice).
    pub fn send_deadline(
        &mut self,
        msg: &[u8],
        deadline: Option<Instant>,
    ) -> Result<(), MailboxError> {
        if msg.len() > LEN_MASK as usize {
            return Err(MailboxError::TooLarge(msg.len()));
        }
        let cap = self.slot_payload();
        let mut at = 0;
        loop {
            let n = self.next;
            let chunk = (msg.len() - at).min(cap);
            let last = at + chunk == msg.len();
            // The slot is free once fragment n - 2 was acknowledged.
            let want = n.wrapping_sub(2);
            wait_until(
                self.dir.ack(),
                self.dir.producer_bed(),
                self.policy,
                deadline,
                |ack| want.wrapping_sub(ack) as i32 <= 0,
            )?;
            let slot = self.dir.slot(n);
            let info = chunk as u32 | if last { LAST } else { 0 };
            self.dir.mem.write(slot + SLOT_HEADER, &msg[at..at + chunk]);
            self.dir.mem.write(slot + 4, &info.to_le_bytes());
            self.dir.seq_word(n).store(n, Ordering::Release);
            wake_if_parked(self.dir.consumer_bed());
            self.next = n.wrapping_add(1);
            at += chunk;
            if last {
                return Ok(());
            }
        }
    }
}

/// The reading end of one direction of a mailbox.
#[derive(Debug)]
pub struct MailboxReceiver {
    dir: Direction,
    /// Sequence number of the next fragment.
    expect: u32,
    policy: WaitPolicy,
    max_message: usize,
}

impl MailboxReceiver {
    /// Refuses messages longer than `max` (a corrupt stream of fragments
    /// without a last one cannot grow the buffer without bound).
    pub fn with_max_message(mut self, max: usize) -> MailboxReceiver {
        self.max_message = max;
        self
    }

    /// Receives the next message into `out` (cleared first), waiting by
    /// the policy; returns its length.
    pub fn recv(&mut self, out: &mut Vec<u8>) -> Result<usize, MailboxError> {
        self.recv_deadline(out, None)
    }

    /// Receives the next message, giving up at `deadline`.
    pub fn recv_deadline(
        &mut self,
        out: &mut Vec<u8>,
        deadline: Option<Instant>,
    ) -> Result<usize, MailboxError> {
        out.clear();
        let cap = self.dir.slot_bytes - SLOT_HEADER;
        loop {
            let n = self.expect;
            wait_until(
                self.dir.seq_word(n),
                self.dir.consumer_bed(),
                self.policy,
                deadline,
                |seq| seq == n,
            )?;
            let slot = self.dir.slot(n);
            let mut info = [0u8; 4];
            self.dir.mem.read(slot + 4, &mut info);
            let info = u32::from_le_bytes(info);
            let len = (info & LEN_MASK) as usize;
            if len > cap {
                return Err(MailboxError::Corrupt("fragment longer than its slot"));
            }
            if out.len() + len > self.max_message {
                return Err(MailboxError::TooLarge(out.len() + len));
            }
            let start = out.len();
            out.resize(start + len, 0);
            self.dir.mem.read(slot + SLOT_HEADER, &mut out[start..]);
            self.dir.ack().store(n, Ordering::Release);
            wake_if_parked(self.dir.producer_bed());
            self.expect = n.wrapping_add(1);
            if info & LAST != 0 {
                return Ok(out.len());
            }
        }
    }

    /// Whether a fragment is waiting (does not take it).
    pub fn ready(&self) -> bool {
        self.dir.seq_word(self.expect).load(Ordering::Acquire) == self.expect
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_message_crosses_in_one_slot() {
        let r = MailboxRegion::create(1, 128).unwrap();
        let (mut tx, _) = r.endpoint(0, Side::A, WaitPolicy::BusyPoll).unwrap();
        let (_, mut rx) = r.endpoint(0, Side::B, WaitPolicy::BusyPoll).unwrap();
        tx.send(b"hello").unwrap();
        let mut out = Vec::new();
        assert_eq!(rx.recv(&mut out).unwrap(), 5);
        assert_eq!(out, b"hello");
        assert!(!rx.ready());
    }

    #[test]
    fn large_messages_are_fragmented_and_reassembled_between_threads() {
        let r = MailboxRegion::create(2, 256).unwrap();
        let (mut tx, _) = r.endpoint(1, Side::B, WaitPolicy::default()).unwrap();
        let (_, mut rx) = r.endpoint(1, Side::A, WaitPolicy::default()).unwrap();
        let t = std::thread::spawn(move || {
            for i in 0..200usize {
                let msg: Vec<u8> = (0..i * 97).map(|k| (k + i) as u8).collect();
                tx.send(&msg).unwrap();
            }
        });
        let mut out = Vec::new();
        for i in 0..200usize {
            rx.recv_deadline(&mut out, Some(Instant::now() + Duration::from_secs(5)))
                .unwrap();
            let want: Vec<u8> = (0..i * 97).map(|k| (k + i) as u8).collect();
            assert_eq!(out, want, "message {i}");
        }
        t.join().unwrap();
    }

    #[test]
    fn an_empty_mailbox_times_out() {
        let r = MailboxRegion::create(1, 128).unwrap();
        let (_, mut rx) = r.endpoint(0, Side::A, WaitPolicy::default()).unwrap();
        let mut out = Vec::new();
        let err = rx
            .recv_deadline(&mut out, Some(Instant::now() + Duration::from_millis(5)))
            .unwrap_err();
        assert!(matches!(err, MailboxError::Timeout));
    }

    #[test]
    fn a_sender_waits_when_both_slots_are_unread() {
        let r = MailboxRegion::create(1, 128).unwrap();
        let (mut tx, _) = r.endpoint(0, Side::A, WaitPolicy::default()).unwrap();
        tx.send(b"1").unwrap();
        tx.send(b"2").unwrap();
        let err = tx
            .send_deadline(b"3", Some(Instant::now() + Duration::from_millis(5)))
            .unwrap_err();
        assert!(matches!(err, MailboxError::Timeout));
    }

    #[test]
    fn a_fragment_longer_than_its_slot_is_refused() {
        let r = MailboxRegion::create(1, 128).unwrap();
        let (_, mut rx) = r.endpoint(0, Side::B, WaitPolicy::BusyPoll).unwrap();
        // Forge fragment 1 in direction 0, slot 1.
        let slot = HEADER_BYTES + 128;
        r.mem.write(slot + 4, &(1000u32 | LAST).to_le_bytes());
        r.mem.atomic_u32(slot).unwrap().store(1, Ordering::Release);
        let mut out = Vec::new();
        assert!(matches!(rx.recv(&mut out), Err(MailboxError::Corrupt(_))));
    }

    #[test]
    fn a_region_opens_only_with_a_matching_header() {
        let r = MailboxRegion::create(3, 128).unwrap();
        let fd = r.memory().fd().try_clone_to_owned().unwrap();
        let o = MailboxRegion::open(fd).unwrap();
        assert_eq!((o.count(), o.slot_payload()), (3, 120));
        r.mem.write(8, &99u64.to_le_bytes());
        let fd = r.memory().fd().try_clone_to_owned().unwrap();
        assert!(MailboxRegion::open(fd).is_err());
    }

    #[test]
    fn parked_ends_never_sleep_through_a_wake_between_slots() {
        // Both ends park at once on multi-fragment messages: a late waker
        // must wake the slot the sleeper waits on now, not the one it wrote.
        let r = MailboxRegion::create(1, 128).unwrap();
        let policy = WaitPolicy::SpinThenPark {
            spin: Duration::ZERO,
        };
        let (mut tx, mut rx) = r.endpoint(0, Side::A, policy).unwrap();
        let (mut btx, mut brx) = r.endpoint(0, Side::B, policy).unwrap();
        // A lost wake-up sleeps until the deadline; a busy machine's
        // scheduling stalls stay well below it.
        let soon = || Some(Instant::now() + Duration::from_millis(500));
        let t = std::thread::spawn(move || {
            let mut b = Vec::new();
            for _ in 0..3000 {
                brx.recv_deadline(&mut b, soon()).unwrap();
                btx.send_deadline(&b, soon()).unwrap();
            }
        });
        let msg = [7u8; 1000];
        let mut back = Vec::new();
        for _ in 0..3000 {
            tx.send_deadline(&msg, soon()).unwrap();
            rx.recv_deadline(&mut back, soon()).unwrap();
        }
        t.join().unwrap();
    }

    #[test]
    fn a_parked_receiver_is_woken_by_the_sender() {
        let r = MailboxRegion::create(1, 128).unwrap();
        let policy = WaitPolicy::SpinThenPark {
            spin: Duration::ZERO,
        };
        let (mut tx, _) = r.endpoint(0, Side::A, policy).unwrap();
        let (_, mut rx) = r.endpoint(0, Side::B, policy).unwrap();
        let t = std::thread::spawn(move || {
            let mut out = Vec::new();
            rx.recv_deadline(&mut out, Some(Instant::now() + Duration::from_secs(5)))
                .map(|_| out)
        });
        std::thread::sleep(Duration::from_millis(20));
        tx.send(b"wake").unwrap();
        assert_eq!(t.join().unwrap().unwrap(), b"wake");
    }
}
