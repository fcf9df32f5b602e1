//! `devices`: a memory device through a daemon, beside the copy it stands
//! for.
//!
//! ```text
//!  this process
//!  ┌ session ──WRTE × N/64 KiB, 32 in flight──► daemon ──► memory device ─┐
//!  │         ◄─READ answers───────────────────  (engine)   host: a Vec     │
//!  │                                                       gpu: a thread,  │
//!  │                                                       staged|direct   │
//!  └ peer, same bytes: memcpy (host) | cuMemcpyHtoD/DtoH from pinned (gpu) ┘
//! ```
//!
//! A daemon starts inside this process (its own runtime directory, no
//! network listeners) with one memory device of the backend asked for
//! (`--memory host|gpu`) and `--size` bytes. The benchmark writes those
//! bytes into it in messages of the largest payload, 32 in flight (the
//! CLI's `uniplane write --file`), reads them back the same way, and with
//! `--verify` compares. Each of `--rounds` rounds is timed; the median is
//! reported, as bytes per second of payload, and as a ratio to the peer
//! measured in the same run on the same bytes: `memcpy` for host memory,
//! the driver's own host-to-device (and device-to-host) copy from pinned
//! memory for GPU memory, which is as fast as those bytes can reach the
//! GPU at all.
//!
//! For GPU memory it also writes the same bytes through a `staged` and a
//! `direct` device at several message sizes, so the crossover that
//! `transfer = "auto"`'s `direct_from` should sit at shows.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use uniplane_client::{Client, ClientError, Session};
use uniplane_dataplane::{MemoryAddress, Message};
use uniplane_services::transfer;

use crate::path::{client_err, scratch_dir};
use crate::BenchError;

/// Where the device keeps its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host memory (`backend = "host"`).
    Host,
    /// GPU memory (`backend = "gpu"`, needs the `gpu` feature).
    Gpu,
}

impl MemoryKind {
    /// Its name on the command line and in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host",
            MemoryKind::Gpu => "gpu",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct DevicesConfig {
    /// The backend.
    pub memory: MemoryKind,
    /// Bytes written and read back per round (also the device's size).
    pub size: usize,
    /// Compare what was read with what was written.
    pub verify: bool,
    /// The CUDA ordinal for GPU memory.
    pub gpu: u32,
    /// Timed rounds (the median is reported).
    pub rounds: usize,
}

/// Message sizes of the staged/direct sweep.
const SWEEP: [usize; 5] = [4096, 8192, 16384, 32768, Message::MAX_PAYLOAD];

/// Bytes each point of the sweep writes, at most.
const SWEEP_BYTES: usize = 64 << 20;

/// The device numbers: the one measured, then the sweep's.
const MEASURED: u16 = 2;
const STAGED: u16 = 3;
const DIRECT: u16 = 4;
/// An inline echo device beside the kernel device: the path without it.
const INLINE_ECHO: u16 = 5;

fn daemon_config(cfg: &DevicesConfig, dir: &Path) -> Result<uniplane_services::Config, BenchError> {
    let mut text = String::from("[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n");
    let device = |device: u16, size: usize, extra: &str| {
        format!(
            "\n[[devices]]\nname = \"mem{device}\"\nkind = \"memory\"\ndevice = {device}\n\
             memory = {size}\n{extra}"
        )
    };
    match cfg.memory {
        MemoryKind::Host => text.push_str(&device(MEASURED, cfg.size, "")),
        MemoryKind::Gpu => {
            let gpu = |transfer: &str| {
                format!(
                    "backend = \"gpu\"\ngpu = {}\ntransfer = \"{transfer}\"\n",
                    cfg.gpu
                )
            };
            let sweep = cfg.size.min(SWEEP_BYTES);
            text.push_str(&device(MEASURED, cfg.size, &gpu("auto")));
            text.push_str(&device(STAGED, sweep, &gpu("staged")));
            text.push_str(&device(DIRECT, sweep, &gpu("direct")));
        }
    }
    let mut config = uniplane_services::Config::parse(&text, "devices")
        .map_err(|e| BenchError::Config(format!("the daemon's configuration: {e}")))?;
    config.runtime_dir = Some(dir.to_owned());
    Ok(config)
}

fn at(device: u16) -> MemoryAddress {
    MemoryAddress {
        uid: uniplane_dataplane::Uid::new(std::net::Ipv4Addr::LOCALHOST, device),
        addr: 0,
    }
}

/// `len` bytes of a pattern no shifted copy of itself matches.
fn pattern(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn gbytes_per_sec(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

/// Median seconds of `rounds` runs of `f`.
fn timed(
    rounds: usize,
    mut f: impl FnMut() -> Result<(), BenchError>,
) -> Result<Duration, BenchError> {
    let mut secs = Vec::new();
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        f()?;
        secs.push(t.elapsed().as_secs_f64());
    }
    Ok(Duration::from_secs_f64(median(secs)))
}

/// Runs the benchmark; the `results` of its report.
pub fn run_devices(cfg: &DevicesConfig) -> Result<Value, BenchError> {
    if cfg.size == 0 {
        return Err(BenchError::Config("--size must be above 0".into()));
    }
    let dir = scratch_dir("devices")?;
    let result = measure(cfg, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The runtime an embedded daemon of these benchmarks runs on.
fn daemon_runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| BenchError::Thread {
            what: "daemon",
            source,
        })
}

fn measure(cfg: &DevicesConfig, dir: &Path) -> Result<Value, BenchError> {
    let runtime = daemon_runtime()?;
    let config = daemon_config(cfg, dir)?;
    let (_daemon, client, session) = runtime.block_on(async {
        let (daemon, client) = uniplane_services::client::embedded(config, dir)
            .await
            .map_err(|e| BenchError::Config(format!("the daemon: {e}")))?;
        let session = Client::connect(dir)
            .await
            .map_err(client_err)?
            .attach("devices-bench")
            .await
            .map_err(client_err)?;
        Ok::<_, BenchError>((daemon, client, session))
    })?;

    let data = Bytes::from(pattern(cfg.size));
    let mtu = Message::MAX_PAYLOAD;
    let write = |device: u16, bytes: Bytes, mtu: usize| {
        runtime
            .block_on(transfer::write(&session, at(device), bytes, mtu))
            .map(drop)
            .map_err(|e| BenchError::Config(format!("write: {e}")))
    };
    let read = |session: &Session, into: &mut [u8]| {
        runtime
            .block_on(transfer::read_into(session, at(MEASURED), into, mtu))
            .map_err(|e| BenchError::Config(format!("read: {e}")))
    };
    // One untimed round: first touches of the memory are not the figure.
    write(MEASURED, data.clone(), mtu)?;
    let write_time = timed(cfg.rounds, || write(MEASURED, data.clone(), mtu))?;
    // Read into one buffer, touched by an untimed round as the device's
    // memory was: page faults are not the figure either.
    let mut back = vec![0u8; cfg.size];
    read(&session, &mut back)?;
    let read_time = timed(cfg.rounds, || read(&session, &mut back))?;
    let verified = cfg.verify.then(|| back[..] == data[..]);
    if verified == Some(false) {
        return Err(BenchError::Config(format!(
            "--verify: the {} bytes read back differ from those written",
            cfg.size
        )));
    }

    let (peer_name, peer_write, peer_read) = match cfg.memory {
        MemoryKind::Host => {
            let (w, r) = memcpy_peer(cfg.size, cfg.rounds);
            ("memcpy", w, r)
        }
        MemoryKind::Gpu => {
            let (w, r) = gpu_peer(cfg)?;
            ("cuMemcpyHtoD/DtoH from pinned host memory", w, r)
        }
    };
    let write_gbs = gbytes_per_sec(cfg.size, write_time);
    let read_gbs = gbytes_per_sec(cfg.size, read_time);

    let mut results = json!({
        "memory": cfg.memory.name(),
        "bytes": cfg.size,
        "message_bytes": mtu,
        "messages": cfg.size.div_ceil(mtu),
        "window": transfer::WINDOW,
        "rounds": cfg.rounds.max(1),
        "write_seconds": write_time.as_secs_f64(),
        "read_seconds": read_time.as_secs_f64(),
        "gbytes_per_sec": { "write": write_gbs, "read": read_gbs },
        "peer": {
            "name": peer_name,
            "gbytes_per_sec": { "write": peer_write, "read": peer_read },
        },
        "ratio": { "write": write_gbs / peer_write, "read": read_gbs / peer_read },
        "verified": verified,
    });
    if cfg.memory == MemoryKind::Host {
        results["mapped"] = mapped(&runtime, &session, cfg, &data, (peer_write, peer_read))?;
    }
    if cfg.memory == MemoryKind::Gpu {
        let sweep_bytes = cfg.size.min(SWEEP_BYTES);
        let sweep_data = data.slice(..sweep_bytes);
        let mut points = Vec::new();
        for message in SWEEP.into_iter().filter(|&m| m <= sweep_bytes) {
            let mut point = json!({ "message_bytes": message });
            for (name, device) in [("staged", STAGED), ("direct", DIRECT)] {
                write(device, sweep_data.clone(), message)?;
                let t = timed(cfg.rounds, || write(device, sweep_data.clone(), message))?;
                point[format!("{name}_gbytes_per_sec")] = json!(gbytes_per_sec(sweep_bytes, t));
            }
            points.push(point);
        }
        let crossover = points
            .iter()
            .find(|p| p["direct_gbytes_per_sec"].as_f64() >= p["staged_gbytes_per_sec"].as_f64())
            .map(|p| p["message_bytes"].clone());
        results["transfers"] = json!({
            "bytes": sweep_bytes,
            "points": points,
            "direct_from": crossover,
        });
        let status = runtime
            .block_on(client.request(&uniplane_services::control::Request::Status))
            .map_err(client_err)?;
        results["device_counters"] = status["devices"].clone();
    }
    drop(session);
    Ok(results)
}

/// The same bytes written and read through a mapping of the device's
/// memory (`Session::map`): the process's own copy, under the daemon's
/// grant; `peer` is the in-run memcpy (write, read) it is compared with.
fn mapped(
    runtime: &tokio::runtime::Runtime,
    session: &Session,
    cfg: &DevicesConfig,
    data: &[u8],
    peer: (f64, f64),
) -> Result<Value, BenchError> {
    let fail = |what: &str, e: ClientError| BenchError::Config(format!("mapped {what}: {e}"));
    let mut map = runtime
        .block_on(session.map(at(MEASURED).uid))
        .map_err(|e| fail("map", e))?;
    let mut write = || {
        runtime
            .block_on(map.write(0, data))
            .map_err(|e| fail("write", e))
    };
    write()?;
    let write_time = timed(cfg.rounds, &mut write)?;
    let mut back = vec![0u8; data.len()];
    let mut read = |into: &mut [u8]| {
        runtime
            .block_on(map.read_into(0, into))
            .map_err(|e| fail("read", e))
    };
    read(&mut back)?;
    let read_time = timed(cfg.rounds, || read(&mut back))?;
    let verified = cfg.verify.then(|| back[..] == data[..]);
    if verified == Some(false) {
        return Err(BenchError::Config(
            "--verify: the bytes read back through the mapping differ from those written".into(),
        ));
    }
    let (w, r) = (
        gbytes_per_sec(data.len(), write_time),
        gbytes_per_sec(data.len(), read_time),
    );
    Ok(json!({
        "write_seconds": write_time.as_secs_f64(),
        "read_seconds": read_time.as_secs_f64(),
        "gbytes_per_sec": { "write": w, "read": r },
        "ratio": { "write": w / peer.0, "read": r / peer.1 },
        "verified": verified,
    }))
}

/// memcpy of `size` bytes, host to host, both ways: GB/s (median).
fn memcpy_peer(size: usize, rounds: usize) -> (f64, f64) {
    let src = pattern(size);
    let mut dst = vec![0u8; size];
    dst.copy_from_slice(&src); // first touch
    let copy = |from: &[u8], to: &mut [u8]| {
        let t = timed(rounds, || {
            to.copy_from_slice(std::hint::black_box(from));
            Ok(())
        })
        .unwrap_or_default();
        gbytes_per_sec(size, t)
    };
    let w = copy(&src, &mut dst);
    let mut back = vec![0u8; size];
    let r = copy(&dst, &mut back);
    (w, r)
}

#[cfg(not(feature = "gpu"))]
fn gpu_peer(_cfg: &DevicesConfig) -> Result<(f64, f64), BenchError> {
    Err(BenchError::Config(
        "--memory gpu: uniplane-bench was built without the gpu feature (build with `--features gpu`)".into(),
    ))
}

/// The driver's own copies of `size` bytes between pinned host memory and
/// the GPU: GB/s host to device, device to host (median).
#[cfg(feature = "gpu")]
fn gpu_peer(cfg: &DevicesConfig) -> Result<(f64, f64), BenchError> {
    use cudarc::driver::{result, sys};
    let err = |call: &str| {
        let call = call.to_owned();
        move |e: cudarc::driver::DriverError| BenchError::Config(format!("peer: {call}: {:?}", e.0))
    };
    // SAFETY: only tries to load the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(BenchError::Config(
            "peer: the CUDA driver library (libcuda.so.1) was not found".into(),
        ));
    }
    result::init().map_err(err("cuInit"))?;
    let device = result::device::get(cfg.gpu as i32).map_err(err("cuDeviceGet"))?;
    // SAFETY: `device` came from cuDeviceGet; every pointer below is
    // allocated here with `size` bytes and freed before returning.
    unsafe {
        let context =
            result::primary_ctx::retain(device).map_err(err("cuDevicePrimaryCtxRetain"))?;
        result::ctx::set_current(context).map_err(err("cuCtxSetCurrent"))?;
        let size = cfg.size;
        let gpu = result::malloc_sync(size).map_err(err("cuMemAlloc"))?;
        let host: *mut u8 = result::malloc_host(size, 0)
            .map_err(err("cuMemHostAlloc"))?
            .cast();
        let pinned = std::slice::from_raw_parts_mut(host, size);
        pinned.copy_from_slice(&pattern(size));
        let h2d = timed(cfg.rounds + 1, || {
            result::memcpy_htod_sync(gpu, &pinned[..]).map_err(err("cuMemcpyHtoD"))
        });
        let d2h = timed(cfg.rounds + 1, || {
            result::memcpy_dtoh_sync(&mut pinned[..], gpu).map_err(err("cuMemcpyDtoH"))
        });
        let _ = result::free_host(host.cast());
        let _ = result::free_sync(gpu);
        let _ = result::primary_ctx::release(device);
        Ok((gbytes_per_sec(size, h2d?), gbytes_per_sec(size, d2h?)))
    }
}

/// Parses a byte count: digits with an optional K, M or G (powers of 1024).
pub fn parse_bytes(text: &str) -> Result<usize, BenchError> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let scale: usize = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => {
            return Err(BenchError::Config(format!(
                "`{text}`: expected bytes, like 4096, 64K, 256M or 1G"
            )))
        }
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| {
            BenchError::Config(format!(
                "`{text}`: expected bytes, like 4096, 64K, 256M or 1G"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("64K").unwrap(), 64 << 10);
        assert_eq!(parse_bytes("256M").unwrap(), 256 << 20);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("M").is_err());
    }

    #[test]
    fn the_median_is_the_middle_round() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }
}

/// What `devices --backend emulated` runs: round trips to an echo kernel
/// device.
#[derive(Clone, Debug)]
pub struct KernelRttConfig {
    /// Payload bytes per message (at most the largest payload).
    pub size: usize,
    /// How the application, the engine and the kernel thread wait.
    pub wait: crate::path::WaitMode,
    /// Round trips measured (after as many again to warm up, at most 1000).
    pub count: usize,
}

/// Round trips application → daemon → kernel → back, one message in
/// flight, to an echo kernel device (`kind = "kernel"`, `backend =
/// "emulated"`) of a daemon in this process; then, in the same run, the
/// round trip of the PIO mailbox alone between two threads for the same
/// bytes. The `results` of its report.
///
/// ```text
///  session ──ring──▶ engine ──KernelPort──PIO mailbox / FPGA Connect──▶ kernel thread (echo)
///          ◀─ring─── (thread) ◀──────────────────────────────────────── answers
///  mailbox alone:  thread A ──slot──▶ thread B ──slot──▶ thread A
/// ```
pub fn run_kernel_rtt(cfg: &KernelRttConfig) -> Result<Value, BenchError> {
    if cfg.size > Message::MAX_PAYLOAD {
        return Err(BenchError::Config(format!(
            "--size: {} bytes; one message carries at most {}",
            cfg.size,
            Message::MAX_PAYLOAD
        )));
    }
    let dir = scratch_dir("devices-kernel")?;
    let result = measure_kernel(cfg, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure_kernel(cfg: &KernelRttConfig, dir: &Path) -> Result<Value, BenchError> {
    use crate::hist::LatencyHistogram;
    use crate::path::WaitMode;
    let (engine, kernel) = match cfg.wait {
        WaitMode::Busy => ("busy-poll", "busy"),
        WaitMode::Park => ("spin-then-park", "park"),
    };
    let text = format!(
        "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n\n\
         [engine]\nmode = \"{engine}\"\n\n\
         [[devices]]\nname = \"kernel\"\nkind = \"kernel\"\ndevice = {MEASURED}\n\
         backend = \"emulated\"\nfunction = \"echo\"\nwait = \"{kernel}\"\n\n\
         [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = {INLINE_ECHO}\n\n\
         [[devices]]\nname = \"kmem\"\nkind = \"kernel\"\ndevice = {KERNEL_MEMORY}\n\
         backend = \"emulated\"\nfunction = \"sum32-memory\"\nmemory = {DMA_BYTES}\n"
    );
    let mut config = uniplane_services::Config::parse(&text, "devices")
        .map_err(|e| BenchError::Config(format!("the daemon's configuration: {e}")))?;
    config.runtime_dir = Some(dir.to_owned());
    let threshold = config.devices[0].kernel.map_or(0, |k| k.pio_threshold);
    let rt = daemon_runtime()?;
    let (hist, echo_hist, counters, one_sided) = rt.block_on(async {
        let (_daemon, client) = uniplane_services::client::embedded(config, dir)
            .await
            .map_err(|e| BenchError::Config(format!("the daemon: {e}")))?;
        let session = crate::path::session(dir, "devices-kernel", cfg.wait).await?;
        let payload = Bytes::from(pattern(cfg.size));
        let mut hists = Vec::new();
        for device in [MEASURED, INLINE_ECHO] {
            let target =
                uniplane_dataplane::Uid::new(std::net::Ipv4Addr::LOCALHOST, device).port(7);
            let mut conn = session.connect(target).await.map_err(client_err)?;
            let mut hist = LatencyHistogram::new();
            let warm = cfg.count.min(1000);
            for i in 0..warm + cfg.count {
                let t0 = Instant::now();
                conn.send_bytes(payload.clone()).await.map_err(client_err)?;
                let back = tokio::time::timeout(
                    Duration::from_secs(5),
                    crate::path::recv(&mut conn, cfg.wait),
                )
                .await
                .map_err(|_| BenchError::Config("the device did not answer in 5 s".into()))??;
                let rtt = t0.elapsed();
                if back.len() != cfg.size {
                    return Err(BenchError::Config(format!(
                        "the device answered {} bytes to {}",
                        back.len(),
                        cfg.size
                    )));
                }
                if i >= warm {
                    hist.record(rtt.as_nanos() as u64);
                }
            }
            hists.push(hist);
        }
        let echo_hist = hists.pop().unwrap_or_default();
        let hist = hists.pop().unwrap_or_default();
        let one_sided = kernel_one_sided(&session).await?;
        let status = client
            .request(&uniplane_services::control::Request::Status)
            .await
            .map_err(client_err)?;
        Ok::<_, BenchError>((hist, echo_hist, status["devices"][0].clone(), one_sided))
    })?;
    drop(rt);
    let port = port_rtt(cfg)?;
    let mailbox = mailbox_rtt(cfg, threshold)?;
    let (cw, cr) = memcpy_peer(DMA_BYTES, DMA_ROUNDS);
    let modes = dma_modes()?;
    Ok(json!({
        "backend": "emulated",
        "function": "echo",
        "size": cfg.size,
        "wait": cfg.wait.name(),
        "pio_threshold": threshold,
        "path": if cfg.size <= threshold { "pio" } else { "connect" },
        "round_trips": cfg.count,
        "rtt_ns": hist.percentiles(),
        "inline_echo_rtt_ns": echo_hist.percentiles(),
        "port_rtt_ns": port.percentiles(),
        "mailbox_rtt_ns": mailbox.percentiles(),
        "device_counters": counters,
        "dma": {
            "bytes": DMA_BYTES,
            "gbytes_per_sec": { "write": one_sided.0, "read": one_sided.1 },
            "memcpy_gbytes_per_sec": { "write": cw, "read": cr },
            "ratio": { "write": one_sided.0 / cw, "read": one_sided.1 / cr },
            "mode_write_ns": modes,
        },
    }))
}

/// The device number of the kernel with memory.
const KERNEL_MEMORY: u16 = 6;
/// Bytes written into (and read back from) the kernel's memory per round.
const DMA_BYTES: usize = 4 << 20;
/// Timed rounds of the one-sided figures (the median is reported).
const DMA_ROUNDS: usize = 7;
/// Transfer sizes of the per-mode sweep.
const DMA_SWEEP: [usize; 6] = [4, 256, 4096, 16384, 32768, Message::MAX_PAYLOAD];

/// `DMA_BYTES` written into the kernel's memory one-sided and read back,
/// in messages of the largest payload (as `uniplane write --file`), the
/// bytes checked: GB/s of payload each way (median of the rounds).
async fn kernel_one_sided(session: &Session) -> Result<(f64, f64), BenchError> {
    let at: MemoryAddress = format!("127.0.0.1:{KERNEL_MEMORY}@0")
        .parse()
        .map_err(|e| BenchError::Config(format!("kernel memory address: {e}")))?;
    let data = Bytes::from(pattern(DMA_BYTES));
    let mut back = vec![0u8; DMA_BYTES];
    let (mut w, mut r) = (Vec::new(), Vec::new());
    for _ in 0..DMA_ROUNDS {
        let t = Instant::now();
        transfer::write(session, at, data.clone(), Message::MAX_PAYLOAD)
            .await
            .map_err(client_err)?;
        w.push(gbytes_per_sec(DMA_BYTES, t.elapsed()));
        let t = Instant::now();
        transfer::read_into(session, at, &mut back, Message::MAX_PAYLOAD)
            .await
            .map_err(client_err)?;
        r.push(gbytes_per_sec(DMA_BYTES, t.elapsed()));
        if back != data {
            return Err(BenchError::Config(
                "the kernel's memory read back differently".into(),
            ));
        }
    }
    Ok((median(w), median(r)))
}

/// One write of each size in [`DMA_SWEEP`] through a kernel's DMA path
/// driven directly (copy into the staging, descriptors, completions), in
/// each mode: median nanoseconds, per mode and size — what the default
/// thresholds of `DmaThresholds` are set from.
fn dma_modes() -> Result<Value, BenchError> {
    use uniplane_services::config::DmaThresholds;
    use uniplane_services::devices::kernel::dma::DmaPath;
    use uniplane_shm::p2p::TransferMode;
    let mut out = serde_json::Map::new();
    for mode in TransferMode::ALL {
        // The thresholds that make `mode` the choice at every size.
        let t = |n: usize| if n == 0 { 0 } else { 1 << 16 };
        let (pull, staged, pipelined) = match mode {
            TransferMode::Push => (1, 1, 1),
            TransferMode::Pull => (0, 1, 1),
            TransferMode::Staged => (0, 0, 1),
            TransferMode::StagedPipelined => (0, 0, 0),
        };
        let thresholds = DmaThresholds {
            pull_from: t(pull),
            staged_from: t(staged),
            pipelined_from: t(pipelined),
        };
        let mut path = DmaPath::new("bench", 1 << 20, thresholds, Duration::from_secs(5))
            .map_err(BenchError::Config)?;
        let mut row = serde_json::Map::new();
        for size in DMA_SWEEP {
            let data = pattern(size);
            let mut ns = Vec::new();
            for i in 0..2000 {
                let t0 = Instant::now();
                path.start(0, size, Some(&data));
                let deadline = t0 + Duration::from_secs(5);
                loop {
                    match path.poll() {
                        Some((_, Ok(()))) => break,
                        Some((_, Err(e))) => {
                            return Err(BenchError::Config(format!("{mode}: {e}")))
                        }
                        None if Instant::now() > deadline => {
                            return Err(BenchError::Config(format!("{mode}: no completion")))
                        }
                        // Yield: the engine's thread may share this core.
                        None => std::thread::yield_now(),
                    }
                }
                if i >= 500 {
                    ns.push(t0.elapsed().as_nanos() as f64);
                }
            }
            row.insert(size.to_string(), json!(median(ns)));
        }
        out.insert(mode.name().to_owned(), Value::Object(row));
    }
    Ok(Value::Object(out))
}

/// Round trips through a kernel device's host end driven directly from
/// this thread, as the engine drives it (push, flush, pop): the emulated
/// path and the kernel thread without the engine and the client library.
fn port_rtt(cfg: &KernelRttConfig) -> Result<crate::hist::LatencyHistogram, BenchError> {
    use uniplane_dataplane::PortIo;
    use uniplane_services::config::{KernelDeviceConfig, KernelFunction, KernelWait};
    let config = KernelDeviceConfig {
        function: KernelFunction::Echo,
        pio_threshold: uniplane_services::config::DEFAULT_PIO_THRESHOLD,
        tokens: uniplane_services::config::DEFAULT_KERNEL_TOKENS,
        stall_timeout_ms: uniplane_services::config::DEFAULT_STALL_TIMEOUT_MS,
        wait: match cfg.wait {
            crate::path::WaitMode::Busy => KernelWait::Busy,
            crate::path::WaitMode::Park => KernelWait::Park,
        },
        memory: 0,
        dma: uniplane_services::config::DmaThresholds::default(),
    };
    let (mut port, _shared) = uniplane_services::devices::kernel::open("bench", config)
        .map_err(|e| BenchError::Config(e.to_string()))?;
    let local = uniplane_dataplane::Uid::new(std::net::Ipv4Addr::LOCALHOST, 9);
    let kernel = uniplane_dataplane::Uid::new(std::net::Ipv4Addr::LOCALHOST, MEASURED);
    let m = Message::send(
        local.port(5),
        kernel.port(7),
        Bytes::from(pattern(cfg.size)),
    )
    .map_err(|e| BenchError::Config(e.to_string()))?;
    let total = cfg.count + cfg.count.min(1000);
    let mut hist = crate::hist::LatencyHistogram::new();
    for i in 0..total {
        let t0 = Instant::now();
        if port.push(m.clone()).is_err() {
            return Err(BenchError::Config(
                "the kernel port refused a message".into(),
            ));
        }
        port.flush();
        let deadline = t0 + Duration::from_secs(5);
        loop {
            if port.pop().is_some() {
                break;
            }
            if Instant::now() > deadline {
                return Err(BenchError::Config(
                    "the kernel did not answer in 5 s".into(),
                ));
            }
            port.release();
            std::hint::spin_loop();
        }
        if i >= total - cfg.count {
            hist.record(t0.elapsed().as_nanos() as u64);
        }
    }
    Ok(hist)
}

/// Round trips of `cfg.size` bytes through a PIO mailbox alone, between
/// this thread and an echoing one, slots as a kernel device of
/// `threshold` has.
fn mailbox_rtt(
    cfg: &KernelRttConfig,
    threshold: usize,
) -> Result<crate::hist::LatencyHistogram, BenchError> {
    use uniplane_shm::mailbox::{MailboxRegion, Side, WaitPolicy};
    let fail = |e: &dyn std::fmt::Display| BenchError::Config(format!("mailbox: {e}"));
    let policy = match cfg.wait {
        crate::path::WaitMode::Busy => WaitPolicy::BusyPoll,
        crate::path::WaitMode::Park => WaitPolicy::default(),
    };
    let slot = (threshold + 20).div_ceil(128) * 128;
    let region = MailboxRegion::create(1, slot).map_err(|e| fail(&e))?;
    let (mut tx, mut rx) = region
        .endpoint(0, Side::A, policy)
        .ok_or_else(|| fail(&"no endpoint"))?;
    let (mut echo_tx, mut echo_rx) = region
        .endpoint(0, Side::B, policy)
        .ok_or_else(|| fail(&"no endpoint"))?;
    let total = cfg.count + cfg.count.min(1000);
    let echo = std::thread::Builder::new()
        .name("mailbox-echo".into())
        .spawn(move || {
            let mut buf = Vec::new();
            for _ in 0..total {
                if echo_rx.recv(&mut buf).is_err() || echo_tx.send(&buf).is_err() {
                    return;
                }
            }
        })
        .map_err(|source| BenchError::Thread {
            what: "mailbox echo",
            source,
        })?;
    let payload = pattern(cfg.size);
    let mut back = Vec::new();
    let mut hist = crate::hist::LatencyHistogram::new();
    for i in 0..total {
        let t0 = Instant::now();
        tx.send(&payload).map_err(|e| fail(&e))?;
        rx.recv(&mut back).map_err(|e| fail(&e))?;
        if i >= total - cfg.count {
            hist.record(t0.elapsed().as_nanos() as u64);
        }
    }
    let _ = echo.join();
    Ok(hist)
}
