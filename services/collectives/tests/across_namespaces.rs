//! `uniplane-run -n 4` across two network namespaces joined by a veth: a
//! daemon in each (peered over a TCP tunnel on the veth), the cluster's
//! directory on an etcd member in the first, ranks 0 and 2 inside the
//! first namespace attached to its daemon, ranks 1 and 3 inside the
//! second. The ranks find each other only by name, through the directory,
//! and allreduce across the tunnel.
//!
//! Needs root with `ip netns`, and `etcd`; skips otherwise, unless
//! `UNIPLANE_REQUIRE_TOOLS=1` makes that a failure.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::process::Command;
use uniplane_client::protocol::Request;
use uniplane_client::Client;
use uniplane_netns::etcd::{wait_healthy, EtcdCluster};
use uniplane_netns::{free_port, Pair};
use uniplane_services::client::Detached;
use uniplane_services::config::Config;

const RUN: &str = env!("CARGO_BIN_EXE_uniplane-run");
const WAIT: Duration = Duration::from_secs(30);

/// The example program, which `cargo test` builds next to the tests.
fn example(name: &str) -> PathBuf {
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
         [registry]\nkind = \"etcd\"\nendpoints = [\"{etcd}\"]\nprefix = \"/uniplane-run\"\n",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_in_two_namespaces_meet_through_the_directory_and_allreduce() {
    if !uniplane_netns::require("uniplane-run across namespaces", false)
        || !uniplane_netns::etcd::require("uniplane-run across namespaces")
    {
        return;
    }
    let program = example("allreduce");
    assert!(program.is_file(), "{} not built", program.display());
    let base = std::env::temp_dir().join(format!("uniplane-run-netns-{}", std::process::id()));
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
    let servers = [
        Server {
            id: Ipv4Addr::new(10, 51, 0, 1),
            addr: pair.addr_a,
            peer: free_port(),
            tunnel: free_port(),
        },
        Server {
            id: Ipv4Addr::new(10, 51, 0, 2),
            addr: pair.addr_b,
            peer: free_port(),
            tunnel: free_port(),
        },
    ];
    let dirs = [base.join("a"), base.join("b")];
    let _a = Detached::start(
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
    let _b = Detached::start(
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

    let runtime = format!("{},{}", dirs[0].display(), dirs[1].display());
    let netns = format!("{},{}", pair.a.name(), pair.b.name());
    let run = Command::new(RUN)
        .args(["-n", "4", "--runtime", &runtime, "--netns", &netns])
        .arg(&program)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("the job finishes in time")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for rank in 0..4 {
        assert!(
            stdout.contains(&format!("rank {rank} of 4: allreduce")),
            "{stdout}"
        );
    }
    // The ranks' traffic crossed the tunnel between the namespaces: each
    // rank sends at least its 800 KB vector to the other server.
    let stats = Client::connect(&dirs[0])
        .await
        .unwrap()
        .request(&Request::Stats)
        .await
        .unwrap();
    let through_tunnels: u64 = stats
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.contains("10.51.0.2")))
        .map(|p| p["counters"]["tx_bytes"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        through_tunnels > 800_000,
        "{through_tunnels} bytes towards the other server: {stats:#}"
    );
    drop(etcd);
    let _ = std::fs::remove_dir_all(&base);
}
