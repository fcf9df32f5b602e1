//! What a failed tunnel owed: a tunnel that owes messages and moves none
//! of them for the failure timeout has failed, like a peer silent for as
//! long (the underlay watches, [`super::underlay`]). Its end is reported
//! (the core closes the connections through it, telling their owners, and
//! opens it again when the peer returns), and what was queued for it is
//! answered here, each request with a `PeerFailed` error to its sender,
//! instead of waiting behind a dead tunnel.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use futures_util::Sink;
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::{Link, Message};

/// Most messages answered when a tunnel fails (a port's queue is bounded
/// anyway; this bounds the work).
const DRAIN_MAX: usize = 64 * 1024;

/// Answers every request owed to the failed tunnel, and every one still
/// queued at its port, with `PeerFailed`.
pub(super) async fn drain(mut owed: Vec<Message>, ring: &mut RingLink) -> usize {
    let mut answered = 0;
    let mut queued = Vec::with_capacity(64);
    loop {
        let mut answers: std::collections::VecDeque<Message> = owed
            .drain(..)
            .filter(|m| !m.kind().is_answer())
            .filter_map(|m| m.error_answer(Status::PeerFailed))
            .collect();
        answered += answers.len();
        let sent = poll_fn(|cx| ring.poll_send_batch(cx, &mut answers));
        if tokio::time::timeout(Duration::from_secs(1), sent)
            .await
            .is_err()
        {
            // The engine takes nothing either: it is stopping.
            return answered;
        }
        let _ = poll_fn(|cx| Pin::new(&mut *ring).poll_flush(cx)).await;
        queued.clear();
        let more = poll_fn(|cx| match ring.poll_recv_batch(cx, &mut queued, 64) {
            Poll::Pending => Poll::Ready(Ok(0)),
            other => other,
        })
        .await;
        match more {
            Ok(n) if n > 0 && answered < DRAIN_MAX => owed.append(&mut queued),
            _ => return answered,
        }
    }
}
