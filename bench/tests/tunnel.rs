//! `tunnel` end to end: two of the workspace's own `uniplaned` (built
//! beside this benchmark by `cargo test --workspace`), peers over a sealed
//! udp tunnel; the report carries the documented figures, and a daemon
//! that cannot start is a clear error.

mod common;

use common::*;

#[test]
fn tunnel_over_udp_reports_the_rate_the_sealing_and_the_ratio() {
    let Some(daemon) = uniplaned() else { return };
    let daemon = daemon.display().to_string();
    let out = bench(&[
        "tunnel",
        "--stack",
        "udp",
        "--size",
        "64",
        "--seconds",
        "0.5",
        "--uniplaned",
        &daemon,
        "--json",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "tunnel");
    assert_eq!(string(&v, "params.stack"), "udp");
    assert_eq!(count(&v, "params.size"), 64);
    check_machine(&v);
    assert!(number(&v, "results.msgs_per_sec") > 0.0);
    assert!(number(&v, "results.gbit_per_sec") > 0.0);
    assert!(count(&v, "results.received") > 0);
    assert!(number(&v, "results.seal_open_ns_per_msg") > 0.0);
    assert!(number(&v, "results.seal_share_of_a_core") > 0.0);
    assert!(number(&v, "results.peer_msgs_per_sec") > 0.0);
    let ratio = number(&v, "results.ratio");
    assert!(ratio.is_finite() && ratio > 0.0, "ratio {ratio}");
    assert!(string(&v, "results.peer").contains("udp stack alone"));
    assert!(!string(&v, "results.note").is_empty());
}

#[test]
fn tunnel_with_a_daemon_that_cannot_start_fails_clearly() {
    fails_with(
        &[
            "tunnel",
            "--seconds",
            "0.2",
            "--uniplaned",
            "/nonexistent/uniplaned",
        ],
        "starting /nonexistent/uniplaned",
    );
}
