//! Kernel devices behind one daemon in this process: an application
//! reaches a kernel by its UID and gets its answers byte-exact, small
//! messages over the PIO mailbox and large ones over FPGA Connect; a
//! kernel that stalls, dies or answers garbage is contained.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::{Endpoint, LinkError};
use uniplane_services::client::{embedded, ClientError, Session};
use uniplane_services::config::Config;
#[cfg(feature = "rtl")]
use uniplane_services::control::Request;
use uniplane_services::transfer;

mod common;
use common::{app, device, status_until};

const SERVER: &str = "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n";

/// A kernel device `device` computing `function`, with `extra` settings.
fn kernel(device: u16, function: &str, extra: &str) -> String {
    format!(
        "\n[[devices]]\nname = \"k{device}\"\nkind = \"kernel\"\ndevice = {device}\n\
         backend = \"emulated\"\nfunction = \"{function}\"\n{extra}"
    )
}

fn config(devices: &[String]) -> Config {
    Config::parse(&format!("{SERVER}{}", devices.concat()), "test").unwrap()
}

fn runtime(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-kernel-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn at(device: u16) -> Endpoint {
    format!("127.0.0.1:{device}/7").parse().unwrap()
}

/// A xorshift stream: the messages' sizes and bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A size from 4 B to `2^(max_bits + 1) - 1` B (at most 64 KiB - 1),
    /// spread evenly over the powers of two.
    fn size(&mut self, max_bits: u32) -> usize {
        let bits = 2 + self.next() % u64::from(max_bits - 1);
        let size = (1usize << bits) + (self.next() as usize % (1 << bits));
        size.clamp(4, 65_535)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn sum32(payload: &[u8]) -> u32 {
    payload
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .fold(0, u32::wrapping_add)
}

/// What [`byte_exact`] sent each kernel (echo, sum32): messages by the
/// PIO mailbox's size rule (at most 256 bytes) and above it, and the sums
/// refused for partial words.
#[derive(Debug, Default)]
struct Sent {
    pio: [u64; 2],
    connect: [u64; 2],
    refused: u64,
}

/// The host test both kernel backends pass: an application attached to
/// the daemon in `dir` connects to the echo kernel (device 2) and the
/// sum32 kernel (device 3), sends `count` random messages alternately,
/// one after the other, of 4 bytes to `2^(max_bits + 1) - 1` (powers of
/// two spread evenly), and checks every answer byte for byte: the echo,
/// the sum of whole words against [`sum32`], and for one sum in four a
/// payload of partial words, refused with BadRequest while the
/// connection goes on. The connections are dropped at the end (each
/// closes in band); the session lives as long as the caller keeps it.
async fn byte_exact(session: &Session, count: u32, max_bits: u32) -> Sent {
    let mut echo = session.connect(at(2)).await.unwrap();
    let mut sum = session.connect(at(3)).await.unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut sent = Sent::default();
    for i in 0..count {
        let to_sum = !i.is_multiple_of(2);
        let mut len = rng.size(max_bits);
        let partial = to_sum && i % 8 == 1;
        if to_sum {
            len -= len % 4;
            if partial {
                len += 1 + i as usize / 8 % 3;
            }
        }
        let payload = rng.bytes(len);
        let k = usize::from(to_sum);
        if len <= 256 {
            sent.pio[k] += 1;
        } else {
            sent.connect[k] += 1;
        }
        let conn = if to_sum { &mut sum } else { &mut echo };
        conn.send_bytes(Bytes::from(payload.clone())).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), conn.recv())
            .await
            .unwrap_or_else(|_| panic!("message {i} of {len} bytes: no answer"))
            .unwrap();
        if partial {
            sent.refused += 1;
            match answer {
                Err(LinkError::PeerFailed(status)) => assert_eq!(status, "BadRequest"),
                other => panic!("message {i}: {len} bytes summed: {other:?}"),
            }
            continue;
        }
        let answer = answer.unwrap_or_else(|e| panic!("message {i} of {len} bytes: {e:?}"));
        if to_sum {
            assert_eq!(
                answer.payload().as_ref(),
                sum32(&payload).to_le_bytes(),
                "message {i}: sum of {len} bytes"
            );
        } else {
            assert!(
                answer.payload().as_ref() == payload.as_slice(),
                "message {i}: {len} bytes echoed differently"
            );
        }
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_random_messages_are_answered_byte_exact_small_by_pio_large_by_connect() {
    let dir = runtime("exact");
    let (_daemon, client) = embedded(
        config(&[kernel(2, "echo", ""), kernel(3, "sum32", "")]),
        &dir,
    )
    .await
    .unwrap();
    let sent = byte_exact(&app(&dir).await, 10_000, 16).await;
    for (name, k) in [("k2", 0), ("k3", 1)] {
        let d = device(&client, name).await;
        assert_eq!(
            (
                d["kind"].as_str(),
                d["backend"].as_str(),
                d["state"].as_str()
            ),
            (Some("kernel"), Some("emulated"), Some("up"))
        );
        assert_eq!(d["messages"]["pio"], sent.pio[k], "{d}");
        assert_eq!(d["messages"]["connect"], sent.connect[k], "{d}");
        assert_eq!(d["garbage"], 0);
    }
    assert_eq!(device(&client, "k3").await["kernel_errors"], sent.refused);
    assert!(sent.pio.iter().all(|&n| n > 500) && sent.connect.iter().all(|&n| n > 500));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same host test against the Verilog kernels on the RTL plane
/// (`backend = "rtl"`, `--plane rtl`): echo on RTL port 6, sum32 on port
/// 7, the same sizes (4 B to 64 KiB - 1), 2,000 messages (about 3 s);
/// the RTL counts what crossed each kernel's port.
#[cfg(feature = "rtl")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rtl_kernels_answer_the_same_messages_byte_exact() {
    let dir = runtime("rtl-exact");
    let rtl = |device: u16, function: &str| {
        format!(
            "\n[[devices]]\nname = \"k{device}\"\nkind = \"kernel\"\ndevice = {device}\n\
             backend = \"rtl\"\nfunction = \"{function}\"\n"
        )
    };
    let text = format!(
        "plane = \"rtl\"\n{SERVER}{}{}",
        rtl(2, "echo"),
        rtl(3, "sum32")
    );
    let (daemon, client) = embedded(Config::parse(&text, "test").unwrap(), &dir)
        .await
        .unwrap();
    let status = client.request(&Request::Status).await.unwrap();
    assert_eq!(status["plane"], "rtl");
    let count = 2_000;
    // The session stays while the counters are read: its end would send
    // each kernel the NOTIFY of its connections' end, beside the CLOSE.
    let session = app(&dir).await;
    let sent = byte_exact(&session, count, 16).await;
    for (name, number, function, port, k) in [("k2", 2, "echo", 6, 0), ("k3", 3, "sum32", 7, 1)] {
        let d = device(&client, name).await;
        assert_eq!(
            (
                d["kind"].as_str(),
                d["backend"].as_str(),
                d["function"].as_str(),
                d["port"].as_u64(),
            ),
            (Some("kernel"), Some("rtl"), Some(function), Some(port)),
            "{d}"
        );
        let t = client
            .request(&Request::Tables { device: number })
            .await
            .unwrap();
        assert_eq!(t["port"], port, "{t}");
        let messages = sent.pio[k] + sent.connect[k];
        assert_eq!(messages, u64::from(count / 2));
        // What the crossbar delivered to the kernel — the messages, and
        // the closing connection's CLOSE once it has crossed (the kernel
        // drops it) — and the kernel's answers.
        let delivered = t["counters"]["tx_msgs"].as_u64().unwrap();
        assert!(
            delivered == messages || delivered == messages + 1,
            "{messages} messages (and a CLOSE) delivered: {t}"
        );
        assert_eq!(t["counters"]["rx_msgs"], messages, "{t}");
    }
    assert!(sent.refused > 100 && sent.connect.iter().all(|&n| n > 300));
    drop(session);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_messages_on_both_paths_come_back_in_the_order_sent() {
    let dir = runtime("order");
    let (_daemon, client) = embedded(config(&[kernel(2, "echo", "tokens = 2\n")]), &dir)
        .await
        .unwrap();
    let session = app(&dir).await;
    let mut conn = session.connect(at(2)).await.unwrap();
    let mut rng = Rng(42);
    let sent: Vec<Vec<u8>> = (0..300)
        .map(|_| {
            let len = if rng.next().is_multiple_of(2) {
                16
            } else {
                9000
            };
            rng.bytes(len)
        })
        .collect();
    for m in &sent {
        conn.send_bytes(Bytes::from(m.clone())).await.unwrap();
    }
    for (i, want) in sent.iter().enumerate() {
        let got = tokio::time::timeout(Duration::from_secs(10), conn.recv())
            .await
            .unwrap_or_else(|_| panic!("answer {i} never came"))
            .unwrap()
            .unwrap_or_else(|e| panic!("answer {i} of {} bytes: {e:?}", want.len()));
        assert!(
            got.payload().as_ref() == want.as_slice(),
            "answer {i} out of order"
        );
    }
    let d = device(&client, "k2").await;
    assert!(
        d["messages"]["pio"].as_u64() > Some(50) && d["messages"]["connect"].as_u64() > Some(50)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sum32_refuses_a_payload_of_partial_words_and_the_connection_goes_on() {
    let dir = runtime("misaligned");
    let (_daemon, client) = embedded(config(&[kernel(2, "sum32", "")]), &dir)
        .await
        .unwrap();
    let session = app(&dir).await;
    let mut conn = session.connect(at(2)).await.unwrap();
    conn.send_bytes(Bytes::from_static(&[1, 2, 3, 4, 5]))
        .await
        .unwrap();
    match conn.recv().await {
        Some(Err(LinkError::PeerFailed(status))) => assert_eq!(status, "BadRequest"),
        other => panic!("not an error answer: {other:?}"),
    }
    conn.send_bytes(Bytes::from_static(&[1, 0, 0, 0, 2, 0, 0, 0]))
        .await
        .unwrap();
    let answer = conn.recv().await.unwrap().unwrap();
    assert_eq!(answer.payload().as_ref(), 3u32.to_le_bytes());
    assert_eq!(device(&client, "k2").await["kernel_errors"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads `conn` until the daemon closes it (bounded): whether an error
/// answer came first.
async fn until_closed(conn: &mut uniplane_client::Connection) -> bool {
    let mut errors = false;
    let deadline = Duration::from_secs(20);
    loop {
        match tokio::time::timeout(deadline, conn.recv()).await {
            Err(_) => panic!("the connection was never closed"),
            Ok(None) => return errors,
            Ok(Some(Err(LinkError::PeerFailed(_)))) => errors = true,
            Ok(Some(other)) => panic!("a failed kernel answered: {other:?}"),
        }
    }
}

/// The echo kernel `device` still answers.
async fn still_answers(session: &uniplane_client::Session, device: u16) {
    let mut conn = session.connect(at(device)).await.unwrap();
    conn.send_bytes(Bytes::from_static(b"still here"))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), conn.recv())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(answer.payload().as_ref(), b"still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_that_stops_consuming_is_marked_down_and_its_connection_closed() {
    let dir = runtime("stall");
    let stall = kernel(2, "stall", "tokens = 2\nstall_timeout_ms = 200\n");
    let (_daemon, client) = embedded(config(&[stall, kernel(3, "echo", "")]), &dir)
        .await
        .unwrap();
    let session = app(&dir).await;
    let mut conn = session.connect(at(2)).await.unwrap();
    // More than its tokens and mailbox slots: the rest waits upstream.
    for len in [8usize, 8, 8, 1000, 1000, 1000, 8] {
        conn.send_bytes(Bytes::from(vec![7; len])).await.unwrap();
    }
    assert!(until_closed(&mut conn).await, "waiting requests are failed");
    let d = status_until(&client, "k2", |d| d["state"] == "down").await;
    assert!(
        d["down_reason"]
            .as_str()
            .unwrap()
            .contains("answered nothing"),
        "{d}"
    );
    assert!(d["failed_requests"].as_u64().unwrap() >= 1, "{d}");
    still_answers(&session, 3).await;
    assert_eq!(device(&client, "k3").await["state"], "up");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_thread_that_dies_is_marked_down_and_its_connection_closed() {
    let dir = runtime("panic");
    let (_daemon, client) = embedded(
        config(&[kernel(2, "panic", ""), kernel(3, "echo", "")]),
        &dir,
    )
    .await
    .unwrap();
    let session = app(&dir).await;
    let mut conn = session.connect(at(2)).await.unwrap();
    conn.send_bytes(Bytes::from_static(b"boom")).await.unwrap();
    assert!(until_closed(&mut conn).await, "the request is failed");
    let d = status_until(&client, "k2", |d| d["state"] == "down").await;
    assert!(d["down_reason"].as_str().unwrap().contains("died"), "{d}");
    still_answers(&session, 3).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_a_kernel_is_counted_and_dropped() {
    let dir = runtime("garbage");
    let garbage = kernel(2, "garbage", "stall_timeout_ms = 60000\n");
    let (_daemon, client) = embedded(config(&[garbage, kernel(3, "echo", "")]), &dir)
        .await
        .unwrap();
    let session = app(&dir).await;
    let mut conn = session.connect(at(2)).await.unwrap();
    conn.send_bytes(Bytes::from_static(b"x")).await.unwrap();
    let d = status_until(&client, "k2", |d| d["garbage"].as_u64() >= Some(2)).await;
    assert_eq!(d["state"], "up", "{d}");
    assert_eq!(d["answers"]["pio"], 0, "nothing was taken for an answer");
    assert!(
        tokio::time::timeout(Duration::ZERO, conn.recv())
            .await
            .is_err(),
        "no answer reached the caller"
    );
    still_answers(&session, 3).await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn cli(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uniplane"))
        .args(args)
        .env("UNIPLANE_RUNTIME_DIR", dir)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_calls_a_kernel_with_a_file_and_writes_the_answer() {
    let dir = runtime("cli");
    let (_daemon, _client) = embedded(
        config(&[kernel(2, "echo", ""), kernel(3, "sum32", "")]),
        &dir,
    )
    .await
    .unwrap();
    let input = dir.join("in.bin");
    let output = dir.join("out.bin");
    let data = Rng(7).bytes(40_000);
    std::fs::write(&input, &data).unwrap();
    let (dir2, inp, outp) = (dir.clone(), input.clone(), output.clone());
    let (echoed, summed) = tokio::task::spawn_blocking(move || {
        let (inp, outp) = (inp.to_str().unwrap(), outp.to_str().unwrap());
        let e = cli(
            &dir2,
            &[
                "kernel",
                "call",
                "127.0.0.1:2",
                "--input",
                inp,
                "--out",
                outp,
                "--json",
            ],
        );
        let s = cli(
            &dir2,
            &["kernel", "call", "127.0.0.1:3", "--input", inp, "--json"],
        );
        (e, s)
    })
    .await
    .unwrap();
    for out in [&echoed, &summed] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(
        std::fs::read(&output).unwrap() == data,
        "the echo came back changed"
    );
    let e: Value = serde_json::from_slice(&echoed.stdout).unwrap();
    assert_eq!(e["len"], 40_000);
    let s: Value = serde_json::from_slice(&summed.stdout).unwrap();
    assert_eq!(s["hex"], hex(&sum32(&data).to_le_bytes()));
    let _ = std::fs::remove_dir_all(&dir);
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Where `device`'s memory is, at `offset`.
fn memory_at(device: u16, offset: u64) -> uniplane_dataplane::MemoryAddress {
    format!("127.0.0.1:{device}@{offset}").parse().unwrap()
}

/// A kernel summing ranges of its `memory` bytes of device memory, DMA
/// modes by size: push below 1 KiB, pull below 8 KiB, staged below
/// 32 KiB, staged-pipelined from there.
fn memory_kernel(device: u16, memory: usize) -> String {
    kernel(
        device,
        "sum32-memory",
        &format!(
            "memory = {memory}\ndma_pull_from = 1024\ndma_staged_from = 8192\n\
             dma_pipelined_from = 32768\n"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_one_sided_writes_and_reads_of_a_kernels_memory_are_byte_exact_in_every_dma_mode() {
    const MEMORY: usize = 8 << 20;
    let dir = runtime("dma");
    let (_daemon, client) = embedded(config(&[memory_kernel(2, MEMORY)]), &dir)
        .await
        .unwrap();
    let session = app(&dir).await;
    let mut conn = session.connect(at(2)).await.unwrap();
    let mut rng = Rng(0x5eed_d11a);
    let mut mirror = vec![0u8; MEMORY];
    let (mut writes, mut sums) = (0u64, 0u64);
    for i in 0..40 {
        // 4 B to 4 MiB, spread over the powers of two; every tenth one
        // several MiB.
        let bits = 2 + rng.next() % 20;
        let mut len = (1usize << bits) + rng.next() as usize % (1 << bits);
        if i % 10 == 9 {
            len = (3 << 20) + rng.next() as usize % (1 << 20);
        }
        let len = len.min(MEMORY);
        let addr = rng.next() as usize % (MEMORY - len + 1);
        let data = rng.bytes(len);
        // Small pieces for small transfers only: the test stays short.
        let mtu = if len > 256 << 10 {
            65_535
        } else {
            [65_535, 4096, 700][i % 3]
        };
        let messages = transfer::write(
            &session,
            memory_at(2, addr as u64),
            Bytes::from(data.clone()),
            mtu,
        )
        .await
        .unwrap_or_else(|e| panic!("write {i}: {len} bytes at {addr}: {e}"));
        writes += messages as u64;
        mirror[addr..addr + len].copy_from_slice(&data);
        // Read back a range around it: what the write left and what it
        // did not touch.
        let from = addr.saturating_sub(rng.next() as usize % 5000);
        let to = (addr + len + rng.next() as usize % 5000).min(MEMORY);
        let back = transfer::read(&session, memory_at(2, from as u64), (to - from) as u64, mtu)
            .await
            .unwrap_or_else(|e| panic!("read {i}: {} bytes at {from}: {e}", to - from));
        assert!(
            back == mirror[from..to],
            "read {i}: {} bytes at {from} differ",
            to - from
        );
        // The kernel computes over what the host wrote, messages between
        // the one-sided traffic.
        let words = (len / 4).min(1 << 16) as u64 * 4;
        let range = uniplane_kernel::SumMemory32::request(addr as u64, words);
        conn.send_bytes(Bytes::copy_from_slice(&range))
            .await
            .unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), conn.recv())
            .await
            .unwrap_or_else(|_| panic!("sum {i}: no answer"))
            .unwrap()
            .unwrap_or_else(|e| panic!("sum {i}: {e:?}"));
        assert_eq!(
            answer.payload().as_ref(),
            sum32(&mirror[addr..addr + words as usize]).to_le_bytes(),
            "sum {i} of {words} bytes at {addr}"
        );
        sums += 1;
    }
    let d = device(&client, "k2").await;
    assert_eq!(d["state"], "up", "{d}");
    assert_eq!(d["memory"], MEMORY, "{d}");
    assert_eq!(d["dma"]["writes"], writes, "{d}");
    assert_eq!(d["dma"]["out_of_range"], 0, "{d}");
    for mode in ["push", "pull", "staged", "staged-pipelined"] {
        assert!(
            d["dma"]["modes"][mode].as_u64() > Some(0),
            "{mode} never used: {d}"
        );
    }
    assert_eq!(d["messages"]["pio"], sums, "the sums went by PIO: {d}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_sided_write_past_a_kernels_memory_is_refused_and_writes_nothing() {
    let dir = runtime("dma-past");
    let (_daemon, client) = embedded(config(&[memory_kernel(2, 1 << 20)]), &dir)
        .await
        .unwrap();
    let session = app(&dir).await;
    let end = (1u64 << 20) - 10;
    let past = transfer::write(
        &session,
        memory_at(2, end),
        Bytes::from(vec![0xab; 64]),
        65_535,
    );
    assert!(matches!(
        past.await,
        Err(ClientError::Status(Status::OutOfRange))
    ));
    let back = transfer::read(&session, memory_at(2, end - 54), 64, 65_535)
        .await
        .unwrap();
    assert!(back.iter().all(|&b| b == 0), "nothing was written");
    let far = transfer::read(&session, memory_at(2, 1 << 20), 4, 65_535).await;
    assert!(matches!(far, Err(ClientError::Status(Status::OutOfRange))));
    let d = device(&client, "k2").await;
    assert_eq!(d["dma"]["out_of_range"], 2, "{d}");
    assert_eq!(d["state"], "up", "{d}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_writes_a_file_into_a_kernels_memory_and_reads_it_back_by_messages() {
    let dir = runtime("dma-cli");
    let (_daemon, client) = embedded(config(&[memory_kernel(2, 1 << 20)]), &dir)
        .await
        .unwrap();
    let input = dir.join("in.bin");
    let output = dir.join("out.bin");
    let data = Rng(11).bytes(200_000);
    std::fs::write(&input, &data).unwrap();
    let (dir2, inp, outp) = (dir.clone(), input.clone(), output.clone());
    let (written, read) = tokio::task::spawn_blocking(move || {
        let (inp, outp) = (inp.to_str().unwrap(), outp.to_str().unwrap());
        // As the CLI goes by default: it asks to map the memory, the
        // daemon refuses (a kernel's memory is not lent), messages carry it.
        let w = cli(
            &dir2,
            &["write", "127.0.0.1:2@3000", "--file", inp, "--json"],
        );
        let r = cli(
            &dir2,
            &[
                "read",
                "127.0.0.1:2@3000",
                "--len",
                "200000",
                "--out",
                outp,
                "--json",
            ],
        );
        (w, r)
    })
    .await
    .unwrap();
    for out in [&written, &read] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let w: Value = serde_json::from_slice(&written.stdout).unwrap();
    let r: Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(
        (w["written"].as_u64(), w["path"].as_str()),
        (Some(200_000), Some("messages"))
    );
    assert_eq!(
        (r["len"].as_u64(), r["path"].as_str()),
        (Some(200_000), Some("messages"))
    );
    assert!(
        std::fs::read(&output).unwrap() == data,
        "the file came back changed"
    );
    let d = device(&client, "k2").await;
    assert!(d["dma"]["writes"].as_u64() >= Some(4), "{d}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernels_messages_go_on_while_one_sided_transfers_run_beside_them() {
    const MEMORY: usize = 4 << 20;
    let dir = runtime("dma-beside");
    let (_daemon, client) = embedded(config(&[memory_kernel(2, MEMORY)]), &dir)
        .await
        .unwrap();
    let session = app(&dir).await;
    // A range the kernel sums, written first and left alone.
    let fixed = Rng(3).bytes(64 << 10);
    transfer::write(
        &session,
        memory_at(2, 0),
        Bytes::from(fixed.clone()),
        65_535,
    )
    .await
    .unwrap();
    let want = sum32(&fixed).to_le_bytes();
    let mut conn = session.connect(at(2)).await.unwrap();
    let sums = async {
        for i in 0..300 {
            let range = uniplane_kernel::SumMemory32::request(0, fixed.len() as u64);
            conn.send_bytes(Bytes::copy_from_slice(&range))
                .await
                .unwrap();
            let answer = tokio::time::timeout(Duration::from_secs(10), conn.recv())
                .await
                .unwrap_or_else(|_| panic!("sum {i}: no answer"))
                .unwrap()
                .unwrap();
            assert_eq!(answer.payload().as_ref(), want, "sum {i}");
        }
    };
    // Meanwhile, transfers into the rest of the memory, checked.
    let transfers = async {
        let mut rng = Rng(5);
        for i in 0..20u64 {
            let len = 100_000 + rng.next() as usize % 900_000;
            let addr = (1 << 20) + rng.next() % (MEMORY as u64 - (1 << 20) - len as u64);
            let data = rng.bytes(len);
            transfer::write(
                &session,
                memory_at(2, addr),
                Bytes::from(data.clone()),
                65_535,
            )
            .await
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
            let back = transfer::read(&session, memory_at(2, addr), len as u64, 65_535)
                .await
                .unwrap();
            assert!(back == data, "transfer {i} read back differently");
        }
    };
    tokio::join!(sums, transfers);
    let d = device(&client, "k2").await;
    assert_eq!(d["state"], "up", "{d}");
    assert!(d["dma"]["reads"].as_u64() > Some(20), "{d}");
    let _ = std::fs::remove_dir_all(&dir);
}
