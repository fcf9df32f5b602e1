//! The binary end to end over the mem stack: every documented JSON key
//! exists with its type, and bad arguments fail with clear errors.

mod common;

use common::*;

#[test]
fn gen_json_has_every_documented_key_with_its_type() {
    let out = bench(&[
        "gen", "--stack", "mem", "--size", "64", "--count", "20000", "--warmup", "0", "--json",
        "--quiet",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "gen");
    assert!(at(&v, "params").is_object());
    assert_eq!(string(&v, "params.stack"), "mem");
    check_machine(&v);
    assert!(number(&v, "results.pps") > 0.0);
    assert!(number(&v, "results.mbps_l2") > 0.0);
    assert!(number(&v, "results.mbps_l1") > number(&v, "results.mbps_l2"));
    for p in ["p50", "p90", "p99", "p999", "max"] {
        count(&v, &format!("results.latency_ns.{p}"));
    }
    assert_eq!(count(&v, "results.lost"), 0);
    assert_eq!(count(&v, "results.sent"), 20000);
    assert_eq!(count(&v, "results.received"), 20000);
    assert!(at(&v, "results.per_second.samples").is_array());
    number(&v, "results.per_second.pps.mean");
    number(&v, "results.per_second.pps.stddev");
}

#[test]
fn rtt_json_has_every_documented_key_with_its_type() {
    let out = bench(&[
        "rtt", "--stack", "mem", "--count", "2000", "--warmup", "0", "--json", "--quiet",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "rtt");
    assert!(at(&v, "params").is_object());
    check_machine(&v);
    for p in ["p50", "p90", "p99", "p999", "max"] {
        assert!(count(&v, &format!("results.rtt_ns.{p}")) > 0, "{p}");
    }
    assert_eq!(count(&v, "results.received"), 2000);
    assert_eq!(count(&v, "results.lost"), 0);
}

#[test]
fn a_size_sweep_reports_each_size() {
    let out = bench(&[
        "gen",
        "--sizes",
        "64,256..512",
        "--count",
        "3000",
        "--warmup",
        "0",
        "--json",
        "--quiet",
    ]);
    let v = last_json(&out);
    let sweep = at(&v, "results.sweep").as_array().expect("an array");
    let sizes: Vec<&str> = sweep.iter().map(|p| p["size"].as_str().unwrap()).collect();
    assert_eq!(sizes, ["64", "256", "512"]);
    for p in sweep {
        assert!(p["pps"].as_f64().unwrap() > 0.0);
        assert!(p["latency_ns"]["p99"].as_u64().is_some());
    }
    assert_eq!(count(&v, "results.received"), 9000);
    assert_eq!(string(&v, "params.size_mode"), "sweep");
}

#[test]
fn imix_sends_the_seven_four_one_mix() {
    let out = bench(&[
        "gen", "--imix", "--count", "1200", "--warmup", "0", "--json", "--quiet",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "params.size_mode"), "imix");
    // 100 cycles of 7×64 + 4×594 + 1×1518 payload bytes, 32-byte headers.
    let bytes = number(&v, "results.mbps_l2") * 1e6 / 8.0 * number(&v, "results.seconds");
    let want = 100.0 * (4342.0 + 12.0 * 32.0);
    assert!((bytes - want).abs() / want < 1e-6, "{bytes} vs {want}");
}

#[test]
fn a_paced_run_with_flows_and_a_pattern_completes() {
    for pattern in ["constant", "burst:16", "poisson"] {
        let out = bench(&[
            "gen",
            "--rate",
            "200kpps",
            "--pattern",
            pattern,
            "--flows",
            "5",
            "--count",
            "2000",
            "--warmup",
            "0",
            "--json",
            "--quiet",
        ]);
        let v = last_json(&out);
        assert_eq!(count(&v, "results.received"), 2000, "{pattern}");
        assert_eq!(count(&v, "params.flows"), 5);
    }
}

#[test]
fn the_report_says_where_the_receiver_ran() {
    let threading = |args: &[&str]| {
        let mut all = vec![
            "gen", "--count", "300", "--warmup", "0", "--json", "--quiet",
        ];
        all.extend_from_slice(args);
        let v = last_json(&bench(&all));
        assert_eq!(count(&v, "results.received"), 300, "{args:?}");
        assert_eq!(count(&v, "results.lost"), 0, "{args:?}");
        (
            string(&v, "params.threading").to_owned(),
            string(&v, "params.threading_asked").to_owned(),
        )
    };
    // Below 20 kpps a paced receiver rides the sender's thread.
    assert_eq!(
        threading(&["--rate", "5kpps"]),
        ("shared".into(), "auto".into())
    );
    // Unpaced, or at 20 kpps and more, each side has its own.
    assert_eq!(threading(&[]), ("split".into(), "auto".into()));
    assert_eq!(
        threading(&["--rate", "50kpps"]),
        ("split".into(), "auto".into())
    );
    // A mode asked for is the mode that runs.
    assert_eq!(
        threading(&["--rate", "5kpps", "--threads", "split"]),
        ("split".into(), "split".into())
    );
    assert_eq!(
        threading(&["--threads", "shared"]),
        ("shared".into(), "shared".into())
    );
}

#[test]
fn bad_arguments_fail_with_clear_errors() {
    fails_with(&["gen", "--size", "8"], "generator stamp");
    fails_with(&["gen", "--size", "70000"], "largest overlay payload");
    fails_with(&["gen", "--rate", "1000"], "has no unit");
    fails_with(&["gen", "--rate", "3 parsecs"], "unknown unit");
    fails_with(&["gen", "--sizes", "4096..64"], "is empty");
    fails_with(&["gen", "--pattern", "zigzag"], "constant, burst");
    fails_with(&["gen", "--size", "64", "--imix"], "cannot be used with");
    fails_with(&["gen", "--stack", "carrier-pigeon"], "unknown stack");
    fails_with(&["gen", "--flows", "0", "--count", "1"], "flows must be");
    fails_with(
        &["gen", "--threads", "shared", "--busy-poll", "--count", "1"],
        "needs its own thread",
    );
    fails_with(&["gen", "--threads", "three"], "auto, split, shared");
    fails_with(
        &["gen", "--stack", "udp", "--size", "2000", "--count", "1"],
        "more than stack",
    );
}

#[test]
fn a_plot_is_written_as_svg() {
    if uniplane_bench::plot::font_path().is_none() {
        assert!(
            std::env::var("UNIPLANE_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "a TrueType font is required for plots (fonts-dejavu-core)"
        );
        eprintln!("skipping: no TrueType font for plot labels");
        return;
    }
    let dir = std::env::temp_dir().join(format!("uniplane-bench-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (args, file) in [
        (vec!["gen", "--count", "5000", "--warmup", "0"], "cdf.svg"),
        (
            vec![
                "gen", "--sizes", "64,128", "--count", "2000", "--warmup", "0",
            ],
            "sweep.png",
        ),
        (vec!["rtt", "--count", "500", "--warmup", "0"], "rtt.svg"),
    ] {
        let path = dir.join(file);
        let path_s = path.to_str().unwrap().to_owned();
        let mut a = args.clone();
        a.extend(["--quiet", "--plot", &path_s]);
        let out = bench(&a);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 1000, "{file}: {} bytes", bytes.len());
        if file.ends_with(".svg") {
            assert!(String::from_utf8_lossy(&bytes).contains("<svg"));
        } else {
            assert_eq!(&bytes[..4], b"\x89PNG");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn wake_reports_its_wakeups_and_their_cost_and_refuses_a_bit_rate() {
    let v = last_json(&bench(&[
        "wake",
        "--rate",
        "1kpps",
        "--seconds",
        "0.05",
        "--json",
    ]));
    assert_eq!(string(&v, "bench"), "wake");
    check_machine(&v);
    assert_eq!(count(&v, "results.wakeups"), 50);
    assert!(number(&v, "results.seconds") >= 0.05);
    assert!(number(&v, "results.thread_cpu_percent") > 0.0);
    assert!(number(&v, "results.cpu_ns_per_wakeup") > 0.0);
    assert_eq!(count(&v, "results.late_ns.count"), 50);
    fails_with(&["wake", "--rate", "1Gbps"], "a message rate");
    fails_with(&["wake", "--seconds", "0"], "seconds must be above 0");
}
