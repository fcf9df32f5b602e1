//! `path` end to end: it starts the workspace's own `uniplaned` (built
//! beside this benchmark by `cargo test --workspace`), measures through it,
//! and reports the documented keys; a daemon that cannot start is a clear
//! error.

mod common;

use common::*;

#[test]
fn path_json_has_every_documented_key_with_its_type() {
    let Some(daemon) = uniplaned() else { return };
    let daemon = daemon.display().to_string();
    let out = bench(&[
        "path",
        "--size",
        "64",
        "--seconds",
        "0.6",
        "--wait",
        "park",
        "--ping-count",
        "20",
        "--uniplaned",
        &daemon,
        "--json",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "path");
    assert_eq!(string(&v, "params.plane"), "engine");
    assert_eq!(string(&v, "params.wait"), "park");
    check_machine(&v);
    let p50 = number(&v, "results.rtt_ns.p50");
    assert!(p50 > 0.0);
    assert!(number(&v, "results.rtt_ns.p99") >= p50);
    assert!(count(&v, "results.round_trips") > 0);
    assert!(count(&v, "results.one_way_received") > 0);
    assert!(number(&v, "results.msgs_per_sec") > 0.0);
    assert!(at(&v, "results.ping_rtt_ns").is_object());
}

#[test]
fn path_with_a_daemon_that_cannot_start_fails_clearly() {
    fails_with(
        &[
            "path",
            "--seconds",
            "0.2",
            "--uniplaned",
            "/nonexistent/uniplaned",
        ],
        "starting /nonexistent/uniplaned",
    );
}
