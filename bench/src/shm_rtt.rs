//! Round trips over the shared-memory device paths of `uniplane-shm`
//! (`rtt --stack shm --path pio|dma`), beside a Unix-socket ping-pong of
//! the same size in the same run (the kernel's way between two local
//! processes).
//!
//! - `pio`: the PIO mailbox (128-byte slots, a message in 120-byte
//!   fragments), both sides busy-polling with `--busy-poll`, else
//!   spinning 20 µs and then parking.
//! - `dma`: the DMA ring: the pinger writes its payload into device
//!   memory, posts a descriptor, rings the doorbell and spins on the
//!   notify word; the engine (its own thread) copies it into the other
//!   window; the answer comes back the same way. The engine always spins.
//!
//! The pinger runs on the calling thread, the other side on a thread of
//! its own; they are pinned to CPUs 0 and 1 (where the machine has them),
//! so each hop crosses cores as it would to a device. After the peer, the
//! same CPUs ping-pong one cache line each way ([`run_cache_line_rtt`]):
//! the floor under any shared-memory round trip on this machine.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uniplane_shm::device::{DeviceConfig, DeviceRegion, Direction};
use uniplane_shm::dma::{bus_addr, Bus, Completion, Descriptor, DmaDriver, DmaEngine, CTRL_NOTIFY};
use uniplane_shm::mailbox::{MailboxRegion, Side, WaitPolicy};

use crate::engine::{Observer, Progress, Sample};
use crate::gen::Stop;
use crate::hist::LatencyHistogram;
use crate::rtt::{RttConfig, RttRun};
use crate::BenchError;

/// Which device path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmPath {
    /// The PIO mailbox.
    Pio,
    /// The DMA ring.
    Dma,
}

impl ShmPath {
    /// By the name `--path` takes.
    pub fn by_name(name: &str) -> Result<ShmPath, BenchError> {
        match name {
            "pio" => Ok(ShmPath::Pio),
            "dma" => Ok(ShmPath::Dma),
            other => Err(BenchError::Config(format!("--path `{other}`: pio or dma"))),
        }
    }

    /// The largest payload of a round trip on this path.
    pub fn max_size(self) -> usize {
        match self {
            ShmPath::Pio => 1 << 16,
            ShmPath::Dma => DMA_WINDOW as usize,
        }
    }
}

/// What the peer is, in words.
pub const PEER: &str = "Unix-socket ping-pong (blocking write_all/read_exact on a socketpair), same size, same threads and CPUs";

/// Pins the calling thread to `cpu`, best effort (on a machine without it
/// the thread stays where it may run: only noise is added). Always tried,
/// never decided by `available_parallelism`: that counts the calling
/// thread's affinity, so once the pinger had pinned itself to CPU 0 every
/// thread it started saw one CPU, skipped its own pin and shared CPU 0
/// with the pinger — the Unix-socket peer and the DMA engine ran on one
/// core beside a pinger on the same core.
fn pin(cpu: usize) {
    let _ = uniplane_shm::sys::pin_to_cpu(cpu);
}

/// Times `ping` (one round trip, `false` on failure) through warm-up and
/// the measured part, with a sample each second and progress a few times a
/// second.
fn measure(
    cfg: &RttConfig,
    observer: &mut dyn Observer,
    mut ping: impl FnMut() -> bool,
) -> Result<RttRun, BenchError> {
    let warm_until = Instant::now() + cfg.warmup;
    while Instant::now() < warm_until {
        if !ping() {
            return Err(BenchError::SideGone("answering"));
        }
    }
    let (planned_s, planned_count) = cfg.stop.plan();
    let mut rtt = LatencyHistogram::new();
    let mut samples = Vec::new();
    let start = Instant::now();
    let (mut n, mut interval_n, mut interval_sum) = (0u64, 0u64, 0u64);
    let mut interval_start = start;
    let mut last_progress = start;
    let mut failed = false;
    loop {
        let done = match cfg.stop {
            Stop::Count(c) => n >= c,
            Stop::Seconds(s) => start.elapsed().as_secs_f64() >= s,
        };
        let now = Instant::now();
        let secs = (now - interval_start).as_secs_f64();
        if (done && interval_n > 0) || secs >= 1.0 {
            let rate = interval_n as f64 / secs.max(1e-9);
            let mbps = rate * cfg.size as f64 * 8.0 / 1e6;
            let s = Sample {
                t_s: (now - start).as_secs_f64(),
                secs,
                tx_pps: rate,
                rx_pps: rate,
                mbps_l2: mbps,
                mbps_l1: mbps,
                drops: 0,
                errors: 0,
                mean_latency_ns: interval_sum as f64 / interval_n.max(1) as f64,
            };
            observer.sample(&s);
            samples.push(s);
            (interval_n, interval_sum, interval_start) = (0, 0, now);
        }
        if done || failed {
            break;
        }
        if (now - last_progress) >= Duration::from_millis(100) {
            observer.progress(&Progress {
                elapsed_s: (now - start).as_secs_f64(),
                planned_s,
                sent: n,
                planned_count,
                warming_up: false,
            });
            last_progress = now;
        }
        // Time 64 round trips between checks of the clock above.
        for _ in 0..64 {
            let t0 = Instant::now();
            if !ping() {
                failed = true;
                break;
            }
            let ns = t0.elapsed().as_nanos() as u64;
            rtt.record(ns);
            n += 1;
            interval_n += 1;
            interval_sum += ns;
            if matches!(cfg.stop, Stop::Count(c) if n >= c) {
                break;
            }
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if failed {
        return Err(BenchError::SideGone("answering"));
    }
    Ok(RttRun {
        sent: n,
        received: n,
        lost: 0,
        errors: 0,
        seconds,
        rtt,
        samples,
    })
}

/// Round trips over `path`: `cfg.size` bytes each way.
pub fn run_shm_rtt(
    path: ShmPath,
    cfg: &RttConfig,
    observer: &mut dyn Observer,
) -> Result<RttRun, BenchError> {
    check(path, cfg)?;
    match path {
        ShmPath::Pio => pio(cfg, observer),
        ShmPath::Dma => dma(cfg, observer),
    }
}

fn check(path: ShmPath, cfg: &RttConfig) -> Result<(), BenchError> {
    if cfg.size == 0 || cfg.size > path.max_size() {
        return Err(BenchError::Config(format!(
            "--size {}: from 1 to {} bytes on --path {}",
            cfg.size,
            path.max_size(),
            if path == ShmPath::Pio { "pio" } else { "dma" }
        )));
    }
    if cfg.inflight != 1 {
        return Err(BenchError::Config(
            "--path pio|dma measures one round trip at a time (--inflight 1)".into(),
        ));
    }
    Ok(())
}

fn mailbox_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Config(format!("the PIO mailbox: {e}"))
}

fn pio(cfg: &RttConfig, observer: &mut dyn Observer) -> Result<RttRun, BenchError> {
    let policy = if cfg.busy_poll {
        WaitPolicy::BusyPoll
    } else {
        WaitPolicy::SpinThenPark {
            spin: Duration::from_micros(20),
        }
    };
    let region = MailboxRegion::create(1, 128).map_err(mailbox_err)?;
    let (mut tx, mut rx) = region
        .endpoint(0, Side::A, policy)
        .ok_or_else(|| mailbox_err("no endpoint A"))?;
    let (mut btx, mut brx) = region
        .endpoint(0, Side::B, policy)
        .ok_or_else(|| mailbox_err("no endpoint B"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let pong = {
        let stop = stop.clone();
        let size = cfg.size;
        std::thread::Builder::new()
            .name("pio-echo".into())
            .spawn(move || {
                pin(1);
                let mut b = Vec::with_capacity(size);
                while !stop.load(Ordering::Relaxed) {
                    let deadline = Some(Instant::now() + Duration::from_millis(50));
                    if brx.recv_deadline(&mut b, deadline).is_err() {
                        continue;
                    }
                    if btx.send(&b).is_err() {
                        break;
                    }
                }
            })
            .map_err(|source| BenchError::Thread {
                what: "echo",
                source,
            })?
    };
    pin(0);
    let msg = vec![7u8; cfg.size];
    let mut buf = Vec::with_capacity(cfg.size);
    let size = cfg.size;
    let r = measure(cfg, observer, || {
        tx.send(&msg).is_ok() && rx.recv(&mut buf).is_ok() && buf.len() == size
    });
    stop.store(true, Ordering::Relaxed);
    pong.join().map_err(|_| BenchError::Panicked("echo"))?;
    r
}

/// Bytes of each window in device memory (and the largest payload).
const DMA_WINDOW: u64 = 1 << 20;

fn dma(cfg: &RttConfig, observer: &mut dyn Observer) -> Result<RttRun, BenchError> {
    const MB: u64 = DMA_WINDOW;
    let dev = DeviceRegion::create(&DeviceConfig {
        name: "rtt".into(),
        memory_bytes: 8 << 20,
        ring_depth: 128,
    })
    .map_err(|e| BenchError::Config(format!("the DMA device: {e}")))?;
    let mut bus = Bus::new();
    bus.map_device(1, &dev);
    let mut engine = DmaEngine::new(dev.clone(), bus).with_spin(Duration::from_secs(3600));
    // Source and destination of each way, and their notify words.
    let (a_buf, b_win, b_buf, a_win, b_note, a_note) =
        (0, MB, 2 * MB, 3 * MB, 4 * MB, 4 * MB + 4096);
    let len = cfg.size.next_multiple_of(4);
    let handle = std::thread::Builder::new()
        .name("dma-engine".into())
        .spawn(move || {
            pin(1);
            engine.run();
        })
        .map_err(|source| BenchError::Thread {
            what: "DMA engine",
            source,
        })?;
    pin(0);
    let mut drv = DmaDriver::new(dev.clone());
    let msg = vec![3u8; len];
    let mut inbox = vec![0u8; len];
    let mut reply = vec![0u8; len];
    let mut done: Vec<Completion> = Vec::with_capacity(256);
    let (base, _) = dev.memory_window();
    let note_a = dev.memory().atomic_u64(base + a_note as usize);
    let note_b = dev.memory().atomic_u64(base + b_note as usize);
    let (Some(note_a), Some(note_b)) = (note_a, note_b) else {
        uniplane_shm::dma::request_shutdown(&dev);
        let _ = handle.join();
        return Err(BenchError::Config(
            "the DMA notify words are out of device memory".into(),
        ));
    };
    // One hop: `data` into device memory at `src`, a descriptor to `dst`,
    // the doorbell, and a spin on the notify word (5 s at most).
    let mut hop = |dir: Direction,
                   (src, dst): (u64, u64),
                   word: &std::sync::atomic::AtomicU64,
                   n: u64,
                   data: &[u8],
                   out: &mut [u8]|
     -> bool {
        dev.write_memory(src as usize, data);
        while drv.free_slots(dir) == 0 {
            done.clear();
            drv.poll_completions(&mut done);
        }
        let Some(id) = drv.try_post(
            dir,
            Descriptor {
                src: bus_addr(1, src),
                dst: bus_addr(1, dst),
                notify: bus_addr(1, n),
                len_words: (data.len() / 4) as u32,
                ctrl: CTRL_NOTIFY,
                ..Descriptor::default()
            },
        ) else {
            return false;
        };
        drv.ring_doorbell(dir);
        let t = Instant::now();
        while word.load(Ordering::Acquire) != u64::from(id) {
            std::hint::spin_loop();
            if t.elapsed() > Duration::from_secs(5) {
                return false;
            }
        }
        dev.read_memory(dst as usize, out);
        done.clear();
        drv.poll_completions(&mut done);
        true
    };
    let r = measure(cfg, observer, || {
        hop(
            Direction::Write,
            (a_buf, b_win),
            note_b,
            b_note,
            &msg,
            &mut inbox,
        ) && hop(
            Direction::Read,
            (b_buf, a_win),
            note_a,
            a_note,
            &inbox,
            &mut reply,
        ) && reply == msg
    });
    uniplane_shm::dma::request_shutdown(&dev);
    handle
        .join()
        .map_err(|_| BenchError::Panicked("DMA engine"))?;
    r
}

/// The peer: a Unix-socket ping-pong of `cfg.size` bytes, the echo side on
/// its own thread (CPU 1), the pinger here (CPU 0).
pub fn run_unix_rtt(cfg: &RttConfig, observer: &mut dyn Observer) -> Result<RttRun, BenchError> {
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| BenchError::Config(format!("socketpair: {e}")))?;
    let size = cfg.size.max(1);
    let pong = std::thread::Builder::new()
        .name("unix-echo".into())
        .spawn(move || {
            pin(1);
            let mut buf = vec![0u8; size];
            while b.read_exact(&mut buf).is_ok() {
                if b.write_all(&buf).is_err() {
                    break;
                }
            }
        })
        .map_err(|source| BenchError::Thread {
            what: "echo",
            source,
        })?;
    pin(0);
    let msg = vec![5u8; size];
    let mut buf = vec![0u8; size];
    let r = measure(cfg, observer, || {
        a.write_all(&msg).is_ok() && a.read_exact(&mut buf).is_ok()
    });
    drop(a);
    pong.join().map_err(|_| BenchError::Panicked("echo"))?;
    r
}

/// The floor under every shared-memory round trip here: one 64-bit word
/// each way, each on a cache line of its own (128-byte aligned, so the
/// pair prefetcher does not couple them), the echo on CPU 1, the pinger
/// here on CPU 0 as for the other paths. Its round trip is two transfers
/// of a line between the cores and nothing else: what the machine charges
/// before any mailbox, ring or protocol; it moves with where the vCPUs
/// sit on the host.
pub fn run_cache_line_rtt(
    cfg: &RttConfig,
    observer: &mut dyn Observer,
) -> Result<RttRun, BenchError> {
    use std::sync::atomic::AtomicU64;
    #[repr(align(128))]
    struct Line(AtomicU64);
    let ping = Arc::new((Line(AtomicU64::new(0)), Line(AtomicU64::new(0))));
    // Sequence u64::MAX: the echo stops.
    const STOP: u64 = u64::MAX;
    let pong = {
        let lines = ping.clone();
        std::thread::Builder::new()
            .name("line-echo".into())
            .spawn(move || {
                pin(1);
                let (ask, answer) = (&lines.0 .0, &lines.1 .0);
                let mut seen = 0;
                let mut idle = Instant::now();
                loop {
                    let n = ask.load(Ordering::Acquire);
                    if n == STOP {
                        break;
                    }
                    if n != seen {
                        seen = n;
                        answer.store(n, Ordering::Release);
                        idle = Instant::now();
                    } else if idle.elapsed() > Duration::from_secs(10) {
                        // The pinger is gone without a word: bounded.
                        break;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            })
            .map_err(|source| BenchError::Thread {
                what: "echo",
                source,
            })?
    };
    pin(0);
    let (ask, answer) = (&ping.0 .0, &ping.1 .0);
    let mut n = 0u64;
    let r = measure(cfg, observer, || {
        n += 1;
        ask.store(n, Ordering::Release);
        let t = Instant::now();
        loop {
            if answer.load(Ordering::Acquire) == n {
                return true;
            }
            std::hint::spin_loop();
            if t.elapsed() > Duration::from_secs(5) {
                return false;
            }
        }
    });
    ask.store(STOP, Ordering::Release);
    pong.join().map_err(|_| BenchError::Panicked("echo"))?;
    r
}
