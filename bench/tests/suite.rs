//! `suite --quick`: every headline row is in the report (run, or skipped
//! with its reason), the rows this machine can always run ran, and the
//! JSON file, the SVG summary and the Markdown table are written.

mod common;

use common::*;

/// The rows of issue 17's table, in its order.
const ROWS: &[&str] = &[
    "fabric-cpu",
    "fabric-wall",
    "fabric-8-ports-16-cores",
    "overhead-p50",
    "overhead-p99",
    "udp-rtt",
    "udp-rtt-busy",
    "tcp",
    "pio-rtt",
    "dpdk-tx",
    "ether-tx",
    "rtl-uniform",
    "rtl-uniform-islip",
    "gen-2kpps",
];

#[test]
fn a_quick_suite_reports_every_row_with_ours_the_peer_and_the_ratio() {
    let dir = std::env::temp_dir().join(format!("uniplane-bench-suite-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("suite");
    let run = bench(&[
        "suite",
        "--quick",
        "--seconds",
        "1",
        "--out",
        out.to_str().unwrap(),
        "--markdown",
        "--json",
    ]);
    let v = last_json(&run);
    assert_eq!(string(&v, "bench"), "suite");
    check_machine(&v);
    let rows = at(&v, "results.rows").as_array().unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ROWS);
    // What needs no tool, feature or extra cores runs on any machine.
    let always = [
        "fabric-cpu",
        "overhead-p50",
        "overhead-p99",
        "pio-rtt",
        "gen-2kpps",
    ];
    let mut must_run: Vec<&str> = always.to_vec();
    if tool_available("sockperf", "sockperf") {
        must_run.extend(["udp-rtt", "udp-rtt-busy"]);
    }
    if tool_available("iperf3", "iperf3") {
        must_run.push("tcp");
    }
    for r in rows {
        let id = r["id"].as_str().unwrap();
        let status = r["status"].as_str().unwrap();
        assert!(
            r["command"]
                .as_str()
                .unwrap()
                .starts_with("uniplane-bench "),
            "{r}"
        );
        match status {
            "ok" => {
                // A figure may be 0 or below (the overhead's added latency
                // is a difference of percentiles), never missing.
                assert!(r["ours"].as_f64().unwrap().is_finite(), "{r}");
                if !r["peer_name"].is_null() {
                    assert!(r["peer"].as_f64().unwrap() > 0.0, "{r}");
                }
                assert!(r["ratio"].as_f64().unwrap().is_finite(), "{r}");
                assert!(r["target_met"].is_boolean() || r["target"].is_null(), "{r}");
            }
            "skipped" => {
                assert!(!must_run.contains(&id), "{id} skipped: {r}");
                assert!(!r["reason"].as_str().unwrap().is_empty());
            }
            other => panic!("{id} {other}: {r}"),
        }
    }
    // The file holds the same report; the summary and the table exist.
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    assert_eq!(file["results"]["rows"], v["results"]["rows"]);
    let svg = std::fs::read_to_string(out.with_extension("svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("fabric-cpu"));
    let stdout = String::from_utf8_lossy(&run.stdout);
    for id in ROWS {
        assert!(
            stdout.contains(&format!("| {id} | `")),
            "{id} not in the table"
        );
    }
    // The table renders again from the file alone.
    let again = bench(&[
        "suite",
        "--from",
        out.with_extension("json").to_str().unwrap(),
        "--out",
        dir.join("again").to_str().unwrap(),
        "--markdown",
    ]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("| pio-rtt | `rtt --stack shm"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_row_is_refused_with_the_known_ones() {
    fails_with(&["suite", "--only", "warp-drive"], "rows are fabric-cpu");
}
