//! Memory devices in CUDA GPU memory (`[[devices]] kind = "memory"`,
//! `backend = "gpu"`).
//!
//! ```text
//!  engine ──ring link──▶ device thread ──WRTE payload──▶ staged: memcpy into the pinned
//!         ◀─answers────  (own runtime,                   bounce buffer, cuMemcpyHtoD
//!                         context current)               direct: cuMemHostRegister the
//!                                                        payload, cuMemcpyHtoD, unregister
//!                        ◀──READ── cuMemcpyDtoH into the bounce buffer, copied into the answer
//! ```
//!
//! One device allocation of the configured size on the configured GPU,
//! made when the daemon starts (so a missing driver, a missing GPU or too
//! little memory refuses the start with the reason), and one pinned bounce
//! buffer of the largest payload. The device runs on a thread of its own,
//! attached to the engine as a device port over a ring link: a copy blocks
//! that thread for microseconds, never the engine.
//!
//! **Direct copies register each payload.** A write's payload is a buffer
//! the ring link filled; for the driver to DMA from it, its pages must be
//! pinned, so `direct` pins them for the copy (`cuMemHostRegister`) and
//! unpins them after. That costs system calls and a page-table walk per
//! message, and measured on an H100 it never paid: at 4 KiB to 64 KiB
//! messages direct wrote 0.03 to 0.42 GB/s, staged 0.45 to 3.4 GB/s
//! (`uniplane-bench devices --memory gpu`). So `transfer = "auto"` goes
//! direct only from `direct_from` bytes on, by default above the largest
//! payload: it stages everything. A pinned receive arena (the link
//! writing payloads straight into pinned memory) would make direct free
//! of that cost, but needs the ring links to allocate from the device,
//! which they do not. A payload the driver refuses to register is staged
//! instead (counted as a fallback).
//!
//! Failures: a write or read outside the memory is answered
//! [`Status::OutOfRange`](uniplane_dataplane::wire::Status) as on host
//! memory; a failed copy is answered `PeerFailed`, and the device is
//! marked down (`uniplane status` shows why) and answers `PeerFailed` to
//! everything after, since a CUDA context that failed a copy stays failed.
//! Other devices and ports are not affected.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use serde_json::json;

use crate::config::Transfer;

#[cfg(feature = "gpu")]
mod cuda;
#[cfg(feature = "gpu")]
pub use cuda::{spawn, GpuMemory};

/// Why GPU memory could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The daemon was built without the `gpu` cargo feature.
    #[error(
        "gpu memory: this daemon was built without the gpu feature (build with `--features gpu`)"
    )]
    NotBuilt,
    /// The CUDA driver library is not installed (or not on the loader's path).
    #[error(
        "gpu memory: the CUDA driver library (libcuda.so.1) was not found: \
         install the NVIDIA driver, or put its directory on LD_LIBRARY_PATH"
    )]
    NoDriver,
    /// There is no GPU with that ordinal.
    #[error("gpu memory: no CUDA GPU number {ordinal} (the driver sees {count})")]
    NoDevice {
        /// The configured ordinal.
        ordinal: u32,
        /// How many GPUs the driver sees.
        count: i32,
    },
    /// A driver call failed.
    #[error("gpu memory: {call} failed: {message}")]
    Driver {
        /// The driver call.
        call: &'static str,
        /// What the driver said.
        message: String,
    },
}

/// What a GPU memory device did, shared with `uniplane status`.
#[derive(Debug, Default)]
pub struct GpuStats {
    /// Writes copied through the pinned bounce buffer.
    pub staged_writes: AtomicU64,
    /// Their bytes.
    pub staged_bytes: AtomicU64,
    /// Writes copied from the registered payload.
    pub direct_writes: AtomicU64,
    /// Their bytes.
    pub direct_bytes: AtomicU64,
    /// Direct writes whose payload the driver would not register, staged
    /// instead (also counted as staged).
    pub direct_fallbacks: AtomicU64,
    /// Reads answered.
    pub reads: AtomicU64,
    /// Their bytes.
    pub read_bytes: AtomicU64,
    /// Requests answered with an error (out of range or failed).
    pub errors: AtomicU64,
    /// Why the device cannot serve anymore, once it cannot.
    down: Mutex<Option<String>>,
}

impl GpuStats {
    /// Why the device is down, or `None` while it serves.
    pub fn down(&self) -> Option<String> {
        self.down.lock().map(|d| d.clone()).unwrap_or(None)
    }

    /// Marks the device down for `reason` (the first reason stays).
    pub fn mark_down(&self, reason: String) {
        if let Ok(mut d) = self.down.lock() {
            d.get_or_insert(reason);
        }
    }

    /// The counters and state as `uniplane status` shows them.
    pub fn json(&self) -> serde_json::Value {
        let n = |c: &AtomicU64| c.load(Relaxed);
        let down = self.down();
        json!({
            "state": if down.is_some() { "down" } else { "up" },
            "down_reason": down,
            "staged_writes": n(&self.staged_writes),
            "staged_bytes": n(&self.staged_bytes),
            "direct_writes": n(&self.direct_writes),
            "direct_bytes": n(&self.direct_bytes),
            "direct_fallbacks": n(&self.direct_fallbacks),
            "reads": n(&self.reads),
            "read_bytes": n(&self.read_bytes),
            "errors": n(&self.errors),
        })
    }
}

/// How a write of `len` bytes is copied under `transfer` with crossover
/// `direct_from`: `true` for direct.
pub fn goes_direct(transfer: Transfer, direct_from: usize, len: usize) -> bool {
    match transfer {
        Transfer::Staged => false,
        Transfer::Direct => true,
        Transfer::Auto => len >= direct_from,
    }
}

/// Stands for GPU memory in a build without the `gpu` feature: it cannot
/// be opened, so none exists.
#[cfg(not(feature = "gpu"))]
#[derive(Debug)]
pub enum GpuMemory {}

#[cfg(not(feature = "gpu"))]
impl GpuMemory {
    /// Always [`GpuError::NotBuilt`].
    pub fn open(
        _size: usize,
        _config: crate::config::GpuMemoryConfig,
        _stats: std::sync::Arc<GpuStats>,
    ) -> Result<GpuMemory, GpuError> {
        Err(GpuError::NotBuilt)
    }
}

/// Never called: no [`GpuMemory`] exists without the `gpu` feature.
#[cfg(not(feature = "gpu"))]
pub fn spawn<L: uniplane_dataplane::Link + Send + 'static>(
    memory: GpuMemory,
    _kind: crate::config::DeviceKind,
    _name: &str,
    _link: L,
) -> std::io::Result<()> {
    match memory {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_goes_direct_from_the_crossover_on() {
        assert!(!goes_direct(Transfer::Auto, 4096, 4095));
        assert!(goes_direct(Transfer::Auto, 4096, 4096));
        assert!(goes_direct(Transfer::Direct, 4096, 1));
        assert!(!goes_direct(Transfer::Staged, 0, 65535));
    }

    #[test]
    fn a_device_marked_down_keeps_its_first_reason() {
        let s = GpuStats::default();
        assert_eq!(s.json()["state"], "up");
        s.mark_down("first".into());
        s.mark_down("second".into());
        assert_eq!(s.down().as_deref(), Some("first"));
        assert_eq!(s.json()["state"], "down");
    }

    #[cfg(not(feature = "gpu"))]
    #[test]
    fn without_the_feature_gpu_memory_cannot_be_opened() {
        let config = crate::config::GpuMemoryConfig {
            ordinal: 0,
            transfer: Transfer::Auto,
            direct_from: 1,
        };
        let err = GpuMemory::open(64, config, std::sync::Arc::default()).unwrap_err();
        assert!(err.to_string().contains("built without the gpu feature"));
    }
}
