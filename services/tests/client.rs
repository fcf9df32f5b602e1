//! The client library against a real daemon in this process: closing on
//! drop, PUSH boundaries through the engine, and memory windows that one
//! session writes and reads in another.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use uniplane_client::protocol::Request;
use uniplane_client::{Client, ClientError, Session};
use uniplane_dataplane::wire::Status;
use uniplane_services::client::embedded;
use uniplane_services::config::Config;
use uniplane_services::Daemon;

const CONFIG: &str = r#"
[server]
id = "127.0.0.1"
peer_listen = "127.0.0.1:0"
"#;

/// A daemon in a fresh runtime directory, and two attached sessions.
struct Setup {
    dir: PathBuf,
    daemon: Daemon,
    a: Session,
    b: Session,
}

impl Setup {
    async fn new(name: &str) -> Setup {
        let dir =
            std::env::temp_dir().join(format!("uniplane-client-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (daemon, client) = embedded(Config::parse(CONFIG, "test").unwrap(), &dir)
            .await
            .unwrap();
        let a = client.attach("a").await.unwrap();
        let b = Client::connect(daemon.runtime_dir())
            .await
            .unwrap()
            .attach("b")
            .await
            .unwrap();
        Setup { dir, daemon, a, b }
    }

    async fn connections(&self) -> usize {
        let observer = Client::connect(self.daemon.runtime_dir()).await.unwrap();
        let conns = observer.request(&Request::Connections).await.unwrap();
        conns.as_array().map(Vec::len).unwrap_or_default()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_connection_closes_it_at_the_far_end() {
    let s = Setup::new("drop").await;
    let mut listener = s.b.listen(80).await.unwrap();
    let conn = s.a.connect(s.b.uid().port(80)).await.unwrap();
    let mut accepted = tokio::time::timeout(Duration::from_secs(2), listener.accept())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.connections().await, 1);

    drop(conn);
    let end = tokio::time::timeout(Duration::from_secs(2), accepted.recv())
        .await
        .expect("the far end hears of the close");
    assert!(end.is_none(), "{end:?}");
    // The far end hears first (in band, behind the data); the daemon
    // removes the connection once the far end has acknowledged.
    tokio::time::timeout(Duration::from_secs(2), async {
        while s.connections().await != 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the daemon forgot it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_boundary_survives_the_engine_and_ends_one_unit() {
    let s = Setup::new("push").await;
    let mut listener = s.b.listen(80).await.unwrap();
    let mut conn = s.a.connect(s.b.uid().port(80)).await.unwrap();
    let mut accepted = tokio::time::timeout(Duration::from_secs(2), listener.accept())
        .await
        .unwrap()
        .unwrap();
    conn.send_bytes(Bytes::from_static(b"one ")).await.unwrap();
    conn.send_bytes(Bytes::from_static(b"two ")).await.unwrap();
    conn.send_push(Bytes::from_static(b"three")).await.unwrap();
    conn.send_push(Bytes::from_static(b"four")).await.unwrap();
    let unit = tokio::time::timeout(Duration::from_secs(2), accepted.recv_until_push())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(unit.as_ref(), b"one two three");
    let unit = accepted.recv_until_push().await.unwrap().unwrap();
    assert_eq!(unit.as_ref(), b"four");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_writes_into_another_sessions_window_and_reads_it_back() {
    let s = Setup::new("window").await;
    let window = s.b.register_window(64);
    assert_eq!(window.address(), s.b.uid().at(0));

    s.a.write(window.at(8), Bytes::from_static(b"written by a"))
        .await
        .unwrap();
    assert_eq!(window.read(8, 12).as_deref(), Some(&b"written by a"[..]));

    assert!(window.write(32, b"set by b"));
    let back = s.a.read(window.at(32), 8).await.unwrap();
    assert_eq!(back.as_ref(), b"set by b");

    // Past the end: an error completion, and the window is untouched.
    let before = window.to_vec();
    let past =
        s.a.write(window.at(60), Bytes::from_static(b"too long"))
            .await;
    assert!(
        matches!(past, Err(ClientError::Status(Status::OutOfRange))),
        "{past:?}"
    );
    let past = s.a.read(window.at(60), 8).await;
    assert!(
        matches!(past, Err(ClientError::Status(Status::OutOfRange))),
        "{past:?}"
    );
    assert_eq!(window.to_vec(), before);
}

/// Data sent at once after `connect` answers may overtake the daemon's
/// notice of the connection (they reach the listener from two engine
/// inputs): it is kept and comes first on the accepted connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_sent_before_the_listener_hears_of_the_connection_is_kept() {
    let s = Setup::new("early").await;
    let mut listener = s.b.listen(80).await.unwrap();
    for round in 0..100u32 {
        let mut conn = s.a.connect(s.b.uid().port(80)).await.unwrap();
        conn.send_push(Bytes::from(round.to_be_bytes().to_vec()))
            .await
            .unwrap();
        let mut accepted = tokio::time::timeout(Duration::from_secs(2), listener.accept())
            .await
            .expect("accepted in time")
            .unwrap();
        let first = tokio::time::timeout(Duration::from_secs(2), accepted.recv_until_push())
            .await
            .unwrap_or_else(|_| panic!("round {round}: the first message was lost"))
            .unwrap()
            .unwrap();
        assert_eq!(first.as_ref(), round.to_be_bytes(), "round {round}");
    }
}

/// Everything sent before a connection is dropped arrives before the far
/// end sees it end: the close travels behind the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_sent_before_a_close_arrives_before_the_end() {
    let s = Setup::new("close-order").await;
    let mut listener = s.b.listen(80).await.unwrap();
    for round in 0..50u32 {
        let mut conn = s.a.connect(s.b.uid().port(80)).await.unwrap();
        let mut accepted = tokio::time::timeout(Duration::from_secs(2), listener.accept())
            .await
            .expect("accepted in time")
            .unwrap();
        for i in 0..64u32 {
            conn.send_bytes(Bytes::from(i.to_be_bytes().to_vec()))
                .await
                .unwrap();
        }
        drop(conn);
        let mut got = 0u32;
        loop {
            let next = tokio::time::timeout(Duration::from_secs(2), accepted.recv())
                .await
                .unwrap_or_else(|_| panic!("round {round}: no end after {got} messages"));
            match next {
                Some(Ok(m)) => {
                    assert_eq!(m.payload().as_ref(), got.to_be_bytes(), "round {round}");
                    got += 1;
                }
                Some(Err(e)) => panic!("round {round}: {e} after {got}"),
                None => break,
            }
        }
        assert_eq!(got, 64, "round {round}: messages lost before the end");
    }
}

/// A burst a little larger than the shared-memory rings (1 MiB each
/// way) on a fresh pair of sessions arrives whole: the message a full
/// ring held back goes out once there is room, with nothing sent after
/// it to push it along. Around one and two rings' worth of 60 KiB
/// messages, each on fresh sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_burst_larger_than_the_rings_arrives_whole() {
    for chunks in [16usize, 17, 18, 19, 34, 35, 36] {
        let s = Setup::new(&format!("burst-{chunks}")).await;
        let mut listener = s.b.listen(80).await.unwrap();
        let mut conn = s.a.connect(s.b.uid().port(80)).await.unwrap();
        let mut accepted = tokio::time::timeout(Duration::from_secs(2), listener.accept())
            .await
            .unwrap()
            .unwrap();
        let chunk = Bytes::from(vec![1u8; 60 * 1024]);
        let sending = tokio::spawn(async move {
            for _ in 1..chunks {
                conn.send_bytes(chunk.clone()).await.unwrap();
            }
            conn.send_push(chunk).await.unwrap();
            conn
        });
        let mut got = 0;
        for n in 0..chunks {
            let Ok(m) = tokio::time::timeout(Duration::from_secs(3), accepted.recv()).await else {
                let observer = Client::connect(s.daemon.runtime_dir()).await.unwrap();
                let stats = observer.request(&Request::Stats).await.unwrap();
                panic!("{chunks} chunks: stalled after {n} messages: {stats:#}")
            };
            got += m.unwrap().unwrap().payload().len();
        }
        assert_eq!(got, chunks * 60 * 1024);
        let _ = sending.await;
    }
}
