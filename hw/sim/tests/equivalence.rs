//! The RTL against the software engine, trace for trace.
//!
//! Each seed makes a scenario (forwarding tables with competing
//! priorities, defaults and misses, access control by connection and by
//! rule, translations, a round-robin, weighted or strict-priority policy
//! per output, and a message trace per input: SEND, PUSH, WRTE, READ with
//! its second header beat, completions, payloads from 0 to ~1.8 KB), programs
//! it into `uniplane_overlay::Engine` and into the RTL through the same
//! `ForwardingPlane` calls, runs the trace through both and compares:
//!
//! (b) `preloaded`: every message is in its virtual output queue before
//!     any output is served (the engine: one step with queues and bursts
//!     larger than the trace; the RTL: outputs paused through their
//!     registers until the inputs have drained, then released), so only
//!     the schedulers decide: each output's message sequence must be
//!     identical, under random output backpressure.
//! (a) `free_running`: random idle cycles on the inputs and backpressure
//!     on the outputs, small engine queues; the interleaving may differ,
//!     but for every (input, output) pair the sequence must be identical,
//!     and so must every output's multiset of messages.
//!
//! In both, the per-port counters must agree (received, sent, denied, no
//! route, error answers, unanswerable), as must the success of every
//! control call.
//!
//! The crossbar with iSLIP matching (`Model::N4Islip`) is held to (a)
//! only: its outputs' schedulers choose among the inputs not matched to
//! another output, so with every message preloaded an output may take a
//! message the engine's scheduler would have taken later (its input was
//! busy elsewhere), and the exact per-output order of (b) does not hold.

mod common;

use common::{run_engine, Outcome, Scenario};
use uniplane_dataplane::Message;
use uniplane_hw_sim::{Model, RtlDevice, Stream, Traffic};
use uniplane_overlay::{ForwardingPlane, PortCounters, PortId};

fn run_rtl(sc: &Scenario, preload: bool, traffic: Traffic) -> Outcome {
    let model = if sc.ports == 8 { Model::N8 } else { Model::N4 };
    run_model(model, sc, preload, traffic)
}

fn run_model(model: Model, sc: &Scenario, preload: bool, traffic: Traffic) -> Outcome {
    let mut dev = RtlDevice::new(model);
    let programmed = sc.program(&mut dev);
    if preload {
        for p in 0..sc.ports as PortId {
            dev.pause_output(p, true).unwrap();
        }
    }
    dev.set_traffic(traffic);
    for (i, msgs) in sc.messages.iter().enumerate() {
        for m in msgs {
            dev.send(Stream::Port, i, m);
        }
    }
    assert!(
        dev.run_until(100_000, |d| d.inputs_drained()),
        "inputs stuck"
    );
    // Let the connectors' pipelines empty into the queues.
    dev.run(64);
    if preload {
        assert_eq!(dev.delivered_total(), 0, "a paused output sent");
        for p in 0..sc.ports as PortId {
            dev.pause_output(p, false).unwrap();
        }
    }
    let mut quiet = 0;
    let mut last = usize::MAX;
    while quiet < 400 {
        dev.run(50);
        let now = dev.delivered_total();
        quiet = if now == last { quiet + 50 } else { 0 };
        last = now;
        assert!(dev.cycle() < 2_000_000, "outputs stuck");
    }
    let outputs = (0..sc.ports)
        .map(|o| {
            assert_eq!(dev.malformed(Stream::Port, o), 0);
            dev.delivered(Stream::Port, o)
                .iter()
                .map(|d| d.message.clone())
                .collect()
        })
        .collect();
    let counters = (0..sc.ports as PortId)
        .map(|p| dev.counters(p).unwrap())
        .collect();
    Outcome {
        outputs,
        counters,
        programmed,
    }
}

fn comparable(c: &PortCounters) -> [u64; 8] {
    [
        c.rx_msgs,
        c.rx_bytes,
        c.tx_msgs,
        c.tx_bytes,
        c.acl_denied,
        c.no_route,
        c.error_answers,
        c.unanswerable,
    ]
}

fn input_of(m: &Message) -> u32 {
    m.header().seqnum >> 16
}

fn describe(v: &[Message]) -> Vec<String> {
    v.iter()
        .map(|m| {
            let h = m.header();
            format!(
                "{}:{}#{:x}+{}",
                h.request.kind(),
                h.dst,
                h.seqnum,
                m.payload().len()
            )
        })
        .collect()
}

fn check_common(seed: u64, sc: &Scenario, sw: &Outcome, hw: &Outcome) {
    assert_eq!(
        sw.programmed, hw.programmed,
        "seed {seed}: control calls differ"
    );
    for p in 0..sc.ports {
        assert_eq!(
            comparable(&sw.counters[p]),
            comparable(&hw.counters[p]),
            "seed {seed}: counters of port {p}\n  engine {:?}\n  rtl    {:?}",
            sw.counters[p],
            hw.counters[p]
        );
    }
}

const SEEDS_PRELOADED: u64 = 400;
const SEEDS_FREE: u64 = 200;

#[test]
fn preloaded_traces_leave_every_output_in_the_engines_exact_order() {
    preloaded(4, SEEDS_PRELOADED, 12, 60);
}

#[test]
fn preloaded_traces_leave_every_output_in_the_engines_exact_order_with_8_ports() {
    // 32-beat queues in this model: shorter traces.
    preloaded(8, SEEDS_PRELOADED / 4, 8, 30);
}

fn preloaded(ports: usize, seeds: u64, msgs: usize, beats: usize) {
    let mut total = 0;
    for seed in 0..seeds {
        let sc = Scenario::random(seed, ports, msgs, beats);
        let sw = run_engine(&sc, true);
        let traffic = Traffic {
            input_idle: 0.0,
            output_stall: 0.3,
            seed,
        };
        let hw = run_rtl(&sc, true, traffic);
        for o in 0..sc.ports {
            assert!(
                sw.outputs[o] == hw.outputs[o],
                "seed {seed}: output {o} differs\n  engine {:?}\n  rtl    {:?}",
                describe(&sw.outputs[o]),
                describe(&hw.outputs[o])
            );
            total += sw.outputs[o].len();
        }
        check_common(seed, &sc, &sw, &hw);
    }
    assert!(
        total as u64 > seeds * 10,
        "the traces carried too little: {total}"
    );
}

#[test]
fn free_running_traces_keep_every_flow_in_order_and_lose_nothing() {
    free_running(Model::N4, SEEDS_FREE);
}

#[test]
fn free_running_traces_through_the_islip_crossbar_keep_every_flow_in_order_and_lose_nothing() {
    free_running(Model::N4Islip, SEEDS_FREE);
}

#[test]
fn free_running_traces_through_the_8_port_islip_crossbar_keep_every_flow_in_order() {
    free_running(Model::N8Islip, SEEDS_FREE / 4);
}

fn free_running(model: Model, seeds: u64) {
    let ports = RtlDevice::new(model).ports();
    for seed in 0..seeds {
        let sc = Scenario::random(1000 + seed, ports, 12, 60);
        let sw = run_engine(&sc, false);
        let traffic = Traffic {
            input_idle: 0.3,
            output_stall: 0.3,
            seed,
        };
        let hw = run_model(model, &sc, false, traffic);
        check_common(seed, &sc, &sw, &hw);
        for o in 0..sc.ports {
            for i in 0..sc.ports as u32 {
                let flow = |v: &[Message]| -> Vec<Message> {
                    v.iter().filter(|m| input_of(m) == i).cloned().collect()
                };
                assert!(
                    flow(&sw.outputs[o]) == flow(&hw.outputs[o]),
                    "seed {seed}: flow {i} -> {o} differs\n  engine {:?}\n  rtl    {:?}",
                    describe(&flow(&sw.outputs[o])),
                    describe(&flow(&hw.outputs[o]))
                );
            }
        }
    }
}
