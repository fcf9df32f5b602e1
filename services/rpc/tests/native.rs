//! The native RPC on a real embedded daemon: caller and server are two
//! sessions of one daemon, so every frame crosses the shared-memory data
//! path and the engine. Every wait has a deadline.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tower::{Layer, Service, ServiceExt};
use uniplane_client::{Connection, Session};
use uniplane_rpc::frame::{self, Flags, Frame, Head, Kind};
use uniplane_rpc::identity::AuthorizeLayer;
use uniplane_rpc::{
    Call, Client, ClientOptions, Code, Reply, Server, ServerCall, ServerOptions, Status,
};
use uniplane_services::client::embedded;
use uniplane_services::config::Config;
use uniplane_services::Daemon;

const CONFIG: &str = r#"
[server]
id = "127.0.0.1"
peer_listen = "127.0.0.1:0"
"#;

const PORT: u16 = 50;
const WAIT: Duration = Duration::from_secs(5);

struct Setup {
    daemon: Daemon,
    server: Option<Server>,
    server_session: Option<Session>,
    caller: Session,
    dir: PathBuf,
    /// Handlers of `/t/Sleep` report here when they start and when their
    /// future is dropped.
    events: mpsc::UnboundedReceiver<&'static str>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.daemon.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reports "dropped" when the handler's future goes.
struct DropGuard(mpsc::UnboundedSender<&'static str>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        let _ = self.0.send("dropped");
    }
}

type Handler = tower::util::BoxCloneSyncService<ServerCall, Reply, Status>;

/// The test service: one method per behaviour under test.
fn service(events: mpsc::UnboundedSender<&'static str>) -> Handler {
    tower::util::BoxCloneSyncService::new(tower::service_fn(move |mut call: ServerCall| {
        let events = events.clone();
        async move {
            match call.method() {
                "/t/Echo" => Ok(Reply::Unary(call.into_message().await?)),
                "/t/Peer" => Ok(Reply::Unary(Bytes::from(call.peer().uid.to_string()))),
                "/t/Sleep" => {
                    let _guard = DropGuard(events.clone());
                    let _ = events.send("started");
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(Reply::Unary(Bytes::new()))
                }
                "/t/Slow" => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok(Reply::Unary(Bytes::from_static(b"slow done")))
                }
                "/t/Count" => {
                    let m = call.into_message().await?;
                    let n = u32::from_be_bytes(m[..4].try_into().unwrap_or([0; 4]));
                    Ok(Reply::stream(futures_util::stream::iter(
                        (0..n).map(|i| Ok(Bytes::copy_from_slice(&i.to_be_bytes()))),
                    )))
                }
                "/t/Forever" => Ok(Reply::stream(
                    futures_util::stream::iter([Ok(Bytes::from_static(b"first"))])
                        .chain(futures_util::stream::pending()),
                )),
                "/t/Concat" => {
                    let mut all = BytesMut::new();
                    while let Some(m) = call.message().await {
                        all.put(m?);
                    }
                    Ok(Reply::Unary(all.freeze()))
                }
                "/t/Bidi" => Ok(Reply::stream(call.into_stream())),
                other => Err(Status::unimplemented(other)),
            }
        }
    }))
}

async fn setup(name: &str, options: ServerOptions) -> Setup {
    setup_with(name, options, |s| s).await
}

async fn setup_with(
    name: &str,
    options: ServerOptions,
    wrap: impl Fn(Handler) -> Handler + Send + 'static,
) -> Setup {
    let dir = std::env::temp_dir().join(format!("uniplane-rpc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (daemon, client) = embedded(Config::parse(CONFIG, name).unwrap(), &dir)
        .await
        .unwrap();
    let server_session = client.attach("server").await.unwrap();
    let listener = server_session.listen(PORT).await.unwrap();
    let (tx, events) = mpsc::unbounded_channel();
    let server = uniplane_rpc::spawn(listener, move |_peer| wrap(service(tx.clone())), options);
    let caller = uniplane_services::client::Client::connect(daemon.runtime_dir())
        .await
        .unwrap()
        .attach("caller")
        .await
        .unwrap();
    Setup {
        daemon,
        server: Some(server),
        server_session: Some(server_session),
        caller,
        dir,
        events,
    }
}

impl Setup {
    fn server_endpoint(&self) -> uniplane_dataplane::Endpoint {
        self.server_session.as_ref().unwrap().uid().port(PORT)
    }

    async fn connection(&self) -> Connection {
        self.caller.connect(self.server_endpoint()).await.unwrap()
    }

    /// A connection for raw frames, after the server's hello.
    async fn raw_connection(&self) -> Connection {
        let mut conn = self.connection().await;
        let hello = recv_any_frame(&mut conn).await;
        assert_eq!(
            (hello.kind(), hello.tag(), hello.status()),
            (Kind::Status, 0, Code::Ok)
        );
        conn
    }

    async fn client(&self, options: ClientOptions) -> Client {
        Client::new(self.connection().await, options)
    }

    async fn event(&mut self) -> &'static str {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("an event in time")
            .expect("events open")
    }
}

async fn unary(client: &mut Client, call: Call) -> Result<Bytes, Status> {
    tokio::time::timeout(WAIT, client.ready().await?.call(call))
        .await
        .expect("an answer in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_call_gets_its_answer() {
    let s = setup("unary", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let answer = unary(&mut client, Call::new("/t/Echo", Bytes::from("hello"))).await;
    assert_eq!(answer.unwrap(), "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_in_flight_each_get_their_own_answer() {
    let s = setup("many", ServerOptions::default()).await;
    let client = s.client(ClientOptions::default()).await;
    let calls = (0..500u32).map(|i| {
        let mut c = client.clone();
        async move {
            let body = Bytes::from(format!("call {i} {}", "x".repeat(i as usize % 97)));
            let got = c
                .ready()
                .await?
                .call(Call::new("/t/Echo", body.clone()))
                .await?;
            Ok::<_, Status>((got, body))
        }
    });
    let results = tokio::time::timeout(WAIT, futures_util::future::join_all(calls))
        .await
        .expect("all answered in time");
    for r in results {
        let (got, want) = r.unwrap();
        assert_eq!(got, want);
    }
    assert_eq!(client.in_flight(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_ready_is_pending_while_every_slot_is_in_flight() {
    let s = setup("ready", ServerOptions::default()).await;
    let mut client = s
        .client(ClientOptions {
            max_in_flight: 2,
            ..ClientOptions::default()
        })
        .await;
    let first = client
        .ready()
        .await
        .unwrap()
        .call(Call::new("/t/Slow", Bytes::new()));
    let second = client
        .ready()
        .await
        .unwrap()
        .call(Call::new("/t/Slow", Bytes::new()));
    let blocked = tokio::time::timeout(Duration::from_millis(100), client.ready()).await;
    assert!(blocked.is_err(), "a third call was admitted");
    assert_eq!(first.await.unwrap(), "slow done");
    drop(second);
    tokio::time::timeout(WAIT, client.ready())
        .await
        .expect("a slot frees")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_fails_and_the_server_drops_it() {
    let mut s = setup("deadline", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let warm = unary(&mut client, Call::new("/t/Echo", Bytes::from("warm"))).await;
    assert!(warm.is_ok());
    let call = Call::new("/t/Sleep", Bytes::new()).timeout(Duration::from_millis(200));
    let err = unary(&mut client, call).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert_eq!(s.event().await, "started");
    assert_eq!(s.event().await, "dropped");
}

/// The deadline travels with the request: a caller that never cancels
/// (raw frames) still gets DeadlineExceeded from the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_enforces_the_deadline_it_was_sent() {
    let mut s = setup("server-deadline", ServerOptions::default()).await;
    let mut conn = s.raw_connection().await;
    let head = Head {
        flags: Flags::MESSAGE | Flags::END,
        deadline_us: 30_000,
        ..Head::new(Kind::Request, 9)
    };
    send_frame(&mut conn, &head, b"/t/Sleep", b"").await;
    let f = recv_frame(&mut conn).await;
    assert_eq!((f.kind(), f.tag()), (Kind::Status, 9));
    assert_eq!(f.status(), Code::DeadlineExceeded);
    assert_eq!(s.event().await, "started");
    assert_eq!(s.event().await, "dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_is_cancelled_at_the_server() {
    let mut s = setup("cancel", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let call = client
        .ready()
        .await
        .unwrap()
        .call(Call::new("/t/Sleep", Bytes::new()));
    let pending = tokio::spawn(call);
    assert_eq!(s.event().await, "started");
    pending.abort();
    assert_eq!(s.event().await, "dropped", "the server dropped the call");
    // The connection goes on.
    let answer = unary(&mut client, Call::new("/t/Echo", Bytes::from("after"))).await;
    assert_eq!(answer.unwrap(), "after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stream_delivers_every_message_in_order_past_many_windows() {
    let s = setup("server-stream", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let n = 1000u32;
    let mut stream = client
        .server_streaming(Call::new(
            "/t/Count",
            Bytes::copy_from_slice(&n.to_be_bytes()),
        ))
        .await
        .unwrap();
    for i in 0..n {
        let m = tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("a message in time")
            .expect("not ended")
            .unwrap();
        assert_eq!(m[..], i.to_be_bytes());
        if i % 200 == 0 {
            // A slow reader: the server waits for credit, nothing is lost.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_is_answered_with_everything_it_sent() {
    let s = setup("client-stream", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let (mut tx, answer) = client.client_streaming("/t/Concat", None).await.unwrap();
    let mut want = Vec::new();
    for i in 0..300u32 {
        let m = Bytes::from(format!("{i},"));
        want.extend_from_slice(&m);
        tokio::time::timeout(WAIT, tx.send(m))
            .await
            .expect("credit in time")
            .unwrap();
    }
    tx.finish();
    let got = tokio::time::timeout(WAIT, answer).await.unwrap().unwrap();
    assert_eq!(got[..], want[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bidirectional_stream_echoes_each_message() {
    let s = setup("bidi", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let (mut tx, mut rx) = client.bidi("/t/Bidi", None).await.unwrap();
    for i in 0..200u32 {
        let m = Bytes::from(format!("m{i}"));
        tx.send(m.clone()).await.unwrap();
        let back = tokio::time::timeout(WAIT, rx.message())
            .await
            .expect("an echo in time")
            .unwrap()
            .unwrap();
        assert_eq!(back, m);
    }
    tx.finish();
    assert!(tokio::time::timeout(WAIT, rx.message())
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_method_is_unimplemented() {
    let s = setup("unknown", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let err = unary(&mut client, Call::new("/t/Nope", Bytes::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_is_resource_exhausted_and_the_connection_goes_on() {
    // Sizes stay below the shared-memory ring's 1 MiB (see
    // `raw_first_burst_larger_than_the_ring_arrives`).
    let server = ServerOptions {
        max_message: 256 << 10,
        ..ServerOptions::default()
    };
    let s = setup("oversized", server).await;
    let mut client = s
        .client(ClientOptions {
            max_message: 8 << 20,
            ..ClientOptions::default()
        })
        .await;
    // Just under the limit passes, in many chunks.
    let fits = Bytes::from(vec![9u8; (256 << 10) - 100]);
    let back = unary(&mut client, Call::new("/t/Echo", fits.clone())).await;
    assert_eq!(back.unwrap(), fits);
    let big = Bytes::from(vec![7u8; 600_000]);
    let err = unary(&mut client, Call::new("/t/Echo", big))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    let back = unary(&mut client, Call::new("/t/Echo", fits.clone())).await;
    assert_eq!(back.unwrap(), fits, "the connection goes on");
    // The client's own limit is checked before sending.
    let mut small = s
        .client(ClientOptions {
            max_message: 10,
            ..ClientOptions::default()
        })
        .await;
    let err = unary(&mut small, Call::new("/t/Echo", Bytes::from(vec![0; 11])))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_mid_stream_ends_the_stream_with_unavailable() {
    let mut s = setup("dies", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let mut stream = client
        .server_streaming(Call::new("/t/Forever", Bytes::new()))
        .await
        .unwrap();
    let first = tokio::time::timeout(WAIT, stream.message()).await.unwrap();
    assert_eq!(first.unwrap().unwrap(), "first");
    // The server process goes: its task and its session.
    s.server.take().unwrap().shutdown(Duration::ZERO).await;
    drop(s.server_session.take());
    let end = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("the stream ends in time");
    match end {
        Some(Err(e)) => assert_eq!(e.code(), Code::Unavailable, "{e}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let err = tokio::time::timeout(WAIT, client.ready())
        .await
        .expect("poll_ready answers in time")
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
}

async fn send_frame(conn: &mut Connection, head: &Head, method: &[u8], payload: &[u8]) {
    let mut b = BytesMut::new();
    frame::encode(head, method, payload, &mut b);
    conn.send_push(b.freeze()).await.unwrap();
}

async fn recv_any_frame(conn: &mut Connection) -> Frame {
    let unit = tokio::time::timeout(WAIT, conn.recv_until_push())
        .await
        .expect("a frame in time")
        .expect("connection open")
        .unwrap();
    Frame::parse(unit).unwrap()
}

/// The next frame that is not a hello.
async fn recv_frame(conn: &mut Connection) -> Frame {
    loop {
        let f = recv_any_frame(conn).await;
        if (f.kind(), f.tag(), f.status()) != (Kind::Status, 0, Code::Ok) {
            return f;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_gets_a_typed_status_for_its_call() {
    let s = setup("malformed", ServerOptions::default()).await;
    let mut conn = s.raw_connection().await;
    // A REQUEST whose status byte is set: the call is refused, by tag.
    let head = Head {
        flags: Flags::MESSAGE | Flags::END,
        status: Code::Aborted,
        ..Head::new(Kind::Request, 5)
    };
    send_frame(&mut conn, &head, b"/t/Echo", b"x").await;
    let f = recv_frame(&mut conn).await;
    assert_eq!(
        (f.kind(), f.tag(), f.status()),
        (Kind::Status, 5, Code::Internal)
    );
    // The connection still serves good frames.
    let head = Head {
        flags: Flags::MESSAGE | Flags::END,
        ..Head::new(Kind::Request, 6)
    };
    send_frame(&mut conn, &head, b"/t/Echo", b"ok").await;
    let f = recv_frame(&mut conn).await;
    assert_eq!((f.tag(), f.status()), (6, Code::Ok));
    assert_eq!(f.payload(), "ok");
    // Bytes that are no frame at all: a connection-level status, then
    // the server closes the connection.
    conn.send_push(Bytes::from_static(b"garbage!"))
        .await
        .unwrap();
    let f = recv_frame(&mut conn).await;
    assert_eq!(
        (f.kind(), f.tag(), f.status()),
        (Kind::Status, 0, Code::Internal)
    );
    // It waits for the caller to close (the close must not overtake the
    // status), at most its linger time.
    let end = tokio::time::timeout(WAIT, conn.recv())
        .await
        .expect("closed in time");
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_sees_the_callers_uid_and_the_identity_layer_refuses_others() {
    let s = setup("identity", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let who = unary(&mut client, Call::new("/t/Peer", Bytes::new())).await;
    assert_eq!(who.unwrap(), s.caller.uid().to_string());

    // Only the setup's caller may call; another session of the same
    // daemon is refused before the service sees the call.
    let allowed = Arc::new(std::sync::Mutex::new(None));
    let strict = setup_with("identity-deny", ServerOptions::default(), {
        let allowed = allowed.clone();
        move |svc| {
            let allowed = allowed.clone();
            tower::util::BoxCloneSyncService::new(
                AuthorizeLayer::new(move |peer| Some(peer.uid) == *allowed.lock().unwrap())
                    .layer(svc),
            )
        }
    })
    .await;
    *allowed.lock().unwrap() = Some(strict.caller.uid());
    let mut friend = strict.client(ClientOptions::default()).await;
    let ok = unary(&mut friend, Call::new("/t/Echo", Bytes::from("hi"))).await;
    assert_eq!(ok.unwrap(), "hi");
    let intruder = uniplane_services::client::Client::connect(strict.daemon.runtime_dir())
        .await
        .unwrap()
        .attach("intruder")
        .await
        .unwrap();
    let conn = intruder.connect(strict.server_endpoint()).await.unwrap();
    let mut other = Client::new(conn, ClientOptions::default());
    let err = unary(&mut other, Call::new("/t/Echo", Bytes::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_calls_in_flight_and_refuses_new_ones() {
    let mut s = setup("shutdown", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    let slow = client
        .ready()
        .await
        .unwrap()
        .call(Call::new("/t/Slow", Bytes::new()));
    let slow = tokio::spawn(slow);
    // Let the request reach the server before it stops.
    let echoed = unary(&mut client, Call::new("/t/Echo", Bytes::from("x"))).await;
    assert!(echoed.is_ok());
    let server = s.server.take().unwrap();
    let token = server.shutdown_token();
    let stopping = tokio::spawn(server.shutdown(WAIT));
    token.cancelled().await;
    let later = unary(&mut client, Call::new("/t/Echo", Bytes::from("y"))).await;
    assert_eq!(later.unwrap_err().code(), Code::Unavailable);
    let done = tokio::time::timeout(WAIT, slow).await.unwrap().unwrap();
    assert_eq!(done.unwrap(), "slow done", "the call in flight finished");
    tokio::time::timeout(WAIT, stopping).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connector_opens_clients_by_uid_for_tower_reconnect() {
    let s = setup("connector", ServerOptions::default()).await;
    let caller = Arc::new(
        uniplane_services::client::Client::connect(s.daemon.runtime_dir())
            .await
            .unwrap()
            .attach("connector")
            .await
            .unwrap(),
    );
    let connector = uniplane_rpc::Connector::new(caller, PORT, ClientOptions::default());
    let target = s.server_endpoint().uid;
    let mut svc: tower::reconnect::Reconnect<_, uniplane_dataplane::Uid> =
        tower::reconnect::Reconnect::new(connector, target);
    let answers = AtomicUsize::new(0);
    for i in 0..3 {
        let body = Bytes::from(format!("via reconnect {i}"));
        let got = tokio::time::timeout(WAIT, async {
            svc.ready()
                .await?
                .call(Call::new("/t/Echo", body.clone()))
                .await
        })
        .await
        .unwrap();
        assert_eq!(got.unwrap(), body);
        answers.fetch_add(1, Ordering::Relaxed);
    }
    assert_eq!(answers.load(Ordering::Relaxed), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_every_size_class_round_trip() {
    let s = setup("sizes", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    for size in [
        0,
        1,
        4096,
        4097,
        60 * 1024,
        60 * 1024 + 1,
        200_000,
        600_000,
        1_100_000,
        3_000_000,
    ] {
        let body = Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let back = unary(&mut client, Call::new("/t/Echo", body.clone())).await;
        assert_eq!(back.unwrap(), body, "{size} bytes");
    }
}

/// Found while writing these tests, outside this crate: the first burst
/// on a fresh session pair larger than the shared-memory ring (1 MiB)
/// did not arrive whole (the message a full ring held back waited for a
/// next one). Raw connections, no RPC involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_first_burst_larger_than_the_ring_arrives() {
    let s = setup("raw-burst", ServerOptions::default()).await;
    let server = s.server_session.as_ref().unwrap();
    let mut listener = server.listen(PORT + 1).await.unwrap();
    let mut conn = s.caller.connect(server.uid().port(PORT + 1)).await.unwrap();
    let mut accepted = tokio::time::timeout(WAIT, listener.accept())
        .await
        .unwrap()
        .unwrap();
    let chunk = Bytes::from(vec![1u8; 60 * 1024]);
    let sending = tokio::spawn(async move {
        for _ in 0..17 {
            conn.send_bytes(chunk.clone()).await.unwrap();
        }
        conn.send_push(chunk).await.unwrap();
        conn
    });
    let unit = tokio::time::timeout(WAIT, accepted.recv_until_push())
        .await
        .expect("the burst arrives in time")
        .unwrap()
        .unwrap();
    assert_eq!(unit.len(), 18 * 60 * 1024);
    drop(sending);
}

/// A "server" that accepts and never speaks: calls end with
/// Unavailable once the hello is overdue (10 s), not never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_says_hello_fails_calls_instead_of_hanging() {
    let s = setup("no-hello", ServerOptions::default()).await;
    let server = s.server_session.as_ref().unwrap();
    let mut listener = server.listen(PORT + 2).await.unwrap();
    let conn = s.caller.connect(server.uid().port(PORT + 2)).await.unwrap();
    let _silent = tokio::time::timeout(WAIT, listener.accept()).await.unwrap();
    let mut client = Client::new(conn, ClientOptions::default());
    let call = client
        .ready()
        .await
        .unwrap()
        .call(Call::new("/t/Echo", Bytes::new()));
    let err = tokio::time::timeout(Duration::from_secs(15), call)
        .await
        .expect("an answer before 15 s")
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

/// tower's own layers on the server: load shedding in front of a
/// concurrency limit of 1 refuses the second call in flight with
/// ResourceExhausted (tower's `Overloaded`, mapped), and the first one
/// is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_load_shedding_on_the_server_is_resource_exhausted() {
    let s = setup_with("shed", ServerOptions::default(), |svc| {
        tower::util::BoxCloneSyncService::new(
            tower::ServiceBuilder::new()
                .map_err(Status::from)
                .load_shed()
                .concurrency_limit(1)
                .service(svc),
        )
    })
    .await;
    let mut client = s.client(ClientOptions::default()).await;
    let first = client
        .ready()
        .await
        .unwrap()
        .call(Call::new("/t/Slow", Bytes::new()));
    let first = tokio::spawn(first);
    // The first call holds the one slot for 300 ms; this one is shed.
    let mut shed = None;
    for _ in 0..50 {
        match unary(&mut client, Call::new("/t/Echo", Bytes::from("x"))).await {
            Err(e) => {
                shed = Some(e);
                break;
            }
            Ok(_) => tokio::task::yield_now().await,
        }
    }
    let shed = shed.expect("a call shed while the slot was taken");
    assert_eq!(shed.code(), Code::ResourceExhausted, "{shed}");
    let done = tokio::time::timeout(WAIT, first).await.unwrap().unwrap();
    assert_eq!(done.unwrap(), "slow done");
}

/// tower's timeout on the client: a call slower than it ends with
/// DeadlineExceeded (tower's `Elapsed`, mapped) and the server drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_timeout_on_the_client_is_deadline_exceeded_and_cancels() {
    let mut s = setup("tower-timeout", ServerOptions::default()).await;
    let mut client = s.client(ClientOptions::default()).await;
    // The connection is up (hello done), so the call reaches the server
    // well within the timeout even on a loaded machine.
    let warm = unary(&mut client, Call::new("/t/Echo", Bytes::from("warm"))).await;
    assert!(warm.is_ok());
    let mut svc = tower::ServiceBuilder::new()
        .timeout(Duration::from_millis(200))
        .service(client);
    let err = tokio::time::timeout(WAIT, async {
        svc.ready()
            .await?
            .call(Call::new("/t/Sleep", Bytes::new()))
            .await
    })
    .await
    .expect("an answer in time")
    .unwrap_err();
    assert_eq!(Status::from(err).code(), Code::DeadlineExceeded);
    assert_eq!(s.event().await, "started");
    assert_eq!(
        s.event().await,
        "dropped",
        "the timed-out call was cancelled"
    );
}

/// The daemon's ACL refuses the connection: the connector says
/// PermissionDenied, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_acl_refuses_is_permission_denied() {
    let dir = std::env::temp_dir().join(format!("uniplane-rpc-acl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!("{CONFIG}\n[policy]\ndefault = \"deny\"\n");
    let (daemon, control) = embedded(Config::parse(&text, "acl").unwrap(), &dir)
        .await
        .unwrap();
    let server = control.attach("server").await.unwrap();
    let _listener = server.listen(PORT).await.unwrap();
    let caller = Arc::new(
        uniplane_services::client::Client::connect(daemon.runtime_dir())
            .await
            .unwrap()
            .attach("caller")
            .await
            .unwrap(),
    );
    let mut connector = uniplane_rpc::Connector::new(caller, PORT, ClientOptions::default());
    let refused = tokio::time::timeout(WAIT, connector.call(server.uid()))
        .await
        .expect("an answer in time");
    assert_eq!(refused.unwrap_err().code(), Code::PermissionDenied);
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Dropping the last handle of a client (with no call left) closes its
/// connection: the far end sees it end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_client_handle_closes_the_connection() {
    let s = setup("drop-client", ServerOptions::default()).await;
    let server = s.server_session.as_ref().unwrap();
    let mut listener = server.listen(PORT + 3).await.unwrap();
    let conn = s.caller.connect(server.uid().port(PORT + 3)).await.unwrap();
    let mut far = tokio::time::timeout(WAIT, listener.accept())
        .await
        .unwrap()
        .unwrap();
    // This end plays the server: hello, then one answer.
    send_frame(&mut far, &Head::new(Kind::Status, 0), b"", b"").await;
    let client = Client::new(conn, ClientOptions::default());
    let mut second = client.clone();
    drop(client);
    let call = second
        .ready()
        .await
        .unwrap()
        .call(Call::new("/t/Echo", Bytes::new()));
    let request = recv_frame(&mut far).await;
    let head = Head {
        flags: Flags::MESSAGE,
        ..Head::new(Kind::Status, request.tag())
    };
    send_frame(&mut far, &head, b"", b"answer").await;
    assert_eq!(
        tokio::time::timeout(WAIT, call).await.unwrap().unwrap(),
        "answer"
    );
    drop(second);
    let end = tokio::time::timeout(WAIT, far.recv())
        .await
        .expect("the connection closes in time");
    assert!(end.is_none(), "{end:?}");
}

/// Discovery from the daemon's registry feeds tower's balancer: two
/// servers registered as `server…`, calls spread over both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_feeds_tower_balance_with_every_matching_server() {
    let s = setup("balance", ServerOptions::default()).await;
    // A second server, "server-b", answering "b" to everything.
    let b = uniplane_services::client::Client::connect(s.daemon.runtime_dir())
        .await
        .unwrap()
        .attach("server-b")
        .await
        .unwrap();
    let listener = b.listen(PORT).await.unwrap();
    let _b_server = uniplane_rpc::spawn(
        listener,
        |_| {
            tower::service_fn(|_call: ServerCall| async {
                Ok::<_, Status>(Reply::Unary(Bytes::from_static(b"b")))
            })
        },
        ServerOptions::default(),
    );
    let caller = Arc::new(
        uniplane_services::client::Client::connect(s.daemon.runtime_dir())
            .await
            .unwrap()
            .attach("balancer")
            .await
            .unwrap(),
    );
    let discover = uniplane_rpc::discover::registry(
        caller,
        |name| name.starts_with("server"),
        PORT,
        ClientOptions::default(),
        Duration::from_millis(100),
    );
    let mut balance = tower::balance::p2c::Balance::new(Box::pin(discover));
    let (mut a_hits, mut b_hits) = (0, 0);
    for _ in 0..60 {
        let got = tokio::time::timeout(WAIT, async {
            balance
                .ready()
                .await?
                .call(Call::new("/t/Echo", Bytes::from_static(b"a")))
                .await
        })
        .await
        .expect("an answer in time")
        .unwrap();
        match &got[..] {
            b"a" => a_hits += 1,
            b"b" => b_hits += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(a_hits > 0 && b_hits > 0, "a {a_hits}, b {b_hits}");
}
