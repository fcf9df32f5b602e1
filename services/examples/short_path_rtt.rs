//! Round-trip time through the short data path, both sides busy-polling:
//! a client-side `ShmLink` (busy-poll) → `ShmPort` driven by the engine
//! thread (`RunMode::BusyPoll`) → the echo device inline in the engine
//! thread → back. Prints percentiles; not a timed assertion.
//!
//! ```text
//! cargo run --release -p uniplane-services --example short_path_rtt -- [ROUND_TRIPS] [SIZE] [await|spin|flood]
//! ```
//!
//! Each side spins on its own thread, so it wants two free cores; on a
//! shared machine the figures move with the load.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use uniplane_dataplane::{Message, Uid};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{Engine, EngineConfig, PortKind, PortSpec, RunMode};
use uniplane_services::config::DeviceKind;
use uniplane_services::devices;
use uniplane_shm::{ShmConfig, ShmPort};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    // `await` (default): the link busy-polls by yielding to its tokio
    // runtime, which checks its reactor (epoll_wait) at every turn;
    // `spin`: the application polls the link in a loop of its own.
    // `flood`: no round trips; the application keeps up to 4096 messages
    // in flight in its own loop and counts the echoes (throughput).
    let mode = args.next().unwrap_or_default();
    let spin_in_place = mode == "spin" || mode == "flood";
    let flood = mode == "flood";
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let busy = ShmConfig {
            busy_poll: true,
            ..ShmConfig::default()
        };
        let (mut link, port, bell) = ShmPort::pair(&ShmConfig::default(), &busy).await?;
        let app: Uid = "127.0.0.1:7".parse()?;
        let echo: Uid = "127.0.0.1:1".parse()?;
        let mut engine = Engine::new(EngineConfig::default());
        let a = engine.attach_io(PortSpec::app("app"), Box::new(port))?;
        let device = PortSpec {
            kind: PortKind::Device,
            name: "echo".into(),
            mtu: Message::MAX_PAYLOAD,
        };
        let e = engine.attach_io(device, devices::inline_port(DeviceKind::Echo, 0, None))?;
        for p in [a, e] {
            uniplane_overlay::ForwardingPlane::add_acl_rule(&mut engine, p, AclRule::ALLOW_ALL)?;
        }
        uniplane_overlay::ForwardingPlane::add_route(&mut engine, a, Route::exact(echo, e))?;
        uniplane_overlay::ForwardingPlane::add_route(&mut engine, e, Route::exact(app, a))?;
        let engine = engine.spawn(RunMode::BusyPoll);
        tokio::spawn(bell);
        let payload = Bytes::from(vec![0u8; size]);
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        if flood {
            let t0 = Instant::now();
            let (mut sent, mut got) = (0usize, 0usize);
            while got < rounds {
                while sent < rounds && sent - got < 4096 {
                    match Pin::new(&mut link).poll_ready(&mut cx) {
                        Poll::Ready(r) => r?,
                        Poll::Pending => break,
                    }
                    let mut m = Message::send(app.port(5), echo.port(80), payload.clone())?;
                    m.set_seqnum(sent as u32);
                    Pin::new(&mut link).start_send(m)?;
                    sent += 1;
                }
                let _ = Pin::new(&mut link).poll_flush(&mut cx)?;
                while let Poll::Ready(m) = Pin::new(&mut link).poll_next(&mut cx) {
                    let m = m.ok_or("the data path closed")??;
                    if m.header().seqnum != got as u32 {
                        return Err("answer out of order".into());
                    }
                    got += 1;
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            println!(
                "short path flood ({size} B, app's own loop, engine BusyPoll, inline echo): \
                 {rounds} messages each way in {secs:.3} s = {:.2} M msgs/s each way",
                rounds as f64 / secs / 1e6
            );
            drop(engine.stop());
            return Ok(());
        }
        let mut rtt = Vec::with_capacity(rounds);
        let warm = rounds / 10;
        for i in 0..rounds + warm {
            let mut m = Message::send(app.port(5), echo.port(80), payload.clone())?;
            m.set_seqnum(i as u32);
            let t0 = Instant::now();
            let back = if spin_in_place {
                // The application's own busy loop: poll the link with a
                // no-op waker and never yield to the runtime.
                let mut m = Some(m);
                loop {
                    match Pin::new(&mut link).poll_ready(&mut cx) {
                        Poll::Ready(r) => break r?,
                        Poll::Pending => std::hint::spin_loop(),
                    }
                }
                Pin::new(&mut link).start_send(m.take().ok_or("sent twice")?)?;
                let _ = Pin::new(&mut link).poll_flush(&mut cx)?;
                loop {
                    match Pin::new(&mut link).poll_next(&mut cx) {
                        Poll::Ready(m) => break m.ok_or("the data path closed")??,
                        Poll::Pending => std::hint::spin_loop(),
                    }
                }
            } else {
                link.send(m).await?;
                link.next().await.ok_or("the data path closed")??
            };
            let ns = t0.elapsed().as_nanos() as u64;
            if back.header().seqnum != i as u32 {
                return Err("answer out of order".into());
            }
            if i >= warm {
                rtt.push(ns);
            }
        }
        rtt.sort_unstable();
        let at = |q: f64| rtt[((rtt.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
        println!(
            "short path (ShmLink busy-poll ({}) → engine BusyPoll + ShmPort → inline echo), \
             {size} B, {rounds} round trips: p50 {:.2} µs, p90 {:.2} µs, p99 {:.2} µs, \
             p99.9 {:.2} µs, doorbells rung by the app {}",
            if spin_in_place {
                "own loop"
            } else {
                "tokio yield"
            },
            at(0.5),
            at(0.9),
            at(0.99),
            at(0.999),
            link.stats().doorbells
        );
        drop(engine.stop());
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
