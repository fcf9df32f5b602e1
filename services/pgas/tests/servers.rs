//! Endpoints on two servers: two embedded daemons peered over a TCP
//! tunnel on loopback, with a cluster secret, two endpoints on each.
//! Every wait has a deadline.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use common::within;
use uniplane_client::protocol::Request;
use uniplane_netns::free_port;
use uniplane_pgas::jacobi::{reference, rows_of, run_rank, Spec};
use uniplane_pgas::{Acl, AtomicOp, Call, Completion, Endpoint, Group, Options, Width};
use uniplane_services::client::{embedded, Client};
use uniplane_services::config::Config;
use uniplane_services::Daemon;

struct Servers {
    daemons: Vec<Daemon>,
    dir: PathBuf,
}

impl Drop for Servers {
    fn drop(&mut self) {
        for d in &self.daemons {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn peers_alive(runtime: &Path) -> bool {
    let Ok(c) = Client::connect(runtime).await else {
        return false;
    };
    let Ok(status) = c.request(&Request::Status).await else {
        return false;
    };
    status["peers"]
        .as_array()
        .is_some_and(|p| p.iter().any(|x| x["alive"] == true))
}

async fn two_servers(name: &str) -> Servers {
    let dir = std::env::temp_dir().join(format!("uniplane-pgas-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let addr = |p| SocketAddr::from(([127, 0, 0, 1], p));
    let ends = [
        ("10.30.0.1", addr(free_port()), addr(free_port())),
        ("10.30.0.2", addr(free_port()), addr(free_port())),
    ];
    let mut daemons = Vec::new();
    for (i, (me, peer, tunnel)) in ends.iter().enumerate() {
        let (other, opeer, otunnel) = ends[1 - i];
        let text = format!(
            "[server]\nid = \"{me}\"\npeer_listen = \"{peer}\"\n\n\
             [[stacks]]\nname = \"tcp\"\nlisten = \"{tunnel}\"\n\n\
             [[peers]]\nserver = \"{other}\"\naddress = \"{opeer}\"\ntunnel = \"{otunnel}\"\nstack = \"tcp\"\n\n\
             [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
            secret.display()
        );
        let runtime = dir.join(format!("d{i}"));
        let (daemon, _client) = embedded(
            Config::parse(&text, &format!("{name}{i}")).unwrap(),
            &runtime,
        )
        .await
        .unwrap();
        daemons.push(daemon);
    }
    for d in &daemons {
        let rt = d.runtime_dir().to_owned();
        within("peers alive", async {
            while !peers_alive(&rt).await {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
    }
    Servers { daemons, dir }
}

/// Ranks 0 and 1 on the first server, 2 and 3 on the second.
async fn endpoints(s: &Servers, prepare: impl Fn(&Endpoint)) -> Vec<Endpoint> {
    let mut eps = Vec::new();
    for i in 0..4 {
        let session = Client::connect(s.daemons[i / 2].runtime_dir())
            .await
            .unwrap()
            .attach(&format!("rank{i}"))
            .await
            .unwrap();
        let ep = Endpoint::bind(session, Options::default()).await.unwrap();
        prepare(&ep);
        eps.push(ep);
    }
    let g = Group::new(eps.iter().map(Endpoint::uid).collect());
    for r in within(
        "join",
        futures_util::future::join_all(eps.iter().map(|e| e.join(g.clone()))),
    )
    .await
    {
        r.unwrap();
    }
    eps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn puts_gets_and_atomics_cross_servers_byte_for_byte() {
    let s = two_servers("servers").await;
    let eps = endpoints(&s, |ep| {
        ep.register_segment(1 << 20, Acl::ReadWrite);
    })
    .await;
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    within(
        "put",
        eps[0].long(3, 0, 0, &data, Call::counter(1), Completion::Reply),
    )
    .await
    .unwrap();
    within("replies", eps[0].wait_replies(1)).await.unwrap();
    within("signal", eps[3].wait_counter_from(0, 1)).await;
    assert!(eps[3].segment(0).unwrap().to_vec() == data);
    let back = within("get", eps[2].get(3, 0, 0, 1 << 20)).await.unwrap();
    assert!(back == data);
    let adds = eps.iter().map(|ep| async move {
        for _ in 0..50 {
            ep.atomic(1, 0, 0, Width::W64, AtomicOp::FetchAdd(1))
                .await
                .unwrap();
        }
    });
    within("atomics", futures_util::future::join_all(adds)).await;
    assert_eq!(
        eps[1].segment(0).unwrap().read(0, 8).unwrap(),
        200u64.to_le_bytes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jacobi_across_two_servers_gives_the_reference_grid_bit_for_bit() {
    let s = two_servers("jacobi-servers").await;
    let eps = endpoints(&s, |_| {}).await;
    let spec = Spec {
        n: 34,
        iterations: 30,
    };
    let strips = within(
        "jacobi",
        futures_util::future::join_all(eps.iter().map(|ep| run_rank(ep, spec))),
    )
    .await;
    let want = reference(spec);
    for (r, strip) in strips.into_iter().enumerate() {
        let rows = rows_of(r, 4, spec.n);
        assert!(
            strip.unwrap()[..] == want[rows.start * spec.n..rows.end * spec.n],
            "rank {r}"
        );
    }
}
