//! `p2p`: every mode moves the bytes (verified), with memcpy of the same
//! sizes in the same run, and bad arguments fail clearly.

mod common;

use common::*;

#[test]
fn p2p_moves_verified_bytes_in_every_mode_beside_memcpy() {
    let dir = std::env::temp_dir().join(format!("uniplane-bench-p2p-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("p2p.svg");
    let out = bench(&[
        "p2p",
        "--mode",
        "push,pull,staged,pipelined",
        "--sizes",
        "64,4K,1M",
        "--budget-ms",
        "5",
        "--verify",
        "--plot",
        svg.to_str().unwrap(),
        "--json",
    ]);
    let v = last_json(&out);
    assert_eq!(string(&v, "bench"), "p2p");
    check_machine(&v);
    let sizes = at(&v, "results.sizes").as_array().unwrap();
    assert_eq!(sizes.len(), 3);
    let memcpy = at(&v, "results.memcpy_gbytes_per_sec").as_array().unwrap();
    assert_eq!(memcpy.len(), 3);
    assert!(
        memcpy.iter().all(|g| g.as_f64().unwrap() > 0.0),
        "{memcpy:?}"
    );
    let modes = at(&v, "results.modes").as_array().unwrap();
    let names: Vec<&str> = modes.iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(names, ["push", "pull", "staged", "staged-pipelined"]);
    for m in modes {
        let points = m["points"].as_array().unwrap();
        assert_eq!(points.len(), 3);
        for p in points {
            assert_eq!(p["verified"], serde_json::json!(true), "{p}");
            assert!(p["gbytes_per_sec"].as_f64().unwrap() > 0.0, "{p}");
            assert!(p["iterations"].as_u64().unwrap() >= 3, "{p}");
        }
        assert!(m["fit"]["gbytes_per_sec"].as_f64().unwrap() > 0.0, "{m}");
    }
    assert_eq!(at(&v, "results.verified"), &serde_json::json!(true));
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.contains("<svg") && plot.contains("memcpy (peer)"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn p2p_refuses_unknown_modes_and_sizes() {
    fails_with(&["p2p", "--mode", "teleport"], "--mode `teleport`");
    fails_with(&["p2p", "--sizes", "1G"], "--sizes");
    fails_with(&["p2p", "--model", "gen9"], "--model `gen9`");
}
