//! `scale`: how the engine's cost grows with ports, installed connections
//! and message size, and what an installed connection costs in memory.
//!
//! Every point is a `fabric`-style run of the single engine stepped on
//! this thread and timed by its CPU time (so the figure is the engine's,
//! not the generators'):
//!
//! - **ports** 4 → 64, uniform traffic of 64 B (every port to every other);
//! - **connections** 1 → 100,000: one input whose table holds that many
//!   exact routes and whose access control holds that many connections,
//!   traffic spread over up to 4,096 of them (so lookups miss the cache
//!   as a large table does); the heap bytes the entries took, from the
//!   allocator's own count (`mallinfo2`), divided by their number;
//! - **size** 64 B → 64 KiB, four ports to one.

use std::net::Ipv4Addr;

use bytes::Bytes;
use serde_json::{json, Value};
use uniplane_dataplane::{Message, Uid};
use uniplane_overlay::acl::{AclRule, ConnKey};
use uniplane_overlay::table::Route;
use uniplane_overlay::{Engine, EngineConfig, ForwardingPlane, PortSpec};

use crate::fabric::{drive, run_fabric, Matrix};
use crate::BenchError;

/// The points of each sweep.
#[derive(Clone, Debug)]
pub struct ScaleConfig {
    /// Port counts (uniform traffic).
    pub ports: Vec<usize>,
    /// Installed connections.
    pub connections: Vec<usize>,
    /// Payload sizes (all to one).
    pub sizes: Vec<usize>,
    /// Seconds per point.
    pub seconds: f64,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        ScaleConfig {
            ports: vec![4, 8, 16, 32, 64],
            connections: vec![1, 10, 100, 1_000, 10_000, 100_000],
            sizes: vec![64, 256, 1024, 4096, 16384, Message::MAX_PAYLOAD],
            seconds: 0.5,
        }
    }
}

/// Destinations the connection sweep sends to, at most.
const SPREAD: usize = 4096;

/// Heap bytes in use, by the allocator's count.
fn heap_bytes() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let m = unsafe { libc::mallinfo2() };
        (m.uordblks + m.hblkhd) as u64
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        0
    }
}

/// The `k`-th installed connection's destination: a UID of its own
/// (server 10.x.y.z, device 2).
fn entry_uid(k: usize) -> Uid {
    Uid::new(Ipv4Addr::from(0x0a00_0000 | k as u32), 2)
}

fn point(what: &str, x: usize, r: &Value) -> Value {
    let msgs = r["msgs_per_sec"].as_f64().unwrap_or(0.0);
    json!({
        what: x,
        "msgs_per_sec": msgs,
        "ns_per_msg": if msgs > 0.0 { 1e9 / msgs } else { 0.0 },
        "delivered": r["delivered"],
    })
}

/// One input (port 0) with `n` routes and `n` connections installed,
/// sending to port 1 over up to [`SPREAD`] of them.
fn connections_point(n: usize, seconds: f64) -> Result<(Value, f64), BenchError> {
    let plane = |e: uniplane_overlay::PlaneError| BenchError::Config(e.to_string());
    let mut e = Engine::new(EngineConfig {
        max_ports: 2,
        burst: 64,
        voq_depth: 256,
        ring_depth: 1024,
        table_capacity: n.max(1) + 1,
        ..EngineConfig::default()
    });
    let (_, a) = e.attach(PortSpec::app("in")).map_err(plane)?;
    let (_, b) = e.attach(PortSpec::app("out")).map_err(plane)?;
    let src = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
    let message = |k: usize| {
        Message::send(src, entry_uid(k).port(2), Bytes::from(vec![0u8; 64]))
            .map_err(|e| BenchError::Config(e.to_string()))
    };
    let before = heap_bytes();
    for k in 0..n {
        e.add_route(0, Route::exact(entry_uid(k), 1))
            .map_err(plane)?;
        e.allow_connection(0, ConnKey::of(message(k)?.header()))
            .map_err(plane)?;
    }
    let per_entry = heap_bytes().saturating_sub(before) as f64 / n.max(1) as f64;
    e.add_acl_rule(1, AclRule::ALLOW_ALL).map_err(plane)?;
    let spread = n.clamp(1, SPREAD);
    let stride = (n / spread).max(1);
    let script: Vec<Message> = (0..spread)
        .map(|i| message(i * stride))
        .collect::<Result<_, _>>()?;
    let mut links = [a, b];
    let r = drive(&mut e, &mut links, &[script, Vec::new()], &[1], 64, seconds)?;
    Ok((r, per_entry))
}

/// Runs the three sweeps; see the module documentation.
pub fn run_scale(cfg: &ScaleConfig) -> Result<Value, BenchError> {
    let mut ports = Vec::new();
    for &p in &cfg.ports {
        let r = run_fabric(p, Matrix::Uniform, 64, cfg.seconds)?;
        ports.push(point("ports", p, &r));
    }
    let mut connections = Vec::new();
    for &n in &cfg.connections {
        let (r, per_entry) = connections_point(n, cfg.seconds)?;
        let mut p = point("connections", n, &r);
        p["heap_bytes_per_connection"] = json!(per_entry);
        connections.push(p);
    }
    let mut sizes = Vec::new();
    for &s in &cfg.sizes {
        let r = run_fabric(4, Matrix::AllToOne, s, cfg.seconds)?;
        let mut p = point("size", s, &r);
        p["gbytes_per_sec"] = r["gbytes_per_sec"].clone();
        sizes.push(p);
    }
    let largest = connections
        .iter()
        .max_by_key(|p| p["connections"].as_u64().unwrap_or(0))
        .map_or(Value::Null, |p| p["heap_bytes_per_connection"].clone());
    Ok(json!({
        "ports": ports,
        "connections": connections,
        "sizes": sizes,
        "heap_bytes_per_connection": largest,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_sweep_measures_every_point_and_the_memory_of_an_entry() {
        let r = run_scale(&ScaleConfig {
            ports: vec![4],
            connections: vec![1, 5_000],
            sizes: vec![64],
            seconds: 0.05,
        })
        .unwrap();
        for sweep in ["ports", "connections", "sizes"] {
            for p in r[sweep].as_array().unwrap() {
                assert!(p["delivered"].as_u64().unwrap() > 0, "{sweep}: {p}");
                assert!(p["ns_per_msg"].as_f64().unwrap() > 0.0, "{sweep}: {p}");
            }
        }
        // 5,000 routes and connections take some heap, and not absurdly
        // much: a few hundred bytes each at most.
        let per = r["heap_bytes_per_connection"].as_f64().unwrap();
        assert!((8.0..4096.0).contains(&per), "{per} B per connection");
    }
}
