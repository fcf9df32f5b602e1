//! Cost of the underlay's per-message path: filter check, offer, dequeue
//! (scheduler and shaper), and demux classification.
//!
//! `cargo bench -p uniplane-underlay`; each figure is per message.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::wire::ReqType;
use uniplane_dataplane::{Message, Uid};
use uniplane_underlay::{
    AddressWindow, Demux, DemuxRule, FilterRules, InterfaceMux, MuxConfig, ShaperConfig, TypeSet,
    UidMatch,
};

const QUEUES: usize = 4;

fn uid(s: &str) -> Uid {
    s.parse().expect("a valid UID")
}

/// One message per queue, of different sizes, sharing one payload buffer.
fn messages() -> Vec<Message> {
    let payload = Bytes::from(vec![0u8; 1500]);
    (0..QUEUES)
        .map(|q| {
            let src = uid(&format!("10.0.0.{}:1", q + 1)).port(7);
            let dst = uid("10.0.1.1:2").port(9);
            Message::send(src, dst, payload.slice(..64 + q * 400)).expect("a valid message")
        })
        .collect()
}

/// Rules of a realistic size: a few sources, all types but user ones,
/// a length limit and a few windows.
fn rules() -> FilterRules {
    FilterRules {
        sources: (1..=8)
            .map(|i| UidMatch::server(format!("10.0.0.{i}").parse().expect("an IPv4 address")))
            .collect(),
        max_len: 9000,
        types: ReqType::ALL.iter().copied().collect(),
        windows: (0..4)
            .map(|i| {
                AddressWindow::new(UidMatch::exact(uid("10.0.1.1:2")), i << 20, 1 << 20)
                    .expect("a valid window")
            })
            .collect(),
    }
}

fn mux(shaper: Option<ShaperConfig>) -> InterfaceMux {
    InterfaceMux::new(MuxConfig {
        policy: Policy::Weighted(vec![1, 2, 3, 4]),
        rules: rules(),
        shaper,
        ..MuxConfig::new(QUEUES, 1024)
    })
    .expect("a valid configuration")
}

fn bench(c: &mut Criterion) {
    let msgs = messages();
    let mut g = c.benchmark_group("underlay");
    g.throughput(Throughput::Elements(1));

    g.bench_function("filter_check", |b| {
        let rules = rules();
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % QUEUES;
            black_box(rules.check(black_box(&msgs[i])))
        })
    });

    // What the harness of the two mux benches costs by itself: cloning a
    // message (a reference-count increment) and dropping one.
    g.bench_function("baseline_clone_drop", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % QUEUES;
            black_box(msgs[i].clone())
        })
    });

    // Keep every queue half full; each iteration offers one message and
    // dequeues one: check + offer + pick + dequeue.
    let prefill = |m: &mut InterfaceMux| {
        for _ in 0..512 {
            for (q, msg) in msgs.iter().enumerate() {
                m.offer(q, msg.clone(), 0).expect("room");
            }
        }
    };
    g.bench_function("offer_dequeue_weighted", |b| {
        let mut m = mux(None);
        prefill(&mut m);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % QUEUES;
            let out = m.dequeue(0).expect("backlogged");
            m.offer(i, msgs[i].clone(), 0).ok();
            black_box(out)
        })
    });

    g.bench_function("offer_dequeue_weighted_shaped", |b| {
        // 100 GB/s on a clock that advances 1 µs per message: never throttled,
        // so this measures the shaper's bookkeeping.
        let mut m = mux(Some(ShaperConfig::new(100_000_000_000, 1 << 20)));
        prefill(&mut m);
        let (mut i, mut now) = (0, 0);
        b.iter(|| {
            i = (i + 1) % QUEUES;
            now += 1000;
            let out = m.dequeue(now);
            m.offer(i, msgs[i].clone(), now).ok();
            black_box(out)
        })
    });

    g.bench_function("demux_classify", |b| {
        let rules = (0..8)
            .map(|i| {
                DemuxRule::new(
                    UidMatch::exact(uid(&format!("10.0.1.{i}:2"))),
                    TypeSet::of(&[ReqType::Write, ReqType::Read]),
                    i % 4,
                )
            })
            .chain([DemuxRule::new(UidMatch::ANY, TypeSet::ALL, 0)])
            .collect();
        let mut d = Demux::new(4, rules, Some(3)).expect("valid rules");
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % QUEUES;
            black_box(d.classify(black_box(msgs[i].header())))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
