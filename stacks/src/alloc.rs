//! Process-wide allocator tuning for a dataplane.
//!
//! glibc's `malloc` hands blocks above 128 KiB to their own `mmap` and gives
//! them back with `munmap` when freed, and trims the top of its heaps once
//! 128 KiB there are free (its thresholds adapt, but only upwards after
//! such a block is freed, and not across threads' arenas). A receive path
//! that allocates read buffers of a few hundred KiB and frees them as its
//! messages are dropped then pays a fresh mapping and a page fault for every
//! 4 KiB of every buffer: TCP with 65 KB messages on loopback moved 21
//! Gbit/s that way and 46 Gbit/s with freed memory kept (measured with
//! `uniplane-bench gen --stack tcp --size 65000`). [`retain_freed_memory`]
//! keeps it.

/// Blocks below this come from the heap (and are reused after a free)
/// instead of a mapping of their own.
pub const MMAP_THRESHOLD: usize = 8 << 20;
/// Free memory at the top of a heap beyond this goes back to the kernel.
pub const TRIM_THRESHOLD: usize = 64 << 20;

/// Makes glibc's `malloc` keep freed memory for reuse: blocks up to
/// [`MMAP_THRESHOLD`] come from the heap, and a heap gives memory back only
/// past [`TRIM_THRESHOLD`] free at its top. Process-wide: call it once,
/// early, from a program's `main` (the daemon and the benchmarks do);
/// libraries leave it to the program. Returns whether the C library took
/// both settings (false on C libraries other than glibc, where it does
/// nothing).
pub fn retain_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only changes the allocator's parameters; both
        // values are within the ranges glibc documents.
        unsafe {
            let mmap = libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
            let trim = libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int);
            mmap == 1 && trim == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_both_settings() {
        assert!(retain_freed_memory());
        // Calling it again is harmless.
        assert!(retain_freed_memory());
    }
}
