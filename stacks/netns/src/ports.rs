//! Loopback ports for tests and benchmarks that start servers on fixed
//! addresses (a daemon's configuration names its ports before it binds).
//!
//! A port the kernel hands out for `bind(…:0)` is in the ephemeral range,
//! and the same range feeds the source ports of outgoing connections: a
//! daemon connecting to its peer can take the very port another daemon of
//! the same test was about to listen on ("address in use"). The ports
//! given here lie below the ephemeral range, where the kernel never
//! allocates on its own, and are checked free for both TCP and UDP on
//! 127.0.0.1. Each process starts at its own place (from its pid) and
//! never gives the same port twice, so test binaries running side by side
//! rarely meet, and a port another process holds is skipped.

use std::io;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port given.
const LOW: u16 = 10_000;

/// Next candidate, as an offset from [`LOW`]; `u32::MAX` until the first
/// call sets it from the pid.
static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

/// The first port of the kernel's ephemeral range (32768 when unreadable).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Whether `port` on 127.0.0.1 can be bound for both TCP and UDP now.
fn free_now(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        && UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A port of 127.0.0.1 below the ephemeral range, free for TCP and UDP a
/// moment ago and not given before by this process.
///
/// # Errors
/// `AddrInUse` when every port of the range was tried (or the ephemeral
/// range starts too low to leave any).
pub fn try_free_port() -> io::Result<u16> {
    let high = ephemeral_low();
    let span = u32::from(high.saturating_sub(LOW));
    if span == 0 {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "no ports below the ephemeral range",
        ));
    }
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(2_654_435_761) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = LOW + offset as u16;
        if free_now(port) {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no free port in {LOW}..{high}"),
    ))
}

/// [`try_free_port`] for tests: panics when none is left.
pub fn free_port() -> u16 {
    try_free_port().expect("a free loopback port")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_distinct_and_bindable() {
        let high = ephemeral_low();
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "a port given twice");
        for p in ports {
            assert!((LOW..high).contains(&p), "{p} outside {LOW}..{high}");
            assert!(free_now(p), "{p} not free");
        }
    }

    #[test]
    fn a_port_held_elsewhere_is_skipped() {
        let _ = free_port();
        let span = u32::from(ephemeral_low() - LOW);
        // Take the next candidate for UDP only, from outside the picker.
        let next = LOW + (NEXT.load(Ordering::Relaxed) % span) as u16;
        let Ok(_held) = UdpSocket::bind((Ipv4Addr::LOCALHOST, next)) else {
            return; // someone else has it already: skipped all the same
        };
        assert_ne!(free_port(), next, "a port bound for UDP was given");
    }
}
