//! The Jacobi example on N endpoints of one daemon gives exactly the grid
//! of the single-process reference.

mod common;

use common::{group, within};
use uniplane_pgas::jacobi::{reference, rows_of, run_rank, Spec};

async fn distributed_equals_reference(name: &str, ranks: usize, spec: Spec) {
    let s = group(name, ranks, |_| {}).await;
    let runs = s.eps.iter().map(|ep| run_rank(ep, spec));
    let strips = within("jacobi", futures_util::future::join_all(runs)).await;
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
