//! Two servers in two network namespaces joined by a veth, a daemon in
//! each (peered over a TCP tunnel on the veth, with a cluster secret),
//! the cluster's directory on an etcd member in the first namespace.
//! Shared by the tests of crates built on the client library (included
//! with `#[path]`); everything is torn down on drop.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use uniplane_client::protocol::Request;
use uniplane_client::Client;
use uniplane_netns::etcd::{wait_healthy, EtcdCluster};
use uniplane_netns::{free_port, Pair};
use uniplane_services::client::Detached;
use uniplane_services::config::Config;

const WAIT: Duration = Duration::from_secs(30);

/// An example program of the crate under test, which `cargo test` builds
/// next to the tests.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
    profile.join("examples").join(name)
}

struct Server {
    id: Ipv4Addr,
    addr: Ipv4Addr,
    peer: u16,
    tunnel: u16,
}

fn config(me: &Server, other: &Server, etcd: &str, secret: &Path, dir: &Path) -> Config {
    let text = format!(
        "[server]\nid = \"{}\"\npeer_listen = \"{}:{}\"\n\n\
         [[stacks]]\nname = \"tcp\"\nlisten = \"{}:{}\"\n\n\
         [[peers]]\nserver = \"{}\"\naddress = \"{}:{}\"\ntunnel = \"{}:{}\"\nstack = \"tcp\"\n\n\
         [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n\n\
         [registry]\nkind = \"etcd\"\nendpoints = [\"{etcd}\"]\nprefix = \"/uniplane-two\"\n",
        me.id,
        me.addr,
        me.peer,
        me.addr,
        me.tunnel,
        other.id,
        other.addr,
        other.peer,
        other.addr,
        other.tunnel,
        secret.display()
    );
    let mut c = Config::parse(&text, "server.toml").unwrap();
    c.runtime_dir = Some(dir.to_owned());
    c
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

/// The two servers, up and peered.
pub struct TwoNamespaces {
    // Dropped in this order: the daemons, etcd, the namespaces.
    _daemons: Vec<Detached>,
    _etcd: EtcdCluster,
    /// The namespaces (`a` holds etcd).
    pub pair: Pair,
    /// Each daemon's runtime directory (`a`'s first).
    pub dirs: [PathBuf; 2],
    /// The servers' IDs.
    pub ids: [Ipv4Addr; 2],
    base: PathBuf,
}

impl Drop for TwoNamespaces {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

impl TwoNamespaces {
    /// Whether the test can run here (root with `ip netns`, and `etcd`).
    pub fn available(test: &str) -> bool {
        uniplane_netns::require(test, false) && uniplane_netns::etcd::require(test)
    }

    /// Sets up both servers (IDs `10.<tag>.0.1` and `.2`) and waits until
    /// they are peers.
    pub async fn start(tag: u8) -> TwoNamespaces {
        let base =
            std::env::temp_dir().join(format!("uniplane-two-ns-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let pair = Pair::new().unwrap();
        let etcd = EtcdCluster::start(&base, pair.addr_a, 1, || pair.a.command("etcd"));
        let clients = etcd.clients.clone();
        pair.b
            .run(move || wait_healthy(&clients, WAIT))
            .unwrap()
            .unwrap();
        let secret = base.join("cluster.key");
        uniplane_services::auth::Key::generate(&secret).unwrap();
        let ids = [Ipv4Addr::new(10, tag, 0, 1), Ipv4Addr::new(10, tag, 0, 2)];
        let servers = [
            Server {
                id: ids[0],
                addr: pair.addr_a,
                peer: free_port(),
                tunnel: free_port(),
            },
            Server {
                id: ids[1],
                addr: pair.addr_b,
                peer: free_port(),
                tunnel: free_port(),
            },
        ];
        let dirs = [base.join("a"), base.join("b")];
        let a = Detached::start(
            vec![config(
                &servers[0],
                &servers[1],
                &etcd.clients[0],
                &secret,
                &dirs[0],
            )],
            |f| pair.a.spawn(f).map_err(std::io::Error::other),
        )
        .unwrap();
        let b = Detached::start(
            vec![config(
                &servers[1],
                &servers[0],
                &etcd.clients[0],
                &secret,
                &dirs[1],
            )],
            |f| pair.b.spawn(f).map_err(std::io::Error::other),
        )
        .unwrap();
        let start = Instant::now();
        for dir in &dirs {
            while !peers_alive(dir).await {
                assert!(start.elapsed() < WAIT, "the daemons did not peer");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        TwoNamespaces {
            _daemons: vec![a, b],
            _etcd: etcd,
            pair,
            dirs,
            ids,
            base,
        }
    }

    /// Bytes the first server's engine sent towards the second (its
    /// tunnel ports' transmit counters).
    pub async fn bytes_a_to_b(&self) -> u64 {
        let stats = Client::connect(&self.dirs[0])
            .await
            .unwrap()
            .request(&Request::Stats)
            .await
            .unwrap();
        let other = self.ids[1].to_string();
        stats
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["name"].as_str().is_some_and(|n| n.contains(&other)))
            .map(|p| p["counters"]["tx_bytes"].as_u64().unwrap_or(0))
            .sum()
    }
}
