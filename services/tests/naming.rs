//! The naming service on a real three-member etcd cluster (Debian's
//! `etcd-server`): two daemons peered over a TCP tunnel register their
//! servers and names in it; a name claimed on one server resolves on the
//! other; no two daemons hold one name or one server ID; without quorum
//! (two members frozen with SIGSTOP) new names fail with a clear error and
//! every claim is held again, once, after; with etcd in a namespace of its
//! own and the link to it cut, a transfer between the daemons loses
//! nothing; servers found in the directory become peers and leave.
//!
//! Needs `etcd` on the PATH (and root with `ip netns` for the partition);
//! skips otherwise, unless `UNIPLANE_REQUIRE_TOOLS=1` makes that a
//! failure.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use uniplane_netns::etcd::{wait_healthy, EtcdCluster, TestPki};
use uniplane_netns::free_port;
use uniplane_services::client::{embedded, Client, ClientError, Detached};
use uniplane_services::config::Config;
use uniplane_services::control::Request;
use uniplane_services::Daemon;

const WAIT: Duration = Duration::from_secs(30);
const PORT: u16 = 4200;

fn have_etcd() -> bool {
    uniplane_netns::etcd::require("naming")
}

/// Three members on loopback, healthy.
async fn etcd_on_loopback(dir: &Path) -> EtcdCluster {
    let etcd = EtcdCluster::start(dir, Ipv4Addr::LOCALHOST, 3, || Command::new("etcd"));
    let clients = etcd.clients.clone();
    tokio::task::spawn_blocking(move || wait_healthy(&clients, WAIT))
        .await
        .unwrap()
        .unwrap();
    etcd
}

/// The etcd endpoints as the items of a TOML array of strings.
fn toml_strings(items: &[String]) -> String {
    items
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn config(
    me: &str,
    name: &str,
    ports: (u16, u16),
    other: &str,
    theirs: (u16, u16),
    secret: &Path,
    etcd: &[String],
) -> String {
    let endpoints = toml_strings(etcd);
    format!(
        "[server]\nid = \"{me}\"\nname = \"{name}\"\npeer_listen = \"127.0.0.1:{}\"\n\n\
         [[stacks]]\nname = \"tcp\"\nlisten = \"127.0.0.1:{}\"\n\n\
         [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = 1\n\n\
         [[peers]]\nserver = \"{other}\"\naddress = \"127.0.0.1:{}\"\ntunnel = \"127.0.0.1:{}\"\nstack = \"tcp\"\n\n\
         [failure]\nheartbeat_ms = 50\nmisses = 20\n\n\
         [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n\n\
         [registry]\nkind = \"etcd\"\nendpoints = [{endpoints}]\nprefix = \"/uniplane-test\"\n\
         lease_ttl_s = 2\ntimeout_ms = 300\n",
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

/// An etcd cluster and two daemons registered in it, peered; all stopped
/// on drop.
struct Fabric {
    daemons: Vec<Daemon>,
    dir: PathBuf,
    etcd: EtcdCluster,
    texts: Vec<String>,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for d in &self.daemons {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn fabric(tag: &str) -> Fabric {
    let dir = std::env::temp_dir().join(format!("uniplane-naming-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let etcd = etcd_on_loopback(&dir).await;
    let secret = dir.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let ids = ["10.41.0.1", "10.41.0.2"];
    let names = ["alpha", "beta"];
    let ports = [(free_port(), free_port()), (free_port(), free_port())];
    let mut daemons = Vec::new();
    let mut clients = Vec::new();
    let mut texts = Vec::new();
    for i in 0..2 {
        let o = 1 - i;
        let text = config(
            ids[i],
            names[i],
            ports[i],
            ids[o],
            ports[o],
            &secret,
            &etcd.clients,
        );
        let (d, c) = embedded(
            Config::parse(&text, &format!("naming{i}")).unwrap(),
            &dir.join(format!("d{i}")),
        )
        .await
        .unwrap();
        daemons.push(d);
        clients.push(c);
        texts.push(text);
    }
    let start = Instant::now();
    for c in &clients {
        while !peers_alive(c).await {
            assert!(start.elapsed() < WAIT, "the daemons did not peer");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Fabric {
        daemons,
        dir,
        etcd,
        texts,
    }
}

async fn client(d: &Daemon) -> Client {
    Client::connect(d.runtime_dir()).await.unwrap()
}

/// Polls the directory of `d` (a daemon, or its runtime directory) until
/// `done` holds of it (bounded).
async fn until(d: impl Runtime, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let v = Client::connect(d.dir())
            .await
            .unwrap()
            .request(&Request::Directory)
            .await
            .unwrap();
        if done(&v) {
            return v;
        }
        assert!(start.elapsed() < WAIT, "{what}: {v:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where a daemon's sockets are.
trait Runtime {
    fn dir(&self) -> &Path;
}

impl Runtime for &Daemon {
    fn dir(&self) -> &Path {
        self.runtime_dir()
    }
}

impl Runtime for &PathBuf {
    fn dir(&self) -> &Path {
        self
    }
}

/// Every key this daemon wants is held.
fn all_held(v: &Value) -> bool {
    v["claims"]["keys"]
        .as_array()
        .is_some_and(|k| !k.is_empty() && k.iter().all(|k| k["state"] == "held"))
        && v["claims"]["error"].is_null()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_claimed_on_one_server_resolves_on_the_other_and_is_never_held_twice() {
    if !have_etcd() {
        return;
    }
    let f = fabric("resolve").await;
    let a = &f.daemons[0];
    let b = &f.daemons[1];
    let v = until(b, "both servers registered", |v| {
        v["servers"].as_array().is_some_and(|s| s.len() == 2) && all_held(v)
    })
    .await;
    let servers: Vec<&str> = v["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["server"].as_str().unwrap())
        .collect();
    assert_eq!(servers, ["10.41.0.1", "10.41.0.2"]);
    assert!(v["servers"][0]["ttl_s"].as_i64().unwrap() > 0);
    assert_eq!(v["servers"][0]["record"]["name"], "alpha");

    // A device's name: DEVICE@SERVER-NAME, claimed by its daemon.
    let echo = client(b).await.resolve("echo@alpha").await.unwrap();
    assert_eq!(echo.to_string(), "10.41.0.1:1");

    let service = client(a).await.attach("service").await.unwrap();
    service.register("job.rank0").await.unwrap();
    let uid = client(b).await.resolve("job.rank0").await.unwrap();
    assert_eq!(uid, service.uid());

    // The name is taken: another process on another server is refused,
    // and so is the same process asking again for a second owner.
    let other = client(b).await.attach("other").await.unwrap();
    match other.register("job.rank0").await {
        Err(ClientError::Daemon { kind, message }) => {
            assert_eq!(kind, "exists", "{message}");
            assert!(message.contains(&service.uid().to_string()), "{message}");
        }
        r => panic!("a second owner: {r:?}"),
    }
    // Bad names are refused before they reach the directory.
    for bad in ["a/b", "", "two words"] {
        match other.register(bad).await {
            Err(ClientError::Daemon { kind, .. }) => assert_eq!(kind, "bad-request"),
            r => panic!("{bad:?}: {r:?}"),
        }
    }

    // The resolved UID is reachable by the one interface.
    let mut listener = service.listen(PORT).await.unwrap();
    let mut conn = other.connect(uid.port(PORT)).await.unwrap();
    conn.send_bytes(Bytes::from_static(b"found by name"))
        .await
        .unwrap();
    let mut accepted = tokio::time::timeout(WAIT, listener.accept())
        .await
        .unwrap()
        .unwrap();
    let m = tokio::time::timeout(WAIT, accepted.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(m.payload().as_ref(), b"found by name");

    // The owner goes: its name goes with it, and the other may take it.
    drop(accepted);
    drop(listener);
    drop(service);
    let start = Instant::now();
    loop {
        match client(b).await.resolve("job.rank0").await {
            Err(ClientError::Daemon { kind, .. }) if kind == "not-found" => break,
            r => assert!(start.elapsed() < WAIT, "still resolves: {r:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    other.register("job.rank0").await.unwrap();
    assert_eq!(
        client(a).await.resolve("job.rank0").await.unwrap(),
        other.uid()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_with_a_registered_server_id_is_refused() {
    if !have_etcd() {
        return;
    }
    let f = fabric("twin").await;
    until(&f.daemons[0], "registered", all_held).await;
    // The same file (same server ID) again, on other ports.
    let text = f.texts[0]
        .lines()
        .map(|l| {
            if l.starts_with("peer_listen") {
                format!("peer_listen = \"127.0.0.1:{}\"", free_port())
            } else if l.starts_with("listen = ") {
                format!("listen = \"127.0.0.1:{}\"", free_port())
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let config = Config::parse(&text, "twin").unwrap();
    match embedded(config, &f.dir.join("twin")).await {
        Err(e) => assert!(
            e.to_string().contains("registered by another daemon"),
            "{e}"
        ),
        Ok(_) => panic!("two daemons hold server ID 10.41.0.1"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_new_names_fail_and_every_claim_is_held_again_once_after() {
    if !have_etcd() {
        return;
    }
    let f = fabric("quorum").await;
    let a = &f.daemons[0];
    let b = &f.daemons[1];
    until(a, "registered", all_held).await;
    until(b, "registered", all_held).await;
    let receiver = client(b).await.attach("receiver").await.unwrap();
    receiver.register("sink").await.unwrap();
    let sender = client(a).await.attach("sender").await.unwrap();

    // Two of three members frozen: the one left has no quorum and
    // answers nothing.
    f.etcd.signal(2, libc::SIGSTOP);
    let t = Instant::now();
    match sender.register("late").await {
        Err(ClientError::Daemon { kind, message }) => {
            assert_eq!(kind, "unavailable", "{message}");
            assert!(message.contains("unreachable"), "{message}");
        }
        r => panic!("a name claimed without quorum: {r:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // What a daemon holds itself still resolves.
    assert_eq!(
        client(b).await.resolve("receiver").await.unwrap(),
        receiver.uid()
    );
    // The daemons find their leases gone once the TTL passes unrenewed.
    until(a, "lease given up", |v| v["claims"]["lease"].is_null()).await;
    until(b, "lease given up", |v| v["claims"]["lease"].is_null()).await;

    f.etcd.signal(2, libc::SIGCONT);
    let va = until(a, "claims held again", |v| {
        all_held(v) && v["servers"].as_array().is_some_and(|s| s.len() == 2)
    })
    .await;
    until(b, "claims held again", all_held).await;
    // One owner per key: the server record and the sink are the daemons'
    // own, each under its current lease.
    let lease_a = va["claims"]["lease"]["id"].as_i64().unwrap();
    let server_a = va["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["server"] == "10.41.0.1")
        .unwrap();
    assert_eq!(server_a["lease"].as_i64().unwrap(), lease_a);
    let sinks: Vec<&Value> = va["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["name"] == "sink")
        .collect();
    assert_eq!(sinks.len(), 1);
    assert_eq!(sinks[0]["uid"], receiver.uid().to_string());
    sender.register("late").await.unwrap();
}

/// Messages numbered 0.. from `conn` to `inbound` until stopped; the
/// receiver counts gaps (a lost or reordered number).
struct Transfer {
    stop: tokio::sync::oneshot::Sender<()>,
    send: tokio::task::JoinHandle<(u64, uniplane_services::client::Connection)>,
    recv: tokio::task::JoinHandle<(u64, u64)>,
}

impl Transfer {
    fn start(
        mut conn: uniplane_services::client::Connection,
        mut inbound: uniplane_services::client::Connection,
    ) -> Transfer {
        let (stop, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let send = tokio::spawn(async move {
            let mut n = 1u64;
            while stop_rx.try_recv().is_err() {
                conn.send_bytes(Bytes::from(n.to_le_bytes().to_vec()))
                    .await
                    .unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            (n, conn)
        });
        let recv = tokio::spawn(async move {
            let mut next = 0u64;
            let mut gaps = 0u64;
            while let Some(Ok(m)) = inbound.recv().await {
                let n = u64::from_le_bytes(m.payload()[..8].try_into().unwrap());
                if n == u64::MAX {
                    break;
                }
                if n != next {
                    gaps += 1;
                }
                next = n + 1;
            }
            (next, gaps)
        });
        Transfer { stop, send, recv }
    }

    /// Stops sending; (sent, received, gaps).
    async fn finish(self) -> (u64, u64, u64) {
        let _ = self.stop.send(());
        let (sent, mut conn) = self.send.await.unwrap();
        conn.send_bytes(Bytes::from(u64::MAX.to_le_bytes().to_vec()))
            .await
            .unwrap();
        let (received, gaps) = tokio::time::timeout(WAIT, self.recv)
            .await
            .unwrap()
            .unwrap();
        (sent, received, gaps)
    }
}

/// Opens a connection from `sender` to `receiver`'s `PORT` (the first
/// message, number 0, carries it through the accept); both ends.
async fn connected(
    sender: &uniplane_services::client::Session,
    to: uniplane_dataplane::Uid,
    listener: &mut uniplane_services::client::Listener,
) -> (
    uniplane_services::client::Connection,
    uniplane_services::client::Connection,
) {
    let mut conn = sender.connect(to.port(PORT)).await.unwrap();
    conn.send_bytes(Bytes::from(0u64.to_le_bytes().to_vec()))
        .await
        .unwrap();
    let inbound = tokio::time::timeout(WAIT, listener.accept())
        .await
        .unwrap()
        .unwrap();
    (conn, inbound)
}

/// The etcd cluster in one namespace, two peered daemons in another, a
/// veth between: cutting the link partitions etcd away from the daemons
/// while a transfer runs between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_partitioned_away_a_transfer_loses_nothing_and_the_claims_converge_after() {
    if !have_etcd() || !uniplane_netns::require("naming partition", false) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uniplane-naming-split-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pair = uniplane_netns::Pair::new().unwrap();
    let etcd = EtcdCluster::start(&dir, pair.addr_b, 3, || pair.b.command("etcd"));
    let clients = etcd.clients.clone();
    pair.a
        .run(move || wait_healthy(&clients, WAIT))
        .unwrap()
        .unwrap();
    let secret = dir.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let ids = ["10.41.0.1", "10.41.0.2"];
    let names = ["alpha", "beta"];
    let ports = [(free_port(), free_port()), (free_port(), free_port())];
    let dirs = [dir.join("d0"), dir.join("d1")];
    let configs = (0..2)
        .map(|i| {
            let o = 1 - i;
            let text = config(
                ids[i],
                names[i],
                ports[i],
                ids[o],
                ports[o],
                &secret,
                &etcd.clients,
            );
            let mut c = Config::parse(&text, "in-namespace").unwrap();
            c.runtime_dir = Some(dirs[i].clone());
            c
        })
        .collect();
    let _daemons =
        Detached::start(configs, |f| pair.a.spawn(f).map_err(std::io::Error::other)).unwrap();
    let ca = Client::connect(&dirs[0]).await.unwrap();
    let cb = Client::connect(&dirs[1]).await.unwrap();
    let start = Instant::now();
    while !(peers_alive(&ca).await && peers_alive(&cb).await) {
        assert!(start.elapsed() < WAIT, "the daemons did not peer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until(&dirs[0], "registered", all_held).await;
    until(&dirs[1], "registered", all_held).await;

    let receiver = Client::connect(&dirs[1])
        .await
        .unwrap()
        .attach("receiver")
        .await
        .unwrap();
    receiver.register("sink").await.unwrap();
    let mut listener = receiver.listen(PORT).await.unwrap();
    let sender = Client::connect(&dirs[0])
        .await
        .unwrap()
        .attach("sender")
        .await
        .unwrap();
    let to = ca.resolve("sink").await.unwrap();
    let (conn, inbound) = connected(&sender, to, &mut listener).await;
    let transfer = Transfer::start(conn, inbound);

    pair.a.ip(&["link", "set", &pair.iface_a, "down"]).unwrap();
    match sender.register("late").await {
        Err(ClientError::Daemon { kind, message }) => {
            assert_eq!(kind, "unavailable", "{message}")
        }
        r => panic!("a name claimed across a partition: {r:?}"),
    }
    until(&dirs[0], "lease given up", |v| {
        v["claims"]["lease"].is_null()
    })
    .await;
    until(&dirs[1], "lease given up", |v| {
        v["claims"]["lease"].is_null()
    })
    .await;
    // Still connected to each other all along.
    assert!(peers_alive(&ca).await && peers_alive(&cb).await);

    pair.a.ip(&["link", "set", &pair.iface_a, "up"]).unwrap();
    // The receiver's daemon holds "sink" again; the other sees it in the
    // directory once, never twice.
    until(&dirs[1], "claims held again", all_held).await;
    let sinks = |v: &Value| {
        v["names"]
            .as_array()
            .map_or(0, |n| n.iter().filter(|n| n["name"] == "sink").count())
    };
    let va = until(&dirs[0], "claims held again, sink listed", |v| {
        all_held(v) && v["servers"].as_array().is_some_and(|s| s.len() == 2) && sinks(v) > 0
    })
    .await;
    assert_eq!(sinks(&va), 1, "{va}");
    sender.register("late").await.unwrap();

    let (sent, received, gaps) = transfer.finish().await;
    assert_eq!(gaps, 0, "messages lost or reordered");
    assert_eq!(received, sent, "messages lost");
    assert!(sent > 100, "the transfer ran across the partition: {sent}");
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Server `me`'s file with no peers: they come from the directory.
fn discovering(me: &str, name: &str, ports: (u16, u16), secret: &Path, etcd: &[String]) -> String {
    let endpoints = toml_strings(etcd);
    format!(
        "[server]\nid = \"{me}\"\nname = \"{name}\"\npeer_listen = \"127.0.0.1:{}\"\n\n\
         [[stacks]]\nname = \"tcp\"\nlisten = \"127.0.0.1:{}\"\n\n\
         [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = 1\n\n\
         [failure]\nheartbeat_ms = 50\nmisses = 20\n\n\
         [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n\n\
         [registry]\nkind = \"etcd\"\nendpoints = [{endpoints}]\nprefix = \"/uniplane-test\"\n\
         lease_ttl_s = 1\ntimeout_ms = 300\n",
        ports.0,
        ports.1,
        secret.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_found_in_the_directory_become_peers_and_leave_when_their_record_goes() {
    if !have_etcd() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uniplane-naming-discover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let etcd = etcd_on_loopback(&dir).await;
    let secret = dir.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let text_a = discovering(
        "10.42.0.1",
        "alpha",
        (free_port(), free_port()),
        &secret,
        &etcd.clients,
    );
    let text_b = discovering(
        "10.42.0.2",
        "beta",
        (free_port(), free_port()),
        &secret,
        &etcd.clients,
    );
    let (a, ca) = embedded(Config::parse(&text_a, "a").unwrap(), &dir.join("a"))
        .await
        .unwrap();
    let dir_b = dir.join("b");
    let mut config_b = Config::parse(&text_b, "b").unwrap();
    config_b.runtime_dir = Some(dir_b.clone());
    let mut b = Detached::start(vec![config_b], |f| Ok(std::thread::spawn(f))).unwrap();

    // Neither file names the other: each finds it in the directory.
    let start = Instant::now();
    while !peers_alive(&ca).await {
        assert!(
            start.elapsed() < WAIT,
            "the directory's servers did not peer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cb = Client::connect(&dir_b).await.unwrap();
    while !peers_alive(&cb).await {
        assert!(
            start.elapsed() < WAIT,
            "the directory's servers did not peer"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A round trip to the other server's echo device, found by name.
    let echo = ca.resolve("echo@beta").await.unwrap();
    assert_eq!(echo.to_string(), "10.42.0.2:1");
    let app = client(&a).await.attach("app").await.unwrap();
    let mut conn = app.connect(echo.port(7)).await.unwrap();
    conn.send_bytes(Bytes::from_static(b"over a discovered peer"))
        .await
        .unwrap();
    let m = tokio::time::timeout(WAIT, conn.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(m.payload().as_ref(), b"over a discovered peer");

    // Beta crashes: its lease runs out, its record goes, and after the
    // grace it is no peer of alpha's any more.
    drop(cb);
    b.stop();
    let start = Instant::now();
    loop {
        let status = ca.request(&Request::Status).await.unwrap();
        if status["peers"].as_array().is_some_and(|p| p.is_empty()) {
            break;
        }
        assert!(start.elapsed() < WAIT, "beta is still a peer: {status:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = a;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_etcd_authentication_the_password_file_lets_a_daemon_in_and_a_wrong_one_not() {
    if !have_etcd() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uniplane-naming-auth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let etcd = etcd_on_loopback(&dir).await;
    let mut admin = etcd_client::Client::connect(&etcd.clients, None)
        .await
        .unwrap();
    admin.user_add("root", "s3cret-root", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let registry = |file: &Path| {
        let endpoints = toml_strings(&etcd.clients);
        format!(
            "[server]\nid = \"10.43.0.1\"\nname = \"alpha\"\npeer_listen = \"127.0.0.1:{}\"\n\n\
             [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = 1\n\n\
             [registry]\nkind = \"etcd\"\nendpoints = [{endpoints}]\nprefix = \"/uniplane-auth\"\n\
             user = \"root\"\npassword_file = \"{}\"\ntimeout_ms = 2000\n",
            free_port(),
            file.display()
        )
    };
    let wrong = dir.join("wrong.password");
    std::fs::write(&wrong, "not-it\n").unwrap();
    match embedded(
        Config::parse(&registry(&wrong), "auth").unwrap(),
        &dir.join("w"),
    )
    .await
    {
        Err(e) => assert!(e.to_string().contains("naming"), "{e}"),
        Ok(_) => panic!("a wrong password was let in"),
    }
    let right = dir.join("right.password");
    std::fs::write(&right, "s3cret-root\n").unwrap();
    let (d, c) = embedded(
        Config::parse(&registry(&right), "auth").unwrap(),
        &dir.join("r"),
    )
    .await
    .unwrap();
    until(&d, "registered with credentials", all_held).await;
    assert_eq!(
        c.resolve("echo@alpha").await.unwrap().to_string(),
        "10.43.0.1:1"
    );
    d.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_a_daemon_with_the_clusters_ca_registers_and_one_with_another_ca_cannot() {
    if !have_etcd() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uniplane-naming-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pki = TestPki::create(&dir, "cluster").unwrap();
    let stranger = TestPki::create(&dir, "stranger").unwrap();
    let etcd = EtcdCluster::start_tls(&dir, &pki);
    let file = |pki: &TestPki| {
        format!(
            "[server]\nid = \"10.44.0.1\"\nname = \"alpha\"\npeer_listen = \"127.0.0.1:{}\"\n\n\
             [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = 1\n\n\
             [registry]\nkind = \"etcd\"\nendpoints = [\"{}\"]\nprefix = \"/uniplane-tls\"\n\
             ca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\ntimeout_ms = 1000\n",
            free_port(),
            etcd.clients[0],
            pki.ca.display(),
            pki.client.0.display(),
            pki.client.1.display()
        )
    };
    let (d, c) = embedded(Config::parse(&file(&pki), "tls").unwrap(), &dir.join("ok"))
        .await
        .unwrap();
    until(&d, "registered over TLS", all_held).await;
    assert_eq!(
        c.resolve("echo@alpha").await.unwrap().to_string(),
        "10.44.0.1:1"
    );
    d.shutdown();
    drop((d, c));

    // Another CA: the daemon cannot trust the member (nor the member it),
    // so it holds nothing and says why; a name fails.
    let (d, _c) = embedded(
        Config::parse(&file(&stranger), "tls").unwrap(),
        &dir.join("stranger"),
    )
    .await
    .unwrap();
    let v = until(&d, "an error shown", |v| !v["claims"]["error"].is_null()).await;
    assert!(v["claims"]["lease"].is_null(), "{v:#}");
    let app = client(&d).await.attach("app").await.unwrap();
    match app.register("x").await {
        Err(ClientError::Daemon { kind, .. }) => assert_eq!(kind, "unavailable"),
        r => panic!("registered with an untrusted CA: {r:?}"),
    }
    d.shutdown();
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}
