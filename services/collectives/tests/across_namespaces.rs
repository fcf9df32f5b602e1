//! `uniplane-run -n 4` across two network namespaces joined by a veth: a
//! daemon in each (peered over a TCP tunnel on the veth), the cluster's
//! directory on an etcd member in the first, ranks 0 and 2 inside the
//! first namespace attached to its daemon, ranks 1 and 3 inside the
//! second. The ranks find each other only by name, through the directory,
//! and allreduce across the tunnel.
//!
//! Needs root with `ip netns`, and `etcd`; skips otherwise, unless
//! `UNIPLANE_REQUIRE_TOOLS=1` makes that a failure.

#[path = "../../testkit/two_namespaces.rs"]
mod two_namespaces;

use std::time::Duration;

use tokio::process::Command;
use two_namespaces::{example, TwoNamespaces};

const RUN: &str = env!("CARGO_BIN_EXE_uniplane-run");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_in_two_namespaces_meet_through_the_directory_and_allreduce() {
    if !TwoNamespaces::available("uniplane-run across namespaces") {
        return;
    }
    let program = example("allreduce");
    assert!(program.is_file(), "{} not built", program.display());
    let two = TwoNamespaces::start(51).await;
    let runtime = format!("{},{}", two.dirs[0].display(), two.dirs[1].display());
    let netns = format!("{},{}", two.pair.a.name(), two.pair.b.name());
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
    // rank of the first server sends at least its 800 KB vector across.
    let crossed = two.bytes_a_to_b().await;
    assert!(
        crossed > 800_000,
        "{crossed} bytes towards the other server"
    );
}
