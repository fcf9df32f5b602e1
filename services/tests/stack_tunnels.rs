//! Tunnels over the stacks that sit on an interface, between two daemons
//! in two network namespaces on a veth pair: raw Ethernet (`ether`, LTL
//! underneath) and user-space TCP (`smoltcp`). Each daemon
//! runs on threads inside its namespace; the test's applications reach
//! them through their runtime directories, and a round trip to the far
//! server's echo device crosses the tunnel. A tunnel stack that cannot
//! start fails the daemon's start with the reason.
//!
//! Needs root and `ip netns`; skips otherwise, unless
//! `UNIPLANE_REQUIRE_TOOLS=1` makes that a failure.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use uniplane_netns::{Namespace, Pair};
use uniplane_services::client::Client;
use uniplane_services::config::Config;
use uniplane_services::control::Request;
use uniplane_services::Daemon;

const WAIT: Duration = Duration::from_secs(20);

/// `iface`'s MAC in `ns`.
fn mac(ns: &Namespace, iface: &str) -> String {
    let out = ns.ip(&["-o", "link", "show", iface]).expect("ip link");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {text}"))
        .to_owned()
}

/// A running daemon on threads inside a namespace; stopped on drop.
struct Remote {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    dir: PathBuf,
}

impl Remote {
    /// Starts a daemon with `text` inside `ns`; its start's error, if any.
    fn start(ns: &Namespace, text: String, dir: PathBuf) -> Result<Remote, String> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (started, result) = std::sync::mpsc::channel::<Result<(), String>>();
        let thread = ns
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let config = match Config::parse(&text, "server.toml") {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = started.send(Err(e.to_string()));
                            return;
                        }
                    };
                    match Daemon::start(config).await {
                        Ok(d) => {
                            let _ = started.send(Ok(()));
                            let _ = stopped.await;
                            d.shutdown();
                        }
                        Err(e) => {
                            let _ = started.send(Err(e.to_string()));
                        }
                    }
                });
            })
            .map_err(|e| e.to_string())?;
        let r = result
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| Err("the daemon did not start in time".into()));
        let remote = Remote {
            stop: Some(stop),
            thread: Some(thread),
            dir,
        };
        r.map(|()| remote)
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Server `me`'s file: its `stack` table, a peer channel on `me`:7460,
/// `peer` over the same stack (`peer_tunnel` lines), an echo device.
fn config(
    me: Ipv4Addr,
    stack: &str,
    peer: Ipv4Addr,
    peer_tunnel: &str,
    dir: &Path,
    secret: &Path,
) -> String {
    format!(
        "[server]\nid = \"{me}\"\npeer_listen = \"{me}:7460\"\n\n\
         [runtime]\ndir = \"{}\"\n\n\
         [[stacks]]\n{stack}\n\n\
         [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = 1\n\n\
         [[peers]]\nserver = \"{peer}\"\naddress = \"{peer}:7460\"\n{peer_tunnel}\n\n\
         [failure]\nheartbeat_ms = 50\nmisses = 20\n\n\
         [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
        dir.display(),
        secret.display()
    )
}

async fn peers_alive(dir: &Path) -> bool {
    let Ok(c) = Client::connect(dir).await else {
        return false;
    };
    let Ok(status) = c.request(&Request::Status).await else {
        return false;
    };
    status["peers"]
        .as_array()
        .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true))
}

/// Two daemons on `pair`, their stack tables from `stack(side)` and the
/// peer lines from `peer_tunnel(side)` (side 0 is `a`); then 20 echo
/// round trips from an application on `a` to `b`'s echo device.
async fn round_trips_over(
    tag: &str,
    name: &str,
    pair: &Pair,
    stack: impl Fn(usize) -> String,
    peer_tunnel: impl Fn(usize) -> String,
) {
    let base = std::env::temp_dir().join(format!(
        "uniplane-stack-tunnels-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let secret = base.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let sides = [
        (&pair.a, pair.addr_a, pair.addr_b),
        (&pair.b, pair.addr_b, pair.addr_a),
    ];
    let mut daemons = Vec::new();
    for (i, (ns, me, peer)) in sides.into_iter().enumerate() {
        let dir = base.join(format!("d{i}"));
        let text = config(me, &stack(i), peer, &peer_tunnel(i), &dir, &secret);
        daemons.push(Remote::start(ns, text, dir).unwrap_or_else(|e| panic!("{tag}: {e}")));
    }
    let start = Instant::now();
    for d in &daemons {
        while !peers_alive(&d.dir).await {
            assert!(start.elapsed() < WAIT, "{tag}: the daemons did not peer");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let session = Client::connect(&daemons[0].dir)
        .await
        .unwrap()
        .attach("app")
        .await
        .unwrap();
    let echo = uniplane_dataplane::Uid::new(pair.addr_b, 1).port(7);
    let mut conn = tokio::time::timeout(WAIT, session.connect(echo))
        .await
        .expect("connected in time")
        .unwrap_or_else(|e| panic!("{tag}: connect: {e}"));
    for i in 0..20u32 {
        let text = format!("{tag} {i}");
        conn.send_bytes(Bytes::from(text.clone())).await.unwrap();
        let back = tokio::time::timeout(WAIT, conn.recv())
            .await
            .unwrap_or_else(|_| panic!("{tag}: echo {i} in time"))
            .expect("a message")
            .expect("not an error");
        assert_eq!(back.payload().as_ref(), text.as_bytes(), "{tag}");
    }
    let status = session.client().request(&Request::Status).await.unwrap();
    assert_eq!(status["stacks"][0], name);
    drop(conn);
    drop(session);
    drop(daemons);
    let _ = std::fs::remove_dir_all(&base);
}

fn ready() -> bool {
    uniplane_netns::require("stack_tunnels", false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_over_raw_ethernet_with_ltl_underneath() {
    if !ready() {
        return;
    }
    let pair = Pair::new().unwrap();
    let ifaces = [pair.iface_a.clone(), pair.iface_b.clone()];
    let macs = [mac(&pair.a, &pair.iface_a), mac(&pair.b, &pair.iface_b)];
    round_trips_over(
        "ltl-over-ether",
        "ether",
        &pair,
        |i| format!("name = \"ether\"\ninterface = \"{}\"", ifaces[i]),
        |i| format!("stack = \"ether\"\nmac = \"{}\"", macs[1 - i]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_over_user_space_tcp() {
    if !ready() {
        return;
    }
    let pair = Pair::new().unwrap();
    let ifaces = [pair.iface_a.clone(), pair.iface_b.clone()];
    // smoltcp's own addresses on the link, beside the kernel's.
    let own = [pair.addr_a, pair.addr_b].map(|a| {
        let o = a.octets();
        Ipv4Addr::new(o[0], o[1], o[2], o[3] + 10)
    });
    round_trips_over(
        "smoltcp",
        "smoltcp",
        &pair,
        |i| {
            format!(
                "name = \"smoltcp\"\ninterface = \"{}\"\naddress = \"{}/24\"\nlisten = \"{}:7470\"",
                ifaces[i], own[i], own[i]
            )
        },
        |i| format!("stack = \"smoltcp\"\ntunnel = \"{}:7470\"", own[1 - i]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_stack_on_a_missing_interface_fails_the_start() {
    if !ready() {
        return;
    }
    let pair = Pair::new().unwrap();
    let dir = std::env::temp_dir().join(format!(
        "uniplane-stack-tunnels-missing-{}",
        std::process::id()
    ));
    let secret = dir.join("cluster.key");
    std::fs::create_dir_all(&dir).unwrap();
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let text = config(
        pair.addr_a,
        "name = \"ether\"\ninterface = \"nosuch0\"",
        pair.addr_b,
        "stack = \"ether\"\nmac = \"02:00:00:00:00:02\"",
        &dir.join("d"),
        &secret,
    );
    let err = Remote::start(&pair.a, text, dir.join("d"))
        .err()
        .expect("the start fails");
    assert!(err.contains("ether") && err.contains("nosuch0"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_over_udp_on_io_uring_with_the_options_given() {
    if !ready() {
        return;
    }
    let pair = Pair::new().unwrap();
    let addrs = [pair.addr_a, pair.addr_b];
    round_trips_over(
        "udp-io-uring",
        "udp",
        &pair,
        |i| {
            format!(
                "name = \"udp\"\nlisten = \"{}:7470\"\nio_uring = true\ngso = false\nmtu = 1400",
                addrs[i]
            )
        },
        |i| format!("stack = \"udp\"\ntunnel = \"{}:7470\"", addrs[1 - i]),
    )
    .await;
}
