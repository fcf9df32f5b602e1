//! The `tcp` stack on loopback: framing, coalescing, large payloads,
//! backpressure and the end of a stream.

mod common;

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use common::{msg, within};
use futures_util::{Sink, SinkExt, StreamExt};
use uniplane_dataplane::{LinkError, LinkExt, Locator, StackError};
use uniplane_stacks::tcp::{TcpConfig, TcpStack};

async fn pair(stack: &TcpStack) -> (uniplane_stacks::tcp::TcpLink, uniplane_stacks::tcp::TcpLink) {
    let mut listener = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = Locator::Socket(listener.local_addr().unwrap());
    let client = within(5, stack.connect_link(&addr)).await.unwrap();
    let server = within(5, listener.next()).await.unwrap().unwrap();
    (client, server)
}

#[tokio::test]
async fn messages_of_every_size_arrive_in_order_and_whole() {
    let stack = TcpStack::new();
    let (mut a, mut b) = pair(&stack).await;
    let sizes = [4usize, 100, 2047, 2048, 9000, 65535, 10];
    let mut batch: VecDeque<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| msg(i as u32, s))
        .collect();
    let expect: Vec<_> = batch.iter().cloned().collect();
    let sender = tokio::spawn(async move {
        a.send_batch(&mut batch).await.unwrap();
        a.close().await.unwrap();
        a
    });
    let mut got = Vec::new();
    while let Some(m) = within(10, b.next()).await {
        got.push(m.unwrap());
    }
    assert_eq!(got, expect);
    sender.await.unwrap();
}

#[tokio::test]
async fn a_burst_of_small_messages_is_coalesced_and_kept_in_order() {
    let (mut a, mut b) = pair(&TcpStack::new()).await;
    let n = 20_000u32;
    let sender = tokio::spawn(async move {
        let mut batch: VecDeque<_> = (0..n).map(|i| msg(i, 32)).collect();
        a.send_batch(&mut batch).await.unwrap();
        a
    });
    let mut next = 0;
    let mut out = Vec::new();
    while next < n {
        out.clear();
        let k = within(10, b.recv_batch(&mut out, 512)).await.unwrap();
        assert!(k > 0);
        for m in &out {
            assert_eq!(m.header().seqnum, next);
            next += 1;
        }
    }
    sender.await.unwrap();
}

#[tokio::test]
async fn a_stalled_receiver_makes_the_sender_pending_with_bounded_memory() {
    let stack = TcpStack::with_config(TcpConfig {
        coalesce_bytes: 64 << 10,
        ..TcpConfig::default()
    });
    let (mut a, mut b) = pair(&stack).await;
    let waker = futures_util::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut sent = 0u32;
    // Fill until the link pushes back; the kernel buffers are finite.
    for _ in 0..10_000_000 {
        match Pin::new(&mut a).poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => {
                Pin::new(&mut a).start_send(msg(sent, 1000)).unwrap();
                sent += 1;
            }
            Poll::Pending => break,
            Poll::Ready(Err(e)) => panic!("{e}"),
        }
    }
    assert!(Pin::new(&mut a).poll_ready(&mut cx).is_pending());
    assert!(a.queued_bytes() < (64 << 10) + 2000, "{}", a.queued_bytes());
    // Nothing was lost: the receiver gets every message once it reads.
    let reader = tokio::spawn(async move {
        for i in 0..sent {
            let m = within(10, b.next()).await.unwrap().unwrap();
            assert_eq!(m.header().seqnum, i);
        }
    });
    within(10, a.flush()).await.unwrap();
    reader.await.unwrap();
}

#[tokio::test]
async fn garbage_on_the_stream_fails_the_link() {
    use tokio::io::AsyncWriteExt;
    let stack = TcpStack::new();
    let mut listener = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
    let mut raw = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let mut link = within(5, listener.next()).await.unwrap().unwrap();
    raw.write_all(&[0xee; 64]).await.unwrap();
    let err = within(5, link.next()).await.unwrap().unwrap_err();
    assert!(matches!(err, LinkError::Malformed(_)), "{err}");
}

#[tokio::test]
async fn connecting_where_nothing_listens_is_refused() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = TcpStack::new()
        .connect_link(&Locator::Socket(port))
        .await
        .unwrap_err();
    assert!(matches!(err, StackError::Refused(_)), "{err}");
}

#[tokio::test]
async fn tcp_by_name_is_reliable_and_ordered() {
    let caps = uniplane_stacks::by_name("tcp").unwrap().capabilities();
    assert!(caps.reliable && caps.ordered);
}
