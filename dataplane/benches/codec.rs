//! Header encode and decode, per header: the budget is 5 ns each.
//!
//! Run: `cargo bench -p uniplane-dataplane --bench codec`

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use uniplane_dataplane::wire::{Header, HeaderView};
use uniplane_dataplane::{Message, Uid};

fn messages() -> (Message, Message) {
    let a: Uid = "10.0.0.7:3".parse().unwrap();
    let b: Uid = "10.0.0.9:1".parse().unwrap();
    let send = Message::send(a.port(80), b.port(443), Bytes::from_static(&[7u8; 64])).unwrap();
    let write = Message::write(a, b.at(0x1000), Bytes::from_static(&[7u8; 64])).unwrap();
    (send, write)
}

fn header(c: &mut Criterion) {
    let (send, write) = messages();
    let mut group = c.benchmark_group("header");
    group.throughput(Throughput::Elements(1));
    for (name, m) in [("send", &send), ("write", &write)] {
        let h = *m.header();
        let mut buf = [0u8; 32];
        group.bench_function(format!("encode/{name}"), |bench| {
            bench.iter(|| black_box(&h).encode(black_box(&mut buf[..])).unwrap())
        });
        h.encode(&mut buf).unwrap();
        group.bench_function(format!("decode/{name}"), |bench| {
            // Read the fields a forwarding hop reads. Passing the whole
            // 72-byte header to black_box would measure a store-forwarding
            // stall of the copy, not the decoder.
            bench.iter(|| {
                let h = Header::decode(black_box(&buf[..])).unwrap();
                black_box((h.dst, h.seqnum, h.request.kind(), h.length));
            })
        });
        group.bench_function(format!("view_check/{name}"), |bench| {
            bench.iter(|| {
                black_box(
                    HeaderView::new_checked(black_box(&buf[..]))
                        .unwrap()
                        .dst_uid(),
                );
            })
        });
    }
    group.finish();
}

fn message(c: &mut Criterion) {
    let (send, _) = messages();
    let mut group = c.benchmark_group("message_64B");
    group.throughput(Throughput::Elements(1));
    let mut out = BytesMut::with_capacity(1 << 20);
    group.bench_function("encode", |bench| {
        bench.iter(|| {
            if out.capacity() - out.len() < 256 {
                out.clear();
            }
            black_box(&send).encode(&mut out);
        })
    });
    let mut one = BytesMut::new();
    send.encode(&mut one);
    let bytes = one.freeze();
    group.bench_function("decode", |bench| {
        bench.iter(|| {
            black_box(Message::decode(black_box(&bytes)).unwrap());
        })
    });
    group.finish();
}

criterion_group!(benches, header, message);
criterion_main!(benches);
