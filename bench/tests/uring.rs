//! The udp stack on its io_uring backend through the binary:
//! `udp-uring` and `udp-unpacked-uring` carry `gen` and `rtt` like their
//! epoll twins.

mod common;

use common::*;

#[test]
fn the_io_uring_variants_carry_gen_and_rtt() {
    for stack in ["udp-uring", "udp-unpacked-uring"] {
        let v = last_json(&bench(&[
            "gen", "--stack", stack, "--rate", "20kpps", "--count", "2000", "--warmup", "0",
            "--json",
        ]));
        assert_eq!(string(&v, "params.stack"), stack);
        assert_eq!(count(&v, "results.sent"), 2000);
        // Loopback at 20 kpps: what the kernel drops is counted, not lost
        // silently.
        assert_eq!(
            count(&v, "results.received") + count(&v, "results.lost"),
            2000
        );
        assert!(count(&v, "results.received") > 1000, "{stack}");
        let v = last_json(&bench(&[
            "rtt", "--stack", stack, "--count", "500", "--warmup", "0", "--json",
        ]));
        assert_eq!(count(&v, "results.received"), 500, "{stack}");
        assert!(count(&v, "results.rtt_ns.p50") > 0);
    }
}
