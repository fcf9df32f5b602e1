//! `rpc` end to end: it starts the workspace's own `uniplaned`, calls
//! the Echo service through it and through tonic over TCP loopback, and
//! reports the documented keys.

mod common;

use common::*;

fn run(mode: &str, stack: &str) {
    let Some(daemon) = uniplaned() else { return };
    let daemon = daemon.display().to_string();
    let out = bench(&[
        "rpc",
        "--mode",
        mode,
        "--stack",
        stack,
        "--concurrency",
        "4",
        "--size",
        "100",
        "--seconds",
        "0.3",
        "--uniplaned",
        &daemon,
        "--json",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "rpc");
    assert_eq!(string(&v, "params.mode"), mode);
    assert_eq!(string(&v, "params.stack"), stack);
    check_machine(&v);
    let p50 = number(&v, "results.latency_ns.p50");
    assert!(p50 > 0.0);
    assert!(number(&v, "results.latency_ns.p99") >= p50);
    assert!(number(&v, "results.requests_per_sec") > 0.0);
    assert_eq!(count(&v, "results.errors"), 0);
    assert!(number(&v, "results.p50_ratio") > 0.0);
    assert!(number(&v, "results.rps_ratio") > 0.0);
    for side in ["client", "server", "daemons"] {
        assert!(number(&v, &format!("results.cpu_ns_per_request.{side}")) >= 0.0);
    }
    for shape in ["split", "shared"] {
        assert!(number(&v, &format!("results.peer.{shape}.requests_per_sec")) > 0.0);
    }
}

#[test]
fn rpc_native_over_shm_reports_every_documented_key() {
    run("native", "shm");
}

#[test]
fn rpc_tonic_over_a_tcp_tunnel_reports_every_documented_key() {
    run("tonic", "tcp");
}

#[test]
fn rpc_with_a_daemon_that_cannot_start_fails_clearly() {
    fails_with(
        &[
            "rpc",
            "--seconds",
            "0.2",
            "--uniplaned",
            "/nonexistent/uniplaned",
        ],
        "starting /nonexistent/uniplaned",
    );
}
