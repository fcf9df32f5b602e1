//! Stacks by name, and where a benchmark listens and connects on each.
//!
//! Every stack of `uniplane_stacks::by_name` is available; the benchmark
//! adds variants of its own: `udp-unpacked`, the udp stack sending one
//! message per datagram (the way iperf3 and sockperf send), where plain
//! `udp` packs many small messages into each datagram; and `udp-uring` and
//! `udp-unpacked-uring`, the same two on the io_uring backend instead of
//! epoll (opening a socket fails where the kernel refuses io_uring).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use uniplane_dataplane::{Locator, Stack};
use uniplane_stacks::ltl::LtlStack;
use uniplane_stacks::udp::{UdpConfig, UdpStack};

use crate::BenchError;

/// The benchmark's own stack variants, beside `uniplane_stacks::STACK_NAMES`.
pub const BENCH_STACK_NAMES: &[&str] = &["udp-unpacked", "udp-uring", "udp-unpacked-uring"];

/// The udp stack's variant called `name`: (packs messages, io_uring), or
/// `None` for another stack.
pub fn udp_variant(name: &str) -> Option<(bool, bool)> {
    match name {
        "udp" => Some((true, false)),
        "udp-unpacked" => Some((false, false)),
        "udp-uring" => Some((true, true)),
        "udp-unpacked-uring" => Some((false, true)),
        _ => None,
    }
}

/// The backend of a udp variant.
pub fn udp_backend(uring: bool) -> uniplane_stacks::udp::Backend {
    if uring {
        uniplane_stacks::udp::Backend::IoUring
    } else {
        uniplane_stacks::udp::Backend::Epoll
    }
}

/// Every stack name [`open_stack`] accepts.
pub fn stack_names() -> Vec<&'static str> {
    uniplane_stacks::STACK_NAMES
        .iter()
        .chain(BENCH_STACK_NAMES)
        .copied()
        .collect()
}

/// A new instance of the stack called `name`.
pub fn open_stack(name: &str) -> Result<Arc<dyn Stack>, BenchError> {
    let stack = match (name, udp_variant(name)) {
        ("udp", _) | (_, None) => uniplane_stacks::by_name(name),
        (_, Some((pack, uring))) => Some(Arc::new(UdpStack::with_config(UdpConfig {
            pack,
            backend: udp_backend(uring),
            ..UdpConfig::default()
        })) as Arc<dyn Stack>),
    };
    stack.ok_or_else(|| BenchError::UnknownStack {
        name: name.to_owned(),
        known: stack_names().join(", "),
    })
}

/// A new `ltl` stack whose endpoints drop each datagram they receive with
/// probability `loss` (0.0–1.0; none at 0), their drop decisions seeded
/// from `seed`: the stack `gen --loss` measures.
pub fn open_lossy_ltl(loss: f64, seed: u64) -> Result<Arc<LtlStack>, BenchError> {
    let stack = LtlStack::new()
        .with_receive_loss(loss, seed)
        .map_err(|e| BenchError::Config(e.to_string()))?;
    Ok(Arc::new(stack))
}

/// Where a run listens and where it connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    /// The receiver listens here.
    pub listen: Locator,
    /// The sender connects here.
    pub connect: Locator,
}

/// Locators for a run over `stack_name` on this host: a fresh name for
/// in-process stacks, a free 127.0.0.1 port for stacks over IP. Stacks that
/// need an interface (ether) have none: the user names them.
pub fn default_endpoints(stack_name: &str) -> Result<Endpoints, BenchError> {
    static RUN: AtomicU32 = AtomicU32::new(0);
    let loc = match stack_name {
        "mem" | "shm" => Locator::Name(format!(
            "uniplane-bench-{}-{}",
            std::process::id(),
            RUN.fetch_add(1, Ordering::Relaxed)
        )),
        "udp" | "udp-unpacked" | "udp-uring" | "udp-unpacked-uring" | "ltl" | "tcp" => {
            Locator::Socket(free_port()?)
        }
        other => return Err(BenchError::NeedsLocator(other.to_owned())),
    };
    Ok(Endpoints {
        listen: loc.clone(),
        connect: loc,
    })
}

/// A port of 127.0.0.1, free for TCP and UDP a moment ago, below the
/// kernel's ephemeral range (so no outgoing connection of the run takes
/// it before its listener binds), never given twice in one process.
pub fn free_port() -> Result<SocketAddr, BenchError> {
    let port = uniplane_netns::try_free_port().map_err(uniplane_dataplane::StackError::Io)?;
    Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_opens() {
        for name in stack_names() {
            assert!(open_stack(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn a_lossy_ltl_stack_takes_a_probability_only() {
        assert_eq!(open_lossy_ltl(0.01, 1).unwrap().receive_loss(), 0.01);
        assert_eq!(open_lossy_ltl(0.0, 1).unwrap().receive_loss(), 0.0);
        assert!(matches!(open_lossy_ltl(1.5, 1), Err(BenchError::Config(_))));
    }

    #[test]
    fn an_unknown_stack_lists_the_known_ones() {
        let err = open_stack("carrier-pigeon").err().unwrap().to_string();
        assert!(err.contains("mem") && err.contains("udp-unpacked"), "{err}");
    }

    #[test]
    fn ip_stacks_get_loopback_locators_and_mem_gets_fresh_names() {
        let a = default_endpoints("mem").unwrap();
        let b = default_endpoints("mem").unwrap();
        assert_ne!(a.listen, b.listen);
        match default_endpoints("udp").unwrap().listen {
            Locator::Socket(s) => assert!(s.ip().is_loopback()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            default_endpoints("ether"),
            Err(BenchError::NeedsLocator(_))
        ));
    }
}
