//! Cost of the LTL per-frame path that the checksum dominates: a sender
//! sums the payload, writes the header and finishes the sum; a receiver
//! validates the frame (length, fields, CRC-32C) before reading it.
//!
//! `cargo bench -p uniplane-stacks --bench ltl_frame`; each figure is per
//! frame, throughput in payload bytes.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use uniplane_stacks::ltl::wire::{payload_checksum, Frame, Kind, Repr, HEADER_LEN};

const SIZES: [usize; 3] = [64, 1400, 8192];

fn repr() -> Repr {
    Repr {
        kind: Kind::Data,
        src_conn: 7,
        dst_conn: 9,
        seq: 1000,
        ack: 2000,
        window: 64,
    }
}

fn emit(c: &mut Criterion) {
    let mut g = c.benchmark_group("ltl_emit");
    for size in SIZES {
        let payload: Vec<u8> = (0..size).map(|i| (i * 131 + 7) as u8).collect();
        let mut out = BytesMut::with_capacity(HEADER_LEN + size);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &payload, |b, payload| {
            b.iter(|| {
                out.clear();
                let sum = payload_checksum(black_box(payload));
                repr().emit(payload, sum, &mut out);
                black_box(out.len())
            })
        });
    }
    g.finish();
}

fn check(c: &mut Criterion) {
    let mut g = c.benchmark_group("ltl_check");
    for size in SIZES {
        let payload: Vec<u8> = (0..size).map(|i| (i * 131 + 7) as u8).collect();
        let mut out = BytesMut::new();
        repr().emit(&payload, payload_checksum(&payload), &mut out);
        let frame = out.freeze();
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &frame, |b, frame| {
            b.iter(|| {
                let f = Frame::new_checked(black_box(&frame[..])).expect("a valid frame");
                black_box(f.seq())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, emit, check);
criterion_main!(benches);
