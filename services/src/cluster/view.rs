//! The resolved view of a cluster that `uniplane cluster check` prints:
//! per server its stacks, devices, peers with their addresses and what
//! each may send, and routes; the classes, which every server shares.
//! As text ([`std::fmt::Display`]) or as one JSON document
//! ([`Cluster::to_json`]).

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv4Addr;

use serde_json::{json, Value};

use super::Cluster;
use crate::config::{Config, DefaultAction, DeviceKind, PeerConfig, Scheduling, UidPattern};

/// Device kinds by the names the file uses.
fn kind_name(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::Echo => "echo",
        DeviceKind::Memory => "memory",
        DeviceKind::Relay => "relay",
        DeviceKind::Kernel => "kernel",
    }
}

/// Server names by ID.
fn names(cluster: &Cluster) -> HashMap<Ipv4Addr, &str> {
    cluster
        .servers
        .iter()
        .map(|s| (s.config.server, s.name.as_str()))
        .collect()
}

/// `*`, `A.B.C.D:*`, `A.B.C.D:N` or `A.B.C.D/LEN:*`, as the file writes it.
pub(super) fn pattern(p: &UidPattern) -> String {
    if p.mask == 0 {
        return "*".to_owned();
    }
    let server = p.key.server();
    let prefix = ((p.mask >> 16) as u32).count_ones();
    let server = if prefix == 32 {
        server.to_string()
    } else {
        format!("{server}/{prefix}")
    };
    if p.mask & 0xffff == 0xffff {
        format!("{server}:{}", p.key.device())
    } else {
        format!("{server}:*")
    }
}

fn classes(config: &Config) -> String {
    config
        .underlay
        .classes
        .iter()
        .map(|c| match config.underlay.scheduling {
            Scheduling::Weighted => format!("{} ({}, weight {})", c.id, c.name, c.weight),
            Scheduling::Priority => format!(
                "{} ({}, priority {}, weight {})",
                c.id, c.name, c.priority, c.weight
            ),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn action(config: &Config) -> &'static str {
    match config.default_action {
        DefaultAction::Allow => "allow",
        DefaultAction::Deny => "deny",
        DefaultAction::AllowLocal => "allow-local",
    }
}

fn takes(p: &PeerConfig) -> String {
    let classes: Vec<String> = p.ingress.classes.iter().map(u8::to_string).collect();
    let mut s = format!("classes {}", classes.join(" "));
    if let Some(types) = &p.ingress.types {
        let types: Vec<&str> = types.iter().map(|t| t.name()).collect();
        s.push_str(&format!(", types {}", types.join(" ")));
    }
    s.push_str(&format!(
        ", messages ≤ {} bytes, from {}",
        p.ingress.max_message,
        p.ingress
            .sources
            .iter()
            .map(pattern)
            .collect::<Vec<_>>()
            .join(" ")
    ));
    s
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = names(self);
        let name = |id| names.get(&id).copied().unwrap_or("?");
        let count = |n: usize, what: &str| match n {
            1 => format!("1 {what}"),
            n => format!("{n} {what}s"),
        };
        writeln!(
            f,
            "cluster {}: {}, {}",
            self.name,
            count(self.servers.len(), "server"),
            count(self.links.len(), "link")
        )?;
        if let Some(first) = self.servers.first() {
            let c = &first.config;
            let shaping = match c.underlay.rate {
                None => "unshaped".to_owned(),
                Some(bytes) => format!("{} Mbit/s per peer", bytes * 8 / 1_000_000),
            };
            writeln!(
                f,
                "classes ({}, {shaping}): {}",
                match c.underlay.scheduling {
                    Scheduling::Weighted => "weighted",
                    Scheduling::Priority => "priority",
                },
                classes(c)
            )?;
            writeln!(
                f,
                "policy: default {}, {} rules; secret {}",
                action(c),
                c.rules.len(),
                c.secret
                    .as_ref()
                    .map_or("none".to_owned(), |p| p.display().to_string())
            )?;
        }
        for s in &self.servers {
            let c = &s.config;
            writeln!(f)?;
            writeln!(
                f,
                "server {} ({}): peer channel {}",
                s.name, c.server, c.peer_listen
            )?;
            for st in &c.stacks {
                match st.listen {
                    Some(a) => writeln!(f, "  stack  {} on {a}", st.name)?,
                    None => writeln!(f, "  stack  {}", st.name)?,
                }
            }
            for d in &c.devices {
                let number = d.device.map_or("next free".to_owned(), |n| n.to_string());
                writeln!(
                    f,
                    "  device {} ({}, device {number}, {} bytes)",
                    d.name,
                    kind_name(d.kind),
                    d.memory
                )?;
            }
            for p in &c.peers {
                writeln!(
                    f,
                    "  peer   {} ({}) at {}, tunnel {} {}; takes {}",
                    name(p.server),
                    p.server,
                    p.address,
                    p.stack,
                    p.tunnel,
                    takes(p)
                )?;
            }
            for r in &c.routes {
                writeln!(
                    f,
                    "  route  from {} via {} to {}",
                    r.from,
                    r.via,
                    pattern(&r.to)
                )?;
            }
        }
        Ok(())
    }
}

impl Cluster {
    /// The resolved view as one JSON document.
    pub fn to_json(&self) -> Value {
        let names = names(self);
        let first = self.servers.first().map(|s| &s.config);
        json!({
            "cluster": self.name,
            "classes": first.map_or(Vec::new(), |c| c.underlay.classes.iter().map(|k| json!({
                "id": k.id, "name": k.name, "weight": k.weight, "priority": k.priority,
            })).collect()),
            "policy": first.map(|c| json!({ "default": action(c), "rules": c.rules.len() })),
            "scheduling": first.map(|c| match c.underlay.scheduling {
                Scheduling::Weighted => "weighted",
                Scheduling::Priority => "priority",
            }),
            "links": self.links.iter().map(|l| json!({
                "a": l.a.to_string(), "b": l.b.to_string(), "stack": l.stack,
            })).collect::<Vec<_>>(),
            "servers": self.servers.iter().map(|s| {
                let c = &s.config;
                json!({
                    "id": c.server.to_string(),
                    "name": s.name,
                    "peer_listen": c.peer_listen.to_string(),
                    "secret": c.secret,
                    "stacks": c.stacks.iter().map(|st| json!({
                        "name": st.name, "listen": st.listen.map(|a| a.to_string()),
                    })).collect::<Vec<_>>(),
                    "devices": c.devices.iter().map(|d| json!({
                        "name": d.name, "kind": kind_name(d.kind), "device": d.device, "memory": d.memory,
                    })).collect::<Vec<_>>(),
                    "peers": c.peers.iter().map(|p| json!({
                        "server": p.server.to_string(),
                        "name": names.get(&p.server),
                        "address": p.address.to_string(),
                        "stack": p.stack,
                        "tunnel": p.tunnel.to_string(),
                        "classes": p.ingress.classes,
                        "types": p.ingress.types.as_ref().map(|t| t.iter().map(|k| k.name()).collect::<Vec<_>>()),
                        "max_message": p.ingress.max_message,
                        "sources": p.ingress.sources.iter().map(pattern).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                    "routes": c.routes.iter().map(|r| json!({
                        "from": r.from, "via": r.via, "to": pattern(&r.to),
                    })).collect::<Vec<_>>(),
                })
            }).collect::<Vec<_>>(),
        })
    }
}
