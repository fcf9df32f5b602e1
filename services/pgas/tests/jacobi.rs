//! The Jacobi example on N endpoints of one daemon gives exactly the grid
//! of the single-process reference.

mod common;

use std::net::Ipv4Addr;

use common::{group, group_with_devices, within};
use uniplane_dataplane::Uid;
use uniplane_pgas::jacobi::{reference, rows_of, run_rank, run_rank_with_store, HaloStore, Spec};
use uniplane_pgas::{HardwareStats, Options, STATS_BYTES, STATS_SEGMENT};

async fn distributed_equals_reference(name: &str, ranks: usize, spec: Spec) {
    let s = group(name, ranks, |_| {}).await;
    let runs = s.eps.iter().map(|ep| run_rank(ep, spec));
    let strips = within("jacobi", futures_util::future::join_all(runs)).await;
    check_strips(strips, ranks, spec);
}

/// Each rank's strip is the reference's rows, bit for bit.
fn check_strips(strips: Vec<Result<Vec<f64>, uniplane_pgas::PgasError>>, ranks: usize, spec: Spec) {
    let want = reference(spec);
    let n = spec.n;
    for (r, strip) in strips.into_iter().enumerate() {
        let strip = strip.unwrap();
        let rows = rows_of(r, ranks, n);
        let expect = &want[rows.start * n..rows.end * n];
        // Bit for bit: the same arithmetic in the same order.
        let same = strip
            .iter()
            .zip(expect)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let first = strip
            .iter()
            .zip(expect)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(
            same && strip.len() == expect.len(),
            "rank {r} differs at {first:?}: {:?} vs {:?}",
            first.map(|i| strip[i]),
            first.map(|i| expect[i])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jacobi_on_four_endpoints_gives_the_reference_grid_bit_for_bit() {
    distributed_equals_reference(
        "jacobi4",
        4,
        Spec {
            n: 66,
            iterations: 60,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jacobi_on_uneven_strips_and_on_one_endpoint_gives_the_reference_grid() {
    distributed_equals_reference(
        "jacobi1",
        1,
        Spec {
            n: 20,
            iterations: 7,
        },
    )
    .await;
    distributed_equals_reference(
        "jacobi3",
        3,
        Spec {
            n: 35,
            iterations: 41,
        },
    )
    .await;
}

/// Three software ranks; the middle one's halo rows live in segment 0 of
/// a `pgas-target` kernel device (rank 3): its neighbours put their edge
/// rows there and signal it, it gets them back each iteration.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jacobi_with_one_ranks_halos_in_a_hardware_endpoint_gives_the_reference_grid() {
    let devices = "\n[[devices]]\nname = \"halo\"\nkind = \"kernel\"\ndevice = 9\n\
                   function = \"pgas-target\"\nparams = { segment_bytes = 4096 }\n";
    let kernel = Uid::new(Ipv4Addr::LOCALHOST, 9);
    let s = group_with_devices(
        "jacobi-hw",
        3,
        devices,
        &[kernel],
        Options::default(),
        |_| {},
    )
    .await;
    let spec = Spec {
        n: 35,
        iterations: 25,
    };
    let store = HaloStore {
        rank: 3,
        owner: 1,
        segment: 0,
    };
    assert!(uniplane_pgas::jacobi::store_bytes(spec.n) <= 4096);
    let runs = s
        .eps
        .iter()
        .map(|ep| run_rank_with_store(ep, spec, Some(store)));
    let strips = within("jacobi", futures_util::future::join_all(runs)).await;
    check_strips(strips, 3, spec);
    // The halos went through the kernel: 4 initial rows, then per
    // iteration two puts and the flushes of their quiets in, two gets out.
    let stats = within("stats", s.eps[0].get(3, STATS_SEGMENT, 0, STATS_BYTES))
        .await
        .unwrap();
    let stats = HardwareStats::decode(&stats).unwrap();
    assert!(
        stats.target.frames >= 4 + 4 * spec.iterations as u64,
        "{stats:?}"
    );
    assert_eq!(stats.target.denied + stats.target.out_of_bounds, 0);
}
