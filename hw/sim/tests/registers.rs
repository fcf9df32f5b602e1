//! The register space describes itself, and what the driver writes is
//! what the RTL holds.

use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::Uid;
use uniplane_hw_sim::{regs, Model, RtlDevice};
use uniplane_overlay::acl::ConnKey;
use uniplane_overlay::table::{Route, TableError};
use uniplane_overlay::{ForwardingPlane, PlaneError};

fn uid(d: u16) -> Uid {
    Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), d)
}

#[test]
fn the_blocks_chain_from_the_id_block_through_every_port_to_the_underlay() {
    for (model, ports) in [
        (Model::N4, 4),
        (Model::N8, 8),
        (Model::N8Kernels, 8),
        (Model::N4Islip, 4),
        (Model::N8Islip, 8),
    ] {
        let dev = RtlDevice::new(model);
        let kinds: Vec<u32> = dev.blocks().iter().map(|b| b.kind).collect();
        let mut want = vec![regs::kind::ID];
        want.extend(std::iter::repeat_n(regs::kind::PORT, ports));
        want.extend([regs::kind::TRANSLATOR, regs::kind::UNDERLAY]);
        assert_eq!(kinds, want);
        assert!(dev.blocks().iter().all(|b| b.version == 0x0001_0000));
    }
}

#[test]
fn the_id_block_reports_the_build_parameters_and_the_header_layout() {
    let mut dev = RtlDevice::new(Model::N4);
    assert_eq!(dev.read(regs::id::PORTS).unwrap(), 4);
    assert_eq!(dev.read(regs::id::TABLE_ENTRIES).unwrap(), 32);
    assert_eq!(dev.read(regs::id::QUANTUM).unwrap(), 1536);
    assert_eq!(dev.read(regs::id::BEAT_BITS).unwrap(), 256);
    assert_eq!(dev.read(regs::id::VOQ_DEPTH).unwrap(), 64);
    assert_eq!(dev.read(regs::id::VOQ_POOL).unwrap(), 768);
    assert_eq!(
        dev.read(regs::id::LAYOUT_HASH).unwrap(),
        uniplane_hw_gen::layout_hash()
    );
}

#[test]
fn the_id_block_says_which_crossbar_the_model_has() {
    for model in [
        Model::N4,
        Model::N8,
        Model::N8Kernels,
        Model::N4Islip,
        Model::N8Islip,
    ] {
        let mut dev = RtlDevice::new(model);
        let want = match model.match_iterations() {
            None => 0,
            Some(iters) => 1 | iters << 8 | (model.read_ports() as u32) << 16,
        };
        assert_eq!(dev.read(regs::id::CROSSBAR).unwrap(), want, "{model:?}");
    }
    assert_eq!(Model::N4Islip.match_iterations(), Some(2));
    assert_eq!(Model::N4Islip.read_ports(), 2);
}

#[test]
fn routes_land_in_priority_order_and_read_back() {
    let mut dev = RtlDevice::new(Model::N4);
    dev.add_route(1, Route::exact(uid(5), 2)).unwrap();
    dev.add_route(
        1,
        Route {
            priority: 7,
            ..Route::exact(uid(6), 3)
        },
    )
    .unwrap();
    let base = dev.block_base(regs::kind::PORT, 1).unwrap() + regs::port::ROUTE;
    // The priority-7 entry is first.
    assert_eq!(dev.read(base).unwrap(), uid(6).to_u64() as u32);
    assert_eq!(dev.read(base + 4).unwrap(), 1 << 31 | 3 << 16 | 0x0a00);
    assert_eq!(dev.read(base + 16).unwrap(), uid(5).to_u64() as u32);
    dev.remove_route(1, uid(6), Uid::MASK).unwrap();
    assert_eq!(dev.read(base).unwrap(), uid(5).to_u64() as u32);
    assert_eq!(dev.read(base + 16 + 4).unwrap() >> 31, 0, "entry 1 freed");
}

#[test]
fn the_table_refuses_an_entry_beyond_its_32_as_the_software_table_does() {
    let mut dev = RtlDevice::new(Model::N4);
    for d in 0..32 {
        dev.add_route(0, Route::exact(uid(d), 1)).unwrap();
    }
    assert_eq!(
        dev.add_route(0, Route::exact(uid(99), 1)),
        Err(PlaneError::Table(TableError::Full(32)))
    );
    assert_eq!(
        dev.add_route(9, Route::exact(uid(1), 1)),
        Err(PlaneError::NoSuchPort(9))
    );
}

#[test]
fn connections_translations_and_policies_are_checked_like_the_engines() {
    let mut dev = RtlDevice::new(Model::N4);
    let conn = ConnKey {
        src: uid(1),
        src_port: 1,
        dst: uid(2),
        dst_port: 2,
    };
    dev.allow_connection(0, conn).unwrap();
    let base = dev.block_base(regs::kind::PORT, 0).unwrap();
    assert_eq!(dev.read(base + regs::port::CONN_VALID).unwrap(), 0b11);
    dev.revoke_connection(0, conn).unwrap();
    assert_eq!(dev.read(base + regs::port::CONN_VALID).unwrap(), 0);
    assert_eq!(
        dev.remove_translation(conn),
        Err(PlaneError::NoTranslation(conn))
    );
    assert_eq!(dev.add_translation(conn, 4), Err(PlaneError::NoSuchPort(4)));
    assert!(matches!(
        dev.set_policy(0, Policy::Weighted(vec![1, 0])),
        Err(PlaneError::Policy(_))
    ));
    dev.set_policy(2, Policy::Weighted(vec![3, 1])).unwrap();
    assert_eq!(dev.read(base + 0x2000 + regs::port::WEIGHT).unwrap(), 3);
    assert_eq!(
        dev.read(base + 0x2000 + regs::port::WEIGHT + 12).unwrap(),
        1,
        "padded with 1"
    );
    assert_eq!(dev.read(base + 0x2000 + regs::port::POLICY).unwrap(), 1);
}

#[test]
fn a_device_can_be_handed_to_another_thread_as_a_daemon_would() {
    let mut dev = RtlDevice::new(Model::N4);
    dev.add_route(0, Route::exact(uid(1), 1)).unwrap();
    let handle = std::thread::spawn(move || {
        dev.add_route(0, Route::exact(uid(2), 2)).unwrap();
        let base = dev.block_base(regs::kind::PORT, 0).unwrap() + regs::port::ROUTE;
        dev.read(base + 16).unwrap()
    });
    assert_eq!(handle.join().unwrap(), uid(2).to_u64() as u32);
}
