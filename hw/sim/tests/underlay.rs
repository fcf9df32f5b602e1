//! The RTL underlay against the Rust underlay, trace for trace: the same
//! filter rules, policy and demux rules give the same interface sequence,
//! the same drops and the same classification.

mod common;

use bytes::Bytes;
use common::{pool, uid};
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::wire::ReqType;
use uniplane_dataplane::{Message, SplitMix64};
use uniplane_hw_sim::{Model, RtlDevice, Stream, Traffic};
use uniplane_underlay::{
    AddressWindow, Demux, DemuxRule, FilterRules, InterfaceMux, MuxConfig, TypeSet, UidMatch,
};

fn pick<T: Clone>(rng: &mut SplitMix64, v: &[T]) -> T {
    v[rng.below(v.len() as u64) as usize].clone()
}

fn random_message(rng: &mut SplitMix64, seq: u32, max_payload: u64) -> Message {
    let pool = pool();
    let src = pick(rng, &pool);
    let dst = pick(rng, &pool);
    let payload = Bytes::from(vec![seq as u8; rng.below(max_payload) as usize]);
    let mut m = match rng.below(4) {
        0 => Message::write(src, dst.at(0x100), payload).unwrap(),
        1 => Message::read(src.at(0), dst.at(0x40), 64).unwrap(),
        _ => Message::send(src.port(1), dst.port(2), payload).unwrap(),
    };
    m.set_seqnum(seq);
    m
}

fn random_rules(rng: &mut SplitMix64) -> FilterRules {
    let pool = pool();
    let mut sources = Vec::new();
    for _ in 0..1 + rng.below(3) {
        sources.push(match rng.below(3) {
            0 => UidMatch::exact(pick(rng, &pool)),
            1 => UidMatch::server(pick(rng, &pool).server()),
            _ => UidMatch::ANY,
        });
    }
    let mut types = TypeSet::of(&[ReqType::Send]);
    if rng.chance(0.7) {
        types.insert(ReqType::Write);
    }
    if rng.chance(0.7) {
        types.insert(ReqType::Read);
    }
    FilterRules {
        sources,
        max_len: 64 + rng.below(200) as usize,
        types,
        windows: vec![AddressWindow::everything(UidMatch::ANY)],
    }
}

fn random_policy(rng: &mut SplitMix64) -> Policy {
    match rng.below(3) {
        0 => Policy::RoundRobin,
        1 => Policy::Weighted(vec![1 + rng.below(4) as u32, 1 + rng.below(4) as u32]),
        _ => Policy::StrictPriority {
            class: vec![rng.below(2) as u8, rng.below(2) as u8],
            weights: vec![1, 1],
        },
    }
}

#[test]
fn preloaded_stacks_leave_the_interface_in_the_software_multiplexers_order() {
    for seed in 0..150 {
        let mut rng = SplitMix64::new(seed);
        let rules = random_rules(&mut rng);
        let policy = random_policy(&mut rng);
        // Each stack's queue (32 beats) holds its whole trace.
        let mut traces: Vec<Vec<Message>> = vec![Vec::new(), Vec::new()];
        for (s, trace) in traces.iter_mut().enumerate() {
            let mut beats = 0;
            for k in 0..10 {
                let m = random_message(&mut rng, (s as u32) << 16 | k, 160);
                beats += m.encoded_len().div_ceil(32);
                if beats > 32 {
                    break;
                }
                trace.push(m);
            }
        }

        let mut mux = InterfaceMux::new(MuxConfig {
            policy: policy.clone(),
            rules: rules.clone(),
            ..MuxConfig::new(2, 64)
        })
        .unwrap();
        for (s, trace) in traces.iter().enumerate() {
            for m in trace {
                let _ = mux.offer(s, m.clone(), 0);
            }
        }
        let sw: Vec<Message> = std::iter::from_fn(|| mux.dequeue(0)).collect();

        let mut dev = RtlDevice::new(Model::N4);
        dev.set_underlay_rules(&rules).unwrap();
        dev.set_underlay_policy(policy).unwrap();
        dev.pause_interface(true).unwrap();
        dev.set_traffic(Traffic {
            input_idle: 0.2,
            output_stall: 0.3,
            seed,
        });
        for (s, trace) in traces.iter().enumerate() {
            for m in trace {
                dev.send(Stream::Stack, s, m);
            }
        }
        assert!(dev.run_until(20_000, |d| d.inputs_drained()));
        dev.run(32);
        dev.pause_interface(false).unwrap();
        dev.run_until(20_000, |d| {
            d.delivered(Stream::Interface, 0).len() >= sw.len()
        });
        dev.run(200);
        let hw: Vec<Message> = dev
            .delivered(Stream::Interface, 0)
            .iter()
            .map(|d| d.message.clone())
            .collect();
        assert!(
            sw == hw,
            "seed {seed}: interface order differs\n  sw {sw:?}\n  hw {hw:?}"
        );

        let f = mux.filter_counters();
        let c = dev.underlay_counters().unwrap();
        assert_eq!(
            (c.passed, c.source_denied, c.type_denied, c.too_long, c.sent),
            (
                f.passed,
                f.source_denied,
                f.type_denied,
                f.too_long,
                sw.len() as u64
            ),
            "seed {seed}: filter counters"
        );
    }
}

#[test]
fn the_demux_sends_each_message_where_the_software_demux_does() {
    for seed in 0..100 {
        let mut rng = SplitMix64::new(500 + seed);
        let pool = pool();
        let mut rules = Vec::new();
        for _ in 0..rng.below(5) {
            let dst = if rng.chance(0.5) {
                UidMatch::exact(pick(&mut rng, &pool))
            } else {
                UidMatch::server(pick(&mut rng, &pool).server())
            };
            let types = if rng.chance(0.5) {
                TypeSet::ALL
            } else {
                TypeSet::of(&[ReqType::Write, ReqType::Read])
            };
            rules.push(DemuxRule::new(dst, types, rng.below(2) as usize));
        }
        let default = rng.chance(0.5).then(|| rng.below(2) as usize);
        let mut demux = Demux::new(2, rules.clone(), default).unwrap();
        let msgs: Vec<Message> = (0..12).map(|k| random_message(&mut rng, k, 100)).collect();
        let mut want = [Vec::new(), Vec::new()];
        for m in &msgs {
            if let Some(o) = demux.classify(m.header()) {
                want[o].push(m.clone());
            }
        }

        let mut dev = RtlDevice::new(Model::N4);
        dev.set_demux(&rules, default).unwrap();
        dev.set_traffic(Traffic {
            input_idle: 0.3,
            output_stall: 0.3,
            seed,
        });
        for m in &msgs {
            dev.send(Stream::Interface, 0, m);
        }
        assert!(dev.run_until(20_000, |d| d.inputs_drained()));
        dev.run(100);
        for (o, want) in want.iter().enumerate() {
            let got: Vec<Message> = dev
                .delivered(Stream::Stack, o)
                .iter()
                .map(|d| d.message.clone())
                .collect();
            assert!(&got == want, "seed {seed}: stack {o}");
        }
        let c = dev.underlay_counters().unwrap();
        let s = demux.counters();
        assert_eq!(
            (c.classified, c.misses, c.dropped),
            (s.classified, s.misses, s.dropped),
            "seed {seed}: demux counters"
        );
    }
}

#[test]
fn the_filter_refuses_memory_windows_it_cannot_check() {
    let mut dev = RtlDevice::new(Model::N4);
    let rules = FilterRules {
        windows: vec![AddressWindow::new(UidMatch::exact(uid(1, 1)), 0, 4096).unwrap()],
        ..FilterRules::allow_all()
    };
    assert!(dev.set_underlay_rules(&rules).is_err());
}
