//! The tonic example as users run it: two network namespaces, a
//! `uniplaned` in each (peers over a `tcp` or `ltl` tunnel, authenticated
//! by a cluster secret), the example's generated server in one and its
//! generated client in the other, each process inside its namespace and
//! reaching the other only by UID through the two daemons.
//!
//! Runs the binaries `cargo test --workspace` builds (`uniplaned` and the
//! `greeter` example); without them, or without root and `ip netns`, it
//! skips, unless `UNIPLANE_REQUIRE_TOOLS=1` makes that a failure.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use uniplane_netns::{Namespace, Pair};
use uniplane_services::client::Client;
use uniplane_services::control::Request;

use common::peered_config;

const WAIT: Duration = Duration::from_secs(20);

/// A binary built beside this test (`target/<profile>/NAME` or its
/// `examples/`), or `None` (skip) unless tools are required.
fn built(relative: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile = exe.parent()?.parent()?;
    let path = profile.join(relative);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("UNIPLANE_REQUIRE_TOOLS").is_none(),
        "no {} built: run `cargo test --workspace --all-targets`",
        path.display()
    );
    eprintln!("skipped: no {} built", path.display());
    None
}

/// Server `me`'s file: peered with `peer` over `stack` (peer channel on
/// port 7460, tunnels on 7470 of each address), sockets in `runtime`.
fn config(stack: &str, me: Ipv4Addr, peer: Ipv4Addr, runtime: &Path, secret: &Path) -> String {
    let at = |ip: Ipv4Addr, port| SocketAddr::from((ip, port));
    let mut c = peered_config(
        stack,
        me,
        at(me, 7460),
        at(me, 7470),
        (peer, at(peer, 7460), at(peer, 7470)),
        secret,
    );
    c.push_str(&format!("\n[runtime]\ndir = \"{}\"\n", runtime.display()));
    c
}

/// A child process killed (and reaped) when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon(ns: &Namespace, uniplaned: &Path, config: &Path) -> Running {
    let child = ns
        .command(uniplaned.to_str().unwrap())
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("uniplaned starts");
    Running(child)
}

async fn peer_alive(runtime: &Path) -> bool {
    let Ok(c) = Client::connect(runtime).await else {
        return false;
    };
    c.request(&Request::Status)
        .await
        .ok()
        .and_then(|s| s["peers"].as_array().cloned())
        .is_some_and(|p| p.len() == 1 && p[0]["alive"] == true)
}

async fn greeter_across_namespaces(stack: &str) {
    if !uniplane_netns::require("greeter_netns", false) {
        return;
    }
    let (Some(uniplaned), Some(greeter)) = (built("uniplaned"), built("examples/greeter")) else {
        return;
    };
    let pair = Pair::new().expect("two namespaces");
    let dir = std::env::temp_dir().join(format!(
        "uniplane-greeter-netns-{stack}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret).unwrap();
    let (run_a, run_b) = (dir.join("run-a"), dir.join("run-b"));
    let (conf_a, conf_b) = (dir.join("a.toml"), dir.join("b.toml"));
    std::fs::write(
        &conf_a,
        config(stack, pair.addr_a, pair.addr_b, &run_a, &secret),
    )
    .unwrap();
    std::fs::write(
        &conf_b,
        config(stack, pair.addr_b, pair.addr_a, &run_b, &secret),
    )
    .unwrap();
    let _daemon_a = daemon(&pair.a, &uniplaned, &conf_a);
    let _daemon_b = daemon(&pair.b, &uniplaned, &conf_b);
    let start = Instant::now();
    while !(peer_alive(&run_a).await && peer_alive(&run_b).await) {
        assert!(start.elapsed() < WAIT, "the daemons did not become peers");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The server, in namespace b: its first line names its UID.
    let mut server = Running(
        pair.b
            .command(greeter.to_str().unwrap())
            .arg("serve")
            .env("UNIPLANE_RUNTIME_DIR", &run_b)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the greeter server starts"),
    );
    let stdout = server.0.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    let first = tokio::time::timeout(WAIT, first)
        .await
        .expect("the server says where it serves")
        .unwrap()
        .unwrap();
    // "serving Echo at 10.R.S.2:N/50051"
    let uid = first
        .trim()
        .strip_prefix("serving Echo at ")
        .and_then(|s| s.split('/').next())
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_string();
    assert!(uid.starts_with(&pair.addr_b.to_string()), "{uid}");

    // The caller, in namespace a, by that UID only.
    let caller = pair
        .a
        .command(greeter.to_str().unwrap())
        .args(["call", &uid])
        .env("UNIPLANE_RUNTIME_DIR", &run_a)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the greeter caller starts");
    let out = tokio::time::timeout(
        WAIT,
        tokio::task::spawn_blocking(move || caller.wait_with_output()),
    )
    .await
    .expect("the caller finishes in time")
    .unwrap()
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "caller failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("unary: b\"hello over uniplane\""), "{text}");
    assert_eq!(text.matches("stream: b\"again\"").count(), 3, "{text}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_greeter_example_calls_across_two_namespaces_over_tcp() {
    greeter_across_namespaces("tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_greeter_example_calls_across_two_namespaces_over_ltl() {
    greeter_across_namespaces("ltl").await;
}
