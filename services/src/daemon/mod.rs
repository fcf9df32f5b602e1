//! `uniplaned`: DUA's CPU control agent, as a thin driver of the control
//! core (`uniplane-control`).
//!
//! Every decision — registry, routes, admission, teardown, failures — is
//! the core's. This module feeds it from the I/O sources and carries out
//! what it asks, one module per source:
//!
//! ```text
//!  sessions (control socket) ─┐                         ┌─► plane (batches, async)
//!  peers (peer channels) ─────┤  driver: Control core   ├─► notices (daemon port)
//!  tunnels (stack links) ─────┤  + timers, one task     ├─► peers / tunnels
//!  plane completions ─────────┘                         └─► answers to sessions
//!  data (data socket): hands a process its port's rings
//!  observe: status, listings, counters and metrics
//! ```

mod data;
mod discovery;
mod driver;
mod observe;
mod peers;
mod seal;
mod security;
mod sessions;
mod tunnels;
mod underlay;
mod watch;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use uniplane_control::{
    AccessRule, ControlConfig, ControlError, DeviceSpec, Event, MultiHopRoute, PeerSpec, UidMatch,
};
use uniplane_dataplane::{BoxLink, Message, Stack, Uid};

pub use self::observe::parse_policy;
use crate::config::{Config, DeviceKind};
use crate::control::PeerRequest;
pub use uniplane_overlay::PlaneHandle;

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new configuration changes what only a restart can.
    #[error("these change only at a restart: {}; nothing was applied", .0.join(", "))]
    NeedsRestart(Vec<&'static str>),
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A file or socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The configured plane cannot run in this build or on this machine.
    #[error("{0}")]
    NoPlane(String),
    /// A configured stack cannot run.
    #[error("{0}")]
    NoStack(String),
    /// The plane refused a setup step.
    #[error("plane: {0}")]
    Plane(#[from] uniplane_overlay::PlaneError),
    /// The cluster secret cannot be used.
    #[error(transparent)]
    Secret(#[from] crate::auth::SecretError),
    /// The runtime directory is another user's or open to others.
    #[error(transparent)]
    RuntimeDir(#[from] uniplane_client::RuntimeDirError),
    /// A device's memory could not be opened.
    #[error("device `{device}`: {source}")]
    Device {
        /// The device's name.
        device: String,
        /// Why.
        source: crate::devices::gpu::GpuError,
    },
    /// A host memory device's region could not be created.
    #[error("device `{device}`: its memory: {source}")]
    HostMemory {
        /// The device's name.
        device: String,
        /// Why.
        source: std::io::Error,
    },
    /// A kernel device's emulated path or thread could not be set up.
    #[error("device `{device}`: {source}")]
    KernelDevice {
        /// The device's name.
        device: String,
        /// Why.
        source: crate::devices::kernel::KernelDeviceError,
    },
    /// The naming service refused this daemon (another holds its server
    /// ID) or could not be set up.
    #[error("naming: {0}")]
    Naming(String),
    /// A stack could not listen.
    #[error("stack {stack}: {source}")]
    Stack {
        /// The stack.
        stack: String,
        /// Why.
        source: uniplane_dataplane::StackError,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

// The client finds the daemon by the same directory and socket names:
// one definition, in the client crate.
pub use uniplane_client::{runtime_dir, CONTROL_SOCKET, DATA_SOCKET};

/// Device number of the daemon itself.
pub const DAEMON_DEVICE: u16 = uniplane_control::DAEMON_DEVICE;

/// What the I/O tasks tell the driver.
enum Input {
    /// An event for the core as it is.
    Core(Event),
    /// A client request; the outcome goes back on `reply`.
    Client {
        session: u64,
        req: uniplane_control::ClientRequest,
        reply: oneshot::Sender<ClientOutcome>,
    },
    /// A peer asks to admit a connection.
    PeerConnect {
        server: Ipv4Addr,
        conn: uniplane_overlay::acl::ConnKey,
        class: u8,
        reply: oneshot::Sender<Result<(), ControlError>>,
    },
    /// Our channel to a peer is up; requests for it go to `tx`.
    PeerUp {
        server: Ipv4Addr,
        tx: mpsc::Sender<PeerRequest>,
    },
    /// The outbound tunnel the core asked for is open.
    TunnelLink {
        server: Ipv4Addr,
        class: u8,
        link: BoxLink,
    },
    /// A peer opened a tunnel to us and said who it is.
    InboundLink {
        from: Ipv4Addr,
        class: u8,
        mtu: usize,
        link: BoxLink,
    },
    /// A plane batch finished.
    PlaneDone {
        batch: uniplane_control::BatchId,
        replies: Result<
            Vec<Result<uniplane_overlay::PlaneReply, uniplane_overlay::PlaneError>>,
            uniplane_overlay::PlaneError,
        >,
    },
    /// The bridge of a tunnel port ended by itself.
    BridgeEnded { port: uniplane_overlay::PortId },
    /// The directory lists a server this daemon has no peer for.
    PeerFound { peer: crate::config::PeerConfig },
    /// A server the directory listed is gone for good.
    PeerLost { server: Ipv4Addr },
    /// A look at the driver's state (listings, metrics).
    Inspect(Box<dyn FnOnce(&driver::Driver) + Send>),
    /// An event for the core from the operator (a reload, a stop).
    Operator(uniplane_control::Event),
    /// A change to how the classes share the peers' tunnels; the answer
    /// is the sharing now in force.
    Underlay {
        change: UnderlayChange,
        reply: oneshot::Sender<Result<crate::config::UnderlayConfig, String>>,
    },
}

/// A change to the underlay's sharing, applied live.
enum UnderlayChange {
    /// A reloaded configuration's.
    Whole(crate::config::UnderlayConfig),
    /// One class's weight or priority (`uniplane class set`).
    Class {
        id: u8,
        weight: Option<u32>,
        priority: Option<u8>,
    },
}

/// What a client request came to; `token` opens the data path of a
/// process that attached.
struct ClientOutcome {
    result: Result<uniplane_control::Reply, ControlError>,
    token: Option<u64>,
}

/// A mapping the core granted, until its process claims it on the data
/// socket.
struct PendingMap {
    region: Arc<crate::devices::region::HostRegion>,
    writable: bool,
    session: u64,
}

struct Shared {
    config: Config,
    server: Ipv4Addr,
    started: Instant,
    runtime: PathBuf,
    plane: Arc<dyn PlaneHandle>,
    stacks: Vec<Arc<dyn Stack>>,
    inputs: mpsc::Sender<Input>,
    /// Data links waiting for their process: token → (device, link).
    pending_data: Mutex<std::collections::HashMap<u64, (u16, driver::PortLink)>>,
    next_session: AtomicU64,
    /// The cluster secret, when the configuration names one.
    secret: Option<crate::auth::Key>,
    /// What was refused from outside.
    security: security::Security,
    /// GPU memory opened at the start, taken by its device's port.
    gpu_memories: Mutex<std::collections::HashMap<String, crate::devices::gpu::GpuMemory>>,
    /// Each GPU memory device's counters and state, by name.
    gpu_stats: Vec<(String, Arc<crate::devices::gpu::GpuStats>)>,
    /// Host memory devices' regions, which local processes may map, by
    /// name.
    host_regions: Vec<(String, Arc<crate::devices::region::HostRegion>)>,
    /// Shared regions processes lend their local peers, by (owner
    /// device, id); made and withdrawn by the driver on the core's word.
    shared_regions:
        Mutex<std::collections::HashMap<(u16, u16), Arc<crate::devices::region::HostRegion>>>,
    /// Mappings granted and waiting for their process, by token.
    pending_maps: Mutex<std::collections::HashMap<u64, PendingMap>>,
    /// Kernel devices' host ends, set up at the start, taken by their
    /// device's port.
    kernel_ports: Mutex<std::collections::HashMap<String, crate::devices::kernel::KernelPort>>,
    /// Each kernel device's counters and state, by name.
    kernels: Vec<(String, Arc<crate::devices::kernel::KernelShared>)>,
    /// The shared directory, when `[registry] kind = "etcd"`.
    naming: Option<crate::naming::etcd::Etcd>,
    /// Every peer: the configured ones, and those the directory added.
    roster: std::sync::RwLock<std::collections::HashMap<Ipv4Addr, crate::config::PeerConfig>>,
}

impl Shared {
    /// The region of host memory device `name`, if it is one.
    fn shared_region(
        &self,
        owner: u16,
        id: u16,
    ) -> Option<Arc<crate::devices::region::HostRegion>> {
        self.shared_regions
            .lock()
            .ok()
            .and_then(|r| r.get(&(owner, id)).cloned())
    }

    fn host_region(&self, name: &str) -> Option<&Arc<crate::devices::region::HostRegion>> {
        self.host_regions
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r)
    }

    async fn input(&self, input: Input) {
        // The driver outlives every task that sends to it.
        let _ = self.inputs.send(input).await;
    }

    /// Runs `f` on the driver's state and returns what it says.
    async fn inspect<T: Send + 'static>(
        &self,
        f: impl FnOnce(&driver::Driver) -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.input(Input::Inspect(Box::new(move |d| {
            let _ = tx.send(f(d));
        })))
        .await;
        rx.await.ok()
    }

    fn uid(&self) -> Uid {
        Uid::new(self.server, DAEMON_DEVICE)
    }

    /// How to reach peer `server`, if it is one.
    fn peer(&self, server: Ipv4Addr) -> Option<crate::config::PeerConfig> {
        self.roster
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&server)
            .cloned()
    }
}

/// A running daemon.
#[derive(Clone)]
pub struct Daemon {
    shared: Arc<Shared>,
}

impl Daemon {
    /// Starts a daemon on the current tokio runtime with the software
    /// engine as its plane.
    pub async fn start(config: Config) -> Result<Daemon, DaemonError> {
        let plane =
            crate::plane::open_plane(config.plane, &config).map_err(DaemonError::NoPlane)?;
        Daemon::start_with_plane(config, plane).await
    }

    /// Starts a daemon on the current tokio runtime programming `plane`:
    /// the control core, devices, stacks, control and data sockets, peers.
    pub async fn start_with_plane(
        config: Config,
        plane: Arc<dyn PlaneHandle>,
    ) -> Result<Daemon, DaemonError> {
        // A `backend = "rtl"` kernel on a plane without it, or more
        // kernels or ports than the RTL has, refuses the start.
        let kind = plane.kind().parse().unwrap_or_default();
        crate::plane::check_kernels(&config, kind).map_err(DaemonError::NoPlane)?;
        let runtime = runtime_dir(config.runtime_dir.as_deref());
        uniplane_client::prepare_runtime_dir(&runtime)?;
        // A stack the file names but this build lacks, or a peer whose
        // tunnels would need a stack not running, fails the start with the
        // reason, not the first message.
        let mut stacks: Vec<Arc<dyn Stack>> = Vec::new();
        for s in &config.stacks {
            let stack = uniplane_stacks::build(&s.name, &s.options).ok_or_else(|| {
                DaemonError::NoStack(format!(
                    "stack `{}` is not in this build (it has {})",
                    s.name,
                    uniplane_stacks::STACK_NAMES.join(", ")
                ))
            })?;
            stacks.push(stack);
        }
        for p in &config.peers {
            let used = std::iter::once(&p.stack).chain(p.pins.iter().map(|x| &x.stack));
            for stack in used {
                if !config.stacks.iter().any(|s| &s.name == stack) {
                    return Err(DaemonError::NoStack(format!(
                        "peer {} is reached over the `{stack}` stack, which [[stacks]] does not run",
                        p.server
                    )));
                }
            }
        }
        let secret = config
            .secret
            .as_deref()
            .map(crate::auth::Key::load)
            .transpose()?;
        // GPU memory is allocated before anything listens: a missing
        // driver, GPU or memory refuses the start with the reason.
        let mut gpu_memories = std::collections::HashMap::new();
        let mut gpu_stats = Vec::new();
        for d in &config.devices {
            if let crate::config::MemoryBackend::Gpu(gpu) = d.backend {
                let stats = Arc::new(crate::devices::gpu::GpuStats::default());
                let memory = crate::devices::gpu::GpuMemory::open(d.memory, gpu, stats.clone())
                    .map_err(|source| DaemonError::Device {
                        device: d.name.clone(),
                        source,
                    })?;
                gpu_memories.insert(d.name.clone(), memory);
                gpu_stats.push((d.name.clone(), stats));
            }
        }
        // Host memory devices' bytes live in a memfd from the start, so
        // local processes can map them.
        let mut host_regions = Vec::new();
        for d in &config.devices {
            if d.kind == DeviceKind::Memory && d.backend == crate::config::MemoryBackend::Host {
                let region = crate::devices::region::HostRegion::create(&d.name, d.memory)
                    .map_err(|source| DaemonError::HostMemory {
                        device: d.name.clone(),
                        source,
                    })?;
                host_regions.push((d.name.clone(), region));
            }
        }
        // Kernel devices get their emulated path and thread now: a
        // failure refuses the start with the reason.
        let mut kernel_ports = std::collections::HashMap::new();
        let mut kernels = Vec::new();
        for d in &config.devices {
            // An RTL kernel has nothing on the host: the plane answers.
            if d.kernel_backend == crate::config::KernelBackend::Rtl {
                continue;
            }
            if let Some(k) = d.kernel {
                let failed = |source| DaemonError::KernelDevice {
                    device: d.name.clone(),
                    source,
                };
                // A library kernel is built from its parameters now (rules
                // compiled, weights generated): a failure refuses the start.
                let built = match k.function {
                    crate::config::KernelFunction::Library(name) => {
                        match uniplane_kernel::library::build(name, &d.params) {
                            Some(Ok(kernel)) => Some(kernel),
                            Some(Err(e)) => {
                                return Err(failed(
                                    crate::devices::kernel::KernelDeviceError::Setup(format!(
                                        "kernel `{name}`: {e}"
                                    )),
                                ))
                            }
                            None => None,
                        }
                    }
                    _ => None,
                };
                let (port, shared) =
                    crate::devices::kernel::open_with(&d.name, k, built, d.next.is_some())
                        .map_err(failed)?;
                kernel_ports.insert(d.name.clone(), port);
                kernels.push((d.name.clone(), shared));
            }
        }
        let naming = start_naming(&config).await?;
        let core_config = control_config(&config, &stacks);
        let (inputs, rx) = mpsc::channel(4096);
        let shared = Arc::new(Shared {
            server: config.server,
            started: Instant::now(),
            runtime: runtime.clone(),
            plane,
            stacks,
            inputs,
            pending_data: Mutex::new(Default::default()),
            next_session: AtomicU64::new(1),
            secret,
            security: security::Security::new(),
            gpu_memories: Mutex::new(gpu_memories),
            host_regions,
            pending_maps: Mutex::new(std::collections::HashMap::new()),
            shared_regions: Mutex::new(std::collections::HashMap::new()),
            gpu_stats,
            kernel_ports: Mutex::new(kernel_ports),
            kernels,
            naming,
            roster: std::sync::RwLock::new(
                config.peers.iter().map(|p| (p.server, p.clone())).collect(),
            ),
            config,
        });
        let mut driver = driver::Driver::new(shared.clone(), core_config, rx);
        driver.settle().await?;
        tokio::spawn(driver.run());
        claim_devices(&shared).await;

        let daemon = Daemon { shared };
        tunnels::listen_stacks(&daemon.shared).await?;
        peers::listen(&daemon.shared).await?;
        sessions::listen(&daemon.shared)?;
        data::listen(&daemon.shared)?;
        for p in &daemon.shared.config.peers {
            tokio::spawn(peers::dial_loop(daemon.shared.clone(), p.server));
        }
        discovery::start(&daemon.shared);
        if let Some(addr) = daemon.shared.config.metrics {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(io_err(format!("metrics on {addr}")))?;
            tokio::spawn(observe::serve_metrics(daemon.shared.clone(), listener));
        }
        tracing::info!(server = %daemon.server(), runtime = %runtime.display(), "uniplaned started");
        Ok(daemon)
    }

    /// This server's ID.
    pub fn server(&self) -> Ipv4Addr {
        self.shared.server
    }

    /// The runtime directory holding the sockets.
    pub fn runtime_dir(&self) -> &Path {
        &self.shared.runtime
    }

    /// Removes the sockets so no client reaches a daemon that is stopping.
    pub fn shutdown(&self) {
        let _ = std::fs::remove_file(self.shared.runtime.join(CONTROL_SOCKET));
        let _ = std::fs::remove_file(self.shared.runtime.join(DATA_SOCKET));
    }

    /// Applies a reloaded configuration: the access rules change live
    /// (later requests and the plane's connectionless entries follow
    /// them; open connections they deny are closed with `Denied`, both
    /// ends told). Anything else that differs is refused, named, and
    /// nothing changes.
    pub async fn reload(&self, new: &Config) -> Result<(), ReloadError> {
        let changed = self.shared.config.needs_restart_for(new);
        if !changed.is_empty() {
            return Err(ReloadError::NeedsRestart(changed));
        }
        let core = control_config(new, &self.shared.stacks);
        self.shared
            .input(Input::Operator(uniplane_control::Event::Rules {
                rules: core.rules,
                default_action: core.default_action,
            }))
            .await;
        let (reply, applied) = oneshot::channel();
        self.shared
            .input(Input::Underlay {
                change: UnderlayChange::Whole(new.underlay.clone()),
                reply,
            })
            .await;
        // Inputs are taken in order: once this is answered, the rules are
        // in the core (its plane batch under way) and the new sharing is
        // on its way to every peer's underlay. Which classes exist was
        // checked above, so the change is accepted.
        if let Ok(Err(e)) = applied.await {
            tracing::warn!("reload: underlay: {e}");
        }
        Ok(())
    }

    /// Stops gracefully: every connection is closed and its local
    /// processes and peers told, and the notices leave (waiting at most
    /// `within` for them), before the sockets go ([`Daemon::shutdown`]).
    pub async fn stop(&self, within: Duration) {
        self.shared
            .input(Input::Operator(uniplane_control::Event::Shutdown))
            .await;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let drained = self
                .shared
                .inspect(|d| d.notices_drained())
                .await
                .unwrap_or(true);
            if drained || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.shutdown();
    }

    /// The UID of the daemon itself.
    pub fn uid(&self) -> Uid {
        self.shared.uid()
    }

    /// Every counter in Prometheus text exposition format.
    pub async fn metrics_text(&self) -> String {
        observe::metrics_text(&self.shared).await
    }

    /// What the control core believes the plane holds.
    pub async fn installed(&self) -> Option<uniplane_control::PlaneImage> {
        self.shared.inspect(|d| d.core.installed().clone()).await
    }

    /// What the control core's state calls for in the plane.
    pub async fn picture(&self) -> Option<uniplane_control::PlaneImage> {
        self.shared.inspect(|d| d.core.picture()).await
    }
}

/// Starts the naming service of an etcd registry and claims this
/// server's record and its devices' names (`DEVICE@SERVER-NAME`). A
/// server ID another daemon holds refuses the start; an unreachable
/// cluster does not (the claims are retried, and new names fail with
/// that reason until it answers).
async fn start_naming(config: &Config) -> Result<Option<crate::naming::etcd::Etcd>, DaemonError> {
    use crate::naming::etcd::{server_key, Etcd};
    use crate::naming::NamingError;
    let crate::config::RegistryConfig::Etcd(etcd) = &config.registry else {
        return Ok(None);
    };
    let naming = Etcd::start(etcd)
        .await
        .map_err(|e| DaemonError::Naming(e.to_string()))?;
    let record = crate::naming::roster::ServerRecord {
        name: config.name.clone(),
        peer_listen: config.peer_listen,
        tunnels: config
            .stacks
            .iter()
            .filter_map(|s| Some((s.name.clone(), s.listen?)))
            .collect(),
    }
    .to_json(std::process::id())
    .to_string();
    match naming
        .claim(server_key(config.server), record, true)
        .await
    {
        Ok(()) => {}
        Err(NamingError::Taken { holder, .. }) => {
            return Err(DaemonError::Naming(format!(
                "server ID {} is registered by another daemon ({holder});                  two daemons with one server ID would hand out the same UIDs",
                config.server
            )))
        }
        Err(e) => tracing::warn!("{e}; claims are retried until it answers"),
    }
    Ok(Some(naming))
}

/// Claims the devices' names, `DEVICE@SERVER-NAME`, kept for the
/// daemon's life (their numbers are known once the core has settled).
async fn claim_devices(shared: &Shared) {
    use crate::naming::etcd::name_key;
    let Some(naming) = &shared.naming else {
        return;
    };
    let devices = shared
        .inspect(|d| {
            d.core
                .resources()
                .filter(|r| matches!(r.kind, uniplane_control::ResourceKind::Device { .. }))
                .map(|r| (r.name.clone(), r.uid))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
    for (device, uid) in devices {
        let name = format!("{device}@{}", shared.config.name);
        if crate::naming::check_name(&name).is_ok() {
            naming.keep(name_key(&name), uid.to_string()).await;
        }
    }
}

/// Largest payload a tunnel over `stack` carries.
fn tunnel_mtu(stack: &dyn Stack) -> usize {
    stack
        .capabilities()
        .mtu
        .saturating_sub(64 + crate::seal::SEAL_OVERHEAD)
        .clamp(256, Message::MAX_PAYLOAD - crate::seal::SEAL_OVERHEAD)
}

/// What the core needs to know of a peer.
fn peer_spec(p: &crate::config::PeerConfig, stacks: &[Arc<dyn Stack>]) -> PeerSpec {
    PeerSpec {
        server: p.server,
        stack: p.stack.clone(),
        classes: p.ingress.classes.clone(),
        // The smallest of its stacks' (a pinned class may take another).
        tunnel_mtu: std::iter::once(&p.stack)
            .chain(p.pins.iter().map(|x| &x.stack))
            .filter_map(|name| stacks.iter().find(|s| s.name() == name))
            .map(|s| tunnel_mtu(s.as_ref()))
            .min()
            .unwrap_or(Message::MAX_PAYLOAD),
    }
}

/// What the core needs of the configuration.
fn control_config(config: &Config, stacks: &[Arc<dyn Stack>]) -> ControlConfig {
    let pattern = |p: &crate::config::UidPattern| UidMatch {
        key: p.key,
        mask: p.mask,
    };
    ControlConfig {
        server: config.server,
        name: config.name.clone(),
        devices: config
            .devices
            .iter()
            .map(|d| DeviceSpec {
                name: d.name.clone(),
                device: d.device,
                relay: d.kind == DeviceKind::Relay,
                mappable: d.kind == DeviceKind::Memory
                    && d.backend == crate::config::MemoryBackend::Host,
                label: format!("{:?}", d.kind).to_lowercase(),
                next: d.next,
            })
            .collect(),
        peers: config.peers.iter().map(|p| peer_spec(p, stacks)).collect(),
        routes: config
            .routes
            .iter()
            .map(|r| MultiHopRoute {
                from: r.from.clone(),
                via: r.via.clone(),
                to: pattern(&r.to),
            })
            .collect(),
        rules: config
            .rules
            .iter()
            .map(|r| AccessRule {
                src: pattern(&r.src),
                dst: pattern(&r.dst),
                types: r.types.clone(),
                allow: r.allow,
            })
            .collect(),
        default_action: config.default_action,
        heartbeat: config.heartbeat,
        misses: config.misses,
        verdict_timeout: Duration::from_secs(2),
        limits: config.limits,
        classes: config.underlay.classes.iter().map(|c| c.id).collect(),
        remotes: config.remotes.clone(),
    }
}
