//! A single-producer single-consumer ring of variable-size records in
//! shared memory, between two processes that do not trust each other.
//!
//! Layout of one ring: a control block of cache lines (each index and each
//! flag in its own 128-byte line, so the two sides never write the same
//! line) and a power-of-two data area. Positions are 64-bit byte counters
//! that only grow; `pos & (size - 1)` is the offset in the data area.
//!
//! A record is an 8-byte header — length (u32, little-endian) and flags
//! (u32) — and `length` bytes, padded to a multiple of 8. A record never
//! wraps: when it does not fit before the end of the data area the producer
//! writes a *wrap* header and continues at the start.
//!
//! The producer copies records in, then publishes the tail with one store
//! (`SeqCst`, which includes `Release`) per batch; the consumer loads the
//! tail (`Acquire`), copies records out and publishes the head the same
//! way. Either side raises its *waiting* flag before it parks; the other
//! side, after publishing, rings the doorbell only if the flag was up
//! (store, fence, load on both sides: one of the two sees the other).
//!
//! Everything read from the shared memory is checked: a tail that runs
//! ahead of the head by more than the ring, a head that passes the tail, a
//! record header that claims more bytes than were published or than fit
//! before the end of the area is [`RingError`]: the peer is broken and the
//! ring cannot be resynchronised. The *contents* of records are the
//! caller's to validate.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::sys::SharedMemory;

/// Bytes of a record header.
pub const RECORD_HEADER: usize = 8;
/// Record flag: the rest of the data area is padding; continue at 0.
const FLAG_WRAP: u32 = 1;

/// Offsets inside a ring's control block, one cache line (128 bytes) each.
mod ctl {
    pub const TAIL: usize = 0;
    pub const HEAD: usize = 128;
    pub const CONSUMER_WAITING: usize = 256;
    pub const PRODUCER_WAITING: usize = 384;
    pub const PRODUCER_CLOSED: usize = 512;
    pub const CONSUMER_CLOSED: usize = 640;
}

/// Bytes of a ring's control block.
pub const CONTROL_BYTES: usize = 1024;

/// What was wrong with the ring the peer shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// An index or record header in shared memory is impossible.
    #[error("corrupt shared ring: {0}")]
    Corrupt(&'static str),
}

/// Where a ring lives in a mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Offset of the control block (128-byte aligned).
    pub control: usize,
    /// Offset of the data area (8-byte aligned).
    pub data: usize,
    /// Bytes of the data area; a power of two.
    pub size: usize,
}

impl RingLayout {
    /// Whether the layout fits `mem` and its alignment rules hold.
    pub fn fits(&self, mem: &SharedMemory) -> bool {
        self.size.is_power_of_two()
            && self.size >= 64
            && self.control.is_multiple_of(128)
            && self.data.is_multiple_of(8)
            && mem.contains(self.control, CONTROL_BYTES)
            && mem.contains(self.data, self.size)
    }

    fn u64_at<'m>(&self, mem: &'m SharedMemory, off: usize) -> &'m AtomicU64 {
        mem.atomic_u64(self.control + off)
            .unwrap_or_else(|| unreachable!("layout checked by `fits`"))
    }

    fn u32_at<'m>(&self, mem: &'m SharedMemory, off: usize) -> &'m AtomicU32 {
        mem.atomic_u32(self.control + off)
            .unwrap_or_else(|| unreachable!("layout checked by `fits`"))
    }

    /// Zeroes the control block (the creator does this once).
    pub fn reset(&self, mem: &SharedMemory) {
        mem.fill(self.control, CONTROL_BYTES, 0);
    }

    /// Whether the producer said it will send no more.
    pub fn producer_closed(&self, mem: &SharedMemory) -> bool {
        self.u32_at(mem, ctl::PRODUCER_CLOSED)
            .load(Ordering::SeqCst)
            != 0
    }

    /// Whether the consumer said it will read no more.
    pub fn consumer_closed(&self, mem: &SharedMemory) -> bool {
        self.u32_at(mem, ctl::CONSUMER_CLOSED)
            .load(Ordering::SeqCst)
            != 0
    }
}

/// Stride of a record of `len` bytes: header and bytes, padded to 8.
#[inline]
pub const fn stride(len: usize) -> usize {
    (RECORD_HEADER + len + 7) & !7
}

/// The writing side's private state.
#[derive(Debug)]
pub struct RingProducer {
    layout: RingLayout,
    /// Next byte position to write (ahead of the shared tail until published).
    tail: u64,
    /// The tail last stored to shared memory.
    published: u64,
    /// The consumer's head as last read.
    head_cache: u64,
}

impl RingProducer {
    /// The producer of the ring at `layout`, starting at position 0.
    pub fn new(layout: RingLayout) -> RingProducer {
        RingProducer {
            layout,
            tail: 0,
            published: 0,
            head_cache: 0,
        }
    }

    /// The largest record this ring carries.
    pub fn max_record(&self) -> usize {
        self.layout.size / 2 - RECORD_HEADER
    }

    fn size(&self) -> u64 {
        self.layout.size as u64
    }

    /// Reloads the consumer's head and checks it.
    fn reload_head(&mut self, mem: &SharedMemory) -> Result<(), RingError> {
        let head = self.layout.u64_at(mem, ctl::HEAD).load(Ordering::Acquire);
        if head > self.published || self.published - head > self.size() || head < self.head_cache {
            return Err(RingError::Corrupt(
                "consumer head outside the published range",
            ));
        }
        self.head_cache = head;
        Ok(())
    }

    /// Bytes free now (reloading the head).
    pub fn free(&mut self, mem: &SharedMemory) -> Result<usize, RingError> {
        self.reload_head(mem)?;
        Ok((self.size() - (self.tail - self.head_cache)) as usize)
    }

    /// Whether nothing written is unread by the consumer (reloading the head).
    pub fn is_drained(&mut self, mem: &SharedMemory) -> Result<bool, RingError> {
        self.reload_head(mem)?;
        Ok(self.head_cache == self.tail)
    }

    /// Writes a record made of `parts` (concatenated), or returns `Ok(false)`
    /// when it does not fit now. Not visible to the consumer until
    /// [`RingProducer::publish`]. Records longer than
    /// [`RingProducer::max_record`] never fit; callers check first.
    #[inline]
    pub fn try_push(&mut self, mem: &SharedMemory, parts: &[&[u8]]) -> Result<bool, RingError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.max_record() {
            return Ok(false);
        }
        let step = stride(len) as u64;
        let pos = self.tail & (self.size() - 1);
        let contiguous = self.size() - pos;
        let need = self.need(len);
        if self.size() - (self.tail - self.head_cache) < need {
            self.reload_head(mem)?;
            if self.size() - (self.tail - self.head_cache) < need {
                return Ok(false);
            }
        }
        if step > contiguous {
            // Positions are multiples of 8, so at least a header fits.
            self.write_header(mem, pos as usize, 0, FLAG_WRAP);
            self.tail += contiguous;
        }
        let mut at = self.layout.data + (self.tail & (self.size() - 1)) as usize;
        self.write_header(mem, at - self.layout.data, len as u32, 0);
        at += RECORD_HEADER;
        for p in parts {
            let ok = mem.write(at, p);
            debug_assert!(ok, "record inside the data area");
            at += p.len();
        }
        self.tail += step;
        Ok(true)
    }

    fn write_header(&self, mem: &SharedMemory, pos: usize, len: u32, flags: u32) {
        let mut h = [0u8; RECORD_HEADER];
        h[..4].copy_from_slice(&len.to_le_bytes());
        h[4..].copy_from_slice(&flags.to_le_bytes());
        let ok = mem.write(self.layout.data + pos, &h);
        debug_assert!(ok, "header inside the data area");
    }

    /// Whether records were written since the last publish.
    pub fn has_unpublished(&self) -> bool {
        self.tail != self.published
    }

    /// Publishes every record written so far. Returns `true` when the
    /// consumer had parked and must be woken (its flag is now down).
    #[inline]
    pub fn publish(&mut self, mem: &SharedMemory) -> bool {
        if self.tail == self.published {
            return false;
        }
        self.published = self.tail;
        self.layout
            .u64_at(mem, ctl::TAIL)
            .store(self.tail, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let waiting = self.layout.u32_at(mem, ctl::CONSUMER_WAITING);
        waiting.load(Ordering::SeqCst) != 0 && waiting.swap(0, Ordering::SeqCst) != 0
    }

    /// Bytes a record of `len` bytes takes at the current position,
    /// counting the padding skipped when it must wrap.
    fn need(&self, len: usize) -> u64 {
        let step = stride(len) as u64;
        let contiguous = self.size() - (self.tail & (self.size() - 1));
        if step <= contiguous {
            step
        } else {
            contiguous + step
        }
    }

    /// Raises the producer's waiting flag and re-checks for room for a
    /// record of `len` bytes: `Ok(true)` means room appeared (flag lowered
    /// again), `Ok(false)` means park until the consumer rings.
    pub fn park(&mut self, mem: &SharedMemory, len: usize) -> Result<bool, RingError> {
        let flag = self.layout.u32_at(mem, ctl::PRODUCER_WAITING);
        flag.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let fits = self.free(mem)? as u64 >= self.need(len.min(self.max_record()));
        if fits {
            flag.store(0, Ordering::Relaxed);
        }
        Ok(fits)
    }

    /// Marks the ring closed by the producer (after a final publish).
    pub fn close(&mut self, mem: &SharedMemory) {
        self.publish(mem);
        self.layout
            .u32_at(mem, ctl::PRODUCER_CLOSED)
            .store(1, Ordering::SeqCst);
    }

    /// Whether the consumer is gone.
    pub fn consumer_closed(&self, mem: &SharedMemory) -> bool {
        self.layout.consumer_closed(mem)
    }
}

/// A record found by [`RingConsumer::next_record`]: where its bytes are in
/// the mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Offset of the record's bytes in the mapping.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

/// The reading side's private state.
#[derive(Debug)]
pub struct RingConsumer {
    layout: RingLayout,
    /// Next byte position to read (ahead of the shared head until released).
    head: u64,
    /// The producer's tail as last read.
    tail_cache: u64,
    /// The head last stored to shared memory.
    released: u64,
}

impl RingConsumer {
    /// The consumer of the ring at `layout`, starting at position 0.
    pub fn new(layout: RingLayout) -> RingConsumer {
        RingConsumer {
            layout,
            head: 0,
            tail_cache: 0,
            released: 0,
        }
    }

    fn size(&self) -> u64 {
        self.layout.size as u64
    }

    /// Reloads the producer's tail and checks it.
    fn reload_tail(&mut self, mem: &SharedMemory) -> Result<(), RingError> {
        let tail = self.layout.u64_at(mem, ctl::TAIL).load(Ordering::Acquire);
        if tail < self.tail_cache || tail - self.released > self.size() {
            return Err(RingError::Corrupt("producer tail outside the ring"));
        }
        self.tail_cache = tail;
        Ok(())
    }

    /// Whether bytes are published and unread (reloading the tail when the
    /// cached one is used up).
    #[inline]
    pub fn has_data(&mut self, mem: &SharedMemory) -> Result<bool, RingError> {
        if self.head == self.tail_cache {
            self.reload_tail(mem)?;
        }
        Ok(self.head != self.tail_cache)
    }

    /// The next published record, checked against the ring's bounds, or
    /// `None` when the ring is empty. The record's space stays reserved
    /// until [`RingConsumer::release`].
    #[inline]
    pub fn next_record(&mut self, mem: &SharedMemory) -> Result<Option<Record>, RingError> {
        loop {
            if !self.has_data(mem)? {
                return Ok(None);
            }
            let pos = (self.head & (self.size() - 1)) as usize;
            let left = self.tail_cache - self.head;
            let contiguous = self.layout.size - pos;
            if left < RECORD_HEADER as u64 {
                return Err(RingError::Corrupt("published bytes end inside a header"));
            }
            let mut h = [0u8; RECORD_HEADER];
            mem.read(self.layout.data + pos, &mut h);
            let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
            let flags = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            if flags == FLAG_WRAP {
                if left < contiguous as u64 {
                    return Err(RingError::Corrupt("wrap past the published bytes"));
                }
                self.head += contiguous as u64;
                continue;
            }
            if flags != 0 {
                return Err(RingError::Corrupt("unknown record flags"));
            }
            let step = stride(len);
            if step > contiguous || step as u64 > left {
                return Err(RingError::Corrupt("record longer than the published bytes"));
            }
            self.head += step as u64;
            return Ok(Some(Record {
                offset: self.layout.data + pos + RECORD_HEADER,
                len,
            }));
        }
    }

    /// Whether records were taken since the last release.
    pub fn has_unreleased(&self) -> bool {
        self.head != self.released
    }

    /// Gives the space of every record taken so far back to the producer.
    /// Returns `true` when the producer had parked and must be woken.
    #[inline]
    pub fn release(&mut self, mem: &SharedMemory) -> bool {
        if self.head == self.released {
            return false;
        }
        self.released = self.head;
        self.layout
            .u64_at(mem, ctl::HEAD)
            .store(self.head, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let waiting = self.layout.u32_at(mem, ctl::PRODUCER_WAITING);
        waiting.load(Ordering::SeqCst) != 0 && waiting.swap(0, Ordering::SeqCst) != 0
    }

    /// Raises the consumer's waiting flag and re-checks for data: `Ok(true)`
    /// means data arrived (flag lowered again), `Ok(false)` means park until
    /// the producer rings.
    pub fn park(&mut self, mem: &SharedMemory) -> Result<bool, RingError> {
        let flag = self.layout.u32_at(mem, ctl::CONSUMER_WAITING);
        flag.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.reload_tail(mem)?;
        let data = self.head != self.tail_cache;
        if data {
            flag.store(0, Ordering::Relaxed);
        }
        Ok(data)
    }

    /// Whether the producer said it will send no more.
    pub fn producer_closed(&self, mem: &SharedMemory) -> bool {
        self.layout.producer_closed(mem)
    }

    /// Marks the ring closed by the consumer.
    pub fn close(&mut self, mem: &SharedMemory) {
        self.release(mem);
        self.layout
            .u32_at(mem, ctl::CONSUMER_CLOSED)
            .store(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::memfd_name;

    fn setup(size: usize) -> (SharedMemory, RingProducer, RingConsumer) {
        let mem = SharedMemory::create(&memfd_name("ring-test"), CONTROL_BYTES + size).unwrap();
        let layout = RingLayout {
            control: 0,
            data: CONTROL_BYTES,
            size,
        };
        assert!(layout.fits(&mem));
        (mem, RingProducer::new(layout), RingConsumer::new(layout))
    }

    fn read(mem: &SharedMemory, r: Record) -> Vec<u8> {
        let mut v = vec![0; r.len];
        assert!(mem.read(r.offset, &mut v));
        v
    }

    #[test]
    fn records_are_invisible_until_published_then_come_out_in_order() {
        let (mem, mut p, mut c) = setup(256);
        assert!(p.try_push(&mem, &[b"ab", b"c"]).unwrap());
        assert!(p.try_push(&mem, &[b"defg"]).unwrap());
        assert_eq!(c.next_record(&mem).unwrap(), None);
        p.publish(&mem);
        let r = c.next_record(&mem).unwrap().unwrap();
        assert_eq!(read(&mem, r), b"abc");
        let r = c.next_record(&mem).unwrap().unwrap();
        assert_eq!(read(&mem, r), b"defg");
        assert_eq!(c.next_record(&mem).unwrap(), None);
    }

    #[test]
    fn records_wrap_around_the_data_area_whole() {
        let (mem, mut p, mut c) = setup(128);
        for round in 0..100u8 {
            let rec = vec![round; (round as usize * 7) % 50];
            assert!(p.try_push(&mem, &[&rec]).unwrap(), "round {round}");
            p.publish(&mem);
            let r = c.next_record(&mem).unwrap().unwrap();
            assert_eq!(read(&mem, r), rec);
            c.release(&mem);
        }
    }

    #[test]
    fn a_full_ring_refuses_until_the_consumer_releases() {
        let (mem, mut p, mut c) = setup(128);
        let rec = [7u8; 24]; // stride 32
        for _ in 0..4 {
            assert!(p.try_push(&mem, &[&rec]).unwrap());
        }
        assert!(!p.try_push(&mem, &[&rec]).unwrap());
        p.publish(&mem);
        assert!(c.next_record(&mem).unwrap().is_some());
        assert!(!p.try_push(&mem, &[&rec]).unwrap(), "not released yet");
        c.release(&mem);
        assert!(p.try_push(&mem, &[&rec]).unwrap());
    }

    #[test]
    fn a_record_larger_than_half_the_ring_is_refused() {
        let (mem, mut p, _c) = setup(128);
        assert!(!p.try_push(&mem, &[&[0u8; 64]]).unwrap());
    }

    #[test]
    fn the_doorbell_is_due_only_when_the_consumer_parked() {
        let (mem, mut p, mut c) = setup(128);
        assert!(p.try_push(&mem, &[b"x"]).unwrap());
        assert!(!p.publish(&mem), "nobody parked");
        assert!(c.park(&mem).unwrap(), "data is there: do not park");
        let _ = c.next_record(&mem).unwrap();
        assert!(!c.park(&mem).unwrap(), "empty: park");
        assert!(p.try_push(&mem, &[b"y"]).unwrap());
        assert!(p.publish(&mem), "consumer parked: ring");
        assert!(p.try_push(&mem, &[b"z"]).unwrap());
        assert!(!p.publish(&mem), "flag already taken");
    }

    #[test]
    fn a_tail_beyond_the_ring_is_corruption_not_a_read() {
        let (mem, _p, mut c) = setup(128);
        mem.atomic_u64(ctl::TAIL)
            .unwrap()
            .store(1 << 40, Ordering::SeqCst);
        assert!(c.next_record(&mem).is_err());
    }

    #[test]
    fn a_record_header_longer_than_published_is_corruption() {
        let (mem, mut p, mut c) = setup(128);
        assert!(p.try_push(&mem, &[b"abcd"]).unwrap());
        p.publish(&mem);
        mem.write(CONTROL_BYTES, &1000u32.to_le_bytes());
        assert!(c.next_record(&mem).is_err());
    }

    #[test]
    fn a_head_past_the_tail_is_corruption() {
        let (mem, mut p, _c) = setup(128);
        mem.atomic_u64(ctl::HEAD)
            .unwrap()
            .store(64, Ordering::SeqCst);
        assert!(p.free(&mem).is_err());
    }
}
