//! The RTL kernels on ports of the RTL plane (`Model::N8Kernels`): SEND
//! messages from host port 0 cross the crossbar to the echo kernel (port
//! 2) and the sum32 kernel (port 3), and their answers cross it back to
//! port 0. Every answer must be byte for byte what the Rust kernels answer
//! (services/kernel `Echo` and `Sum32`, as the kernel device answers
//! them), in order per kernel, with port 0's output always ready.
//!
//! `UPSIM_KERNEL_MESSAGES` sets how many random messages the long test
//! sends (default 10 000); each test prints simulated cycles per message.

use bytes::Bytes;
use uniplane_dataplane::wire::{Header, Params, PortParams, Request, Status};
use uniplane_dataplane::{Message, SplitMix64, Uid};
use uniplane_hw_sim::{Model, RtlDevice, Stream, Traffic};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{ForwardingPlane, PortId};

const HOST: usize = 0;
const ECHO: usize = Model::ECHO_PORT;
const SUM32: usize = Model::SUM32_PORT;

/// The UID of the device on port `p`.
fn uid(p: usize) -> Uid {
    Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), p as u16 + 1)
}

/// The plane with its kernels, programmed so that port 0 reaches both
/// kernels and both kernels answer to port 0.
fn device() -> RtlDevice {
    let mut dev = RtlDevice::new(Model::N8Kernels);
    for p in [HOST, ECHO, SUM32] {
        dev.add_acl_rule(p as PortId, AclRule::ALLOW_ALL).unwrap();
    }
    for k in [ECHO, SUM32] {
        dev.add_route(HOST as PortId, Route::exact(uid(k), k as PortId))
            .unwrap();
        dev.add_route(k as PortId, Route::exact(uid(HOST), HOST as PortId))
            .unwrap();
    }
    dev
}

/// The reply header to `h`: back to its source, ports swapped, the same
/// sequence number and flags (as the kernel device builds it).
fn reply_header(h: &Header) -> Header {
    let (src_port, dst_port) = h.request.ports().expect("a SEND names ports");
    let request = Request::new(
        h.request.kind(),
        Params::Port(PortParams {
            flag: 0,
            src_port: dst_port,
            dst_port: src_port,
        }),
    )
    .unwrap();
    let mut reply = Header::new(h.dst, h.src, request);
    reply.seqnum = h.seqnum;
    reply.flags = h.flags;
    reply
}

/// What the echo kernel answers to `m`.
fn echo_answer(m: &Message) -> Message {
    Message::new(reply_header(m.header()), m.payload().clone()).unwrap()
}

/// What the sum32 kernel answers to `m`: the wrapping sum of its
/// little-endian 32-bit words, or BAD_REQUEST for a partial word.
fn sum32_answer(m: &Message) -> Message {
    let payload = m.payload();
    if !payload.len().is_multiple_of(4) {
        return m.error_answer(Status::BadRequest).unwrap();
    }
    let sum = payload
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .fold(0u32, u32::wrapping_add);
    Message::new(
        reply_header(m.header()),
        Bytes::copy_from_slice(&sum.to_le_bytes()),
    )
    .unwrap()
}

/// A payload length in 0..=2048: one in four a multiple of 4, one in
/// eight a multiple of 32, the rest anything (so most are partial words).
fn payload_len(rng: &mut SplitMix64) -> usize {
    let len = rng.below(2049) as usize;
    match rng.below(8) {
        0 => len / 32 * 32,
        1 | 2 => len / 4 * 4,
        _ => len,
    }
}

fn send_to(rng: &mut SplitMix64, kernel: usize, len: usize, seq: u32) -> Message {
    let payload: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
    let mut m =
        Message::send(uid(HOST).port(7), uid(kernel).port(9), Bytes::from(payload)).unwrap();
    m.set_seqnum(seq);
    m
}

/// Sends `msgs` (kernel, message) from port 0, runs until every answer is
/// back, checks them byte for byte and in order per kernel, and returns
/// the simulated cycles it took.
fn run_and_check(dev: &mut RtlDevice, msgs: &[(usize, Message)]) -> u64 {
    let mut expected: [Vec<Message>; 2] = [Vec::new(), Vec::new()];
    for (kernel, m) in msgs {
        if *kernel == ECHO {
            expected[0].push(echo_answer(m));
        } else {
            expected[1].push(sum32_answer(m));
        }
    }
    let t0 = dev.cycle();
    for (_, m) in msgs {
        dev.send(Stream::Port, HOST, m);
    }
    let want = msgs.len();
    let budget = 200
        + 8 * msgs
            .iter()
            .map(|(_, m)| m.encoded_len() as u64)
            .sum::<u64>();
    let done = dev.run_until(budget, |d| d.delivered(Stream::Port, HOST).len() >= want);
    let cycles = dev.cycle() - t0;
    let got = dev.delivered(Stream::Port, HOST);
    assert!(
        done,
        "{} of {want} answers after {cycles} cycles",
        got.len()
    );
    assert_eq!(dev.malformed(Stream::Port, HOST), 0);
    for (i, (kernel, from)) in [(ECHO, "echo"), (SUM32, "sum32")].into_iter().enumerate() {
        let answers: Vec<&Message> = got
            .iter()
            .map(|d| &d.message)
            .filter(|m| m.header().src == uid(kernel))
            .collect();
        assert_eq!(answers.len(), expected[i].len(), "{from}: answer count");
        for (k, (a, e)) in answers.iter().zip(&expected[i]).enumerate() {
            assert_eq!(*a, e, "{from}: answer {k} differs");
        }
    }
    // Nothing else: no answer from elsewhere, nothing more after a while.
    dev.run(200);
    assert_eq!(dev.delivered(Stream::Port, HOST).len(), want);
    for p in [1, ECHO, SUM32] {
        assert!(dev.delivered(Stream::Port, p).is_empty());
    }
    cycles
}

fn messages(
    seed: u64,
    n: usize,
    kernels: &[usize],
    len: impl Fn(&mut SplitMix64) -> usize,
) -> Vec<(usize, Message)> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|k| {
            let kernel = kernels[rng.below(kernels.len() as u64) as usize];
            let l = len(&mut rng);
            (kernel, send_to(&mut rng, kernel, l, k as u32))
        })
        .collect()
}

fn report(what: &str, msgs: &[(usize, Message)], cycles: u64) {
    let bytes: usize = msgs.iter().map(|(_, m)| m.payload().len()).sum();
    eprintln!(
        "{what}: {} messages, {bytes} payload bytes, {cycles} cycles, {:.2} cycles per message",
        msgs.len(),
        cycles as f64 / msgs.len() as f64
    );
}

#[test]
fn echo_and_sum32_answer_random_sends_byte_exact_through_the_crossbar() {
    let n = std::env::var("UPSIM_KERNEL_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut dev = device();
    let msgs = messages(18, n, &[ECHO, SUM32], payload_len);
    let cycles = run_and_check(&mut dev, &msgs);
    report("echo and sum32, mixed", &msgs, cycles);
}

#[test]
fn answers_stay_byte_exact_with_idle_input_and_back_pressure_on_port_0() {
    let mut dev = device();
    dev.set_traffic(Traffic {
        input_idle: 0.2,
        output_stall: 0.5,
        seed: 18,
    });
    let msgs = messages(7, 2_000, &[ECHO, SUM32], payload_len);
    let cycles = run_and_check(&mut dev, &msgs);
    report(
        "echo and sum32, 20 % idle in, 50 % stalled out",
        &msgs,
        cycles,
    );
}

#[test]
fn echo_answers_every_payload_length_from_0_to_96() {
    let mut dev = device();
    let msgs: Vec<_> = (0..=96)
        .map(|l| {
            let mut rng = SplitMix64::new(l as u64);
            (ECHO, send_to(&mut rng, ECHO, l, l as u32))
        })
        .collect();
    let cycles = run_and_check(&mut dev, &msgs);
    report("echo, 0..=96 bytes", &msgs, cycles);
}

#[test]
fn sum32_answers_every_payload_length_from_0_to_96() {
    let mut dev = device();
    let msgs: Vec<_> = (0..=96)
        .map(|l| {
            let mut rng = SplitMix64::new(l as u64);
            (SUM32, send_to(&mut rng, SUM32, l, l as u32))
        })
        .collect();
    let cycles = run_and_check(&mut dev, &msgs);
    report("sum32, 0..=96 bytes", &msgs, cycles);
}

#[test]
fn the_host_side_of_a_kernel_port_takes_nothing() {
    let mut dev = device();
    let mut rng = SplitMix64::new(3);
    let m = send_to(&mut rng, HOST, 40, 1);
    dev.send(Stream::Port, ECHO, &m);
    dev.send(Stream::Port, SUM32, &m);
    dev.run(200);
    assert_eq!(dev.beats_in(Stream::Port, ECHO), 0);
    assert_eq!(dev.beats_in(Stream::Port, SUM32), 0);
    assert_eq!(dev.delivered_total(), 0);
}

#[test]
fn cycles_per_message_by_payload_size() {
    for kernel in [ECHO, SUM32] {
        for len in [0usize, 64, 256, 1024, 2048] {
            let mut dev = device();
            let msgs = messages(len as u64, 200, &[kernel], |_| len);
            let cycles = run_and_check(&mut dev, &msgs);
            let name = if kernel == ECHO { "echo" } else { "sum32" };
            report(&format!("{name}, {len} bytes"), &msgs, cycles);
        }
    }
}
