//! What the daemon shows: status and listings read from the core, port
//! counters read from the plane, Prometheus metrics, and the policy text
//! the CLI sets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::net::TcpListener;
use uniplane_control::{PlaneOp, ResourceKind};
use uniplane_overlay::{PortCounters, PortId};

use super::driver::Driver;
use super::Shared;
use crate::control::Answer;
use uniplane_dataplane::wire::ReqType;
use uniplane_overlay::acl::{ConnCounters, ConnKey, TypeSet};
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
                "backend": match (d.kernel, d.backend) {
                    (Some(_), _) => d.kernel_backend.name(),
                    (None, MemoryBackend::Host) => "host",
                    (None, MemoryBackend::Gpu(_)) => "gpu",
                },
                "state": "up",
            });
            if let Some((_, port)) =
                crate::plane::rtl_kernels(&shared.config).find(|(k, _)| k.name == d.name)
            {
                v["function"] = json!(d.kernel.map(|k| k.function.name()));
                v["port"] = json!(port);
            }
            if let Some((_, k)) = shared.kernels.iter().find(|(n, _)| *n == d.name) {
                if let (Some(v), serde_json::Value::Object(s)) = (v.as_object_mut(), k.json()) {
                    v.extend(s);
                }
            }
            if let Some(region) = shared.host_region(&d.name) {
                v["mappings"] = json!(region.grants());
                v["taken_back"] = json!(region.moves());
            }
            if let MemoryBackend::Gpu(g) = d.backend {
                v["gpu"] = json!(g.ordinal);
                v["transfer"] = json!(g.transfer.name());
                v["direct_from"] = json!(g.direct_from);
                if let Some((_, stats)) = shared.gpu_stats.iter().find(|(n, _)| *n == d.name) {
                    if let (Some(v), serde_json::Value::Object(s)) =
                        (v.as_object_mut(), stats.json())
                    {
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

/// An open connection as the listings show it: key, class, peer, age.
type OpenConnection = (ConnKey, u8, Option<std::net::Ipv4Addr>, Duration);

/// The open connections, the longest open first, and the ports to read
/// their counters from.
fn open_connections(d: &Driver) -> (Vec<OpenConnection>, Vec<(String, PortId)>) {
    let now = d.now();
    let mut open: Vec<OpenConnection> = d
        .core
        .connections()
        .map(|c| (c.key, c.class, c.peer, now.saturating_sub(c.since)))
        .collect();
    open.sort_by_key(|c| std::cmp::Reverse(c.3));
    (open, ports(d))
}

/// What each connection direction carried into this server's plane: the
/// counters of every port it is admitted at, added up (a message enters
/// the plane once, through one port). `None` when the plane keeps no
/// per-connection counters (the RTL plane).
async fn carried(
    shared: &Shared,
    ports: &[(String, PortId)],
) -> Option<HashMap<ConnKey, ConnCounters>> {
    let ops = ports
        .iter()
        .map(|(_, p)| PlaneOp::ConnCounters(*p))
        .collect();
    let replies = shared.plane.submit(ops).await.ok()?;
    let mut sum: HashMap<ConnKey, ConnCounters> = HashMap::new();
    let mut kept = false;
    for reply in replies {
        // A port detached since the listing answers an error: skipped.
        if let Ok(PlaneReply::ConnCounters(list)) = reply {
            kept = true;
            for (key, c) in list {
                let e = sum.entry(key).or_default();
                e.msgs += c.msgs;
                e.bytes += c.bytes;
            }
        }
    }
    kept.then_some(sum)
}

/// `uniplane connections`: every open connection with what it carried
/// each way (`src_to_dst_messages`, `src_to_dst_bytes`,
/// `dst_to_src_messages`, `dst_to_src_bytes`; absent where the plane
/// keeps no per-connection counters). `None` when the daemon is stopping.
pub(super) async fn connections(shared: &Shared) -> Option<serde_json::Value> {
    let (open, ports) = shared.inspect(open_connections).await?;
    let carried = carried(shared, &ports).await;
    Some(json!(open
        .iter()
        .map(|(key, class, peer, age)| {
            let mut v = json!({
                "src": key.src.to_string(), "src_port": key.src_port,
                "dst": key.dst.to_string(), "dst_port": key.dst_port,
                "class": class, "peer": peer.map(|p| p.to_string()),
                "age_s": age.as_secs_f64(),
            });
            if let Some(c) = &carried {
                let there = c.get(key).copied().unwrap_or_default();
                let back = c.get(&key.reversed()).copied().unwrap_or_default();
                v["src_to_dst_messages"] = json!(there.msgs);
                v["src_to_dst_bytes"] = json!(there.bytes);
                v["dst_to_src_messages"] = json!(back.msgs);
                v["dst_to_src_bytes"] = json!(back.bytes);
            }
            v
        })
        .collect::<Vec<_>>()))
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

/// A per-port counter: name (with the `_total` Prometheus adds), help, and
/// how to read it.
type PortFamily = (&'static str, &'static str, fn(&PortCounters) -> u64);

const PORT_FAMILIES: [PortFamily; 12] = [
    (
        "uniplane_port_rx_messages_total",
        "Messages read from the port.",
        |c| c.rx_msgs,
    ),
    (
        "uniplane_port_rx_bytes_total",
        "Payload bytes read from the port.",
        |c| c.rx_bytes,
    ),
    (
        "uniplane_port_tx_messages_total",
        "Messages written to the port.",
        |c| c.tx_msgs,
    ),
    (
        "uniplane_port_tx_bytes_total",
        "Payload bytes written to the port.",
        |c| c.tx_bytes,
    ),
    (
        "uniplane_port_acl_denied_total",
        "Messages refused by the port's access control.",
        |c| c.acl_denied,
    ),
    (
        "uniplane_port_no_route_total",
        "Messages whose destination no route matched.",
        |c| c.no_route,
    ),
    (
        "uniplane_port_input_stalls_total",
        "Times the port's input waited for a full queue.",
        |c| c.input_stalls,
    ),
    (
        "uniplane_port_segments_total",
        "Segments created for messages above an output's MTU.",
        |c| c.segments,
    ),
    (
        "uniplane_port_error_answers_total",
        "Error answers sent back to the port's senders.",
        |c| c.error_answers,
    ),
    (
        "uniplane_port_unanswerable_total",
        "Refused messages that could not be answered (answers themselves).",
        |c| c.unanswerable,
    ),
    (
        "uniplane_port_reassembled_total",
        "Segmented messages reassembled for the port.",
        |c| c.reassembly.completed,
    ),
    (
        "uniplane_port_reassembly_incomplete_total",
        "Segmented messages given up before they were whole.",
        |c| c.reassembly.incomplete,
    ),
];

/// A per-connection counter: name (with `_total`), help, and how to read
/// one direction's counters.
type ConnectionFamily = (&'static str, &'static str, fn(&ConnCounters) -> u64);

const CONNECTION_FAMILIES: [ConnectionFamily; 2] = [
    (
        "uniplane_connection_messages_total",
        "Messages an open connection carried into this server's plane, by direction (a message cut into segments on the way counts once per segment on the receiving server).",
        |c| c.msgs,
    ),
    (
        "uniplane_connection_bytes_total",
        "Payload bytes an open connection carried into this server's plane, by direction.",
        |c| c.bytes,
    ),
];

/// A per-peer underlay value: name, type, help, and how to read it.
type UnderlayFamily = (
    &'static str,
    MetricType,
    &'static str,
    fn(&super::underlay::Counters) -> u64,
);

const UNDERLAY_FAMILIES: [UnderlayFamily; 6] = {
    use std::sync::atomic::Ordering::Relaxed;
    [
        (
            "uniplane_underlay_sent_messages_total",
            MetricType::Counter,
            "Messages the underlay let leave for a peer.",
            |c| c.sent.load(Relaxed),
        ),
        (
            "uniplane_underlay_sent_bytes_total",
            MetricType::Counter,
            "Bytes the underlay let leave for a peer.",
            |c| c.sent_bytes.load(Relaxed),
        ),
        (
            "uniplane_underlay_passed_total",
            MetricType::Counter,
            "Messages from a peer that passed the filter.",
            |c| c.passed.load(Relaxed),
        ),
        (
            "uniplane_underlay_backlog",
            MetricType::Gauge,
            "Messages waiting in a peer's class queues.",
            |c| c.backlog.load(Relaxed),
        ),
        (
            "uniplane_underlay_tunnels",
            MetricType::Gauge,
            "Tunnels to a peer the underlay carries now.",
            |c| c.tunnels.load(Relaxed),
        ),
        (
            "uniplane_underlay_lost_reports_total",
            MetricType::Counter,
            "Violations the control core was not told of (its queue was full).",
            |c| c.lost_reports.load(Relaxed),
        ),
    ]
};

/// One scrape: every value the daemon exports, read at one moment, and
/// encoded by `prometheus-client` as OpenMetrics text.
#[derive(Debug)]
struct Scrape {
    ports: Vec<(String, PortId, PortCounters)>,
    connections: usize,
    /// The exported connections, the longest open first: key and what
    /// it carried (src → dst, dst → src).
    flows: Vec<(ConnKey, ConnCounters, ConnCounters)>,
    /// Open connections left out of `flows` by the configured cap.
    flows_left_out: usize,
    setup: [SetupHistogram; 2],
    /// (server, reachable, failures).
    peers: Vec<(String, bool, u64)>,
    /// (server, class, port, stack) of each tunnel we opened.
    tunnels: Vec<(String, u8, PortId, String)>,
    /// (peer, class, port) of each tunnel a peer opened to us.
    inbound: Vec<(String, u8, PortId)>,
    classes: Vec<crate::config::ClassConfig>,
    underlay: Vec<(std::net::Ipv4Addr, Arc<super::underlay::Counters>)>,
    security: [(&'static str, &'static str, u64); 8],
}

/// `name` without the `_total` that the encoder appends to counters.
fn family(name: &'static str, kind: MetricType) -> &'static str {
    match kind {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    }
}

/// Encodes one value of a counter or gauge family.
fn value(e: MetricEncoder<'_>, kind: MetricType, v: u64) -> std::fmt::Result {
    match kind {
        MetricType::Counter => ConstCounter::new(v).encode(e),
        _ => ConstGauge::new(v).encode(e),
    }
}

/// Encodes a family whose members are told apart by `labels`.
fn labelled<L: EncodeLabelSet>(
    e: &mut DescriptorEncoder<'_>,
    name: &'static str,
    kind: MetricType,
    help: &str,
    members: impl IntoIterator<Item = (L, u64)>,
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(family(name, kind), help, None, kind)?;
    for (labels, v) in members {
        value(m.encode_family(&labels)?, kind, v)?;
    }
    Ok(())
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> std::fmt::Result {
        for (name, help, get) in PORT_FAMILIES {
            labelled(
                &mut e,
                name,
                MetricType::Counter,
                help,
                self.ports.iter().map(|(port_name, port, c)| {
                    (
                        [("port", port.to_string()), ("name", port_name.clone())],
                        get(c),
                    )
                }),
            )?;
        }
        let m = e.encode_descriptor(
            "uniplane_connections",
            "Open connections.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.connections as u64).encode(m)?;
        for (name, help, get) in CONNECTION_FAMILIES {
            labelled(
                &mut e,
                name,
                MetricType::Counter,
                help,
                self.flows.iter().flat_map(|(key, there, back)| {
                    [("src_to_dst", there), ("dst_to_src", back)].map(|(direction, c)| {
                        (
                            [
                                ("src", key.src.to_string()),
                                ("src_port", key.src_port.to_string()),
                                ("dst", key.dst.to_string()),
                                ("dst_port", key.dst_port.to_string()),
                                ("direction", direction.to_string()),
                            ],
                            get(c),
                        )
                    })
                }),
            )?;
        }
        let m = e.encode_descriptor(
            "uniplane_connections_unexported",
            "Open connections whose counters the metrics leave out (runtime.metrics_connections caps them; the longest open are kept).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(self.flows_left_out as u64).encode(m)?;
        let mut m = e.encode_descriptor(
            "uniplane_connect_seconds",
            "Time to set up a connection, by path (local or through a peer).",
            None,
            MetricType::Histogram,
        )?;
        for (h, path) in self.setup.iter().zip(["local", "remote"]) {
            h.encode(&mut m.encode_family(&[("path", path)])?)?;
        }
        labelled(
            &mut e,
            "uniplane_peer_up",
            MetricType::Gauge,
            "Whether a peer daemon is reachable (1) or not (0).",
            self.peers
                .iter()
                .map(|(s, up, _)| ([("server", s.as_str())], u64::from(*up))),
        )?;
        labelled(
            &mut e,
            "uniplane_peer_failures_total",
            MetricType::Counter,
            "Times a peer was declared down after being up.",
            self.peers
                .iter()
                .map(|(s, _, f)| ([("server", s.as_str())], *f)),
        )?;
        labelled(
            &mut e,
            "uniplane_tunnel_open",
            MetricType::Gauge,
            "A tunnel this daemon opened to a peer, by class, port and stack (always 1 while open).",
            self.tunnels.iter().map(|(s, class, port, stack)| {
                (
                    [
                        ("server", s.clone()),
                        ("class", class.to_string()),
                        ("port", port.to_string()),
                        ("stack", stack.clone()),
                    ],
                    1,
                )
            }),
        )?;
        labelled(
            &mut e,
            "uniplane_tunnel_inbound",
            MetricType::Gauge,
            "A tunnel a peer opened to this daemon, by class and port (always 1 while open).",
            self.inbound.iter().map(|(s, class, port)| {
                (
                    [
                        ("server", s.clone()),
                        ("class", class.to_string()),
                        ("port", port.to_string()),
                    ],
                    1,
                )
            }),
        )?;
        labelled(
            &mut e,
            "uniplane_class_weight",
            MetricType::Gauge,
            "A class's share of a peer's tunnels against the other classes'.",
            self.classes.iter().map(|c| {
                (
                    [("class", c.id.to_string()), ("name", c.name.clone())],
                    u64::from(c.weight),
                )
            }),
        )?;
        labelled(
            &mut e,
            "uniplane_class_priority",
            MetricType::Gauge,
            "A class's priority under priority scheduling (0 is served first).",
            self.classes.iter().map(|c| {
                (
                    [("class", c.id.to_string()), ("name", c.name.clone())],
                    u64::from(c.priority),
                )
            }),
        )?;
        for (name, kind, help, get) in UNDERLAY_FAMILIES {
            labelled(
                &mut e,
                name,
                kind,
                help,
                self.underlay
                    .iter()
                    .map(|(s, c)| ([("server", s.to_string())], get(c))),
            )?;
        }
        labelled(
            &mut e,
            "uniplane_underlay_dropped_total",
            MetricType::Counter,
            "Messages from a peer the filter dropped, by the rule broken.",
            self.underlay.iter().flat_map(|(s, c)| {
                uniplane_underlay::Reason::ALL
                    .iter()
                    .zip(&c.dropped)
                    .map(move |(r, n)| {
                        (
                            [("server", s.to_string()), ("reason", r.name().to_string())],
                            n.load(std::sync::atomic::Ordering::Relaxed),
                        )
                    })
            }),
        )?;
        for (name, help, v) in self.security {
            let m = e.encode_descriptor(
                family(name, MetricType::Counter),
                help,
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(v).encode(m)?;
        }
        Ok(())
    }
}

/// Every value the daemon exports, as OpenMetrics text (the format
/// Prometheus scrapes; it ends with `# EOF`).
pub(super) async fn metrics_text(shared: &Shared) -> String {
    let snapshot = shared
        .inspect(|d| {
            let conf = &d.shared.config;
            let peers = d.core.peers();
            let tunnels = peers
                .iter()
                .flat_map(|p| {
                    let stack = conf.peers.iter().find(|c| c.server == p.server);
                    p.tunnels.iter().map(move |(class, port)| {
                        let stack = stack.map_or("", |c| c.tunnel_of(*class).0);
                        (p.server.to_string(), *class, *port, stack.to_string())
                    })
                })
                .collect();
            let inbound = d
                .core
                .inbound_tunnels()
                .into_iter()
                .map(|t| (t.from.to_string(), t.class, t.port))
                .collect();
            (
                open_connections(d),
                d.core.connections().count(),
                d.setup.clone(),
                peers
                    .iter()
                    .map(|p| (p.server.to_string(), p.alive, p.failures))
                    .collect::<Vec<_>>(),
                tunnels,
                inbound,
                d.underlay.classes.clone(),
                d.underlay_counters(),
            )
        })
        .await;
    let Some(((open, ports), connections, setup, peers, tunnels, inbound, classes, underlay)) =
        snapshot
    else {
        return String::new();
    };
    let limit = shared.config.metrics_connections;
    let carried = carried(shared, &ports).await.unwrap_or_default();
    let flows = open
        .iter()
        .take(limit)
        .map(|(key, ..)| {
            let get = |k: &ConnKey| carried.get(k).copied().unwrap_or_default();
            (*key, get(key), get(&key.reversed()))
        })
        .collect();
    let scrape = Scrape {
        ports: counters(shared, ports).await,
        connections,
        flows,
        flows_left_out: open.len().saturating_sub(limit),
        setup,
        peers,
        tunnels,
        inbound,
        classes,
        underlay,
        security: shared.security.metrics(),
    };
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// The content type of [`metrics_text`].
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A connection that sends no request line within this is closed.
const METRICS_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// No scraper keeps one connection longer than this.
const METRICS_CONNECTION_LIMIT: Duration = Duration::from_secs(300);

/// Answers one HTTP request: the metrics on `GET /metrics` (and `/`).
async fn metrics_response(
    shared: &Shared,
    req: &hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    use hyper::{header, Method, Response, StatusCode};
    let reply = |status: StatusCode, body: String, kind: &str| {
        let mut r = Response::new(http_body_util::Full::new(bytes::Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = header::HeaderValue::from_str(kind) {
            r.headers_mut().insert(header::CONTENT_TYPE, v);
        }
        r
    };
    if !matches!(req.uri().path(), "/metrics" | "/") {
        return reply(StatusCode::NOT_FOUND, "try /metrics\n".into(), "text/plain");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET only\n".into(),
            "text/plain",
        );
    }
    reply(StatusCode::OK, metrics_text(shared).await, OPENMETRICS)
}

/// Serves the metrics over HTTP/1.1 (hyper) on `listener`.
pub(super) async fn serve_metrics(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(metrics_response(&shared, &req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(METRICS_HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(METRICS_CONNECTION_LIMIT, conn).await;
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

    /// Encodes the histogram (the encoder wants each bucket's own count
    /// and adds them up; ours are kept cumulative).
    fn encode(&self, e: &mut MetricEncoder<'_>) -> std::fmt::Result {
        let mut below = 0;
        let mut buckets: Vec<(f64, u64)> = SETUP_BUCKETS
            .iter()
            .zip(self.counts)
            .map(|(bound, n)| {
                let own = n - below;
                below = n;
                (*bound, own)
            })
            .collect();
        buckets.push((f64::MAX, self.count - below));
        e.encode_histogram::<NoLabelSet>(self.sum, self.count, &buckets, None)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape() -> Scrape {
        let mut local = SetupHistogram::default();
        local.record(Duration::from_micros(50));
        local.record(Duration::from_millis(3));
        local.record(Duration::from_secs(2));
        let counters = Arc::new(super::super::underlay::Counters::default());
        counters.dropped[1].store(4, std::sync::atomic::Ordering::Relaxed);
        counters
            .tunnels
            .store(2, std::sync::atomic::Ordering::Relaxed);
        Scrape {
            ports: vec![(
                "app".into(),
                3,
                PortCounters {
                    rx_msgs: 7,
                    acl_denied: 2,
                    ..PortCounters::default()
                },
            )],
            connections: 2,
            flows: vec![(
                ConnKey {
                    src: "10.0.0.1:2".parse().unwrap(),
                    src_port: 49152,
                    dst: "10.0.0.2:1".parse().unwrap(),
                    dst_port: 7,
                },
                ConnCounters {
                    msgs: 5,
                    bytes: 500,
                },
                ConnCounters { msgs: 5, bytes: 0 },
            )],
            flows_left_out: 1,
            setup: [local, SetupHistogram::default()],
            peers: vec![("10.0.0.2".into(), true, 1)],
            tunnels: vec![("10.0.0.2".into(), 1, 9, "udp".into())],
            inbound: vec![],
            classes: vec![crate::config::ClassConfig {
                id: 1,
                name: "bulk".into(),
                weight: 3,
                priority: 0,
            }],
            underlay: vec![([10, 0, 0, 2].into(), counters)],
            security: super::super::security::Security::new().metrics(),
        }
    }

    fn text() -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(scrape()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn counters_keep_their_names_and_have_help() {
        let t = text();
        assert!(t.contains("uniplane_port_rx_messages_total{port=\"3\",name=\"app\"} 7\n"));
        assert!(t.contains("uniplane_port_acl_denied_total{port=\"3\",name=\"app\"} 2\n"));
        assert!(t.contains("uniplane_peer_refused_total 0\n"));
        assert!(t.contains("uniplane_connections 2\n"));
        assert!(t.contains(
            "uniplane_connection_bytes_total{src=\"10.0.0.1:2\",src_port=\"49152\",\
             dst=\"10.0.0.2:1\",dst_port=\"7\",direction=\"src_to_dst\"} 500\n"
        ));
        assert!(t.contains(
            "uniplane_connection_messages_total{src=\"10.0.0.1:2\",src_port=\"49152\",\
             dst=\"10.0.0.2:1\",dst_port=\"7\",direction=\"dst_to_src\"} 5\n"
        ));
        assert!(t.contains("uniplane_connections_unexported 1\n"));
        assert!(t.contains("uniplane_underlay_tunnels{server=\"10.0.0.2\"} 2\n"));
        assert!(t.contains(
            "uniplane_tunnel_open{server=\"10.0.0.2\",class=\"1\",port=\"9\",stack=\"udp\"} 1\n"
        ));
        assert!(t.contains("uniplane_class_weight{class=\"1\",name=\"bulk\"} 3\n"));
        let reason = uniplane_underlay::Reason::ALL[1].name();
        assert!(t.contains(&format!(
            "uniplane_underlay_dropped_total{{server=\"10.0.0.2\",reason=\"{reason}\"}} 4\n"
        )));
        // Every family has a help text, and the exposition is closed.
        let types = t.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = t
            .lines()
            .filter(|l| l.starts_with("# HELP ") && l.split(' ').count() > 3)
            .count();
        assert_eq!(types, helps);
        assert!(types >= 30, "{types} families");
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn the_setup_histogram_is_cumulative_with_an_infinite_bucket() {
        let t = text();
        let bucket = |le: &str| {
            let key = format!("uniplane_connect_seconds_bucket{{le=\"{le}\",path=\"local\"}} ");
            t.lines()
                .find_map(|l| l.strip_prefix(&key))
                .unwrap_or_else(|| panic!("no bucket {le} in\n{t}"))
                .parse::<u64>()
                .unwrap()
        };
        assert_eq!(bucket("0.0001"), 1);
        assert_eq!(bucket("0.001"), 1);
        assert_eq!(bucket("0.005"), 2);
        assert_eq!(bucket("1.0"), 2);
        assert_eq!(bucket("+Inf"), 3);
        assert!(t.contains("uniplane_connect_seconds_count{path=\"local\"} 3\n"));
        assert!(t.contains("uniplane_connect_seconds_count{path=\"remote\"} 0\n"));
    }
}
