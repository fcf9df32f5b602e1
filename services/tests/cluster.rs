//! The cluster file through the built binaries: `uniplane cluster check`
//! prints the examples' resolved view and refuses a bad file with its
//! place; `uniplaned --cluster --check` takes each example server's part;
//! and the two-server example runs — two `uniplaned --cluster FILE
//! --server-id ID` on loopback (its addresses moved to 127.0.0.1, the
//! server IDs kept) — with a cross-server `uniplane ping`, and a rule
//! added to the file applied on SIGHUP; and the three-server example
//! in network namespaces (skipped without root and `ip netns`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use uniplane_netns::free_port;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/cluster")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uniplane-cluster-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `cmd` to its end, killed after `limit`.
fn bounded(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{cmd:?} ran past {limit:?}: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn uniplane(args: &[&str]) -> Output {
    bounded(
        Command::new(env!("CARGO_BIN_EXE_uniplane")).args(args),
        Duration::from_secs(20),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_prints_the_resolved_view_of_the_two_server_example() {
    let path = example("two-servers.toml");
    let out = uniplane(&["cluster", "check", path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let view = text(&out.stdout);
    assert!(view.starts_with("cluster two-servers: 2 servers"), "{view}");
    assert!(
        view.contains("server alpha (10.77.0.1): peer channel 10.77.0.1:7460"),
        "{view}"
    );
    assert!(
        view.contains("peer   beta (10.77.0.2) at 10.77.0.2:7460, tunnel tcp 10.77.0.2:7470"),
        "{view}"
    );
    assert!(
        view.contains("peer   alpha (10.77.0.1) at 10.77.0.1:7460, tunnel tcp 10.77.0.1:7470"),
        "{view}"
    );
}

#[test]
fn check_prints_the_three_server_example_as_json() {
    let path = example("three-servers.toml");
    let out = uniplane(&["--json", "cluster", "check", path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], true);
    let view = &doc["view"];
    assert_eq!(view["cluster"], "three-servers");
    let servers = view["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 3);
    let peers = |i: usize| -> Vec<String> {
        servers[i]["peers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(peers(0), ["beta"]);
    assert_eq!(peers(1), ["alpha", "gamma"]);
    assert_eq!(peers(2), ["beta"]);
    assert_eq!(servers[1]["routes"][0]["via"], "relay");
    assert_eq!(servers[1]["routes"][0]["to"], "10.77.0.3:*");
}

/// The two-server example with beta's two devices given one number.
fn bad_example(dir: &Path) -> PathBuf {
    let good = std::fs::read_to_string(example("two-servers.toml")).unwrap();
    let bad = good.replacen(
        "name = \"memory\"\nkind = \"memory\"\ndevice = 2",
        "name = \"memory\"\nkind = \"memory\"\ndevice = 1",
        1,
    );
    assert_ne!(good, bad);
    let path = dir.join("bad.toml");
    std::fs::write(&path, &bad).unwrap();
    path
}

#[test]
fn check_refuses_a_bad_file_with_its_place_and_exit_status_1() {
    let dir = scratch("bad");
    let path = bad_example(&dir);
    let file = path.display().to_string();
    let lines: Vec<usize> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, l)| *l == "device = 1")
        .map(|(i, _)| i + 1)
        .collect();
    // alpha's echo, beta's echo, beta's memory.
    assert_eq!(lines.len(), 3);
    let out = uniplane(&["cluster", "check", &file]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        text(&out.stderr).trim(),
        format!(
            "uniplane: cluster check: {file}:{}:10: field `servers.devices.device`: device \
             number 1 is used twice; the other is `servers.devices.device` at {file}:{}:10",
            lines[2], lines[1]
        )
    );
    let out = uniplane(&["--json", "cluster", "check", &file]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    assert!(doc["error"]
        .as_str()
        .unwrap()
        .contains("device number 1 is used twice"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn uniplaned_checks_each_example_servers_part() {
    for (file, ids) in [
        ("two-servers.toml", &["10.77.0.1", "10.77.0.2"][..]),
        (
            "three-servers.toml",
            &["10.77.0.1", "10.77.0.2", "10.77.0.3"][..],
        ),
    ] {
        let path = example(file);
        for id in ids {
            let out = bounded(
                Command::new(env!("CARGO_BIN_EXE_uniplaned"))
                    .arg("--cluster")
                    .arg(&path)
                    .args(["--server-id", id, "--check"]),
                Duration::from_secs(20),
            );
            assert!(out.status.success(), "{file} {id}: {out:?}");
            assert!(
                text(&out.stdout).starts_with(&format!("configuration is valid: server {id} (")),
                "{out:?}"
            );
        }
    }
}

#[test]
fn uniplaned_refuses_a_server_id_not_in_the_cluster() {
    let out = bounded(
        Command::new(env!("CARGO_BIN_EXE_uniplaned"))
            .arg("--cluster")
            .arg(example("two-servers.toml"))
            .args(["--server-id", "10.77.0.9", "--check"]),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        text(&out.stderr).contains(
            "server 10.77.0.9 is not in cluster `two-servers` (its servers: alpha (10.77.0.1), beta (10.77.0.2))"
        ),
        "{out:?}"
    );
}

/// Daemons killed on drop.
struct Daemons(Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `uniplane ARGS` against the daemon whose runtime directory is `dir`.
fn uniplane_at(dir: &Path, args: &[&str]) -> Output {
    bounded(
        Command::new(env!("CARGO_BIN_EXE_uniplane"))
            .env("UNIPLANE_RUNTIME_DIR", dir)
            .args(args),
        Duration::from_secs(20),
    )
}

fn peers_alive(dir: &Path) -> bool {
    let out = uniplane_at(dir, &["--json", "status"]);
    if !out.status.success() {
        return false;
    }
    serde_json::from_slice::<Value>(&out.stdout)
        .ok()
        .and_then(|s| s["peers"].as_array().cloned())
        .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true))
}

#[test]
fn the_two_server_example_runs_pings_across_servers_and_reloads_on_sighup() {
    let dir = scratch("run");
    let key = dir.join("cluster.key");
    let out = uniplane(&["cluster", "keygen", key.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    // The example as it is, but on loopback: each address on a free
    // port of 127.0.0.1, a runtime directory and the key in `dir`.
    let mut cluster = std::fs::read_to_string(example("two-servers.toml")).unwrap();
    for server in ["10.77.0.1", "10.77.0.2"] {
        for port in ["7460", "7470"] {
            let from = format!("\"{server}:{port}\"");
            assert!(cluster.contains(&from), "{from}");
            cluster = cluster.replace(&from, &format!("\"127.0.0.1:{}\"", free_port()));
        }
    }
    let runtime = |name: &str| dir.join(name);
    for name in ["alpha", "beta"] {
        let from = format!("\"/tmp/uniplane-{name}\"");
        assert!(cluster.contains(&from), "{from}");
        cluster = cluster.replace(&from, &format!("\"{}\"", runtime(name).display()));
    }
    cluster = cluster.replace(
        "\"/tmp/uniplane-cluster-example.key\"",
        &format!("\"{}\"", key.display()),
    );
    let file = dir.join("two-servers.toml");
    std::fs::write(&file, &cluster).unwrap();

    let mut daemons = Daemons(Vec::new());
    for id in ["10.77.0.1", "10.77.0.2"] {
        let child = Command::new(env!("CARGO_BIN_EXE_uniplaned"))
            .arg("--cluster")
            .arg(&file)
            .args(["--server-id", id])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("uniplaned starts");
        daemons.0.push(child);
    }
    let start = Instant::now();
    for name in ["alpha", "beta"] {
        while !peers_alive(&runtime(name)) {
            for c in &mut daemons.0 {
                assert!(c.try_wait().unwrap().is_none(), "a daemon exited early");
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{name}'s peer not alive within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // From alpha to beta's echo device (device 1), three round trips.
    let out = uniplane_at(
        &runtime("alpha"),
        &["--json", "ping", "10.77.0.2:1/7", "--count", "3"],
    );
    assert!(out.status.success(), "{out:?}");
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["received"], 3, "{summary}");
    assert_eq!(summary["target"], "10.77.0.2:1/7");

    // SIGHUP re-reads the cluster file: a rule added there refuses
    // alpha's next connection to beta's echo device.
    cluster.push_str(
        "\n[[policy.rules]]\nsrc = \"10.77.0.1:*\"\ndst = \"10.77.0.2:1\"\n\
         types = [\"CONNECT\"]\naction = \"deny\"\n",
    );
    std::fs::write(&file, &cluster).unwrap();
    for c in &daemons.0 {
        let hup = Command::new("kill")
            .args(["-HUP", &c.id().to_string()])
            .status()
            .unwrap();
        assert!(hup.success());
    }
    let start = Instant::now();
    loop {
        let out = uniplane_at(
            &runtime("alpha"),
            &["ping", "10.77.0.2:1/7", "--count", "1"],
        );
        if !out.status.success() {
            // Refused at setup — by beta's admission ("denied") or, once
            // alpha has re-read the file too, by its own policy check
            // ("policy denies") — or, when the ping had connected just
            // before the reload, its open connection closed by the rule
            // ("peer failed: Denied"): each is the rule applied.
            let err = text(&out.stderr).to_lowercase();
            assert!(
                err.contains("denied") || err.contains("policy denies"),
                "{out:?}"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the reloaded rule not applied within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(daemons);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The three-server example as it is, in network namespaces: one per
/// server with its ID's address, the servers' bridge in a hub namespace.
/// Only the runtime directories and the key move (the filesystem is
/// shared with other runs).
#[test]
fn the_three_server_example_runs_in_namespaces_each_daemon_finding_its_server() {
    if !uniplane_netns::require("three_server_example", false) {
        return;
    }
    uniplane_netns::remove_leftovers();
    let dir = scratch("netns");
    let key = dir.join("cluster.key");
    assert!(uniplane(&["cluster", "keygen", key.to_str().unwrap()])
        .status
        .success());
    let mut cluster = std::fs::read_to_string(example("three-servers.toml")).unwrap();
    let runtime = |name: &str| dir.join(name);
    for name in ["alpha", "beta", "gamma"] {
        let from = format!("\"/tmp/uniplane-{name}\"");
        assert!(cluster.contains(&from), "{from}");
        cluster = cluster.replace(&from, &format!("\"{}\"", runtime(name).display()));
    }
    cluster = cluster.replace(
        "\"/tmp/uniplane-cluster-example.key\"",
        &format!("\"{}\"", key.display()),
    );
    let file = dir.join("three-servers.toml");
    std::fs::write(&file, &cluster).unwrap();

    let hub = uniplane_netns::Namespace::new().expect("hub namespace");
    hub.ip(&["link", "add", "br0", "type", "bridge"]).unwrap();
    hub.ip(&["link", "set", "br0", "up"]).unwrap();
    let tag = std::process::id() % 100_000;
    let mut servers = Vec::new();
    for i in 1..=3 {
        let ns = uniplane_netns::Namespace::new().expect("server namespace");
        // As examples/cluster/netns.sh makes them: `eth0` with the MAC
        // the file names for the ether stacks.
        let (inner, outer) = ("eth0".to_string(), format!("c{tag}s{i}"));
        let out = Command::new("ip")
            .args(["link", "add", &inner, "netns", ns.name(), "type", "veth"])
            .args(["peer", "name", &outer, "netns", hub.name()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        hub.ip(&["link", "set", &outer, "master", "br0"]).unwrap();
        hub.ip(&["link", "set", &outer, "up"]).unwrap();
        ns.ip(&[
            "link",
            "set",
            &inner,
            "address",
            &format!("02:77:00:00:00:0{i}"),
        ])
        .unwrap();
        ns.ip(&["addr", "add", &format!("10.77.0.{i}/24"), "dev", &inner])
            .unwrap();
        ns.ip(&["link", "set", &inner, "up"]).unwrap();
        servers.push(ns);
    }
    // No --server-id: each finds the server whose ID is its address.
    let mut daemons = Daemons(Vec::new());
    for ns in &servers {
        let child = ns
            .command(env!("CARGO_BIN_EXE_uniplaned"))
            .arg("--cluster")
            .arg(&file)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("uniplaned starts");
        daemons.0.push(child);
    }
    let start = Instant::now();
    for (name, peers) in [("alpha", 1), ("beta", 2), ("gamma", 1)] {
        loop {
            let out = uniplane_at(&runtime(name), &["--json", "status"]);
            let status: Option<Value> = serde_json::from_slice(&out.stdout).ok();
            let alive = status.as_ref().is_some_and(|s| {
                s["peers"]
                    .as_array()
                    .is_some_and(|p| p.len() == peers && p.iter().all(|x| x["alive"] == true))
            });
            if alive {
                assert_eq!(status.unwrap()["name"], name);
                break;
            }
            for c in &mut daemons.0 {
                assert!(c.try_wait().unwrap().is_none(), "a daemon exited early");
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{name}'s peers not alive within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let ping =
        |from: &str, to: &str| uniplane_at(&runtime(from), &["--json", "ping", to, "--count", "3"]);
    let out = ping("alpha", "10.77.0.2:1/7");
    assert!(out.status.success(), "alpha → beta: {out:?}");
    // beta → gamma goes through beta's relay device (its route).
    let out = ping("beta", "10.77.0.3:1/7");
    assert!(out.status.success(), "beta → gamma: {out:?}");
    let stats = uniplane_at(&runtime("beta"), &["--json", "stats"]);
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    let relay = stats
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == "relay"))
        .unwrap_or_else(|| panic!("no relay port in {stats}"));
    assert!(
        relay["counters"]["rx_msgs"]
            .as_u64()
            .is_some_and(|n| n >= 3),
        "{relay}"
    );
    // alpha and gamma are not linked: beta carries alpha's connection to
    // gamma on, from its LTL tunnel to its Ethernet one.
    let out = ping("alpha", "10.77.0.3:1/7");
    assert!(out.status.success(), "alpha → gamma through beta: {out:?}");

    // Gamma's link cut: beta finds gamma gone, and alpha cannot reach it;
    // restored: beta finds gamma again, and alpha reaches it through beta.
    // Each side of the link has its own channel to the other: back means
    // both are up (gamma admits what beta carries on only over its own).
    let sees = |who: &str, peer: &str| {
        let out = uniplane_at(&runtime(who), &["--json", "status"]);
        let status: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        status["peers"]
            .as_array()
            .is_some_and(|p| p.iter().any(|x| x["server"] == peer && x["alive"] == true))
    };
    let gamma_alive = |want: bool| {
        let start = Instant::now();
        loop {
            let alive = if want {
                sees("beta", "10.77.0.3") && sees("gamma", "10.77.0.2")
            } else {
                sees("beta", "10.77.0.3")
            };
            if alive == want {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "beta does not find gamma {}",
                if want { "back" } else { "gone" }
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    servers[2].ip(&["link", "set", "eth0", "down"]).unwrap();
    gamma_alive(false);
    let out = ping("alpha", "10.77.0.3:1/7");
    assert!(!out.status.success(), "gamma is cut off: {out:?}");
    servers[2].ip(&["link", "set", "eth0", "up"]).unwrap();
    gamma_alive(true);
    let out = ping("alpha", "10.77.0.3:1/7");
    assert!(out.status.success(), "alpha → gamma again: {out:?}");
    drop(daemons);
    let _ = std::fs::remove_dir_all(&dir);
}
