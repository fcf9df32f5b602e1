//! `ForwardingPlane` over the register map: the host programs the RTL
//! exactly as it programs the software engine.
//!
//! The driver keeps a shadow of what it installed, because the hardware
//! structures are simpler than the software ones: the forwarding table is
//! a list in priority order (the shadow reproduces the software table's
//! priorities and tie-breaks and writes the entries in that order), the
//! connection set and the translator are fixed slot arrays, and a rule's
//! type set is spread over one bitmap word per request type.
//!
//! The shadow decides where to write; [`ForwardingPlane::dump`] and
//! [`ForwardingPlane::translations`] read what the RTL holds back through
//! the register map. What the registers do not hold comes from the shadow,
//! and says so where it is used: a route's priority number (the RTL keeps
//! only the order), the port of a route or default that names a detached
//! port (written as "no port", so it misses as in the engine), and the
//! original class numbers of a strict-priority policy (the RTL keeps
//! their ranks).

use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::sched::{Policy, Scheduler};
use uniplane_dataplane::Uid;
use uniplane_overlay::acl::{AclRule, ConnKey, TypeSet};
use uniplane_overlay::table::{Route, TableError};
use uniplane_overlay::{ForwardingPlane, PlaneError, PortCounters, PortDump, PortId, PortSpec};
use uniplane_underlay::{DemuxRule, FilterRules, UidMatch};

use crate::device::{BusError, RtlDevice};
use crate::regs::{kind, port, translator, underlay};

/// A port number the RTL reads as "no such port" (a miss).
const NO_PORT: u32 = 0xff;

/// One mask group, as `ForwardingTable` keeps it.
#[derive(Clone, Debug)]
struct Group {
    mask: u64,
    max_priority: u32,
    /// (masked key, priority, port)
    entries: Vec<(u64, u32, PortId)>,
}

/// The software table's bookkeeping, replayed so the RTL's order gives
/// the same answers, ties included.
#[derive(Clone, Debug)]
struct TableShadow {
    capacity: usize,
    len: usize,
    groups: Vec<Group>,
}

impl TableShadow {
    fn new(capacity: usize) -> Self {
        TableShadow {
            capacity,
            len: 0,
            groups: Vec::new(),
        }
    }

    fn sort(&mut self) {
        self.groups.sort_by(|a, b| {
            b.max_priority
                .cmp(&a.max_priority)
                .then(b.mask.count_ones().cmp(&a.mask.count_ones()))
        });
    }

    fn insert(&mut self, route: Route) -> Result<(), TableError> {
        if route.mask & !Uid::MASK != 0 {
            return Err(TableError::BadMask(route.mask));
        }
        let key = route.key.to_u64() & route.mask;
        let gi = match self.groups.iter().position(|g| g.mask == route.mask) {
            Some(i) => i,
            None => {
                self.groups.push(Group {
                    mask: route.mask,
                    max_priority: 0,
                    entries: Vec::new(),
                });
                self.groups.len() - 1
            }
        };
        let group = &mut self.groups[gi];
        match group.entries.iter().position(|e| e.0 == key) {
            Some(i) => group.entries[i] = (key, route.priority, route.port),
            None => {
                if self.len == self.capacity {
                    if group.entries.is_empty() {
                        self.groups.remove(gi);
                    }
                    return Err(TableError::Full(self.capacity));
                }
                self.len += 1;
                group.entries.push((key, route.priority, route.port));
            }
        }
        let group = &mut self.groups[gi];
        group.max_priority = group.max_priority.max(route.priority);
        self.sort();
        Ok(())
    }

    fn remove(&mut self, key: Uid, mask: u64) -> Result<(), TableError> {
        let not_found = TableError::NotFound { key, mask };
        let gi = self
            .groups
            .iter()
            .position(|g| g.mask == mask)
            .ok_or(not_found.clone())?;
        let group = &mut self.groups[gi];
        let k = key.to_u64() & mask;
        let i = group
            .entries
            .iter()
            .position(|e| e.0 == k)
            .ok_or(not_found)?;
        group.entries.remove(i);
        self.len -= 1;
        if group.entries.is_empty() {
            self.groups.remove(gi);
        } else {
            group.max_priority = group.entries.iter().map(|e| e.1).max().unwrap_or(0);
            self.sort();
        }
        Ok(())
    }

    /// The entries in the RTL's order: highest priority first, ties to
    /// the group the software table visits first.
    fn image(&self) -> Vec<(u64, u64, PortId)> {
        let mut all: Vec<(u32, usize, u64, u64, PortId)> = Vec::new();
        for (rank, g) in self.groups.iter().enumerate() {
            for &(key, prio, port) in &g.entries {
                all.push((prio, rank, key, g.mask, port));
            }
        }
        all.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        all.into_iter().map(|(_, _, k, m, p)| (k, m, p)).collect()
    }
}

/// What the driver installed in the RTL.
pub(crate) struct Shadow {
    ports: usize,
    tables: Vec<TableShadow>,
    /// What each entry slot holds: key, mask, the port code written.
    routes_written: Vec<Vec<Option<(u64, u64, u32)>>>,
    conns: Vec<Vec<Option<ConnKey>>>,
    rules: Vec<Vec<AclRule>>,
    rule_capacity: usize,
    types_written: Vec<Vec<u32>>,
    translations: Vec<Option<(ConnKey, PortId)>>,
    /// Default route per port, as asked (the RTL holds "no port" for a
    /// detached one).
    defaults: Vec<Option<PortId>>,
    /// Ports whose output is in service; routes to the others are
    /// written as "no port", so they answer as misses.
    live: Vec<bool>,
}

impl Shadow {
    pub(crate) fn new(
        ports: usize,
        entries: usize,
        conns: usize,
        rules: usize,
        translations: usize,
    ) -> Shadow {
        Shadow {
            ports,
            tables: (0..ports).map(|_| TableShadow::new(entries)).collect(),
            routes_written: vec![vec![None; entries]; ports],
            defaults: vec![None; ports],
            live: vec![true; ports],
            conns: vec![vec![None; conns]; ports],
            rules: vec![Vec::new(); ports],
            rule_capacity: rules,
            types_written: vec![vec![0; 256]; ports],
            translations: vec![None; translations],
        }
    }
}

fn bus(e: BusError) -> PlaneError {
    // A bus timeout means the device stopped answering.
    let _ = e;
    PlaneError::EngineGone
}

impl Shadow {
    /// The port code the RTL gets for output `p`: "no port" for one that
    /// does not exist or is detached.
    fn code(&self, p: PortId) -> u32 {
        if (p as usize) < self.ports && self.live[p as usize] {
            u32::from(p)
        } else {
            NO_PORT
        }
    }
}

/// Counters of the underlay block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnderlayCounters {
    /// Messages the filters passed.
    pub passed: u64,
    /// Dropped: no source pattern matched.
    pub source_denied: u64,
    /// Dropped: request type not allowed.
    pub type_denied: u64,
    /// Dropped: longer than the limit.
    pub too_long: u64,
    /// Messages the demux classified.
    pub classified: u64,
    /// Of those, how many no rule matched.
    pub misses: u64,
    /// Misses with no default: dropped.
    pub dropped: u64,
    /// Messages sent on the interface.
    pub sent: u64,
}

/// Why the underlay refused a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnderlayError {
    /// More entries than the RTL has.
    #[error("{what}: {given} given, the RTL has {capacity}")]
    Capacity {
        /// Which table.
        what: &'static str,
        /// Entries asked for.
        given: usize,
        /// Entries the RTL has.
        capacity: usize,
    },
    /// The RTL does not check memory windows; only rules that allow every
    /// address are accepted.
    #[error("the RTL filter does not check memory windows")]
    WindowsUnsupported,
    /// The policy does not fit the stacks.
    #[error(transparent)]
    Policy(#[from] uniplane_dataplane::sched::PolicyError),
    /// The device did not answer.
    #[error(transparent)]
    Bus(#[from] BusError),
}

impl RtlDevice {
    fn port_base(&self, p: PortId) -> Result<u32, PlaneError> {
        if (p as usize) >= self.shadow.ports {
            return Err(PlaneError::NoSuchPort(p));
        }
        self.block_base(kind::PORT, p as usize)
            .ok_or(PlaneError::NoSuchPort(p))
    }

    fn translator_base(&self) -> u32 {
        self.block_base(kind::TRANSLATOR, 0).unwrap_or(0)
    }

    fn underlay_base(&self) -> u32 {
        self.block_base(kind::UNDERLAY, 0).unwrap_or(0)
    }

    fn w(&mut self, addr: u32, data: u32) -> Result<(), PlaneError> {
        self.write(addr, data).map_err(bus)
    }

    fn write_uid_pair(&mut self, addr: u32, uid: u64, high_extra: u32) -> Result<(), PlaneError> {
        self.w(addr, uid as u32)?;
        self.w(addr + 4, (uid >> 32) as u32 & 0xffff | high_extra << 16)
    }

    fn sync_routes(&mut self, p: PortId) -> Result<(), PlaneError> {
        let base = self.port_base(p)?;
        let image: Vec<(u64, u64, u32)> = self.shadow.tables[p as usize]
            .image()
            .into_iter()
            .map(|(k, m, out)| (k, m, self.shadow.code(out)))
            .collect();
        let slots = self.shadow.routes_written[p as usize].len();
        for e in 0..slots {
            let want = image.get(e).copied();
            let have = self.shadow.routes_written[p as usize][e];
            if want == have {
                continue;
            }
            let at = base + port::ROUTE + 16 * e as u32;
            // Invalidate first, so no half-written entry ever matches.
            if have.is_some() {
                self.w(at + 4, 0)?;
            }
            if let Some((key, mask, out)) = want {
                self.w(at, key as u32)?;
                self.w(at + 8, mask as u32)?;
                self.w(at + 12, (mask >> 32) as u32)?;
                let word1 = 1 << 31 | out << 16 | (key >> 32) as u32;
                self.w(at + 4, word1)?;
            }
            self.shadow.routes_written[p as usize][e] = want;
        }
        Ok(())
    }

    fn write_conn(&mut self, at: u32, c: ConnKey) -> Result<(), PlaneError> {
        self.write_uid_pair(at, c.src.to_u64(), u32::from(c.src_port))?;
        self.write_uid_pair(at + 8, c.dst.to_u64(), u32::from(c.dst_port))
    }

    fn sync_conn_valid(&mut self, p: PortId) -> Result<(), PlaneError> {
        let base = self.port_base(p)?;
        let bits = self.shadow.conns[p as usize]
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_some())
            .fold(0u32, |acc, (i, _)| acc | 1 << i);
        self.w(base + port::CONN_VALID, bits)
    }

    fn install_conn(&mut self, p: PortId, c: ConnKey) -> Result<(), PlaneError> {
        let slots = &self.shadow.conns[p as usize];
        if slots.contains(&Some(c)) {
            return Ok(());
        }
        let capacity = slots.len();
        let free = slots
            .iter()
            .position(Option::is_none)
            .ok_or(PlaneError::Table(TableError::Full(capacity)))?;
        let at = self.port_base(p)? + port::CONN + 16 * free as u32;
        self.write_conn(at, c)?;
        self.shadow.conns[p as usize][free] = Some(c);
        Ok(())
    }

    fn sync_rules(&mut self, p: PortId) -> Result<(), PlaneError> {
        let base = self.port_base(p)?;
        let rules = self.shadow.rules[p as usize].clone();
        // Stop checking rules while they change.
        self.w(base + port::RULE_COUNT, 0)?;
        let mut allow = 0u32;
        for (r, rule) in rules.iter().enumerate() {
            let at = base + port::RULE + 32 * r as u32;
            let words = [
                rule.src.to_u64(),
                rule.src_mask & Uid::MASK,
                rule.dst.to_u64(),
                rule.dst_mask & Uid::MASK,
            ];
            for (i, v) in words.iter().enumerate() {
                self.w(at + 8 * i as u32, *v as u32)?;
                self.w(at + 8 * i as u32 + 4, (*v >> 32) as u32)?;
            }
            if rule.allow {
                allow |= 1 << r;
            }
        }
        for code in 0..=255u8 {
            let mut bits = 0u32;
            for (r, rule) in rules.iter().enumerate() {
                if rule.types.contains_code(code) {
                    bits |= 1 << r;
                }
            }
            if self.shadow.types_written[p as usize][code as usize] != bits {
                self.w(base + port::TYPES + 4 * u32::from(code), bits)?;
                self.shadow.types_written[p as usize][code as usize] = bits;
            }
        }
        self.w(base + port::RULE_ALLOW, allow)?;
        self.w(base + port::RULE_COUNT, rules.len() as u32)
    }

    fn write_policy(
        &mut self,
        base: u32,
        policy: &Policy,
        queues: usize,
        offsets: (u32, u32, u32, u32),
    ) -> Result<(), BusError> {
        let (policy_reg, commit, weight, class) = offsets;
        let (drr, weights, classes): (u32, Vec<u32>, Vec<u32>) = match policy {
            Policy::RoundRobin => (0, vec![1; queues], vec![0; queues]),
            Policy::Weighted(w) => (1, w.clone(), vec![0; queues]),
            Policy::StrictPriority { class, weights } => {
                // Only the order of classes matters: rank them 0, 1, ...
                let mut distinct: Vec<u8> = class.clone();
                distinct.sort_unstable();
                distinct.dedup();
                let ranks = class
                    .iter()
                    .map(|c| distinct.iter().position(|d| d == c).unwrap_or(0) as u32)
                    .collect();
                (1, weights.clone(), ranks)
            }
        };
        for q in 0..queues {
            self.write(base + weight + 4 * q as u32, weights[q])?;
            self.write(base + class + 4 * q as u32, classes[q])?;
        }
        self.write(base + policy_reg, drr)?;
        self.write(base + commit, 1)
    }

    /// Pads a policy to `n` queues as `Crossbar::set_policy` does.
    fn pad_policy(policy: Policy, n: usize) -> Policy {
        match policy {
            Policy::RoundRobin => Policy::RoundRobin,
            Policy::Weighted(mut w) => {
                if w.len() < n {
                    w.resize(n, 1);
                }
                Policy::Weighted(w)
            }
            Policy::StrictPriority {
                mut class,
                mut weights,
            } => {
                let last = class.iter().copied().max().unwrap_or(0);
                if class.len() < n {
                    class.resize(n, last);
                }
                if weights.len() < n {
                    weights.resize(n, 1);
                }
                Policy::StrictPriority { class, weights }
            }
        }
    }

    /// Holds (true) or releases output `p`'s scheduler: a held output
    /// finishes the message in flight and starts no other.
    pub fn pause_output(&mut self, p: PortId, paused: bool) -> Result<(), PlaneError> {
        let base = self.port_base(p)?;
        self.w(base + port::PAUSE, paused as u32)
    }

    /// Holds (true) or releases the underlay's interface output.
    pub fn pause_interface(&mut self, paused: bool) -> Result<(), BusError> {
        let base = self.underlay_base();
        self.write(base + underlay::PAUSE, paused as u32)
    }

    /// Sets the underlay filter's rules (sources, types, length).
    pub fn set_underlay_rules(&mut self, rules: &FilterRules) -> Result<(), UnderlayError> {
        let base = self.underlay_base();
        let caps = self.read(base + 0x02c)?;
        let sources = (caps & 0xff) as usize;
        if rules.sources.len() > sources {
            return Err(UnderlayError::Capacity {
                what: "filter sources",
                given: rules.sources.len(),
                capacity: sources,
            });
        }
        let everything = rules
            .windows
            .iter()
            .any(|w| w.uid() == UidMatch::ANY && w.base() == 0 && w.last() == u64::MAX);
        if !everything {
            return Err(UnderlayError::WindowsUnsupported);
        }
        self.write(base + underlay::SOURCE_VALID, 0)?;
        for (s, m) in rules.sources.iter().enumerate() {
            let at = base + underlay::SOURCE + 16 * s as u32;
            let key = m.key().to_u64();
            self.write(at, key as u32)?;
            self.write(at + 4, (key >> 32) as u32)?;
            self.write(at + 8, m.mask() as u32)?;
            self.write(at + 12, (m.mask() >> 32) as u32)?;
        }
        let words = rules.types.to_words();
        for w in 0..8u32 {
            let word = (words[(w / 2) as usize] >> (32 * (w % 2))) as u32;
            self.write(base + underlay::TYPES + 4 * w, word)?;
        }
        let max_len = u32::try_from(rules.max_len).unwrap_or(u32::MAX);
        self.write(base + underlay::MAX_LEN, max_len)?;
        let valid = (0..rules.sources.len()).fold(0u32, |a, s| a | 1 << s);
        self.write(base + underlay::SOURCE_VALID, valid)?;
        Ok(())
    }

    /// Sets the policy the interface shares itself with among the stacks.
    pub fn set_underlay_policy(&mut self, policy: Policy) -> Result<(), UnderlayError> {
        let base = self.underlay_base();
        let stacks = self.read(base + underlay::STACKS)? as usize;
        let policy = Self::pad_policy(policy, stacks);
        Scheduler::with_policy(stacks, policy.clone())?;
        self.write_policy(
            base,
            &policy,
            stacks,
            (
                underlay::POLICY,
                underlay::COMMIT,
                underlay::WEIGHT,
                underlay::CLASS,
            ),
        )?;
        Ok(())
    }

    /// Sets the demux rules (first match wins) and the default output.
    pub fn set_demux(
        &mut self,
        rules: &[DemuxRule],
        default: Option<usize>,
    ) -> Result<(), UnderlayError> {
        let base = self.underlay_base();
        let caps = self.read(base + 0x02c)?;
        let capacity = (caps >> 8 & 0xff) as usize;
        if rules.len() > capacity {
            return Err(UnderlayError::Capacity {
                what: "demux rules",
                given: rules.len(),
                capacity,
            });
        }
        self.write(base + underlay::RULE_COUNT, 0)?;
        for (d, r) in rules.iter().enumerate() {
            let at = base + underlay::RULE + 16 * d as u32;
            let key = r.dst.key().to_u64();
            let out = u32::try_from(r.output).unwrap_or(NO_PORT).min(NO_PORT);
            self.write(at, key as u32)?;
            self.write(at + 4, (key >> 32) as u32 | out << 16)?;
            self.write(at + 8, r.dst.mask() as u32)?;
            self.write(at + 12, (r.dst.mask() >> 32) as u32)?;
        }
        for code in 0..=255u8 {
            let bits = rules
                .iter()
                .enumerate()
                .filter(|(_, r)| r.types.contains_code(code))
                .fold(0u32, |a, (d, _)| a | 1 << d);
            self.write(base + underlay::RULE_TYPES + 4 * u32::from(code), bits)?;
        }
        let def = match default {
            Some(o) => 1 << 31 | u32::try_from(o).unwrap_or(NO_PORT).min(NO_PORT),
            None => 0,
        };
        self.write(base + underlay::DEFAULT, def)?;
        self.write(base + underlay::RULE_COUNT, rules.len() as u32)?;
        Ok(())
    }

    /// Reads the underlay's counters.
    pub fn underlay_counters(&mut self) -> Result<UnderlayCounters, BusError> {
        let base = self.underlay_base() + underlay::COUNTERS;
        let mut v = [0u64; 8];
        for (i, c) in v.iter_mut().enumerate() {
            *c = self.read64(base + 8 * i as u32)?;
        }
        Ok(UnderlayCounters {
            passed: v[0],
            source_denied: v[1],
            type_denied: v[2],
            too_long: v[3],
            classified: v[4],
            misses: v[5],
            dropped: v[6],
            sent: v[7],
        })
    }
}

impl ForwardingPlane for RtlDevice {
    fn kind(&self) -> &'static str {
        "rtl"
    }

    fn attach(&mut self, _spec: PortSpec) -> Result<(PortId, RingLink), PlaneError> {
        // Ports are wired at synthesis; rings to them come with the
        // running co-simulation.
        Err(PlaneError::Unsupported {
            plane: "rtl",
            what: "attach a port outside a running co-simulation",
        })
    }

    fn detach(&mut self, _port: PortId) -> Result<PortCounters, PlaneError> {
        Err(PlaneError::Unsupported {
            plane: "rtl",
            what: "detach a port outside a running co-simulation",
        })
    }

    /// Reads `p`'s tables back through the register map (see the module
    /// documentation for the few fields that come from the shadow). The
    /// bare device keeps no port names or kinds: `name` is `rtl<p>`.
    fn dump(&mut self, p: PortId) -> Result<PortDump, PlaneError> {
        let counters = self.counters(p)?;
        Ok(PortDump {
            port: p,
            name: format!("rtl{p}"),
            kind: None,
            routes: self.read_routes(p)?,
            default_route: self.read_default(p)?,
            connections: self.read_connections(p)?,
            rules: self.read_rules(p)?,
            policy: Some(self.read_policy(p)?),
            counters,
        })
    }

    fn translations(&mut self) -> Result<Vec<(ConnKey, PortId)>, PlaneError> {
        let base = self.translator_base();
        let valid = self.r(base + translator::VALID)?;
        let mut out = Vec::new();
        for t in 0..self.shadow.translations.len().min(32) {
            if valid >> t & 1 == 0 {
                continue;
            }
            let at = base + translator::ENTRY + 32 * t as u32;
            let conn = self.read_conn(at)?;
            let port = self.r(at + 16)? & 0xff;
            out.push((conn, port as PortId));
        }
        out.sort_by_key(|(c, _)| (c.src.to_u64(), c.src_port, c.dst.to_u64(), c.dst_port));
        Ok(out)
    }

    fn add_route(&mut self, port: PortId, route: Route) -> Result<(), PlaneError> {
        self.port_base(port)?;
        self.shadow.tables[port as usize].insert(route)?;
        self.sync_routes(port)
    }

    fn remove_route(&mut self, port: PortId, key: Uid, mask: u64) -> Result<(), PlaneError> {
        self.port_base(port)?;
        self.shadow.tables[port as usize].remove(key, mask)?;
        self.sync_routes(port)
    }

    fn set_default_route(&mut self, port: PortId, out: Option<PortId>) -> Result<(), PlaneError> {
        self.port_base(port)?;
        self.shadow.defaults[port as usize] = out;
        self.sync_default(port)
    }

    fn allow_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.port_base(port)?;
        self.install_conn(port, conn)?;
        if let Err(e) = self.install_conn(port, conn.reversed()) {
            // Keep both directions or neither.
            if let Some(slot) = self.shadow.conns[port as usize]
                .iter_mut()
                .find(|c| **c == Some(conn))
            {
                *slot = None;
            }
            self.sync_conn_valid(port)?;
            return Err(e);
        }
        self.sync_conn_valid(port)
    }

    fn revoke_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.port_base(port)?;
        for slot in self.shadow.conns[port as usize].iter_mut() {
            if *slot == Some(conn) || *slot == Some(conn.reversed()) {
                *slot = None;
            }
        }
        self.sync_conn_valid(port)
    }

    fn add_acl_rule(&mut self, port: PortId, rule: AclRule) -> Result<(), PlaneError> {
        self.port_base(port)?;
        if self.shadow.rules[port as usize].len() == self.shadow.rule_capacity {
            return Err(PlaneError::Table(TableError::Full(
                self.shadow.rule_capacity,
            )));
        }
        self.shadow.rules[port as usize].push(rule);
        self.sync_rules(port)
    }

    fn clear_acl_rules(&mut self, port: PortId) -> Result<(), PlaneError> {
        self.port_base(port)?;
        self.shadow.rules[port as usize].clear();
        self.sync_rules(port)
    }

    fn add_translation(&mut self, conn: ConnKey, out: PortId) -> Result<(), PlaneError> {
        self.port_base(out)?;
        let slots = &self.shadow.translations;
        let capacity = slots.len();
        let slot = slots
            .iter()
            .position(|s| matches!(s, Some((c, _)) if *c == conn))
            .or_else(|| slots.iter().position(Option::is_none))
            .ok_or(PlaneError::Table(TableError::Full(capacity)))?;
        let base = self.translator_base();
        let valid = self.translation_bits();
        // Out of service while it changes.
        self.w(base + translator::VALID, valid & !(1 << slot))?;
        let at = base + translator::ENTRY + 32 * slot as u32;
        self.write_conn(at, conn)?;
        self.w(at + 16, u32::from(out))?;
        self.shadow.translations[slot] = Some((conn, out));
        let valid = self.translation_bits();
        self.w(base + translator::VALID, valid)
    }

    fn remove_translation(&mut self, conn: ConnKey) -> Result<(), PlaneError> {
        let slot = self
            .shadow
            .translations
            .iter()
            .position(|s| matches!(s, Some((c, _)) if *c == conn))
            .ok_or(PlaneError::NoTranslation(conn))?;
        self.shadow.translations[slot] = None;
        let base = self.translator_base();
        let valid = self.translation_bits();
        self.w(base + translator::VALID, valid)
    }

    fn set_policy(&mut self, output: PortId, policy: Policy) -> Result<(), PlaneError> {
        let base = self.port_base(output)?;
        let n = self.shadow.ports;
        let policy = Self::pad_policy(policy, n);
        Scheduler::with_policy(n, policy.clone())?;
        self.write_policy(
            base,
            &policy,
            n,
            (port::POLICY, port::COMMIT, port::WEIGHT, port::CLASS),
        )
        .map_err(bus)
    }

    fn counters(&mut self, p: PortId) -> Result<PortCounters, PlaneError> {
        let base = self.port_base(p)? + port::COUNTERS;
        let mut v = [0u64; 9];
        for (i, c) in v.iter_mut().enumerate() {
            *c = self.read64(base + 8 * i as u32).map_err(bus)?;
        }
        Ok(PortCounters {
            rx_msgs: v[0],
            rx_bytes: v[1],
            tx_msgs: v[2],
            tx_bytes: v[3],
            acl_denied: v[4],
            no_route: v[5],
            error_answers: v[6],
            unanswerable: v[7],
            input_stalls: v[8],
            ..PortCounters::default()
        })
    }
}

impl RtlDevice {
    fn translation_bits(&self) -> u32 {
        self.shadow
            .translations
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .fold(0u32, |a, (i, _)| a | 1 << i)
    }
}

/// A UID from a register pair's low 48 bits (always a valid UID).
fn uid_of(v: u64) -> Uid {
    Uid::from_u64(v & Uid::MASK).unwrap_or(Uid::from_bytes([0; 6]))
}

impl RtlDevice {
    fn r(&mut self, addr: u32) -> Result<u32, PlaneError> {
        self.read(addr).map_err(bus)
    }

    fn r64(&mut self, addr: u32) -> Result<u64, PlaneError> {
        let lo = self.r(addr)?;
        let hi = self.r(addr + 4)?;
        Ok(u64::from(hi) << 32 | u64::from(lo))
    }

    /// Writes `p`'s default route from the shadow (a detached output is
    /// written as "no port").
    fn sync_default(&mut self, p: PortId) -> Result<(), PlaneError> {
        let base = self.port_base(p)?;
        let word = match self.shadow.defaults[p as usize] {
            Some(o) => 1 << 31 | self.shadow.code(o),
            None => 0,
        };
        self.w(base + port::DEFAULT_ROUTE, word)
    }

    /// Puts output `p` in service (`live`) or out of it: every route and
    /// default naming `p` is rewritten, so messages to a detached port
    /// are answered NO_ROUTE, as the engine answers them.
    pub(crate) fn set_port_live(&mut self, p: PortId, live: bool) -> Result<(), PlaneError> {
        self.port_base(p)?;
        if self.shadow.live[p as usize] == live {
            return Ok(());
        }
        self.shadow.live[p as usize] = live;
        for q in 0..self.shadow.ports as PortId {
            self.sync_routes(q)?;
            if self.shadow.defaults[q as usize] == Some(p) {
                self.sync_default(q)?;
            }
        }
        Ok(())
    }

    /// Empties port `p`'s tables as a detached engine port loses them:
    /// forwarding entries, default route, connections, rules, the
    /// translator entries that lead to it, and its output policy (back to
    /// round-robin).
    pub(crate) fn clear_port(&mut self, p: PortId) -> Result<(), PlaneError> {
        self.port_base(p)?;
        let i = p as usize;
        let capacity = self.shadow.tables[i].capacity;
        self.shadow.tables[i] = TableShadow::new(capacity);
        self.sync_routes(p)?;
        self.shadow.defaults[i] = None;
        self.sync_default(p)?;
        self.shadow.conns[i].iter_mut().for_each(|c| *c = None);
        self.sync_conn_valid(p)?;
        self.shadow.rules[i].clear();
        self.sync_rules(p)?;
        let to_p: Vec<ConnKey> = self
            .shadow
            .translations
            .iter()
            .flatten()
            .filter(|(_, out)| *out == p)
            .map(|(c, _)| *c)
            .collect();
        for c in to_p {
            self.remove_translation(c)?;
        }
        self.set_policy(p, Policy::RoundRobin)
    }

    fn read_conn(&mut self, at: u32) -> Result<ConnKey, PlaneError> {
        let src_lo = self.r(at)?;
        let src_hi = self.r(at + 4)?;
        let dst_lo = self.r(at + 8)?;
        let dst_hi = self.r(at + 12)?;
        Ok(ConnKey {
            src: uid_of(u64::from(src_hi & 0xffff) << 32 | u64::from(src_lo)),
            src_port: (src_hi >> 16) as u16,
            dst: uid_of(u64::from(dst_hi & 0xffff) << 32 | u64::from(dst_lo)),
            dst_port: (dst_hi >> 16) as u16,
        })
    }

    /// The valid forwarding entries, read back, in the order
    /// `ForwardingTable::routes` lists them. The priority number, and the
    /// port of an entry written as "no port" (a detached output), come
    /// from the shadow entry with the same key and mask.
    fn read_routes(&mut self, p: PortId) -> Result<Vec<Route>, PlaneError> {
        let base = self.port_base(p)?;
        let slots = self.shadow.routes_written[p as usize].len();
        let mut routes = Vec::new();
        for e in 0..slots {
            let at = base + port::ROUTE + 16 * e as u32;
            let word1 = self.r(at + 4)?;
            if word1 >> 31 == 0 {
                continue;
            }
            let key = u64::from(word1 & 0xffff) << 32 | u64::from(self.r(at)?);
            let mask = self.r64(at + 8)? & Uid::MASK;
            let code = word1 >> 16 & 0xff;
            let shadow = self.shadow.tables[p as usize]
                .groups
                .iter()
                .filter(|g| g.mask == mask)
                .flat_map(|g| g.entries.iter())
                .find(|(k, _, _)| *k == key)
                .map(|&(_, prio, out)| (prio, out));
            let (priority, shadow_port) = shadow.unwrap_or((0, code as PortId));
            let port = if code == NO_PORT {
                shadow_port
            } else {
                code as PortId
            };
            routes.push(Route {
                key: uid_of(key),
                mask,
                priority,
                port,
            });
        }
        routes.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(b.mask.count_ones().cmp(&a.mask.count_ones()))
                .then(a.key.to_u64().cmp(&b.key.to_u64()))
        });
        Ok(routes)
    }

    /// The default route, read back; one written as "no port" (to a
    /// detached or missing port) reports the port asked for.
    fn read_default(&mut self, p: PortId) -> Result<Option<PortId>, PlaneError> {
        let base = self.port_base(p)?;
        let word = self.r(base + port::DEFAULT_ROUTE)?;
        if word >> 31 == 0 {
            return Ok(None);
        }
        let code = word & 0xff;
        Ok(if code == NO_PORT {
            self.shadow.defaults[p as usize]
        } else {
            Some(code as PortId)
        })
    }

    /// The admitted connections, read back, one direction of each, in
    /// `AccessControl::connection_keys`'s order.
    fn read_connections(&mut self, p: PortId) -> Result<Vec<ConnKey>, PlaneError> {
        let base = self.port_base(p)?;
        let valid = self.r(base + port::CONN_VALID)?;
        let mut all = Vec::new();
        for c in 0..self.shadow.conns[p as usize].len().min(32) {
            if valid >> c & 1 == 1 {
                all.push(self.read_conn(base + port::CONN + 16 * c as u32)?);
            }
        }
        let mut out: Vec<ConnKey> = all
            .iter()
            .copied()
            .filter(|c| {
                let r = c.reversed();
                (c.src.to_u64(), c.src_port) <= (r.src.to_u64(), r.src_port) || !all.contains(&r)
            })
            .collect();
        out.sort_by_key(|c| (c.src.to_u64(), c.src_port, c.dst.to_u64(), c.dst_port));
        out.dedup();
        Ok(out)
    }

    /// The rules in force, read back: patterns, masks (48 bits), allow
    /// bits and type sets from the per-code bitmap words.
    fn read_rules(&mut self, p: PortId) -> Result<Vec<AclRule>, PlaneError> {
        let base = self.port_base(p)?;
        let count = (self.r(base + port::RULE_COUNT)? as usize).min(32);
        if count == 0 {
            return Ok(Vec::new());
        }
        let allow = self.r(base + port::RULE_ALLOW)?;
        let mut rules = Vec::with_capacity(count);
        for r in 0..count {
            let at = base + port::RULE + 32 * r as u32;
            rules.push(AclRule {
                src: uid_of(self.r64(at)?),
                src_mask: self.r64(at + 8)? & Uid::MASK,
                dst: uid_of(self.r64(at + 16)?),
                dst_mask: self.r64(at + 24)? & Uid::MASK,
                types: TypeSet::EMPTY,
                allow: allow >> r & 1 == 1,
            });
        }
        for code in 0..=255u8 {
            let bits = self.r(base + port::TYPES + 4 * u32::from(code))?;
            for (r, rule) in rules.iter_mut().enumerate() {
                if bits >> r & 1 == 1 {
                    rule.types = rule.types.with_code(code);
                }
            }
        }
        Ok(rules)
    }

    /// Output `p`'s policy, read back from its shadow registers (which
    /// the commit put in force): round-robin, weighted, or strict
    /// priority when the classes differ. The RTL holds class ranks
    /// (0, 1, …), not the numbers given; a strict-priority policy whose
    /// classes are all equal reads back as the weighted policy it acts as.
    fn read_policy(&mut self, p: PortId) -> Result<Policy, PlaneError> {
        let base = self.port_base(p)?;
        if self.r(base + port::POLICY)? & 1 == 0 {
            return Ok(Policy::RoundRobin);
        }
        let n = self.shadow.ports;
        let mut weights = Vec::with_capacity(n);
        let mut class = Vec::with_capacity(n);
        for q in 0..n as u32 {
            weights.push(self.r(base + port::WEIGHT + 4 * q)?);
            class.push(self.r(base + port::CLASS + 4 * q)? as u8);
        }
        Ok(if class.iter().all(|c| *c == class[0]) {
            Policy::Weighted(weights)
        } else {
            Policy::StrictPriority { class, weights }
        })
    }
}
