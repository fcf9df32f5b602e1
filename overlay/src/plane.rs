//! The control API of a forwarding plane: what the host daemon programs,
//! whether the plane is this software engine or the RTL under `hw/`.

use std::sync::{Arc, Mutex};

use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::sched::{Policy, PolicyError};
use uniplane_dataplane::{Message, PortIo, Uid};

use crate::acl::{AclRule, ConnCounters, ConnKey};
use crate::segment::ReassemblyStats;
use crate::table::{Route, TableError};
use crate::PortId;

/// What a port connects to the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortKind {
    /// An application (or a service of the daemon): gets whole messages;
    /// segmented ones are reassembled before delivery.
    App,
    /// A stack tunnel to another server, carrying many connections of one
    /// traffic class; segments pass through as they are.
    Tunnel {
        /// The traffic class the tunnel carries.
        class: u8,
    },
    /// A device (an emulated or simulated hardware kernel): like an app.
    Device,
}

impl PortKind {
    /// Whether messages leaving through this port are reassembled first.
    pub fn reassembles(self) -> bool {
        !matches!(self, PortKind::Tunnel { .. })
    }
}

/// A port's static description.
#[derive(Clone, Debug)]
pub struct PortSpec {
    /// What the port connects.
    pub kind: PortKind,
    /// A name for counters and logs.
    pub name: String,
    /// Largest payload one message leaving through this port may carry;
    /// larger ones are cut into segments.
    pub mtu: usize,
}

impl PortSpec {
    /// An application port with no MTU limit below the message limit.
    pub fn app(name: &str) -> Self {
        PortSpec {
            kind: PortKind::App,
            name: name.to_owned(),
            mtu: Message::MAX_PAYLOAD,
        }
    }

    /// A tunnel port of traffic class `class` whose stack carries at most
    /// `mtu` payload bytes per message.
    pub fn tunnel(name: &str, class: u8, mtu: usize) -> Self {
        PortSpec {
            kind: PortKind::Tunnel { class },
            name: name.to_owned(),
            mtu,
        }
    }
}

/// Per-port counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Messages read from the port.
    pub rx_msgs: u64,
    /// Payload bytes read from the port.
    pub rx_bytes: u64,
    /// Messages written to the port.
    pub tx_msgs: u64,
    /// Payload bytes written to the port.
    pub tx_bytes: u64,
    /// Messages refused by the port's access control.
    pub acl_denied: u64,
    /// Messages whose destination no route matched.
    pub no_route: u64,
    /// Error answers sent back to this port's senders.
    pub error_answers: u64,
    /// Refused messages that could not be answered (answers themselves).
    pub unanswerable: u64,
    /// Segments created for messages above an output's MTU.
    pub segments: u64,
    /// Times the port's input was held because a queue was full.
    pub input_stalls: u64,
    /// Reassembly of messages delivered through this port.
    pub reassembly: ReassemblyStats,
}

/// Why a control request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlaneError {
    /// No port has that number.
    #[error("no port {0}")]
    NoSuchPort(PortId),
    /// Every port number is taken.
    #[error("all {0} ports are in use")]
    TooManyPorts(usize),
    /// The forwarding table refused the change.
    #[error(transparent)]
    Table(#[from] TableError),
    /// The scheduler refused the policy.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// No translation for that connection.
    #[error("no translation for {0:?}")]
    NoTranslation(ConnKey),
    /// The engine stopped.
    #[error("the engine is not running")]
    EngineGone,
    /// The plane cannot do this at all (a fixed-function part lacks it).
    #[error("the {plane} plane cannot {what}")]
    Unsupported {
        /// Which plane.
        plane: &'static str,
        /// What was asked.
        what: &'static str,
    },
    /// The plane's control queue is full: try again once earlier
    /// operations completed.
    #[error("the plane's control queue is full")]
    Busy,
    /// An [`IoSlot`] was empty: its queues were attached already.
    #[error("the port's queues were taken already")]
    IoTaken,
}

/// Caller-supplied queues of a port on their way to the plane: what
/// [`PlaneOp::AttachIo`] carries. Cloning shares the slot; the first
/// [`IoSlot::take`] gets the queues, later ones get `None`, so an operation
/// applied twice attaches them once.
#[derive(Clone)]
pub struct IoSlot(Arc<Mutex<Option<Box<dyn PortIo>>>>);

impl IoSlot {
    /// A slot holding `io`.
    pub fn new(io: Box<dyn PortIo>) -> Self {
        IoSlot(Arc::new(Mutex::new(Some(io))))
    }

    /// Takes the queues out; `None` when someone took them already.
    pub fn take(&self) -> Option<Box<dyn PortIo>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Whether the queues are still in the slot.
    pub fn is_present(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl std::fmt::Debug for IoSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.is_present() {
            "present"
        } else {
            "taken"
        };
        f.debug_tuple("IoSlot")
            .field(&format_args!("{state}"))
            .finish()
    }
}

/// One control operation, as data: what [`ForwardingPlane::apply`] takes
/// and what a [`PlaneHandle`](crate::remote::PlaneHandle) carries to a
/// plane on another thread, in batches.
#[derive(Clone, Debug)]
pub enum PlaneOp {
    /// [`ForwardingPlane::attach`].
    Attach(PortSpec),
    /// [`ForwardingPlane::attach_io`]: a port on the queues in the slot.
    AttachIo(PortSpec, IoSlot),
    /// [`ForwardingPlane::detach`].
    Detach(PortId),
    /// [`ForwardingPlane::add_route`].
    AddRoute(PortId, Route),
    /// [`ForwardingPlane::remove_route`]: port, key, mask.
    RemoveRoute(PortId, Uid, u64),
    /// [`ForwardingPlane::set_default_route`].
    SetDefault(PortId, Option<PortId>),
    /// [`ForwardingPlane::allow_connection`].
    Allow(PortId, ConnKey),
    /// [`ForwardingPlane::revoke_connection`].
    Revoke(PortId, ConnKey),
    /// [`ForwardingPlane::add_acl_rule`].
    AddRule(PortId, AclRule),
    /// [`ForwardingPlane::clear_acl_rules`].
    ClearRules(PortId),
    /// [`ForwardingPlane::add_translation`].
    AddTranslation(ConnKey, PortId),
    /// [`ForwardingPlane::remove_translation`].
    RemoveTranslation(ConnKey),
    /// [`ForwardingPlane::set_policy`].
    SetPolicy(PortId, Policy),
    /// [`ForwardingPlane::counters`].
    Counters(PortId),
    /// [`ForwardingPlane::dump`].
    Dump(PortId),
    /// [`ForwardingPlane::connection_counters`].
    ConnCounters(PortId),
    /// [`ForwardingPlane::translations`].
    Translations,
    /// [`ForwardingPlane::move_port`]: port, shard.
    MovePort(PortId, usize),
}

/// What a [`PlaneOp`] gave back.
pub enum PlaneReply {
    /// The change is in place.
    Done,
    /// A port was attached: its number and the link its user holds.
    Attached(PortId, RingLink),
    /// A port was attached on caller-supplied queues: its number.
    AttachedIo(PortId),
    /// A port's counters (also what a detached port counted last).
    Counters(PortCounters),
    /// A port's tables as the plane holds them.
    Dump(Box<PortDump>),
    /// Every translator entry as the plane holds it.
    Translations(Vec<(ConnKey, PortId)>),
    /// What each admitted connection direction carried in through a port.
    ConnCounters(Vec<(ConnKey, ConnCounters)>),
}

impl std::fmt::Debug for PlaneReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlaneReply::Done => f.write_str("Done"),
            PlaneReply::Attached(p, _) => f.debug_tuple("Attached").field(p).finish(),
            PlaneReply::AttachedIo(p) => f.debug_tuple("AttachedIo").field(p).finish(),
            PlaneReply::Counters(c) => f.debug_tuple("Counters").field(c).finish(),
            PlaneReply::Dump(d) => f.debug_tuple("Dump").field(d).finish(),
            PlaneReply::Translations(t) => f.debug_tuple("Translations").field(t).finish(),
            PlaneReply::ConnCounters(c) => f.debug_tuple("ConnCounters").field(c).finish(),
        }
    }
}

impl PlaneReply {
    /// The attached port, when this answers an attach.
    pub fn into_attached(self) -> Option<(PortId, RingLink)> {
        match self {
            PlaneReply::Attached(p, l) => Some((p, l)),
            _ => None,
        }
    }
}

/// One port's state read back from the plane (never from a copy kept by
/// its controller): what `uniplane plane dump` prints.
#[derive(Clone, Debug, PartialEq)]
pub struct PortDump {
    /// The port.
    pub port: PortId,
    /// Its name, where the plane keeps one.
    pub name: String,
    /// What it connects, where the plane keeps it.
    pub kind: Option<PortKind>,
    /// Forwarding entries, in the order the plane prefers them.
    pub routes: Vec<Route>,
    /// Where misses go.
    pub default_route: Option<PortId>,
    /// Admitted connections, one direction of each.
    pub connections: Vec<ConnKey>,
    /// Connectionless rules in the order they are checked.
    pub rules: Vec<AclRule>,
    /// The scheduling policy of the port's output.
    pub policy: Option<Policy>,
    /// Its counters.
    pub counters: PortCounters,
}

/// The control API every forwarding plane implements: the software engine
/// (directly, or through a handle to its thread) and the RTL backend
/// (through its register map).
pub trait ForwardingPlane {
    /// The plane's name for logs and errors: `engine` or `rtl`.
    fn kind(&self) -> &'static str;
    /// Attaches a port; returns its number and the link its user holds.
    fn attach(&mut self, spec: PortSpec) -> Result<(PortId, RingLink), PlaneError>;
    /// Attaches a port whose queues the caller supplies (a shared-memory
    /// link driven by the plane's own thread, a device run inline); returns
    /// its number. Planes that cannot run foreign queues refuse.
    fn attach_io(&mut self, spec: PortSpec, io: Box<dyn PortIo>) -> Result<PortId, PlaneError> {
        let _ = (spec, io);
        Err(PlaneError::Unsupported {
            plane: self.kind(),
            what: "attach a port on caller-supplied queues",
        })
    }
    /// Removes a port and everything queued for it; returns its last
    /// counters. Routes naming it elsewhere stay until removed.
    fn detach(&mut self, port: PortId) -> Result<PortCounters, PlaneError>;
    /// Reads `port`'s tables and counters back from the plane.
    fn dump(&mut self, port: PortId) -> Result<PortDump, PlaneError>;
    /// Reads every translator entry back from the plane.
    fn translations(&mut self) -> Result<Vec<(ConnKey, PortId)>, PlaneError>;
    /// Moves `port` (its connector, its queues, its output's scheduler)
    /// to `shard` of a sharded engine, losing and reordering nothing:
    /// what waits in its queues stays there. Planes of one thread refuse.
    fn move_port(&mut self, port: PortId, shard: usize) -> Result<(), PlaneError> {
        let _ = (port, shard);
        Err(PlaneError::Unsupported {
            plane: self.kind(),
            what: "move a port between shards",
        })
    }
    /// Adds or replaces a forwarding entry of `port`'s connector.
    fn add_route(&mut self, port: PortId, route: Route) -> Result<(), PlaneError>;
    /// Removes the entry with `key` and `mask` from `port`'s table.
    fn remove_route(&mut self, port: PortId, key: Uid, mask: u64) -> Result<(), PlaneError>;
    /// Sets where `port` sends what no entry matches.
    fn set_default_route(&mut self, port: PortId, out: Option<PortId>) -> Result<(), PlaneError>;
    /// Admits a connection (both directions) at `port`.
    fn allow_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError>;
    /// Withdraws a connection at `port`.
    fn revoke_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError>;
    /// Appends a connectionless access rule at `port`.
    fn add_acl_rule(&mut self, port: PortId, rule: AclRule) -> Result<(), PlaneError>;
    /// Removes every connectionless rule at `port`.
    fn clear_acl_rules(&mut self, port: PortId) -> Result<(), PlaneError>;
    /// Steers a connection's messages (this direction) to `out`, ahead of
    /// the forwarding tables: the stack translator entry of an active
    /// connection.
    fn add_translation(&mut self, conn: ConnKey, out: PortId) -> Result<(), PlaneError>;
    /// Removes a connection's translator entries.
    fn remove_translation(&mut self, conn: ConnKey) -> Result<(), PlaneError>;
    /// Sets the scheduling policy of `output` over its inputs.
    fn set_policy(&mut self, output: PortId, policy: Policy) -> Result<(), PlaneError>;
    /// Reads `port`'s counters.
    fn counters(&mut self, port: PortId) -> Result<PortCounters, PlaneError>;
    /// Reads what each connection direction admitted at `port` carried in
    /// through it (messages and payload bytes), for as long as the
    /// connection is installed there. Planes that keep no such counters
    /// refuse.
    fn connection_counters(
        &mut self,
        port: PortId,
    ) -> Result<Vec<(ConnKey, ConnCounters)>, PlaneError> {
        let _ = port;
        Err(PlaneError::Unsupported {
            plane: self.kind(),
            what: "count per connection",
        })
    }

    /// Carries out one operation given as data.
    fn apply(&mut self, op: PlaneOp) -> Result<PlaneReply, PlaneError> {
        let done = |r: Result<(), PlaneError>| r.map(|()| PlaneReply::Done);
        match op {
            PlaneOp::Attach(spec) => self.attach(spec).map(|(p, l)| PlaneReply::Attached(p, l)),
            PlaneOp::AttachIo(spec, slot) => match slot.take() {
                Some(io) => self.attach_io(spec, io).map(PlaneReply::AttachedIo),
                None => Err(PlaneError::IoTaken),
            },
            PlaneOp::Detach(p) => self.detach(p).map(PlaneReply::Counters),
            PlaneOp::AddRoute(p, r) => done(self.add_route(p, r)),
            PlaneOp::RemoveRoute(p, k, m) => done(self.remove_route(p, k, m)),
            PlaneOp::SetDefault(p, o) => done(self.set_default_route(p, o)),
            PlaneOp::Allow(p, c) => done(self.allow_connection(p, c)),
            PlaneOp::Revoke(p, c) => done(self.revoke_connection(p, c)),
            PlaneOp::AddRule(p, r) => done(self.add_acl_rule(p, r)),
            PlaneOp::ClearRules(p) => done(self.clear_acl_rules(p)),
            PlaneOp::AddTranslation(c, o) => done(self.add_translation(c, o)),
            PlaneOp::RemoveTranslation(c) => done(self.remove_translation(c)),
            PlaneOp::SetPolicy(o, p) => done(self.set_policy(o, p)),
            PlaneOp::Counters(p) => self.counters(p).map(PlaneReply::Counters),
            PlaneOp::Dump(p) => self.dump(p).map(|d| PlaneReply::Dump(Box::new(d))),
            PlaneOp::Translations => self.translations().map(PlaneReply::Translations),
            PlaneOp::ConnCounters(p) => self.connection_counters(p).map(PlaneReply::ConnCounters),
            PlaneOp::MovePort(p, shard) => done(self.move_port(p, shard)),
        }
    }
}
