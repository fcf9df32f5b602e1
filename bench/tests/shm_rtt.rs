//! `rtt --stack shm --path pio|dma`: round trips over the PIO mailbox and
//! the DMA ring, the Unix-socket peer in the same run; misuse fails
//! clearly.

mod common;

use common::*;

#[test]
fn pio_and_dma_round_trips_come_with_the_unix_socket_peer() {
    for (path, extra) in [("pio", None), ("pio", Some("--busy-poll")), ("dma", None)] {
        let mut args = vec![
            "rtt", "--stack", "shm", "--path", path, "--size", "200", "--count", "3000",
            "--warmup", "0", "--json",
        ];
        args.extend(extra);
        let v = last_json(&bench(&args));
        assert_eq!(string(&v, "bench"), "rtt");
        assert_eq!(string(&v, "params.path"), path);
        assert_eq!(string(&v, "results.path"), path);
        assert_eq!(count(&v, "results.received"), 3000, "{path} {extra:?}");
        assert_eq!(count(&v, "results.lost"), 0);
        assert_eq!(count(&v, "results.rtt_ns.count"), 3000);
        assert!(count(&v, "results.rtt_ns.p50") > 0);
        assert_eq!(count(&v, "results.peer.rtt_ns.count"), 3000);
        assert!(count(&v, "results.peer.rtt_ns.p50") > 0);
        assert!(number(&v, "results.p50_ratio") > 0.0);
        string(&v, "results.peer.name");
        // The floor: a cache line each way between the same CPUs, as many
        // round trips, each no slower than a round trip of the path over it.
        assert_eq!(count(&v, "results.cache_line_floor.rtt_ns.count"), 3000);
        let floor = count(&v, "results.cache_line_floor.rtt_ns.min");
        assert!(floor > 0 && floor <= count(&v, "results.rtt_ns.max"), "{v}");
        string(&v, "results.cache_line_floor.what");
        // The machine as it is, not as the pinned pinger sees it.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(count(&v, "machine.cores"), cores as u64);
    }
}

#[test]
fn a_device_path_needs_the_shm_stack_and_a_size_it_carries() {
    fails_with(
        &["rtt", "--stack", "mem", "--path", "pio"],
        "use it with --stack shm",
    );
    fails_with(
        &["rtt", "--stack", "shm", "--path", "dma", "--size", "70000"],
        "above 65535 bytes",
    );
    fails_with(
        &["rtt", "--stack", "shm", "--path", "pio", "--inflight", "4"],
        "--inflight 1",
    );
}
