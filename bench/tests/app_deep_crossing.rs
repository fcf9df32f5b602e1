//! `app deep-crossing` end to end, briefly: daemons started in the
//! benchmark's process for the single endpoint and the two splits (FPGA
//! Connect on one server, LTL between two), every output verified
//! against the reference, the documented keys reported.

mod common;

use common::*;

#[test]
fn deep_crossing_reports_single_and_split_figures_with_verified_outputs() {
    let v = last_json(&bench(&[
        "app",
        "deep-crossing",
        "--count",
        "30",
        "--pipeline",
        "4",
        "--rounds",
        "1",
        "--paths",
        "connect,ltl",
        "--json",
    ]));
    assert_eq!(string(&v, "bench"), "app");
    assert_eq!(string(&v, "params.app"), "deep-crossing");
    check_machine(&v);
    assert_eq!(at(&v, "results.verified"), true);
    let reference = string(&v, "results.reference_digest");
    assert!(number(&v, "results.in_process_us.p50") > 0.0);
    for (placement, layers) in [
        ("single", vec!["0..4"]),
        ("split.connect", vec!["0..2", "2..4"]),
        ("split.ltl", vec!["0..2", "2..4"]),
    ] {
        let p = |k: &str| format!("results.{placement}.{k}");
        for k in ["latency_us.p50", "latency_us.p99", "per_sec"] {
            assert!(number(&v, &p(k)) > 0.0, "{placement}: {k}");
        }
        assert!(number(&v, &p("latency_us.p99")) >= number(&v, &p("latency_us.p50")));
        assert_eq!(at(&v, &p("verified")), true, "{placement}");
        assert_eq!(string(&v, &p("digest")), reference, "{placement}");
        let got: Vec<&str> = at(&v, &p("layers"))
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_str().unwrap())
            .collect();
        assert_eq!(got, layers, "{placement}");
    }
    assert_eq!(count(&v, "results.split.ltl.servers"), 2);
    assert_eq!(count(&v, "results.split.connect.servers"), 1);
}

#[test]
fn a_path_that_does_not_exist_is_refused() {
    fails_with(
        &["app", "deep-crossing", "--paths", "pcie", "--count", "1"],
        "--paths",
    );
}

#[test]
fn a_split_with_an_empty_half_is_refused() {
    fails_with(
        &["app", "deep-crossing", "--cut", "4", "--count", "1"],
        "a split at layer 4",
    );
}
