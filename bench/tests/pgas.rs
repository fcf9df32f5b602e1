//! `pgas` end to end: two endpoints on the workspace's own `uniplaned`
//! beside OpenSHMEM (compiled here with `oshcc`), reporting the
//! documented keys.

mod common;

use common::*;

fn run(op: &str, sizes: &str, openshmem: bool) -> serde_json::Value {
    let daemon = uniplaned().expect("checked by the caller");
    let daemon = daemon.display().to_string();
    let mut args = vec![
        "pgas",
        "--op",
        op,
        "--sizes",
        sizes,
        "--uniplaned",
        &daemon,
        "--json",
    ];
    if !openshmem {
        args.push("--no-openshmem");
    }
    let v = last_json(&bench(&args));
    assert_eq!(string(&v, "bench"), "pgas");
    check_machine(&v);
    v
}

#[test]
fn pgas_put_reports_uniplane_and_openshmem_per_size() {
    if uniplaned().is_none() {
        return;
    }
    let shmem =
        tool_available("oshcc", "libopenmpi-dev") && tool_available("oshrun", "openmpi-bin");
    let v = run("put", "8..64", shmem);
    let points = v
        .pointer("/results/points")
        .and_then(|p| p.as_array())
        .unwrap();
    let sizes: Vec<u64> = points.iter().map(|p| p["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [8, 16, 32, 64]);
    for p in points {
        assert!(p["uniplane_us"].as_f64().unwrap() > 0.0);
        if shmem {
            assert!(p["openshmem_us"].as_f64().unwrap() > 0.0, "{p}");
        }
    }
}

#[test]
fn pgas_short_reports_the_round_trip_p50() {
    if uniplaned().is_none() {
        return;
    }
    let v = run("short", "8", false);
    assert!(number(&v, "results.rtt_ns.p50") > 0.0);
    let points = v
        .pointer("/results/points")
        .and_then(|p| p.as_array())
        .unwrap();
    assert!(
        points[0]["openshmem_us"].is_null(),
        "OpenSHMEM has no active messages"
    );
}

fn hardware_args<'a>(op: &'a str, sizes: &'a str, daemon: &'a str) -> Vec<&'a str> {
    vec![
        "pgas",
        "--op",
        op,
        "--target",
        "hardware",
        "--sizes",
        sizes,
        "--uniplaned",
        daemon,
        "--no-openshmem",
        "--json",
    ]
}

#[test]
fn pgas_to_a_hardware_rank_measures_what_a_kernel_answers() {
    let Some(daemon) = uniplaned() else {
        return;
    };
    let daemon = daemon.display().to_string();
    for (op, sizes, want) in [
        (
            "get",
            "8..128K",
            (3..=17).map(|e| 1u64 << e).collect::<Vec<_>>(),
        ),
        ("put-quiet", "8,64K", vec![8, 65536]),
        ("atomic", "8", vec![8]),
        ("short", "8", vec![8]),
    ] {
        let v = last_json(&bench(&hardware_args(op, sizes, &daemon)));
        assert_eq!(string(&v, "results.target"), "hardware");
        let points = v
            .pointer("/results/points")
            .and_then(|p| p.as_array())
            .unwrap();
        let got: Vec<u64> = points.iter().map(|p| p["size"].as_u64().unwrap()).collect();
        assert_eq!(got, want, "{op}");
        for p in points {
            assert!(p["uniplane_us"].as_f64().unwrap() > 0.0, "{op}: {p}");
        }
    }
}

#[test]
fn pgas_refuses_what_a_hardware_rank_cannot_do() {
    let Some(daemon) = uniplaned() else {
        return;
    };
    let daemon = daemon.display().to_string();
    for op in ["put", "window"] {
        fails_with(&hardware_args(op, "8", &daemon), "only answers");
    }
}

#[test]
fn pgas_across_two_daemons_runs_over_each_tunnel_stack() {
    let Some(daemon) = uniplaned() else {
        return;
    };
    let daemon = daemon.display().to_string();
    for (stack, target, op, sizes) in [
        ("tcp", "software", "put", "8,4K"),
        ("ltl", "hardware", "get", "8,64K"),
        ("udp", "software", "atomic", "8"),
    ] {
        let v = last_json(&bench(&[
            "pgas",
            "--op",
            op,
            "--stack",
            stack,
            "--target",
            target,
            "--sizes",
            sizes,
            "--uniplaned",
            &daemon,
            "--no-openshmem",
            "--json",
        ]));
        assert_eq!(string(&v, "results.stack"), stack);
        assert_eq!(string(&v, "results.target"), target);
        assert_eq!(
            string(&v, "results.openshmem_transport"),
            "UCX_TLS=tcp,self"
        );
        let points = v
            .pointer("/results/points")
            .and_then(|p| p.as_array())
            .unwrap();
        assert!(!points.is_empty());
        for p in points {
            assert!(p["uniplane_us"].as_f64().unwrap() > 0.0, "{stack}: {p}");
        }
    }
}
