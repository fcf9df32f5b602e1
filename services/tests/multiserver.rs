//! Three servers in three network namespaces, each with its own uniplaned,
//! joined by a bridge: cross-server connections with send/recv and
//! write/read, a route through a relay device, an access-control denial,
//! a killed daemon whose connections (and only those) are notified, and a
//! restarted one that applications reconnect to.
//!
//! With the `rtl` feature the same runs with every server on the RTL plane
//! and with servers alternating engine, RTL, engine; and, on two servers,
//! an application on server A calls the Verilog sum32 kernel of server B
//! (`backend = "rtl"`, B on the RTL plane) across the tunnel, with A on
//! either plane: 300 random messages, every sum byte-exact; then writes
//! and reads back 300 KB of B's host memory device (on B's RTL plane).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use uniplane_dataplane::{LinkError, Uid};
use uniplane_netns::Namespace;
use uniplane_services::client::{Client, ClientError, Connection, Session};
use uniplane_services::control::Request;
#[cfg(feature = "rtl")]
use uniplane_services::transfer::{self, Route, Went};

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// N namespaces on one bridge (in a hub namespace), at 10.R.S.1…N.
struct Lan {
    servers: Vec<Namespace>,
    addrs: Vec<Ipv4Addr>,
    _hub: Namespace,
}

impl Lan {
    fn new(n: usize) -> Lan {
        uniplane_netns::remove_leftovers();
        let hub = Namespace::new().expect("hub namespace");
        hub.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
        hub.ip(&["link", "set", "br0", "up"]).unwrap();
        let tag = std::process::id() % 10_000;
        let (r, s) = (200 + (tag / 250) as u8 % 50, (tag % 250) as u8);
        let mut servers = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..n {
            let ns = Namespace::new().expect("server namespace");
            let (inner, outer) = (format!("eth{i}"), format!("up{tag}s{i}"));
            ip(&[
                "link",
                "add",
                &inner,
                "netns",
                ns.name(),
                "type",
                "veth",
                "peer",
                "name",
                &outer,
                "netns",
                hub.name(),
            ]);
            hub.ip(&["link", "set", &outer, "master", "br0"]).unwrap();
            hub.ip(&["link", "set", &outer, "up"]).unwrap();
            let addr = Ipv4Addr::new(10, r, s, i as u8 + 1);
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", &inner])
                .unwrap();
            ns.ip(&["link", "set", &inner, "up"]).unwrap();
            servers.push(ns);
            addrs.push(addr);
        }
        Lan {
            servers,
            addrs,
            _hub: hub,
        }
    }
}

fn config(lan: &Lan, i: usize, runtime: &Path, plane: &str, secret: &Path) -> String {
    let me = lan.addrs[i];
    let mut c = format!(
        r#"
plane = "{plane}"

[server]
id = "{me}"
name = "server{i}"
peer_listen = "{me}:7460"

[runtime]
dir = "{}"

[[stacks]]
name = "tcp"
listen = "{me}:7470"

[[devices]]
name = "echo"
kind = "echo"
device = 1
memory = 65536

[[devices]]
name = "relay"
kind = "relay"
device = 2

[failure]
heartbeat_ms = 50
misses = 6

[cluster]
secret = "{}"

[policy]
default = "allow"

# Server 3 may not open connections to server 1's echo device.
[[policy.rules]]
src = "{}:*"
dst = "{}:1"
types = ["CONNECT"]
action = "deny"
"#,
        runtime.display(),
        secret.display(),
        lan.addrs[2],
        lan.addrs[0],
    );
    for (j, peer) in lan.addrs.iter().enumerate() {
        if j != i {
            c.push_str(&format!(
                "\n[[peers]]\nserver = \"{peer}\"\naddress = \"{peer}:7460\"\ntunnel = \"{peer}:7470\"\nstack = \"tcp\"\n"
            ));
        }
    }
    if i == 1 && plane == "engine" {
        // Server 2 hosts a kernel (the software engine drives kernels).
        c.push_str(
            "\n[[devices]]\nname = \"sum\"\nkind = \"kernel\"\ndevice = 3\n\
             backend = \"emulated\"\nfunction = \"sum32\"\n",
        );
    }
    if i == 0 {
        // Server 1 reaches server 3 through its relay device.
        c.push_str(&format!(
            "\n[[routes]]\nfrom = \"*\"\nvia = \"relay\"\nto = \"{}:*\"\n",
            lan.addrs[2]
        ));
    }
    c
}

struct Server {
    ns_name: String,
    config: PathBuf,
    runtime: PathBuf,
    child: Option<Child>,
}

impl Server {
    fn start(&mut self) {
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns_name,
                env!("CARGO_BIN_EXE_uniplaned"),
                "--config",
            ])
            .arg(&self.config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("uniplaned starts");
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits (bounded) until `check` holds.
async fn until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn peers_alive(runtime: &Path, want: usize) -> bool {
    let Ok(c) = Client::connect(runtime).await else {
        return false;
    };
    let Ok(status) = c.request(&Request::Status).await else {
        return false;
    };
    status["peers"]
        .as_array()
        .is_some_and(|p| p.iter().filter(|x| x["alive"] == true).count() == want)
}

async fn echo_round_trip(conn: &mut Connection, text: &str) -> Result<Bytes, LinkError> {
    conn.send_bytes(Bytes::copy_from_slice(text.as_bytes()))
        .await?;
    match tokio::time::timeout(Duration::from_secs(3), conn.recv()).await {
        Ok(Some(Ok(m))) => Ok(m.payload().clone()),
        Ok(Some(Err(e))) => Err(e),
        Ok(None) => Err(LinkError::Closed),
        Err(_) => Err(LinkError::PeerFailed("no echo within 3 s".into())),
    }
}

async fn session(runtime: &Path, name: &str) -> Session {
    Client::connect(runtime)
        .await
        .expect("control socket")
        .attach(name)
        .await
        .expect("attach")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_connect_route_deny_fail_and_recover() {
    three_servers(["engine", "engine", "engine"]).await;
}

/// Every server on the RTL plane: tunnels cross it cut and joined by its
/// port bridge.
#[cfg(feature = "rtl")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_on_the_rtl_plane() {
    three_servers(["rtl", "rtl", "rtl"]).await;
}

/// An engine and an RTL plane talking to each other.
#[cfg(feature = "rtl")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_alternating_engine_and_rtl() {
    three_servers(["engine", "rtl", "engine"]).await;
}

/// Ports of the RTL plane (the 8-port model).
const RTL_PORTS: usize = 8;

async fn three_servers(planes: [&str; 3]) {
    if !uniplane_netns::require("three_servers", false) {
        return;
    }
    let lan = Lan::new(3);
    let dir = std::env::temp_dir().join(format!(
        "uniplane-3srv-{}-{}",
        std::process::id(),
        planes.join("-")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("cluster.key");
    let _ = std::fs::remove_file(&secret);
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let mut servers: Vec<Server> = (0..3)
        .map(|i| {
            let runtime = dir.join(format!("s{i}"));
            std::fs::create_dir_all(&runtime).unwrap();
            let file = dir.join(format!("s{i}.toml"));
            std::fs::write(&file, config(&lan, i, &runtime, planes[i], &secret)).unwrap();
            Server {
                ns_name: lan.servers[i].name().to_owned(),
                config: file,
                runtime,
                child: None,
            }
        })
        .collect();
    for s in &mut servers {
        s.start();
    }
    for s in &servers {
        let rt = s.runtime.clone();
        until("peers up", Duration::from_secs(15), || peers_alive(&rt, 2)).await;
    }
    let uid = |server: usize, device: u16| Uid::new(lan.addrs[server], device);

    // An application on server 1 talks to server 2's echo device.
    let app = session(&servers[0].runtime, "app").await;
    let mut to2 = app
        .connect(uid(1, 1).port(7))
        .await
        .expect("connect to server 2");
    assert_eq!(
        echo_round_trip(&mut to2, "hello 2").await.unwrap().as_ref(),
        b"hello 2"
    );
    if planes[1] == "engine" {
        // ... and calls the kernel on server 2 by its UID.
        let mut sum = app
            .connect(uid(1, 3).port(7))
            .await
            .expect("connect to the kernel");
        let words: Vec<u8> = [40u32, 2, u32::MAX]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        sum.send_bytes(Bytes::from(words)).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), sum.recv())
            .await
            .expect("the kernel answers")
            .unwrap()
            .unwrap();
        assert_eq!(answer.payload().as_ref(), 41u32.to_le_bytes());
        app.close(sum).await.unwrap();
    }

    // Server 1 holds its daemon, two devices, the app and a tunnel each
    // way to each peer: 8 ports.
    let rt = servers[0].runtime.clone();
    until("inbound tunnels", Duration::from_secs(5), || {
        inbound_tunnels(&rt, 2)
    })
    .await;
    let tunnels_before = tunnel_ports(&servers[0].runtime).await;
    if planes[0] == "rtl" {
        // The RTL's 8 ports are all taken: a tunnel of class 1 is refused
        // cleanly, and what runs is untouched.
        assert_eq!(port_count(&servers[0].runtime).await, RTL_PORTS);
        let refused = app.connect_class(uid(1, 1).port(8), 1).await;
        assert!(
            matches!(&refused, Err(ClientError::Daemon { .. })),
            "{:?}",
            refused.err()
        );
        assert_eq!(tunnel_ports(&servers[0].runtime).await, tunnels_before);
        assert_eq!(
            echo_round_trip(&mut to2, "still 2").await.unwrap().as_ref(),
            b"still 2"
        );
    } else {
        // A connection of traffic class 1 gets a tunnel of its own; two
        // connections of that class share it.
        let mut class1 = app
            .connect_class(uid(1, 1).port(8), 1)
            .await
            .expect("class 1");
        let mut class1b = app
            .connect_class(uid(1, 1).port(9), 1)
            .await
            .expect("class 1 again");
        assert_eq!(
            echo_round_trip(&mut class1, "class 1")
                .await
                .unwrap()
                .as_ref(),
            b"class 1"
        );
        assert_eq!(
            echo_round_trip(&mut class1b, "class 1b")
                .await
                .unwrap()
                .as_ref(),
            b"class 1b"
        );
        assert_eq!(tunnel_ports(&servers[0].runtime).await, tunnels_before + 1);
    }

    // A large message crosses whole (a TCP tunnel's MTU is the largest
    // payload, so nothing is cut here; hw/sim/tests/runtime.rs cuts).
    let big: String = (0..100_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let big = &big[..60_000];
    assert_eq!(
        echo_round_trip(&mut to2, big).await.unwrap().as_ref(),
        big.as_bytes()
    );

    // One-sided write and read of server 2's echo memory.
    app.write(uid(1, 1).at(0x40), Bytes::from_static(b"remote bytes"))
        .await
        .expect("write");
    let back = app.read(uid(1, 1).at(0x40), 12).await.expect("read");
    assert_eq!(back.as_ref(), b"remote bytes");
    let outside = app
        .write(uid(1, 1).at(65_530), Bytes::from_static(b"too far"))
        .await;
    assert!(
        matches!(outside, Err(ClientError::Status(_))),
        "{outside:?}"
    );

    // Server 3 is reached through server 1's relay device.
    let relay_before = relay_rx(&servers[0].runtime).await;
    let mut to3 = app
        .connect(uid(2, 1).port(7))
        .await
        .expect("connect to server 3");
    assert_eq!(
        echo_round_trip(&mut to3, "via relay")
            .await
            .unwrap()
            .as_ref(),
        b"via relay"
    );
    assert!(
        relay_rx(&servers[0].runtime).await > relay_before,
        "the relay carried it"
    );

    // Access control: server 3 may not connect to server 1's echo.
    let app3 = session(&servers[2].runtime, "app3").await;
    let denied = app3.connect(uid(0, 1).port(7)).await;
    assert!(
        matches!(&denied, Err(ClientError::Daemon { .. })),
        "{:?}",
        denied.err()
    );

    // Kill server 2's daemon: the connection to it is notified, the one to
    // server 3 is untouched.
    let killed_at = Instant::now();
    servers[1].kill();
    let failure = tokio::time::timeout(Duration::from_secs(3), to2.recv()).await;
    let notified_after = killed_at.elapsed();
    match failure {
        Ok(Some(Err(LinkError::PeerFailed(_)))) | Ok(None) => {}
        other => panic!("expected a failure notice, got {other:?}"),
    }
    assert!(
        notified_after < Duration::from_millis(1500),
        "notified after {notified_after:?}"
    );
    assert_eq!(
        echo_round_trip(&mut to3, "still here")
            .await
            .unwrap()
            .as_ref(),
        b"still here"
    );

    // Restart it: applications can reconnect.
    servers[1].start();
    let rt = servers[0].runtime.clone();
    until("server 2 back", Duration::from_secs(15), || {
        peers_alive(&rt, 2)
    })
    .await;
    let mut again = app.connect(uid(1, 1).port(7)).await.expect("reconnect");
    assert_eq!(
        echo_round_trip(&mut again, "again").await.unwrap().as_ref(),
        b"again"
    );

    // A silent failure: server 2's link goes down, nothing resets the TCP
    // connections, only the missing heartbeats tell.
    let cut_at = Instant::now();
    lan.servers[1].ip(&["link", "set", "eth1", "down"]).unwrap();
    let failure = tokio::time::timeout(Duration::from_secs(3), again.recv()).await;
    let detected_after = cut_at.elapsed();
    match failure {
        Ok(Some(Err(LinkError::PeerFailed(_)))) | Ok(None) => {}
        other => panic!("expected a failure notice, got {other:?}"),
    }
    // 6 missed heartbeats of 50 ms, then the notice.
    assert!(
        detected_after >= Duration::from_millis(250),
        "too early: {detected_after:?}"
    );
    assert!(
        detected_after < Duration::from_millis(1500),
        "notified after {detected_after:?}"
    );
    assert_eq!(
        echo_round_trip(&mut to3, "unaffected")
            .await
            .unwrap()
            .as_ref(),
        b"unaffected"
    );

    for s in &mut servers {
        s.kill();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Tunnel ports of a daemon, from its stats.
async fn tunnel_ports(runtime: &Path) -> usize {
    let c = Client::connect(runtime).await.unwrap();
    let stats = c.request(&Request::Stats).await.unwrap();
    stats
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("tunnel-")))
        .count()
}

/// Ports of a daemon, from its stats.
async fn port_count(runtime: &Path) -> usize {
    let c = Client::connect(runtime).await.unwrap();
    let stats = c.request(&Request::Stats).await.unwrap();
    stats.as_array().unwrap().len()
}

/// Whether a daemon has `want` tunnel ports its peers opened to it.
async fn inbound_tunnels(runtime: &Path, want: usize) -> bool {
    let Ok(c) = Client::connect(runtime).await else {
        return false;
    };
    let Ok(stats) = c.request(&Request::Stats).await else {
        return false;
    };
    stats.as_array().is_some_and(|ports| {
        ports
            .iter()
            .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("from-")))
            .count()
            == want
    })
}

async fn relay_rx(runtime: &Path) -> u64 {
    let c = Client::connect(runtime).await.unwrap();
    let t = c.request(&Request::Tables { device: 2 }).await.unwrap();
    t["counters"]["rx_msgs"].as_u64().unwrap()
}

/// An application on server A calls the Verilog sum32 kernel on server B
/// (`backend = "rtl"`, B on the RTL plane's kernel model) across the
/// tunnel, with A on the engine.
#[cfg(feature = "rtl")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_calls_an_rtl_kernel_on_another_server_from_the_engine() {
    app_calls_a_remote_rtl_kernel("engine").await;
}

/// The same with A on the RTL plane too.
#[cfg(feature = "rtl")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_calls_an_rtl_kernel_on_another_server_from_the_rtl_plane() {
    app_calls_a_remote_rtl_kernel("rtl").await;
}

/// Server `i` of two: `plane` for server A (0); server B (1) on the RTL
/// plane with the RTL sum32 kernel as device 3 beside an echo device.
#[cfg(feature = "rtl")]
fn kernel_config(lan: &Lan, i: usize, runtime: &Path, plane: &str, secret: &Path) -> String {
    let me = lan.addrs[i];
    let peer = lan.addrs[1 - i];
    let mut c = format!(
        r#"
plane = "{plane}"

[server]
id = "{me}"
name = "server{i}"
peer_listen = "{me}:7460"

[runtime]
dir = "{}"

[[stacks]]
name = "tcp"
listen = "{me}:7470"

[[devices]]
name = "echo"
kind = "echo"
device = 1
memory = 65536

[failure]
heartbeat_ms = 50
misses = 6

[cluster]
secret = "{}"

[policy]
default = "allow"

[[peers]]
server = "{peer}"
address = "{peer}:7460"
tunnel = "{peer}:7470"
stack = "tcp"
"#,
        runtime.display(),
        secret.display(),
    );
    if i == 1 {
        c.push_str(
            "\n[[devices]]\nname = \"sum\"\nkind = \"kernel\"\ndevice = 3\n\
             backend = \"rtl\"\nfunction = \"sum32\"\n\
             \n[[devices]]\nname = \"mem\"\nkind = \"memory\"\ndevice = 4\n\
             memory = 1048576\n",
        );
    }
    c
}

#[cfg(feature = "rtl")]
async fn app_calls_a_remote_rtl_kernel(plane_a: &str) {
    if !uniplane_netns::require("app_calls_a_remote_rtl_kernel", false) {
        return;
    }
    let lan = Lan::new(2);
    let dir = std::env::temp_dir().join(format!("uniplane-rtlk-{}-{plane_a}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("cluster.key");
    let _ = std::fs::remove_file(&secret);
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let planes = [plane_a, "rtl"];
    let mut servers: Vec<Server> = (0..2)
        .map(|i| {
            let runtime = dir.join(format!("s{i}"));
            std::fs::create_dir_all(&runtime).unwrap();
            let file = dir.join(format!("s{i}.toml"));
            std::fs::write(&file, kernel_config(&lan, i, &runtime, planes[i], &secret)).unwrap();
            Server {
                ns_name: lan.servers[i].name().to_owned(),
                config: file,
                runtime,
                child: None,
            }
        })
        .collect();
    for s in &mut servers {
        s.start();
    }
    for s in &servers {
        let rt = s.runtime.clone();
        until("peers up", Duration::from_secs(15), || peers_alive(&rt, 1)).await;
    }
    let app = session(&servers[0].runtime, "app").await;
    // Server B's echo device, then its RTL kernel, by their UIDs.
    let mut echo = app
        .connect(Uid::new(lan.addrs[1], 1).port(7))
        .await
        .expect("connect to B's echo");
    assert_eq!(
        echo_round_trip(&mut echo, "hello B")
            .await
            .unwrap()
            .as_ref(),
        b"hello B"
    );
    let mut sum = app
        .connect(Uid::new(lan.addrs[1], 3).port(7))
        .await
        .expect("connect to B's rtl kernel");
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ planes.len() as u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let count = 300;
    for i in 0..count {
        let words: Vec<u32> = (0..1 + next() % 512).map(|_| next() as u32).collect();
        let payload: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let want = words.iter().fold(0u32, |a, w| a.wrapping_add(*w));
        sum.send_bytes(Bytes::from(payload)).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), sum.recv())
            .await
            .unwrap_or_else(|_| panic!("answer {i} never came"))
            .expect("the connection stays open")
            .unwrap_or_else(|e| panic!("answer {i}: {e:?}"));
        assert_eq!(
            answer.payload().as_ref(),
            want.to_le_bytes(),
            "message {i} of {} words",
            words.len()
        );
    }
    // B's kernel port counted each message and each answer.
    let b = Client::connect(&servers[1].runtime).await.unwrap();
    let t = b.request(&Request::Tables { device: 3 }).await.unwrap();
    assert_eq!(t["port"], 7, "{t}");
    assert_eq!(t["counters"]["rx_msgs"], count, "{t}");
    app.close(sum).await.unwrap();

    // B's host memory, on B's RTL plane, written and read from A: another
    // server's memory is not mapped, so the transfer goes by messages
    // through the tunnel, of the tunnel's size.
    let a = Client::connect(&servers[0].runtime).await.unwrap();
    let status = a.request(&Request::Status).await.unwrap();
    let mtu = status["peers"][0]["tunnel_mtu"]
        .as_u64()
        .expect("tunnel_mtu") as usize;
    let data: Vec<u8> = (0..300_000).map(|_| next() as u8).collect();
    let at = Uid::new(lan.addrs[1], 4).at(12_345);
    let went = transfer::write_by(&app, at, Bytes::from(data.clone()), mtu, Route::Auto)
        .await
        .expect("write B's memory");
    assert_eq!(went, Went::Messages(data.len().div_ceil(mtu)));
    let mut back = vec![0u8; data.len()];
    transfer::read_by(&app, at, &mut back, mtu, Route::Auto)
        .await
        .expect("read B's memory");
    assert!(back == data, "B's memory read back differently");
    let past = transfer::write_by(
        &app,
        Uid::new(lan.addrs[1], 4).at(1_048_570),
        Bytes::from_static(b"too far"),
        mtu,
        Route::Auto,
    )
    .await;
    assert!(matches!(past, Err(ClientError::Status(_))), "{past:?}");
    drop(servers);
    let _ = std::fs::remove_dir_all(&dir);
}
