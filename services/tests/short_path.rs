//! The short data path: an application's client-side `ShmLink` talks to
//! the engine thread through a `ShmPort` (no task, no relay), and the echo
//! device runs inside the engine thread as an `InlinePort`.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{Message, Uid};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{
    Engine, EngineConfig, EngineHandle, ForwardingPlane, PortKind, PortSpec, RunMode,
};
use uniplane_services::config::DeviceKind;
use uniplane_services::devices;
use uniplane_shm::{ShmConfig, ShmLink, ShmPort, ShmPortEnd, MIN_RING_BYTES};

fn app() -> Uid {
    "127.0.0.1:7".parse().unwrap()
}

fn echo() -> Uid {
    "127.0.0.1:1".parse().unwrap()
}

fn ping(i: u32, len: usize) -> Message {
    let mut m = Message::send(app().port(5), echo().port(80), Bytes::from(vec![9u8; len])).unwrap();
    m.set_seqnum(i);
    m
}

/// An engine with the application on a `ShmPort` and an inline echo,
/// routed to each other, running on its own thread.
async fn short_path(
    mode: RunMode,
    client: &ShmConfig,
) -> (ShmLink, EngineHandle, tokio::task::JoinHandle<ShmPortEnd>) {
    let server = ShmConfig {
        ring_bytes: MIN_RING_BYTES,
        ..ShmConfig::default()
    };
    let (link, port, bell) = ShmPort::pair(&server, client).await.unwrap();
    let mut engine = Engine::new(EngineConfig::default());
    let a = engine
        .attach_io(PortSpec::app("app"), Box::new(port))
        .unwrap();
    let device = PortSpec {
        kind: PortKind::Device,
        name: "echo".into(),
        mtu: Message::MAX_PAYLOAD,
    };
    let e = engine
        .attach_io(device, devices::inline_port(DeviceKind::Echo, 0, None))
        .unwrap();
    for p in [a, e] {
        engine.add_acl_rule(p, AclRule::ALLOW_ALL).unwrap();
    }
    engine.add_route(a, Route::exact(echo(), e)).unwrap();
    engine.add_route(e, Route::exact(app(), a)).unwrap();
    let bell = tokio::spawn(bell);
    (link, engine.spawn(mode), bell)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_goes_through_the_engine_to_an_inline_echo_and_back() {
    let mode = RunMode::SpinThenPark { spins: 100 };
    let (mut link, engine, _bell) = short_path(mode, &ShmConfig::default()).await;
    for (i, len) in [0usize, 64, 1500, 65_000].into_iter().enumerate() {
        link.send(ping(i as u32, len)).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(5), link.next())
            .await
            .expect("the echo answers")
            .unwrap()
            .unwrap();
        assert_eq!((back.header().src, back.header().dst), (echo(), app()));
        assert_eq!(back.header().request.ports(), Some((80, 5)));
        assert_eq!(
            (back.header().seqnum, back.payload().len()),
            (i as u32, len)
        );
    }
    let mut e = engine.stop().unwrap();
    assert_eq!(e.counters(0).unwrap().rx_msgs, 4);
    assert_eq!(e.counters(1).unwrap().tx_msgs, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_larger_than_every_queue_arrives_whole_and_in_order() {
    let mode = RunMode::SpinThenPark { spins: 100 };
    let (link, engine, _bell) = short_path(mode, &ShmConfig::default()).await;
    const N: u32 = 20_000;
    let (mut tx, mut rx) = link.split();
    let sender = tokio::spawn(async move {
        for i in 0..N {
            tx.feed(ping(i, 1000)).await.unwrap();
        }
        tx.flush().await.unwrap();
        tx
    });
    for i in 0..N {
        if i % 2000 == 0 {
            // A slow reader: every queue on the way fills up.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let m = tokio::time::timeout(Duration::from_secs(10), rx.next())
            .await
            .expect("no message is lost")
            .unwrap()
            .unwrap();
        assert_eq!(m.header().seqnum, i);
    }
    drop(sender.await.unwrap());
    let mut e = engine.stop().unwrap();
    let app = e.counters(0).unwrap();
    assert_eq!(
        (app.rx_msgs, app.tx_msgs, app.no_route),
        (N as u64, N as u64, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_polling_on_both_sides_carries_the_round_trip() {
    let busy = ShmConfig {
        busy_poll: true,
        ..ShmConfig::default()
    };
    let (mut link, engine, _bell) = short_path(RunMode::BusyPoll, &busy).await;
    for i in 0..1000 {
        link.send(ping(i, 64)).await.unwrap();
        let back = link.next().await.unwrap().unwrap();
        assert_eq!(back.header().seqnum, i);
    }
    assert_eq!(link.stats().doorbells, 0, "nobody parked, nobody rang");
    drop(engine.stop());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applications_death_is_reported_and_the_port_can_be_detached() {
    let mode = RunMode::SpinThenPark { spins: 10 };
    let (link, engine, bell) = short_path(mode, &ShmConfig::default()).await;
    drop(link);
    let end = tokio::time::timeout(Duration::from_secs(5), bell)
        .await
        .expect("the bell reports")
        .unwrap();
    assert_eq!(end, ShmPortEnd::PeerGone);
    let mut handle = engine.clone();
    let counters = tokio::task::spawn_blocking(move || handle.detach(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(counters.rx_msgs, 0);
    drop(engine.stop());
}

/// How a daemon attaches a process's port at its `attach` request, before
/// its data connection arrives: a deferred port, its queues handed over
/// once the shared-memory handshake is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_attached_before_the_application_connects_carries_its_traffic_once_it_does() {
    let (deferred, handoff) = uniplane_dataplane::deferred_port();
    let mut engine = Engine::new(EngineConfig::default());
    let a = engine
        .attach_io(PortSpec::app("app"), Box::new(deferred))
        .unwrap();
    let device = PortSpec {
        kind: PortKind::Device,
        name: "echo".into(),
        mtu: Message::MAX_PAYLOAD,
    };
    let e = engine
        .attach_io(device, devices::inline_port(DeviceKind::Echo, 0, None))
        .unwrap();
    for p in [a, e] {
        engine.add_acl_rule(p, AclRule::ALLOW_ALL).unwrap();
    }
    engine.add_route(a, Route::exact(echo(), e)).unwrap();
    engine.add_route(e, Route::exact(app(), a)).unwrap();
    let engine = engine.spawn(RunMode::SpinThenPark { spins: 100 });
    tokio::time::sleep(Duration::from_millis(20)).await;

    // The data connection arrives: the handshake, then the handoff.
    let (mut link, port, bell) = ShmPort::pair(&ShmConfig::default(), &ShmConfig::default())
        .await
        .unwrap();
    handoff.install(Box::new(port));
    let _bell = tokio::spawn(bell);
    link.send(ping(7, 100)).await.unwrap();
    let back = tokio::time::timeout(Duration::from_secs(5), link.next())
        .await
        .expect("the parked engine was woken by the handoff and the doorbell")
        .unwrap()
        .unwrap();
    assert_eq!((back.header().seqnum, back.header().src), (7, echo()));
    drop(engine.stop());
}
