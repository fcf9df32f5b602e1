//! `tunnel`: one-way traffic from one server to another, through two
//! daemons and the sealed tunnel between them, beside the same stack
//! alone and the sealing's own cost.
//!
//! ```text
//!  this process                 uniplaned A (10.254.0.1)        uniplaned B (10.254.0.2)        this process
//!  ┌──────────────┐  shm rings  ┌──────────────────────┐  stack  ┌──────────────────────┐  shm  ┌──────────────┐
//!  │    sender    ├────────────►│ engine ─► seal (FWRD)├────────►│ open ─► engine       ├──────►│   receiver   │
//!  └──────────────┘             └──────────────────────┘127.0.0.1└──────────────────────┘       └──────────────┘
//!        peer channel (TCP, sealed JSON lines) and tunnel handshake: cluster secret in the temp dir
//!  then, in the same run:  Sealer::seal + Sealer::open of the same message on one thread (no I/O)
//!                          the stack alone, one way: `gen` over the same stack, no daemons
//! ```
//!
//! The benchmark creates a temporary directory with a fresh cluster
//! secret and starts two `uniplaned` (the binary built next to this one,
//! or `--uniplaned PATH`) on loopback, each the other's peer over the
//! chosen stack, and waits until each reports the other alive. A session
//! attached to B listens; a session attached to A connects to it and
//! floods fixed-size messages for the warm-up and the measured seconds,
//! each session on its own OS thread with a current-thread runtime. The
//! receiver counts messages and payload bytes from the end of its
//! warm-up to its last message; the sender then waits (bounded) until
//! the receiver has everything it sent, and the run reports any
//! difference. The daemons are stopped (and the directory removed) before
//! the two reference measurements run, on drop also when a step fails.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use uniplane_client::protocol::Request;
use uniplane_client::{Client, Connection, Session};
use uniplane_dataplane::{LinkExt, Message, Uid};
use uniplane_services::auth::Key;
use uniplane_services::seal::{End, Sealer};

use crate::engine::Quiet;
use crate::fabric::thread_cpu_ns;
use crate::gen::{check, run_gen, GenConfig, Stop};
use crate::path::{
    client_err, runtime, scratch_dir, session, sibling_binary, DaemonProcess, WaitMode,
};
use crate::sizes::SizeMix;
use crate::stacks::{default_endpoints, free_port, open_stack};
use crate::BenchError;

/// The server ID of the sending side's daemon.
pub const SERVER_A: Ipv4Addr = Ipv4Addr::new(10, 254, 0, 1);
/// The server ID of the receiving side's daemon.
pub const SERVER_B: Ipv4Addr = Ipv4Addr::new(10, 254, 0, 2);
/// The port the receiving session listens on.
const PORT: u16 = 9;
/// Messages per send and receive call.
const BATCH: usize = 64;
/// How long the daemons have to start and see each other alive.
const PEERS_ALIVE_WITHIN: Duration = Duration::from_secs(20);
/// How long connecting and accepting may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);
/// A send that moves nothing for this long is a stall, not backpressure.
const STALL: Duration = Duration::from_secs(5);
/// Most time the receiver has to catch up once the sender stops.
const SETTLE_WITHIN: Duration = Duration::from_secs(10);
/// The receiver has caught up as far as it will once it gains nothing
/// for this long.
const SETTLE_QUIET: Duration = Duration::from_secs(1);

/// The stack of the tunnel between the two daemons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TunnelStack {
    /// `udp`: messages packed into UDP datagrams.
    Udp,
    /// `ltl`: the lightweight transport, over UDP.
    Ltl,
    /// `tcp`: kernel TCP.
    Tcp,
}

impl TunnelStack {
    /// Every stack a tunnel can run over here, by name.
    pub const ALL: [TunnelStack; 3] = [TunnelStack::Udp, TunnelStack::Ltl, TunnelStack::Tcp];

    /// The stack's name in a daemon's configuration and in `gen --stack`.
    pub fn name(self) -> &'static str {
        match self {
            TunnelStack::Udp => "udp",
            TunnelStack::Ltl => "ltl",
            TunnelStack::Tcp => "tcp",
        }
    }

    /// The stack called `name`.
    pub fn by_name(name: &str) -> Option<TunnelStack> {
        TunnelStack::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct TunnelConfig {
    /// The tunnel's stack (and the peer's).
    pub stack: TunnelStack,
    /// Payload bytes per message.
    pub size: usize,
    /// Measured seconds, through the tunnel and for the peer each.
    pub seconds: f64,
    /// Traffic before measuring, left out of every figure.
    pub warmup: Duration,
    /// The daemon binary; next to this program when `None`.
    pub uniplaned: Option<PathBuf>,
}

/// What crossed the tunnel.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OneWay {
    /// Messages the sender handed to its session (warm-up included).
    pub sent: u64,
    /// Messages the receiver got (warm-up included).
    pub received: u64,
    /// Messages received between the end of the warm-up and the last one.
    pub measured: u64,
    /// Payload bytes of those.
    pub measured_bytes: u64,
    /// Seconds from the end of the warm-up to the last message.
    pub seconds: f64,
    /// Each daemon's counters once the receiver caught up (`a`, `b`:
    /// `ports` as `uniplane stats` shows them, `tunnel_frames_refused`
    /// from its metrics; `null` where a daemon did not answer).
    pub daemons: Value,
}

impl OneWay {
    /// Messages per second at the receiver.
    pub fn msgs_per_sec(&self) -> f64 {
        per_s(self.measured as f64, self.seconds)
    }

    /// Payload Gbit/s at the receiver.
    pub fn gbit_per_sec(&self) -> f64 {
        per_s(self.measured_bytes as f64 * 8.0 / 1e9, self.seconds)
    }
}

fn per_s(n: f64, s: f64) -> f64 {
    if s > 0.0 {
        n / s
    } else {
        0.0
    }
}

/// What sealing and opening one message costs on one core.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SealCost {
    /// CPU nanoseconds per `Sealer::seal`.
    pub seal_ns: f64,
    /// CPU nanoseconds per `Sealer::open`.
    pub open_ns: f64,
    /// Messages sealed and opened.
    pub messages: u64,
}

impl SealCost {
    /// Nanoseconds to seal and open one message.
    pub fn seal_open_ns(&self) -> f64 {
        self.seal_ns + self.open_ns
    }
}

/// The same stack alone, one way, with `gen`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerRun {
    /// Messages received per second.
    pub msgs_per_sec: f64,
    /// Payload Gbit/s received.
    pub gbit_per_sec: f64,
    /// Sent and never received.
    pub lost: u64,
}

/// Everything one run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TunnelRun {
    /// Through the two daemons.
    pub tunnel: OneWay,
    /// Sealing alone.
    pub seal: SealCost,
    /// The stack alone.
    pub peer: PeerRun,
    /// Whether the stack repairs loss (udp does not).
    pub reliable: bool,
}

impl TunnelRun {
    /// Tunnel ÷ peer messages per second (`None` when the peer moved
    /// nothing).
    pub fn ratio(&self) -> Option<f64> {
        (self.peer.msgs_per_sec > 0.0).then(|| self.tunnel.msgs_per_sec() / self.peer.msgs_per_sec)
    }

    /// The share of one core that sealing and opening take at the
    /// measured rate (the sending daemon seals, the receiving one opens).
    pub fn seal_share_of_a_core(&self) -> f64 {
        self.seal.seal_open_ns() * self.tunnel.msgs_per_sec() / 1e9
    }

    /// Messages sent and never received.
    pub fn lost(&self) -> u64 {
        self.tunnel.sent.saturating_sub(self.tunnel.received)
    }

    /// Whether every message arrived, and if not, where the daemons'
    /// counters say the rest went.
    pub fn note(&self) -> String {
        let (t, lost) = (&self.tunnel, self.lost());
        if lost == 0 {
            return "every message sent through the tunnel was received".to_owned();
        }
        let mut note = if self.reliable {
            format!(
                "{lost} of {} messages sent through the tunnel were not received within the \
                 settle time: over a reliable stack the overlay should lose none (backpressure), \
                 so this is worth a look",
                t.sent
            )
        } else {
            format!(
                "{lost} of {} messages sent through the tunnel were lost: this stack does not \
                 repair loss, and the kernel drops datagrams a receiver does not read in time \
                 (the stack alone lost {} in its run)",
                t.sent, self.peer.lost
            )
        };
        match tunnel_handoff(&t.daemons) {
            Some((tx, rx)) if tx > rx => note.push_str(&format!(
                "; A's engine handed {tx} messages (segments) to its tunnel port and B's engine \
                 took {rx} from its inbound one: {} went missing between the two daemons \
                 (bridge, seal, stack)",
                tx - rx
            )),
            Some((tx, rx)) => note.push_str(&format!(
                "; the tunnel delivered what it was given ({tx} sent, {rx} taken): the loss is \
                 inside a daemon, not between them"
            )),
            None => {}
        }
        let dropped = drops(&t.daemons);
        if dropped.is_empty() {
            note.push_str("; neither daemon counted a drop or refused a frame");
        } else {
            note.push_str(&format!(
                "; the daemons counted drops: {}",
                dropped.join(", ")
            ));
        }
        note
    }
}

/// How the report names the peer.
pub fn peer_name(stack: TunnelStack) -> String {
    format!(
        "the {} stack alone, one-way, uniplane-bench gen",
        stack.name()
    )
}

/// Runs the benchmark.
pub fn run_tunnel(cfg: &TunnelConfig) -> Result<TunnelRun, BenchError> {
    if !(cfg.seconds.is_finite() && cfg.seconds > 0.0) {
        return Err(BenchError::Config(format!(
            "--seconds must be a positive number, not {}",
            cfg.seconds
        )));
    }
    let gen_cfg = GenConfig {
        sizes: SizeMix::fixed(cfg.size),
        stop: Stop::Seconds(cfg.seconds),
        warmup: cfg.warmup,
        ..GenConfig::default()
    };
    // Refuse a size the stack cannot carry before starting anything.
    let stack = open_stack(cfg.stack.name())?;
    check(&*stack, &gen_cfg)?;
    let reliable = stack.capabilities().reliable;
    let binary = match &cfg.uniplaned {
        Some(p) => p.clone(),
        None => sibling_binary("uniplaned").ok_or_else(|| {
            BenchError::Config(
                "no uniplaned next to this program: cargo build --release -p uniplane-services --bin uniplaned (or pass --uniplaned PATH)".into(),
            )
        })?,
    };
    let tunnel = {
        let mut pair = DaemonPair::start(&binary, cfg.stack)?;
        let r = measure_one_way(&pair, cfg);
        // A daemon that died explains a failure better than the failure.
        match (r, pair.exited()) {
            (Err(e), Some(why)) => return Err(BenchError::Config(format!("{e}; {why}"))),
            (r, _) => r?,
        }
    };
    let seal = seal_cost(cfg.size, Duration::from_secs(1))?;
    let run = run_gen(
        open_stack(cfg.stack.name())?,
        &default_endpoints(cfg.stack.name())?,
        &gen_cfg,
        &mut Quiet,
    )?;
    Ok(TunnelRun {
        tunnel,
        seal,
        peer: PeerRun {
            msgs_per_sec: run.pps(),
            gbit_per_sec: run.goodput_gbps(),
            lost: run.lost,
        },
        reliable,
    })
}

/// A directory removed on drop.
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two daemons, peers of each other over one stack, sharing a cluster
/// secret; stopped, and their directory removed, on drop.
pub(crate) struct DaemonPair {
    // Dropped in this order: the daemons, then the directory.
    pub(crate) a: DaemonProcess,
    pub(crate) b: DaemonProcess,
    _dir: ScratchDir,
}

/// The addresses one daemon listens on.
#[derive(Clone, Copy)]
struct Listens {
    server: Ipv4Addr,
    peer: SocketAddr,
    tunnel: SocketAddr,
}

impl DaemonPair {
    fn start(binary: &Path, stack: TunnelStack) -> Result<DaemonPair, BenchError> {
        DaemonPair::start_with(binary, stack, "")
    }

    /// Two daemons whose files end with `extra` (more tables).
    pub(crate) fn start_with(
        binary: &Path,
        stack: TunnelStack,
        extra: &str,
    ) -> Result<DaemonPair, BenchError> {
        let dir = ScratchDir(scratch_dir("tunnel")?);
        let secret = dir.0.join("cluster.key");
        Key::generate(&secret).map_err(|e| BenchError::Config(e.to_string()))?;
        let [pa, pb, ta, tb] = free_ports()?;
        let a = Listens {
            server: SERVER_A,
            peer: pa,
            tunnel: ta,
        };
        let b = Listens {
            server: SERVER_B,
            peer: pb,
            tunnel: tb,
        };
        let daemon = |me: Listens, other: Listens, name: &str| {
            let runtime = dir.0.join(name);
            std::fs::create_dir_all(&runtime)
                .map_err(|e| BenchError::Config(format!("{}: {e}", runtime.display())))?;
            let text = daemon_config(stack, me, other, &runtime, &secret) + extra;
            DaemonProcess::spawn(binary, runtime, &text, &[])
        };
        let pair = DaemonPair {
            a: daemon(a, b, "a")?,
            b: daemon(b, a, "b")?,
            _dir: dir,
        };
        pair.wait_alive()?;
        Ok(pair)
    }

    /// Waits until each daemon reports its peer alive.
    fn wait_alive(&self) -> Result<(), BenchError> {
        let rt = runtime()?;
        rt.block_on(async {
            let deadline = Instant::now() + PEERS_ALIVE_WITHIN;
            loop {
                let a = peers(self.a.runtime_dir()).await;
                let b = peers(self.b.runtime_dir()).await;
                if all_alive(&a) && all_alive(&b) {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    return Err(BenchError::Config(format!(
                        "the two daemons did not both report their peer alive within {PEERS_ALIVE_WITHIN:?}: \
                         A ({SERVER_A}) says peers = {}, B ({SERVER_B}) says peers = {}; \
                         A's log: [{}]; B's log: [{}]",
                        a,
                        b,
                        self.a.log_tail(),
                        self.b.log_tail()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    }

    /// Which daemon is gone, and what it logged, if one is.
    pub(crate) fn exited(&mut self) -> Option<String> {
        let mut gone = Vec::new();
        for (name, d) in [("A", &mut self.a), ("B", &mut self.b)] {
            if !d.running() {
                gone.push(format!("daemon {name} exited: [{}]", d.log_tail()));
            }
        }
        (!gone.is_empty()).then(|| gone.join("; "))
    }
}

/// The `peers` of a daemon's status (`null` when it does not answer).
async fn peers(dir: &Path) -> Value {
    let ask = async {
        let c = Client::connect(dir).await.ok()?;
        let status = c.request(&Request::Status).await.ok()?;
        Some(status["peers"].clone())
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(Value::Null)
}

fn all_alive(peers: &Value) -> bool {
    peers
        .as_array()
        .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true))
}

/// Four loopback ports (see [`free_port`]): two for the peer channels,
/// then two for the tunnel listeners.
fn free_ports() -> Result<[SocketAddr; 4], BenchError> {
    Ok([free_port()?, free_port()?, free_port()?, free_port()?])
}

/// The configuration of the daemon `me`, the peer of `other` over `stack`.
fn daemon_config(
    stack: TunnelStack,
    me: Listens,
    other: Listens,
    runtime: &Path,
    secret: &Path,
) -> String {
    let stack = stack.name();
    format!(
        r#"[server]
id = "{}"
name = "bench-{}"
peer_listen = "{}"

[runtime]
dir = "{}"

[engine]
mode = "spin-then-park"

[[stacks]]
name = "{stack}"
listen = "{}"

[[peers]]
server = "{}"
address = "{}"
stack = "{stack}"
tunnel = "{}"

[policy]
default = "allow"

[failure]
heartbeat_ms = 100
misses = 20

[cluster]
secret = "{}"
"#,
        me.server,
        me.server,
        me.peer,
        runtime.display(),
        me.tunnel,
        other.server,
        other.peer,
        other.tunnel,
        secret.display()
    )
}

/// What the receiving session counted.
struct Received {
    total: u64,
    measured: u64,
    measured_bytes: u64,
    seconds: f64,
}

/// Floods `cfg.size`-byte messages from a session on A to one on B for
/// the warm-up and `cfg.seconds`; counts them at B.
fn measure_one_way(pair: &DaemonPair, cfg: &TunnelConfig) -> Result<OneWay, BenchError> {
    let done = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Uid>();
    let b_dir = pair.b.runtime_dir().to_owned();
    let warmup = cfg.warmup;
    let (done2, received2) = (done.clone(), received.clone());
    let receiver = std::thread::Builder::new()
        .name("tunnel-receiver".into())
        .spawn(move || -> Result<Received, BenchError> {
            runtime()?.block_on(receive(&b_dir, warmup, ready_tx, &done2, &received2))
        })
        .map_err(|source| BenchError::Thread {
            what: "receiver",
            source,
        })?;
    let sent = match ready_rx.recv_timeout(CONNECT_WITHIN) {
        Ok(sink) => runtime().and_then(|rt| {
            rt.block_on(async {
                let (sent, open) = send(pair.a.runtime_dir(), sink, cfg, &received).await?;
                // Read while both sessions and the tunnel are still up.
                let daemons = json!({
                    "a": daemon_counters(pair.a.runtime_dir()).await,
                    "b": daemon_counters(pair.b.runtime_dir()).await,
                });
                drop(open);
                Ok((sent, daemons))
            })
        }),
        Err(_) => Err(BenchError::SideGone("receiver")),
    };
    done.store(true, Ordering::Relaxed);
    // The receiver's own failure says more than the sender's "it went
    // away", so it comes first.
    let got = receiver
        .join()
        .map_err(|_| BenchError::Panicked("receiver"))??;
    let (sent, daemons) = sent?;
    Ok(OneWay {
        sent,
        daemons,
        received: got.total,
        measured: got.measured,
        measured_bytes: got.measured_bytes,
        seconds: got.seconds,
    })
}

/// The receiving side: listens on B, hands its UID over, counts until
/// told to stop (or the connection closes).
async fn receive(
    dir: &Path,
    warmup: Duration,
    ready: std::sync::mpsc::Sender<Uid>,
    done: &AtomicBool,
    received: &AtomicU64,
) -> Result<Received, BenchError> {
    let s = session(dir, "bench-tunnel-sink", WaitMode::Park).await?;
    let mut l = s.listen(PORT).await.map_err(client_err)?;
    let _ = ready.send(s.uid());
    let mut conn = tokio::time::timeout(CONNECT_WITHIN, l.accept())
        .await
        .ok()
        .flatten()
        .ok_or(BenchError::SideGone("sender"))?;
    let mut buf = Vec::with_capacity(BATCH);
    let (mut n, mut bytes) = (0u64, 0u64);
    let mut first: Option<Instant> = None;
    // (time, messages, bytes) at the end of the warm-up and at the last
    // message.
    let mut mark: Option<(Instant, u64, u64)> = None;
    let mut last = (Instant::now(), 0, 0);
    while !done.load(Ordering::Relaxed) {
        let got =
            tokio::time::timeout(Duration::from_millis(200), conn.recv_batch(&mut buf, BATCH));
        match got.await {
            Ok(Ok(0)) => break,
            Ok(Ok(k)) => {
                let now = Instant::now();
                bytes += buf.drain(..).map(|m| m.payload().len() as u64).sum::<u64>();
                n += k as u64;
                let start = *first.get_or_insert(now);
                if mark.is_none() && now.duration_since(start) >= warmup {
                    mark = Some((now, n, bytes));
                }
                last = (now, n, bytes);
                received.store(n, Ordering::Relaxed);
            }
            Ok(Err(e)) => return Err(BenchError::Link(e)),
            Err(_) => continue,
        }
    }
    let (t0, n0, b0) = mark.unwrap_or((first.unwrap_or(last.0), 0, 0));
    Ok(Received {
        total: n,
        measured: last.1 - n0,
        measured_bytes: last.2 - b0,
        seconds: last.0.duration_since(t0).as_secs_f64(),
    })
}

/// A daemon's port counters and refused tunnel frames (`null` when it
/// does not answer within 2 s).
async fn daemon_counters(dir: &Path) -> Value {
    let ask = async {
        let c = Client::connect(dir).await.ok()?;
        let ports = c.request(&Request::Stats).await.ok()?;
        let metrics = c.request(&Request::Metrics).await.ok()?;
        let refused: serde_json::Map<String, Value> = metrics["text"]
            .as_str()
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("uniplane_tunnel_frames_"))
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_owned(), json!(v.trim().parse::<u64>().unwrap_or(0))))
            .collect();
        Some(json!({ "ports": ports, "tunnel_frames_refused": refused }))
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(Value::Null)
}

/// The counters of `daemons` (as [`OneWay::daemons`] holds them) that
/// count messages or frames dropped, where not zero: `A tunnel-…: no_route
/// 3`.
pub fn drops(daemons: &Value) -> Vec<String> {
    const DROPS: [&str; 4] = [
        "acl_denied",
        "no_route",
        "unanswerable",
        "reassembly_incomplete",
    ];
    let mut out = Vec::new();
    for side in ["a", "b"] {
        let d = &daemons[side];
        for port in d["ports"].as_array().into_iter().flatten() {
            for k in DROPS {
                match port["counters"][k].as_u64() {
                    Some(n) if n > 0 => out.push(format!(
                        "{} {}: {k} {n}",
                        side.to_uppercase(),
                        port["name"].as_str().unwrap_or("?")
                    )),
                    _ => {}
                }
            }
        }
        for (k, v) in d["tunnel_frames_refused"].as_object().into_iter().flatten() {
            match v.as_u64() {
                Some(n) if n > 0 => out.push(format!(
                    "{} refused tunnel frames {k}: {n}",
                    side.to_uppercase()
                )),
                _ => {}
            }
        }
    }
    out
}

/// Messages (segments, for messages larger than the tunnel carries whole)
/// A's engine handed to its tunnel ports (`tunnel-…`), and B's engine took
/// from its inbound tunnel ports (`from-…`), from `daemons` as
/// [`OneWay::daemons`] holds them; `None` where a daemon did not answer.
pub fn tunnel_handoff(daemons: &Value) -> Option<(u64, u64)> {
    let sum = |side: &str, prefix: &str, counter: &str| {
        let ports = daemons[side]["ports"].as_array()?;
        Some(
            ports
                .iter()
                .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
                .filter_map(|p| p["counters"][counter].as_u64())
                .sum::<u64>(),
        )
    };
    Some((
        sum("a", "tunnel-", "tx_msgs")?,
        sum("b", "from-", "rx_msgs")?,
    ))
}

/// The sending side: connects from A to `sink` and floods; then waits
/// (bounded) until the receiver has caught up. Returns the messages sent
/// and the session with its connection, still open.
async fn send(
    dir: &Path,
    sink: Uid,
    cfg: &TunnelConfig,
    received: &AtomicU64,
) -> Result<(u64, (Session, Connection)), BenchError> {
    let s = session(dir, "bench-tunnel-source", WaitMode::Park).await?;
    let mut conn = tokio::time::timeout(CONNECT_WITHIN, s.connect(sink.port(PORT)))
        .await
        .map_err(|_| {
            BenchError::Config(format!(
                "connecting from {SERVER_A} to {sink}:{PORT} through the tunnel took over {CONNECT_WITHIN:?}"
            ))
        })?
        .map_err(client_err)?;
    let payload = Bytes::from(vec![0xa5; cfg.size]);
    let mut batch: VecDeque<Message> = VecDeque::with_capacity(BATCH);
    let end = Instant::now() + cfg.warmup + Duration::from_secs_f64(cfg.seconds);
    let mut sent = 0u64;
    while Instant::now() < end {
        for _ in 0..BATCH {
            batch.push_back(conn.message(payload.clone())?);
        }
        tokio::time::timeout(STALL, conn.send_batch(&mut batch))
            .await
            .map_err(|_| {
                BenchError::Config(format!(
                    "sending stalled for {STALL:?} after {sent} messages, {} received",
                    received.load(Ordering::Relaxed)
                ))
            })??;
        sent += BATCH as u64;
    }
    // Keep the connection open while the receiver drains what is in
    // flight: until it has everything, gains nothing for a while, or
    // the limit.
    let settle = Instant::now();
    let (mut seen, mut since) = (received.load(Ordering::Relaxed), Instant::now());
    while seen < sent && settle.elapsed() < SETTLE_WITHIN && since.elapsed() < SETTLE_QUIET {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = received.load(Ordering::Relaxed);
        if now > seen {
            (seen, since) = (now, Instant::now());
        }
    }
    Ok((sent, (s, conn)))
}

/// Seals and opens a `size`-byte message over and over for about
/// `budget` on this thread, as the two ends of a tunnel do: each in
/// batches, so the two are timed apart. Times are this thread's CPU time,
/// so that a loaded machine taking the core away does not count.
pub fn seal_cost(size: usize, budget: Duration) -> Result<SealCost, BenchError> {
    const ROUND: usize = 64;
    let key = Key::from_hex(&"5a".repeat(32))
        .ok_or_else(|| BenchError::Config("the sealing key".into()))?;
    let (a, b) = (Uid::new(SERVER_A, 0), Uid::new(SERVER_B, 0));
    let mut opener = Sealer::new(key.clone(), End::Opener, a, b);
    let mut acceptor = Sealer::new(key, End::Acceptor, b, a);
    let m = Message::send(
        Uid::new(SERVER_A, 2).port(49152),
        Uid::new(SERVER_B, 2).port(PORT),
        Bytes::from(vec![0xa5; size]),
    )?;
    let mut frames = Vec::with_capacity(ROUND);
    let (mut seal_ns, mut open_ns) = (0u64, 0u64);
    let mut messages = 0u64;
    let start = Instant::now();
    while start.elapsed() < budget {
        let t0 = thread_cpu_ns();
        for _ in 0..ROUND {
            frames.push(opener.seal(&m)?);
        }
        let t1 = thread_cpu_ns();
        for f in frames.drain(..) {
            let inner = acceptor.open(f).map_err(|why| {
                BenchError::Config(format!("a frame sealed here did not open: {why:?}"))
            })?;
            std::hint::black_box(inner);
        }
        let t2 = thread_cpu_ns();
        seal_ns += t1.saturating_sub(t0);
        open_ns += t2.saturating_sub(t1);
        messages += ROUND as u64;
    }
    let per = |ns: u64| ns as f64 / messages.max(1) as f64;
    Ok(SealCost {
        seal_ns: per(seal_ns),
        open_ns: per(open_ns),
        messages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_counters_are_listed_where_not_zero() {
        let d = json!({
            "a": {"ports": [{"name": "tunnel-x", "counters": {"no_route": 3, "acl_denied": 0, "rx_msgs": 9}}],
                  "tunnel_frames_refused": {"replayed_total": 0}},
            "b": {"ports": [], "tunnel_frames_refused": {"bad_tag_total": 2}},
        });
        assert_eq!(
            drops(&d),
            [
                "A tunnel-x: no_route 3",
                "B refused tunnel frames bad_tag_total: 2"
            ]
        );
        assert!(drops(&Value::Null).is_empty());
    }

    #[test]
    fn the_handoff_counts_a_s_tunnel_ports_out_and_b_s_inbound_ports_in() {
        let port = |name: &str, tx: u64, rx: u64| json!({"name": name, "counters": {"tx_msgs": tx, "rx_msgs": rx}});
        let d = json!({
            "a": {"ports": [port("bench-source", 0, 10), port("tunnel-10.254.0.2-class0", 20, 0), port("from-10.254.0.2-class0", 0, 1)]},
            "b": {"ports": [port("tunnel-10.254.0.1-class0", 1, 0), port("from-10.254.0.1-class0", 0, 19), port("sink", 10, 0)]},
        });
        assert_eq!(tunnel_handoff(&d), Some((20, 19)));
        assert_eq!(
            tunnel_handoff(&json!({"a": null, "b": {"ports": []}})),
            None
        );
    }

    #[test]
    fn stacks_go_by_their_config_names() {
        for s in TunnelStack::ALL {
            assert_eq!(TunnelStack::by_name(s.name()), Some(s));
        }
        assert_eq!(TunnelStack::by_name("mem"), None);
    }

    #[test]
    fn sealing_costs_something_and_every_frame_opens() {
        let c = seal_cost(64, Duration::from_millis(20)).unwrap();
        assert!(c.messages > 0);
        assert!(c.seal_ns > 0.0 && c.open_ns > 0.0);
    }

    #[test]
    fn the_ratio_and_the_share_follow_from_the_rates() {
        let run = TunnelRun {
            tunnel: OneWay {
                sent: 1000,
                received: 1000,
                measured: 500,
                measured_bytes: 500 * 64,
                seconds: 0.5,
                daemons: Value::Null,
            },
            seal: SealCost {
                seal_ns: 100.0,
                open_ns: 150.0,
                messages: 1,
            },
            peer: PeerRun {
                msgs_per_sec: 4000.0,
                ..PeerRun::default()
            },
            reliable: true,
        };
        assert_eq!(run.tunnel.msgs_per_sec(), 1000.0);
        assert_eq!(run.ratio(), Some(0.25));
        // 250 ns × 1000/s = 0.25 ms per second.
        assert!((run.seal_share_of_a_core() - 0.00025).abs() < 1e-12);
        assert_eq!(run.lost(), 0);
        let none = TunnelRun::default();
        assert_eq!(none.ratio(), None);
    }

    #[test]
    fn a_loss_is_located_by_the_daemons_counters() {
        let port = |name: &str, tx: u64, rx: u64| json!({"name": name, "counters": {"tx_msgs": tx, "rx_msgs": rx}});
        let mut run = TunnelRun {
            tunnel: OneWay {
                sent: 100,
                received: 100,
                ..OneWay::default()
            },
            reliable: true,
            ..TunnelRun::default()
        };
        assert_eq!(
            run.note(),
            "every message sent through the tunnel was received"
        );
        run.tunnel.received = 97;
        run.tunnel.daemons = json!({
            "a": {"ports": [port("tunnel-10.254.0.2-class0", 100, 0)]},
            "b": {"ports": [port("from-10.254.0.1-class0", 0, 97)]},
        });
        let note = run.note();
        assert!(note.starts_with("3 of 100 messages"), "{note}");
        assert!(
            note.contains("3 went missing between the two daemons"),
            "{note}"
        );
        assert!(note.contains("neither daemon counted a drop"), "{note}");
        run.reliable = false;
        assert!(
            run.note().contains("does not repair loss"),
            "{}",
            run.note()
        );
    }

    #[test]
    fn each_daemon_names_the_other_as_its_peer_over_the_stack() {
        let l = |server, p, t| Listens {
            server,
            peer: SocketAddr::from(([127, 0, 0, 1], p)),
            tunnel: SocketAddr::from(([127, 0, 0, 1], t)),
        };
        let text = daemon_config(
            TunnelStack::Ltl,
            l(SERVER_A, 1, 2),
            l(SERVER_B, 3, 4),
            Path::new("/tmp/r"),
            Path::new("/tmp/k"),
        );
        for want in [
            "id = \"10.254.0.1\"",
            "peer_listen = \"127.0.0.1:1\"",
            "name = \"ltl\"\nlisten = \"127.0.0.1:2\"",
            "server = \"10.254.0.2\"\naddress = \"127.0.0.1:3\"\nstack = \"ltl\"\ntunnel = \"127.0.0.1:4\"",
            "secret = \"/tmp/k\"",
            "default = \"allow\"",
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
        let parsed = uniplane_services::Config::parse(&text, "a").unwrap();
        assert_eq!(parsed.peers.len(), 1);
        assert_eq!(parsed.peers[0].stack, "ltl");
    }
}
