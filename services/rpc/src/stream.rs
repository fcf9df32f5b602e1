//! What a call's handles say to their connection's driver, and the two
//! ends of a streamed direction: [`Sender`] (waits for credit) and
//! [`Streaming`] (returns credit as it is read).
//!
//! Flow control is per call and per direction, counted in messages: a
//! sender starts with [`WINDOW`] credits, spends one per message, and the
//! receiver grants them back in CREDIT frames once its reader has taken
//! half a window. A receiver's queue therefore never holds more than a
//! window, so a slow reader holds up its own call and no other.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use futures_core::Stream;
use tokio::sync::{mpsc, oneshot};

use crate::status::Status;

/// Messages a sender may have unread at the receiver, per call and
/// direction.
pub const WINDOW: u32 = 64;

/// How the driver answers a call's opener.
pub(crate) enum Reply {
    /// One message or a status.
    Unary(oneshot::Sender<Result<Bytes, Status>>),
    /// Messages, then the end (or an error).
    Stream(mpsc::Sender<Result<Bytes, Status>>),
}

/// What a call's handles ask of its connection's driver.
pub(crate) enum Command {
    /// Client: open call `tag`.
    Open {
        tag: u32,
        method: Bytes,
        message: Option<Bytes>,
        end: bool,
        deadline_us: u32,
        reply: Reply,
        /// The request stream's credit (streamed requests only).
        credit: Option<Arc<Credit>>,
    },
    /// One message of a stream, or its end.
    Message {
        tag: u32,
        message: Option<Bytes>,
        end: bool,
    },
    /// Grant the far end `n` more messages.
    Credit { tag: u32, n: u32 },
    /// Client: the caller gave up.
    Cancel { tag: u32 },
    /// Server: a streamed reply starts; its credit.
    StreamStart { tag: u32, credit: Arc<Credit> },
    /// Server: the call's end, with its last message or its error.
    Status {
        tag: u32,
        result: Result<Option<Bytes>, Status>,
    },
}

/// The commands' channel.
pub(crate) type Commands = mpsc::UnboundedSender<Command>;

/// Credits of one sending direction, shared by the sender and the driver.
pub(crate) struct Credit {
    available: AtomicU32,
    closed: AtomicBool,
    waker: AtomicWaker,
}

impl Credit {
    /// A full window.
    pub(crate) fn new() -> Arc<Credit> {
        Arc::new(Credit {
            available: AtomicU32::new(WINDOW),
            closed: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        })
    }

    /// Takes one credit; `Err` once the call ended.
    pub(crate) fn poll_take(&self, cx: &mut Context<'_>) -> Poll<Result<(), ()>> {
        for registered in [false, true] {
            if self.closed.load(Ordering::Acquire) {
                return Poll::Ready(Err(()));
            }
            let mut n = self.available.load(Ordering::Acquire);
            while n > 0 {
                match self.available.compare_exchange_weak(
                    n,
                    n - 1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Poll::Ready(Ok(())),
                    Err(now) => n = now,
                }
            }
            if !registered {
                self.waker.register(cx.waker());
            }
        }
        Poll::Pending
    }

    /// The far end granted `n` more.
    pub(crate) fn add(&self, n: u32) {
        let _ = self
            .available
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                Some(a.saturating_add(n).min(WINDOW))
            });
        self.waker.wake();
    }

    /// The call ended: a waiting sender gives up.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.waker.wake();
    }
}

/// Sends the messages of a streamed request (client) — spends a credit
/// each, so it waits while the receiver is a window behind.
pub struct Sender {
    tag: u32,
    commands: Commands,
    credit: Arc<Credit>,
    max_message: usize,
    finished: bool,
}

impl Sender {
    pub(crate) fn new(
        tag: u32,
        commands: Commands,
        credit: Arc<Credit>,
        max_message: usize,
    ) -> Sender {
        Sender {
            tag,
            commands,
            credit,
            max_message,
            finished: false,
        }
    }

    /// Sends one message, waiting for credit; an error once the call
    /// ended (its status comes with the response).
    pub async fn send(&mut self, message: Bytes) -> Result<(), Status> {
        if message.len() > self.max_message {
            return Err(Status::resource_exhausted(format!(
                "message of {} bytes above the limit of {}",
                message.len(),
                self.max_message
            )));
        }
        if self.finished {
            return Err(Status::internal("send after finish"));
        }
        std::future::poll_fn(|cx| self.credit.poll_take(cx))
            .await
            .map_err(|()| Status::cancelled())?;
        self.commands
            .send(Command::Message {
                tag: self.tag,
                message: Some(message),
                end: false,
            })
            .map_err(|_| Status::unavailable("connection closed"))
    }

    /// Ends the stream (dropping the sender does the same).
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        if !self.finished {
            self.finished = true;
            let _ = self.commands.send(Command::Message {
                tag: self.tag,
                message: None,
                end: true,
            });
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.end();
    }
}

/// The messages of a streamed direction as they arrive; ends after the
/// last one, or with an error [`Status`]. Returns credit as it is read.
/// On the client, dropping it before its end cancels the call.
pub struct Streaming {
    tag: u32,
    rx: mpsc::Receiver<Result<Bytes, Status>>,
    commands: Commands,
    read: u32,
    done: bool,
    cancel_on_drop: bool,
    /// The client's deadline for the call.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The call's place among the client's calls in flight.
    _slot: Option<crate::client::Slot>,
}

impl Streaming {
    pub(crate) fn new(
        tag: u32,
        rx: mpsc::Receiver<Result<Bytes, Status>>,
        commands: Commands,
        cancel_on_drop: bool,
    ) -> Streaming {
        Streaming {
            tag,
            rx,
            commands,
            read: 0,
            done: false,
            cancel_on_drop,
            deadline: None,
            _slot: None,
        }
    }

    pub(crate) fn with_deadline(mut self, at: Option<tokio::time::Instant>) -> Self {
        self.deadline = at.map(|at| Box::pin(tokio::time::sleep_until(at)));
        self
    }

    pub(crate) fn with_slot(mut self, slot: crate::client::Slot) -> Self {
        self._slot = Some(slot);
        self
    }

    /// The next message; `None` after the last.
    pub async fn message(&mut self) -> Option<Result<Bytes, Status>> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next(cx)).await
    }

    fn cancel(&mut self) {
        if self.cancel_on_drop {
            let _ = self.commands.send(Command::Cancel { tag: self.tag });
        }
    }
}

impl Stream for Streaming {
    type Item = Result<Bytes, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(m))) => {
                this.read += 1;
                if this.read >= WINDOW / 2 {
                    let _ = this.commands.send(Command::Credit {
                        tag: this.tag,
                        n: this.read,
                    });
                    this.read = 0;
                }
                Poll::Ready(Some(Ok(m)))
            }
            Poll::Ready(Some(Err(s))) => {
                this.done = true;
                Poll::Ready(Some(Err(s)))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => {
                if let Some(d) = this.deadline.as_mut() {
                    if d.as_mut().poll(cx).is_ready() {
                        this.done = true;
                        this.cancel();
                        return Poll::Ready(Some(Err(Status::deadline_exceeded())));
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        if !self.done {
            self.cancel();
        }
    }
}

impl std::fmt::Debug for Streaming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming").field("tag", &self.tag).finish()
    }
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").field("tag", &self.tag).finish()
    }
}

use std::future::Future as _;
