//! Our side of `peer --tool testpmd --stack dpdk` (the `dpdk` feature):
//! the frame layer transmitting 64-byte frames on a DPDK `net_null` port
//! (no hardware, no hugepages) from this thread, as `dpdk-testpmd
//! --forward-mode=txonly` does on its own `net_null` ports.
//!
//! The EAL can start once per process, so the port is opened on the first
//! measurement and kept for the later ones.

use std::time::Instant;

use uniplane_dpdk::{DpdkConfig, DpdkDevice, Eal};
use uniplane_frame::eth::{write_header, MacAddr};
use uniplane_frame::{FrameDevice, RxQueue, TxQueue};

use crate::BenchError;

/// A `net_null` port of this process's EAL.
pub struct NullPort {
    dev: DpdkDevice,
}

impl Drop for NullPort {
    fn drop(&mut self) {
        // The EAL stays up for the process; its runtime files need not
        // outlive it.
        let _ = std::fs::remove_dir_all(
            std::path::Path::new(crate::peer::DPDK_RUNTIME)
                .join(format!("uniplane-bench-{}", std::process::id())),
        );
    }
}

impl NullPort {
    /// Starts the EAL (on CPU 1, without hugepages or PCI) and opens
    /// `net_null0`.
    pub fn open() -> Result<NullPort, BenchError> {
        let prefix = format!("--file-prefix=uniplane-bench-{}", std::process::id());
        let eal = Eal::init(&[
            "--no-huge",
            "-m",
            "1024",
            "--no-pci",
            "--no-shconf",
            "--no-telemetry",
            &prefix,
            "-l",
            "1",
            "--log-level=lib.eal:error",
            "--vdev=net_null0",
        ])
        .map_err(|e| BenchError::Config(format!("starting the DPDK EAL: {e}")))?;
        let cfg = DpdkConfig {
            pool_mbufs: 16383,
            ..DpdkConfig::default()
        };
        let dev = DpdkDevice::open(eal, "net_null0", &cfg)
            .map_err(|e| BenchError::Config(format!("opening net_null0: {e}")))?;
        Ok(NullPort { dev })
    }

    /// Transmits `size`-byte frames for `secs`; returns (frames per
    /// second, frames). The first 42 bytes of each frame are written, as
    /// testpmd's txonly writes Ethernet, IPv4 and UDP headers.
    pub fn transmit(&mut self, size: usize, secs: f64) -> Result<(f64, u64), BenchError> {
        let len = size.clamp(60, 1514);
        let src = self.dev.mac();
        let (_, tx) = self.dev.queues();
        let start = Instant::now();
        let mut sent = 0u64;
        let mut turns = 0u32;
        loop {
            tx.push_burst(usize::MAX, |_, f| {
                write_header(f, MacAddr::BROADCAST, src, 0x88b5);
                f[14..42].fill(0);
                len
            });
            sent += tx
                .flush()
                .map_err(|e| BenchError::Config(format!("DPDK transmit: {e}")))?
                as u64;
            turns += 1;
            if turns.is_multiple_of(1024) && start.elapsed().as_secs_f64() >= secs {
                break;
            }
        }
        Ok((sent as f64 / start.elapsed().as_secs_f64(), sent))
    }

    /// Receives for `secs` the frames net_null's receive makes (64 bytes,
    /// their contents never written), looking at each one's length only,
    /// as testpmd's rxonly does; returns (frames per second, frames).
    pub fn receive(&mut self, secs: f64) -> Result<(f64, u64), BenchError> {
        let (rx, _) = self.dev.queues();
        let start = Instant::now();
        let (mut got, mut bytes) = (0u64, 0u64);
        let mut turns = 0u32;
        loop {
            rx.refill()
                .map_err(|e| BenchError::Config(format!("DPDK receive: {e}")))?;
            while let Some(len) = rx.take(|f| f.len()) {
                bytes += len as u64;
                got += 1;
            }
            turns += 1;
            if turns.is_multiple_of(1024) && start.elapsed().as_secs_f64() >= secs {
                break;
            }
        }
        if got > 0 && bytes == 0 {
            return Err(BenchError::Config("DPDK receive: empty frames".into()));
        }
        Ok((got as f64 / start.elapsed().as_secs_f64(), got))
    }
}
