//! Readiness for async tasks: a device whose wake-up is a descriptor is
//! registered with tokio's reactor; a poll-mode device (DPDK) asks to be
//! polled again at once.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::{FrameDevice, RxQueue, TxQueue, Wakeup};

/// A descriptor the device owns; registration does not own it.
struct Borrowed(RawFd);

impl AsRawFd for Borrowed {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A [`FrameDevice`] with async readiness.
pub struct AsyncDevice<D: FrameDevice> {
    // Deregistered before the device closes the descriptor.
    reg: Option<AsyncFd<Borrowed>>,
    dev: D,
}

impl<D: FrameDevice> AsyncDevice<D> {
    /// Registers `dev`; must be called inside a tokio runtime when the
    /// device wakes through a descriptor.
    pub fn new(dev: D) -> io::Result<Self> {
        let reg = match dev.wakeup() {
            // SAFETY: the device owns the descriptor and outlives the
            // registration (dropped first, by field order).
            Wakeup::Fd(fd) => {
                Some(unsafe { AsyncFd::register_with_interest(Borrowed(fd), Interest::READABLE) }?)
            }
            Wakeup::Poll => None,
        };
        Ok(AsyncDevice { reg, dev })
    }

    /// The device.
    pub fn get_ref(&self) -> &D {
        &self.dev
    }

    /// The device, to move frames.
    pub fn get_mut(&mut self) -> &mut D {
        &mut self.dev
    }

    /// Waits until received frames are ready; `Ready(Ok(n))` with `n > 0`.
    pub fn poll_rx(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        loop {
            let n = self.dev.queues().0.refill()?;
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            match &self.reg {
                Some(reg) => match reg.poll_read_ready(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    // Stale or fresh: clear it and look once more.
                    Poll::Ready(Ok(mut guard)) => guard.clear_ready(),
                },
                None => {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
        }
    }

    /// Waits until a transmit slot is free, flushing what is queued.
    pub fn poll_tx_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let tx = self.dev.queues().1;
        if tx.has_room() {
            return Poll::Ready(Ok(()));
        }
        tx.flush()?;
        if tx.has_room() {
            return Poll::Ready(Ok(()));
        }
        // Slots come back as the kernel or the device finishes with them,
        // which takes no event to learn: look again on the next turn.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
