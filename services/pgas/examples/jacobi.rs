//! The Jacobi example of the Shoal paper on one host: N endpoints (N
//! sessions of one uniplaned started in this process) share an `n × n`
//! grid by strips and exchange halos with long puts and signals; the
//! result is checked against the single-process reference, bit for bit.
//!
//! ```text
//! cargo run --release -p uniplane-pgas --example jacobi -- [RANKS] [N] [ITERATIONS]
//! cargo run --release -p uniplane-pgas --example jacobi -- sweep
//! ```
//!
//! `sweep` prints the time per iteration for 1, 2, 4 and 8 ranks on 64²,
//! 256² and 1024² grids.

use std::time::Instant;

use uniplane_pgas::jacobi::{reference, rows_of, run_rank, Spec};
use uniplane_pgas::{Endpoint, Group, Options};
use uniplane_services::client::{embedded, Client};
use uniplane_services::config::Config;

const CONFIG: &str = r#"
[server]
id = "127.0.0.1"
peer_listen = "127.0.0.1:0"
"#;

/// Seconds per iteration of `spec` on `ranks` endpoints, after checking
/// the grid against the reference.
async fn run(ranks: usize, spec: Spec) -> Result<f64, Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("uniplane-jacobi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (daemon, _client) = embedded(Config::parse(CONFIG, "jacobi")?, &dir).await?;
    let mut eps = Vec::new();
    for i in 0..ranks {
        let session = Client::connect(daemon.runtime_dir())
            .await?
            .attach(&format!("kernel{i}"))
            .await?;
        eps.push(Endpoint::bind(session, Options::default()).await?);
    }
    let group = Group::new(eps.iter().map(Endpoint::uid).collect());
    for r in futures_util::future::join_all(eps.iter().map(|e| e.join(group.clone()))).await {
        r?;
    }
    let start = Instant::now();
    let strips = futures_util::future::join_all(eps.iter().map(|ep| {
        let ep = ep.clone();
        tokio::spawn(async move { run_rank(&ep, spec).await })
    }))
    .await;
    let per_iteration = start.elapsed().as_secs_f64() / spec.iterations.max(1) as f64;
    let want = reference(spec);
    for (r, strip) in strips.into_iter().enumerate() {
        let strip = strip??;
        let rows = rows_of(r, ranks, spec.n);
        if strip[..] != want[rows.start * spec.n..rows.end * spec.n] {
            return Err(format!("rank {r}'s strip differs from the reference").into());
        }
    }
    drop(eps);
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(per_iteration)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("sweep") {
        println!("{:>6} {:>6} {:>14}", "n", "ranks", "µs/iteration");
        for n in [64, 256, 1024] {
            for ranks in [1, 2, 4, 8] {
                let spec = Spec { n, iterations: 200 };
                let t = run(ranks, spec).await?;
                println!("{n:>6} {ranks:>6} {:>14.1}", t * 1e6);
            }
        }
        return Ok(());
    }
    let num = |i: usize, default: usize| -> Result<usize, String> {
        args.get(i).map_or(Ok(default), |a| {
            a.parse().map_err(|_| format!("not a number: {a}"))
        })
    };
    let ranks = num(0, 4)?;
    let spec = Spec {
        n: num(1, 256)?,
        iterations: num(2, 500)?,
    };
    let t = run(ranks, spec).await?;
    println!(
        "{ranks} ranks, {n}×{n} grid, {it} iterations: same grid as the reference; {us:.1} µs per iteration",
        n = spec.n,
        it = spec.iterations,
        us = t * 1e6
    );
    Ok(())
}
