//! `hw`: the RTL crossbar in co-simulation (a build with `--features rtl`),
//! and a clear refusal in a build without it.

mod common;

use common::*;

#[cfg(feature = "rtl")]
#[test]
fn hw_reports_beats_per_cycle_per_output_beside_its_reference() {
    let v = last_json(&bench(&[
        "hw",
        "--pattern",
        "uniform",
        "--size",
        "1500",
        "--cycles",
        "4000",
        "--json",
    ]));
    assert_eq!(string(&v, "bench"), "hw");
    check_machine(&v);
    assert_eq!(string(&v, "results.crossbar.matching"), "none");
    assert_eq!(count(&v, "results.crossbar.read_ports_per_input"), 4);
    let per_output = at(&v, "results.beats_per_cycle").as_array().unwrap();
    assert_eq!(per_output.len() as u64, count(&v, "results.ports"));
    for b in per_output {
        let b = b.as_f64().unwrap();
        // An output moves at most one beat per cycle; under uniform load
        // every output gets traffic.
        assert!(b > 0.0 && b <= 1.0, "{b}");
    }
    assert_eq!(count(&v, "results.cycles"), 4000);
    assert_eq!(count(&v, "results.beats_per_message"), 48);
    assert!(count(&v, "results.messages_delivered") > 0);
    assert!(number(&v, "results.reference.beats_per_cycle") < 0.7);
    assert!(number(&v, "results.ratio") > 0.0);
    // The output-queued switch on the same destinations: one figure per
    // output, each at most the line rate, and its lowest output no lower
    // than a FIFO input-queued switch's head-of-line bound.
    let oq = at(&v, "results.output_queued.beats_per_cycle")
        .as_array()
        .unwrap();
    assert_eq!(oq.len() as u64, count(&v, "results.ports"));
    assert!(oq
        .iter()
        .all(|b| (0.0..=1.0).contains(&b.as_f64().unwrap())));
    let oq_min = number(&v, "results.output_queued.beats_per_cycle_min");
    assert!(
        oq_min > number(&v, "results.reference.beats_per_cycle"),
        "{oq_min}"
    );
    assert!(oq_min <= number(&v, "results.output_queued.beats_per_cycle_mean"));

    let v = last_json(&bench(&[
        "hw",
        "--pattern",
        "all-to-one",
        "--size",
        "64",
        "--ports",
        "8",
        "--cycles",
        "2000",
        "--json",
    ]));
    let per_output = at(&v, "results.beats_per_cycle").as_array().unwrap();
    assert_eq!(per_output.len(), 8);
    // Only port 0 receives, and never faster than its line rate.
    let out0 = per_output[0].as_f64().unwrap();
    assert!(out0 > 0.0 && out0 <= 1.0, "{out0}");
    assert!(per_output[1..].iter().all(|b| b.as_f64() == Some(0.0)));
    assert_eq!(number(&v, "results.reference.beats_per_cycle"), 1.0);
    // Every input to port 0 keeps it busy in the output-queued switch.
    assert_eq!(number(&v, "results.output_queued.beats_per_cycle_min"), 1.0);
}

#[cfg(feature = "rtl")]
#[test]
fn hw_measures_the_crossbar_with_islip_matching_when_asked() {
    for ports in [4usize, 8] {
        let ports_arg = ports.to_string();
        let v = last_json(&bench(&[
            "hw",
            "--crossbar",
            "islip",
            "--ports",
            &ports_arg,
            "--pattern",
            "uniform",
            "--size",
            "64",
            "--cycles",
            "2000",
            "--json",
        ]));
        assert_eq!(string(&v, "results.crossbar.matching"), "islip");
        assert_eq!(count(&v, "results.crossbar.read_ports_per_input"), 2);
        assert!(count(&v, "results.crossbar.iterations") >= 1);
        let per_output = at(&v, "results.beats_per_cycle").as_array().unwrap();
        assert_eq!(per_output.len(), ports);
        for b in per_output {
            let b = b.as_f64().unwrap();
            assert!(b > 0.0 && b <= 1.0, "{ports} ports: {b}");
        }
        assert!(count(&v, "results.messages_delivered") > 0);
    }
}

#[cfg(feature = "rtl")]
#[test]
fn hw_refuses_what_the_rtl_is_not_built_for() {
    fails_with(
        &["hw", "--ports", "5"],
        "--ports 5: the RTL is built with 4 or 8",
    );
    fails_with(&["hw", "--size", "100000"], "at most 9000 bytes");
}

#[cfg(not(feature = "rtl"))]
#[test]
fn hw_without_the_rtl_feature_says_how_to_get_it() {
    fails_with(&["hw"], "built without the `rtl` feature");
}
