//! The overlay benchmarks end to end: every documented JSON key exists
//! with its type (no figure of this machine is asserted).

mod common;

use common::*;

#[test]
fn fabric_json_has_every_documented_key() {
    for pattern in ["all-to-one", "uniform"] {
        let out = bench(&[
            "fabric",
            "--ports",
            "3",
            "--pattern",
            pattern,
            "--size",
            "64",
            "--seconds",
            "0.2",
            "--json",
        ]);
        let v = last_json(&out);
        assert_eq!(string(&v, "bench"), "fabric");
        check_machine(&v);
        for key in [
            "msgs_per_sec",
            "gbytes_per_sec",
            "reference_msgs_per_sec",
            "memcpy_gbytes_per_sec",
        ] {
            assert!(number(&v, &format!("results.{key}")) > 0.0, "{key}");
        }
        count(&v, "results.latency_ns.p50");
        count(&v, "results.latency_ns.p99");
        assert!(count(&v, "results.delivered") > 0);
    }
}

#[test]
fn overhead_json_has_every_documented_key() {
    let out = bench(&["overhead", "--size", "64", "--count", "2000", "--json"]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "overhead");
    number(&v, "results.added_ns.p50");
    number(&v, "results.added_ns.p99");
    assert_eq!(count(&v, "results.rtt_without_ns.count"), 2000);
    number(&v, "results.added_through_engine_thread_ns.p50");
    number(&v, "results.added_through_engine_thread_ns.p99");
    assert_eq!(count(&v, "results.rtt_inline_ns.count"), 2000);
    assert_eq!(
        count(&v, "results.rtt_through_engine_thread_ns.count"),
        2000
    );
}

#[test]
fn share_json_has_every_documented_key() {
    let out = bench(&[
        "share",
        "--weights",
        "1:2:3",
        "--phase-ms",
        "40",
        "--gbps",
        "1",
        "--json",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "share");
    let phases = at(&v, "results.phases").as_array().expect("phases").clone();
    assert_eq!(phases.len(), 4);
    for p in &phases {
        for key in ["share_error", "jain", "utilization", "settle_ms"] {
            assert!(p[key].is_number(), "{key} in {p}");
        }
        assert_eq!(p["target"].as_array().map(Vec::len), Some(3));
        assert_eq!(p["achieved"].as_array().map(Vec::len), Some(3));
    }
    // The last phase's target follows the weights 1:2:3.
    let t = phases[3]["target"].as_array().unwrap();
    assert!((t[2].as_f64().unwrap() - 0.5).abs() < 1e-9);
    for key in [
        "max_share_error",
        "jain_min",
        "utilization_min",
        "settle_ms_max",
    ] {
        number(&v, &format!("results.{key}"));
    }
}

#[test]
fn overlay_benchmarks_refuse_bad_arguments() {
    let out = bench(&["fabric", "--pattern", "sideways"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("all-to-one or uniform"));
    let out = bench(&["share", "--weights", "1:0:2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("three non-zero weights"));
    let out = bench(&["overhead", "--size", "8"]);
    assert!(!out.status.success());
}
