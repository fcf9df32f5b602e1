//! The bridge between a tunnel's stack link and its plane port, watched:
//! a tunnel that owes messages and moves none of them for the failure
//! timeout has failed, like a peer silent for as long. Its end is
//! reported (the core closes the connections through it, telling their
//! owners, and opens it again when the peer returns), and what was queued
//! for it is answered, each request with a `PeerFailed` error to its
//! sender, instead of waiting behind a dead tunnel.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use futures_util::Sink;
use std::future::Future;
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::{BoxLink, Link, LinkError, Message, Pump};

/// Most messages answered when a tunnel fails (a port's queue is bounded
/// anyway; this bounds the work).
const DRAIN_MAX: usize = 64 * 1024;

/// How a watched bridge ended.
#[derive(Debug)]
pub(super) struct Ended {
    /// Why: `None` when the stack link ended cleanly.
    pub error: Option<String>,
    /// Requests answered with `PeerFailed`.
    pub answered: usize,
}

/// Bridges `link` and `ring` until either ends, the link fails, or it
/// owes messages and takes none for `stall`.
pub(super) async fn bridge(mut link: BoxLink, mut ring: RingLink, stall: Duration) -> Ended {
    let mut out = Pump::default();
    let mut inn = Pump::default();
    let mut timer: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let result: Result<(), LinkError> = poll_fn(|cx| loop {
        let moved_out = out.poll(cx, &mut ring, &mut link)?;
        let moved_in = inn.poll(cx, &mut link, &mut ring)?;
        if out.ended() || inn.ended() {
            return Poll::Ready(Ok(()));
        }
        if moved_out || (out.owed() == 0 && out.flushed()) {
            timer = None;
        } else {
            let t = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
            if t.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(LinkError::PeerFailed(format!(
                    "the tunnel took nothing for {stall:?} with {} messages owed",
                    out.owed()
                ))));
            }
        }
        if !moved_out && !moved_in {
            return Poll::Pending;
        }
    })
    .await;
    let error = result.err().map(|e| e.to_string());
    let answered = if error.is_some() {
        drain(out.take_owed().into_iter().collect(), &mut ring).await
    } else {
        0
    };
    Ended { error, answered }
}

/// Answers every request owed to the failed tunnel, and every one still
/// queued at its port, with `PeerFailed`.
async fn drain(mut owed: Vec<Message>, ring: &mut RingLink) -> usize {
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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use uniplane_dataplane::channel::pair;
    use uniplane_dataplane::{Endpoint, Uid};

    fn msg(i: u8) -> Message {
        Message::send(
            Endpoint {
                uid: "10.0.0.1:5".parse::<Uid>().unwrap(),
                port: 1,
            },
            Endpoint {
                uid: "10.0.0.2:1".parse::<Uid>().unwrap(),
                port: 7,
            },
            Bytes::from(vec![i; 8]),
        )
        .unwrap()
    }

    /// A tunnel that stops taking messages fails after the stall time (on
    /// paused time), and every request owed or queued is answered with
    /// PeerFailed to its sender.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_tunnel_fails_and_answers_what_it_owed() {
        // The tunnel: a channel of capacity 4 nobody reads.
        let (tunnel, _far) = pair(4);
        let (ring, mut engine) = uniplane_dataplane::ring::ring_link(64);
        for i in 0..20 {
            engine.output.push(msg(i)).unwrap();
        }
        engine.output.flush();
        let ended = bridge(Box::new(tunnel), ring, Duration::from_millis(300)).await;
        assert!(ended.error.unwrap().contains("took nothing"));
        // 4 went into the tunnel; 16 come back as errors.
        assert_eq!(ended.answered, 16);
        let mut back = Vec::new();
        engine.input.pop_into(&mut back, 64);
        assert_eq!(back.len(), 16);
        for m in &back {
            assert!(m.kind().is_answer());
            assert_eq!(m.header().status(), Status::PeerFailed);
            assert_eq!(m.header().dst.to_string(), "10.0.0.1:5");
        }
    }
}
