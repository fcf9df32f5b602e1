//! DPDK transmit rate on a `net_null` port (no hardware, no hugepages),
//! beside `dpdk-testpmd --forward-mode=txonly` on `net_null` ports in the
//! same run: 64-byte frames, one core each.
//!
//! Run as root: `cargo run --release -p uniplane-dpdk --features dpdk
//! --example dpdkbench` (`apt-get install dpdk-dev` for testpmd).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use uniplane_dpdk::{DpdkConfig, DpdkDevice, Eal};
use uniplane_frame::eth::{write_header, MacAddr};
use uniplane_frame::{FrameDevice, TxQueue};

const SECS: f64 = 2.0;
const ROUNDS: usize = 5;

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn open() -> DpdkDevice {
    let prefix = format!("--file-prefix=uniplane-bench-{}", std::process::id());
    let eal = Eal::init(&[
        "--no-huge",
        "-m",
        "1024",
        "--no-pci",
        "--no-shconf",
        "--no-telemetry",
        &prefix,
        "-l",
        "1",
        "--log-level=lib.eal:error",
        "--vdev=net_null0",
    ])
    .expect("EAL");
    let cfg = DpdkConfig {
        pool_mbufs: 16383,
        ..DpdkConfig::default()
    };
    DpdkDevice::open(eal, "net_null0", &cfg).expect("net_null0")
}

/// Frames per second sent for `secs`.
fn ours(dev: &mut DpdkDevice, secs: f64) -> f64 {
    let src = dev.mac();
    let (_, tx) = dev.queues();
    let start = Instant::now();
    let mut sent = 0u64;
    let mut turns = 0u32;
    loop {
        // 64-byte frames of which the first 42 bytes are written, as
        // testpmd's txonly writes Ethernet, IPv4 and UDP headers.
        tx.push_burst(usize::MAX, |_, f| {
            write_header(f, MacAddr::BROADCAST, src, 0x88b5);
            f[14..42].fill(0);
            64
        });
        sent += tx.flush().expect("flush") as u64;
        turns += 1;
        if turns.is_multiple_of(1024) && start.elapsed().as_secs_f64() >= secs {
            break;
        }
    }
    sent as f64 / start.elapsed().as_secs_f64()
}

/// testpmd's transmit rate: the median of its per-second samples, summed
/// over its ports.
fn testpmd() -> Option<Vec<f64>> {
    let prefix = format!("uniplane-testpmd-{}", std::process::id());
    let mut child = Command::new("dpdk-testpmd")
        .args([
            "--no-huge",
            "-m",
            "1024",
            "--no-pci",
            "--file-prefix",
            &prefix,
            "--vdev=net_null0",
            "--vdev=net_null1",
            "-l",
            "0,1",
            "--",
            "--forward-mode=txonly",
            "--total-num-mbufs=16384",
            "-a",
            "--stats-period",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_secs_f64(SECS + 2.0));
    // SAFETY: signalling the testpmd this run started; it exits on SIGINT.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().ok()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{prefix}"));
    // Each period prints a block per port; a block's "Tx-pps:" summed over
    // the ports of one period.
    let mut samples = Vec::new();
    // The first period includes start-up.
    for period in out.split("Port statistics").skip(2) {
        let pps: f64 = period
            .lines()
            .filter_map(|l| l.split("Tx-pps:").nth(1))
            .filter_map(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .sum();
        if pps > 0.0 {
            samples.push(pps);
        }
    }
    Some(samples)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

fn list(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{:.1}", x / 1e6))
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    let before = load();
    let mut dev = open();
    // Alternating runs, so both see the same load on this shared machine:
    // one second of ours, then a testpmd run of a few one-second samples.
    let (mut o, mut t) = (Vec::new(), Vec::new());
    let mut have_testpmd = true;
    for _ in 0..ROUNDS {
        o.push(ours(&mut dev, 1.0));
        match testpmd() {
            Some(s) => t.extend(s),
            None => have_testpmd = false,
        }
    }
    drop(dev);
    let _ = std::fs::remove_dir(format!(
        "/var/run/dpdk/uniplane-bench-{}",
        std::process::id()
    ));
    let after = load();
    println!("DPDK TX, 64 B frames, net_null, one core (load before {before}, after {after})");
    println!(
        "{:<40} {:>10.2} Mpps",
        "frame layer on DPDK (median)",
        median(&o) / 1e6
    );
    println!("  one-second runs (Mpps): {}", list(&o));
    if have_testpmd && !t.is_empty() {
        println!(
            "{:<40} {:>10.2} Mpps",
            "dpdk-testpmd txonly (median)",
            median(&t) / 1e6
        );
        println!("  per-second samples (Mpps): {}", list(&t));
        println!(
            "{:<40} {:>10.2}",
            "ratio frame layer / testpmd",
            median(&o) / median(&t)
        );
    } else {
        println!(
            "{:<40} {:>10}",
            "dpdk-testpmd", "not run (install dpdk-dev)"
        );
    }
}
