//! `collectives` end to end: it starts the workspace's own `uniplaned`,
//! runs allreduce with two ranks through it, and reports the documented
//! keys (the MPI libraries are left out to keep it short).

mod common;

use common::*;

#[test]
fn collectives_over_shm_reports_every_documented_key() {
    let Some(daemon) = uniplaned() else { return };
    let daemon = daemon.display().to_string();
    let out = bench(&[
        "collectives",
        "--op",
        "allreduce",
        "--ranks",
        "2",
        "--sizes",
        "8,300K",
        "--iterations",
        "5",
        "--wait",
        "park",
        "--no-mpi",
        "--uniplaned",
        &daemon,
        "--json",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "collectives");
    check_machine(&v);
    let points = at(&v, "results.points").as_array().expect("points");
    assert_eq!(points.len(), 2, "one point per size");
    for (p, size) in points.iter().zip([8u64, 300 * 1024]) {
        assert_eq!(p["size"].as_u64(), Some(size));
        assert!(p["uniplane_us"].as_f64().is_some_and(|x| x > 0.0), "{p}");
        assert!(p["openmpi_us"].is_null() && p["mpich_us"].is_null(), "{p}");
    }
}

#[test]
fn collectives_refuses_a_bad_size_list() {
    fails_with(&["collectives", "--sizes", "8..4", "--no-mpi"], "--sizes");
}
