//! The control API of a forwarding plane: what the host daemon programs,
//! whether the plane is this software engine or the RTL under `hw/`.

use uniplane_dataplane::sched::{Policy, PolicyError};
use uniplane_dataplane::Uid;

use crate::acl::{AclRule, ConnKey};
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
}

/// The control API every forwarding plane implements: the software engine
/// (directly, or through a handle to its thread) and the RTL backend
/// (through its register map).
pub trait ForwardingPlane {
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
}
