//! Kernel devices behind one daemon in this process: an application
//! reaches a kernel by its UID and gets its answers byte-exact, small
//! messages over the PIO mailbox and large ones over FPGA Connect; a
//! kernel that stalls, dies or answers garbage is contained.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use uniplane_dataplane::{Endpoint, LinkError};
use uniplane_services::client::{embedded, Client, Session};
use uniplane_services::config::Config;
use uniplane_services::control::Request;

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

    /// A size from 4 B to 64 KiB, spread evenly over the powers of two.
    fn size(&mut self) -> usize {
        let bits = 2 + self.next() % 15;
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

/// An application attached to the daemon whose sockets are in `dir`.
async fn app(dir: &Path) -> Session {
    Client::connect(dir)
        .await
        .unwrap()
        .attach("app")
        .await
        .unwrap()
}

/// The device `name` in `uniplane status`.
async fn device(client: &Client, name: &str) -> Value {
    let status = client.request(&Request::Status).await.unwrap();
    status["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .cloned()
        .unwrap()
}

/// Waits (bounded) until `device`'s status satisfies `ready`.
async fn status_until(client: &Client, name: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let d = device(client, name).await;
        if ready(&d) {
            return d;
        }
        assert!(Instant::now() < deadline, "status never came to be: {d}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    let session = app(&dir).await;
    let mut echo = session.connect(at(2)).await.unwrap();
    let mut sum = session.connect(at(3)).await.unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut pio = [0u64; 2];
    let mut connect = [0u64; 2];
    for i in 0..10_000u32 {
        let to_sum = !i.is_multiple_of(2);
        let mut len = rng.size();
        if to_sum {
            len -= len % 4;
        }
        let payload = rng.bytes(len);
        let small = usize::from(to_sum);
        if len <= 256 {
            pio[small] += 1;
        } else {
            connect[small] += 1;
        }
        let conn = if to_sum { &mut sum } else { &mut echo };
        conn.send_bytes(Bytes::from(payload.clone())).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), conn.recv())
            .await
            .unwrap_or_else(|_| panic!("message {i} of {len} bytes: no answer"))
            .unwrap()
            .unwrap();
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
        assert_eq!(d["messages"]["pio"], pio[k], "{d}");
        assert_eq!(d["messages"]["connect"], connect[k], "{d}");
        assert_eq!(d["garbage"], 0);
    }
    assert!(pio.iter().all(|&n| n > 500) && connect.iter().all(|&n| n > 500));
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
