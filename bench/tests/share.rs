//! `share --through daemons` end to end: two of the workspace's own
//! `uniplaned`, peered over a tcp tunnel shaped to 40 Mbit/s, three
//! classes; the report carries the documented keys, and the class whose
//! weight goes to 2 halfway gets more than each class of weight 1 after
//! the change (the figures themselves are a benchmark's, not a test's).

mod common;

use common::*;

#[test]
fn share_through_daemons_moves_the_shares_when_the_weights_change() {
    let Some(daemon) = uniplaned() else { return };
    let daemon = daemon.display().to_string();
    let out = bench(&[
        "share",
        "--through",
        "daemons",
        "--tunnel",
        "tcp",
        "--weights",
        "1:1:2",
        "--phase-ms",
        "400",
        "--gbps",
        "0.04",
        "--uniplaned",
        &daemon,
        "--json",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "share");
    assert_eq!(string(&v, "params.through"), "daemons");
    for k in [
        "max_share_error",
        "utilization",
        "settle_ms",
        "change_took_ms",
    ] {
        let x = number(&v, &format!("results.{k}"));
        assert!(x.is_finite() && x >= 0.0, "{k} = {x}");
    }
    assert!(number(&v, "results.utilization") > 0.0);
    let after = |k: usize| {
        v["results"]["phases"][1]["achieved"][k]
            .as_f64()
            .expect("phase 1's achieved shares")
    };
    assert!(
        after(2) > after(0) && after(2) > after(1),
        "class 2 (weight 2) got {} after the change, classes 0 and 1 {} and {}",
        after(2),
        after(0),
        after(1)
    );
}

#[test]
fn share_refuses_an_unknown_path_or_tunnel() {
    fails_with(&["share", "--through", "carrier-pigeon"], "--through");
    fails_with(
        &["share", "--through", "daemons", "--tunnel", "smoke"],
        "--tunnel `smoke`",
    );
}
