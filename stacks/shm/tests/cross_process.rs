//! Shared-memory links between two processes: this test binary runs itself
//! again as the child, with `UNIPLANE_SHM_CHILD` naming the child's role.

mod common;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{LinkError, LinkExt};
use uniplane_shm::{ShmConfig, ShmLink, ShmListener, MIN_RING_BYTES};

use common::{msg, within, ChildProcess};

/// The child's side. Does nothing unless started by a parent test.
#[test]
fn child_role() {
    let Some(role) = std::env::var_os(common::ROLE_VAR) else {
        return;
    };
    let path = std::env::var_os(common::PATH_VAR).expect("socket path");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut link = within(10, ShmLink::connect(&path)).await.expect("connect");
        match role.to_str() {
            Some("echo") => {
                let mut batch = Vec::new();
                loop {
                    batch.clear();
                    let n = within(20, link.recv_batch(&mut batch, 64))
                        .await
                        .expect("recv");
                    if n == 0 {
                        break;
                    }
                    let mut out: std::collections::VecDeque<_> = batch.drain(..).collect();
                    link.send_batch(&mut out).await.expect("send");
                }
                link.close().await.expect("close");
            }
            Some("crash") => {
                let _ = within(10, link.next()).await;
                // Leave without closing: the parent must notice.
                std::process::exit(3);
            }
            other => panic!("unknown role {other:?}"),
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_every_size_echo_through_another_process() {
    let path = common::socket_path("echo");
    let cfg = ShmConfig {
        ring_bytes: MIN_RING_BYTES,
        ..ShmConfig::default()
    };
    let listener = ShmListener::bind_with(&path, cfg).unwrap();
    let mut child = ChildProcess::spawn("echo", &path);
    let link = within(10, listener.accept()).await.unwrap();
    let (mut tx, mut rx) = link.split();
    const N: u32 = 5000;
    let sizes = [0usize, 8, 64, 1536, 9600, 65535];
    let size = move |i: u32| sizes[i as usize % sizes.len()];
    let sender = tokio::spawn(async move {
        for i in 0..N {
            tx.feed(msg(i, size(i))).await.unwrap();
            if i % 16 == 15 {
                tx.flush().await.unwrap();
            }
        }
        tx.close().await.unwrap();
        tx
    });
    for i in 0..N {
        let m = within(20, rx.next()).await.unwrap().unwrap();
        assert_eq!(m, msg(i, size(i)), "message {i}");
    }
    assert!(
        within(10, rx.next()).await.is_none(),
        "child closed cleanly"
    );
    let _tx = sender.await.unwrap();
    assert_eq!(child.wait(Duration::from_secs(10)), Some(0));
}

#[tokio::test]
async fn a_child_that_dies_without_closing_fails_the_link() {
    let path = common::socket_path("crash");
    let listener = ShmListener::bind(&path).unwrap();
    let mut child = ChildProcess::spawn("crash", &path);
    let mut link = within(10, listener.accept()).await.unwrap();
    link.send(msg(1, 10)).await.unwrap();
    let end = within(10, link.next()).await;
    assert!(
        matches!(end, Some(Err(LinkError::PeerFailed(_)))),
        "{end:?}"
    );
    assert!(within(10, link.next()).await.is_none());
    assert!(matches!(
        link.send(msg(2, 10)).await,
        Err(LinkError::Closed)
    ));
    assert_eq!(child.wait(Duration::from_secs(10)), Some(3));
}
