//! The peer mechanism: parsing real iperf3 output, and iperf3 run for real
//! on 127.0.0.1 beside uniplane.

mod common;

use common::*;
use uniplane_bench::peer::{parse_iperf3_udp, Iperf3Udp, Metric, Peer, PeerError, Workload};

const IPERF3_UDP_64B: &str = include_str!("data/iperf3-udp-64b.json");

#[test]
fn real_iperf3_udp_output_parses_to_received_datagrams_per_second() {
    let r = parse_iperf3_udp(IPERF3_UDP_64B).unwrap();
    assert_eq!(r.blksize, 64);
    assert_eq!(r.sent_packets, 643_920);
    assert_eq!(r.server_packets, 642_835);
    assert_eq!(r.lost_packets, 364_293);
    assert_eq!(r.received_packets(), 278_542);
    // The server received 17826688 bytes = 278542 datagrams of 64 bytes.
    assert_eq!(r.received_packets() * 64, 17_826_688);
    assert!((r.received_pps() - 278_542.0 / 1.002984).abs() < 1e-6);
    assert!((r.sent_pps() - 643_920.0 / 1.00002).abs() < 1e-6);
}

#[test]
fn iperf3_output_that_is_not_a_udp_result_is_an_error() {
    let tcp = IPERF3_UDP_64B.replace("\"UDP\"", "\"TCP\"");
    assert!(matches!(
        parse_iperf3_udp(&tcp),
        Err(PeerError::BadOutput { .. })
    ));
    assert!(matches!(
        parse_iperf3_udp("not json"),
        Err(PeerError::BadOutput { .. })
    ));
    let refused = r#"{"start":{},"intervals":[],"end":{},"error":"unable to connect to server: Connection refused"}"#;
    let e = parse_iperf3_udp(refused).unwrap_err().to_string();
    assert!(e.contains("Connection refused"), "{e}");
    let truncated = r#"{"start":{"test_start":{"protocol":"UDP"}},"end":{"sum":{"packets":1}}}"#;
    assert!(parse_iperf3_udp(truncated).is_err());
}

#[test]
fn iperf3_runs_on_loopback_and_reports_a_rate() {
    if !tool_available("iperf3", "iperf3") {
        return;
    }
    let peer = Iperf3Udp::default();
    assert_eq!(peer.metric(), Metric::Pps);
    let f = peer
        .run(&Workload {
            size: 64,
            seconds: 1,
            busy_poll: false,
        })
        .unwrap();
    assert!(f.value > 0.0, "{f:?}");
    assert!(f.detail["sent_packets"].as_u64().unwrap() > 0);
}

#[test]
fn the_peer_command_reports_both_sides_and_the_ratio() {
    if !tool_available("iperf3", "iperf3") {
        return;
    }
    let svg = std::env::temp_dir().join(format!("uniplane-bench-peer-{}.svg", std::process::id()));
    let out = bench(&[
        "peer",
        "--tool",
        "iperf3",
        "--stack",
        "mem",
        "--seconds",
        "1",
        "--rounds",
        "1",
        "--plot",
        svg.to_str().unwrap(),
        "--json",
    ]);
    let v = last_json(&out);
    // The plot has both lines, the peer's beside ours.
    let plot = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(plot.contains("iperf3 (peer)") && plot.contains("uniplane over mem"));
    assert_eq!(string(&v, "bench"), "peer");
    check_machine(&v);
    assert_eq!(string(&v, "results.metric"), "pps");
    let ours = number(&v, "results.ours");
    let peer = number(&v, "results.peer");
    assert!(ours > 0.0 && peer > 0.0);
    assert!((number(&v, "results.ratio") - ours / peer).abs() < 1e-9);
    let rounds = at(&v, "results.rounds").as_array().unwrap();
    let sides: Vec<&str> = rounds.iter().map(|r| r["side"].as_str().unwrap()).collect();
    assert_eq!(sides, ["ours", "peer"]);
    // mem against kernel UDP is said to be a different transport.
    assert_eq!(at(&v, "results.like_for_like").as_bool(), Some(false));
    assert!(string(&v, "results.note").contains("different transports"));
}

#[test]
fn sockperf_round_trips_compare_like_with_like_blocking_and_busy() {
    if !tool_available("sockperf", "sockperf") {
        return;
    }
    for busy in [false, true] {
        let mut args = vec![
            "peer",
            "--tool",
            "sockperf",
            "--stack",
            "udp-unpacked",
            "--seconds",
            "1",
            "--rounds",
            "1",
            "--json",
        ];
        if busy {
            args.push("--busy-poll");
        }
        let v = last_json(&bench(&args));
        assert_eq!(string(&v, "results.metric"), "rtt_p50_ns");
        assert_eq!(at(&v, "params.busy_poll").as_bool(), Some(busy));
        assert_eq!(at(&v, "results.like_for_like").as_bool(), Some(true));
        let commands = at(&v, "params.peer_commands").as_array().unwrap();
        assert_eq!(commands.len(), 2);
        for c in commands {
            let c = c.as_str().unwrap();
            assert_eq!(c.contains("--nonblocked"), busy, "{c}");
        }
        let ours = number(&v, "results.ours");
        let peer = number(&v, "results.peer");
        // Round trips on loopback: positive and below the 200 ms timeout.
        assert!(ours > 0.0 && ours < 2e8, "{ours}");
        assert!(peer > 0.0 && peer < 2e8, "{peer}");
        assert!(!at(&v, "results.higher_is_better").as_bool().unwrap());
    }
}

#[test]
fn busy_polling_is_refused_for_throughput_peers() {
    fails_with(
        &["peer", "--tool", "iperf3", "--busy-poll"],
        "--tool sockperf",
    );
}

/// `peer --tool TOOL --stack dpdk` for a second, one round, as JSON;
/// `None` (skipped) without testpmd or root.
#[cfg(feature = "dpdk")]
fn testpmd_side_by_side(tool: &str) -> Option<serde_json::Value> {
    if !tool_available("dpdk-testpmd", "dpdk-dev") {
        return None;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: DPDK's EAL needs root here");
        return None;
    }
    let v = last_json(&bench(&[
        "peer",
        "--tool",
        tool,
        "--stack",
        "dpdk",
        "--seconds",
        "1",
        "--rounds",
        "1",
        "--json",
    ]));
    assert_eq!(string(&v, "results.metric"), "pps");
    assert_eq!(string(&v, "results.peer_tool"), "dpdk-testpmd");
    assert_eq!(at(&v, "results.like_for_like").as_bool(), Some(true));
    let ours = number(&v, "results.ours");
    let peer = number(&v, "results.peer");
    assert!(ours > 0.0 && peer > 0.0, "{ours} {peer}");
    let rounds = at(&v, "results.rounds").as_array().unwrap();
    assert!(rounds[0]["detail"]["frames"].as_u64().unwrap() > 0);
    Some(v)
}

#[cfg(feature = "dpdk")]
#[test]
fn testpmd_and_our_dpdk_transmit_side_by_side() {
    let Some(v) = testpmd_side_by_side("testpmd") else {
        return;
    };
    let rounds = at(&v, "results.rounds").as_array().unwrap();
    // testpmd's per-second samples, start-up left out.
    assert!(!rounds[1]["detail"]["tx_pps_samples"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[cfg(feature = "dpdk")]
#[test]
fn testpmd_and_our_dpdk_receive_side_by_side() {
    let Some(v) = testpmd_side_by_side("testpmd-rx") else {
        return;
    };
    let rounds = at(&v, "results.rounds").as_array().unwrap();
    // testpmd's receive rates, not its (zero) transmit ones.
    let samples = rounds[1]["detail"]["rx_pps_samples"].as_array().unwrap();
    assert!(!samples.is_empty());
    assert!(samples.iter().all(|s| s.as_f64().unwrap() > 0.0));
}

#[cfg(not(feature = "dpdk"))]
#[test]
fn testpmd_without_the_dpdk_feature_says_how_to_get_it() {
    fails_with(
        &["peer", "--tool", "testpmd", "--stack", "dpdk"],
        "built without the `dpdk` feature",
    );
}

#[test]
fn testpmd_needs_the_dpdk_stack() {
    fails_with(
        &["peer", "--tool", "testpmd", "--stack", "udp"],
        "use it with --stack dpdk",
    );
    fails_with(
        &["peer", "--tool", "testpmd-rx", "--stack", "udp"],
        "use it with --stack dpdk",
    );
}

#[test]
fn trafgen_and_our_raw_ethernet_transmit_side_by_side() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !uniplane_netns::available() {
        eprintln!("skipping: namespaces and a veth need root");
        return;
    }
    if !tool_available("trafgen", "netsniff-ng") {
        return;
    }
    let v = last_json(&bench(&[
        "peer",
        "--tool",
        "trafgen",
        "--stack",
        "ether",
        "--size",
        "60",
        "--seconds",
        "1",
        "--rounds",
        "1",
        "--json",
    ]));
    assert_eq!(string(&v, "results.metric"), "pps");
    assert_eq!(string(&v, "results.peer_tool"), "trafgen");
    let ours = number(&v, "results.ours");
    let peer = number(&v, "results.peer");
    assert!(ours > 0.0 && peer > 0.0, "{ours} {peer}");
    let rounds = at(&v, "results.rounds").as_array().unwrap();
    assert!(rounds[0]["detail"]["frames"].as_u64().unwrap() > 0);
    assert!(rounds[1]["detail"]["packets"].as_u64().unwrap() > 0);
}

#[test]
fn trafgen_needs_the_ether_stack() {
    fails_with(
        &["peer", "--tool", "trafgen", "--stack", "udp"],
        "use it with --stack ether",
    );
}

#[test]
fn iperf3_and_our_user_space_tcp_on_a_veth_side_by_side() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !uniplane_netns::available() {
        eprintln!("skipping: namespaces and a veth need root");
        return;
    }
    if !tool_available("iperf3", "iperf3") {
        return;
    }
    let v = last_json(&bench(&[
        "peer",
        "--tool",
        "iperf3-tcp",
        "--stack",
        "smoltcp",
        "--size",
        "16000",
        "--seconds",
        "1",
        "--rounds",
        "1",
        "--mtu",
        "9000",
        "--json",
    ]));
    assert_eq!(string(&v, "results.metric"), "gbps");
    assert_eq!(string(&v, "results.peer_tool"), "iperf3");
    let ours = number(&v, "results.ours");
    let peer = number(&v, "results.peer");
    assert!(ours > 0.0 && peer > 0.0, "{ours} {peer}");
    let rounds = at(&v, "results.rounds").as_array().unwrap();
    // What the kernel socket counted: at least one whole message.
    assert!(rounds[0]["detail"]["bytes"].as_u64().unwrap() >= 16_000);
    assert_eq!(rounds[0]["detail"]["mtu"], 9000);
    assert_eq!(rounds[1]["detail"]["mtu"], 9000);
}

#[test]
fn a_veth_mtu_outside_its_range_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    fails_with(
        &[
            "peer",
            "--tool",
            "iperf3-tcp",
            "--stack",
            "smoltcp",
            "--mtu",
            "100",
        ],
        "--mtu 100: 576..=9000",
    );
}
