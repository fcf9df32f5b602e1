//! A UDP relay that misbehaves on purpose: it forwards datagrams between
//! one client and one target and, seeded by [`SplitMix64`], drops,
//! duplicates, holds back (reorders) and delays them, in both directions.
//!
//! The relay listens at `listen`; the first datagram's source becomes the
//! client; datagrams from the client go to `target` from the relay's own
//! socket, and what the target answers goes back to the client. It stops
//! when [`Relay::stop`] is called, when dropped, or after `idle` without
//! traffic, so a test never leaves it running.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use uniplane_dataplane::SplitMix64;

/// What the relay does to each datagram (probabilities 0.0–1.0).
#[derive(Clone, Debug, PartialEq)]
pub struct Impairment {
    /// Seed of every decision.
    pub seed: u64,
    /// Probability of dropping a datagram.
    pub loss: f64,
    /// Probability of sending it twice.
    pub duplicate: f64,
    /// Probability of holding it back until after the next one.
    pub reorder: f64,
    /// Probability of delaying it by `delay`.
    pub delay_chance: f64,
    /// The added delay.
    pub delay: Duration,
}

impl Impairment {
    /// Forwards faithfully.
    pub const fn none(seed: u64) -> Self {
        Impairment {
            seed,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            delay_chance: 0.0,
            delay: Duration::ZERO,
        }
    }
}

/// Counters of a running relay.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Datagrams received on either side.
    pub received: AtomicU64,
    /// Datagrams sent on either side.
    pub sent: AtomicU64,
    /// Datagrams dropped on purpose.
    pub dropped: AtomicU64,
}

/// A running relay; stops when dropped.
pub struct Relay {
    stop: Arc<AtomicBool>,
    stats: Arc<RelayStats>,
    local: SocketAddr,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl Relay {
    /// Binds `listen` and relays to `target` on a new thread, stopping by
    /// itself after `idle` without traffic.
    pub fn start(
        listen: SocketAddr,
        target: SocketAddr,
        impairment: Impairment,
        idle: Duration,
    ) -> io::Result<Relay> {
        let front = UdpSocket::bind(listen)?;
        let any: SocketAddr = if target.is_ipv4() {
            "0.0.0.0:0".parse().map_err(io::Error::other)?
        } else {
            "[::]:0".parse().map_err(io::Error::other)?
        };
        let back = UdpSocket::bind(any)?;
        back.connect(target)?;
        let local = front.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(RelayStats::default());
        let (s, st) = (stop.clone(), stats.clone());
        let thread = std::thread::spawn(move || run(front, back, impairment, idle, &s, &st));
        Ok(Relay {
            stop,
            stats,
            local,
            thread: Some(thread),
        })
    }

    /// The address clients send to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Counters.
    pub fn stats(&self) -> &RelayStats {
        &self.stats
    }

    /// Stops the relay and waits for its thread.
    pub fn stop(mut self) -> io::Result<()> {
        self.halt()
    }

    /// Waits until the relay stops by itself (idle).
    pub fn wait(mut self) -> io::Result<()> {
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("relay panicked"))),
            None => Ok(()),
        }
    }

    fn halt(&mut self) -> io::Result<()> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("relay panicked"))),
            None => Ok(()),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// One direction's pending datagrams: due time and bytes.
struct Lane {
    held: Option<Vec<u8>>,
    delayed: VecDeque<(Instant, Vec<u8>)>,
}

fn run(
    front: UdpSocket,
    back: UdpSocket,
    imp: Impairment,
    idle: Duration,
    stop: &AtomicBool,
    stats: &RelayStats,
) -> io::Result<()> {
    let tick = Duration::from_millis(1);
    front.set_read_timeout(Some(tick))?;
    back.set_nonblocking(true)?;
    let mut rng = SplitMix64::new(imp.seed);
    let mut client: Option<SocketAddr> = None;
    let mut lanes = [
        Lane {
            held: None,
            delayed: VecDeque::new(),
        },
        Lane {
            held: None,
            delayed: VecDeque::new(),
        },
    ];
    let mut buf = vec![0u8; 65_536];
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) && last.elapsed() < idle {
        let mut got: Vec<(usize, Vec<u8>)> = Vec::new();
        match front.recv_from(&mut buf) {
            Ok((n, from)) => {
                client = Some(from);
                got.push((0, buf[..n].to_vec()));
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(e),
        }
        front.set_nonblocking(true)?;
        for _ in 0..256 {
            match front.recv_from(&mut buf) {
                Ok((n, from)) => {
                    client = Some(from);
                    got.push((0, buf[..n].to_vec()));
                }
                Err(_) => break,
            }
        }
        front.set_nonblocking(false)?;
        for _ in 0..256 {
            match back.recv(&mut buf) {
                Ok(n) => got.push((1, buf[..n].to_vec())),
                Err(_) => break,
            }
        }
        if !got.is_empty() {
            last = Instant::now();
        }
        let now = Instant::now();
        for (lane, data) in got {
            stats.received.fetch_add(1, Ordering::Relaxed);
            if rng.chance(imp.loss) {
                stats.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let copies = if rng.chance(imp.duplicate) { 2 } else { 1 };
            for _ in 0..copies {
                let l = &mut lanes[lane];
                if rng.chance(imp.delay_chance) {
                    l.delayed.push_back((now + imp.delay, data.clone()));
                } else if l.held.is_none() && rng.chance(imp.reorder) {
                    l.held = Some(data.clone());
                } else {
                    l.delayed.push_back((now, data.clone()));
                    if let Some(h) = l.held.take() {
                        l.delayed.push_back((now, h));
                    }
                }
            }
        }
        for (i, l) in lanes.iter_mut().enumerate() {
            // A held datagram must not wait forever on an idle lane.
            if let Some(h) = l.held.take() {
                if l.delayed.is_empty() {
                    l.delayed.push_back((now, h));
                } else {
                    l.held = Some(h);
                }
            }
            let mut keep = VecDeque::new();
            while let Some((due, data)) = l.delayed.pop_front() {
                if due > now {
                    keep.push_back((due, data));
                    continue;
                }
                let sent = if i == 0 {
                    back.send(&data).is_ok()
                } else {
                    client.is_some_and(|c| front.send_to(&data, c).is_ok())
                };
                if sent {
                    stats.sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            l.delayed = keep;
        }
    }
    Ok(())
}
