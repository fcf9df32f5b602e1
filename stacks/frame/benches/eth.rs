//! Cost of the Ethernet header on the frame path: the checked view and
//! the two fields every received frame is sorted by, writing a header,
//! and completing an offloaded UDP checksum.
//!
//! `cargo bench -p uniplane-frame --bench eth`; each figure is per frame.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use uniplane_frame::eth::{self, EthernetFrame, MacAddr};

fn frame_path(c: &mut Criterion) {
    let mut buf = vec![0u8; 64];
    eth::write_header(&mut buf, MacAddr::local(2), MacAddr::local(1), 0x88b5);
    c.bench_function("eth_read_src_and_type", |b| {
        b.iter(|| {
            let e = EthernetFrame::new_checked(black_box(&buf[..])).expect("a frame");
            (eth::src(&e), eth::ethertype(&e))
        })
    });
    c.bench_function("eth_write_header", |b| {
        b.iter(|| {
            eth::write_header(
                black_box(&mut buf),
                black_box(MacAddr::local(2)),
                MacAddr::local(1),
                0x88b5,
            )
        })
    });
    // IPv4/UDP, 1400 bytes of payload, checksum field holding a partial sum.
    let mut udp = vec![0u8; 14 + 20 + 8 + 1400];
    eth::write_header(&mut udp, MacAddr::local(2), MacAddr::local(1), 0x0800);
    udp[14] = 0x45;
    udp[16..18].copy_from_slice(&((20 + 8 + 1400) as u16).to_be_bytes());
    udp[14 + 9] = 17;
    udp[38..40].copy_from_slice(&((8 + 1400) as u16).to_be_bytes());
    c.bench_function("eth_complete_udp_checksum_1400", |b| {
        b.iter(|| eth::complete_l4_checksum(black_box(&mut udp)))
    });
}

criterion_group!(benches, frame_path);
criterion_main!(benches);
