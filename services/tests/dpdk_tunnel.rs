//! A tunnel over DPDK ports (`--features dpdk`): two `uniplaned` built
//! with the feature, each in a network namespace of a veth pair, each
//! with a `dpdk` stack on a `net_af_packet` vdev over its end of the veth
//! (the EAL without hugepages); `uniplane ping` from one to the other's
//! echo device crosses it. Needs root and `ip netns`; skips otherwise,
//! unless `UNIPLANE_REQUIRE_TOOLS=1` makes that a failure.

#![cfg(feature = "dpdk")]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use uniplane_netns::{Namespace, Pair};

struct Daemons(Vec<Child>);

impl Drop for Daemons {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn mac(ns: &Namespace, iface: &str) -> String {
    let out = ns.ip(&["-o", "link", "show", iface]).expect("ip link");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {text}"))
        .to_owned()
}

fn uniplane(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uniplane"))
        .args(args)
        .env("UNIPLANE_RUNTIME_DIR", dir)
        .output()
        .expect("uniplane runs")
}

#[test]
fn a_tunnel_over_dpdk_ports_carries_a_ping() {
    if !uniplane_netns::require("dpdk_tunnel", false) {
        return;
    }
    let pair = Pair::new().unwrap();
    let base = std::env::temp_dir().join(format!("uniplane-dpdk-tunnel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let key = base.join("cluster.key");
    assert!(Command::new(env!("CARGO_BIN_EXE_uniplane"))
        .args(["cluster", "keygen", key.to_str().unwrap()])
        .status()
        .unwrap()
        .success());
    let sides = [
        (
            &pair.a,
            &pair.iface_a,
            pair.addr_a,
            pair.addr_b,
            &pair.iface_b,
            &pair.b,
        ),
        (
            &pair.b,
            &pair.iface_b,
            pair.addr_b,
            pair.addr_a,
            &pair.iface_a,
            &pair.a,
        ),
    ];
    let mut daemons = Daemons(Vec::new());
    let mut dirs = Vec::new();
    for (i, (ns, iface, me, peer, peer_iface, peer_ns)) in sides.into_iter().enumerate() {
        let dir = base.join(format!("d{i}"));
        let text = format!(
            "[server]\nid = \"{me}\"\npeer_listen = \"{me}:7460\"\n\n\
             [runtime]\ndir = \"{}\"\n\n\
             [[stacks]]\nname = \"dpdk\"\ninterface = \"{iface}\"\n\n\
             [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = 1\n\n\
             [[peers]]\nserver = \"{peer}\"\naddress = \"{peer}:7460\"\nstack = \"dpdk\"\nmac = \"{}\"\n\n\
             [failure]\nheartbeat_ms = 50\nmisses = 20\n\n\
             [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
            dir.display(),
            mac(peer_ns, peer_iface),
            key.display()
        );
        let file = base.join(format!("d{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let child = ns
            .command(env!("CARGO_BIN_EXE_uniplaned"))
            .arg("--config")
            .arg(&file)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("uniplaned starts");
        daemons.0.push(child);
        dirs.push(dir);
    }
    let start = Instant::now();
    for dir in &dirs {
        loop {
            let out = uniplane(dir, &["--json", "status"]);
            let status: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
            let alive = status["peers"]
                .as_array()
                .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true));
            if alive {
                assert_eq!(status["stacks"][0], "dpdk");
                break;
            }
            for c in &mut daemons.0 {
                assert!(c.try_wait().unwrap().is_none(), "a daemon exited");
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the daemons did not peer over DPDK"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let out = uniplane(
        &dirs[0],
        &[
            "--json",
            "ping",
            &format!("{}:1/7", pair.addr_b),
            "--count",
            "20",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    drop(daemons);
    let _ = std::fs::remove_dir_all(&base);
}
