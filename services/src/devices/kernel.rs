//! Kernel devices (`[[devices]] kind = "kernel"`, `backend = "emulated"`):
//! a [`Kernel`] on a thread of its own behind the PCIe-emulation path of
//! `uniplane-shm`, reached from the engine like any device port.
//!
//! ```text
//!  engine thread                                          kernel thread
//!  KernelPort (PortIo) ── ≤ pio_threshold: PIO mailbox ──▶ KernelEnd: takes frame `seq`
//!   push: request frame   > pio_threshold: FPGA Connect    from whichever path has it,
//!   pop:  answer frames  ◀─ answers, by their size, ─────   runs Kernel::on_message,
//!         back in order      the same two paths             frames the answers
//! ```
//!
//! The host end is a [`PortIo`] the engine drives from its own thread
//! ([`KernelPort`]): a request is framed ([`uniplane_kernel::wire`]) and
//! written into the PIO mailbox when its payload is at most
//! `pio_threshold` bytes, else into the kernel's FPGA Connect receive
//! window, spending a token. Nothing there blocks: a full mailbox or no
//! tokens holds the message back (one at most, counted in
//! [`PortIo::free`]) and the engine's queues hold the rest — back-pressure
//! up to the caller, never a drop. The kernel thread answers on the same
//! two paths by the answer's size; both ends put the frames of the two
//! paths back in order by their sequence numbers.
//!
//! Everything the kernel side writes is checked: a frame that does not
//! decode, answers no request waiting, or comes out of order is counted
//! (`garbage`) and dropped.
//!
//! Failures: a kernel that stops taking requests (tokens and mailbox
//! slots run out) or answers none for `stall_timeout_ms` while requests
//! wait, or whose thread dies, is declared failed by [`Watch`] (a daemon
//! task samples it): the device is marked down (`uniplane status` says
//! why), every request waiting and every later one is answered
//! `PeerFailed`, and the daemon closes the device's connections with a
//! notice. Other devices are not affected.
//!
//! Device memory (`memory = N`): one-sided WRTE and READ to the kernel's
//! UID are carried by the emulated DMA engine of `uniplane-shm` into and
//! out of the kernel's memory ([`dma`]: the mode — push, pull, staged,
//! staged-pipelined — chosen per transfer by its size), and the kernel
//! reads that memory ([`uniplane_kernel::Kernel::on_request`]). The host
//! end checks the range first (outside: `OutOfRange`, nothing written),
//! starts the transfer (up to [`dma::SLOTS`] in flight) and polls the
//! completions from the engine's thread, answering in the order the
//! transfers started. Later requests wait behind them in order (up to
//! a client's transfer window; then [`PortIo::free`] is 0 and the
//! engine's queues hold the rest): one-sided ones as slots free up,
//! messages once no transfer is in flight. The answers are the host
//! memory device's ([`super::handle`]); a DMA
//! error completion answers `PeerFailed` and marks the device down. A
//! kernel without memory answers every non-empty one-sided request
//! `OutOfRange`.

pub mod dma;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::thread::Thread;
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use serde_json::json;
use uniplane_dataplane::wire::{Header, MsgFlags, Params, PortParams, ReqType, Request, Status};
use uniplane_dataplane::{Message, PortClosed, PortIo, Uid};
use uniplane_kernel::wire::{earlier, pick, Caller, Frame, FrameKind, Pick, FRAME_HEADER_BYTES};
use uniplane_kernel::{Emit, Kernel, KernelError};
use uniplane_shm::connect::{ConnectConfig, ConnectPort, FRAME_HEADER_BYTES as CONNECT_HEADER};
use uniplane_shm::mailbox::{MailboxReceiver, MailboxRegion, MailboxSender, Side, WaitPolicy};
use uniplane_shm::ring::{RingLayout, CONTROL_BYTES, RECORD_HEADER};
use uniplane_shm::sys::{memfd_name, SharedMemory};

use crate::config::{DeviceKind, KernelDeviceConfig, KernelFunction, KernelWait};
use dma::{DmaPath, KernelMemory};
use uniplane_overlay::acl::ConnKey;
use uniplane_shm::p2p::TransferMode;

/// The one FPGA Connect connection between host and kernel: it carries
/// every overlay connection (the kernel's `conn` is in the frame).
const CONNECT_CONN: u16 = 0;
/// Overlay connections a kernel device tells apart at once; beyond, the
/// oldest slot is reused.
const KERNEL_CONNS: usize = 256;
/// Requests a kernel device's host end keeps behind a DMA transfer in
/// flight (as many one-sided requests as a transfer keeps in flight);
/// beyond, the engine's queues hold them.
const BEHIND_DMA: usize = crate::transfer::WINDOW;

/// Answers a chained device has sent on and awaits from its next device;
/// beyond, an answer is refused to its caller (`Timeout`) rather than
/// sent on. The queues between the two devices bound it well below.
const MAX_ORIGINS: usize = 1 << 16;

/// Largest frame: a header and the largest payload.
const MAX_FRAME: usize = FRAME_HEADER_BYTES + Message::MAX_PAYLOAD;

/// Why a kernel device could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KernelDeviceError {
    /// The shared memory of the emulated path could not be made.
    #[error("kernel device: {0}")]
    Setup(String),
    /// No thread for the kernel.
    #[error("kernel device: no thread for the kernel: {0}")]
    Thread(#[from] std::io::Error),
}

/// What a kernel device did, shared by its host end, its kernel thread,
/// the daemon's watch and `uniplane status`.
#[derive(Debug, Default)]
pub struct KernelStats {
    /// Requests sent through the PIO mailbox.
    pub pio_requests: AtomicU64,
    /// Requests sent through FPGA Connect.
    pub connect_requests: AtomicU64,
    /// Answer frames received through the PIO mailbox.
    pub pio_answers: AtomicU64,
    /// Answer frames received through FPGA Connect.
    pub connect_answers: AtomicU64,
    /// Error answers of the kernel (a request it refused).
    pub kernel_errors: AtomicU64,
    /// Frames from the kernel refused (undecodable, out of order, for no
    /// request waiting) and dropped.
    pub garbage: AtomicU64,
    /// Requests answered `PeerFailed` because the device was down.
    pub failed_requests: AtomicU64,
    /// One-sided transfers by DMA mode, in [`TransferMode::ALL`]'s order.
    pub dma_modes: [AtomicU64; 4],
    /// One-sided writes done by DMA.
    pub dma_writes: AtomicU64,
    /// One-sided reads done by DMA.
    pub dma_reads: AtomicU64,
    /// Bytes moved by DMA.
    pub dma_bytes: AtomicU64,
    /// One-sided requests refused `OutOfRange` (nothing moved).
    pub out_of_range: AtomicU64,
    /// A chained device: answers sent on to the next device.
    pub forwarded: AtomicU64,
    /// A chained device: the next device's answers returned to callers.
    pub returned: AtomicU64,
    /// A chained device: answers refused to their callers because the
    /// chain was down (`NoRoute`) or too many waited (`Timeout`), and
    /// callers answered `PeerFailed` because the chain went down while
    /// they waited.
    pub chain_failed: AtomicU64,
    /// Frames received from the kernel, garbage included: the sign of
    /// life [`Watch`] looks at.
    received: AtomicU64,
    /// Whether requests wait for the kernel (sent or held back).
    waiting: AtomicBool,
}

/// A kernel device's shared state.
#[derive(Debug)]
pub struct KernelShared {
    /// Its counters.
    pub stats: KernelStats,
    config: KernelDeviceConfig,
    down: Mutex<Option<String>>,
    is_down: AtomicBool,
    /// Set when the host end goes (or the device is down): the kernel
    /// thread returns.
    shutdown: AtomicBool,
    /// Cleared when the kernel thread ends, panics included.
    alive: AtomicBool,
    /// The engine's waker, woken when the kernel answered or made room.
    host_waker: AtomicWaker,
    kernel_thread: OnceLock<Thread>,
    /// Whether the device sends its answers on (`next`).
    chained: bool,
    /// The chain's connection while it is installed (the driver sets it
    /// from the control core's `Chain` action); `chain_epoch` counts the
    /// changes, so the host end reads it under the lock only after one.
    chain: Mutex<Option<ConnKey>>,
    chain_epoch: AtomicU64,
}

impl KernelShared {
    fn new(config: KernelDeviceConfig, chained: bool) -> KernelShared {
        KernelShared {
            chained,
            chain: Mutex::new(None),
            chain_epoch: AtomicU64::new(0),
            stats: KernelStats::default(),
            config,
            down: Mutex::new(None),
            is_down: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            alive: AtomicBool::new(true),
            host_waker: AtomicWaker::new(),
            kernel_thread: OnceLock::new(),
        }
    }

    /// The chain's connection is installed (`Some`) or gone: answers go
    /// on through it only while it is; callers waiting on the next device
    /// when it goes are answered `PeerFailed`.
    pub fn set_chain(&self, conn: Option<ConnKey>) {
        if let Ok(mut c) = self.chain.lock() {
            *c = conn;
        }
        self.chain_epoch.fetch_add(1, Relaxed);
        self.host_waker.wake();
    }

    /// The device's settings.
    pub fn config(&self) -> &KernelDeviceConfig {
        &self.config
    }

    /// Why the device is down, or `None` while it serves.
    pub fn down(&self) -> Option<String> {
        self.down.lock().map(|d| d.clone()).unwrap_or(None)
    }

    /// Marks the device down for `reason` (the first reason stays): the
    /// kernel thread is told to stop, and the host end answers every
    /// waiting and later request `PeerFailed`.
    pub fn mark_down(&self, reason: String) {
        if let Ok(mut d) = self.down.lock() {
            d.get_or_insert(reason);
        }
        self.is_down.store(true, Relaxed);
        self.stop();
        self.host_waker.wake();
    }

    /// Whether the device stopped: its host end went (the daemon stops)
    /// or it was marked down.
    pub fn stopped(&self) -> bool {
        self.shutdown.load(Relaxed)
    }

    fn stop(&self) {
        self.shutdown.store(true, Relaxed);
        if let Some(t) = self.kernel_thread.get() {
            t.unpark();
        }
    }

    fn unpark_kernel(&self) {
        if let Some(t) = self.kernel_thread.get() {
            t.unpark();
        }
    }

    /// The counters and state as `uniplane status` shows them.
    pub fn json(&self) -> serde_json::Value {
        let n = |c: &AtomicU64| c.load(Relaxed);
        let s = &self.stats;
        let down = self.down();
        json!({
            "state": if down.is_some() { "down" } else { "up" },
            "down_reason": down,
            "function": self.config.function.name(),
            "pio_threshold": self.config.pio_threshold,
            "tokens": self.config.tokens,
            "stall_timeout_ms": self.config.stall_timeout_ms,
            "wait": match self.config.wait { KernelWait::Park => "park", KernelWait::Busy => "busy" },
            "messages": {
                "pio": n(&s.pio_requests),
                "connect": n(&s.connect_requests),
                "dma": n(&s.dma_writes) + n(&s.dma_reads),
            },
            "memory": self.config.memory,
            "dma": {
                "writes": n(&s.dma_writes),
                "reads": n(&s.dma_reads),
                "bytes": n(&s.dma_bytes),
                "out_of_range": n(&s.out_of_range),
                "modes": TransferMode::ALL
                    .iter()
                    .map(|m| (m.name().to_owned(), json!(n(&s.dma_modes[dma::mode_index(*m)]))))
                    .collect::<serde_json::Map<_, _>>(),
                "pull_from": self.config.dma.pull_from,
                "staged_from": self.config.dma.staged_from,
                "pipelined_from": self.config.dma.pipelined_from,
            },
            "answers": {
                "pio": n(&s.pio_answers),
                "connect": n(&s.connect_answers),
            },
            "kernel_errors": n(&s.kernel_errors),
            "garbage": n(&s.garbage),
            "failed_requests": n(&s.failed_requests),
            "chain": self.chained.then(|| json!({
                "up": self.chain.lock().map(|c| c.is_some()).unwrap_or(false),
                "forwarded": n(&s.forwarded),
                "returned": n(&s.returned),
                "failed": n(&s.chain_failed),
            })),
        })
    }
}

/// Decides when a kernel device has failed, on the time it is given: its
/// thread died, or requests have waited `timeout` without a frame from
/// the kernel.
#[derive(Clone, Copy, Debug)]
pub struct Watch {
    timeout: Duration,
    seen: u64,
    since: Duration,
    waiting: bool,
}

impl Watch {
    /// A watch that allows `timeout` of silence while requests wait.
    pub fn new(timeout: Duration) -> Watch {
        Watch {
            timeout,
            seen: 0,
            since: Duration::ZERO,
            waiting: false,
        }
    }

    /// How often to [`Watch::observe`]: a quarter of the timeout.
    pub fn period(&self) -> Duration {
        (self.timeout / 4).max(Duration::from_millis(1))
    }

    /// What is seen at `now`: frames `received` from the kernel so far,
    /// whether requests are `waiting`, whether its thread is `alive`.
    /// `Some(reason)` once the device has failed.
    pub fn observe(
        &mut self,
        now: Duration,
        received: u64,
        waiting: bool,
        alive: bool,
    ) -> Option<String> {
        if !alive {
            return Some("the kernel thread died".into());
        }
        // Silence counts from the first look that saw requests waiting.
        let started = waiting && !self.waiting;
        self.waiting = waiting;
        if received != self.seen || !waiting || started {
            self.seen = received;
            self.since = now;
            return None;
        }
        (now.saturating_sub(self.since) >= self.timeout).then(|| {
            format!(
                "the kernel answered nothing for {} ms while requests waited",
                self.timeout.as_millis()
            )
        })
    }

    /// Samples `shared` (see [`Watch::observe`]).
    pub fn check(&mut self, now: Duration, shared: &KernelShared) -> Option<String> {
        self.observe(
            now,
            shared.stats.received.load(Relaxed),
            shared.stats.waiting.load(Relaxed),
            shared.alive.load(Relaxed),
        )
    }
}

/// The regions of one device's emulated path: a PIO mailbox and the two
/// FPGA Connect receive windows.
struct Path {
    mailbox: MailboxRegion,
    connect_memory: Arc<SharedMemory>,
    windows: [RingLayout; 2],
    connect: ConnectConfig,
}

impl Path {
    fn new(config: &KernelDeviceConfig) -> Result<Path, KernelDeviceError> {
        let setup = |e: &dyn std::fmt::Display| KernelDeviceError::Setup(e.to_string());
        // One slot holds a whole PIO frame: a send never waits midway.
        let slot = (config.pio_threshold + FRAME_HEADER_BYTES + 8).div_ceil(128) * 128;
        let mailbox = MailboxRegion::create(1, slot).map_err(|e| setup(&e))?;
        // A window holds every token's largest frame, and a record may
        // take at most half of it.
        let record = (RECORD_HEADER + CONNECT_HEADER + MAX_FRAME + 7) & !7;
        let size = (record * config.tokens as usize)
            .max(2 * record)
            .next_power_of_two();
        let connect_memory =
            SharedMemory::create(&memfd_name("kernel-connect"), 2 * (CONTROL_BYTES + size))
                .map_err(|e| setup(&e))?;
        let window = |i: usize| RingLayout {
            control: i * CONTROL_BYTES,
            data: 2 * CONTROL_BYTES + i * size,
            size,
        };
        Ok(Path {
            mailbox,
            connect_memory: Arc::new(connect_memory),
            windows: [window(0), window(1)],
            connect: ConnectConfig {
                max_connections: 1,
                tokens: config.tokens,
                max_payload: MAX_FRAME,
            },
        })
    }

    /// Side A is the host, B the kernel; window 0 is the kernel's, 1 the host's.
    fn end(&self, side: Side, wait: KernelWait) -> Option<End> {
        let policy = match wait {
            KernelWait::Busy => WaitPolicy::BusyPoll,
            KernelWait::Park => WaitPolicy::default(),
        };
        let (tx, rx) = self.mailbox.endpoint(0, side, policy)?;
        let (peer, own) = match side {
            Side::A => (self.windows[0], self.windows[1]),
            Side::B => (self.windows[1], self.windows[0]),
        };
        let mut connect = ConnectPort::new(self.connect, self.connect_memory.clone(), peer, own)?;
        connect.protocol().open(CONNECT_CONN).ok()?;
        let max = self.mailbox.slot_payload();
        Some(End {
            mailbox_tx: tx,
            mailbox_rx: rx.with_max_message(max),
            connect,
            threshold: 0,
            scratch: Vec::with_capacity(MAX_FRAME),
            mailbox_head: Vec::with_capacity(max),
            mailbox_has: false,
            connect_head: None,
            next_seq: 0,
            expect: 0,
            #[cfg(test)]
            own_window: (self.connect_memory.clone(), own),
        })
    }
}

/// Which path a frame came by or goes by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Pio,
    Connect,
}

/// One side of the emulated path: sends frames by size, takes frames in
/// order from both paths.
struct End {
    mailbox_tx: MailboxSender,
    mailbox_rx: MailboxReceiver,
    connect: ConnectPort,
    threshold: usize,
    scratch: Vec<u8>,
    mailbox_head: Vec<u8>,
    mailbox_has: bool,
    connect_head: Option<Bytes>,
    next_seq: u32,
    expect: u32,
    /// The window this side reads, for tests that corrupt it.
    #[cfg(test)]
    own_window: (Arc<SharedMemory>, RingLayout),
}

/// What [`End::next`] found.
enum Next {
    /// Frame `expect` arrived (its bytes: [`End::frame`]).
    Frame(Via),
    /// Bytes that are not a frame, dropped.
    Garbage,
    /// Nothing in order yet.
    Empty,
    /// A path's shared memory is corrupt (a mailbox slot or the Connect
    /// window's control words): nothing more can be read from it.
    Broken(String),
}

impl End {
    /// Sends `frame` with `payload` by the payload's size: `Ok(Some(via))`
    /// when sent, `Ok(None)` when the path has no room now.
    fn send(&mut self, mut frame: Frame, payload: &[u8]) -> Result<Option<Via>, String> {
        frame.seq = self.next_seq;
        self.scratch.clear();
        self.scratch.extend_from_slice(&frame.encode());
        self.scratch.extend_from_slice(payload);
        let via = if payload.len() <= self.threshold {
            match self
                .mailbox_tx
                .send_deadline(&self.scratch, Some(Instant::now()))
            {
                Ok(()) => Via::Pio,
                Err(uniplane_shm::mailbox::MailboxError::Timeout) => return Ok(None),
                Err(e) => return Err(format!("PIO mailbox: {e}")),
            }
        } else {
            let mut sent = self.connect.send(CONNECT_CONN, &self.scratch);
            if matches!(sent, Ok(false)) {
                // Tokens come back in ACKs in our own window: read it
                // (data frames wait in their queue), then try again.
                if let Err(e) = self.connect.poll() {
                    return Err(format!("FPGA Connect: {e}"));
                }
                sent = self.connect.send(CONNECT_CONN, &self.scratch);
            }
            match sent {
                Ok(true) => Via::Connect,
                Ok(false) => return Ok(None),
                Err(e) => return Err(format!("FPGA Connect: {e}")),
            }
        };
        self.next_seq = self.next_seq.wrapping_add(1);
        Ok(Some(via))
    }

    /// Sends raw bytes that are not a frame (the `garbage` kernel).
    fn send_raw(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() <= self.threshold {
            self.mailbox_tx
                .send_deadline(bytes, Some(Instant::now()))
                .is_ok()
        } else {
            self.connect.send(CONNECT_CONN, bytes).unwrap_or(false)
        }
    }

    fn head_seq(bytes: &[u8]) -> Option<u32> {
        Frame::decode(bytes).ok().map(|(f, _)| f.seq)
    }

    /// Looks at both paths for frame `expect`.
    fn next(&mut self) -> Next {
        if !self.mailbox_has && self.mailbox_rx.ready() {
            let deadline = Instant::now() + Duration::from_millis(1);
            match self
                .mailbox_rx
                .recv_deadline(&mut self.mailbox_head, Some(deadline))
            {
                Ok(_) if Frame::decode(&self.mailbox_head).is_ok() => self.mailbox_has = true,
                // A message cut short: what arrived is dropped.
                Ok(_) | Err(uniplane_shm::mailbox::MailboxError::Timeout) => return Next::Garbage,
                // The slot stays as it is: it would be read again and again.
                Err(e) => return Next::Broken(format!("PIO mailbox: {e}")),
            }
        }
        if self.connect_head.is_none() {
            if let Err(e) = self.connect.poll() {
                return Next::Broken(format!("FPGA Connect: {e}"));
            }
            if let Some(b) = self.connect.take(CONNECT_CONN) {
                if Frame::decode(&b).is_err() {
                    return Next::Garbage;
                }
                self.connect_head = Some(b);
            }
        }
        let a = self
            .mailbox_has
            .then(|| Self::head_seq(&self.mailbox_head))
            .flatten();
        let b = self.connect_head.as_deref().and_then(Self::head_seq);
        // A frame from before the one expected can never be taken: it
        // would block its path for good.
        let stale =
            |seq: Option<u32>| seq.is_some_and(|s| (s.wrapping_sub(self.expect) as i32) < 0);
        if stale(a) {
            self.mailbox_has = false;
            return Next::Garbage;
        }
        if stale(b) {
            self.connect_head = None;
            return Next::Garbage;
        }
        let choice = match pick(self.expect, a, b) {
            Pick::Skip => match (a, b) {
                (Some(a), Some(b)) => earlier(self.expect, a, b),
                _ => Pick::Wait,
            },
            p => p,
        };
        let via = match choice {
            Pick::First => Via::Pio,
            Pick::Second => Via::Connect,
            _ => return Next::Empty,
        };
        // After a skip, frames before this one were lost: go on from it.
        let seq = if via == Via::Pio { a } else { b };
        self.expect = seq.unwrap_or(self.expect).wrapping_add(1);
        Next::Frame(via)
    }

    /// The bytes of the frame [`End::next`] found on `via`.
    fn frame(&self, via: Via) -> &[u8] {
        match via {
            Via::Pio => &self.mailbox_head,
            Via::Connect => self.connect_head.as_deref().unwrap_or(&[]),
        }
    }

    /// Done with the frame found on `via`.
    fn consumed(&mut self, via: Via) {
        match via {
            Via::Pio => self.mailbox_has = false,
            Via::Connect => self.connect_head = None,
        }
    }
}

/// A request sent to the kernel and not yet fully answered.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    request: u32,
    header: Header,
}

/// The host end of a kernel device: a [`PortIo`] the engine drives.
pub struct KernelPort {
    shared: Arc<KernelShared>,
    end: End,
    in_flight: VecDeque<Waiting>,
    max_in_flight: usize,
    held: Option<Message>,
    ready: VecDeque<Message>,
    ready_capacity: usize,
    conns: HashMap<(Uid, u16, u16), u16>,
    conn_keys: Vec<Option<(Uid, u16, u16)>>,
    /// Whether the kernel was told of the connection in each slot
    /// ([`FrameKind::Open`]): sent before the slot's first request.
    announced: Vec<bool>,
    /// Slots whose connection ended, to tell the kernel
    /// ([`FrameKind::Close`]) before anything else is sent.
    closing: VecDeque<u16>,
    next_conn: usize,
    received: u64,
    failed_over: bool,
    /// The kernel's memory behind its DMA engine (`memory` above 0).
    dma: Option<DmaPath>,
    /// The one-sided requests whose transfers are in flight, oldest first.
    dma_requests: VecDeque<Message>,
    /// Requests that came while a transfer was in flight, in order.
    behind: VecDeque<Message>,
    /// Bytes of the kernel's memory the host end lets requests reach.
    memory_size: u64,
    /// A chained device: the chain's connection while installed, and the
    /// change of [`KernelShared::set_chain`] it reflects.
    chain: Option<ConnKey>,
    chain_epoch: u64,
    /// The requests whose answers went on to the next device, oldest
    /// first: the next device's answers come back in this order.
    origins: VecDeque<Header>,
}

impl std::fmt::Debug for KernelPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelPort")
            .field("in_flight", &self.in_flight.len())
            .field("held", &self.held.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for KernelPort {
    fn drop(&mut self) {
        self.shared.stop();
    }
}

/// Sets up a kernel device `name`: its emulated path and its kernel
/// thread (which waits for work). Returns the host end, for the engine,
/// and the shared state.
pub fn open(
    name: &str,
    config: KernelDeviceConfig,
) -> Result<(KernelPort, Arc<KernelShared>), KernelDeviceError> {
    open_with(name, config, None, false)
}

/// [`open`] with the kernel built already (a library kernel, from its
/// parameters; otherwise the function's own), and `chained`: its answers
/// go on to a next device ([`KernelShared::set_chain`]).
pub fn open_with(
    name: &str,
    config: KernelDeviceConfig,
    kernel_fn: Option<Box<dyn Kernel>>,
    chained: bool,
) -> Result<(KernelPort, Arc<KernelShared>), KernelDeviceError> {
    let path = Path::new(&config)?;
    let broken = || KernelDeviceError::Setup("the emulated path's regions do not fit".into());
    let mut host = path.end(Side::A, config.wait).ok_or_else(broken)?;
    let mut kernel = path.end(Side::B, config.wait).ok_or_else(broken)?;
    host.threshold = config.pio_threshold;
    kernel.threshold = config.pio_threshold;
    let dma = match config.memory {
        0 => None,
        bytes => Some(
            DmaPath::new(
                name,
                bytes,
                config.dma,
                Duration::from_millis(config.stall_timeout_ms),
            )
            .map_err(KernelDeviceError::Setup)?,
        ),
    };
    let memory = dma.as_ref().map(DmaPath::memory).unwrap_or_default();
    let shared = Arc::new(KernelShared::new(config, chained));
    let max_in_flight = config.tokens as usize + 2;
    let port = KernelPort {
        shared: shared.clone(),
        end: host,
        in_flight: VecDeque::with_capacity(max_in_flight),
        max_in_flight,
        held: None,
        ready: VecDeque::with_capacity(max_in_flight + 64),
        ready_capacity: max_in_flight + 64,
        conns: HashMap::with_capacity(KERNEL_CONNS),
        conn_keys: vec![None; KERNEL_CONNS],
        announced: vec![false; KERNEL_CONNS],
        closing: VecDeque::with_capacity(KERNEL_CONNS),
        next_conn: 0,
        received: 0,
        failed_over: false,
        memory_size: dma.as_ref().map_or(0, DmaPath::size),
        dma,
        dma_requests: VecDeque::with_capacity(dma::SLOTS),
        behind: VecDeque::with_capacity(BEHIND_DMA),
        chain: None,
        chain_epoch: 0,
        origins: VecDeque::new(),
    };
    let thread_shared = shared.clone();
    let handle = std::thread::Builder::new()
        .name(format!("kernel-{name}"))
        .spawn(move || {
            let _alive = Alive(thread_shared.clone());
            // Wait until the thread is known, so the host can wake it.
            while thread_shared.kernel_thread.get().is_none() {
                std::thread::park();
            }
            KernelEnd::new(thread_shared, kernel, memory, kernel_fn).run();
        })?;
    let _ = shared.kernel_thread.set(handle.thread().clone());
    handle.thread().unpark();
    Ok((port, shared))
}

/// Clears `alive` when the kernel thread ends, however it ends.
struct Alive(Arc<KernelShared>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.alive.store(false, Relaxed);
        self.0.host_waker.wake();
    }
}

/// The reply header to a request with header `h`: back to its source, on
/// its ports, same sequence number and flags (as the echo device).
fn reply_header(h: &Header) -> Option<Header> {
    let (src_port, dst_port) = h.request.ports()?;
    let request = Request::new(
        h.request.kind(),
        Params::Port(PortParams {
            flag: 0,
            src_port: dst_port,
            dst_port: src_port,
        }),
    )
    .ok()?;
    let mut reply = Header::new(h.dst, h.src, request);
    reply.seqnum = h.seqnum;
    reply.flags = h.flags;
    Some(reply)
}

fn error_to(h: &Header, status: Status) -> Option<Message> {
    Message::new(*h, Bytes::new()).ok()?.error_answer(status)
}

impl KernelPort {
    fn is_down(&self) -> bool {
        self.shared.is_down.load(Relaxed)
    }

    fn publish_waiting(&self) {
        let waiting = !self.in_flight.is_empty() || self.held.is_some();
        self.shared.stats.waiting.store(waiting, Relaxed);
    }

    /// The kernel connection of an overlay connection, given one on first
    /// sight (the oldest is reused when all are taken).
    fn conn_of(&mut self, h: &Header) -> u16 {
        let Some((src_port, dst_port)) = h.request.ports() else {
            return 0;
        };
        let key = (h.src, src_port, dst_port);
        if let Some(&c) = self.conns.get(&key) {
            return c;
        }
        let slot = self.next_conn;
        self.next_conn = (slot + 1) % KERNEL_CONNS;
        if let Some(old) = self.conn_keys[slot].replace(key) {
            self.conns.remove(&old);
        }
        // The slot's new connection is told to the kernel before its
        // first request (which also makes it forget the old one's).
        self.announced[slot] = false;
        self.conns.insert(key, slot as u16);
        slot as u16
    }

    /// A CLOSE in band from the caller.
    fn forget_conn(&mut self, h: &Header) {
        if let Some((src_port, dst_port)) = h.request.ports() {
            self.forget_key((h.src, src_port, dst_port));
        }
    }

    /// The daemon's NOTIFY that a connection ended (its caller's session
    /// may be gone, with no CLOSE in band): `[ local port | remote UID |
    /// remote port ]`, big-endian. Only the daemon of this server (device
    /// 0) is heard.
    fn forget_noticed(&mut self, m: &Message) {
        let h = m.header();
        if h.src.device() != 0 || h.src.server() != h.dst.server() {
            return;
        }
        let p = m.payload();
        if p.len() != 10 {
            return;
        }
        let local = u16::from_be_bytes([p[0], p[1]]);
        let mut uid = [0u8; 6];
        uid.copy_from_slice(&p[2..8]);
        let remote = u16::from_be_bytes([p[8], p[9]]);
        self.forget_key((Uid::from_bytes(uid), remote, local));
    }

    fn forget_key(&mut self, key: (Uid, u16, u16)) {
        if let Some(c) = self.conns.remove(&key) {
            self.conn_keys[c as usize] = None;
            if std::mem::take(&mut self.announced[c as usize]) {
                // At most one entry a slot: a slot is announced again
                // only after its close went.
                self.closing.push_back(c);
            }
        }
    }

    /// Tells the kernel of the connections that ended, then of the one
    /// in `conn` if it is new: false when the path has no room yet (or
    /// broke) and the request must wait.
    fn announce(&mut self, conn: u16) -> bool {
        while let Some(&c) = self.closing.front() {
            if !self.control_frame(FrameKind::Close, c, &[]) {
                return false;
            }
            self.closing.pop_front();
        }
        if self.announced[conn as usize] {
            return true;
        }
        let Some((uid, src_port, _)) = self.conn_keys[conn as usize] else {
            // A request with no ports (slot 0 by default): nobody to name.
            return true;
        };
        let caller = Caller {
            server: uid.server(),
            device: uid.device(),
            port: src_port,
        };
        if !self.control_frame(FrameKind::Open, conn, &caller.encode()) {
            return false;
        }
        self.announced[conn as usize] = true;
        true
    }

    /// Sends an `Open` or `Close` frame: whether it went.
    fn control_frame(&mut self, kind: FrameKind, conn: u16, payload: &[u8]) -> bool {
        let frame = Frame {
            kind,
            code: 0,
            conn,
            request: 0,
            seq: 0,
        };
        match self.end.send(frame, payload) {
            Ok(Some(_)) => true,
            Ok(None) => false,
            Err(reason) => {
                self.shared.mark_down(reason);
                false
            }
        }
    }

    /// Sends `m` to the kernel, or gives it back when the path has no room.
    fn try_send(&mut self, m: Message) -> Result<(), Message> {
        if self.in_flight.len() >= self.max_in_flight {
            return Err(m);
        }
        let header = *m.header();
        let conn = self.conn_of(&header);
        if !self.announce(conn) {
            return Err(m);
        }
        let request = self.end.next_seq;
        let frame = Frame {
            kind: FrameKind::Request,
            code: 0,
            conn,
            request,
            seq: request,
        };
        match self.end.send(frame, m.payload()) {
            Ok(Some(via)) => {
                let counter = match via {
                    Via::Pio => &self.shared.stats.pio_requests,
                    Via::Connect => &self.shared.stats.connect_requests,
                };
                counter.fetch_add(1, Relaxed);
                self.in_flight.push_back(Waiting { request, header });
                Ok(())
            }
            Ok(None) => Err(m),
            Err(reason) => {
                self.shared.mark_down(reason);
                Err(m)
            }
        }
    }

    /// Sends the message held back, if the path has room now.
    fn retry_held(&mut self) {
        if let Some(m) = self.held.take() {
            if let Err(m) = self.try_send(m) {
                self.held = Some(m);
            }
        }
    }

    /// Once down: every request waiting or held is answered `PeerFailed`.
    fn fail_over(&mut self) {
        if self.failed_over {
            return;
        }
        self.failed_over = true;
        let in_flight = std::mem::take(&mut self.dma_requests);
        for m in in_flight.into_iter().chain(self.behind.drain(..)) {
            if let Some(a) = m.error_answer(Status::PeerFailed) {
                self.shared.stats.failed_requests.fetch_add(1, Relaxed);
                self.ready.push_back(a);
            }
        }
        let held = self.held.take().map(|m| *m.header());
        for h in self.in_flight.drain(..).map(|w| w.header).chain(held) {
            self.shared.stats.failed_requests.fetch_add(1, Relaxed);
            self.ready.extend(error_to(&h, Status::PeerFailed));
        }
        self.publish_waiting();
    }

    /// Takes what the kernel answered into `ready`, in order; first
    /// sends the message held back if there is room now (the engine asks
    /// for room only while it has more for this port, so the last one
    /// held must go from here: the kernel wakes the engine's input side
    /// when it makes room).
    fn receive(&mut self) {
        self.refresh_chain();
        self.drive_dma();
        if self.is_down() {
            self.fail_over();
            return;
        }
        self.retry_held();
        // Bounded: a kernel writing garbage as fast as it is read must not
        // keep the engine here.
        for _ in 0..self.ready_capacity {
            if self.ready.len() >= self.ready_capacity {
                break;
            }
            let via = match self.end.next() {
                Next::Empty => break,
                Next::Broken(reason) => {
                    self.shared.mark_down(reason);
                    self.fail_over();
                    break;
                }
                Next::Garbage => {
                    self.received += 1;
                    self.shared.stats.garbage.fetch_add(1, Relaxed);
                    continue;
                }
                Next::Frame(via) => via,
            };
            self.received += 1;
            let answer = self.answer(via);
            self.end.consumed(via);
            match answer {
                Some(Some(m)) => self.ready.push_back(m),
                Some(None) => {}
                None => {
                    self.shared.stats.garbage.fetch_add(1, Relaxed);
                }
            }
        }
        self.shared.stats.received.store(self.received, Relaxed);
        self.publish_waiting();
    }

    /// Whether a one-sided transfer is in flight or requests wait behind
    /// one.
    fn dma_busy(&self) -> bool {
        !self.dma_requests.is_empty() || !self.behind.is_empty()
    }

    /// Polls the transfers in flight; those that ended have their answers
    /// join `ready`, in the order they started (room was kept for them).
    ///
    /// Then takes the requests that waited behind them, in order: one-sided
    /// ones while the DMA path has a free slot, anything else once no
    /// transfer is in flight (a message to the kernel finds the bytes
    /// written before it in place).
    fn drive_dma(&mut self) {
        loop {
            while self.finish_transfer() {}
            if self.held.is_some() || self.is_down() {
                return;
            }
            let Some(next) = self.behind.front() else {
                return;
            };
            if !is_one_sided(next) && !self.dma_requests.is_empty() {
                return;
            }
            let Some(m) = self.behind.pop_front() else {
                return;
            };
            if let Err(m) = self.take(m) {
                self.behind.push_front(m);
                return;
            }
        }
    }

    /// Polls the transfers in flight: whether the oldest ended (its
    /// answer is in `ready`).
    fn finish_transfer(&mut self) -> bool {
        let Some(dma) = self.dma.as_mut().filter(|_| !self.dma_requests.is_empty()) else {
            return false;
        };
        let Some((slot, end)) = dma.poll() else {
            return false;
        };
        let Some(m) = self.dma_requests.pop_front() else {
            return false;
        };
        let outcome = match end {
            Ok(()) if m.kind() == ReqType::Read => {
                let len = match m.header().request.params() {
                    Params::Read(p) => p.length as usize,
                    _ => 0,
                };
                Outcome::Read(dma.read_result(slot, len))
            }
            Ok(()) => Outcome::Written,
            Err(failure) => {
                self.shared.mark_down(format!("kernel memory: {failure}"));
                self.shared.stats.failed_requests.fetch_add(1, Relaxed);
                Outcome::Failed(Status::PeerFailed)
            }
        };
        if outcome != Outcome::Failed(Status::PeerFailed) {
            let s = &self.shared.stats;
            let counter = if m.kind() == ReqType::Read {
                &s.dma_reads
            } else {
                &s.dma_writes
            };
            counter.fetch_add(1, Relaxed);
        }
        self.ready
            .extend(super::handle(DeviceKind::Kernel, &mut { outcome }, m));
        true
    }

    /// Takes a one-sided request (WRTE, READ): refused outside the memory,
    /// answered at once when empty (after the transfers in flight), else
    /// its DMA transfer starts. Gives `m` back while it cannot be taken
    /// yet: no free slot, answers before it to come, no room for its answer.
    fn one_sided(&mut self, m: Message) -> Result<(), Message> {
        if self.held.is_some() || self.ready.len() + self.dma_requests.len() >= self.ready_capacity
        {
            return Err(m);
        }
        let h = m.header();
        let (addr, len, data) = match *h.request.params() {
            Params::Memory(p) => (p.addr, m.payload().len(), true),
            Params::Read(p) => (p.src_addr, p.length as usize, false),
            _ => return Err(m),
        };
        let inside = addr
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.memory_size);
        let dma = match self.dma.as_mut() {
            Some(dma) if inside && len > 0 => dma,
            // Answered in order: after the transfers in flight.
            _ if !self.dma_requests.is_empty() => return Err(m),
            _ => {
                let outcome = if !inside {
                    self.shared.stats.out_of_range.fetch_add(1, Relaxed);
                    Outcome::Failed(Status::OutOfRange)
                } else if data {
                    Outcome::Written
                } else {
                    Outcome::Read(Bytes::new())
                };
                self.ready
                    .extend(super::handle(DeviceKind::Kernel, &mut { outcome }, m));
                return Ok(());
            }
        };
        let Some(mode) = dma.start(addr, len, data.then(|| m.payload().as_ref())) else {
            return Err(m);
        };
        let s = &self.shared.stats;
        s.dma_modes[dma::mode_index(mode)].fetch_add(1, Relaxed);
        s.dma_bytes.fetch_add(len as u64, Relaxed);
        self.dma_requests.push_back(m);
        Ok(())
    }

    /// The message an answer frame on `via` makes: `Some(None)` for a
    /// frame that answers nothing (`Done`), `None` for garbage.
    fn answer(&mut self, via: Via) -> Option<Option<Message>> {
        self.refresh_chain();
        let (frame, payload) = Frame::decode(self.end.frame(via)).ok()?;
        if matches!(
            frame.kind,
            FrameKind::Request | FrameKind::Open | FrameKind::Close
        ) {
            return None;
        }
        // Requests before the one answered will get no more answers.
        while let Some(w) = self.in_flight.front() {
            if (frame.request.wrapping_sub(w.request) as i32) > 0 {
                self.in_flight.pop_front();
            } else {
                break;
            }
        }
        let w = *self
            .in_flight
            .front()
            .filter(|w| w.request == frame.request)?;
        if frame.kind.ends_request() {
            self.in_flight.pop_front();
        }
        let counter = match via {
            Via::Pio => &self.shared.stats.pio_answers,
            Via::Connect => &self.shared.stats.connect_answers,
        };
        counter.fetch_add(1, Relaxed);
        Some(match frame.kind {
            FrameKind::Answer | FrameKind::Last if self.shared.chained => forward(
                self.chain,
                &mut self.origins,
                &self.shared,
                w.header,
                payload,
            ),
            FrameKind::Answer | FrameKind::Last => {
                let header = reply_header(&w.header)?;
                Some(Message::new(header, Bytes::copy_from_slice(payload)).ok()?)
            }
            FrameKind::Error => {
                self.shared.stats.kernel_errors.fetch_add(1, Relaxed);
                error_to(&w.header, Status::BadRequest)
            }
            FrameKind::Done | FrameKind::Request | FrameKind::Open | FrameKind::Close => None,
        })
    }
}

impl PortIo for KernelPort {
    fn peek(&mut self) -> Option<&Message> {
        if self.ready.is_empty() {
            self.receive();
        }
        self.ready.front()
    }

    fn pop(&mut self) -> Option<Message> {
        if self.ready.is_empty() {
            self.receive();
        }
        self.ready.pop_front()
    }

    fn available(&mut self) -> usize {
        self.receive();
        self.ready.len()
    }

    /// Returns the kernel's tokens (and makes room for its answers).
    fn release(&mut self) {
        if !self.is_down() {
            let _ = self.end.connect.poll();
            self.shared.unpark_kernel();
        }
    }

    fn poll_available(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        self.receive();
        if !self.ready.is_empty() {
            return Poll::Ready(true);
        }
        if !self.dma_requests.is_empty() {
            // Nothing wakes the engine when a DMA completes: poll again
            // soon (a transfer takes microseconds).
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.shared.host_waker.register(cx.waker());
        self.receive();
        if self.ready.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(true)
        }
    }

    fn free(&mut self) -> usize {
        if self.is_down() {
            self.fail_over();
            return self.ready_capacity.saturating_sub(self.ready.len());
        }
        self.retry_held();
        self.drive_dma();
        if self.dma_busy() {
            return BEHIND_DMA - self.behind.len();
        }
        if self.held.is_some() {
            return 0;
        }
        self.max_in_flight
            .saturating_sub(self.in_flight.len())
            .max(1)
    }

    fn push(&mut self, m: Message) -> Result<(), Message> {
        if self.came_back(&m) {
            return self.returned(m);
        }
        if self.is_down() {
            self.fail_over();
            if self.ready.len() >= self.ready_capacity {
                return Err(m);
            }
            if let Some(a) = m.error_answer(Status::PeerFailed) {
                self.shared.stats.failed_requests.fetch_add(1, Relaxed);
                self.ready.push_back(a);
            }
            return Ok(());
        }
        if self.dma_busy() {
            // Later requests wait behind the transfer in flight, in order.
            if self.behind.len() >= BEHIND_DMA {
                return Err(m);
            }
            self.behind.push_back(m);
            self.drive_dma();
            return Ok(());
        }
        let taken = self.take(m);
        self.drive_dma();
        taken
    }

    /// Rings the kernel thread, once per burst.
    fn flush(&mut self) {
        self.retry_held();
        self.shared.unpark_kernel();
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PortClosed>> {
        if self.free() > 0 {
            return Poll::Ready(Ok(()));
        }
        if !self.dma_requests.is_empty() {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.shared.host_waker.register(cx.waker());
        self.shared.unpark_kernel();
        if self.free() > 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    /// The port stays while the daemon runs: a device that failed answers
    /// `PeerFailed`.
    fn is_closed(&mut self) -> bool {
        false
    }
}

impl KernelPort {
    /// Takes a change of the chain's connection: gone, callers waiting on
    /// the next device are answered `PeerFailed` (its answers cannot
    /// come back any more).
    fn refresh_chain(&mut self) {
        if !self.shared.chained {
            return;
        }
        let epoch = self.shared.chain_epoch.load(Relaxed);
        if epoch == self.chain_epoch {
            return;
        }
        self.chain_epoch = epoch;
        // Every change is a transition, and any since the last look means
        // the connection went down in between (maybe up again since):
        // what went on before cannot come back.
        for h in self.origins.drain(..) {
            self.shared.stats.chain_failed.fetch_add(1, Relaxed);
            self.ready.extend(error_to(&h, Status::PeerFailed));
        }
        self.chain = self.shared.chain.lock().map(|c| *c).unwrap_or(None);
    }

    /// Whether `m` came back over the chain's connection from the next
    /// device.
    fn came_back(&mut self, m: &Message) -> bool {
        if !self.shared.chained {
            return false;
        }
        self.refresh_chain();
        let Some(key) = self.chain else {
            return false;
        };
        let h = m.header();
        h.src == key.dst
            && h.dst == key.src
            && h.request.ports() == Some((key.dst_port, key.src_port))
    }

    /// The next device's answer, returned to the caller whose request it
    /// answers (the oldest waiting): its data, or its error's status.
    /// Anything else on the chain's connection is counted and dropped.
    fn returned(&mut self, m: Message) -> Result<(), Message> {
        let h = *m.header();
        let error = h.flags.contains(MsgFlags::ERROR);
        let data = !error && matches!(h.request.kind(), ReqType::Send | ReqType::Push);
        if !data && !error {
            self.shared.stats.garbage.fetch_add(1, Relaxed);
            return Ok(());
        }
        if self.ready.len() >= self.ready_capacity {
            return Err(m);
        }
        let Some(origin) = self.origins.pop_front() else {
            self.shared.stats.garbage.fetch_add(1, Relaxed);
            return Ok(());
        };
        let answer = if error {
            error_to(&origin, h.status())
        } else {
            reply_header(&origin).and_then(|rh| Message::new(rh, m.payload().clone()).ok())
        };
        self.shared.stats.returned.fetch_add(1, Relaxed);
        self.ready.extend(answer);
        Ok(())
    }

    /// Takes `m` with no transfer in flight: a one-sided request starts
    /// one, a message goes to the kernel (or is held back), the rest is
    /// answered as a device without memory answers it.
    fn take(&mut self, m: Message) -> Result<(), Message> {
        let kind = m.header().request.kind();
        let data = matches!(kind, ReqType::Send | ReqType::Push)
            && !m.header().flags.contains(MsgFlags::ERROR)
            && matches!(m.header().request.params(), Params::Port(_));
        if is_one_sided(&m) {
            return self.one_sided(m);
        }
        if !data {
            // Connection control and the rest: as any device with no
            // memory answers them.
            if kind == ReqType::Close {
                self.forget_conn(m.header());
            }
            if kind == ReqType::Notify {
                self.forget_noticed(&m);
            }
            if self.ready.len() >= self.ready_capacity {
                return Err(m);
            }
            let mut none = super::Memory::new(0);
            self.ready
                .extend(super::handle(DeviceKind::Kernel, &mut none, m));
            return Ok(());
        }
        if self.held.is_some() {
            return Err(m);
        }
        if let Err(m) = self.try_send(m) {
            self.held = Some(m);
        }
        self.publish_waiting();
        Ok(())
    }
}

/// A chained device's answer to `origin`, sent on to the next device over
/// the chain's connection (`chain`), `origin` joining those waiting; while
/// the chain is down (or too many wait), refused to the caller.
fn forward(
    chain: Option<ConnKey>,
    origins: &mut VecDeque<Header>,
    shared: &KernelShared,
    origin: Header,
    payload: &[u8],
) -> Option<Message> {
    let refuse = |status| {
        shared.stats.chain_failed.fetch_add(1, Relaxed);
        error_to(&origin, status)
    };
    let Some(key) = chain else {
        return refuse(Status::NoRoute);
    };
    if origins.len() >= MAX_ORIGINS {
        return refuse(Status::Timeout);
    }
    let request = Request::new(
        ReqType::Send,
        Params::Port(PortParams {
            flag: 0,
            src_port: key.src_port,
            dst_port: key.dst_port,
        }),
    )
    .ok()?;
    let m = Message::new(
        Header::new(key.src, key.dst, request),
        Bytes::copy_from_slice(payload),
    )
    .ok()?;
    origins.push_back(origin);
    shared.stats.forwarded.fetch_add(1, Relaxed);
    Some(m)
}

/// Whether `m` is a one-sided request (WRTE, READ) the DMA path carries.
fn is_one_sided(m: &Message) -> bool {
    let h = m.header();
    matches!(
        (h.request.kind(), h.request.params()),
        (ReqType::Write, Params::Memory(_)) | (ReqType::Read, Params::Read(_))
    ) && !h.flags.contains(MsgFlags::ERROR)
}

/// How a one-sided request ended, as the memory [`super::handle`] answers
/// from: the bytes already moved (or refused) by the DMA path.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Written,
    Read(Bytes),
    Failed(Status),
}

impl super::MemoryStore for Outcome {
    fn store(&mut self, _addr: u64, _data: &[u8]) -> Result<(), Status> {
        match self {
            Outcome::Written => Ok(()),
            Outcome::Failed(s) => Err(*s),
            Outcome::Read(_) => Err(Status::BadRequest),
        }
    }

    fn load(&mut self, _addr: u64, _len: usize) -> Result<Bytes, Status> {
        match self {
            Outcome::Read(b) => Ok(std::mem::take(b)),
            Outcome::Failed(s) => Err(*s),
            Outcome::Written => Err(Status::BadRequest),
        }
    }
}

/// One answer a kernel emitted: its connection, and the range of its
/// bytes in [`Answers::bytes`] or its error code.
type Emitted = (u16, Result<(usize, usize), u8>);

/// What a kernel emitted for one request: answers in one buffer.
#[derive(Default)]
struct Answers {
    bytes: Vec<u8>,
    items: Vec<Emitted>,
}

impl Emit for Answers {
    fn answer(&mut self, conn: u16, payload: &[u8]) {
        if payload.len() > Message::MAX_PAYLOAD {
            let error = KernelError::AnswerTooLarge { len: payload.len() };
            self.items.push((conn, Err(error.code())));
            return;
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(payload);
        self.items.push((conn, Ok((start, self.bytes.len()))));
    }

    fn error(&mut self, conn: u16, error: KernelError) {
        self.items.push((conn, Err(error.code())));
    }
}

/// The kernel thread's end: takes requests in order, runs the kernel,
/// sends its answers.
struct KernelEnd {
    shared: Arc<KernelShared>,
    function: KernelFunction,
    kernel: Option<Box<dyn Kernel>>,
    memory: KernelMemory,
    end: End,
    answers: Answers,
    /// Next answer of `answers` to send, and the request they answer.
    sending: usize,
    request: u32,
}

impl KernelEnd {
    fn new(
        shared: Arc<KernelShared>,
        end: End,
        memory: KernelMemory,
        kernel: Option<Box<dyn Kernel>>,
    ) -> KernelEnd {
        let function = shared.config.function;
        KernelEnd {
            kernel: kernel.or_else(|| uniplane_kernel::by_name(function.name())),
            memory,
            function,
            shared,
            end,
            answers: Answers::default(),
            sending: 0,
            request: 0,
        }
    }

    fn run(mut self) {
        let mut idle = 0u32;
        while !self.shared.shutdown.load(Relaxed) {
            if self.function == KernelFunction::Stall {
                std::thread::park();
                continue;
            }
            if self.step() {
                idle = 0;
                self.shared.host_waker.wake();
                continue;
            }
            idle = idle.saturating_add(1);
            match self.shared.config.wait {
                KernelWait::Busy => std::hint::spin_loop(),
                KernelWait::Park if idle < 2000 => std::hint::spin_loop(),
                // The host rings after each burst; the timeout only bounds
                // a lost ring.
                KernelWait::Park => std::thread::park_timeout(Duration::from_millis(1)),
            }
        }
    }

    /// Sends pending answers, else takes and runs the next request:
    /// whether anything moved.
    fn step(&mut self) -> bool {
        if self.sending < self.answers.items.len() || self.sending == usize::MAX {
            return self.send_answers();
        }
        let via = match self.end.next() {
            Next::Frame(via) => via,
            // The host's own frames: never garbage unless memory broke.
            Next::Garbage => return true,
            Next::Empty => return false,
            Next::Broken(reason) => {
                self.shared.mark_down(reason);
                return false;
            }
        };
        let bytes = self.end.frame(via);
        let Ok((frame, payload)) = Frame::decode(bytes) else {
            self.end.consumed(via);
            return true;
        };
        match frame.kind {
            FrameKind::Request => {}
            FrameKind::Open => {
                if let (Some(k), Some(caller)) = (self.kernel.as_mut(), Caller::decode(payload)) {
                    k.on_open(frame.conn, caller);
                }
                self.end.consumed(via);
                return true;
            }
            FrameKind::Close => {
                if let Some(k) = self.kernel.as_mut() {
                    k.on_close(frame.conn);
                }
                self.end.consumed(via);
                return true;
            }
            // Answers come from this end, never to it.
            _ => {
                self.end.consumed(via);
                return true;
            }
        }
        self.answers.bytes.clear();
        self.answers.items.clear();
        self.request = frame.request;
        match self.function {
            KernelFunction::Panic => panic!("kernel function `panic` panicked, as configured"),
            KernelFunction::Garbage => {
                self.end.consumed(via);
                // Too short to be a frame, then a header of no kind.
                let _ = self.end.send_raw(&[0xee; 5]);
                let _ = self.end.send_raw(&[0x7f; FRAME_HEADER_BYTES]);
                return true;
            }
            _ => {}
        }
        if let Some(k) = self.kernel.as_mut() {
            k.on_request(frame.conn, payload, &self.memory, &mut self.answers);
        }
        self.end.consumed(via);
        // Give the tokens back at once: the request is taken.
        let _ = self.end.connect.poll();
        self.sending = if self.answers.items.is_empty() {
            usize::MAX
        } else {
            0
        };
        self.send_answers();
        true
    }

    /// Sends the answers not yet sent (a `Done` when there are none):
    /// whether one went.
    fn send_answers(&mut self) -> bool {
        let mut moved = false;
        if self.sending == usize::MAX {
            let done = Frame {
                kind: FrameKind::Done,
                code: 0,
                conn: 0,
                request: self.request,
                seq: 0,
            };
            return match self.end.send(done, &[]) {
                Ok(Some(_)) => {
                    self.sending = 0;
                    self.answers.items.clear();
                    true
                }
                _ => false,
            };
        }
        while self.sending < self.answers.items.len() {
            let last = self.sending + 1 == self.answers.items.len();
            let (conn, item) = self.answers.items[self.sending];
            let (kind, code, range) = match item {
                Ok(r) if last => (FrameKind::Last, 0, r),
                Ok(r) => (FrameKind::Answer, 0, r),
                Err(code) => (FrameKind::Error, code, (0, 0)),
            };
            let frame = Frame {
                kind,
                code,
                conn,
                request: self.request,
                seq: 0,
            };
            let payload = &self.answers.bytes[range.0..range.1];
            match self.end.send(frame, payload) {
                Ok(Some(_)) => {
                    self.sending += 1;
                    moved = true;
                }
                Ok(None) => break,
                Err(reason) => {
                    self.shared.mark_down(reason);
                    break;
                }
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(function: KernelFunction) -> KernelDeviceConfig {
        KernelDeviceConfig {
            function,
            pio_threshold: 256,
            tokens: 4,
            stall_timeout_ms: 1000,
            wait: KernelWait::Park,
            memory: 0,
            dma: crate::config::DmaThresholds::default(),
        }
    }

    #[test]
    fn a_watch_fails_a_device_only_after_the_timeout_of_silence_with_requests_waiting() {
        let ms = Duration::from_millis;
        let mut w = Watch::new(ms(100));
        assert_eq!(w.observe(ms(0), 0, false, true), None);
        assert_eq!(w.observe(ms(500), 0, false, true), None, "idle is fine");
        assert_eq!(w.observe(ms(510), 0, true, true), None, "waiting starts");
        assert_eq!(w.observe(ms(600), 0, true, true), None);
        assert_eq!(w.observe(ms(605), 1, true, true), None, "an answer came");
        assert_eq!(w.observe(ms(700), 1, true, true), None);
        assert!(w.observe(ms(705), 1, true, true).is_some(), "100 ms silent");
    }

    #[test]
    fn a_watch_fails_a_device_whose_thread_died_at_once() {
        let mut w = Watch::new(Duration::from_secs(60));
        let reason = w.observe(Duration::ZERO, 0, false, false).unwrap();
        assert!(reason.contains("died"), "{reason}");
    }

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    fn request(len: usize, seq: u32) -> Message {
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + seq as usize) as u8).collect();
        let mut m = Message::send(
            uid("1.1.1.1:5").port(9),
            uid("1.1.1.1:3").port(7),
            Bytes::from(payload),
        )
        .unwrap();
        m.set_seqnum(seq);
        m
    }

    /// Pops answers until `n` came, waiting on the kernel thread with a bound.
    fn answers(port: &mut KernelPort, n: usize) -> Vec<Message> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} answers",
                got.len()
            );
            match port.pop() {
                Some(m) => got.push(m),
                None => {
                    port.release();
                    std::thread::yield_now();
                }
            }
        }
        got
    }

    #[test]
    fn an_echo_kernel_answers_in_order_whatever_path_each_message_took() {
        let (mut port, shared) = open("t", config(KernelFunction::Echo)).unwrap();
        let sizes = [4usize, 5000, 8, 300, 256, 257, 0, 65_535];
        let mut sent = Vec::new();
        let mut got = Vec::new();
        for (i, len) in sizes.into_iter().enumerate() {
            let m = request(len, i as u32);
            sent.push(m.payload().clone());
            assert!(port.free() > 0);
            port.push(m).unwrap();
            port.flush();
            got.extend(answers(&mut port, 1));
        }
        for (i, (a, want)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(a.header().seqnum, i as u32);
            assert_eq!(a.payload(), want, "answer {i}");
            assert_eq!(a.header().dst, uid("1.1.1.1:5"));
            assert_eq!(a.header().request.ports(), Some((7, 9)));
        }
        let s = &shared.stats;
        assert_eq!(s.pio_requests.load(Relaxed), 4, "4, 8, 256 and 0 bytes");
        assert_eq!(s.connect_requests.load(Relaxed), 4, "above 256 bytes");
        assert_eq!(s.garbage.load(Relaxed), 0);
    }

    #[test]
    fn pipelined_messages_come_back_in_order_and_a_full_path_holds_back() {
        for tokens in [1, 4] {
            pipelined(KernelDeviceConfig {
                tokens,
                ..config(KernelFunction::Echo)
            });
        }
    }

    /// 200 messages, two of every three large, as many in flight as the
    /// path takes.
    fn pipelined(config: KernelDeviceConfig) {
        let (mut port, _shared) = open("t", config).unwrap();
        let mut next = 0u32;
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.len() < 200 {
            assert!(Instant::now() < deadline, "{} answers", got.len());
            while next < 200 && port.free() > 0 {
                let len = if next.is_multiple_of(3) { 16 } else { 9000 };
                match port.push(request(len, next)) {
                    Ok(()) => next += 1,
                    Err(_) => break,
                }
            }
            port.flush();
            while let Some(m) = port.pop() {
                got.push(m);
            }
            port.release();
        }
        let order: Vec<u32> = got.iter().map(|m| m.header().seqnum).collect();
        assert_eq!(order, (0..200).collect::<Vec<_>>());
    }

    #[test]
    fn the_last_message_held_back_goes_once_the_kernel_makes_room() {
        let (mut port, shared) = open("t", config(KernelFunction::Echo)).unwrap();
        // Fill the path without reading answers, until one is held back.
        let mut pushed = 0u32;
        while shared.stats.pio_requests.load(Relaxed) + shared.stats.connect_requests.load(Relaxed)
            == u64::from(pushed)
        {
            assert!(pushed < 1000, "nothing was ever held back");
            port.push(request(9000, pushed)).unwrap();
            pushed += 1;
        }
        port.flush();
        // The engine has nothing more for this port: it only reads answers.
        let got = answers(&mut port, pushed as usize);
        let order: Vec<u32> = got.iter().map(|m| m.header().seqnum).collect();
        assert_eq!(order, (0..pushed).collect::<Vec<_>>());
    }

    #[test]
    fn sum32_errors_are_answered_bad_request_to_the_caller() {
        let (mut port, shared) = open("t", config(KernelFunction::Sum32)).unwrap();
        port.push(request(7, 1)).unwrap();
        port.flush();
        let a = answers(&mut port, 1).remove(0);
        assert_eq!(a.header().status(), Status::BadRequest);
        assert_eq!(a.header().dst, uid("1.1.1.1:5"));
        assert_eq!(shared.stats.kernel_errors.load(Relaxed), 1);
    }

    #[test]
    fn an_answer_longer_than_a_message_becomes_an_error_not_a_cut_answer() {
        let mut a = Answers::default();
        a.answer(1, &vec![0; Message::MAX_PAYLOAD + 1]);
        a.answer(2, b"ok");
        assert_eq!(a.items[0], (1, Err(3)));
        assert_eq!(a.items[1], (2, Ok((0, 2))));
    }

    #[test]
    fn a_frame_from_before_the_one_expected_is_dropped_not_left_blocking_its_path() {
        let (mut port, _shared) = open("t", config(KernelFunction::Stall)).unwrap();
        // Expect answer 5: a frame numbered 3 on the mailbox is stale.
        port.end.expect = 5;
        let stale = Frame {
            kind: FrameKind::Done,
            code: 0,
            conn: 0,
            request: 0,
            seq: 3,
        };
        port.end.mailbox_head = stale.encode().to_vec();
        port.end.mailbox_has = true;
        assert!(matches!(port.end.next(), Next::Garbage));
        assert!(!port.end.mailbox_has, "the path is free again");
    }

    #[test]
    fn a_corrupt_connect_window_marks_the_device_down_instead_of_spinning() {
        let (mut port, shared) = open("t", config(KernelFunction::Stall)).unwrap();
        port.push(request(16, 1)).unwrap();
        // The kernel side scribbles over the control words of the host's
        // window (the kernel writes it): its tail runs past the data.
        let (memory, window) = &port.end.own_window;
        assert!(memory.write(window.control, &[0xff; 8]));
        assert_eq!(port.available(), 1, "the waiting request is failed");
        assert!(shared.down().unwrap().contains("FPGA Connect"));
        assert_eq!(port.pop().unwrap().header().status(), Status::PeerFailed);
    }

    #[test]
    fn garbage_from_the_kernel_is_counted_and_dropped() {
        let (mut port, shared) = open("t", config(KernelFunction::Garbage)).unwrap();
        port.push(request(8, 1)).unwrap();
        port.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while shared.stats.garbage.load(Relaxed) < 2 {
            assert!(Instant::now() < deadline, "garbage not seen");
            assert!(port.pop().is_none(), "garbage became an answer");
            std::thread::yield_now();
        }
        assert!(port.pop().is_none());
    }

    fn with_memory(memory: usize, dma: crate::config::DmaThresholds) -> KernelDeviceConfig {
        KernelDeviceConfig {
            memory,
            dma,
            ..config(KernelFunction::SumMemory32)
        }
    }

    fn write(addr: u64, data: Vec<u8>) -> Message {
        Message::write(
            uid("1.1.1.1:5"),
            uid("1.1.1.1:3").at(addr),
            Bytes::from(data),
        )
        .unwrap()
    }

    fn read(addr: u64, len: u16) -> Message {
        Message::read(uid("1.1.1.1:5").at(0x40), uid("1.1.1.1:3").at(addr), len).unwrap()
    }

    #[test]
    fn one_sided_requests_move_bytes_by_dma_and_are_answered_as_a_memory_device_answers() {
        let dma = crate::config::DmaThresholds {
            pull_from: 100,
            staged_from: 1000,
            pipelined_from: 20_000,
        };
        let (mut port, shared) = open("t", with_memory(1 << 20, dma)).unwrap();
        let mut host = super::super::Memory::new(1 << 20);
        for (i, len) in [4usize, 100, 5000, 65_535].into_iter().enumerate() {
            let addr = (i * 100_003) as u64;
            let data: Vec<u8> = (0..len).map(|b| (b * 31 + i) as u8).collect();
            for m in [write(addr, data.clone()), read(addr, len as u16)] {
                let want = super::super::handle(DeviceKind::Memory, &mut host, m.clone());
                port.push(m).unwrap();
                let got = answers(&mut port, 1).remove(0);
                assert_eq!(Some(got), want, "{len} bytes");
            }
        }
        let modes: Vec<u64> = shared
            .stats
            .dma_modes
            .iter()
            .map(|c| c.load(Relaxed))
            .collect();
        // staged, staged-pipelined, push, pull: each transfer twice.
        assert_eq!(modes, [2, 2, 2, 2]);
        assert_eq!(shared.stats.dma_writes.load(Relaxed), 4);
        // The kernel computes over what was written: sum the 100 bytes at
        // 100,003 (25 words).
        port.push(request(0, 9)).unwrap();
        let mut sum = Message::send(
            uid("1.1.1.1:5").port(9),
            uid("1.1.1.1:3").port(7),
            Bytes::copy_from_slice(&uniplane_kernel::SumMemory32::request(100_003, 100)),
        )
        .unwrap();
        sum.set_seqnum(10);
        port.push(sum).unwrap();
        port.flush();
        let got = answers(&mut port, 2);
        let data: Vec<u8> = (0..100usize).map(|b| (b * 31 + 1) as u8).collect();
        let want = uniplane_kernel::Sum32::sum(&data).unwrap();
        assert_eq!(got[0].header().status(), Status::BadRequest);
        assert_eq!(got[1].payload().as_ref(), want.to_le_bytes());
    }

    #[test]
    fn a_write_past_the_end_is_refused_out_of_range_and_writes_nothing() {
        let (mut port, shared) = open(
            "t",
            with_memory(4096, crate::config::DmaThresholds::default()),
        )
        .unwrap();
        port.push(write(4000, vec![9; 200])).unwrap();
        let a = answers(&mut port, 1).remove(0);
        assert_eq!(a.header().status(), Status::OutOfRange);
        port.push(read(3896, 200)).unwrap();
        let back = answers(&mut port, 1).remove(0);
        assert_eq!(back.kind(), ReqType::ReadCmpl);
        assert!(back.payload().iter().all(|&b| b == 0), "nothing written");
        port.push(read(u64::MAX - 1, 4)).unwrap();
        assert_eq!(
            answers(&mut port, 1)[0].header().status(),
            Status::OutOfRange
        );
        assert_eq!(shared.stats.out_of_range.load(Relaxed), 2);
        assert_eq!(shared.stats.dma_modes[2].load(Relaxed), 1, "the read only");
    }

    #[test]
    fn requests_wait_in_order_behind_transfers_in_flight_and_then_the_engines_queues() {
        let config = KernelDeviceConfig {
            function: KernelFunction::Echo,
            ..with_memory(1 << 20, crate::config::DmaThresholds::default())
        };
        let (mut port, _shared) = open("t", config).unwrap();
        // Transfers that do not end until the test says so.
        port.dma.as_mut().unwrap().pause();
        let n = dma::SLOTS + BEHIND_DMA;
        for i in 0..n {
            if i == dma::SLOTS {
                port.push(request(8, 0)).unwrap();
            } else {
                port.push(write(64 * i as u64, vec![i as u8; 8])).unwrap();
            }
        }
        assert_eq!(port.free(), 0, "the port holds no more");
        assert_eq!(port.dma_requests.len(), dma::SLOTS, "every slot in flight");
        let back = port.push(request(8, 99)).unwrap_err();
        assert_eq!(back.header().seqnum, 99, "given back, not dropped");
        assert!(
            port.pop().is_none(),
            "nothing passed the transfers in flight"
        );
        port.dma.as_mut().unwrap().resume();
        port.flush();
        let got = answers(&mut port, n);
        let kinds: Vec<ReqType> = got.iter().map(Message::kind).collect();
        let echo = kinds.iter().position(|k| *k == ReqType::Send).unwrap();
        assert!(
            echo >= dma::SLOTS,
            "the message went after the writes before it"
        );
        let written: Vec<u64> = got
            .iter()
            .filter(|m| m.kind() == ReqType::WriteCmpl)
            .map(|m| match m.header().request.params() {
                Params::Memory(p) => p.addr,
                _ => u64::MAX,
            })
            .collect();
        let want: Vec<u64> = (0..n as u64)
            .filter(|&i| i != dma::SLOTS as u64)
            .map(|i| 64 * i)
            .collect();
        assert_eq!(written, want, "the writes, in order");
        assert!(port.free() > 0);
    }

    #[test]
    fn a_dma_error_completion_answers_peer_failed_and_marks_the_device_down() {
        let (mut port, shared) = open(
            "t",
            with_memory(4096, crate::config::DmaThresholds::default()),
        )
        .unwrap();
        // Let a request past the host end's check: the engine refuses it.
        port.memory_size = 1 << 20;
        port.push(write(8192, vec![3; 64])).unwrap();
        let a = answers(&mut port, 1).remove(0);
        assert_eq!(a.header().status(), Status::PeerFailed);
        assert!(
            shared.down().unwrap().contains("OutOfRange"),
            "{:?}",
            shared.down()
        );
        port.push(request(8, 2)).unwrap();
        assert_eq!(
            answers(&mut port, 1)[0].header().status(),
            Status::PeerFailed
        );
    }

    #[test]
    fn a_kernel_without_memory_answers_one_sided_requests_out_of_range() {
        let (mut port, _shared) = open("t", config(KernelFunction::Echo)).unwrap();
        port.push(write(0, vec![1; 4])).unwrap();
        assert_eq!(
            answers(&mut port, 1)[0].header().status(),
            Status::OutOfRange
        );
    }

    #[test]
    fn a_device_marked_down_answers_waiting_and_later_requests_peer_failed() {
        let (mut port, shared) = open("t", config(KernelFunction::Stall)).unwrap();
        let mut pushed = 0;
        while port.free() > 0 && pushed < 100 {
            port.push(request(16, pushed)).unwrap();
            pushed += 1;
        }
        assert!(pushed < 100, "a stalled kernel pushes back");
        assert!(shared.stats.waiting.load(Relaxed));
        shared.mark_down("test".into());
        port.push(request(16, 1000)).unwrap();
        let failed = answers(&mut port, pushed as usize + 1);
        assert!(failed
            .iter()
            .all(|m| m.header().status() == Status::PeerFailed));
        assert_eq!(shared.down().as_deref(), Some("test"));
    }
}
