//! What the daemon shows: status and listings read from the core, port
//! counters read from the plane, Prometheus metrics, and the policy text
//! the CLI sets.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uniplane_control::{PlaneOp, ResourceKind};
use uniplane_overlay::{PortCounters, PortId};

use super::driver::Driver;
use super::Shared;
use crate::control::Answer;
use uniplane_dataplane::wire::ReqType;
use uniplane_overlay::acl::{ConnKey, TypeSet};
use uniplane_overlay::PlaneReply;

pub(super) fn status(d: &Driver) -> serde_json::Value {
    let shared = &d.shared;
    let core = &d.core;
    let peers: Vec<_> = core
        .peers()
        .into_iter()
        .map(|p| {
            let conf = shared.peer(p.server);
            let address = conf.as_ref().map(|c| c.address.to_string());
            let underlay = d
                .underlay_counters()
                .into_iter()
                .find(|(s, _)| *s == p.server)
                .map(|(_, c)| underlay_json(&c));
            let tunnels: Vec<_> = p
                .tunnels
                .iter()
                .map(|(class, port)| {
                    let stack = conf.as_ref().map(|c| c.tunnel_of(*class).0);
                    json!({ "class": class, "port": port, "stack": stack })
                })
                .collect();
            // The largest payload its tunnels carry (the smallest of its
            // stacks', as the core has it).
            let tunnel_mtu = conf.as_ref().and_then(|c| {
                std::iter::once(&c.stack)
                    .chain(c.pins.iter().map(|x| &x.stack))
                    .filter_map(|name| shared.stacks.iter().find(|s| s.name() == name))
                    .map(|s| super::tunnel_mtu(s.as_ref()))
                    .min()
            });
            json!({
                "server": p.server.to_string(), "address": address,
                "tunnel_mtu": tunnel_mtu,
                "alive": p.alive, "failures": p.failures,
                "tunnels": tunnels,
                "underlay": underlay,
            })
        })
        .collect();
    json!({
        "server": shared.server.to_string(),
        "name": shared.config.name,
        "uid": shared.uid().to_string(),
        "uptime_s": shared.started.elapsed().as_secs_f64(),
        "runtime_dir": shared.runtime.display().to_string(),
        "resources": core.resources().count(),
        "connections": core.connections().count(),
        "stacks": shared.stacks.iter().map(|s| s.name()).collect::<Vec<_>>(),
        "plane": shared.plane.kind(),
        "engine": { "shards": shared.config.shards, "cpus": shared.config.cpus },
        "peers": peers,
        "devices": devices_json(shared),
        "classes": classes_json(&d.underlay),
    })
}

/// The configured devices, with each GPU memory device's state and copies.
fn devices_json(shared: &super::Shared) -> serde_json::Value {
    use crate::config::MemoryBackend;
    json!(shared
        .config
        .devices
        .iter()
        .map(|d| {
            let mut v = json!({
                "name": d.name,
                "kind": format!("{:?}", d.kind).to_lowercase(),
                "memory": d.memory,
                "backend": match d.backend { MemoryBackend::Host => "host", MemoryBackend::Gpu(_) => "gpu" },
                "state": "up",
            });
            if let MemoryBackend::Gpu(g) = d.backend {
                v["gpu"] = json!(g.ordinal);
                v["transfer"] = json!(g.transfer.name());
                v["direct_from"] = json!(g.direct_from);
                if let Some((_, stats)) = shared.gpu_stats.iter().find(|(n, _)| *n == d.name) {
                    if let (Some(v), serde_json::Value::Object(s)) = (v.as_object_mut(), stats.json()) {
                        v.extend(s);
                    }
                }
            }
            v
        })
        .collect::<Vec<_>>())
}

/// A peer's underlay counters.
fn underlay_json(c: &super::underlay::Counters) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    let dropped: serde_json::Map<String, serde_json::Value> = uniplane_underlay::Reason::ALL
        .iter()
        .zip(&c.dropped)
        .map(|(r, n)| (r.name().to_string(), json!(n.load(Relaxed))))
        .collect();
    json!({
        "tunnels": c.tunnels.load(Relaxed),
        "sent": c.sent.load(Relaxed),
        "sent_bytes": c.sent_bytes.load(Relaxed),
        "backlog": c.backlog.load(Relaxed),
        "passed": c.passed.load(Relaxed),
        "dropped": dropped,
        "dropped_total": c.dropped_total(),
        "lost_reports": c.lost_reports.load(Relaxed),
    })
}

/// The classes and how they share the peers' tunnels.
pub(super) fn classes_json(u: &crate::config::UnderlayConfig) -> serde_json::Value {
    json!({
        "scheduling": format!("{:?}", u.scheduling).to_lowercase(),
        "rate_bytes_per_sec": u.rate,
        "burst_bytes": u.burst,
        "queue_depth": u.queue_depth,
        "classes": u.classes.iter().map(|c| json!({
            "id": c.id, "name": c.name, "weight": c.weight, "priority": c.priority,
        })).collect::<Vec<_>>(),
    })
}

pub(super) fn resources(d: &Driver) -> serde_json::Value {
    json!(d
        .core
        .resources()
        .map(|r| json!({
            "device": r.uid.device(), "uid": r.uid.to_string(), "name": r.name,
            "kind": match &r.kind {
                ResourceKind::Daemon => "daemon".to_string(),
                ResourceKind::Process => "process".to_string(),
                ResourceKind::Device { label, .. } => label.clone(),
            },
            "port": r.port,
            "listening": r.listening.iter().collect::<Vec<_>>(),
        }))
        .collect::<Vec<_>>())
}

/// The interconnection table (DUA Fig. 5).
pub(super) fn routes(d: &Driver) -> serde_json::Value {
    json!(d
        .core
        .routes()
        .into_iter()
        .map(|r| json!({ "from": r.from, "to": r.to, "via": r.via, "stack": r.stack, "hops": r.hops }))
        .collect::<Vec<_>>())
}

pub(super) fn connections(d: &Driver) -> serde_json::Value {
    let now = d.now();
    json!(d
        .core
        .connections()
        .map(|c| json!({
            "src": c.key.src.to_string(), "src_port": c.key.src_port,
            "dst": c.key.dst.to_string(), "dst_port": c.key.dst_port,
            "class": c.class, "peer": c.peer.map(|p| p.to_string()),
            "age_s": now.saturating_sub(c.since).as_secs_f64(),
        }))
        .collect::<Vec<_>>())
}

/// Every port the daemon owns, named for counters.
fn ports(d: &Driver) -> Vec<(String, PortId)> {
    let core = &d.core;
    core.resources()
        .map(|r| (r.name.clone(), r.port))
        .chain(core.peers().into_iter().flat_map(|p| {
            p.tunnels
                .into_iter()
                .map(move |(c, t)| (format!("tunnel-{}-class{c}", p.server), t))
        }))
        .chain(
            core.inbound_tunnels()
                .into_iter()
                .map(|t| (format!("from-{}-class{}", t.from, t.class), t.port)),
        )
        .collect()
}

/// Reads the counters of `ports` in one batch; ports the plane no longer
/// has are left out.
async fn counters(
    shared: &Shared,
    ports: Vec<(String, PortId)>,
) -> Vec<(String, PortId, PortCounters)> {
    let ops = ports.iter().map(|(_, p)| PlaneOp::Counters(*p)).collect();
    let Ok(replies) = shared.plane.submit(ops).await else {
        return Vec::new();
    };
    ports
        .into_iter()
        .zip(replies)
        .filter_map(|((n, p), r)| match r {
            Ok(PlaneReply::Counters(c)) => Some((n, p, c)),
            _ => None,
        })
        .collect()
}

pub(super) async fn tables(shared: &Shared, device: u16) -> Answer {
    let port = shared
        .inspect(move |d| d.core.resource(device).map(|r| r.port))
        .await
        .flatten();
    let Some(port) = port else {
        return Answer::err("not-found", format!("no device {device}"));
    };
    match counters(shared, vec![(String::new(), port)]).await.pop() {
        Some((_, _, c)) => {
            Answer::ok(json!({ "device": device, "port": port, "counters": counters_json(&c) }))
        }
        None => Answer::err("engine", format!("no counters for port {port}")),
    }
}

pub(super) async fn stats(shared: &Shared) -> serde_json::Value {
    let ports = shared.inspect(ports).await.unwrap_or_default();
    json!(counters(shared, ports)
        .await
        .into_iter()
        .map(|(name, port, c)| json!({ "name": name, "port": port, "counters": counters_json(&c) }))
        .collect::<Vec<_>>())
}

/// `uniplane plane dump`: every port's tables and counters and the
/// translator, as the plane holds them (read back in one batch).
pub(super) async fn plane_dump(shared: &Shared) -> Answer {
    let Some(ports) = shared.inspect(ports).await else {
        return Answer::err("engine", "the daemon is stopping");
    };
    let mut ops: Vec<PlaneOp> = ports.iter().map(|(_, p)| PlaneOp::Dump(*p)).collect();
    ops.push(PlaneOp::Translations);
    let mut replies = match shared.plane.submit(ops).await {
        Ok(r) => r,
        Err(e) => return Answer::err("engine", e.to_string()),
    };
    let translations = match replies.pop() {
        Some(Ok(PlaneReply::Translations(t))) => t
            .iter()
            .map(|(c, out)| json!({ "conn": conn_json(c), "port": out }))
            .collect::<Vec<_>>(),
        Some(Err(e)) => return Answer::err("engine", e.to_string()),
        _ => Vec::new(),
    };
    let rows: Vec<serde_json::Value> = ports
        .into_iter()
        .zip(replies)
        .map(|((name, port), r)| match r {
            Ok(PlaneReply::Dump(d)) => json!({
                "name": name,
                "port": port,
                "plane_name": d.name,
                "kind": d.kind.map(|k| format!("{k:?}")),
                "routes": d.routes.iter().map(|r| json!({
                    "key": r.key.to_string(), "mask": format!("{:#014x}", r.mask),
                    "priority": r.priority, "port": r.port,
                })).collect::<Vec<_>>(),
                "default_route": d.default_route,
                "connections": d.connections.iter().map(conn_json).collect::<Vec<_>>(),
                "rules": d.rules.iter().map(|r| json!({
                    "src": r.src.to_string(), "src_mask": format!("{:#014x}", r.src_mask),
                    "dst": r.dst.to_string(), "dst_mask": format!("{:#014x}", r.dst_mask),
                    "types": if r.types == TypeSet::ALL { vec!["all".to_string()] } else {
                        ReqType::ALL.iter().filter(|t| r.types.contains(**t))
                            .map(|t| format!("{t:?}")).collect::<Vec<_>>()
                    },
                    "allow": r.allow,
                })).collect::<Vec<_>>(),
                "policy": d.policy.as_ref().map(|p| format!("{p:?}")),
                "counters": counters_json(&d.counters),
            }),
            Ok(_) => json!({ "name": name, "port": port, "error": "unexpected reply" }),
            Err(e) => json!({ "name": name, "port": port, "error": e.to_string() }),
        })
        .collect();
    Answer::ok(json!({
        "plane": shared.plane.kind(),
        "ports": rows,
        "translations": translations,
    }))
}

fn conn_json(c: &ConnKey) -> serde_json::Value {
    json!({
        "src": c.src.to_string(), "src_port": c.src_port,
        "dst": c.dst.to_string(), "dst_port": c.dst_port,
    })
}

/// A Prometheus counter family: name, help, and how to read it.
type CounterFamily = (&'static str, &'static str, fn(&PortCounters) -> u64);

const FAMILIES: [CounterFamily; 8] = [
    (
        "uniplane_port_rx_messages_total",
        "Messages read from the port",
        |c| c.rx_msgs,
    ),
    (
        "uniplane_port_rx_bytes_total",
        "Payload bytes read from the port",
        |c| c.rx_bytes,
    ),
    (
        "uniplane_port_tx_messages_total",
        "Messages written to the port",
        |c| c.tx_msgs,
    ),
    (
        "uniplane_port_tx_bytes_total",
        "Payload bytes written to the port",
        |c| c.tx_bytes,
    ),
    (
        "uniplane_port_acl_denied_total",
        "Messages refused by access control",
        |c| c.acl_denied,
    ),
    (
        "uniplane_port_no_route_total",
        "Messages with no route",
        |c| c.no_route,
    ),
    (
        "uniplane_port_input_stalls_total",
        "Times the input waited for a full queue",
        |c| c.input_stalls,
    ),
    (
        "uniplane_port_segments_total",
        "Segments created for the MTU",
        |c| c.segments,
    ),
];

/// Every counter in Prometheus text exposition format.
pub(super) async fn metrics_text(shared: &Shared) -> String {
    let snapshot = shared
        .inspect(|d| {
            let mut gauges = String::new();
            gauges.push_str(
                "# HELP uniplane_connections Open connections\n# TYPE uniplane_connections gauge\n",
            );
            gauges.push_str(&format!("uniplane_connections {}\n", d.core.connections().count()));
            gauges.push_str("# HELP uniplane_connect_seconds Time to set up a connection\n# TYPE uniplane_connect_seconds histogram\n");
            for (h, path) in d.setup.iter().zip(["local", "remote"]) {
                h.write(&mut gauges, "uniplane_connect_seconds", &format!("path=\"{path}\""));
            }
            gauges.push_str("# HELP uniplane_peer_up Whether a peer daemon is reachable\n# TYPE uniplane_peer_up gauge\n");
            for p in d.core.peers() {
                gauges.push_str(&format!(
                    "uniplane_peer_up{{server=\"{}\"}} {}\n",
                    p.server,
                    u8::from(p.alive)
                ));
            }
            underlay_metrics(&mut gauges, &d.underlay_counters());
            (ports(d), gauges)
        })
        .await;
    let Some((ports, gauges)) = snapshot else {
        return String::new();
    };
    let counters = counters(shared, ports).await;
    let mut out = String::new();
    for (name, help, get) in FAMILIES {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for (port_name, port, c) in &counters {
            out.push_str(&format!(
                "{name}{{port=\"{port}\",name=\"{port_name}\"}} {}\n",
                get(c)
            ));
        }
    }
    out.push_str(&gauges);
    for (name, help, value) in shared.security.metrics() {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
        ));
    }
    out
}

/// Each peer's underlay counters in Prometheus text.
fn underlay_metrics(
    out: &mut String,
    peers: &[(std::net::Ipv4Addr, Arc<super::underlay::Counters>)],
) {
    use std::sync::atomic::Ordering::Relaxed;
    type Family = (
        &'static str,
        &'static str,
        &'static str,
        fn(&super::underlay::Counters) -> u64,
    );
    const FAMILIES: [Family; 5] = [
        (
            "uniplane_underlay_sent_messages_total",
            "counter",
            "Messages the underlay let leave for a peer",
            |c| c.sent.load(Relaxed),
        ),
        (
            "uniplane_underlay_sent_bytes_total",
            "counter",
            "Bytes the underlay let leave for a peer",
            |c| c.sent_bytes.load(Relaxed),
        ),
        (
            "uniplane_underlay_passed_total",
            "counter",
            "Messages from a peer that passed the filter",
            |c| c.passed.load(Relaxed),
        ),
        (
            "uniplane_underlay_backlog",
            "gauge",
            "Messages waiting in a peer's class queues",
            |c| c.backlog.load(Relaxed),
        ),
        (
            "uniplane_underlay_lost_reports_total",
            "counter",
            "Violations the control core was not told of (its queue was full)",
            |c| c.lost_reports.load(Relaxed),
        ),
    ];
    for (name, kind, help, get) in FAMILIES {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (server, c) in peers {
            out.push_str(&format!("{name}{{server=\"{server}\"}} {}\n", get(c)));
        }
    }
    let name = "uniplane_underlay_dropped_total";
    out.push_str(&format!(
        "# HELP {name} Messages from a peer the filter dropped, by the rule broken\n# TYPE {name} counter\n"
    ));
    for (server, c) in peers {
        for (reason, n) in uniplane_underlay::Reason::ALL.iter().zip(&c.dropped) {
            out.push_str(&format!(
                "{name}{{server=\"{server}\",reason=\"{}\"}} {}\n",
                reason.name(),
                n.load(Relaxed)
            ));
        }
    }
}

pub(super) async fn serve_metrics(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let body = metrics_text(&shared).await;
            let mut req = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut req)).await;
            let head = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        });
    }
}

/// A Prometheus histogram with fixed buckets, in seconds.
#[derive(Clone, Debug, Default)]
pub(super) struct SetupHistogram {
    counts: [u64; SETUP_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Upper bounds of the connection-setup buckets, in seconds.
const SETUP_BUCKETS: [f64; 10] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0,
];

impl SetupHistogram {
    pub(super) fn record(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, bound) in SETUP_BUCKETS.iter().enumerate() {
            if s <= *bound {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += s;
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        for (bound, n) in SETUP_BUCKETS.iter().zip(self.counts) {
            out.push_str(&format!("{name}_bucket{{{labels},le=\"{bound}\"}} {n}\n"));
        }
        out.push_str(&format!(
            "{name}_bucket{{{labels},le=\"+Inf\"}} {}\n",
            self.count
        ));
        out.push_str(&format!(
            "{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {}\n",
            self.sum, self.count
        ));
    }
}

fn counters_json(c: &PortCounters) -> serde_json::Value {
    json!({
        "rx_msgs": c.rx_msgs, "rx_bytes": c.rx_bytes, "tx_msgs": c.tx_msgs, "tx_bytes": c.tx_bytes,
        "acl_denied": c.acl_denied, "no_route": c.no_route, "error_answers": c.error_answers,
        "unanswerable": c.unanswerable, "segments": c.segments, "input_stalls": c.input_stalls,
        "reassembled": c.reassembly.completed, "reassembly_incomplete": c.reassembly.incomplete,
    })
}

/// Parses `rr`, `weighted:W0:W1:…` or `strict:C0/W0,C1/W1,…`.
pub fn parse_policy(text: &str) -> Result<uniplane_dataplane::sched::Policy, String> {
    use uniplane_dataplane::sched::Policy;
    let bad = || format!("`{text}` is not a policy: rr, weighted:1:2:… or strict:0/1,1/1,…");
    if text == "rr" {
        return Ok(Policy::RoundRobin);
    }
    if let Some(w) = text.strip_prefix("weighted:") {
        let weights: Result<Vec<u32>, _> = w.split(':').map(str::parse).collect();
        return weights.map(Policy::Weighted).map_err(|_| bad());
    }
    if let Some(s) = text.strip_prefix("strict:") {
        let mut class = Vec::new();
        let mut weights = Vec::new();
        for item in s.split(',') {
            let (c, w) = item.split_once('/').ok_or_else(bad)?;
            class.push(c.parse().map_err(|_| bad())?);
            weights.push(w.parse().map_err(|_| bad())?);
        }
        return Ok(Policy::StrictPriority { class, weights });
    }
    Err(bad())
}
