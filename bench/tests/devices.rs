//! `devices` end to end: a host memory device in a daemon started in the
//! benchmark's process, written, read back and verified, reporting the
//! documented keys.

mod common;

use common::*;

#[test]
fn host_memory_is_written_read_back_verified_and_compared_with_memcpy() {
    let v = last_json(&bench(&[
        "devices", "--memory", "host", "--size", "1M", "--verify", "--rounds", "1", "--json",
    ]));
    assert_eq!(string(&v, "bench"), "devices");
    check_machine(&v);
    assert_eq!(string(&v, "results.memory"), "host");
    assert_eq!(count(&v, "results.bytes"), 1 << 20);
    assert_eq!(count(&v, "results.messages"), (1u64 << 20).div_ceil(65_535));
    assert_eq!(at(&v, "results.verified"), true);
    assert_eq!(string(&v, "results.peer.name"), "memcpy");
    assert_eq!(at(&v, "results.mapped.verified"), true);
    for way in ["write", "read"] {
        assert!(number(&v, &format!("results.gbytes_per_sec.{way}")) > 0.0);
        assert!(number(&v, &format!("results.peer.gbytes_per_sec.{way}")) > 0.0);
        assert!(number(&v, &format!("results.ratio.{way}")) > 0.0);
        assert!(number(&v, &format!("results.mapped.gbytes_per_sec.{way}")) > 0.0);
        assert!(number(&v, &format!("results.mapped.ratio.{way}")) > 0.0);
    }
}

#[test]
fn a_size_that_is_no_byte_count_is_refused() {
    fails_with(&["devices", "--size", "lots"], "--size");
}

#[cfg(not(feature = "gpu"))]
#[test]
fn gpu_memory_needs_the_gpu_feature() {
    fails_with(
        &["devices", "--memory", "gpu", "--size", "1M"],
        "built without the gpu feature",
    );
}

#[test]
fn an_emulated_kernel_reports_its_round_trips_and_the_path_its_size_takes() {
    for (size, path, field) in [("64", "pio", "pio"), ("4K", "connect", "connect")] {
        let v = last_json(&bench(&[
            "devices",
            "--backend",
            "emulated",
            "--size",
            size,
            "--count",
            "200",
            "--json",
        ]));
        assert_eq!(string(&v, "bench"), "devices");
        check_machine(&v);
        assert_eq!(string(&v, "results.path"), path);
        assert_eq!(count(&v, "results.round_trips"), 200);
        for hist in [
            "rtt_ns",
            "inline_echo_rtt_ns",
            "port_rtt_ns",
            "mailbox_rtt_ns",
        ] {
            assert_eq!(count(&v, &format!("results.{hist}.count")), 200, "{hist}");
            assert!(count(&v, &format!("results.{hist}.p50")) > 0, "{hist}");
        }
        // Warm-up and measured round trips all took the path.
        assert_eq!(
            count(&v, &format!("results.device_counters.messages.{field}")),
            400
        );
        assert_eq!(string(&v, "results.device_counters.state"), "up");
    }
}

#[test]
fn an_emulated_kernel_refuses_a_message_larger_than_one_message() {
    fails_with(
        &["devices", "--backend", "emulated", "--size", "64K"],
        "at most 65535",
    );
}
