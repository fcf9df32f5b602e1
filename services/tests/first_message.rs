//! The first message of a cross-server connection: two daemons peered over
//! a TCP tunnel on loopback (two servers in one process). The accepting
//! process sends at once when it hears of a connection, and the caller
//! gets that message without anyone sending it again: the caller's daemon
//! admits the connection's return traffic before it asks the peer (see
//! `Control::ask_peer` in `uniplane-control`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use uniplane_netns::free_port;
use uniplane_services::client::{embedded, Client};
use uniplane_services::config::Config;
use uniplane_services::control::Request;
use uniplane_services::Daemon;

/// Connections opened, one after the other (before the fix, 2 to 5 in 50
/// lost their first message here: enough rounds that luck cannot pass).
const ROUNDS: usize = 200;
/// How long a caller waits for the acceptor's first message.
const FIRST_WITHIN: Duration = Duration::from_secs(2);
const PORT: u16 = 4100;

fn config(me: &str, ports: (u16, u16), other: &str, theirs: (u16, u16), secret: &Path) -> String {
    format!(
        "[server]\nid = \"{me}\"\npeer_listen = \"127.0.0.1:{}\"\n\n\
         [[stacks]]\nname = \"tcp\"\nlisten = \"127.0.0.1:{}\"\n\n\
         [[peers]]\nserver = \"{other}\"\naddress = \"127.0.0.1:{}\"\ntunnel = \"127.0.0.1:{}\"\nstack = \"tcp\"\n\n\
         [failure]\nheartbeat_ms = 50\nmisses = 20\n\n\
         [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
        ports.0,
        ports.1,
        theirs.0,
        theirs.1,
        secret.display()
    )
}

async fn peers_alive(c: &Client) -> bool {
    c.request(&Request::Status)
        .await
        .ok()
        .and_then(|s| s["peers"].as_array().cloned())
        .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true))
}

/// Two daemons, peers of each other, alive; shut down on drop.
struct Pair {
    daemons: Vec<Daemon>,
    dir: PathBuf,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for d in &self.daemons {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn pair() -> Pair {
    let dir = std::env::temp_dir().join(format!("uniplane-first-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let ids = ["10.31.0.1", "10.31.0.2"];
    let ports = [(free_port(), free_port()), (free_port(), free_port())];
    let mut daemons = Vec::new();
    let mut clients = Vec::new();
    for i in 0..2 {
        let o = 1 - i;
        let text = config(ids[i], ports[i], ids[o], ports[o], &secret);
        let (d, c) = embedded(
            Config::parse(&text, &format!("first{i}")).unwrap(),
            &dir.join(format!("d{i}")),
        )
        .await
        .unwrap();
        daemons.push(d);
        clients.push(c);
    }
    let start = Instant::now();
    for c in &clients {
        while !peers_alive(c).await {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the daemons did not peer"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Pair { daemons, dir }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acceptors_first_message_reaches_the_caller_on_another_server_without_a_retry() {
    let p = pair().await;
    let acceptor = Client::connect(p.daemons[1].runtime_dir())
        .await
        .unwrap()
        .attach("acceptor")
        .await
        .unwrap();
    let mut listener = acceptor.listen(PORT).await.unwrap();
    // The acceptor speaks first, once, the moment it hears of a
    // connection, and keeps the connection open.
    let speaker = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Some(mut conn) = listener.accept().await {
            let first = format!("first to port {}", conn.remote().port);
            let _ = conn.send_bytes(Bytes::from(first)).await;
            open.push(conn);
        }
    });
    let caller = Client::connect(p.daemons[0].runtime_dir())
        .await
        .unwrap()
        .attach("caller")
        .await
        .unwrap();
    let mut lost = Vec::new();
    for round in 0..ROUNDS {
        let mut conn = caller
            .connect(acceptor.uid().port(PORT))
            .await
            .unwrap_or_else(|e| panic!("connect {round}: {e}"));
        let want = format!("first to port {}", conn.local().port);
        match tokio::time::timeout(FIRST_WITHIN, conn.recv()).await {
            Ok(Some(Ok(m))) => assert_eq!(m.payload().as_ref(), want.as_bytes()),
            Ok(other) => panic!("round {round}: {other:?}"),
            Err(_) => lost.push(round),
        }
        drop(conn);
    }
    speaker.abort();
    assert!(
        lost.is_empty(),
        "the acceptor's first message was lost in {} of {ROUNDS} rounds: {lost:?}",
        lost.len()
    );
}
