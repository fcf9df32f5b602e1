//! The Jacobi example of the Shoal paper with its four endpoints as four
//! processes in two network namespaces joined by a veth: a daemon in each
//! (peered over a TCP tunnel on the veth), the cluster's directory on an
//! etcd member in the first; ranks 0 and 2 in the first namespace, 1 and
//! 3 in the second. The endpoints find each other by name through the
//! directory (`Endpoint::group_by_name`) and each checks its strip
//! against the single-process reference, bit for bit.
//!
//! Needs root with `ip netns`, and `etcd`; skips otherwise, unless
//! `UNIPLANE_REQUIRE_TOOLS=1` makes that a failure.

#[path = "../../testkit/two_namespaces.rs"]
mod two_namespaces;

use std::time::Duration;

use futures_util::StreamExt;

use tokio::process::Command;
use two_namespaces::{example, TwoNamespaces};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jacobi_on_four_processes_in_two_namespaces_matches_the_reference() {
    if !TwoNamespaces::available("jacobi across namespaces") {
        return;
    }
    let program = example("jacobi_rank");
    assert!(program.is_file(), "{} not built", program.display());
    let two = TwoNamespaces::start(52).await;
    let size = 4;
    let mut ranks: futures_util::stream::FuturesUnordered<_> = (0..size)
        .map(|rank| {
            let side = rank % 2;
            let run = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    [two.pair.a.name(), two.pair.b.name()][side],
                ])
                .arg(&program)
                .args(["96", "60"])
                .env("UNIPLANE_RUNTIME_DIR", &two.dirs[side])
                .env("UNIPLANE_COLL_RANK", rank.to_string())
                .env("UNIPLANE_COLL_SIZE", size.to_string())
                .env("UNIPLANE_COLL_JOB", "netns")
                .kill_on_drop(true)
                .output();
            async move { (rank, run.await) }
        })
        .collect();
    // Each rank is checked as it ends: one that fails is reported at once
    // with what it said (the others, waiting for it, are killed), not as
    // the whole run's timeout.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let mut finished = Vec::new();
    while let Some((rank, out)) = tokio::time::timeout_at(deadline, ranks.next())
        .await
        .unwrap_or_else(|_| panic!("ranks {finished:?} finished, the others not in time"))
    {
        let out = out.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "rank {rank}: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("rank {rank} of {size}: jacobi 96x96")),
            "{stdout}"
        );
        finished.push(rank);
    }
    // Halos crossed the tunnel between the namespaces.
    assert!(two.bytes_a_to_b().await > 0);
}
