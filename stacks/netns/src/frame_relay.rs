//! A frame-level relay: bridges raw Ethernet frames between two interfaces
//! of one namespace (the middle of a [`Line`](crate::Line)) with packet
//! sockets, and misbehaves on purpose as the UDP [`relay`](crate::relay)
//! does — loss, duplication, reordering, delay — seeded so a run replays.
//! Every EtherType passes, so it carries raw-Ethernet stacks as well as IP.
//!
//! It stops when [`FrameRelay::stop`] is called, when dropped, or after
//! `idle` without a frame.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use uniplane_dataplane::SplitMix64;

use crate::relay::{Impairment, RelayStats};
use crate::{Namespace, NetnsError};

const ETH_P_ALL: u16 = libc::ETH_P_ALL as u16;

/// A running frame relay; stops when dropped.
pub struct FrameRelay {
    stop: Arc<AtomicBool>,
    stats: Arc<RelayStats>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

/// A packet socket bound to one interface, receiving every EtherType.
fn open(iface: &str) -> io::Result<OwnedFd> {
    let name = std::ffi::CString::new(iface).map_err(io::Error::other)?;
    // SAFETY: a valid C string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: plain socket creation.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            ETH_P_ALL.to_be() as i32,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: all-zero is a valid sockaddr_ll.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETH_P_ALL.to_be();
    sll.sll_ifindex = index as i32;
    // SAFETY: binding to a valid sockaddr_ll of the declared size.
    let rc = unsafe {
        libc::bind(
            raw,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The next frame received on `fd` that did not leave through it.
fn recv(fd: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    loop {
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: receiving into live buffers of the declared sizes.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if n < 0 {
            return None;
        }
        if from.sll_pkttype != libc::PACKET_OUTGOING {
            return Some(n as usize);
        }
    }
}

fn send(fd: &OwnedFd, frame: &[u8]) -> bool {
    // SAFETY: sending a live buffer on a bound packet socket.
    unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) >= 0 }
}

impl FrameRelay {
    /// Starts bridging `left` and `right`, two interfaces of `ns`, on a new
    /// thread inside it, stopping by itself after `idle` without frames.
    pub fn start(
        ns: &Namespace,
        left: &str,
        right: &str,
        impairment: Impairment,
        idle: Duration,
    ) -> Result<FrameRelay, NetnsError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(RelayStats::default());
        let (l, r) = (left.to_owned(), right.to_owned());
        let (s, st) = (stop.clone(), stats.clone());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = ns.spawn(move || {
            let sockets = open(&l).and_then(|a| Ok((a, open(&r)?)));
            let (a, b) = match sockets {
                Ok(p) => {
                    let _ = ready_tx.send(Ok(()));
                    p
                }
                Err(e) => {
                    let kind = e.kind();
                    let _ = ready_tx.send(Err(e));
                    return Err(io::Error::new(kind, "frame relay did not start"));
                }
            };
            run([a, b], impairment, idle, &s, &st)
        })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(FrameRelay {
                stop,
                stats,
                thread: Some(thread),
            }),
            Ok(Err(source)) => Err(NetnsError::Spawn {
                cmd: format!("frame relay {left} <-> {right}"),
                source,
            }),
            Err(_) => Err(NetnsError::Spawn {
                cmd: format!("frame relay {left} <-> {right}"),
                source: io::Error::other("relay thread died"),
            }),
        }
    }

    /// Counters.
    pub fn stats(&self) -> &RelayStats {
        &self.stats
    }

    /// Stops the relay and waits for its thread.
    pub fn stop(mut self) -> io::Result<()> {
        self.halt()
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

impl Drop for FrameRelay {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// One direction's frames held back or delayed.
#[derive(Default)]
struct Lane {
    held: Option<Vec<u8>>,
    delayed: VecDeque<(Instant, Vec<u8>)>,
}

fn run(
    fds: [OwnedFd; 2],
    imp: Impairment,
    idle: Duration,
    stop: &AtomicBool,
    stats: &RelayStats,
) -> io::Result<()> {
    let mut rng = SplitMix64::new(imp.seed);
    let mut lanes = [Lane::default(), Lane::default()];
    let mut buf = vec![0u8; 65_536];
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) && last.elapsed() < idle {
        let mut pfd = [
            libc::pollfd {
                fd: fds[0].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fds[1].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polling two live descriptors for at most 1 ms.
        unsafe { libc::poll(pfd.as_mut_ptr(), 2, 1) };
        let now = Instant::now();
        // Lane i carries frames that arrived on fds[i] to the other side.
        for (i, fd) in fds.iter().enumerate() {
            for _ in 0..256 {
                let Some(n) = recv(fd, &mut buf) else {
                    break;
                };
                last = now;
                stats.received.fetch_add(1, Ordering::Relaxed);
                if rng.chance(imp.loss) {
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let copies = if rng.chance(imp.duplicate) { 2 } else { 1 };
                let l = &mut lanes[i];
                for _ in 0..copies {
                    let frame = buf[..n].to_vec();
                    if rng.chance(imp.delay_chance) {
                        l.delayed.push_back((now + imp.delay, frame));
                    } else if l.held.is_none() && rng.chance(imp.reorder) {
                        l.held = Some(frame);
                    } else {
                        l.delayed.push_back((now, frame));
                        if let Some(h) = l.held.take() {
                            l.delayed.push_back((now, h));
                        }
                    }
                }
            }
        }
        for (i, l) in lanes.iter_mut().enumerate() {
            // A held frame must not wait forever on an idle lane.
            if let Some(h) = l.held.take() {
                if l.delayed.is_empty() {
                    l.delayed.push_back((now, h));
                } else {
                    l.held = Some(h);
                }
            }
            let out = &fds[1 - i];
            let mut keep = VecDeque::new();
            while let Some((due, frame)) = l.delayed.pop_front() {
                if due > now {
                    keep.push_back((due, frame));
                } else if send(out, &frame) {
                    stats.sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            l.delayed = keep;
        }
    }
    Ok(())
}
