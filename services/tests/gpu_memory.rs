//! Memory devices in GPU memory behind one daemon in this process
//! (`--features gpu`). The tests that need a CUDA GPU are ignored unless
//! asked for: where no GPU is present they report as not run, never as
//! passed; run with `--ignored` on a machine without the driver they fail
//! with the daemon's reason.
//!
//! ```text
//! cargo test --features gpu -p uniplane-services --test gpu_memory -- --ignored
//! ```

use std::path::PathBuf;

use bytes::Bytes;
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::{MemoryAddress, Message};
use uniplane_services::client::{embedded, Client, ClientError};
use uniplane_services::config::Config;
use uniplane_services::control::Request;
use uniplane_services::transfer;

const MEMORY: usize = 4 << 20;

/// Three GPU memory devices, one per way to copy: `auto` (direct from
/// 16 KiB) as device 2, `staged` as 3, `direct` as 4.
fn config(gpu: u32) -> Config {
    let mut text = String::from("[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n");
    for (device, transfer) in [(2, "auto"), (3, "staged"), (4, "direct")] {
        text.push_str(&format!(
            "\n[[devices]]\nname = \"gpu-{transfer}\"\nkind = \"memory\"\ndevice = {device}\n\
             memory = {MEMORY}\nbackend = \"gpu\"\ngpu = {gpu}\ntransfer = \"{transfer}\"\n"
        ));
        if transfer == "auto" {
            text.push_str("direct_from = 16384\n");
        }
    }
    Config::parse(&text, "test").unwrap()
}

fn runtime(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-gpu-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

async fn start(name: &str) -> (uniplane_services::Daemon, Client, PathBuf) {
    let dir = runtime(name);
    match embedded(config(0), &dir).await {
        Ok((daemon, client)) => (daemon, client, dir),
        Err(e) => panic!("the daemon with GPU memory devices did not start: {e}"),
    }
}

fn at(device: u16, offset: u64) -> MemoryAddress {
    format!("127.0.0.1:{device}@{offset}").parse().unwrap()
}

/// `len` pseudo-random bytes.
fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

async fn device_status(client: &Client, name: &str) -> serde_json::Value {
    let status = client.request(&Request::Status).await.unwrap();
    status["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no device {name} in {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU: cargo test --features gpu --test gpu_memory -- --ignored"]
async fn random_writes_of_64_bytes_to_1_mib_read_back_byte_exact_in_every_transfer_mode() {
    let (_daemon, client, dir) = start("exact").await;
    let session = Client::connect(&dir)
        .await
        .unwrap()
        .attach("app")
        .await
        .unwrap();
    let cases = [
        (0u64, 64usize),
        (64, 1000),
        (4093, 4096),
        (100_000, 16_384),
        (200_001, 65_535),
        (300_000, 65_536),
        (1 << 20, 1 << 20),
        ((MEMORY - 64) as u64, 64),
    ];
    for device in [2, 3, 4] {
        for (i, &(offset, len)) in cases.iter().enumerate() {
            let data = random(len, (device as u64) << 8 | i as u64);
            transfer::write(
                &session,
                at(device, offset),
                Bytes::from(data.clone()),
                Message::MAX_PAYLOAD,
            )
            .await
            .unwrap_or_else(|e| panic!("device {device}: write of {len} at {offset}: {e}"));
            let back = transfer::read(
                &session,
                at(device, offset),
                len as u64,
                Message::MAX_PAYLOAD,
            )
            .await
            .unwrap_or_else(|e| panic!("device {device}: read of {len} at {offset}: {e}"));
            assert!(
                back == data,
                "device {device}: {len} bytes at {offset} read back differently"
            );
        }
    }
    let auto = device_status(&client, "gpu-auto").await;
    assert!(auto["staged_writes"].as_u64().unwrap() > 0, "{auto}");
    assert!(auto["direct_writes"].as_u64().unwrap() > 0, "{auto}");
    let staged = device_status(&client, "gpu-staged").await;
    assert_eq!(staged["direct_writes"], 0, "{staged}");
    let direct = device_status(&client, "gpu-direct").await;
    assert!(direct["direct_writes"].as_u64().unwrap() > 0, "{direct}");
    assert_eq!(
        direct["staged_writes"], direct["direct_fallbacks"],
        "direct stages only what the driver would not pin: {direct}"
    );
    for d in [auto, staged, direct] {
        assert_eq!(d["state"], "up", "{d}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU: cargo test --features gpu --test gpu_memory -- --ignored"]
async fn writes_and_reads_outside_get_an_error_and_the_device_stays_up() {
    let (_daemon, client, dir) = start("outside").await;
    let session = Client::connect(&dir)
        .await
        .unwrap()
        .attach("app")
        .await
        .unwrap();
    let end = MEMORY as u64;
    for device in [2, 3, 4] {
        for (offset, len) in [(end - 10, 64usize), (end, 1), (u64::MAX - 8, 64)] {
            let err = session
                .write(at(device, offset), Bytes::from(vec![7; len]))
                .await
                .unwrap_err();
            assert!(
                matches!(err, ClientError::Status(Status::OutOfRange)),
                "device {device}: {len} at {offset}: {err}"
            );
        }
        let err = session.read(at(device, end - 1), 2).await.unwrap_err();
        assert!(
            matches!(err, ClientError::Status(Status::OutOfRange)),
            "{err}"
        );
        // The bytes just inside are untouched, and the device still serves.
        assert_eq!(
            session
                .read(at(device, end - 10), 10)
                .await
                .unwrap()
                .as_ref(),
            &[0; 10]
        );
        session
            .write(at(device, end - 4), Bytes::from_static(b"last"))
            .await
            .unwrap();
        assert_eq!(
            session.read(at(device, end - 4), 4).await.unwrap().as_ref(),
            b"last"
        );
    }
    for name in ["gpu-auto", "gpu-staged", "gpu-direct"] {
        let d = device_status(&client, name).await;
        assert_eq!(d["state"], "up", "{d}");
        assert_eq!(d["errors"], 4, "{d}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs everywhere: without the driver the daemon names the missing
/// library; with it, the missing GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_refuses_to_start_without_the_driver_or_the_gpu_and_says_which() {
    let dir = runtime("refused");
    let err = match embedded(config(63), &dir).await {
        Ok(_) => panic!("a daemon started with GPU 63"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("device `gpu-auto`"), "{err}");
    assert!(
        err.contains("the CUDA driver library (libcuda.so.1) was not found")
            || err.contains("no CUDA GPU number 63"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
