//! Transit through a server: three daemons on loopback (three servers in
//! one process), A — B — C, where A and C are not peers. A reaches C's
//! echo device and a process on C through B, which only forwards; the
//! ingress filters let A's resources through B because the files say A is
//! reached through B. When C goes away the connection's owner on A is
//! told (through B), and once C is back A connects again through B.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use uniplane_client::protocol::Request;
use uniplane_client::Client;
use uniplane_dataplane::Uid;
use uniplane_netns::free_port;
use uniplane_services::client::embedded;
use uniplane_services::config::Config;
use uniplane_services::Daemon;

const IDS: [&str; 3] = ["10.40.0.1", "10.40.0.2", "10.40.0.3"];
const WAIT: Duration = Duration::from_secs(20);

/// Server `i`'s file: peers with its neighbours on the line A — B — C,
/// the far end (for A and C) reached through B.
fn config(i: usize, ports: &[(u16, u16); 3], secret: &Path) -> String {
    let (peer, tunnel) = ports[i];
    let mut text = format!(
        "[server]\nid = \"{}\"\npeer_listen = \"127.0.0.1:{peer}\"\n\n\
         [[stacks]]\nname = \"tcp\"\nlisten = \"127.0.0.1:{tunnel}\"\n\n\
         [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = 1\n\n\
         [failure]\nheartbeat_ms = 50\nmisses = 10\n\n\
         [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
        IDS[i],
        secret.display()
    );
    let neighbours: &[usize] = match i {
        1 => &[0, 2],
        _ => &[1],
    };
    for &n in neighbours {
        text.push_str(&format!(
            "\n[[peers]]\nserver = \"{}\"\naddress = \"127.0.0.1:{}\"\ntunnel = \"127.0.0.1:{}\"\nstack = \"tcp\"\n",
            IDS[n], ports[n].0, ports[n].1
        ));
    }
    if i != 1 {
        text.push_str(&format!(
            "\n[[remotes]]\nserver = \"{}\"\nvia = \"{}\"\n",
            IDS[2 - i],
            IDS[1]
        ));
    }
    text
}

async fn alive_peers(dir: &Path) -> usize {
    let Ok(c) = Client::connect(dir).await else {
        return 0;
    };
    let Ok(s) = c.request(&Request::Status).await else {
        return 0;
    };
    s["peers"]
        .as_array()
        .map_or(0, |p| p.iter().filter(|x| x["alive"] == true).count())
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < WAIT, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A daemon on a runtime of its own, so that dropping it ends every task
/// and socket of it, as a killed process would.
struct Hosted {
    daemon: Daemon,
    rt: Option<tokio::runtime::Runtime>,
}

impl Hosted {
    fn kill(mut self) {
        self.daemon.shutdown();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Hosted {
    fn drop(&mut self) {
        self.daemon.shutdown();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn start(i: usize, ports: &[(u16, u16); 3], secret: &Path, dir: &Path) -> Hosted {
    let text = config(i, ports, secret);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dir = dir.to_owned();
    let (daemon, _client) = rt
        .spawn(async move { embedded(Config::parse(&text, IDS[i]).unwrap(), &dir).await })
        .await
        .unwrap()
        .unwrap();
    Hosted {
        daemon,
        rt: Some(rt),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_carries_connections_between_its_neighbours_and_reports_the_far_end_gone() {
    let base = std::env::temp_dir().join(format!("uniplane-transit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let secret = base.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let ports = [0, 1, 2].map(|_| (free_port(), free_port()));
    let dirs: Vec<PathBuf> = (0..3).map(|i| base.join(format!("d{i}"))).collect();
    let mut daemons = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        daemons.push(start(i, &ports, &secret, dir).await);
    }
    until("B sees both neighbours", async || {
        alive_peers(&dirs[1]).await == 2
    })
    .await;
    until("A and C see B", async || {
        alive_peers(&dirs[0]).await == 1 && alive_peers(&dirs[2]).await == 1
    })
    .await;

    // A's application to C's echo device, through B.
    let a = Client::connect(&dirs[0]).await.unwrap();
    let app = a.attach("app").await.unwrap();
    let echo = Uid::new(IDS[2].parse().unwrap(), 1).port(7);
    let mut conn = tokio::time::timeout(WAIT, app.connect(echo))
        .await
        .expect("in time")
        .expect("connected through B");
    for i in 0..50u32 {
        let text = format!("through B {i}");
        conn.send_bytes(Bytes::from(text.clone())).await.unwrap();
        let back = tokio::time::timeout(WAIT, conn.recv())
            .await
            .expect("echoed in time")
            .expect("a message")
            .expect("not an error");
        assert_eq!(back.payload().as_ref(), text.as_bytes(), "in order, once");
    }
    let b_conns = Client::connect(&dirs[1])
        .await
        .unwrap()
        .request(&Request::Connections)
        .await
        .unwrap();
    assert_eq!(
        b_conns.as_array().map(Vec::len),
        Some(1),
        "B carries it: {b_conns}"
    );

    // A process on C that speaks first, the moment it accepts.
    let c = Client::connect(&dirs[2]).await.unwrap();
    let server = c.attach("server").await.unwrap();
    let mut listener = server.listen(80).await.unwrap();
    let accept = tokio::spawn(async move {
        let mut accepted = listener.accept().await.expect("a connection");
        accepted
            .send_bytes(Bytes::from_static(b"hello from C"))
            .await
            .unwrap();
        let got = accepted.recv().await.expect("a message").expect("no error");
        assert_eq!(got.payload().as_ref(), b"hello from A");
        (listener, accepted)
    });
    let mut to_c = tokio::time::timeout(WAIT, app.connect(server.uid().port(80)))
        .await
        .expect("in time")
        .expect("connected to C's process");
    let first = tokio::time::timeout(WAIT, to_c.recv())
        .await
        .expect("C's first message in time")
        .expect("a message")
        .expect("no error");
    assert_eq!(first.payload().as_ref(), b"hello from C");
    to_c.send_bytes(Bytes::from_static(b"hello from A"))
        .await
        .unwrap();
    let (_listener, _accepted) = tokio::time::timeout(WAIT, accept).await.unwrap().unwrap();

    // C goes away: B closes what it carried to C and tells A, whose
    // application hears it on its connection.
    drop((_listener, _accepted, server));
    daemons.pop().unwrap().kill();
    let end = tokio::time::timeout(WAIT, conn.recv())
        .await
        .expect("A's owner is told in time");
    match end {
        Some(Err(e)) => assert!(e.to_string().contains("PeerFailed"), "{e}"),
        other => panic!("the owner is told the far end failed, not {other:?}"),
    }
    until("the connections are gone from A and B", async || {
        let mut empty = true;
        for dir in &dirs[..2] {
            let c = Client::connect(dir).await.unwrap();
            let v = c.request(&Request::Connections).await.unwrap();
            empty &= v.as_array().is_some_and(|v| v.is_empty());
        }
        empty
    })
    .await;

    // C is back: A reaches it through B again.
    daemons.push(start(2, &ports, &secret, &dirs[2]).await);
    until("B sees C again", async || alive_peers(&dirs[1]).await == 2).await;
    let mut again = tokio::time::timeout(WAIT, app.connect(echo))
        .await
        .expect("in time")
        .expect("connected through B again");
    again.send_bytes(Bytes::from_static(b"back")).await.unwrap();
    let back = tokio::time::timeout(WAIT, again.recv())
        .await
        .expect("in time")
        .expect("a message")
        .expect("no error");
    assert_eq!(back.payload().as_ref(), b"back");
    drop((again, to_c, conn, app));
    drop(daemons);
    let _ = std::fs::remove_dir_all(&base);
}
