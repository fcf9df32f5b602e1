//! A host memory device behind one daemon in this process: one-sided
//! writes and reads of more than one message, from the library and from
//! the CLI's files.

use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::MemoryAddress;
use uniplane_services::client::{embedded, ClientError};
use uniplane_services::config::Config;
use uniplane_services::control::Request;
use uniplane_services::transfer;

const MEMORY: usize = 1 << 20;

fn config() -> Config {
    let text = format!(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n\n\
         [[devices]]\nname = \"mem\"\nkind = \"memory\"\ndevice = 2\nmemory = {MEMORY}\n\
         backend = \"host\"\n"
    );
    Config::parse(&text, "test").unwrap()
}

fn runtime(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-mem-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `len` bytes that differ from any shifted copy of themselves.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn at(offset: u64) -> MemoryAddress {
    format!("127.0.0.1:2@{offset}").parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_many_messages_read_back_byte_exact_and_outside_is_refused() {
    let dir = runtime("lib");
    let (_daemon, client) = embedded(config(), &dir).await.unwrap();
    let session = client.attach("app").await.unwrap();
    for (offset, len) in [(0u64, 64usize), (4096, 65_535), (100_001, 300_000)] {
        let data = pattern(len, offset + 7);
        let messages = transfer::write(&session, at(offset), Bytes::from(data.clone()), 8192)
            .await
            .unwrap();
        assert_eq!(messages, len.div_ceil(8192));
        let back = transfer::read(&session, at(offset), len as u64, 8192)
            .await
            .unwrap();
        assert!(
            back == data,
            "{len} bytes at {offset} read back differently"
        );
    }
    let past = transfer::write(
        &session,
        at(MEMORY as u64 - 10),
        Bytes::from(vec![1; 64]),
        8192,
    );
    assert!(matches!(
        past.await,
        Err(ClientError::Status(Status::OutOfRange))
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

fn cli(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uniplane"))
        .args(args)
        .env("UNIPLANE_RUNTIME_DIR", dir)
        .output()
        .unwrap()
}

fn cli_ok(dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = cli(dir, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_writes_a_file_and_reads_it_back_into_another() {
    let dir = runtime("cli");
    let (_daemon, _client) = embedded(config(), &dir).await.unwrap();
    let data = pattern(200_000, 42);
    let input = dir.join("in.bin");
    let output = dir.join("out.bin");
    std::fs::write(&input, &data).unwrap();
    let (inp, outp) = (input.clone(), output.clone());
    let dir2 = dir.clone();
    let (written, read) = tokio::task::spawn_blocking(move || {
        let (inp, outp) = (inp.to_str().unwrap(), outp.to_str().unwrap());
        let w = cli_ok(
            &dir2,
            &["write", "127.0.0.1:2@1000", "--file", inp, "--json"],
        );
        let r = cli_ok(
            &dir2,
            &[
                "read",
                "127.0.0.1:2@1000",
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
    assert_eq!(written["written"], 200_000);
    assert_eq!(written["messages"], 200_000usize.div_ceil(65_535));
    assert_eq!(read["len"], 200_000);
    assert!(
        std::fs::read(&output).unwrap() == data,
        "the file came back changed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_still_writes_a_string_and_shows_what_it_reads() {
    let dir = runtime("data");
    let (_daemon, client) = embedded(config(), &dir).await.unwrap();
    let dir2 = dir.clone();
    let read = tokio::task::spawn_blocking(move || {
        cli_ok(
            &dir2,
            &["write", "127.0.0.1:2@7", "--data", "hello", "--json"],
        );
        cli_ok(&dir2, &["read", "127.0.0.1:2@7", "--len", "5", "--json"])
    })
    .await
    .unwrap();
    assert_eq!(read["text"], "hello");
    let status = client.request(&Request::Status).await.unwrap();
    let device = &status["devices"][0];
    assert_eq!(
        (device["name"].as_str(), device["backend"].as_str()),
        (Some("mem"), Some("host"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_fails_a_file_that_runs_past_the_memory() {
    let dir = runtime("past");
    let (_daemon, _client) = embedded(config(), &dir).await.unwrap();
    let input = dir.join("in.bin");
    std::fs::write(&input, pattern(100_000, 1)).unwrap();
    let (dir2, inp) = (dir.clone(), input.to_str().unwrap().to_owned());
    let out = tokio::task::spawn_blocking(move || {
        let at = format!("127.0.0.1:2@{}", MEMORY - 50_000);
        cli(&dir2, &["write", &at, "--file", &inp])
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("range"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
