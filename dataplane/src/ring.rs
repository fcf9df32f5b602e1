//! A bounded single-producer single-consumer ring with async wake-ups.
//!
//! The path between an application (or a stack) and the engine: one
//! producer, one consumer, a power-of-two array of slots allocated once.
//! Pushing and popping take no lock and allocate nothing; indices are
//! published with one atomic store per batch.
//!
//! Wake-ups are suppressed while the other side is busy: a side that finds
//! the ring empty (consumer) or full (producer) raises its *waiting* flag
//! before it parks, and the other side wakes it only when that flag is up.
//! Publishing a batch therefore costs one store and one load of a flag,
//! not a wake-up per message.
//!
//! The producer's pushes become visible to the consumer at
//! [`Producer::flush`] (or when the ring is full and the producer is about
//! to wait), so a burst is published — and its consumer woken — once.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;

/// Pads a value to its own cache line (128 bytes covers adjacent-line
/// prefetching on x86).
#[repr(align(128))]
struct Padded<T>(T);

struct Shared<T> {
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: usize,
    /// Next slot the consumer reads; written by the consumer only.
    head: Padded<AtomicUsize>,
    /// Next slot the producer writes; written by the producer only.
    tail: Padded<AtomicUsize>,
    consumer_waiting: AtomicBool,
    producer_waiting: AtomicBool,
    consumer_waker: AtomicWaker,
    producer_waker: AtomicWaker,
    producer_closed: AtomicBool,
    consumer_closed: AtomicBool,
}

// SAFETY: slots are handed from exactly one producer to exactly one
// consumer; a slot is written only while it is outside [head, tail) and read
// only while inside it, with release/acquire on the indices ordering the
// accesses. T must be Send to cross threads.
unsafe impl<T: Send> Send for Shared<T> {}
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        let head = *self.head.0.get_mut();
        let tail = *self.tail.0.get_mut();
        for i in head..tail {
            // SAFETY: slots in [head, tail) hold initialised values that
            // nobody else can reach any more.
            unsafe { (*self.slots[i & self.mask].get()).assume_init_drop() };
        }
    }
}

/// Creates a ring of at least `capacity` slots (rounded up to a power of
/// two, at least 2) and returns its two ends.
pub fn ring<T: Send>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let size = capacity.max(2).next_power_of_two();
    let slots = (0..size)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect();
    let shared = Arc::new(Shared {
        slots,
        mask: size - 1,
        head: Padded(AtomicUsize::new(0)),
        tail: Padded(AtomicUsize::new(0)),
        consumer_waiting: AtomicBool::new(false),
        producer_waiting: AtomicBool::new(false),
        consumer_waker: AtomicWaker::new(),
        producer_waker: AtomicWaker::new(),
        producer_closed: AtomicBool::new(false),
        consumer_closed: AtomicBool::new(false),
    });
    (
        Producer {
            shared: shared.clone(),
            tail: 0,
            published: 0,
            head_cache: 0,
        },
        Consumer {
            shared,
            head: 0,
            tail_cache: 0,
            released: 0,
        },
    )
}

/// The writing end of a ring. On a cache line of its own: its indices
/// change with every push, and a ring's two ends, or the ends of many
/// rings, often sit side by side in memory while different threads use
/// them.
#[repr(align(128))]
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    /// Next slot to write (ahead of the shared tail until flushed).
    tail: usize,
    /// The tail last stored to the shared index.
    published: usize,
    /// The consumer's head as last read.
    head_cache: usize,
}

impl<T: Send> Producer<T> {
    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }

    /// Slots free now (re-reading the consumer's position if needed).
    pub fn free(&mut self) -> usize {
        let cap = self.capacity();
        if self.tail - self.head_cache == cap {
            self.head_cache = self.shared.head.0.load(Ordering::Acquire);
        }
        cap - (self.tail - self.head_cache)
    }

    /// Whether the consumer is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.consumer_closed.load(Ordering::Acquire)
    }

    /// Writes `value` into the next slot, or gives it back when the ring is
    /// full. Not visible to the consumer until [`Producer::flush`].
    #[inline]
    pub fn push(&mut self, value: T) -> Result<(), T> {
        if self.free() == 0 {
            return Err(value);
        }
        // SAFETY: the slot at `tail` is outside [head, tail): the consumer
        // does not touch it until the tail is published past it.
        unsafe { (*self.shared.slots[self.tail & self.shared.mask].get()).write(value) };
        self.tail += 1;
        Ok(())
    }

    /// Publishes every value pushed so far and wakes the consumer if it is
    /// waiting. One store and one flag load per call, whatever the batch.
    #[inline]
    pub fn flush(&mut self) {
        if self.tail == self.published {
            return;
        }
        self.published = self.tail;
        // SeqCst pairs with the consumer's SeqCst flag store and index
        // load: either it sees the new tail or we see its flag.
        self.shared.tail.0.store(self.tail, Ordering::SeqCst);
        if self.shared.consumer_waiting.load(Ordering::SeqCst)
            && self.shared.consumer_waiting.swap(false, Ordering::SeqCst)
        {
            self.shared.consumer_waker.wake();
        }
    }

    /// `Ready` when at least one slot is free; otherwise publishes what is
    /// pending, registers the task and returns `Pending` until the
    /// consumer frees a slot. `Ready(Err(()))` when the consumer is gone.
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        if self.is_closed() {
            return Poll::Ready(Err(()));
        }
        if self.free() > 0 {
            return Poll::Ready(Ok(()));
        }
        self.flush();
        self.shared.producer_waker.register(cx.waker());
        self.shared.producer_waiting.store(true, Ordering::SeqCst);
        self.head_cache = self.shared.head.0.load(Ordering::SeqCst);
        if self.free() > 0 {
            self.shared.producer_waiting.store(false, Ordering::Relaxed);
            return Poll::Ready(Ok(()));
        }
        if self.is_closed() {
            return Poll::Ready(Err(()));
        }
        Poll::Pending
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        self.shared.tail.0.store(self.tail, Ordering::SeqCst);
        self.shared.producer_closed.store(true, Ordering::SeqCst);
        self.shared.consumer_waker.wake();
    }
}

/// The reading end of a ring.
#[repr(align(128))]
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    /// Next slot to read (ahead of the shared head until released).
    head: usize,
    /// The producer's tail as last read.
    tail_cache: usize,
    /// The head last stored to the shared index.
    released: usize,
}

impl<T: Send> Consumer<T> {
    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }

    /// Values readable now (re-reading the producer's position if needed).
    pub fn available(&mut self) -> usize {
        if self.head == self.tail_cache {
            self.tail_cache = self.shared.tail.0.load(Ordering::Acquire);
        }
        self.tail_cache - self.head
    }

    /// Whether the producer is gone (values it published may remain).
    pub fn is_closed(&self) -> bool {
        self.shared.producer_closed.load(Ordering::Acquire)
    }

    #[inline]
    fn take(&mut self) -> T {
        // SAFETY: the slot at `head` is inside [head, tail): the producer
        // published it and will not write it until the head moves past.
        let v =
            unsafe { (*self.shared.slots[self.head & self.shared.mask].get()).assume_init_read() };
        self.head += 1;
        v
    }

    /// The next value, without taking it.
    #[inline]
    pub fn peek(&mut self) -> Option<&T> {
        if self.available() == 0 {
            return None;
        }
        // SAFETY: as in `take`; the reference borrows `self`, so the slot
        // cannot be taken or released while it lives.
        Some(unsafe { (*self.shared.slots[self.head & self.shared.mask].get()).assume_init_ref() })
    }

    /// The next value among those seen readable at the last
    /// [`Consumer::available`] (or `peek`/`pop`), without re-reading the
    /// producer's position: for a scheduler that looks at many rings
    /// through shared references after refreshing each once.
    #[inline]
    pub fn peek_cached(&self) -> Option<&T> {
        if self.head == self.tail_cache {
            return None;
        }
        // SAFETY: as in `take`: [head, tail_cache) was published.
        Some(unsafe { (*self.shared.slots[self.head & self.shared.mask].get()).assume_init_ref() })
    }

    /// Whether values were seen readable at the last refresh and not
    /// all taken since (no shared index is read).
    #[inline]
    pub fn has_cached(&self) -> bool {
        self.head != self.tail_cache
    }

    /// Asks the processor to fetch the next slot, so that a consumer
    /// serving several rings in turn finds it in its cache.
    #[inline]
    pub fn prefetch_next(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            let slot = self.shared.slots[self.head & self.shared.mask].get();
            // SAFETY: prefetching is a hint; it reads nothing the program
            // sees and is valid for any address.
            unsafe {
                std::arch::x86_64::_mm_prefetch(slot.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0);
                std::arch::x86_64::_mm_prefetch(
                    slot.cast::<i8>().wrapping_add(64),
                    std::arch::x86_64::_MM_HINT_T0,
                );
            }
        }
    }

    /// Takes the next value, if any. The slot is returned to the producer
    /// at the next [`Consumer::release`] (batch calls release themselves).
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        if self.available() == 0 {
            return None;
        }
        Some(self.take())
    }

    /// Appends up to `max` values to `out`; returns how many. Releases the
    /// slots at once.
    pub fn pop_into(&mut self, out: &mut Vec<T>, max: usize) -> usize {
        let n = self.available().min(max);
        out.reserve(n);
        for _ in 0..n {
            let v = self.take();
            out.push(v);
        }
        self.release();
        n
    }

    /// Returns the slots of every value taken so far to the producer, and
    /// wakes it if it waits for room.
    #[inline]
    pub fn release(&mut self) {
        if self.head == self.released {
            return;
        }
        self.released = self.head;
        self.shared.head.0.store(self.head, Ordering::SeqCst);
        if self.shared.producer_waiting.load(Ordering::SeqCst)
            && self.shared.producer_waiting.swap(false, Ordering::SeqCst)
        {
            self.shared.producer_waker.wake();
        }
    }

    /// `Ready(true)` when a value is available, `Ready(false)` when the
    /// producer is gone and the ring is drained, else registers the task and
    /// returns `Pending` (after releasing taken slots).
    pub fn poll_available(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if self.available() > 0 {
            return Poll::Ready(true);
        }
        self.release();
        self.shared.consumer_waker.register(cx.waker());
        self.shared.consumer_waiting.store(true, Ordering::SeqCst);
        self.tail_cache = self.shared.tail.0.load(Ordering::SeqCst);
        if self.tail_cache > self.head {
            self.shared.consumer_waiting.store(false, Ordering::Relaxed);
            return Poll::Ready(true);
        }
        if self.is_closed() {
            // The producer stores its last tail before the closed flag.
            self.tail_cache = self.shared.tail.0.load(Ordering::SeqCst);
            return Poll::Ready(self.tail_cache > self.head);
        }
        Poll::Pending
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.shared.head.0.store(self.head, Ordering::SeqCst);
        self.shared.consumer_closed.store(true, Ordering::SeqCst);
        self.shared.producer_waker.wake();
    }
}

/// A [`Link`](crate::Link) made of two rings: what an application or a
/// stack holds to talk to the engine (the engine holds the other ends).
///
/// `start_send` pushes without publishing; `poll_flush` publishes the burst
/// with one store and at most one wake-up. Receiving releases slots in
/// batches.
pub struct RingLink {
    tx: Producer<crate::Message>,
    rx: Consumer<crate::Message>,
}

/// The engine's ends of a [`RingLink`]: it reads what the link sends and
/// writes what the link receives.
pub struct RingPort {
    /// Messages the link sent, for the engine to read.
    pub input: Consumer<crate::Message>,
    /// Messages for the link to receive, written by the engine.
    pub output: Producer<crate::Message>,
}

/// A link and the engine-side ends of its two rings, each `depth` deep.
pub fn ring_link(depth: usize) -> (RingLink, RingPort) {
    let (tx, input) = ring(depth);
    let (output, rx) = ring(depth);
    (RingLink { tx, rx }, RingPort { input, output })
}

impl futures_core::Stream for RingLink {
    type Item = Result<crate::Message, crate::LinkError>;

    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(m) = this.rx.pop() {
            if this.rx.head - this.rx.released >= this.rx.capacity() / 4 {
                this.rx.release();
            }
            return Poll::Ready(Some(Ok(m)));
        }
        match this.rx.poll_available(cx) {
            Poll::Ready(true) => Poll::Ready(this.rx.pop().map(Ok)),
            Poll::Ready(false) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl futures_sink::Sink<crate::Message> for RingLink {
    type Error = crate::LinkError;

    fn poll_ready(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        self.get_mut()
            .tx
            .poll_ready(cx)
            .map(|r| r.map_err(|()| crate::LinkError::Closed))
    }

    fn start_send(self: std::pin::Pin<&mut Self>, item: crate::Message) -> Result<(), Self::Error> {
        let this = self.get_mut();
        if this.tx.is_closed() {
            return Err(crate::LinkError::Closed);
        }
        this.tx.push(item).map_err(|_| crate::LinkError::TooLarge {
            size: this.tx.capacity() + 1,
            limit: this.tx.capacity(),
        })
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        self.get_mut().tx.flush();
        Poll::Ready(Ok(()))
    }

    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        self.get_mut().tx.flush();
        Poll::Ready(Ok(()))
    }
}

impl crate::Link for RingLink {
    fn poll_recv_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<crate::Message>,
        max: usize,
    ) -> Poll<Result<usize, crate::LinkError>> {
        let n = self.rx.pop_into(out, max);
        if n > 0 {
            return Poll::Ready(Ok(n));
        }
        match self.rx.poll_available(cx) {
            Poll::Ready(true) => Poll::Ready(Ok(self.rx.pop_into(out, max))),
            Poll::Ready(false) => Poll::Ready(Ok(0)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_send_batch(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut std::collections::VecDeque<crate::Message>,
    ) -> Poll<Result<(), crate::LinkError>> {
        loop {
            if self.tx.is_closed() {
                return Poll::Ready(Err(crate::LinkError::Closed));
            }
            while let Some(m) = batch.pop_front() {
                if let Err(m) = self.tx.push(m) {
                    batch.push_front(m);
                    break;
                }
            }
            if batch.is_empty() {
                return Poll::Ready(Ok(()));
            }
            match self.tx.poll_ready(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(())) => return Poll::Ready(Err(crate::LinkError::Closed)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn values_come_out_in_order_after_flush() {
        let (mut p, mut c) = ring(4);
        p.push(1).unwrap();
        p.push(2).unwrap();
        assert_eq!(c.pop(), None, "not visible before flush");
        p.flush();
        assert_eq!(c.pop(), Some(1));
        assert_eq!(c.pop(), Some(2));
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn a_full_ring_gives_the_value_back() {
        let (mut p, mut c) = ring(2);
        p.push(1).unwrap();
        p.push(2).unwrap();
        assert_eq!(p.push(3), Err(3));
        p.flush();
        assert_eq!(c.pop(), Some(1));
        c.release();
        p.push(3).unwrap();
    }

    #[test]
    fn capacity_rounds_up_to_a_power_of_two() {
        let (p, _c) = ring::<u8>(5);
        assert_eq!(p.capacity(), 8);
    }

    #[test]
    fn unread_values_are_dropped_with_the_ring() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct D;
        impl Drop for D {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let (mut p, c) = ring(4);
        for _ in 0..3 {
            assert!(p.push(D).is_ok());
        }
        drop(p);
        drop(c);
        assert_eq!(DROPS.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn threads_pass_a_million_values_without_loss_or_reordering() {
        let (mut p, mut c) = ring::<u64>(64);
        const N: u64 = 1_000_000;
        let producer = std::thread::spawn(move || {
            let mut i = 0;
            while i < N {
                while i < N && p.push(i).is_ok() {
                    i += 1;
                }
                p.flush();
                std::hint::spin_loop();
            }
        });
        let mut expect = 0;
        let mut out = Vec::with_capacity(64);
        while expect < N {
            out.clear();
            c.pop_into(&mut out, 64);
            for v in out.drain(..) {
                assert_eq!(v, expect);
                expect += 1;
            }
        }
        producer.join().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parked_sides_are_woken() {
        let (mut p, mut c) = ring::<u32>(4);
        const N: u32 = 100_000;
        let producer = tokio::spawn(async move {
            for i in 0..N {
                std::future::poll_fn(|cx| p.poll_ready(cx)).await.unwrap();
                p.push(i).unwrap();
                if i % 3 == 0 {
                    p.flush();
                }
            }
            p.flush();
        });
        let mut expect = 0;
        loop {
            let more = std::future::poll_fn(|cx| c.poll_available(cx)).await;
            if !more {
                break;
            }
            while let Some(v) = c.pop() {
                assert_eq!(v, expect);
                expect += 1;
            }
            c.release();
        }
        assert_eq!(expect, N);
        producer.await.unwrap();
    }
}

#[cfg(test)]
mod link_tests {
    use super::*;
    use crate::{LinkExt, Message, Uid};
    use bytes::Bytes;
    use futures_util::SinkExt;
    use std::collections::VecDeque;

    fn msg(i: u32) -> Message {
        let u = Uid::new(std::net::Ipv4Addr::LOCALHOST, 1);
        let mut m = Message::send(u.port(1), u.port(2), Bytes::new()).unwrap();
        m.set_seqnum(i);
        m
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ring_link_carries_bursts_through_an_echoing_port() {
        let (mut link, mut port) = ring_link(16);
        // The "engine": echo everything back, one ring to the other.
        let echo = std::thread::spawn(move || {
            let mut seen = 0;
            let mut buf = Vec::new();
            while seen < 10_000 {
                buf.clear();
                port.input.pop_into(&mut buf, 16);
                for m in buf.drain(..) {
                    let mut m = Some(m);
                    while let Some(v) = m.take() {
                        if let Err(v) = port.output.push(v) {
                            port.output.flush();
                            std::thread::yield_now();
                            m = Some(v);
                        }
                    }
                    seen += 1;
                }
                port.output.flush();
                std::thread::yield_now();
            }
            port
        });
        // Bursts of 8 out, 8 back: the receiver parks until the other
        // thread publishes, so every burst crosses a real wake-up.
        let mut batch: VecDeque<Message> = VecDeque::new();
        let mut got = Vec::with_capacity(8);
        for chunk in 0..1250u32 {
            batch.extend((0..8).map(|i| msg(chunk * 8 + i)));
            link.send_batch(&mut batch).await.unwrap();
            let mut n = 0;
            while n < 8 {
                got.clear();
                n += link.recv_batch(&mut got, 8).await.unwrap();
                for (k, m) in got.iter().enumerate() {
                    assert_eq!(m.header().seqnum, chunk * 8 + (n - got.len() + k) as u32);
                }
            }
        }
        let _port = echo.join().unwrap();
        link.close().await.unwrap();
    }
}
