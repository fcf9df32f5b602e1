//! The core's inputs ([`Event`]) and outputs ([`Action`]), and the words
//! they use.

use std::net::Ipv4Addr;

use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::wire::{ReqType, Status};
use uniplane_dataplane::Uid;
use uniplane_overlay::acl::ConnKey;
use uniplane_overlay::{PlaneError, PortId};

use crate::PlaneOp;

/// A client control session, named by the driver.
pub type SessionId = u64;
/// A request awaiting an answer (from a client or a peer), named by the
/// driver; the core's [`Action::Answer`] carries it back.
pub type RequestId = u64;
/// An inbound tunnel, named by the driver.
pub type TunnelId = u64;
/// A batch of plane operations, named by the core.
pub type BatchId = u64;

/// What a client (an application or the CLI) asks of the core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientRequest {
    /// Registers the session as a process resource.
    Attach {
        /// A name for listings and routes.
        name: String,
    },
    /// Accepts connections to `port` of the session's resource.
    Listen {
        /// The port.
        port: u16,
    },
    /// Stops accepting on `port`.
    Unlisten {
        /// The port.
        port: u16,
    },
    /// Opens a connection from the session's resource.
    Connect {
        /// Local port (0: the core picks an ephemeral one).
        src_port: u16,
        /// Destination resource.
        dst: Uid,
        /// Destination port.
        dst_port: u16,
        /// Traffic class (tunnel) for cross-server paths.
        class: u8,
    },
    /// Closes a connection the session's resource is an end of (either
    /// direction may be given).
    Close {
        /// The connection.
        conn: ConnKey,
    },
    /// Lends the session the memory of a local host memory device by
    /// mapping (DUA's one-sided access without a message per access):
    /// granted as the access rules allow the session's resource READ (and
    /// WRTE, for a writable mapping) on the device, taken back when they no
    /// longer do or the session ends.
    Map {
        /// Device number.
        device: u16,
    },
    /// Makes `len` zeroed bytes of shared memory that the session's
    /// resource lends its peers on this server as region `id` (its own
    /// numbering): the session gets it writable, and a peer that asks
    /// ([`ClientRequest::MapShared`]) as the access rules allow it READ
    /// (and WRTE, when `peers_write`) on the session's resource. Withdrawn
    /// from everyone when a borrower loses its grant or the session ends.
    Share {
        /// The region's number among the resource's.
        id: u16,
        /// Bytes (at least 1).
        len: u64,
        /// Whether peers may write it (as the rules allow).
        peers_write: bool,
    },
    /// Withdraws region `id` the session's resource shares.
    Unshare {
        /// The region.
        id: u16,
    },
    /// Maps region `id` that local resource `owner` shares.
    MapShared {
        /// The lending resource's device number.
        owner: u16,
        /// The region.
        id: u16,
    },
    /// Sets the scheduling policy of a device's port.
    SetPolicy {
        /// Device number.
        device: u16,
        /// The policy.
        policy: Policy,
    },
}

/// What a successful request answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The session is now the resource `uid`, on engine port `port`.
    Attached {
        /// Its UID.
        uid: Uid,
        /// Its port (the driver holds the port's ring link).
        port: PortId,
    },
    /// Listening on (or no longer on) a port.
    Port(u16),
    /// The connection is open (as stored: `src` is the connecting end).
    Connected(ConnKey),
    /// Done, nothing to say (close, a peer's connection admitted).
    Done,
    /// The device's memory may be mapped: read-only unless `writable`.
    Mapped {
        /// The device number.
        device: u16,
        /// Whether the rules allow writes too.
        writable: bool,
    },
    /// A shared region is made (for its owner) or may be mapped (for a
    /// peer): read-only unless `writable`.
    Shared {
        /// The lending resource's device number.
        owner: u16,
        /// The region.
        id: u16,
        /// Its bytes.
        len: u64,
        /// Whether the mapping may be written.
        writable: bool,
    },
}

/// Why a request failed. [`ControlError::kind`] is the stable word the
/// control protocol puts in its error answers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// The session has not attached.
    #[error("attach first")]
    NotAttached,
    /// The request makes no sense here.
    #[error("{0}")]
    BadRequest(String),
    /// The access policy refuses it.
    #[error("{0}")]
    Denied(String),
    /// The connection is open already.
    #[error("connection already open")]
    Exists,
    /// Nothing accepts it at the destination.
    #[error("{0}")]
    Refused(String),
    /// No such thing.
    #[error("{0}")]
    NotFound(String),
    /// No peer serves that server.
    #[error("{0}")]
    NoRoute(String),
    /// The peer is not reachable.
    #[error("{0}")]
    PeerDown(String),
    /// The peer did not answer in time.
    #[error("{0}")]
    Timeout(String),
    /// The plane could not attach a port for a new resource.
    #[error("{0}")]
    Resources(String),
    /// The plane refused an operation; the core's state was rolled back.
    #[error("{0}")]
    Plane(PlaneError),
    /// A bound of [`crate::Limits`] is reached.
    #[error("limit reached: {0}")]
    Limit(&'static str),
}

impl ControlError {
    /// The machine-readable kind used by the control protocol.
    pub fn kind(&self) -> &'static str {
        match self {
            ControlError::NotAttached => "not-attached",
            ControlError::BadRequest(_) => "bad-request",
            ControlError::Denied(_) => "denied",
            ControlError::Exists => "exists",
            ControlError::Refused(_) => "refused",
            ControlError::NotFound(_) => "not-found",
            ControlError::NoRoute(_) => "no-route",
            ControlError::PeerDown(_) => "peer-down",
            ControlError::Timeout(_) => "timeout",
            ControlError::Resources(_) => "resources",
            ControlError::Plane(_) => "engine",
            ControlError::Limit(_) => "limit",
        }
    }
}

/// A message between peer daemons, as the core sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerMsg {
    /// Liveness.
    Heartbeat,
    /// Asks the peer to admit a connection to one of its resources.
    Connect {
        /// The connection (src on the asking server).
        conn: ConnKey,
        /// Traffic class.
        class: u8,
    },
    /// The connection is closed on the sender's side.
    Close {
        /// The connection.
        conn: ConnKey,
        /// Why: `Closed` when its owner closed it, `Denied` when a rule
        /// closed it; its local ends are told the same.
        status: Status,
    },
}

/// What one plane operation returned, as far as the core cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// Done.
    Done,
    /// A port was attached with this number.
    Attached(PortId),
}

/// What the port a plane attach gave is for: the driver connects the
/// port's ring link accordingly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortUse {
    /// The daemon's own port (source of notices).
    Daemon,
    /// A hosted device.
    Device {
        /// Its name in the configuration.
        name: String,
        /// Its UID.
        uid: Uid,
    },
    /// An attached process (the answer to its attach follows).
    Process {
        /// Its session.
        session: SessionId,
        /// Its UID.
        uid: Uid,
    },
    /// Our tunnel of `class` to `server` (bridge it to the opened link).
    TunnelOut {
        /// The peer.
        server: Ipv4Addr,
        /// The traffic class.
        class: u8,
    },
    /// A tunnel a peer opened to us.
    TunnelIn {
        /// The driver's name for it.
        tunnel: TunnelId,
    },
}

/// An input to the core.
#[derive(Clone, Debug)]
pub enum Event {
    /// A client asks something; the answer comes as [`Action::Answer`].
    Client {
        /// Its session.
        session: SessionId,
        /// The request's id.
        request: RequestId,
        /// What it asks.
        req: ClientRequest,
    },
    /// A client session ended: its resource and connections go.
    ClientClosed {
        /// The session.
        session: SessionId,
    },
    /// A plane batch finished: one result per operation, or an error for
    /// the whole batch.
    PlaneDone {
        /// The batch.
        batch: BatchId,
        /// What each operation returned.
        results: Result<Vec<Result<OpResult, PlaneError>>, PlaneError>,
    },
    /// Our channel to a peer is up (hellos exchanged).
    PeerChannelUp {
        /// The peer.
        server: Ipv4Addr,
    },
    /// Our channel to a peer broke.
    PeerChannelDown {
        /// The peer.
        server: Ipv4Addr,
    },
    /// A peer said something on its channel to us (any message counts as
    /// a sign of life; a hello is a heartbeat here).
    PeerMessage {
        /// The peer.
        server: Ipv4Addr,
        /// The message.
        msg: PeerMsg,
        /// Where the verdict goes, for a connect.
        request: RequestId,
    },
    /// A peer's verdict on a connection we asked it to admit.
    PeerVerdict {
        /// The peer.
        server: Ipv4Addr,
        /// The connection.
        conn: ConnKey,
        /// Admitted, or why not.
        verdict: Result<(), String>,
    },
    /// An outbound tunnel asked for with [`Action::OpenTunnel`] is open.
    TunnelOpened {
        /// The peer.
        server: Ipv4Addr,
        /// The traffic class.
        class: u8,
    },
    /// An outbound tunnel could not open, or its link ended.
    TunnelFailed {
        /// The peer.
        server: Ipv4Addr,
        /// The traffic class.
        class: u8,
    },
    /// A peer opened a tunnel to us and its hello named it.
    InboundTunnel {
        /// The driver's name for it.
        tunnel: TunnelId,
        /// The peer.
        from: Ipv4Addr,
        /// The traffic class.
        class: u8,
        /// Largest payload its stack carries.
        mtu: usize,
    },
    /// An inbound tunnel's link ended.
    InboundTunnelEnded {
        /// The driver's name for it.
        tunnel: TunnelId,
    },
    /// The operator changed the access rules (a reload of the
    /// configuration): they apply to every later request and to the
    /// plane's connectionless entries at once, and every open connection
    /// they would no longer admit is closed (`Denied`, both ends told).
    Rules {
        /// Access rules, first match wins.
        rules: Vec<crate::config::AccessRule>,
        /// What happens when no rule matches.
        default_action: crate::config::DefaultAction,
    },
    /// A server joined (the naming service's directory lists it): it is
    /// a peer from now on, reached as `spec` says. Ignored when the
    /// server is a peer already (the configuration's peers win) or is
    /// this server; bounded by `limits.peers`.
    PeerAdded {
        /// How to reach it.
        spec: crate::config::PeerSpec,
    },
    /// A server left (its directory record is gone for good): like a
    /// failure, every connection through it is closed (`PeerFailed`, its
    /// owners told), its tunnels and channel go; then it is no peer.
    PeerRemoved {
        /// The server.
        server: Ipv4Addr,
    },
    /// The daemon is stopping: every connection is closed, its local
    /// processes and its peer told (`Closed`), before it goes.
    Shutdown,
    /// The underlay of the tunnels from `server` dropped a message that
    /// broke its rules (DUA's filter): the connection it claims to belong
    /// to is closed (`Denied`; its local ends and the peer told). Without
    /// ports (a one-sided access), every connection between `src` and
    /// `dst` through that peer is.
    Violation {
        /// The peer whose tunnel carried it.
        server: Ipv4Addr,
        /// The message's source and destination.
        src: Uid,
        /// Its destination.
        dst: Uid,
        /// Its source and destination ports, when it has them.
        ports: Option<(u16, u16)>,
    },
    /// A local device failed (its kernel stopped consuming or its thread
    /// died): every connection to or from it is closed (`PeerFailed`, its
    /// other ends told, local or remote). The device keeps its UID.
    DeviceFailed {
        /// Its device number on this server.
        device: u16,
    },
}

/// Whether a notice announces a connection or its end.
pub type NoticeKind = ReqType;

/// An output of the core, for the driver to carry out.
#[derive(Clone, Debug)]
pub enum Action {
    /// Submit these operations to the plane as one batch, and report the
    /// outcome with [`Event::PlaneDone`].
    Plane {
        /// The batch.
        batch: BatchId,
        /// The operations, in order.
        ops: Vec<PlaneOp>,
    },
    /// A port the plane attached is ready for its use.
    PortReady {
        /// The port.
        port: PortId,
        /// What it is for.
        usage: PortUse,
    },
    /// A port was detached: drop what the driver holds for it.
    PortGone {
        /// The port.
        port: PortId,
    },
    /// The answer to a request.
    Answer {
        /// The request.
        request: RequestId,
        /// Its result.
        result: Result<Reply, ControlError>,
    },
    /// Tell a local process about one of its connections: a CONNECT (it
    /// arrived), CLOSE (closed) or NOTIFY (gone with `status`).
    Notice {
        /// The process.
        to: Uid,
        /// `Connect`, `Close` or `Notify`.
        kind: NoticeKind,
        /// The connection seen from `to` (`src` is `to`).
        conn: ConnKey,
        /// Why.
        status: Status,
    },
    /// Send this to a peer on our channel to it.
    ToPeer {
        /// The peer.
        server: Ipv4Addr,
        /// The message.
        msg: PeerMsg,
    },
    /// Open our tunnel of `class` to `server`, then report
    /// [`Event::TunnelOpened`] or [`Event::TunnelFailed`].
    OpenTunnel {
        /// The peer.
        server: Ipv4Addr,
        /// The traffic class.
        class: u8,
    },
    /// Drop an inbound tunnel the core refused or replaced.
    DropTunnel {
        /// The driver's name for it.
        tunnel: TunnelId,
    },
    /// Close an outbound tunnel nobody waits for any more (the peer went
    /// down while it opened, or its port could not be attached).
    CloseTunnel {
        /// The peer.
        server: Ipv4Addr,
        /// The traffic class.
        class: u8,
    },
    /// The peer is declared failed: drop our channel to it (and dial
    /// again later).
    ClosePeerChannel {
        /// The peer.
        server: Ipv4Addr,
    },
    /// Take back the memory of `device` that `session` mapped: the rules no
    /// longer allow it, or the session ended. The driver revokes every
    /// mapping of that memory and moves it (other sessions map it again).
    Unmap {
        /// The session.
        session: SessionId,
        /// The device number.
        device: u16,
    },
    /// Make the memory of a shared region (`len` zeroed bytes) for the
    /// session that asked; it answers a [`Reply::Shared`] that follows.
    MakeShared {
        /// The lending resource's device number.
        owner: u16,
        /// The region.
        id: u16,
        /// Its bytes.
        len: u64,
    },
    /// Withdraw a shared region: revoke every loan of it (its owner's
    /// too, which then keeps the bytes to itself) and forget it.
    Withdraw {
        /// The lending resource's device number.
        owner: u16,
        /// The region.
        id: u16,
    },
    /// A chained device's connection to its next device is installed
    /// (`up`) or gone: the device sends on through it only while it is up
    /// and fails what waited on it when it goes.
    Chain {
        /// The chained device.
        device: Uid,
        /// Its connection to the next device (`src` the device, both ports
        /// [`crate::CHAIN_PORT`]).
        conn: ConnKey,
        /// Installed, or not (any more).
        up: bool,
    },
    /// A connection was set up, with the time it took (for metrics).
    Opened {
        /// The connection.
        conn: ConnKey,
        /// Whether its far end is on a peer server.
        remote: bool,
        /// Time from request to installed.
        setup: std::time::Duration,
    },
}
