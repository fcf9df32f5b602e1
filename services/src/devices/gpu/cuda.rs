//! GPU memory through the CUDA driver API (cudarc, loaded at run time).

use std::ffi::c_void;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use bytes::Bytes;
use cudarc::driver::{result, sys, DriverError};
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::{Link, Message};

use super::{goes_direct, GpuError, GpuStats};
use crate::config::{DeviceKind, GpuMemoryConfig};
use crate::devices::MemoryStore;

/// Bytes of the pinned bounce buffer: the largest payload.
const BOUNCE: usize = Message::MAX_PAYLOAD;

fn driver(call: &'static str) -> impl FnOnce(DriverError) -> GpuError {
    move |e| GpuError::Driver {
        call,
        message: match e.error_string() {
            Ok(text) => format!("{:?}: {}", e.0, text.to_string_lossy()),
            Err(_) => format!("{:?}", e.0),
        },
    }
}

/// One allocation in a GPU's memory with its pinned bounce buffer, in the
/// GPU's primary context (made current on whichever thread uses it).
#[derive(Debug)]
pub struct GpuMemory {
    config: GpuMemoryConfig,
    device: sys::CUdevice,
    context: sys::CUcontext,
    base: sys::CUdeviceptr,
    size: usize,
    /// Pinned host memory of [`BOUNCE`] bytes.
    bounce: *mut u8,
    stats: Arc<GpuStats>,
}

// SAFETY: the context, device pointer and pinned buffer belong to this
// value alone; every use makes the context current on the using thread
// first, and CUDA contexts may be current on any thread.
unsafe impl Send for GpuMemory {}

impl GpuMemory {
    /// `size` zeroed bytes on GPU `config.ordinal`, counted in `stats`.
    /// Refuses with the reason when the driver library, the GPU or the
    /// memory is missing.
    pub fn open(
        size: usize,
        config: GpuMemoryConfig,
        stats: Arc<GpuStats>,
    ) -> Result<GpuMemory, GpuError> {
        // cudarc panics on the first call when the library is missing:
        // look for it first.
        // SAFETY: only tries to load the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        result::init().map_err(driver("cuInit"))?;
        let count = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
        if i64::from(config.ordinal) >= i64::from(count) {
            return Err(GpuError::NoDevice {
                ordinal: config.ordinal,
                count,
            });
        }
        let device = result::device::get(config.ordinal as i32).map_err(driver("cuDeviceGet"))?;
        // SAFETY: `device` came from cuDeviceGet.
        let context = unsafe { result::primary_ctx::retain(device) }
            .map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let mut memory = GpuMemory {
            config,
            device,
            context,
            base: 0,
            size,
            bounce: std::ptr::null_mut(),
            stats,
        };
        memory.bind()?;
        // SAFETY: the context is current; sizes are the configured ones.
        unsafe {
            memory.base = result::malloc_sync(size).map_err(driver("cuMemAlloc"))?;
            result::memset_d8_sync(memory.base, 0, size).map_err(driver("cuMemsetD8"))?;
            memory.bounce = result::malloc_host(BOUNCE, 0)
                .map_err(driver("cuMemHostAlloc"))?
                .cast();
        }
        Ok(memory)
    }

    /// Makes the context current on this thread.
    fn bind(&self) -> Result<(), GpuError> {
        // SAFETY: the context was retained and lives as long as `self`.
        unsafe { result::ctx::set_current(self.context) }.map_err(driver("cuCtxSetCurrent"))
    }

    /// The device address of `len` bytes at `addr`, when inside.
    fn at(&self, addr: u64, len: usize) -> Option<sys::CUdeviceptr> {
        let start = usize::try_from(addr).ok()?;
        (start.checked_add(len)? <= self.size).then_some(self.base + addr)
    }

    /// The pinned bounce buffer, `len` bytes of it.
    fn bounce(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= BOUNCE, "a payload larger than the largest");
        // SAFETY: `bounce` points to BOUNCE bytes owned by `self`.
        unsafe { std::slice::from_raw_parts_mut(self.bounce, len) }
    }

    fn staged(&mut self, dst: sys::CUdeviceptr, data: &[u8]) -> Result<(), GpuError> {
        self.bounce(data.len()).copy_from_slice(data);
        let src = &self.bounce(data.len())[..];
        // SAFETY: `dst` holds `data.len()` bytes (checked by `at`); a copy
        // from pinned memory is complete when it returns.
        unsafe { result::memcpy_htod_sync(dst, src) }.map_err(driver("cuMemcpyHtoD"))?;
        self.stats.staged_writes.fetch_add(1, Relaxed);
        self.stats
            .staged_bytes
            .fetch_add(data.len() as u64, Relaxed);
        Ok(())
    }

    /// Pins `data`'s pages, copies from them, unpins them; `Ok(false)`
    /// when the driver would not pin them (nothing copied).
    fn direct(&mut self, dst: sys::CUdeviceptr, data: &[u8]) -> Result<bool, GpuError> {
        let ptr = data.as_ptr() as *mut c_void;
        // SAFETY: `data` outlives the registration, which ends below; the
        // driver only reads through it.
        if unsafe { sys::cuMemHostRegister_v2(ptr, data.len(), 0) }
            .result()
            .is_err()
        {
            return Ok(false);
        }
        // SAFETY: as in `staged`; the source is pinned for the copy.
        let copied = unsafe { result::memcpy_htod_sync(dst, data) };
        // SAFETY: registered just above.
        let unpinned = unsafe { sys::cuMemHostUnregister(ptr) }.result();
        copied.map_err(driver("cuMemcpyHtoD"))?;
        unpinned.map_err(driver("cuMemHostUnregister"))?;
        self.stats.direct_writes.fetch_add(1, Relaxed);
        self.stats
            .direct_bytes
            .fetch_add(data.len() as u64, Relaxed);
        Ok(true)
    }

    /// Writes `data` at `addr`.
    fn write(&mut self, dst: sys::CUdeviceptr, data: &[u8]) -> Result<(), GpuError> {
        if data.is_empty() {
            return Ok(());
        }
        if goes_direct(self.config.transfer, self.config.direct_from, data.len()) {
            if self.direct(dst, data)? {
                return Ok(());
            }
            self.stats.direct_fallbacks.fetch_add(1, Relaxed);
        }
        self.staged(dst, data)
    }

    /// The `len` bytes at `src`, through the bounce buffer.
    fn read(&mut self, src: sys::CUdeviceptr, len: usize) -> Result<Bytes, GpuError> {
        if len == 0 {
            return Ok(Bytes::new());
        }
        let out = self.bounce(len);
        // SAFETY: `src` holds `len` bytes (checked by `at`), `out` is
        // pinned and `len` long.
        unsafe { result::memcpy_dtoh_sync(out, src) }.map_err(driver("cuMemcpyDtoH"))?;
        let data = Bytes::copy_from_slice(self.bounce(len));
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(len as u64, Relaxed);
        Ok(data)
    }

    /// A failed copy: the device cannot serve anymore.
    fn failed(&self, e: GpuError) -> Status {
        tracing::error!(error = %e, "gpu memory device down");
        self.stats.mark_down(e.to_string());
        Status::PeerFailed
    }

    /// Answers for a device that is down or out of range.
    fn refuse(&self, status: Status) -> Status {
        self.stats.errors.fetch_add(1, Relaxed);
        status
    }
}

impl MemoryStore for GpuMemory {
    fn store(&mut self, addr: u64, data: &[u8]) -> Result<(), Status> {
        if self.stats.down().is_some() {
            return Err(self.refuse(Status::PeerFailed));
        }
        let Some(dst) = self.at(addr, data.len()) else {
            return Err(self.refuse(Status::OutOfRange));
        };
        self.write(dst, data)
            .map_err(|e| self.failed(e))
            .map_err(|s| self.refuse(s))
    }

    fn load(&mut self, addr: u64, len: usize) -> Result<Bytes, Status> {
        if self.stats.down().is_some() {
            return Err(self.refuse(Status::PeerFailed));
        }
        let Some(src) = self.at(addr, len) else {
            return Err(self.refuse(Status::OutOfRange));
        };
        self.read(src, len)
            .map_err(|e| self.failed(e))
            .map_err(|s| self.refuse(s))
    }
}

impl Drop for GpuMemory {
    fn drop(&mut self) {
        // Nothing to do about a failure here but leave it to the process's
        // end; the context must be current to free.
        let _ = self.bind();
        // SAFETY: allocated in `open` (null or 0 when it failed before),
        // used by nobody after this.
        unsafe {
            if !self.bounce.is_null() {
                let _ = result::free_host(self.bounce.cast());
            }
            if self.base != 0 {
                let _ = result::free_sync(self.base);
            }
            let _ = result::primary_ctx::release(self.device);
        }
    }
}

/// Runs `memory` as a `kind` device named `name` on `link`, on a thread of
/// its own (with a runtime of its own for the link), until the link
/// closes.
pub fn spawn<L: Link + Send + 'static>(
    mut memory: GpuMemory,
    kind: DeviceKind,
    name: &str,
    link: L,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(format!("gpu-{name}"))
        .spawn(move || {
            if let Err(e) = memory.bind() {
                memory.failed(e);
            }
            runtime.block_on(crate::devices::serve(kind, &mut memory, link));
        })?;
    Ok(())
}
