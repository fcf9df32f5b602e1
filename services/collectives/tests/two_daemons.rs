//! Ranks on two daemons peered over a TCP tunnel on loopback (two
//! servers in one process): they find each other through both daemons'
//! resource lists and run collectives across the tunnel, eager and
//! rendezvous. Every wait has a deadline.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use uniplane_client::protocol::Request;
use uniplane_client::Client;
use uniplane_collectives::{join, Op, Options, WorldSpec};
use uniplane_netns::free_port;
use uniplane_services::client::embedded;
use uniplane_services::config::Config;
use uniplane_services::Daemon;

fn config(
    me: &str,
    peer_port: u16,
    tunnel: u16,
    other: &str,
    other_peer: u16,
    other_tunnel: u16,
    secret: &Path,
) -> String {
    format!(
        "[server]\nid = \"{me}\"\npeer_listen = \"127.0.0.1:{peer_port}\"\n\n\
         [[stacks]]\nname = \"tcp\"\nlisten = \"127.0.0.1:{tunnel}\"\n\n\
         [[peers]]\nserver = \"{other}\"\naddress = \"127.0.0.1:{other_peer}\"\ntunnel = \"127.0.0.1:{other_tunnel}\"\nstack = \"tcp\"\n\n\
         [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ranks_on_two_peered_daemons_run_collectives_across_the_tunnel() {
    let base = std::env::temp_dir().join(format!("uniplane-coll-two-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let secret = base.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let ports = [free_port(), free_port(), free_port(), free_port()];
    let ids = ["10.20.0.1", "10.20.0.2"];
    let mut daemons: Vec<Daemon> = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for i in 0..2 {
        let o = 1 - i;
        let text = config(
            ids[i],
            ports[2 * i],
            ports[2 * i + 1],
            ids[o],
            ports[2 * o],
            ports[2 * o + 1],
            &secret,
        );
        let dir = base.join(format!("d{i}"));
        let (d, _client) = embedded(Config::parse(&text, &format!("two{i}")).unwrap(), &dir)
            .await
            .unwrap();
        daemons.push(d);
        dirs.push(dir);
    }
    let start = Instant::now();
    for dir in &dirs {
        while !peers_alive(dir).await {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the daemons did not peer"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let n = 4;
    let joins = (0..n).map(|rank| {
        let (mine, other) = (dirs[rank % 2].clone(), dirs[1 - rank % 2].clone());
        tokio::spawn(async move {
            let client = Client::connect(&mine).await?;
            let spec = WorldSpec {
                job: "two".into(),
                rank,
                size: n,
            };
            let options = Options {
                also_ask: vec![other],
                ..common::options()
            };
            join(client, &spec, options).await
        })
    });
    let comms: Vec<_> = tokio::time::timeout(common::STEP, futures_util::future::join_all(joins))
        .await
        .expect("the world joins in time")
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let results = common::on_all(&comms, |comm| async move {
        let r = comm.rank() as i64;
        let small = comm.allreduce(&[r, 1], Op::Sum).await?;
        // 400 KB: above the eager cap, so by rendezvous writes.
        let big: Vec<i64> = (0..50_000).map(|i| i + r).collect();
        let big = comm.allreduce(&big, Op::Max).await?;
        let all = comm
            .alltoall(&[r * 10, r * 10 + 1, r * 10 + 2, r * 10 + 3])
            .await?;
        comm.finalize().await?;
        Ok::<_, uniplane_collectives::Error>((small, big, all))
    })
    .await;
    for (rank, res) in results.into_iter().enumerate() {
        let (small, big, all) = res.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(small, [6, 4]);
        assert!(big.iter().enumerate().all(|(i, &v)| v == i as i64 + 3));
        let want: Vec<i64> = (0..4).map(|k| k * 10 + rank as i64).collect();
        assert_eq!(all, want);
    }
    drop(comms);
    for d in &daemons {
        d.shutdown();
    }
    let _ = std::fs::remove_dir_all(&base);
}
