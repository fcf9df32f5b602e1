//! The daemon's sealed tunnel links: [`crate::seal`] on the way in and
//! out of a stack link, every refusal counted.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::{Sink, Stream};
use uniplane_dataplane::{BoxLink, Link, LinkError, Message};

use crate::seal::{Refused, Sealer};

/// A tunnel link whose frames are sealed and opened on the way.
pub(super) struct SealedLink {
    inner: BoxLink,
    sealer: Sealer,
    counters: Arc<super::Shared>,
    /// Sealed frames accepted from the caller, not yet taken by `inner`
    /// (at most one batch).
    outgoing: VecDeque<Message>,
    incoming: Vec<Message>,
    /// Scratch for `poll_next`'s one message.
    ready: Vec<Message>,
}

impl SealedLink {
    pub fn new(inner: BoxLink, sealer: Sealer, shared: Arc<super::Shared>) -> SealedLink {
        SealedLink {
            inner,
            sealer,
            counters: shared,
            outgoing: VecDeque::new(),
            incoming: Vec::new(),
            ready: Vec::with_capacity(1),
        }
    }

    /// Hands what waits to `inner`; `Ready` once nothing waits.
    fn push_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        if self.outgoing.is_empty() {
            return Poll::Ready(Ok(()));
        }
        self.inner.poll_send_batch(cx, &mut self.outgoing)
    }
}

impl Stream for SealedLink {
    type Item = Result<Message, LinkError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // `ready` is empty between calls; reusing it spares an
        // allocation per message.
        let this = self.get_mut();
        let mut one = std::mem::take(&mut this.ready);
        let polled = this.poll_recv_batch(cx, &mut one, 1);
        let m = one.pop();
        this.ready = one;
        match polled {
            Poll::Ready(Ok(0)) => Poll::Ready(None),
            Poll::Ready(Ok(_)) => Poll::Ready(m.map(Ok)),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Sink<Message> for SealedLink {
    type Error = LinkError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.get_mut().push_out(cx)
    }

    fn start_send(self: Pin<&mut Self>, m: Message) -> Result<(), LinkError> {
        let this = self.get_mut();
        let frame = this.sealer.seal(&m)?;
        this.outgoing.push_back(frame);
        this.counters.security.frames_sealed.fetch_add(1, Relaxed);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        match this.push_out(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        match this.push_out(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_close(cx),
            other => other,
        }
    }
}

impl Link for SealedLink {
    fn poll_recv_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Message>,
        max: usize,
    ) -> Poll<Result<usize, LinkError>> {
        loop {
            self.incoming.clear();
            let got = match self.inner.poll_recv_batch(cx, &mut self.incoming, max) {
                Poll::Ready(Ok(n)) => Ok(n),
                Poll::Ready(Err(e)) => Err(e),
                Poll::Pending => return Poll::Pending,
            };
            let mut n = 0;
            for frame in self.incoming.drain(..) {
                match self.sealer.open(frame) {
                    Ok(m) => {
                        out.push(m);
                        n += 1;
                    }
                    Err(why) => {
                        let s = &self.counters.security;
                        let counter = match why {
                            Refused::Unsealed => &s.frames_unsealed,
                            Refused::Replayed => &s.frames_replayed,
                            Refused::BadTag => &s.frames_bad_tag,
                            Refused::ForeignSource => &s.frames_foreign_source,
                        };
                        counter.fetch_add(1, Relaxed);
                    }
                }
            }
            if n > 0 {
                self.counters
                    .security
                    .frames_opened
                    .fetch_add(n as u64, Relaxed);
            }
            match got {
                // Messages before a failure are delivered first.
                Err(e) if n == 0 => return Poll::Ready(Err(e)),
                Err(_) => return Poll::Ready(Ok(n)),
                // The stream ended.
                Ok(0) => return Poll::Ready(Ok(0)),
                Ok(_) if n > 0 => return Poll::Ready(Ok(n)),
                // Every frame was dropped: look again, not "ended".
                Ok(_) => continue,
            }
        }
    }

    fn poll_send_batch(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut VecDeque<Message>,
    ) -> Poll<Result<(), LinkError>> {
        loop {
            match self.push_out(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            if batch.is_empty() {
                return Poll::Ready(Ok(()));
            }
            // Accept one batch's worth; it waits here until `inner`
            // takes it, so the bound is the caller's batch.
            let before = self.outgoing.len();
            while let Some(m) = batch.pop_front() {
                let frame = self.sealer.seal(&m)?;
                self.outgoing.push_back(frame);
            }
            self.counters
                .security
                .frames_sealed
                .fetch_add((self.outgoing.len() - before) as u64, Relaxed);
        }
    }
}
