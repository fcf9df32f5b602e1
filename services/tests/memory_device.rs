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
async fn the_cli_writes_a_file_and_reads_it_back_into_another_by_messages_or_mapping() {
    let dir = runtime("cli");
    let (_daemon, _client) = embedded(config(), &dir).await.unwrap();
    // By messages, as asked; by default (below 1 MiB: messages); mapped,
    // as asked.
    for (i, (path, expect_path, messages)) in [
        (Some("messages"), "messages", 200_000usize.div_ceil(65_535)),
        (None, "messages", 200_000usize.div_ceil(65_535)),
        (Some("map"), "map", 0),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(200_000, 42 + i as u64);
        let input = dir.join(format!("in{i}.bin"));
        let output = dir.join(format!("out{i}.bin"));
        std::fs::write(&input, &data).unwrap();
        let dir2 = dir.clone();
        let (written, read) = tokio::task::spawn_blocking(move || {
            let (inp, outp) = (input.to_str().unwrap(), output.to_str().unwrap());
            let route: Vec<&str> = path.map(|p| vec!["--path", p]).unwrap_or_default();
            let mut w = vec!["write", "127.0.0.1:2@1000", "--file", inp, "--json"];
            w.extend(&route);
            let mut r = vec![
                "read",
                "127.0.0.1:2@1000",
                "--len",
                "200000",
                "--out",
                outp,
                "--json",
            ];
            r.extend(&route);
            (cli_ok(&dir2, &w), cli_ok(&dir2, &r))
        })
        .await
        .unwrap();
        assert_eq!(written["written"], 200_000);
        assert_eq!(written["path"], expect_path);
        assert_eq!(written["messages"], messages);
        assert_eq!(
            (read["len"].as_u64(), read["path"].as_str()),
            (Some(200_000), Some(expect_path))
        );
        assert!(
            std::fs::read(dir.join(format!("out{i}.bin"))).unwrap() == data,
            "the file came back changed ({expect_path})"
        );
    }
    // A file of 1 MiB or more is mapped by default.
    let data = pattern(MEMORY, 99);
    let input = dir.join("whole.bin");
    std::fs::write(&input, &data).unwrap();
    let dir2 = dir.clone();
    let written = tokio::task::spawn_blocking(move || {
        let inp = input.to_str().unwrap();
        cli_ok(&dir2, &["write", "127.0.0.1:2@0", "--file", inp, "--json"])
    })
    .await
    .unwrap();
    assert_eq!(
        (written["path"].as_str(), written["messages"].as_u64()),
        (Some("map"), Some(0))
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

/// The configuration with access rules appended (`rules`: TOML).
fn config_with(rules: &str) -> Config {
    let text = format!(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n\n\
         [[devices]]\nname = \"mem\"\nkind = \"memory\"\ndevice = 2\nmemory = {MEMORY}\n\
         backend = \"host\"\n{rules}"
    );
    Config::parse(&text, "test").unwrap()
}

fn deny(src: uniplane_dataplane::Uid, types: &str) -> String {
    format!(
        "\n[[policy.rules]]\nsrc = \"{src}\"\ndst = \"127.0.0.1:2\"\ntypes = [{types}]\naction = \"deny\"\n"
    )
}

/// The memory device's line of `uniplane status`.
async fn device_status(client: &uniplane_services::client::Client) -> serde_json::Value {
    let status = client.request(&Request::Status).await.unwrap();
    status["devices"][0].clone()
}

/// Waits (bounded) until the device says it was taken back `n` times.
async fn taken_back(client: &uniplane_services::client::Client, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let d = device_status(client).await;
        if d["taken_back"].as_u64() == Some(n) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the memory was not taken back {n} times: {d}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_memory_holds_the_same_bytes_the_messages_write_and_read() {
    let dir = runtime("map");
    let (_daemon, client) = embedded(config(), &dir).await.unwrap();
    let session = client.attach("app").await.unwrap();
    let mem: uniplane_dataplane::Uid = "127.0.0.1:2".parse().unwrap();
    let mut map = session.map(mem).await.unwrap();
    assert_eq!((map.len(), map.writable()), (MEMORY, true));
    assert_eq!(device_status(session.client()).await["mappings"], 1);

    // Written by mapping, read by messages.
    let data = pattern(300_000, 3);
    map.write(4096, &data).await.unwrap();
    let back = transfer::read(&session, at(4096), data.len() as u64, 65_535)
        .await
        .unwrap();
    assert!(
        back == data,
        "the messages read other bytes than were mapped in"
    );
    // Written by messages, read by mapping.
    let data = pattern(200_000, 9);
    transfer::write(&session, at(500_000), Bytes::from(data.clone()), 65_535)
        .await
        .unwrap();
    let mut seen = vec![0u8; data.len()];
    map.read_into(500_000, &mut seen).await.unwrap();
    assert!(
        seen == data,
        "the mapping shows other bytes than the messages wrote"
    );

    // Past the end: refused, nothing written.
    let last = MEMORY as u64 - 4;
    map.write(last, b"keep").await.unwrap();
    let past = map.write(last, b"too long").await;
    assert!(
        matches!(past, Err(ClientError::Status(Status::OutOfRange))),
        "{past:?}"
    );
    assert!(matches!(
        map.write(u64::MAX, b"x").await,
        Err(ClientError::Status(Status::OutOfRange))
    ));
    let mut tail = [0u8; 4];
    map.read_into(last, &mut tail).await.unwrap();
    assert_eq!(&tail, b"keep");

    // Only this server's host memory can be mapped.
    let other = session
        .map("10.9.9.9:2".parse().unwrap())
        .await
        .unwrap_err();
    assert!(other.to_string().contains("another server"), "{other}");
    let none = session
        .map("127.0.0.1:77".parse().unwrap())
        .await
        .unwrap_err();
    assert!(none.to_string().contains("no device 77"), "{none}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_rules_take_a_mapping_back_and_the_process_keeps_to_them() {
    let dir = runtime("revoke");
    let (daemon, client) = embedded(config(), &dir).await.unwrap();
    let session = client.attach("app").await.unwrap();
    let me = session.uid();
    let mem: uniplane_dataplane::Uid = "127.0.0.1:2".parse().unwrap();
    let mut map = session.map(mem).await.unwrap();
    map.write(0, b"first").await.unwrap();

    // Writes denied: the daemon takes the memory back; the next write
    // maps again, gets a read-only mapping and is refused.
    let reloaded = |rules: String| {
        let mut c = config_with(&rules);
        c.runtime_dir = Some(dir.clone());
        c
    };
    daemon
        .reload(&reloaded(deny(me, "\"WRTE\"")))
        .await
        .unwrap();
    taken_back(session.client(), 1).await;
    let refused = map.write(0, b"second").await.unwrap_err();
    assert!(refused.to_string().contains("not write"), "{refused}");
    assert_eq!((map.writable(), map.remaps()), (false, 1));
    let mut seen = [0u8; 5];
    map.read_into(0, &mut seen).await.unwrap();
    assert_eq!(&seen, b"first", "the bytes moved with the memory");
    // The messages' path keeps to the same rules.
    let by_message = session.write(at(0), Bytes::from_static(b"other")).await;
    assert!(
        by_message.is_err(),
        "a denied WRTE went through: {by_message:?}"
    );

    // Reads denied too: no mapping at all.
    daemon
        .reload(&reloaded(deny(me, "\"WRTE\", \"READ\"")))
        .await
        .unwrap();
    taken_back(session.client(), 2).await;
    let refused = map.read_into(0, &mut seen).await.unwrap_err();
    assert!(refused.to_string().starts_with("denied"), "{refused}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_ends_gives_its_mapping_back_and_the_others_follow_the_memory() {
    let dir = runtime("ends");
    let (_daemon, client) = embedded(config(), &dir).await.unwrap();
    let mem: uniplane_dataplane::Uid = "127.0.0.1:2".parse().unwrap();
    let stays = client.attach("stays").await.unwrap();
    let mut kept = stays.map(mem).await.unwrap();
    kept.write(0, b"kept").await.unwrap();
    {
        let goes = uniplane_services::client::Client::connect(&dir)
            .await
            .unwrap()
            .attach("goes")
            .await
            .unwrap();
        let mut map = goes.map(mem).await.unwrap();
        map.write(100, b"left behind").await.unwrap();
    }
    taken_back(stays.client(), 1).await;
    // What the ended session wrote stays; the other mapping follows the
    // memory to its new place and goes on.
    let mut seen = [0u8; 11];
    kept.read_into(100, &mut seen).await.unwrap();
    assert_eq!(&seen, b"left behind");
    assert_eq!(kept.remaps(), 1);
    kept.write(200, b"after").await.unwrap();
    let back = transfer::read(&stays, at(200), 5, 8192).await.unwrap();
    assert_eq!(back, b"after".to_vec());
    assert_eq!(device_status(stays.client()).await["mappings"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}
