//! A bridge keeps asking a destination to flush what it took until it has:
//! a link may hold what it accepted until its flush completes, and a flush
//! that is pending once must not strand the last messages of a burst.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Sink, Stream};
use uniplane_dataplane::{bridge, channel, Link, LinkError, LinkExt, Message, Uid};

/// A link that holds what it takes until a flush, and whose every other
/// flush is pending (it wakes its task, as a link does when room comes).
struct Holding {
    held: Vec<Message>,
    delivered: Arc<Mutex<Vec<Message>>>,
    flushes: usize,
}

impl Stream for Holding {
    type Item = Result<Message, LinkError>;
    fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Pending
    }
}

impl Sink<Message> for Holding {
    type Error = LinkError;
    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        Poll::Ready(Ok(()))
    }
    fn start_send(self: Pin<&mut Self>, m: Message) -> Result<(), LinkError> {
        self.get_mut().held.push(m);
        Ok(())
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        this.flushes += 1;
        if this.flushes % 2 == 1 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.delivered.lock().unwrap().append(&mut this.held);
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.poll_flush(cx)
    }
}

impl Link for Holding {}

#[tokio::test]
async fn the_last_messages_of_a_burst_are_flushed_without_more_traffic() {
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let holding = Holding {
        held: Vec::new(),
        delivered: delivered.clone(),
        flushes: 0,
    };
    let (mut feed, far) = channel::pair(64);
    tokio::spawn(bridge(far, holding));
    let uid = |d| Uid::new([10, 0, 0, 1].into(), d);
    let mut burst: std::collections::VecDeque<Message> = (0..10)
        .map(|i| Message::send(uid(1).port(1), uid(2).port(i), Bytes::from_static(b"x")).unwrap())
        .collect();
    feed.send_batch(&mut burst).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while delivered.lock().unwrap().len() < 10 {
        assert!(
            Instant::now() < deadline,
            "{} of 10 delivered: the rest stayed in the link unflushed",
            delivered.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
