//! `gen --loss` through the real binary: LTL measured without and with
//! loss in one invocation, its JSON keys, and the arguments it refuses.
//! No test here asserts how much goodput loss costs (that is a benchmark).

mod common;

use common::*;

#[test]
fn gen_with_loss_reports_goodput_against_the_lossless_phase() {
    let out = bench(&[
        "gen", "--stack", "ltl", "--size", "1000", "--count", "5000", "--warmup", "0", "--loss",
        "2", "--json", "--quiet",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "params.stack"), "ltl");
    assert_eq!(number(&v, "params.loss"), 2.0);
    // The top-level figures are the lossy phase's; LTL repairs every loss.
    assert_eq!(count(&v, "results.sent"), 5000);
    assert_eq!(count(&v, "results.received"), 5000);
    assert_eq!(count(&v, "results.lost"), 0);
    for k in ["goodput_gbps", "lossless_goodput_gbps", "lossless_pps"] {
        assert!(number(&v, &format!("results.{k}")) > 0.0, "{k}");
    }
    let ratio = number(&v, "results.goodput_vs_lossless");
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");
    for phase in ["lossless", "lossy"] {
        for k in [
            "tx_frames",
            "rx_frames",
            "retransmits",
            "fast_retransmits",
            "probe_retransmits",
            "timeout_retransmits",
            "timeouts",
            "blocked_micros",
        ] {
            count(&v, &format!("results.ltl_sender.{phase}.{k}"));
        }
        assert!(count(&v, &format!("results.ltl_sender.{phase}.tx_frames")) >= 5000);
    }
    // 2 % of about 5000 data frames were dropped at the receiver: some went
    // again.
    assert!(count(&v, "results.ltl_sender.lossy.retransmits") > 0);
}

#[test]
fn gen_without_loss_has_none_of_its_keys() {
    let out = bench(&[
        "gen", "--stack", "mem", "--count", "1000", "--warmup", "0", "--json", "--quiet",
    ]);
    let v = last_json(&out);
    assert!(v["params"].get("loss").is_none());
    for k in [
        "goodput_gbps",
        "lossless_goodput_gbps",
        "lossless_pps",
        "goodput_vs_lossless",
        "ltl_sender",
    ] {
        assert!(v["results"].get(k).is_none(), "{k}");
    }
}

#[test]
fn loss_is_refused_on_other_stacks_and_outside_zero_to_one_hundred() {
    for stack in ["mem", "udp", "tcp"] {
        fails_with(
            &["gen", "--stack", stack, "--loss", "1", "--count", "1"],
            "--loss works only with --stack ltl",
        );
    }
    for bad in ["150", "-1", "100.5", "NaN"] {
        fails_with(
            &["gen", "--stack", "ltl", "--loss", bad, "--count", "1"],
            "percentage from 0 to 100",
        );
    }
    fails_with(
        &["gen", "--stack", "ltl", "--loss", "1", "--sizes", "64,128"],
        "cannot be used with",
    );
    fails_with(
        &["gen", "--stack", "ltl", "--loss", "one", "--count", "1"],
        "invalid value",
    );
}

/// A paced ltl sender sleeps between departures without blocking its
/// runtime, where the ltl endpoint's timers and acknowledgments run:
/// at 2 kpps (a 500 us gap, once slept in `thread::sleep`) a 2-second
/// run ends with every message delivered instead of failing with "no
/// answer after 9 timeouts" (it did from about 1.5 s on).
#[test]
fn a_slowly_paced_ltl_run_delivers_everything() {
    let out = bench(&[
        "gen", "--stack", "ltl", "--rate", "2kpps", "--count", "4000", "--warmup", "0", "--json",
        "--quiet",
    ]);
    let v = last_json(&out);
    assert_eq!(count(&v, "results.sent"), 4000);
    assert_eq!(count(&v, "results.received"), 4000);
    assert_eq!(count(&v, "results.lost"), 0);
}
