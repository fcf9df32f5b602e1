//! Shared-memory links between two processes: this test binary runs itself
//! again as the child, with `UNIPLANE_SHM_CHILD` naming the child's role.

mod common;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{LinkError, LinkExt};
use uniplane_shm::device::{DeviceConfig, DeviceRegion, Direction};
use uniplane_shm::dma::{
    bus_addr, request_shutdown, Bus, DmaDriver, DmaEngine, DmaError, DmaStatus,
};
use uniplane_shm::mailbox::{MailboxRegion, Side, WaitPolicy};
use uniplane_shm::{ShmConfig, ShmLink, ShmListener, MIN_RING_BYTES};

use common::{msg, within, ChildProcess};

/// The child's side. Does nothing unless started by a parent test.
#[test]
fn child_role() {
    let Some(role) = std::env::var_os(common::ROLE_VAR) else {
        return;
    };
    let path = std::env::var_os(common::PATH_VAR).expect("socket path");
    match role.to_str() {
        Some("dma-engine") => return dma_engine_child(&path),
        Some("mailbox-echo") => return mailbox_child(&path),
        Some("hostile-listener") => return hostile_listener_child(&path),
        _ => {}
    }
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

/// Plays device A: receives devices A and B, runs A's engine until the
/// driver in the parent writes the shutdown register.
fn dma_engine_child(path: &std::ffi::OsStr) {
    let sock = std::os::unix::net::UnixStream::connect(path).expect("connect");
    let devs = DeviceRegion::receive(sock.as_fd()).expect("devices");
    let mut bus = Bus::new();
    bus.map_device(1, &devs[0]);
    bus.map_device(2, &devs[1]);
    let mut engine = DmaEngine::new(devs[0].clone(), bus);
    engine.run();
}

/// Echoes mailbox messages until an empty one.
fn mailbox_child(path: &std::ffi::OsStr) {
    let sock = std::os::unix::net::UnixStream::connect(path).expect("connect");
    let mut buf = [0u8; 1];
    let mut fds = Vec::new();
    uniplane_shm::sys::recv_with_fds(sock.as_fd(), &mut buf, &mut fds).expect("region");
    let region = MailboxRegion::open(fds.pop().expect("one fd")).expect("open");
    let (mut tx, mut rx) = region
        .endpoint(0, Side::B, WaitPolicy::default())
        .expect("endpoint");
    let mut m = Vec::new();
    loop {
        rx.recv_deadline(&mut m, Some(Instant::now() + Duration::from_secs(20)))
            .expect("recv");
        if m.is_empty() {
            break;
        }
        tx.send(&m).expect("send");
    }
}

fn accept_within(
    l: &std::os::unix::net::UnixListener,
    secs: u64,
) -> std::os::unix::net::UnixStream {
    l.set_nonblocking(true).unwrap();
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

#[test]
fn a_dma_engine_in_another_process_moves_and_checks_transfers() {
    let path = common::socket_path("dma");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let cfg = DeviceConfig {
        name: "xproc".into(),
        memory_bytes: 8 << 20,
        ring_depth: 8,
    };
    let a = DeviceRegion::create(&cfg).unwrap();
    let b = DeviceRegion::create(&cfg).unwrap();
    let mut child = ChildProcess::spawn("dma-engine", &path);
    let sock = accept_within(&listener, 10);
    DeviceRegion::send(sock.as_fd(), &[&a, &b]).unwrap();
    let data: Vec<u8> = (0..(3 << 20) + 64).map(|i| (i * 13) as u8).collect();
    assert!(a.write_memory(0, &data));
    let mut drv = DmaDriver::new(a.clone());
    let t = Duration::from_secs(20);
    drv.transfer(
        Direction::Write,
        bus_addr(1, 0),
        bus_addr(2, 4096),
        data.len(),
        t,
    )
    .unwrap();
    let mut got = vec![0u8; data.len()];
    assert!(b.read_memory(4096, &mut got));
    assert!(got == data, "bytes differ after the cross-process DMA");
    let err = drv
        .transfer(
            Direction::Read,
            bus_addr(1, 0),
            bus_addr(2, 8 << 20),
            4096,
            t,
        )
        .unwrap_err();
    assert_eq!(
        err,
        DmaError::Failed {
            id: 5,
            status: DmaStatus::OutOfRange
        }
    );
    request_shutdown(&a);
    assert_eq!(child.wait(Duration::from_secs(10)), Some(0));
}

#[test]
fn a_mailbox_echoes_through_another_process() {
    let path = common::socket_path("mbx");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let region = MailboxRegion::create(1, 128).unwrap();
    let mut child = ChildProcess::spawn("mailbox-echo", &path);
    let sock = accept_within(&listener, 10);
    uniplane_shm::sys::send_with_fds(sock.as_fd(), b"m", &[region.memory().fd()]).unwrap();
    let (mut tx, mut rx) = region.endpoint(0, Side::A, WaitPolicy::default()).unwrap();
    let mut back = Vec::new();
    for i in 0..300usize {
        let msg: Vec<u8> = (0..1 + (i * 37) % 5000).map(|k| (k ^ i) as u8).collect();
        tx.send(&msg).unwrap();
        rx.recv_deadline(&mut back, Some(Instant::now() + Duration::from_secs(10)))
            .unwrap();
        assert_eq!(back, msg, "message {i}");
    }
    tx.send(&[]).unwrap();
    assert_eq!(child.wait(Duration::from_secs(10)), Some(0));
}

/// A listener that hands out a well-formed region, then writes a tail far
/// beyond the ring and a garbage record: what a buggy or hostile daemon
/// could do.
fn hostile_listener_child(path: &std::ffi::OsStr) {
    use uniplane_shm::sys::{memfd_name, send_with_fds, EventFd, SharedMemory};
    let listener = std::os::unix::net::UnixListener::bind(path).expect("bind");
    let (sock, _) = listener.accept().expect("accept");
    let ring = MIN_RING_BYTES;
    let len = 4096 + 2 * ring;
    let mem = SharedMemory::create(&memfd_name("hostile"), len).expect("memfd");
    mem.write(0, b"1MHSPINU");
    mem.write(8, &1u32.to_le_bytes());
    mem.write(12, &(ring as u32).to_le_bytes());
    let mut hello = [0u8; 32];
    hello[0..8].copy_from_slice(b"1MHSPINU");
    hello[8..12].copy_from_slice(&1u32.to_le_bytes());
    hello[12..16].copy_from_slice(&(ring as u32).to_le_bytes());
    hello[16..24].copy_from_slice(&(len as u64).to_le_bytes());
    let bells: Vec<EventFd> = (0..4).map(|_| EventFd::new().expect("eventfd")).collect();
    let mut fds = vec![mem.fd()];
    fds.extend(bells.iter().map(|b| b.as_fd()));
    send_with_fds(sock.as_fd(), &hello, &fds).expect("hello");
    // Ring 1 (listener -> connector): control block at 2048, data after ring 0.
    let data = 4096 + ring;
    // First a record that is not a message, published properly...
    mem.write(data, &8u32.to_le_bytes());
    mem.write(data + 8, b"garbage!");
    let tail = mem.atomic_u64(2048).expect("tail");
    tail.store(16, std::sync::atomic::Ordering::Release);
    bells[2].ring();
    std::thread::sleep(Duration::from_millis(200));
    // ...then a tail that claims more than the ring holds.
    tail.store(1 << 40, std::sync::atomic::Ordering::Release);
    bells[2].ring();
    // Stay alive until the parent hangs up.
    let mut b = [0u8; 1];
    let _ = std::io::Read::read(&mut &sock, &mut b);
}

#[tokio::test]
async fn a_hostile_listener_gets_a_failed_link_not_a_crash() {
    let path = common::socket_path("hostile");
    let mut child = ChildProcess::spawn("hostile-listener", &path);
    let start = Instant::now();
    let mut link = loop {
        match ShmLink::connect(&path).await {
            Ok(l) => break l,
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("connect: {e}"),
        }
    };
    let end = within(10, link.next()).await;
    assert!(
        matches!(end, Some(Err(LinkError::PeerFailed(_)))),
        "{end:?}"
    );
    assert_eq!(link.stats().malformed, 1, "the garbage record was counted");
    assert!(within(10, link.next()).await.is_none());
    drop(link);
    assert_eq!(child.wait(Duration::from_secs(10)), Some(0));
}
