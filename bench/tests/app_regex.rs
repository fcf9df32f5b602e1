//! `app regex` end to end, briefly: the three configurations through a
//! daemon started in the benchmark's process, every match list the same
//! in all three, the documented keys reported per size.

mod common;

use common::*;

/// The Core Rule Set is installed (else skip, or fail with
/// `UNIPLANE_REQUIRE_TOOLS=1`).
fn crs() -> bool {
    if std::path::Path::new(uniplane_regex_pipeline::DEBIAN_CRS_RULES).is_dir() {
        return true;
    }
    if std::env::var("UNIPLANE_REQUIRE_TOOLS").as_deref() == Ok("1") {
        panic!(
            "the rule set is required (UNIPLANE_REQUIRE_TOOLS=1): apt-get install modsecurity-crs"
        );
    }
    eprintln!("skipping: no rule set (Debian package modsecurity-crs)");
    false
}

#[test]
fn regex_reports_each_size_for_the_three_configurations_with_identical_matches() {
    if !crs() {
        return;
    }
    let v = last_json(&bench(&[
        "app", "regex", "--count", "12", "--sizes", "64,2048", "--depth", "4", "--json",
    ]));
    assert_eq!(string(&v, "bench"), "app");
    assert_eq!(string(&v, "params.app"), "regex");
    check_machine(&v);
    assert_eq!(count(&v, "results.mismatches"), 0);
    assert!(count(&v, "results.rules.compiled") > 200);
    assert!(at(&v, "results.target_met").is_boolean());
    let points = at(&v, "results.points").as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (p, size) in points.iter().zip([64, 2048]) {
        assert_eq!(count(p, "size"), size);
        for k in [
            "through_uniplane_mbps",
            "through_cpu_mbps",
            "one_core_mbps",
            "latency_us.through_uniplane.p50",
            "latency_us.through_cpu.p99",
            "latency_us.one_core.p50",
        ] {
            assert!(number(p, k) > 0.0, "size {size}: {k}");
        }
    }
}

#[test]
fn an_input_size_over_a_stages_limit_is_refused() {
    fails_with(&["app", "regex", "--sizes", "64,20000"], "--sizes");
}

#[test]
fn an_engine_that_does_not_exist_is_refused() {
    fails_with(&["app", "regex", "--engine", "pcre"], "unknown engine");
}
