//! The simulation as a specification of the control plane: many seeds
//! with faults and no violation, a seed that replays exactly, and a
//! checker that sees the defects planted for it.

use uniplane_sim::{run, Bug, Fault, SimConfig, Workload};

const ALL_FAULTS: [Fault; 4] = [Fault::Crash, Fault::Partition, Fault::Loss, Fault::Reorder];

fn faulty(servers: usize, seed: u64) -> SimConfig {
    let mut c = SimConfig::new(servers, seed);
    c.faults = ALL_FAULTS.to_vec();
    c
}

fn assert_clean(c: SimConfig) -> uniplane_sim::Report {
    let r = run(c);
    if let Some(v) = &r.violation {
        panic!(
            "violation at {:.3} ms: {}\nreplay: {}",
            v.at_ms, v.what, r.replay
        );
    }
    r
}

#[test]
fn two_hundred_churn_seeds_with_every_fault_break_no_invariant() {
    let mut crashes = 0;
    let mut delivered = 0;
    for seed in 0..200u64 {
        let servers = 8 + (seed % 9) as usize;
        let r = assert_clean(faulty(servers, seed));
        crashes += r.crashes;
        delivered += r.delivered;
        assert!(r.connected > 0, "seed {seed} set nothing up");
    }
    assert!(crashes >= 200, "every seed crashed a server");
    assert!(delivered > 10_000, "data went through the engines");
}

#[test]
fn all_to_all_and_collective_seeds_with_faults_break_no_invariant() {
    for seed in 0..40u64 {
        let mut c = faulty(8 + (seed % 5) as usize, 1000 + seed);
        c.workload = if seed % 2 == 0 {
            Workload::AllToAll
        } else {
            Workload::Collective
        };
        c.connections = 2;
        assert_clean(c);
    }
}

#[test]
fn a_collective_without_faults_completes_every_ring_step() {
    let mut c = SimConfig::new(10, 3);
    c.workload = Workload::Collective;
    c.connections = 2;
    let r = assert_clean(c);
    // Ten servers, each passing 2 × (10 − 1) chunks per round, 2 rounds.
    assert_eq!(r.delivered, 10 * 2 * 9 * 2);
    assert_eq!(r.delivered, r.sent);
}

#[test]
fn the_same_seed_replays_the_same_trace_and_another_seed_does_not() {
    let a = assert_clean(faulty(12, 42));
    let b = assert_clean(faulty(12, 42));
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.events, b.events);
    assert_eq!(a.delivered, b.delivered);
    assert_eq!(a.convergence, b.convergence);
    let c = assert_clean(faulty(12, 43));
    assert_ne!(a.trace_hash, c.trace_hash);
}

#[test]
fn the_engine_and_its_connectors_alone_decide_the_same_run() {
    let mut light = faulty(10, 9);
    light.engine = false;
    let a = assert_clean(faulty(10, 9));
    let b = assert_clean(light);
    assert_eq!(a.connected, b.connected);
    assert_eq!(a.delivered, b.delivered);
}

#[test]
fn a_killed_servers_peers_are_notified_within_the_timeout_in_every_seed() {
    let mut checked = 0;
    for seed in 0..60u64 {
        let mut c = SimConfig::new(8 + (seed % 9) as usize, 500 + seed);
        c.faults = vec![Fault::Crash];
        c.crashes = 2;
        c.connections = 16;
        c.window = 8;
        let limit = c.notify_within().as_secs_f64() * 1e3;
        let r = assert_clean(c);
        assert!(r.crashes >= 1);
        checked += r.notify_checks;
        assert_eq!(r.convergence.len() as u64, r.crashes, "seed {seed}");
        for ms in &r.convergence {
            assert!(*ms <= limit, "seed {seed}: converged after {ms} ms");
        }
    }
    assert!(
        checked > 100,
        "connections to dead servers were watched ({checked})"
    );
}

fn caught(bug: Bug) -> String {
    let mut c = SimConfig::new(8, 1);
    c.bug = Some(bug);
    let r = run(c);
    let v = r.violation.unwrap_or_else(|| panic!("{bug:?} went unseen"));
    assert!(r.replay.contains("--seed 1") && r.replay.contains("--bug"));
    v.what
}

#[test]
fn the_checker_sees_a_tunnel_that_duplicates() {
    assert!(caught(Bug::Duplicate).contains("delivered twice"));
}

#[test]
fn the_checker_sees_a_tunnel_that_reorders() {
    assert!(caught(Bug::Reorder).contains("out of order"));
}

#[test]
fn the_checker_sees_a_tunnel_that_drops_silently() {
    assert!(caught(Bug::Drop).contains("never told"));
}
