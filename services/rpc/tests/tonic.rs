//! tonic, unchanged, over uniplane's byte-stream adapter: the generated
//! client calls the generated server by UID, within one daemon (shared
//! memory) and across two daemons peered over `tcp` and `ltl` tunnels.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use uniplane_client::Session;
use uniplane_dataplane::{Endpoint, Uid};
use uniplane_rpc::echo::echo_client::EchoClient;
use uniplane_rpc::echo::echo_server::EchoServer;
use uniplane_rpc::echo::{Payload, Repeat};
use uniplane_rpc::tonic::{incoming, EchoService, PeerInfo, UidConnector};
use uniplane_services::client::{embedded, Client};
use uniplane_services::config::Config;
use uniplane_services::Daemon;

use common::peered_config;
use uniplane_netns::free_port;

const PORT: u16 = 50051;
const WAIT: Duration = Duration::from_secs(10);

/// Serves Echo on `PORT` of `session`; each call's caller (tonic's
/// connect info) is reported on the returned channel, and the caller
/// `deny` names is refused with PermissionDenied.
async fn listen_and_serve(
    session: &Session,
    deny: Option<Uid>,
) -> mpsc::UnboundedReceiver<Endpoint> {
    let listener = session.listen(PORT).await.unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let interceptor = move |req: tonic::Request<()>| {
        let Some(peer) = req.extensions().get::<PeerInfo>().copied() else {
            return Err(tonic::Status::unauthenticated("no uniplane peer"));
        };
        let _ = tx.send(peer.remote);
        if Some(peer.remote.uid) == deny {
            return Err(tonic::Status::permission_denied("denied by UID"));
        }
        Ok(req)
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EchoServer::with_interceptor(EchoService, interceptor))
            .serve_with_incoming(incoming(listener)),
    );
    rx
}

async fn client(session: Arc<Session>, server: Endpoint) -> EchoClient<tonic::transport::Channel> {
    let channel = tokio::time::timeout(
        WAIT,
        tonic::transport::Endpoint::from_static("http://uniplane")
            .connect_with_connector(UidConnector::new(session, server)),
    )
    .await
    .expect("connected in time")
    .unwrap();
    EchoClient::new(channel)
}

/// Every kind of call, with answers checked.
async fn every_kind_of_call(echo: &mut EchoClient<tonic::transport::Channel>) {
    let data = Bytes::from_static(b"over uniplane");
    let got = tokio::time::timeout(WAIT, echo.unary(Payload { data: data.clone() }))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.into_inner().data, data);

    let big = Bytes::from(vec![0x5a; 200_000]);
    let got = tokio::time::timeout(WAIT, echo.unary(Payload { data: big.clone() }))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.into_inner().data, big);

    let stream = tokio::time::timeout(
        WAIT,
        echo.server_stream(Repeat {
            data: data.clone(),
            count: 100,
        }),
    )
    .await
    .unwrap()
    .unwrap()
    .into_inner();
    let all: Vec<_> = tokio::time::timeout(WAIT, stream.collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(all.len(), 100);
    assert!(all.into_iter().all(|p| p.unwrap().data == data));

    let parts = (0..10).map(|i| Payload {
        data: Bytes::from(format!("{i}")),
    });
    let got = tokio::time::timeout(WAIT, echo.client_stream(futures_util::stream::iter(parts)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.into_inner().data, "0123456789");

    let parts = (0..10).map(|i| Payload {
        data: Bytes::from(format!("b{i}")),
    });
    let back = tokio::time::timeout(WAIT, echo.bidi(futures_util::stream::iter(parts)))
        .await
        .unwrap()
        .unwrap()
        .into_inner();
    let back: Vec<_> = tokio::time::timeout(WAIT, back.collect::<Vec<_>>())
        .await
        .unwrap();
    let back: Vec<Bytes> = back.into_iter().map(|p| p.unwrap().data).collect();
    assert_eq!(
        back,
        (0..10)
            .map(|i| Bytes::from(format!("b{i}")))
            .collect::<Vec<_>>()
    );
}

const ONE: &str = r#"
[server]
id = "127.0.0.1"
peer_listen = "127.0.0.1:0"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_client_calls_its_server_through_shared_memory() {
    let dir = std::env::temp_dir().join(format!("uniplane-rpc-tonic-shm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (daemon, control) = embedded(Config::parse(ONE, "tonic").unwrap(), &dir)
        .await
        .unwrap();
    let server = control.attach("server").await.unwrap();
    let mut callers = listen_and_serve(&server, None).await;
    let caller = Arc::new(
        Client::connect(daemon.runtime_dir())
            .await
            .unwrap()
            .attach("caller")
            .await
            .unwrap(),
    );
    let mut echo = client(caller.clone(), server.uid().port(PORT)).await;
    every_kind_of_call(&mut echo).await;
    // The service saw the caller's UID, as the daemon installed it.
    let seen = tokio::time::timeout(WAIT, callers.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.uid, caller.uid());
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_refused_by_uid_gets_permission_denied_from_the_real_client() {
    let dir = std::env::temp_dir().join(format!("uniplane-rpc-tonic-deny-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (daemon, control) = embedded(Config::parse(ONE, "tonic").unwrap(), &dir)
        .await
        .unwrap();
    let server = control.attach("server").await.unwrap();
    let caller = Arc::new(
        Client::connect(daemon.runtime_dir())
            .await
            .unwrap()
            .attach("caller")
            .await
            .unwrap(),
    );
    let _callers = listen_and_serve(&server, Some(caller.uid())).await;
    let mut echo = client(caller, server.uid().port(PORT)).await;
    let err = tokio::time::timeout(WAIT, echo.unary(Payload { data: Bytes::new() }))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    // Nothing listens on another port: the connector's refusal is a
    // typed status too (Unavailable), not a hang.
    let channel = tonic::transport::Endpoint::from_static("http://uniplane")
        .connect_timeout(WAIT)
        .connect_with_connector_lazy(UidConnector::new(
            Arc::new(
                Client::connect(daemon.runtime_dir())
                    .await
                    .unwrap()
                    .attach("other")
                    .await
                    .unwrap(),
            ),
            server.uid().port(PORT + 1),
        ));
    let err = tokio::time::timeout(
        WAIT,
        EchoClient::new(channel).unary(Payload { data: Bytes::new() }),
    )
    .await
    .expect("an answer in time")
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

const A: Ipv4Addr = Ipv4Addr::new(10, 19, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 19, 0, 2);

struct Pair {
    a: Daemon,
    b: Daemon,
    dir: PathBuf,
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.a.shutdown();
        self.b.shutdown();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Two daemons on loopback, peers over `stack` tunnels, alive.
async fn pair(stack: &str) -> Pair {
    let dir = std::env::temp_dir().join(format!("uniplane-rpc-{stack}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let addr = |p| SocketAddr::from(([127, 0, 0, 1], p));
    let (a_peer, a_tun, b_peer, b_tun) = (
        addr(free_port()),
        addr(free_port()),
        addr(free_port()),
        addr(free_port()),
    );
    let ca = peered_config(stack, A, a_peer, a_tun, (B, b_peer, b_tun), &secret);
    let cb = peered_config(stack, B, b_peer, b_tun, (A, a_peer, a_tun), &secret);
    let (a, ac) = embedded(Config::parse(&ca, "a").unwrap(), &dir.join("a"))
        .await
        .unwrap();
    let (b, bc) = embedded(Config::parse(&cb, "b").unwrap(), &dir.join("b"))
        .await
        .unwrap();
    let start = Instant::now();
    loop {
        if alive(&ac).await && alive(&bc).await {
            break;
        }
        assert!(start.elapsed() < WAIT, "peers not alive in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Pair { a, b, dir }
}

async fn alive(c: &Client) -> bool {
    c.request(&uniplane_services::control::Request::Status)
        .await
        .ok()
        .and_then(|s| s["peers"].as_array().cloned())
        .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true))
}

async fn across(stack: &str) {
    let p = pair(stack).await;
    let server = Client::connect(p.b.runtime_dir())
        .await
        .unwrap()
        .attach("server")
        .await
        .unwrap();
    let mut callers = listen_and_serve(&server, None).await;
    let caller = Arc::new(
        Client::connect(p.a.runtime_dir())
            .await
            .unwrap()
            .attach("caller")
            .await
            .unwrap(),
    );
    assert_eq!(server.uid().server(), B);
    let mut echo = client(caller.clone(), server.uid().port(PORT)).await;
    every_kind_of_call(&mut echo).await;
    let seen = tokio::time::timeout(WAIT, callers.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.uid, caller.uid(), "the source UID crossed the tunnel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_client_calls_a_server_on_another_daemon_over_tcp() {
    across("tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_client_calls_a_server_on_another_daemon_over_ltl() {
    across("ltl").await;
}
