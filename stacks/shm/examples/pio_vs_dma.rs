//! Round trips, in one run: the PIO mailbox (busy-poll and spin-then-park),
//! the DMA ring (descriptor + engine + notify word, both ways), a
//! `ShmLink`, a Unix-socket ping-pong and a tokio channel between threads;
//! p50/p95/p99/p99.9/max per size, and the PIO/DMA crossover.
//!
//! ```text
//! cargo run --release -p uniplane-shm --example pio_vs_dma
//! cargo run --release -p uniplane-shm --example pio_vs_dma -- --budget-ms 300 --quiet-samples 2000
//! ```
//!
//! Threads are pinned to CPUs 0 and 1. The DMA round trip runs its driver
//! (playing both ends in turn) on CPU 0 and the engine on CPU 1, so each
//! hop crosses cores twice (doorbell, notify), as it would to a device.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{Message, Uid};
use uniplane_shm::device::{DeviceConfig, DeviceRegion, Direction};
use uniplane_shm::dma::{bus_addr, Bus, Completion, Descriptor, DmaDriver, DmaEngine, CTRL_NOTIFY};
use uniplane_shm::mailbox::{MailboxRegion, Side, WaitPolicy};
use uniplane_shm::sys::pin_to_cpu;
use uniplane_shm::{ShmConfig, ShmLink};

const SIZES: [usize; 11] = [8, 64, 256, 512, 1024, 1536, 2048, 4096, 9600, 16384, 65536];

#[derive(Clone, Copy)]
struct Opts {
    budget: Duration,
    max_samples: usize,
    quiet_samples: usize,
}

fn opts() -> Opts {
    let mut o = Opts {
        budget: Duration::from_millis(150),
        max_samples: 50_000,
        quiet_samples: 500,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v: u64 = it.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            eprintln!("pio_vs_dma: {a} needs a number");
            std::process::exit(2)
        });
        match a.as_str() {
            "--budget-ms" => o.budget = Duration::from_millis(v),
            "--max-samples" => o.max_samples = v as usize,
            "--quiet-samples" => o.quiet_samples = v as usize,
            _ => {
                eprintln!("pio_vs_dma: unknown option {a}");
                std::process::exit(2)
            }
        }
    }
    o
}

struct Stats {
    n: usize,
    p: [f64; 5],
}

fn stats(mut v: Vec<u64>) -> Stats {
    v.sort_unstable();
    let q = |f: f64| v[((v.len() as f64 * f) as usize).min(v.len() - 1)] as f64 / 1000.0;
    Stats {
        n: v.len(),
        p: [
            q(0.5),
            q(0.95),
            q(0.99),
            q(0.999),
            *v.last().unwrap_or(&0) as f64 / 1000.0,
        ],
    }
}

fn print_row(name: &str, size: usize, s: &Stats) {
    println!(
        "{:<22} {:>6} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>10.2}",
        name, size, s.n, s.p[0], s.p[1], s.p[2], s.p[3], s.p[4]
    );
}

/// Runs `ping` (on CPU 0) against `pong` (on CPU 1) until the budget or the
/// sample limit is used up; returns round-trip times in ns.
fn two_threads<P, Q>(o: Opts, mut ping: P, pong: Q, stop: impl FnOnce()) -> Vec<u64>
where
    P: FnMut() -> bool,
    Q: FnOnce() + Send + 'static,
{
    let t = std::thread::spawn(move || {
        let _ = pin_to_cpu(1);
        pong();
    });
    let _ = pin_to_cpu(0);
    let mut v = Vec::with_capacity(o.max_samples);
    // Warm-up.
    for _ in 0..100 {
        ping();
    }
    let start = Instant::now();
    while v.len() < o.max_samples && start.elapsed() < o.budget {
        let t0 = Instant::now();
        if !ping() {
            break;
        }
        v.push(t0.elapsed().as_nanos() as u64);
    }
    // Dropping the ping side closes what it owns; `stop` does the rest.
    drop(ping);
    stop();
    t.join().ok();
    v
}

/// Sends a zero-length message that tells the pong side to stop.
fn pio(o: Opts, size: usize, policy: WaitPolicy) -> Vec<u64> {
    let region = MailboxRegion::create(1, 128).expect("mailbox");
    let (mut tx, mut rx) = region.endpoint(0, Side::A, policy).expect("endpoint");
    let (mut btx, mut brx) = region.endpoint(0, Side::B, policy).expect("endpoint");
    let msg = vec![7u8; size];
    let mut buf = Vec::with_capacity(size);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    two_threads(
        o,
        move || tx.send(&msg).is_ok() && rx.recv(&mut buf).is_ok() && buf.len() == size,
        move || {
            let mut b = Vec::with_capacity(size);
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                if brx
                    .recv_deadline(&mut b, Some(Instant::now() + Duration::from_millis(50)))
                    .is_err()
                {
                    continue;
                }
                if b.is_empty() {
                    break;
                }
                if btx.send(&b).is_err() {
                    break;
                }
            }
        },
        move || stop.store(true, std::sync::atomic::Ordering::Relaxed),
    )
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Spin-then-park with a quiet line: one ping per millisecond. The
/// responder spins `spin` and parks (its CPU is idle between pings); the
/// pinger, which expects its answer at once, spins up to 200 µs first.
/// Returns the round trips and the responder's CPU use (fraction of one
/// core).
fn pio_quiet(samples: usize, spin: Duration) -> (Vec<u64>, f64) {
    let region = MailboxRegion::create(1, 128).expect("mailbox");
    let pinger = WaitPolicy::SpinThenPark {
        spin: Duration::from_micros(200),
    };
    let (mut tx, mut rx) = region.endpoint(0, Side::A, pinger).expect("endpoint");
    let responder = WaitPolicy::SpinThenPark { spin };
    let (mut btx, mut brx) = region.endpoint(0, Side::B, responder).expect("endpoint");
    let t = std::thread::spawn(move || {
        let _ = pin_to_cpu(1);
        let wall = Instant::now();
        let cpu = thread_cpu();
        let mut b = Vec::new();
        loop {
            if brx.recv(&mut b).is_err() || b.is_empty() {
                break;
            }
            if btx.send(&b).is_err() {
                break;
            }
        }
        (thread_cpu() - cpu).as_secs_f64() / wall.elapsed().as_secs_f64()
    });
    let _ = pin_to_cpu(0);
    let msg = [1u8; 64];
    let mut buf = Vec::new();
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        std::thread::sleep(Duration::from_millis(1));
        let t0 = Instant::now();
        if tx.send(&msg).is_err() || rx.recv(&mut buf).is_err() {
            break;
        }
        v.push(t0.elapsed().as_nanos() as u64);
    }
    let _ = tx.send(&[]);
    let cpu = t.join().unwrap_or(f64::NAN);
    (v, cpu)
}

/// DMA round trip: A's bytes go by descriptor into B's window (notify word),
/// B answers by descriptor into A's window.
fn dma(o: Opts, size: usize) -> Vec<u64> {
    const MB: u64 = 1 << 20;
    let dev = DeviceRegion::create(&DeviceConfig {
        name: "rt".into(),
        memory_bytes: 8 << 20,
        ring_depth: 128,
    })
    .expect("device");
    let mut bus = Bus::new();
    bus.map_device(1, &dev);
    let engine = DmaEngine::new(dev.clone(), bus).with_spin(Duration::from_secs(3600));
    let (a_buf, b_win, b_buf, a_win, b_note, a_note) =
        (0, MB, 2 * MB, 3 * MB, 4 * MB, 4 * MB + 4096);
    let len = size.next_multiple_of(4);
    let handle = {
        let mut e = engine;
        std::thread::spawn(move || {
            let _ = pin_to_cpu(1);
            e.run();
        })
    };
    let _ = pin_to_cpu(0);
    let mut drv = DmaDriver::new(dev.clone());
    let msg = vec![3u8; len];
    let mut inbox = vec![0u8; len];
    let mut done: Vec<Completion> = Vec::with_capacity(256);
    let note = |off: u64| {
        let (base, _) = dev.memory_window();
        dev.memory()
            .atomic_u64(base + off as usize)
            .expect("notify word")
    };
    let mut hop = |drv: &mut DmaDriver,
                   dir: Direction,
                   src: u64,
                   dst: u64,
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
        let word = note(n);
        let t = Instant::now();
        while word.load(std::sync::atomic::Ordering::Acquire) != id as u64 {
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
    let mut v = Vec::with_capacity(o.max_samples);
    let mut reply = vec![0u8; len];
    for i in 0..(100 + o.max_samples) {
        if i == 100 {
            v.clear();
        }
        let t0 = Instant::now();
        let ok = hop(
            &mut drv,
            Direction::Write,
            a_buf,
            b_win,
            b_note,
            &msg,
            &mut inbox,
        ) && hop(
            &mut drv,
            Direction::Read,
            b_buf,
            a_win,
            a_note,
            &inbox,
            &mut reply,
        );
        if !ok {
            eprintln!("pio_vs_dma: DMA round trip timed out");
            break;
        }
        v.push(t0.elapsed().as_nanos() as u64);
        if i >= 100 && v.len() > 10 && v.iter().sum::<u64>() > o.budget.as_nanos() as u64 {
            break;
        }
    }
    uniplane_shm::dma::request_shutdown(&dev);
    handle.join().ok();
    v
}

fn unix_socket(o: Opts, size: usize) -> Vec<u64> {
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    let msg = vec![5u8; size];
    let mut buf = vec![0u8; size];
    two_threads(
        o,
        move || a.write_all(&msg).is_ok() && a.read_exact(&mut buf).is_ok(),
        move || {
            let mut b2 = vec![0u8; size];
            while b.read_exact(&mut b2).is_ok() {
                if b.write_all(&b2).is_err() {
                    break;
                }
            }
        },
        || {},
    )
}

fn tokio_channel(o: Opts, size: usize) -> Vec<u64> {
    let (to_b, mut b_rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let (to_a, mut a_rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let msg = Bytes::from(vec![9u8; size]);
    two_threads(
        o,
        move || {
            rt.block_on(async {
                to_b.send(msg.clone()).await.is_ok() && a_rx.recv().await.is_some()
            })
        },
        move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                while let Some(m) = b_rx.recv().await {
                    if to_a.send(m).await.is_err() {
                        break;
                    }
                }
            });
        },
        || {},
    )
}

fn shm_link(o: Opts, size: usize) -> Vec<u64> {
    let (sa, sb) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    let cfg = ShmConfig {
        spin: Duration::from_micros(20),
        ..ShmConfig::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let cfg2 = cfg.clone();
    let uid = Uid::new(std::net::Ipv4Addr::LOCALHOST, 1);
    let msg = Message::send(
        uid.port(1),
        uid.port(2),
        Bytes::from(vec![1u8; size.min(Message::MAX_PAYLOAD)]),
    )
    .expect("message");
    sa.set_nonblocking(true).ok();
    sb.set_nonblocking(true).ok();
    let mut link = rt
        .block_on(async {
            let s = tokio::net::UnixStream::from_std(sa)?;
            ShmLink::serve(s, &cfg).map_err(std::io::Error::other)
        })
        .expect("serve");
    two_threads(
        o,
        move || {
            rt.block_on(async {
                link.send(msg.clone()).await.is_ok() && matches!(link.next().await, Some(Ok(_)))
            })
        },
        move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let Ok(s) = tokio::net::UnixStream::from_std(sb) else {
                    return;
                };
                let Ok(mut l) = ShmLink::join(s, &cfg2).await else {
                    return;
                };
                while let Some(Ok(m)) = l.next().await {
                    if l.send(m).await.is_err() {
                        break;
                    }
                }
            });
        },
        || {},
    )
}

/// One-way messages per second through `n` mailboxes in parallel, a
/// sender and a receiver thread each (busy-poll). With one mailbox the
/// two threads are pinned to CPUs 0 and 1; more pairs share the two CPUs.
fn mailbox_throughput(n: usize, size: usize, run: Duration) -> f64 {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    let region = MailboxRegion::create(n, 128).expect("mailbox");
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for i in 0..n {
        let (mut tx, _) = region
            .endpoint(i, Side::A, WaitPolicy::BusyPoll)
            .expect("endpoint");
        let (_, mut rx) = region
            .endpoint(i, Side::B, WaitPolicy::BusyPoll)
            .expect("endpoint");
        let (stop_tx, stop_rx, got) = (stop.clone(), stop.clone(), got.clone());
        threads.push(std::thread::spawn(move || {
            if n == 1 {
                let _ = pin_to_cpu(0);
            }
            let msg = vec![1u8; size];
            while !stop_tx.load(Relaxed) {
                let soon = Some(Instant::now() + Duration::from_millis(10));
                if tx.send_deadline(&msg, soon).is_err() {
                    continue;
                }
            }
        }));
        threads.push(std::thread::spawn(move || {
            if n == 1 {
                let _ = pin_to_cpu(1);
            }
            let mut b = Vec::with_capacity(size);
            let mut count = 0;
            while !stop_rx.load(Relaxed) {
                let soon = Some(Instant::now() + Duration::from_millis(10));
                if rx.recv_deadline(&mut b, soon).is_ok() {
                    count += 1;
                }
            }
            got.fetch_add(count, Relaxed);
        }));
    }
    std::thread::sleep(run);
    stop.store(true, Relaxed);
    for t in threads {
        t.join().ok();
    }
    got.load(Relaxed) as f64 / run.as_secs_f64()
}

/// CPU use of a spin-then-park receiver on a silent mailbox for 500 ms.
fn idle_cpu(spin: Duration) -> f64 {
    let region = MailboxRegion::create(1, 128).expect("mailbox");
    let (mut tx, _) = region
        .endpoint(0, Side::A, WaitPolicy::BusyPoll)
        .expect("endpoint");
    let (_, mut rx) = region
        .endpoint(0, Side::B, WaitPolicy::SpinThenPark { spin })
        .expect("endpoint");
    let t = std::thread::spawn(move || {
        let wall = Instant::now();
        let cpu = thread_cpu();
        let mut b = Vec::new();
        let _ = rx.recv(&mut b);
        (thread_cpu() - cpu).as_secs_f64() / wall.elapsed().as_secs_f64()
    });
    std::thread::sleep(Duration::from_millis(500));
    let _ = tx.send(&[]);
    t.join().unwrap_or(f64::NAN)
}

fn main() {
    let o = opts();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("# round trips in microseconds; loadavg {}", load.trim());
    println!(
        "{:<22} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "path", "bytes", "n", "p50", "p95", "p99", "p99.9", "max"
    );
    let mut crossover = None;
    for size in SIZES {
        let p = stats(pio(o, size, WaitPolicy::BusyPoll));
        print_row("pio busy-poll", size, &p);
        let parked = WaitPolicy::SpinThenPark {
            spin: Duration::from_micros(20),
        };
        print_row("pio spin-then-park", size, &stats(pio(o, size, parked)));
        let d = stats(dma(o, size));
        print_row("dma ring", size, &d);
        if crossover.is_none() && d.p[0] < p.p[0] {
            crossover = Some(size);
        }
        print_row("shm link (tokio)", size, &stats(shm_link(o, size)));
        print_row("unix socket", size, &stats(unix_socket(o, size)));
        print_row("tokio mpsc threads", size, &stats(tokio_channel(o, size)));
    }
    match crossover {
        Some(s) => println!("# crossover: DMA p50 beats PIO p50 from {s} bytes"),
        None => println!("# crossover: PIO p50 wins at every size measured"),
    }
    for n in [1, 2] {
        for size in [8, 64, 120] {
            println!(
                "# mailbox one-way, {n} in parallel, {size} B: {:.2} M messages/s",
                mailbox_throughput(n, size, Duration::from_millis(300)) / 1e6
            );
        }
    }
    let (v, cpu) = pio_quiet(o.quiet_samples, Duration::from_micros(5));
    let s = stats(v);
    print_row("pio spin-then-park 1ms", 64, &s);
    println!(
        "# spin-then-park, one ping per ms: responder CPU {:.1} % of a core",
        cpu * 100.0
    );
    println!(
        "# spin-then-park, silent for 500 ms: receiver CPU {:.2} % of a core",
        idle_cpu(Duration::from_micros(20)) * 100.0
    );
}
