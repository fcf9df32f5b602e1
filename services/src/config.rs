//! The daemon's configuration: an embedded default for one server, or a
//! TOML file for real deployments (servers, local resources, stacks,
//! neighbours, scheduling, access policy) — the role of Galapagos's
//! cluster map.
//!
//! A bad file is refused with the file, the line and column, the field and
//! what was expected.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;
use toml::Spanned;
use uniplane_dataplane::wire::ReqType;
use uniplane_dataplane::Uid;

pub mod bounds;
mod error;
pub mod limits;
mod registry;
mod underlay;
mod unique;

pub use underlay::{ClassConfig, IngressRules, Scheduling, UnderlayConfig, MAX_CLASSES};

pub use error::ConfigError;
pub(crate) use error::Source;
pub use registry::{EtcdConfig, RegistryConfig};

/// The embedded default configuration (`uniplaned` with no arguments).
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    /// `engine` or `rtl`; a top-level key, so before any `[table]`.
    plane: Option<Spanned<String>>,
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    runtime: RawRuntime,
    #[serde(default)]
    engine: RawEngine,
    #[serde(default)]
    stacks: Vec<RawStack>,
    #[serde(default)]
    devices: Vec<RawDevice>,
    #[serde(default)]
    peers: Vec<RawPeer>,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    remotes: Vec<RawRemote>,
    #[serde(default)]
    policy: RawPolicy,
    #[serde(default)]
    failure: RawFailure,
    #[serde(default)]
    cluster: RawCluster,
    #[serde(default)]
    limits: limits::RawLimits,
    #[serde(default)]
    underlay: underlay::RawUnderlay,
    #[serde(default)]
    classes: Vec<underlay::RawClass>,
    #[serde(default)]
    registry: registry::RawRegistry,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    /// The cluster secret's file (`uniplane cluster keygen FILE`).
    secret: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawServer {
    id: Option<Spanned<String>>,
    name: Option<String>,
    peer_listen: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    dir: Option<PathBuf>,
    metrics: Option<Spanned<String>>,
    metrics_connections: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEngine {
    max_ports: Option<Spanned<i64>>,
    ring_depth: Option<Spanned<i64>>,
    voq_depth: Option<Spanned<i64>>,
    table_capacity: Option<Spanned<i64>>,
    mode: Option<Spanned<String>>,
    shards: Option<Spanned<i64>>,
    cpus: Option<Vec<Spanned<i64>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStack {
    name: Spanned<String>,
    listen: Option<Spanned<String>>,
    interface: Option<Spanned<String>>,
    address: Option<Spanned<String>>,
    transport: Option<Spanned<String>>,
    mtu: Option<Spanned<i64>>,
    gso: Option<Spanned<bool>>,
    io_uring: Option<Spanned<bool>>,
    eal: Option<Spanned<Vec<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    name: Spanned<String>,
    kind: Spanned<String>,
    device: Option<Spanned<i64>>,
    memory: Option<Spanned<i64>>,
    backend: Option<Spanned<String>>,
    gpu: Option<Spanned<i64>>,
    transfer: Option<Spanned<String>>,
    direct_from: Option<Spanned<i64>>,
    function: Option<Spanned<String>>,
    pio_threshold: Option<Spanned<i64>>,
    tokens: Option<Spanned<i64>>,
    stall_timeout_ms: Option<Spanned<i64>>,
    wait: Option<Spanned<String>>,
    dma_pull_from: Option<Spanned<i64>>,
    dma_staged_from: Option<Spanned<i64>>,
    dma_pipelined_from: Option<Spanned<i64>>,
    params: Option<Spanned<BTreeMap<String, toml::Value>>>,
    next: Option<Spanned<String>>,
    next_class: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    server: Spanned<String>,
    address: Spanned<String>,
    stack: Option<Spanned<String>>,
    tunnel: Option<Spanned<String>>,
    mac: Option<Spanned<String>>,
    #[serde(default)]
    pin: Vec<RawPin>,
    classes: Option<Vec<Spanned<i64>>>,
    types: Option<Vec<Spanned<String>>>,
    max_message: Option<Spanned<i64>>,
    sources: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    from: Spanned<String>,
    via: Spanned<String>,
    to: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPin {
    class: Spanned<i64>,
    stack: Spanned<String>,
    tunnel: Option<Spanned<String>>,
    mac: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRemote {
    server: Spanned<String>,
    via: Spanned<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    default: Option<Spanned<String>>,
    #[serde(default)]
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    src: Spanned<String>,
    dst: Spanned<String>,
    #[serde(default)]
    types: Vec<Spanned<String>>,
    action: Spanned<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFailure {
    heartbeat_ms: Option<Spanned<i64>>,
    misses: Option<Spanned<i64>>,
}

/// A UID pattern: `*`, `SERVER:*`, `SERVER:DEVICE`, or `A.B.C.D/LEN:*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidPattern {
    /// The pattern's value.
    pub key: Uid,
    /// Which of the 48 bits must match.
    pub mask: u64,
}

impl UidPattern {
    /// Matches every UID.
    pub const ANY: UidPattern = UidPattern {
        key: Uid::from_bytes([0; 6]),
        mask: 0,
    };

    /// Whether `uid` matches.
    pub fn matches(&self, uid: Uid) -> bool {
        (uid.to_u64() ^ self.key.to_u64()) & self.mask == 0
    }
}

impl FromStr for UidPattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "*" {
            return Ok(UidPattern::ANY);
        }
        let (server, device) = s.rsplit_once(':').ok_or_else(|| {
            format!("`{s}` is not a UID pattern such as *, 10.0.0.7:*, 10.0.0.7:3 or 10.0.0.0/24:*")
        })?;
        let (ip, prefix) = match server.split_once('/') {
            Some((ip, len)) => (
                ip,
                len.parse::<u32>()
                    .ok()
                    .filter(|l| *l <= 32)
                    .ok_or_else(|| format!("`{len}` is not a prefix length from 0 to 32"))?,
            ),
            None => (server, 32),
        };
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|_| format!("`{ip}` is not an IPv4 address"))?;
        let server_mask = if prefix == 0 {
            0
        } else {
            (u32::MAX << (32 - prefix)) as u64
        } << 16;
        let (device, device_mask) = if device == "*" {
            (0, 0)
        } else {
            (
                device
                    .parse::<u16>()
                    .map_err(|_| format!("`{device}` is not a device number or *"))?,
                0xffff,
            )
        };
        Ok(UidPattern {
            key: Uid::new(ip, device),
            mask: server_mask | device_mask,
        })
    }
}

/// One access rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRule {
    /// Who sends.
    pub src: UidPattern,
    /// Who receives.
    pub dst: UidPattern,
    /// Request types covered (`None`: all).
    pub types: Option<Vec<ReqType>>,
    /// Allow or deny.
    pub allow: bool,
}

/// What happens when no rule matches: the control core's own type.
pub use uniplane_control::DefaultAction;

/// A stack the daemon runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackConfig {
    /// The stack's name (`tcp`, `udp`, `ltl`, `mem`, …).
    pub name: String,
    /// Where its tunnel listener binds, for stacks over IP.
    pub listen: Option<SocketAddr>,
    /// How a stack on a network interface (`ether`, `smoltcp`, `dpdk`)
    /// is set up.
    pub options: uniplane_stacks::StackOptions,
}

impl StackConfig {
    /// Whether its tunnels are reached by MAC on its interface (and its
    /// listener is the interface itself).
    pub fn on_ethernet(&self) -> bool {
        matches!(self.name.as_str(), "ether" | "dpdk")
    }
}

/// The kinds of local device the daemon can host itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// Answers SEND with the same payload and serves WRTE/READ on its memory.
    Echo,
    /// A memory region served by WRTE/READ.
    Memory,
    /// Sends everything it receives back into the overlay: a hop of
    /// multi-hop routes.
    Relay,
    /// A kernel (`function = …`) on a thread of its own behind the
    /// emulated PCIe path: PIO mailbox and FPGA Connect.
    Kernel,
}

/// A device hosted by the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: DeviceKind,
    /// A fixed device number, or the next free one.
    pub device: Option<u16>,
    /// Bytes of memory it serves.
    pub memory: usize,
    /// Where a memory device keeps its bytes.
    pub backend: MemoryBackend,
    /// A kernel device's settings (`kind = "kernel"` only).
    pub kernel: Option<KernelDeviceConfig>,
    /// Where a kernel device's kernel runs (`kind = "kernel"` only;
    /// `Emulated` for every other kind).
    pub kernel_backend: KernelBackend,
    /// A library kernel's parameters (`params = { … }`; empty otherwise).
    pub params: uniplane_kernel::library::Params,
    /// An emulated kernel chained to a next device (`next`, `next_class`):
    /// its answers go there, and the next device's answers come back to
    /// the caller.
    pub next: Option<uniplane_control::NextHop>,
}

/// Where a kernel device's kernel runs (`backend = "emulated" | "rtl"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelBackend {
    /// A Rust kernel on a thread of its own behind the emulated PCIe path
    /// (PIO mailbox and FPGA Connect), on the software engine.
    #[default]
    Emulated,
    /// The Verilog kernel on a port of the RTL crossbar (`--plane rtl`,
    /// the `rtl` cargo feature): `echo` or `sum32` only, and none of the
    /// emulated path's settings.
    Rtl,
}

impl KernelBackend {
    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            KernelBackend::Emulated => "emulated",
            KernelBackend::Rtl => "rtl",
        }
    }
}

/// A kernel device's settings (`kind = "kernel"`, `backend = "emulated"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelDeviceConfig {
    /// What the kernel computes.
    pub function: KernelFunction,
    /// Messages of at most this many payload bytes take the PIO mailbox,
    /// larger ones FPGA Connect.
    pub pio_threshold: usize,
    /// FPGA Connect tokens: data frames in flight per direction.
    pub tokens: u32,
    /// How long requests may wait unanswered before the device is marked
    /// down and its connections closed.
    pub stall_timeout_ms: u64,
    /// How the kernel thread waits for work.
    pub wait: KernelWait,
    /// Bytes of device memory (`memory`), written and read one-sided
    /// through the emulated DMA engine; 0: none (every one-sided request
    /// is out of range).
    pub memory: usize,
    /// Which DMA mode a one-sided transfer of a given size takes.
    pub dma: DmaThresholds,
}

/// The sizes from which a kernel device's one-sided transfers take each
/// DMA mode of `uniplane_shm::p2p::TransferMode` (`dma_pull_from`,
/// `dma_staged_from`, `dma_pipelined_from`): a transfer of `n` bytes is
/// staged-pipelined when `n >= pipelined_from`, else staged when
/// `n >= staged_from`, else pull when `n >= pull_from`, else push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaThresholds {
    /// Bytes from which a transfer is pulled (the other side's ring).
    pub pull_from: usize,
    /// Bytes from which a transfer goes through a host bounce buffer.
    pub staged_from: usize,
    /// Bytes from which it goes through bounce slots in chunks.
    pub pipelined_from: usize,
}

/// A threshold that no one-sided transfer reaches (the largest payload
/// is 64 KiB - 1).
pub const DMA_NEVER: usize = uniplane_dataplane::Message::MAX_PAYLOAD + 1;

impl Default for DmaThresholds {
    /// Push at every size: measured with `uniplane-bench devices --backend
    /// emulated --size 65535` (`results.dma`), push is the fastest mode
    /// from 4 B to 64 KiB at memory speed — one descriptor, posted writes;
    /// the staged modes copy every byte twice (`docs/daemon.md`).
    fn default() -> Self {
        DmaThresholds {
            pull_from: DMA_NEVER,
            staged_from: DMA_NEVER,
            pipelined_from: DMA_NEVER,
        }
    }
}

/// What a kernel device computes (`function = …`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFunction {
    /// Answers each message with its payload.
    Echo,
    /// Answers the wrapping sum of the payload's little-endian `u32`s.
    Sum32,
    /// Answers the wrapping sum of the little-endian `u32`s in a range of
    /// its device memory (payload: address and length, `u64` LE each).
    SumMemory32,
    /// For failure tests: never takes a message, so tokens and slots run
    /// out and the device must be declared stalled.
    Stall,
    /// For failure tests: the kernel thread panics on its first message.
    Panic,
    /// For failure tests: answers frames that are not frames.
    Garbage,
    /// A kernel of `uniplane_kernel::library`, built from the device's
    /// `params`.
    Library(&'static str),
}

impl KernelFunction {
    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            KernelFunction::Echo => "echo",
            KernelFunction::Sum32 => "sum32",
            KernelFunction::SumMemory32 => "sum32-memory",
            KernelFunction::Stall => "stall",
            KernelFunction::Panic => "panic",
            KernelFunction::Garbage => "garbage",
            KernelFunction::Library(name) => name,
        }
    }
}

/// How a kernel thread waits for work (`wait = "park" | "busy"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelWait {
    /// Spins a little, then sleeps until the host rings it.
    #[default]
    Park,
    /// Polls without pause: lowest latency, one busy core.
    Busy,
}

/// A kernel device's PIO threshold when the file gives none: the PIO
/// mailbox's round trip is shorter up to 256 bytes (`docs/shm.md`, the
/// size-based choice of `uniplane_shm::p2p::PathPolicy`).
pub const DEFAULT_PIO_THRESHOLD: usize = 256;
/// FPGA Connect tokens of a kernel device by default.
pub const DEFAULT_KERNEL_TOKENS: u32 = 16;
/// A kernel device's stall timeout by default, in milliseconds.
pub const DEFAULT_STALL_TIMEOUT_MS: u64 = 1000;

/// Where a memory device keeps its bytes (`backend = "host" | "gpu"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryBackend {
    /// A vector in the daemon's memory, served inside the engine thread.
    #[default]
    Host,
    /// One allocation on a CUDA GPU, served by a thread of its own
    /// (needs the `gpu` cargo feature).
    Gpu(GpuMemoryConfig),
}

/// A GPU memory device's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuMemoryConfig {
    /// The CUDA device ordinal (`gpu = N`).
    pub ordinal: u32,
    /// How a write's payload reaches the GPU.
    pub transfer: Transfer,
    /// `transfer = "auto"`: payloads of at least this many bytes go direct,
    /// smaller ones staged.
    pub direct_from: usize,
}

/// How a write's payload reaches GPU memory (`transfer = ...`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transfer {
    /// Staged below `direct_from` bytes, direct from there on.
    Auto,
    /// Copied into a pinned bounce buffer, then host-to-device from it.
    Staged,
    /// Host-to-device from the payload itself, pinned for the copy.
    Direct,
}

impl Transfer {
    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Transfer::Auto => "auto",
            Transfer::Staged => "staged",
            Transfer::Direct => "direct",
        }
    }
}

/// A neighbouring server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// Its server ID.
    pub server: Ipv4Addr,
    /// Its daemon's peer address.
    pub address: SocketAddr,
    /// The stack tunnels to it use.
    pub stack: String,
    /// Where its tunnel listener for that stack is.
    pub tunnel: SocketAddr,
    /// Its MAC on our `ether`/`dpdk` stack's interface.
    pub mac: Option<[u8; 6]>,
    /// Traffic classes whose tunnels take another stack than `stack`
    /// (bulk over TCP, small messages over LTL, say).
    pub pins: Vec<ClassPin>,
    /// What it may send us.
    pub ingress: IngressRules,
}

/// A traffic class pinned to a stack of its own towards one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassPin {
    /// The class.
    pub class: u8,
    /// The stack its tunnel uses.
    pub stack: String,
    /// Where the peer's tunnel listener for that stack is (stacks over
    /// IP).
    pub tunnel: SocketAddr,
    /// The peer's MAC (stacks on Ethernet).
    pub mac: Option<[u8; 6]>,
}

impl PeerConfig {
    /// The stack, tunnel address and MAC of the tunnel of `class`.
    pub fn tunnel_of(&self, class: u8) -> (&str, SocketAddr, Option<[u8; 6]>) {
        match self.pins.iter().find(|p| p.class == class) {
            Some(p) => (&p.stack, p.tunnel, p.mac),
            None => (&self.stack, self.tunnel, self.mac),
        }
    }
}

/// A multi-hop route: traffic from `from` to `to` goes through `via`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteConfig {
    /// Source device name, or `*` for every local resource.
    pub from: String,
    /// Relay device name.
    pub via: String,
    /// Destination: a UID pattern.
    pub to: UidPattern,
}

/// How the engine thread waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineMode {
    /// Never sleeps.
    BusyPoll,
    /// Spins briefly, then parks until woken.
    SpinThenPark,
}

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// This server's ID.
    pub server: Ipv4Addr,
    /// A human name.
    pub name: String,
    /// Where peer daemons reach this one.
    pub peer_listen: SocketAddr,
    /// Runtime directory (control socket), if set in the file.
    pub runtime_dir: Option<PathBuf>,
    /// Prometheus metrics listener, if any.
    pub metrics: Option<SocketAddr>,
    /// Open connections whose counters the metrics export (the longest
    /// open first; `runtime.metrics_connections`, default 100): bounds
    /// the series a scrape carries.
    pub metrics_connections: usize,
    /// Engine sizes.
    pub max_ports: usize,
    /// Ring depth per port.
    pub ring_depth: usize,
    /// VOQ depth.
    pub voq_depth: usize,
    /// Forwarding entries per port.
    pub table_capacity: usize,
    /// Engine wait mode (also how the RTL plane's thread waits).
    pub mode: EngineMode,
    /// Engine threads (`[engine] shards`, default 1): ports are spread
    /// over them, one crossbar between them.
    pub shards: usize,
    /// CPUs to pin the shards to (`[engine] cpus`; shard k on the k-th,
    /// round); empty: not pinned.
    pub cpus: Vec<usize>,
    /// The forwarding plane (`plane = "engine" | "rtl"` at the top of the
    /// file; `uniplaned --plane` overrides it). Default: the engine.
    pub plane: crate::plane::PlaneKind,
    /// Stacks.
    pub stacks: Vec<StackConfig>,
    /// Devices hosted by the daemon.
    pub devices: Vec<DeviceConfig>,
    /// Neighbours.
    pub peers: Vec<PeerConfig>,
    /// Multi-hop routes.
    pub routes: Vec<RouteConfig>,
    /// Servers beyond a peer, reached through it (their traffic is
    /// carried on by the peer's daemon).
    pub remotes: Vec<uniplane_control::RemoteSpec>,
    /// Default access action.
    pub default_action: DefaultAction,
    /// Access rules, first match wins.
    pub rules: Vec<PolicyRule>,
    /// Heartbeat interval.
    pub heartbeat: std::time::Duration,
    /// Missed heartbeats that declare a peer failed.
    pub misses: u32,
    /// The cluster secret's file: peers prove they hold the same secret
    /// before any peer message or tunnel frame is believed. Required
    /// when the file names peers.
    pub secret: Option<PathBuf>,
    /// Bounds on the state clients and peers can make the daemon keep
    /// (`[limits]`; `resources` defaults to `max_ports`).
    pub limits: uniplane_control::Limits,
    /// Traffic classes and how they share each peer's tunnels.
    pub underlay: UnderlayConfig,
    /// Where names of resources and servers live (`[registry]`).
    pub registry: RegistryConfig,
}

impl Config {
    /// What differs between `self` (running) and `new` that only a
    /// restart can change, as the configuration's section or key names;
    /// empty when `new` changes nothing but what a reload applies live:
    /// the access rules (`[policy]`) and how the classes share the
    /// tunnels (`[underlay]` scheduling, rate and burst, the classes'
    /// weights and priorities).
    pub fn needs_restart_for(&self, new: &Config) -> Vec<&'static str> {
        let mut changed = Vec::new();
        let mut check = |differs: bool, name: &'static str| {
            if differs && !changed.contains(&name) {
                changed.push(name);
            }
        };
        check(self.server != new.server, "server.id");
        check(self.name != new.name, "server.name");
        check(self.peer_listen != new.peer_listen, "server.peer_listen");
        check(self.runtime_dir != new.runtime_dir, "runtime");
        check(
            (self.metrics, self.metrics_connections) != (new.metrics, new.metrics_connections),
            "metrics",
        );
        check(
            (
                self.max_ports,
                self.ring_depth,
                self.voq_depth,
                self.table_capacity,
                self.mode,
                self.shards,
                &self.cpus,
            ) != (
                new.max_ports,
                new.ring_depth,
                new.voq_depth,
                new.table_capacity,
                new.mode,
                new.shards,
                &new.cpus,
            ),
            "engine",
        );
        check(self.plane != new.plane, "plane");
        check(self.stacks != new.stacks, "stacks");
        check(self.devices != new.devices, "devices");
        check(self.peers != new.peers, "peers");
        check(self.routes != new.routes, "routes");
        check(self.remotes != new.remotes, "remotes");
        check(
            (self.heartbeat, self.misses) != (new.heartbeat, new.misses),
            "failure",
        );
        check(self.secret != new.secret, "cluster.secret");
        check(self.limits != new.limits, "limits");
        check(self.registry != new.registry, "registry");
        let ids = |c: &Config| c.underlay.classes.iter().map(|k| k.id).collect::<Vec<_>>();
        check(
            self.underlay.queue_depth != new.underlay.queue_depth || ids(self) != ids(new),
            "underlay (queue depth, which classes exist)",
        );
        // Everything but the access rules: a field added to Config and not
        // named above still refuses the reload rather than being ignored.
        let live = Config {
            rules: self.rules.clone(),
            default_action: self.default_action,
            underlay: self.underlay.clone(),
            ..new.clone()
        };
        if changed.is_empty() && live != *self {
            changed.push("other settings");
        }
        changed
    }

    /// The embedded default: one server on loopback stacks with an echo
    /// device. Stacks this build lacks are left out.
    pub fn embedded() -> Result<Config, ConfigError> {
        let mut c = Config::parse(DEFAULT_CONFIG, "<embedded default>")?;
        c.stacks
            .retain(|s| uniplane_stacks::STACK_NAMES.contains(&s.name.as_str()));
        Ok(c)
    }

    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            file: file.clone(),
            source,
        })?;
        Config::parse(&text, &file)
    }

    /// Validates configuration text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let src = Source { file, text };
        let raw: RawConfig = src.toml()?;

        let server = match &raw.server.id {
            Some(id) => match id.get_ref().parse::<Ipv4Addr>() {
                Ok(ip) => ip,
                Err(_) => {
                    return src.invalid(
                        id.span(),
                        "server.id",
                        format!("`{}` is not an IPv4 address", id.get_ref()),
                    )
                }
            },
            None => detect_server_id(),
        };
        let peer_listen = parse_addr(&src, raw.server.peer_listen.as_ref(), "server.peer_listen")?
            .unwrap_or(SocketAddr::from((Ipv4Addr::LOCALHOST, 7460)));
        let metrics = parse_addr(&src, raw.runtime.metrics.as_ref(), "runtime.metrics")?;
        let metrics_connections = src.number_or(
            raw.runtime.metrics_connections.as_ref(),
            100,
            "runtime.metrics_connections",
            bounds::METRICS_CONNECTIONS,
        )?;
        let plane = match raw.plane.as_ref() {
            None => crate::plane::PlaneKind::default(),
            Some(p) => match p.get_ref().parse() {
                Ok(kind) => kind,
                Err(crate::plane::UnknownPlane(other)) => {
                    return src.invalid(
                        p.span(),
                        "plane",
                        format!("`{other}`: expected \"engine\" or \"rtl\""),
                    )
                }
            },
        };
        let mode = match raw.engine.mode.as_ref() {
            None => EngineMode::SpinThenPark,
            Some(m) => match m.get_ref().as_str() {
                "busy-poll" => EngineMode::BusyPoll,
                "spin-then-park" => EngineMode::SpinThenPark,
                other => {
                    return src.invalid(
                        m.span(),
                        "engine.mode",
                        format!("`{other}`: expected \"busy-poll\" or \"spin-then-park\""),
                    )
                }
            },
        };

        let mut stacks = Vec::new();
        for s in &raw.stacks {
            let name = s.name.get_ref();
            if !KNOWN_STACKS.contains(&name.as_str()) {
                return src.invalid(
                    s.name.span(),
                    "stacks.name",
                    format!(
                        "unknown stack `{name}`: expected one of {}",
                        KNOWN_STACKS.join(", ")
                    ),
                );
            }
            stacks.push(stack_config(&src, s)?);
        }

        let mut devices = Vec::new();
        for d in &raw.devices {
            let kind = match d.kind.get_ref().as_str() {
                "echo" => DeviceKind::Echo,
                "memory" => DeviceKind::Memory,
                "relay" => DeviceKind::Relay,
                "kernel" => DeviceKind::Kernel,
                other => {
                    return src.invalid(
                        d.kind.span(),
                        "devices.kind",
                        format!(
                            "`{other}`: expected \"echo\", \"memory\", \"relay\" or \"kernel\""
                        ),
                    )
                }
            };
            let memory = src.number_or(
                d.memory.as_ref(),
                0,
                "devices.memory",
                bounds::DEVICE_MEMORY,
            )?;
            let kernel = kernel_device(&src, d, kind)?;
            devices.push(DeviceConfig {
                name: d.name.get_ref().clone(),
                kind,
                device: d
                    .device
                    .as_ref()
                    .map(|n| src.number(n, "devices.device", bounds::DEVICE))
                    .transpose()?,
                memory,
                backend: memory_backend(&src, d, kind, memory)?,
                kernel: kernel.map(|(k, _)| k),
                kernel_backend: kernel.map(|(_, b)| b).unwrap_or_default(),
                params: kernel_params(&src, d, kernel)?,
                next: kernel_next(&src, d, kernel)?,
            });
        }

        let underlay = underlay::parse(&src, &raw.underlay, &raw.classes)?;
        let mut peers = Vec::new();
        for p in &raw.peers {
            let server = match p.server.get_ref().parse::<Ipv4Addr>() {
                Ok(ip) => ip,
                Err(_) => {
                    return src.invalid(
                        p.server.span(),
                        "peers.server",
                        format!("`{}` is not an IPv4 address", p.server.get_ref()),
                    )
                }
            };
            let Some(address) = parse_addr(&src, Some(&p.address), "peers.address")? else {
                unreachable!("address is required")
            };
            let stack = match &p.stack {
                Some(s) if !KNOWN_STACKS.contains(&s.get_ref().as_str()) => {
                    return src.invalid(
                        s.span(),
                        "peers.stack",
                        format!("unknown stack `{}`", s.get_ref()),
                    );
                }
                Some(s) => s.get_ref().clone(),
                None => "tcp".to_owned(),
            };
            let tunnel = parse_addr(&src, p.tunnel.as_ref(), "peers.tunnel")?
                .unwrap_or(SocketAddr::new(address.ip(), 7470));
            let mac = parse_mac(&src, p.mac.as_ref(), "peers.mac")?;
            let on_ethernet = matches!(stack.as_str(), "ether" | "dpdk");
            if on_ethernet && mac.is_none() {
                return src.invalid(
                    p.server.span(),
                    "peers.mac",
                    format!("a peer over the `{stack}` stack needs its MAC (mac = \"02:…\")"),
                );
            }
            let mut pins: Vec<ClassPin> = Vec::new();
            for pin in &p.pin {
                let class: u8 = src.number(&pin.class, "peers.pin.class", underlay::CLASS_ID)?;
                if underlay.class(class).is_none() || pins.iter().any(|x| x.class == class) {
                    return src.invalid(
                        pin.class.span(),
                        "peers.pin.class",
                        format!("class {class} is not defined in [[classes]], or pinned twice"),
                    );
                }
                let stack = pin.stack.get_ref().clone();
                if !KNOWN_STACKS.contains(&stack.as_str()) {
                    return src.invalid(
                        pin.stack.span(),
                        "peers.pin.stack",
                        format!("unknown stack `{stack}`"),
                    );
                }
                let mac = parse_mac(&src, pin.mac.as_ref(), "peers.pin.mac")?;
                if matches!(stack.as_str(), "ether" | "dpdk") && mac.is_none() {
                    return src.invalid(
                        pin.stack.span(),
                        "peers.pin.mac",
                        format!("a class over the `{stack}` stack needs the peer's MAC"),
                    );
                }
                let tunnel =
                    parse_addr(&src, pin.tunnel.as_ref(), "peers.pin.tunnel")?.unwrap_or(tunnel);
                pins.push(ClassPin {
                    class,
                    stack,
                    tunnel,
                    mac,
                });
            }
            peers.push(PeerConfig {
                server,
                address,
                stack,
                tunnel,
                mac,
                pins,
                ingress: underlay::ingress(
                    &src,
                    &underlay::RawIngress {
                        classes: p.classes.as_deref(),
                        types: p.types.as_deref(),
                        max_message: p.max_message.as_ref(),
                        sources: p.sources.as_deref(),
                    },
                    server,
                    &underlay,
                )?,
            });
        }

        if let (Some(first), None) = (raw.peers.first(), &raw.cluster.secret) {
            return src.invalid(
                first.server.span(),
                "cluster.secret",
                "peers are configured but no cluster secret authenticates them: \
                 create one with `uniplane cluster keygen FILE` and name it in [cluster] secret",
            );
        }

        let mut routes = Vec::new();
        for r in &raw.routes {
            for (field, name) in [("routes.from", &r.from), ("routes.via", &r.via)] {
                let any_source = field == "routes.from" && name.get_ref() == "*";
                if !any_source && !devices.iter().any(|d| &d.name == name.get_ref()) {
                    return src.invalid(
                        name.span(),
                        field,
                        format!("no device named `{}`", name.get_ref()),
                    );
                }
            }
            let to = match r.to.get_ref().parse() {
                Ok(p) => p,
                Err(e) => return src.invalid(r.to.span(), "routes.to", e),
            };
            routes.push(RouteConfig {
                from: r.from.get_ref().clone(),
                via: r.via.get_ref().clone(),
                to,
            });
        }

        let remotes = parse_remotes(&src, &raw.remotes, server, &mut peers)?;

        let default_action = match raw.policy.default.as_ref() {
            None => DefaultAction::AllowLocal,
            Some(d) => match d.get_ref().as_str() {
                "allow" => DefaultAction::Allow,
                "deny" => DefaultAction::Deny,
                "allow-local" => DefaultAction::AllowLocal,
                other => {
                    return src.invalid(
                        d.span(),
                        "policy.default",
                        format!("`{other}`: expected \"allow\", \"deny\" or \"allow-local\""),
                    )
                }
            },
        };
        let mut rules = Vec::new();
        for r in &raw.policy.rules {
            let pattern = |s: &Spanned<String>, field: &str| -> Result<UidPattern, ConfigError> {
                s.get_ref()
                    .parse()
                    .or_else(|e: String| src.invalid(s.span(), field, e))
            };
            let types = if r.types.is_empty() || r.types.iter().any(|t| t.get_ref() == "*") {
                None
            } else {
                Some(request_types(&src, &r.types, "policy.rules.types")?)
            };
            let allow = match r.action.get_ref().as_str() {
                "allow" => true,
                "deny" => false,
                other => {
                    return src.invalid(
                        r.action.span(),
                        "policy.rules.action",
                        format!("`{other}`: expected \"allow\" or \"deny\""),
                    )
                }
            };
            rules.push(PolicyRule {
                src: pattern(&r.src, "policy.rules.src")?,
                dst: pattern(&r.dst, "policy.rules.dst")?,
                types,
                allow,
            });
        }

        let engine = &raw.engine;
        let max_ports = src.number_or(
            engine.max_ports.as_ref(),
            32,
            "engine.max_ports",
            bounds::MAX_PORTS,
        )?;
        let ring_depth = src.number_or(
            engine.ring_depth.as_ref(),
            1024,
            "engine.ring_depth",
            bounds::RING_DEPTH,
        )?;
        let voq_depth = src.number_or(
            engine.voq_depth.as_ref(),
            64,
            "engine.voq_depth",
            bounds::VOQ_DEPTH,
        )?;
        let table_capacity = src.number_or(
            engine.table_capacity.as_ref(),
            4096,
            "engine.table_capacity",
            bounds::TABLE_CAPACITY,
        )?;
        let shards = src.number_or(engine.shards.as_ref(), 1, "engine.shards", bounds::SHARDS)?;
        let cpus = engine
            .cpus
            .iter()
            .flatten()
            .map(|c| src.number(c, "engine.cpus", bounds::CPU))
            .collect::<Result<Vec<usize>, _>>()?;
        if voq_depth as u64 * (max_ports * max_ports) as u64 > bounds::VOQ_SLOTS {
            let span = engine
                .voq_depth
                .as_ref()
                .or(engine.max_ports.as_ref())
                .map_or(0..0, |v| v.span());
            return src.invalid(
                span,
                "engine.voq_depth",
                format!(
                    "max_ports² × voq_depth = {max_ports}² × {voq_depth} queue slots, more than {}: \
                     with {max_ports} ports voq_depth can be at most {}",
                    bounds::VOQ_SLOTS,
                    bounds::VOQ_SLOTS / (max_ports * max_ports) as u64
                ),
            );
        }
        if let Some(d) = raw.devices.get(max_ports - 1) {
            return src.invalid(
                d.name.span(),
                "devices.name",
                format!(
                    "device `{}` needs port {} of the engine, but engine.max_ports is {max_ports} \
                     (the daemon takes one port, each device one)",
                    d.name.get_ref(),
                    max_ports + 1
                ),
            );
        }
        let heartbeat_ms: u64 = src.number_or(
            raw.failure.heartbeat_ms.as_ref(),
            100,
            "failure.heartbeat_ms",
            bounds::HEARTBEAT_MS,
        )?;
        let misses = src.number_or(
            raw.failure.misses.as_ref(),
            5,
            "failure.misses",
            bounds::MISSES,
        )?;

        let limits = limits::parse(
            &src,
            &raw.limits,
            uniplane_control::Limits {
                resources: max_ports,
                ..Default::default()
            },
        )?;

        let config = Config {
            server,
            name: raw
                .server
                .name
                .clone()
                .unwrap_or_else(|| "uniplane".to_owned()),
            peer_listen,
            runtime_dir: raw.runtime.dir.clone(),
            metrics,
            metrics_connections,
            max_ports,
            ring_depth,
            voq_depth,
            table_capacity,
            mode,
            shards,
            cpus,
            plane,
            stacks,
            devices,
            peers,
            routes,
            remotes,
            default_action,
            rules,
            heartbeat: std::time::Duration::from_millis(heartbeat_ms),
            misses,
            secret: raw.cluster.secret.clone(),
            limits,
            underlay,
            registry: registry::parse(&src, &raw.registry, raw.cluster.secret.is_some())?,
        };
        unique::refuse_clashes(&src, &raw, &config)?;
        Ok(config)
    }

    /// Whether the policy lets `src` open or use a connection to `dst`
    /// with requests of type `kind`.
    pub fn allows(&self, src: Uid, dst: Uid, kind: ReqType) -> bool {
        for r in &self.rules {
            let typed = r.types.as_ref().is_none_or(|t| t.contains(&kind));
            if r.src.matches(src) && r.dst.matches(dst) && typed {
                return r.allow;
            }
        }
        match self.default_action {
            DefaultAction::Allow => true,
            DefaultAction::Deny => false,
            DefaultAction::AllowLocal => src.server() == self.server && dst.server() == self.server,
        }
    }
}

/// Stack names a configuration may use.
pub const KNOWN_STACKS: &[&str] = &[
    "mem", "shm", "udp", "tcp", "ltl", "ether", "smoltcp", "dpdk",
];

/// A MAC address, if given.
fn parse_mac(
    src: &Source<'_>,
    value: Option<&Spanned<String>>,
    field: &str,
) -> Result<Option<[u8; 6]>, ConfigError> {
    match value {
        None => Ok(None),
        Some(m) => match m.get_ref().parse::<uniplane_frame::MacAddr>() {
            Ok(mac) => Ok(Some(mac.0)),
            Err(_) => src.invalid(
                m.span(),
                field,
                format!(
                    "`{}` is not a MAC address such as 02:00:00:00:00:01",
                    m.get_ref()
                ),
            ),
        },
    }
}

/// The `[[remotes]]`: servers reached through a peer. A peer may carry
/// what they send, so its default ingress sources grow by them.
fn parse_remotes(
    src: &Source<'_>,
    raw: &[RawRemote],
    me: Ipv4Addr,
    peers: &mut [PeerConfig],
) -> Result<Vec<uniplane_control::RemoteSpec>, ConfigError> {
    let ip = |s: &Spanned<String>, field: &str| -> Result<Ipv4Addr, ConfigError> {
        s.get_ref().parse().or_else(|_| {
            src.invalid(
                s.span(),
                field,
                format!("`{}` is not an IPv4 address", s.get_ref()),
            )
        })
    };
    let mut remotes: Vec<uniplane_control::RemoteSpec> = Vec::new();
    for r in raw {
        let server = ip(&r.server, "remotes.server")?;
        let via = ip(&r.via, "remotes.via")?;
        if server == me || peers.iter().any(|p| p.server == server) {
            return src.invalid(
                r.server.span(),
                "remotes.server",
                format!("{server} is this server or a peer: it is reached directly"),
            );
        }
        if remotes.iter().any(|x| x.server == server) {
            return src.invalid(
                r.server.span(),
                "remotes.server",
                format!("{server} is listed twice"),
            );
        }
        let Some(peer) = peers.iter_mut().find(|p| p.server == via) else {
            return src.invalid(
                r.via.span(),
                "remotes.via",
                format!("{via} is not a peer ([[peers]]): a remote server is reached through one"),
            );
        };
        if !peer.ingress.sources_set {
            peer.ingress.sources.push(UidPattern {
                key: Uid::new(server, 0),
                mask: 0xffff_ffff << 16,
            });
        }
        remotes.push(uniplane_control::RemoteSpec { server, via });
    }
    Ok(remotes)
}

/// A `[[stacks]]` entry: the options only stacks on an interface take,
/// and what each of those needs.
/// A memory device's backend: `backend`, and for `gpu` its `gpu`,
/// `transfer` and `direct_from`, each refused where it means nothing.
fn memory_backend(
    src: &Source<'_>,
    d: &RawDevice,
    kind: DeviceKind,
    memory: usize,
) -> Result<MemoryBackend, ConfigError> {
    let gpu_only = [
        ("gpu", d.gpu.as_ref().map(|v| v.span())),
        ("transfer", d.transfer.as_ref().map(|v| v.span())),
        ("direct_from", d.direct_from.as_ref().map(|v| v.span())),
    ];
    let backend = match &d.backend {
        None => "host",
        // Checked by `kernel_device`.
        Some(_) if kind == DeviceKind::Kernel => "host",
        Some(b) if kind != DeviceKind::Memory => {
            return src.invalid(
                b.span(),
                "devices.backend",
                "only a `kind = \"memory\"` or `kind = \"kernel\"` device has a backend",
            )
        }
        Some(b) => b.get_ref().as_str(),
    };
    match backend {
        "host" => {
            if let Some((field, Some(span))) = gpu_only.into_iter().find(|(_, s)| s.is_some()) {
                return src.invalid(
                    span,
                    &format!("devices.{field}"),
                    "only a `backend = \"gpu\"` device takes it",
                );
            }
            Ok(MemoryBackend::Host)
        }
        "gpu" => {
            let span = d.backend.as_ref().map(|b| b.span()).unwrap_or_default();
            if !cfg!(feature = "gpu") {
                return src.invalid(
                    span,
                    "devices.backend",
                    "`gpu`: this daemon was built without the gpu feature \
                     (build with `--features gpu`)",
                );
            }
            if memory == 0 {
                return src.invalid(
                    span,
                    "devices.backend",
                    "a gpu memory device needs `memory` (bytes) above 0",
                );
            }
            let transfer = match d.transfer.as_ref() {
                None => Transfer::Auto,
                Some(t) => match t.get_ref().as_str() {
                    "auto" => Transfer::Auto,
                    "staged" => Transfer::Staged,
                    "direct" => Transfer::Direct,
                    other => {
                        return src.invalid(
                            t.span(),
                            "devices.transfer",
                            format!("`{other}`: expected \"auto\", \"staged\" or \"direct\""),
                        )
                    }
                },
            };
            if let (Some(v), false) = (&d.direct_from, transfer == Transfer::Auto) {
                return src.invalid(
                    v.span(),
                    "devices.direct_from",
                    "only `transfer = \"auto\"` has a crossover",
                );
            }
            Ok(MemoryBackend::Gpu(GpuMemoryConfig {
                ordinal: src.number_or(d.gpu.as_ref(), 0, "devices.gpu", bounds::GPU)?,
                transfer,
                direct_from: src.number_or(
                    d.direct_from.as_ref(),
                    DEFAULT_DIRECT_FROM,
                    "devices.direct_from",
                    bounds::DIRECT_FROM,
                )?,
            }))
        }
        other => src.invalid(
            d.backend.as_ref().map(|b| b.span()).unwrap_or_default(),
            "devices.backend",
            format!("`{other}`: expected \"host\" or \"gpu\""),
        ),
    }
}

/// A kernel device's settings: `backend` (`emulated`, or `rtl` in a build
/// with the `rtl` feature), `function`, `pio_threshold`, `tokens`,
/// `stall_timeout_ms` and `wait`, each refused on other kinds. An `rtl`
/// kernel is `echo` or `sum32` (the kernels the RTL has) and refuses the
/// emulated path's settings, which mean nothing there.
fn kernel_device(
    src: &Source<'_>,
    d: &RawDevice,
    kind: DeviceKind,
) -> Result<Option<(KernelDeviceConfig, KernelBackend)>, ConfigError> {
    let kernel_only = [
        ("function", d.function.as_ref().map(|v| v.span())),
        ("pio_threshold", d.pio_threshold.as_ref().map(|v| v.span())),
        ("tokens", d.tokens.as_ref().map(|v| v.span())),
        (
            "stall_timeout_ms",
            d.stall_timeout_ms.as_ref().map(|v| v.span()),
        ),
        ("wait", d.wait.as_ref().map(|v| v.span())),
        ("dma_pull_from", d.dma_pull_from.as_ref().map(|v| v.span())),
        (
            "dma_staged_from",
            d.dma_staged_from.as_ref().map(|v| v.span()),
        ),
        (
            "dma_pipelined_from",
            d.dma_pipelined_from.as_ref().map(|v| v.span()),
        ),
    ];
    if kind != DeviceKind::Kernel {
        if let Some((field, Some(span))) = kernel_only.into_iter().find(|(_, s)| s.is_some()) {
            return src.invalid(
                span,
                &format!("devices.{field}"),
                "only a `kind = \"kernel\"` device takes it",
            );
        }
        return Ok(None);
    }
    let backend = match d.backend.as_ref() {
        None => KernelBackend::Emulated,
        Some(b) => match b.get_ref().as_str() {
            "emulated" => KernelBackend::Emulated,
            "rtl" if !cfg!(feature = "rtl") => {
                return src.invalid(
                    b.span(),
                    "devices.backend",
                    "`rtl`: this daemon was built without the rtl feature \
                     (build with `--features rtl`)",
                )
            }
            "rtl" => KernelBackend::Rtl,
            other => {
                return src.invalid(
                    b.span(),
                    "devices.backend",
                    format!("`{other}`: a kernel device's backend is \"emulated\" or \"rtl\""),
                )
            }
        },
    };
    if backend == KernelBackend::Rtl {
        let emulated_only = kernel_only[1..]
            .iter()
            .find_map(|(field, span)| Some((field, span.clone()?)));
        if let Some((field, span)) = emulated_only {
            return src.invalid(
                span,
                &format!("devices.{field}"),
                "a setting of the emulated path: a `backend = \"rtl\"` kernel does not take it",
            );
        }
    }
    if let (Some(m), KernelBackend::Rtl) = (&d.memory, backend) {
        return src.invalid(
            m.span(),
            "devices.memory",
            "a `backend = \"rtl\"` kernel has no memory of its own to serve",
        );
    }
    let function =
        match d.function.as_ref() {
            None => {
                return src.invalid(
                    d.kind.span(),
                    "devices.function",
                    "a kernel device needs `function` (\"echo\" or \"sum32\")",
                )
            }
            Some(f) => {
                match f.get_ref().as_str() {
                    "echo" => KernelFunction::Echo,
                    "sum32" => KernelFunction::Sum32,
                    other if backend == KernelBackend::Rtl => {
                        return src.invalid(
                            f.span(),
                            "devices.function",
                            format!(
                                "`{other}`: a `backend = \"rtl\"` kernel is \"echo\" or \"sum32\" \
                         (the kernels the RTL has)"
                            ),
                        )
                    }
                    "stall" => KernelFunction::Stall,
                    "panic" => KernelFunction::Panic,
                    "garbage" => KernelFunction::Garbage,
                    "sum32-memory" => KernelFunction::SumMemory32,
                    other => match uniplane_kernel::library::spec(other) {
                        Some(spec) => KernelFunction::Library(spec.name),
                        None => {
                            let library: Vec<String> = uniplane_kernel::library::LIBRARY
                                .iter()
                                .map(|s| format!("\"{}\"", s.name))
                                .collect();
                            return src.invalid(
                                f.span(),
                                "devices.function",
                                format!(
                            "`{other}`: expected \"echo\", \"sum32\" or \"sum32-memory\"{}{} \
                             (or, for failure tests, \"stall\", \"panic\" or \"garbage\")",
                            if library.is_empty() { "" } else { ", or a library kernel: " },
                            library.join(", ")
                        ),
                            );
                        }
                    },
                }
            }
        };
    let wait = match d.wait.as_ref() {
        None => KernelWait::Park,
        Some(w) => match w.get_ref().as_str() {
            "park" => KernelWait::Park,
            "busy" => KernelWait::Busy,
            other => {
                return src.invalid(
                    w.span(),
                    "devices.wait",
                    format!("`{other}`: expected \"park\" or \"busy\""),
                )
            }
        },
    };
    let config = KernelDeviceConfig {
        function,
        pio_threshold: src.number_or(
            d.pio_threshold.as_ref(),
            DEFAULT_PIO_THRESHOLD,
            "devices.pio_threshold",
            bounds::PIO_THRESHOLD,
        )?,
        tokens: src.number_or(
            d.tokens.as_ref(),
            DEFAULT_KERNEL_TOKENS,
            "devices.tokens",
            bounds::KERNEL_TOKENS,
        )?,
        stall_timeout_ms: src.number_or(
            d.stall_timeout_ms.as_ref(),
            DEFAULT_STALL_TIMEOUT_MS,
            "devices.stall_timeout_ms",
            bounds::STALL_TIMEOUT_MS,
        )?,
        wait,
        memory: src.number_or(
            d.memory.as_ref(),
            0,
            "devices.memory",
            bounds::DEVICE_MEMORY,
        )?,
        dma: DmaThresholds {
            pull_from: src.number_or(
                d.dma_pull_from.as_ref(),
                DMA_NEVER,
                "devices.dma_pull_from",
                bounds::DMA_FROM,
            )?,
            staged_from: src.number_or(
                d.dma_staged_from.as_ref(),
                DMA_NEVER,
                "devices.dma_staged_from",
                bounds::DMA_FROM,
            )?,
            pipelined_from: src.number_or(
                d.dma_pipelined_from.as_ref(),
                DMA_NEVER,
                "devices.dma_pipelined_from",
                bounds::DMA_FROM,
            )?,
        },
    };
    Ok(Some((config, backend)))
}

/// A library kernel's `params`: strings, integers, floats and booleans,
/// each kept as its text; checked by the kernel (cheaply: nothing is
/// built until the device starts). Refused on every other device.
fn kernel_params(
    src: &Source<'_>,
    d: &RawDevice,
    kernel: Option<(KernelDeviceConfig, KernelBackend)>,
) -> Result<uniplane_kernel::library::Params, ConfigError> {
    let function = kernel.map(|(k, _)| k.function);
    let Some(raw) = d.params.as_ref() else {
        if let Some(KernelFunction::Library(name)) = function {
            if let Some(Err(e)) = uniplane_kernel::library::check(name, &Default::default()) {
                let span = d.function.as_ref().map_or(d.kind.span(), |f| f.span());
                return src.invalid(
                    span,
                    "devices.params",
                    format!("device `{}`: kernel `{name}`: {e}", d.name.get_ref()),
                );
            }
        }
        return Ok(Default::default());
    };
    let Some(KernelFunction::Library(name)) = function else {
        return src.invalid(
            raw.span(),
            "devices.params",
            "only a library kernel takes parameters (this device's kind or function takes none)",
        );
    };
    let mut params = uniplane_kernel::library::Params::new();
    for (key, value) in raw.get_ref() {
        let text = match value {
            toml::Value::String(v) => v.clone(),
            toml::Value::Integer(v) => v.to_string(),
            toml::Value::Float(v) => v.to_string(),
            toml::Value::Boolean(v) => v.to_string(),
            other => {
                return src.invalid(
                    raw.span(),
                    "devices.params",
                    format!(
                        "`{key}`: a {} — a parameter is a string, number or boolean",
                        other.type_str()
                    ),
                )
            }
        };
        params.insert(key.clone(), text);
    }
    if let Some(Err(e)) = uniplane_kernel::library::check(name, &params) {
        return src.invalid(
            raw.span(),
            "devices.params",
            format!("device `{}`: kernel `{name}`: {e}", d.name.get_ref()),
        );
    }
    Ok(params)
}

/// An emulated kernel's `next` (a UID, `SERVER:DEVICE`) and `next_class`.
fn kernel_next(
    src: &Source<'_>,
    d: &RawDevice,
    kernel: Option<(KernelDeviceConfig, KernelBackend)>,
) -> Result<Option<uniplane_control::NextHop>, ConfigError> {
    let Some(next) = d.next.as_ref() else {
        if let Some(c) = &d.next_class {
            return src.invalid(c.span(), "devices.next_class", "it goes with `next`");
        }
        return Ok(None);
    };
    match kernel {
        Some((_, KernelBackend::Emulated)) => {}
        Some((_, KernelBackend::Rtl)) => {
            return src.invalid(
                next.span(),
                "devices.next",
                "a `backend = \"rtl\"` kernel answers its caller only: chains are emulated kernels",
            )
        }
        None => {
            return src.invalid(
                next.span(),
                "devices.next",
                "only a `kind = \"kernel\"` device takes it",
            )
        }
    }
    let uid: Uid = match next.get_ref().parse() {
        Ok(uid) => uid,
        Err(_) => {
            return src.invalid(
                next.span(),
                "devices.next",
                format!(
                    "`{}`: expected the next device's UID, SERVER:DEVICE (e.g. \"10.0.0.2:5\")",
                    next.get_ref()
                ),
            )
        }
    };
    let class = src.number_or(
        d.next_class.as_ref(),
        0u8,
        "devices.next_class",
        underlay::CLASS_ID,
    )?;
    Ok(Some(uniplane_control::NextHop { uid, class }))
}

/// `direct_from` when the file gives none: payloads of at least this many
/// bytes go direct under `transfer = "auto"`. Above the largest payload,
/// so `auto` stages everything: on an H100, pinning each payload made
/// direct writes 6 to 16 times slower than staged ones at every message
/// size from 4 KiB to 64 KiB (`uniplane-bench devices --memory gpu`).
pub const DEFAULT_DIRECT_FROM: usize = uniplane_dataplane::Message::MAX_PAYLOAD + 1;

fn stack_config(src: &Source<'_>, s: &RawStack) -> Result<StackConfig, ConfigError> {
    let name = s.name.get_ref().clone();
    let on_iface = matches!(name.as_str(), "ether" | "smoltcp" | "dpdk");
    let misplaced = [
        ("stacks.interface", s.interface.as_ref().map(Spanned::span)),
        ("stacks.address", s.address.as_ref().map(Spanned::span)),
        ("stacks.transport", s.transport.as_ref().map(Spanned::span)),
        ("stacks.mtu", s.mtu.as_ref().map(Spanned::span)),
        ("stacks.gso", s.gso.as_ref().map(Spanned::span)),
        ("stacks.io_uring", s.io_uring.as_ref().map(Spanned::span)),
        ("stacks.eal", s.eal.as_ref().map(Spanned::span)),
    ];
    for (field, span) in misplaced {
        let Some(span) = span else { continue };
        let allowed = match field {
            "stacks.interface" => on_iface,
            "stacks.mtu" => matches!(name.as_str(), "udp" | "ltl" | "ether" | "dpdk"),
            "stacks.gso" => name == "udp",
            "stacks.io_uring" => matches!(name.as_str(), "udp" | "ltl"),
            "stacks.eal" => name == "dpdk",
            _ => name == "smoltcp",
        };
        if !allowed {
            return src.invalid(
                span,
                field,
                format!("the `{name}` stack takes no such option"),
            );
        }
    }
    if on_iface && s.interface.is_none() {
        return src.invalid(
            s.name.span(),
            "stacks.interface",
            format!("the `{name}` stack runs on an interface: name it (interface = \"eth0\")"),
        );
    }
    if matches!(name.as_str(), "ether" | "dpdk") {
        if let Some(l) = &s.listen {
            return src.invalid(
                l.span(),
                "stacks.listen",
                format!("the `{name}` stack listens on its interface, not an address"),
            );
        }
    }
    let address = match &s.address {
        None if name == "smoltcp" => {
            return src.invalid(
                s.name.span(),
                "stacks.address",
                "the `smoltcp` stack needs its own address (address = \"10.0.0.1/24\")",
            )
        }
        None => None,
        Some(a) => {
            let parsed = a.get_ref().split_once('/').and_then(|(ip, len)| {
                Some((
                    ip.parse::<Ipv4Addr>().ok()?,
                    len.parse::<u8>().ok().filter(|l| *l <= 32)?,
                ))
            });
            match parsed {
                Some(p) => Some(p),
                None => {
                    return src.invalid(
                        a.span(),
                        "stacks.address",
                        format!(
                            "`{}` is not an address with its prefix, such as 10.0.0.1/24",
                            a.get_ref()
                        ),
                    )
                }
            }
        }
    };
    let datagrams = match s.transport.as_ref().map(|t| (t, t.get_ref().as_str())) {
        None | Some((_, "tcp")) => false,
        Some((_, "udp")) => true,
        Some((t, other)) => {
            return src.invalid(
                t.span(),
                "stacks.transport",
                format!("`{other}`: expected \"tcp\" or \"udp\""),
            )
        }
    };
    let on_ethernet = matches!(name.as_str(), "ether" | "dpdk");
    Ok(StackConfig {
        name,
        listen: parse_addr(src, s.listen.as_ref(), "stacks.listen")?,
        options: uniplane_stacks::StackOptions {
            interface: s.interface.as_ref().map(|i| i.get_ref().clone()),
            // Tunnels over Ethernet run LTL underneath: plain frames carry
            // one link per peer MAC, and each daemon opens its own tunnel
            // (a class each) to the other.
            reliable: on_ethernet,
            address,
            datagrams,
            mtu: s
                .mtu
                .as_ref()
                .map(|m| src.number(m, "stacks.mtu", bounds::STACK_MTU))
                .transpose()?,
            gso: s.gso.as_ref().map(|g| *g.get_ref()),
            io_uring: s.io_uring.as_ref().is_some_and(|u| *u.get_ref()),
            eal: s
                .eal
                .as_ref()
                .map(|e| e.get_ref().clone())
                .unwrap_or_default(),
        },
    })
}

/// Request types by their wire names (`SEND`, `WRTE`, `READ`, …).
fn request_types(
    src: &Source<'_>,
    list: &[Spanned<String>],
    field: &str,
) -> Result<Vec<ReqType>, ConfigError> {
    let mut v = Vec::new();
    for t in list {
        match ReqType::ALL
            .iter()
            .find(|k| k.name() == t.get_ref().as_str())
        {
            Some(k) => v.push(*k),
            None => {
                return src.invalid(
                    t.span(),
                    field,
                    format!(
                        "unknown request type `{}` (SEND, WRTE, READ, …)",
                        t.get_ref()
                    ),
                )
            }
        }
    }
    Ok(v)
}

fn parse_addr(
    src: &Source<'_>,
    value: Option<&Spanned<String>>,
    field: &str,
) -> Result<Option<SocketAddr>, ConfigError> {
    match value {
        None => Ok(None),
        Some(v) => match v.get_ref().parse::<SocketAddr>() {
            Ok(a) => Ok(Some(a)),
            Err(_) => src.invalid(
                v.span(),
                field,
                format!("`{}` is not an address such as 127.0.0.1:7470", v.get_ref()),
            ),
        },
    }
}

/// The first non-loopback IPv4 address of this host, else 127.0.0.1.
///
/// Found without sending anything: a UDP socket "connected" to a
/// documentation address reveals the source address routing would pick.
pub fn detect_server_id() -> Ipv4Addr {
    let probe = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|s| s.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).map(|_| s))
        .and_then(|s| s.local_addr());
    match probe {
        Ok(SocketAddr::V4(a)) if !a.ip().is_loopback() && !a.ip().is_unspecified() => *a.ip(),
        _ => Ipv4Addr::LOCALHOST,
    }
}

#[cfg(test)]
mod tests;
