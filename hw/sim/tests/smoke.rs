use bytes::Bytes;
use uniplane_dataplane::{Message, Uid};
use uniplane_hw_sim::{regs, Model, RtlDevice, Stream};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{ForwardingPlane, PortId};

fn uid(d: u16) -> Uid {
    Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), d)
}

#[test]
fn smoke() {
    let mut dev = RtlDevice::new(Model::N4);
    for b in dev.blocks() {
        eprintln!("{:x} {:x} {:x}", b.base, b.kind, b.version);
    }
    assert_eq!(dev.blocks().len(), 7);
    assert_eq!(dev.blocks()[0].kind, regs::kind::ID);
    for p in 0..4 as PortId {
        dev.add_acl_rule(p, AclRule::ALLOW_ALL).unwrap();
        for d in 0..4 as PortId {
            dev.add_route(p, Route::exact(uid(d + 1), d)).unwrap();
        }
    }
    let t0 = dev.cycle();
    for s in 0..4u16 {
        for k in 0..5u32 {
            let mut m = Message::send(
                uid(s + 1).port(1),
                uid((s + k as u16) % 4 + 1).port(2),
                Bytes::from(vec![k as u8; (k * 37) as usize]),
            )
            .unwrap();
            m.set_seqnum(k);
            dev.send(Stream::Port, s as usize, &m);
        }
    }
    let ok = dev.run_until(5000, |d| d.delivered_total() == 20);
    eprintln!("cycles {}", dev.cycle() - t0);
    for o in 0..4 {
        for d in dev.delivered(Stream::Port, o) {
            eprintln!(
                "out {o}: {} -> {} seq {} len {} @{}",
                d.message.header().src,
                d.message.header().dst,
                d.message.header().seqnum,
                d.message.payload().len(),
                d.first_cycle
            );
        }
    }
    assert!(ok);
    let c = dev.counters(0).unwrap();
    eprintln!("{c:?}");
}
