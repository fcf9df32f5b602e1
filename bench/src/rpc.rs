//! `rpc`: unary calls of one Echo service through uniplane, next to the
//! same service in tonic over plain TCP loopback, in one run.
//!
//! ```text
//!  uniplane side (--mode native | tonic)            peer: tonic over TCP loopback
//!  ┌ client thread ┐  shm rings  ┌─────────┐        ┌ client thread ┐  127.0.0.1  ┌ server thread ┐
//!  │ N callers     ├────────────►│uniplaned├──┐     │ N callers     ├────────────►│ tonic Echo    │
//!  └───────────────┘             └─────────┘  │     └───────────────┘             └───────────────┘
//!  ┌ server thread ┐◄── shm (one daemon) or ───┘
//!  │ Echo service  │    tcp/ltl tunnel to a second uniplaned
//!  └───────────────┘
//! ```
//!
//! Each side runs on two OS threads of this process, one current-thread
//! tokio runtime each (client, server): on a 2-core machine that is
//! tonic's best configuration (a multi-thread runtime's work stealing
//! costs more than it gives here). `concurrency` callers run a closed
//! loop on the client thread for `seconds` after a short warm-up. CPU time
//! per request is each runtime thread's CPU time (and the daemons', from
//! `/proc`) over the measured window, divided by the requests.
//!
//! The daemons are `uniplaned` processes started here on configurations
//! of their own: one for `shm`; two peered over a `tcp` or `ltl` tunnel
//! on loopback, with a cluster secret, for the others.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use uniplane_client::{Client, DataPathOptions, Session, Wait};
use uniplane_dataplane::Endpoint;
use uniplane_rpc::echo::echo_client::EchoClient;
use uniplane_rpc::echo::echo_server::EchoServer;
use uniplane_rpc::echo::Payload;
use uniplane_rpc::tonic::{incoming, EchoService, UidConnector};
use uniplane_rpc::{Call, ClientOptions, Reply, ServerCall, ServerOptions, Status};

use crate::hist::LatencyHistogram;
use crate::path::sibling_binary;
use crate::stacks::free_port;
use crate::BenchError;

/// What carries the calls on the uniplane side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcMode {
    /// uniplane-rpc's own frames.
    Native,
    /// tonic over the byte-stream adapter.
    Tonic,
}

/// The stack between caller and server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcStack {
    /// Both on one daemon: shared memory and its engine.
    Shm,
    /// Two daemons, an LTL tunnel (UDP) on loopback.
    Ltl,
    /// Two daemons, a TCP tunnel on loopback.
    Tcp,
}

impl RpcStack {
    fn name(self) -> &'static str {
        match self {
            RpcStack::Shm => "shm",
            RpcStack::Ltl => "ltl",
            RpcStack::Tcp => "tcp",
        }
    }
}

/// How the sessions and the engine wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcWait {
    /// Sessions and engine poll without sleeping.
    Busy,
    /// Spin 50 µs, then park (engine: spin-then-park).
    Spin,
    /// Park at once.
    Park,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RpcConfig {
    /// The uniplane side's protocol.
    pub mode: RpcMode,
    /// The uniplane side's stack.
    pub stack: RpcStack,
    /// Calls in flight.
    pub concurrency: usize,
    /// Payload bytes per request (and response).
    pub size: usize,
    /// Measured seconds per side.
    pub seconds: f64,
    /// Waiting on the uniplane side.
    pub wait: RpcWait,
    /// The daemon binary; next to this program when `None`.
    pub uniplaned: Option<PathBuf>,
}

const PORT: u16 = 50051;
const WARMUP: Duration = Duration::from_millis(300);

fn cfg_err(what: impl std::fmt::Display) -> BenchError {
    BenchError::Config(what.to_string())
}

/// A `uniplaned` started here on `config`; killed on drop.
struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Daemon {
    fn start(binary: &Path, dir: &Path, config: &str) -> Result<Daemon, BenchError> {
        std::fs::create_dir_all(dir).map_err(cfg_err)?;
        let file = dir.join("uniplaned.toml");
        std::fs::File::create(&file)
            .and_then(|mut f| f.write_all(config.as_bytes()))
            .map_err(cfg_err)?;
        let child = Command::new(binary)
            .arg("--config")
            .arg(&file)
            .env("UNIPLANE_RUNTIME_DIR", dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| cfg_err(format!("starting {}: {e}", binary.display())))?;
        let d = Daemon {
            child,
            dir: dir.to_owned(),
        };
        let socket = dir.join(uniplane_client::CONTROL_SOCKET);
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if start.elapsed() > Duration::from_secs(20) {
                return Err(cfg_err("uniplaned did not start within 20 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    /// User + system CPU time so far, in nanoseconds.
    fn cpu_ns(&self) -> u64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())) else {
            return 0;
        };
        // Fields after the command name (which may hold spaces).
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        ticks * 1_000_000_000 / hz
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn engine(wait: RpcWait) -> &'static str {
    match wait {
        RpcWait::Busy => "busy-poll",
        RpcWait::Spin | RpcWait::Park => "spin-then-park",
    }
}

/// The daemons of `stack`: (the caller's, the server's).
fn daemons(cfg: &RpcConfig, binary: &Path, base: &Path) -> Result<Vec<Daemon>, BenchError> {
    let mode = engine(cfg.wait);
    let common = format!("[engine]\nmax_ports = 8\nring_depth = 1024\nmode = \"{mode}\"\n\n");
    if cfg.stack == RpcStack::Shm {
        let text = format!(
            "[server]\nid = \"127.0.0.1\"\npeer_listen = \"127.0.0.1:0\"\n\n{common}\
             [policy]\ndefault = \"allow-local\"\n"
        );
        return Ok(vec![Daemon::start(binary, &base.join("one"), &text)?]);
    }
    std::fs::create_dir_all(base).map_err(cfg_err)?;
    let secret = base.join("cluster.key");
    let mut key = [0u8; 32];
    getrandom(&mut key);
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&secret)
            .map_err(cfg_err)?;
        writeln!(f, "{hex}").map_err(cfg_err)?;
    }
    let ends = [
        ("10.20.0.1", free_port()?, free_port()?),
        ("10.20.0.2", free_port()?, free_port()?),
    ];
    let stack = cfg.stack.name();
    let mut out = Vec::new();
    for (i, (me, peer, tunnel)) in ends.iter().enumerate() {
        let (other, opeer, otunnel) = ends[1 - i];
        let text = format!(
            "[server]\nid = \"{me}\"\npeer_listen = \"{peer}\"\n\n{common}\
             [[stacks]]\nname = \"{stack}\"\nlisten = \"{tunnel}\"\n\n\
             [[peers]]\nserver = \"{other}\"\naddress = \"{opeer}\"\ntunnel = \"{otunnel}\"\nstack = \"{stack}\"\n\n\
             [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
            secret.display()
        );
        out.push(Daemon::start(binary, &base.join(format!("d{i}")), &text)?);
    }
    // Until each sees the other alive.
    let rt = runtime()?;
    rt.block_on(async {
        let start = Instant::now();
        for d in &out {
            let c = Client::connect(&d.dir).await.map_err(cfg_err)?;
            loop {
                let status = c
                    .request(&uniplane_client::protocol::Request::Status)
                    .await
                    .map_err(cfg_err)?;
                let alive = status["peers"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true));
                if alive {
                    break;
                }
                if start.elapsed() > Duration::from_secs(20) {
                    return Err(cfg_err("the daemons did not become peers within 20 s"));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok::<(), BenchError>(())
    })?;
    Ok(out)
}

fn getrandom(buf: &mut [u8]) {
    let mut seed = Instant::now().elapsed().as_nanos() as u64 ^ std::process::id() as u64;
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if std::io::Read::read_exact(&mut f, buf).is_ok() {
            return;
        }
    }
    for b in buf {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        *b = seed as u8;
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| BenchError::Thread {
            what: "rpc runtime",
            source,
        })
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A server on its own thread; answers CPU-time samples of that thread.
struct ServerThread {
    samples: mpsc::UnboundedSender<oneshot::Sender<u64>>,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Option<oneshot::Sender<()>>,
}

impl ServerThread {
    /// Runs `serve` (given a ready signal) on a new thread's runtime.
    fn spawn<F, Fut>(serve: F) -> Result<(ServerThread, Endpoint), BenchError>
    where
        F: FnOnce(oneshot::Sender<Result<Endpoint, String>>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let (samples, mut sample_rx) = mpsc::unbounded_channel::<oneshot::Sender<u64>>();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("rpc-server".into())
            .spawn(move || {
                let Ok(rt) = runtime() else { return };
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    tokio::task::spawn_local(async move {
                        while let Some(reply) = sample_rx.recv().await {
                            let _ = reply.send(thread_cpu_ns());
                        }
                    });
                    tokio::task::spawn_local(serve(ready_tx));
                    let _ = stop_rx.await;
                });
            })
            .map_err(|source| BenchError::Thread {
                what: "rpc server",
                source,
            })?;
        let at = ready_rx
            .blocking_recv()
            .map_err(|_| BenchError::SideGone("rpc server"))?
            .map_err(cfg_err)?;
        Ok((
            ServerThread {
                samples,
                thread: Some(thread),
                stop: Some(stop),
            },
            at,
        ))
    }

    async fn cpu_ns(&self) -> u64 {
        let (tx, rx) = oneshot::channel();
        let _ = self.samples.send(tx);
        rx.await.unwrap_or(0)
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn session(dir: &Path, name: &str, wait: RpcWait) -> Result<Session, String> {
    let wait = match wait {
        RpcWait::Busy => Wait::Busy,
        RpcWait::Spin => Wait::Park {
            spin: Duration::from_micros(50),
        },
        RpcWait::Park => Wait::Park {
            spin: Duration::ZERO,
        },
    };
    Client::connect(dir)
        .await
        .map_err(|e| e.to_string())?
        .attach_with(name, DataPathOptions { wait })
        .await
        .map_err(|e| e.to_string())
}

/// The native Echo: the request message back.
fn native_echo() -> impl tower::Service<
    ServerCall,
    Response = Reply,
    Error = Status,
    Future = impl std::future::Future<Output = Result<Reply, Status>> + Send + 'static,
> + Clone {
    tower::service_fn(
        |call: ServerCall| async move { Ok(Reply::Unary(call.into_message().await?)) },
    )
}

/// What one side measured.
struct Measured {
    hist: LatencyHistogram,
    requests: u64,
    window: f64,
    client_cpu_ns: u64,
    server_cpu_ns: u64,
    daemon_cpu_ns: u64,
    errors: u64,
}

impl Measured {
    fn json(&self) -> Value {
        let per = |ns: u64| {
            if self.requests == 0 {
                0.0
            } else {
                ns as f64 / self.requests as f64
            }
        };
        json!({
            "latency_ns": self.hist.percentiles(),
            "requests": self.requests,
            "requests_per_sec": self.rps(),
            "errors": self.errors,
            "cpu_ns_per_request": {
                "client": per(self.client_cpu_ns),
                "server": per(self.server_cpu_ns),
                "daemons": per(self.daemon_cpu_ns),
            },
        })
    }

    fn rps(&self) -> f64 {
        if self.window > 0.0 {
            self.requests as f64 / self.window
        } else {
            0.0
        }
    }
}

/// `concurrency` closed-loop callers of `call` on this thread's runtime;
/// CPU times sampled at the window's edges.
async fn load<F, Fut>(
    cfg: &RpcConfig,
    server: Option<&ServerThread>,
    daemons: &[Daemon],
    call: F,
) -> Measured
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let warm = Instant::now() + WARMUP;
    let end = warm + Duration::from_secs_f64(cfg.seconds);
    let callers = (0..cfg.concurrency).map(|_| async {
        let mut hist = LatencyHistogram::new();
        let (mut n, mut errors) = (0u64, 0u64);
        loop {
            let t0 = Instant::now();
            if t0 >= end {
                break;
            }
            let ok = call().await;
            if t0 >= warm {
                if ok {
                    hist.record(t0.elapsed().as_nanos() as u64);
                    n += 1;
                } else {
                    errors += 1;
                }
            }
        }
        (hist, n, errors)
    });
    let sample = || async {
        (
            thread_cpu_ns(),
            match server {
                Some(s) => s.cpu_ns().await,
                None => 0,
            },
            daemons.iter().map(Daemon::cpu_ns).sum::<u64>(),
        )
    };
    let sampler = async {
        tokio::time::sleep_until(warm.into()).await;
        let before = sample().await;
        tokio::time::sleep_until(end.into()).await;
        (before, sample().await)
    };
    let (results, (before, after)) =
        futures_util::future::join(futures_util::future::join_all(callers), sampler).await;
    let mut m = Measured {
        hist: LatencyHistogram::new(),
        requests: 0,
        window: end.duration_since(warm).as_secs_f64(),
        client_cpu_ns: after.0.saturating_sub(before.0),
        server_cpu_ns: after.1.saturating_sub(before.1),
        daemon_cpu_ns: after.2.saturating_sub(before.2),
        errors: 0,
    };
    for (h, n, e) in &results {
        m.hist.merge(h);
        m.requests += n;
        m.errors += e;
    }
    m
}

/// The uniplane side.
fn measure_uniplane(cfg: &RpcConfig, daemons: &[Daemon]) -> Result<Measured, BenchError> {
    let server_dir = daemons[daemons.len() - 1].dir.clone();
    let wait = cfg.wait;
    let mode = cfg.mode;
    let (server, at) = ServerThread::spawn(move |ready| async move {
        let s = match session(&server_dir, "rpc-server", wait).await {
            Ok(s) => s,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let listener = match s.listen(PORT).await {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        };
        let _ = ready.send(Ok(s.uid().port(PORT)));
        match mode {
            RpcMode::Native => {
                let options = ServerOptions {
                    max_concurrent_calls: 1024,
                    ..ServerOptions::default()
                };
                let token = uniplane_rpc::ShutdownToken::new();
                uniplane_rpc::serve(listener, |_| native_echo(), options, token).await;
            }
            RpcMode::Tonic => {
                let _ = tonic::transport::Server::builder()
                    .add_service(EchoServer::new(EchoService))
                    .serve_with_incoming(incoming(listener))
                    .await;
            }
        }
        drop(s);
    })?;
    let caller_dir = daemons[0].dir.clone();
    let rt = runtime()?;
    rt.block_on(async {
        let s = Arc::new(
            session(&caller_dir, "rpc-client", cfg.wait)
                .await
                .map_err(cfg_err)?,
        );
        let payload = Bytes::from(vec![0x5a; cfg.size]);
        let m = match cfg.mode {
            RpcMode::Native => {
                let conn = s.connect(at).await.map_err(cfg_err)?;
                let client = uniplane_rpc::Client::new(
                    conn,
                    ClientOptions {
                        max_in_flight: cfg.concurrency.max(1),
                        ..ClientOptions::default()
                    },
                );
                load(cfg, Some(&server), daemons, || {
                    let mut c = client.clone();
                    let call = Call::new("/uniplane.echo.Echo/Unary", payload.clone());
                    async move {
                        use tower::{Service, ServiceExt};
                        match c.ready().await {
                            Ok(c) => c.call(call).await.is_ok(),
                            Err(_) => false,
                        }
                    }
                })
                .await
            }
            RpcMode::Tonic => {
                let channel = tonic::transport::Endpoint::from_static("http://uniplane")
                    .connect_with_connector(UidConnector::new(s.clone(), at))
                    .await
                    .map_err(cfg_err)?;
                let client = EchoClient::new(channel);
                load(cfg, Some(&server), daemons, || {
                    let mut c = client.clone();
                    let data = payload.clone();
                    async move { c.unary(Payload { data }).await.is_ok() }
                })
                .await
            }
        };
        Ok::<_, BenchError>(m)
    })
}

/// The peer's tonic server on `listener`.
async fn tonic_over_tcp(listener: tokio::net::TcpListener) {
    let incoming = futures_util::stream::unfold(listener, |l| async move {
        let s = l.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            s
        });
        Some((s, l))
    });
    let _ = tonic::transport::Server::builder()
        .add_service(EchoServer::new(EchoService))
        .serve_with_incoming(incoming)
        .await;
}

/// How the peer's two ends share threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerRuntime {
    /// Client and server each on their own thread's current-thread runtime.
    Split,
    /// Both on one current-thread runtime (one thread, no cross-thread
    /// wake-ups; its CPU time is all counted as the client's).
    Shared,
}

/// The peer: the same Echo in tonic over TCP loopback.
fn measure_tcp(cfg: &RpcConfig, how: PeerRuntime) -> Result<Measured, BenchError> {
    let server = match how {
        PeerRuntime::Split => Some(ServerThread::spawn(|ready| async move {
            let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready.send(Err(e.to_string()));
                    return;
                }
            };
            let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
            let _ = ready.send(Ok(Endpoint {
                uid: uniplane_dataplane::Uid::new([127, 0, 0, 1].into(), 0),
                port,
            }));
            tonic_over_tcp(listener).await;
        })?),
        PeerRuntime::Shared => None,
    };
    let rt = runtime()?;
    rt.block_on(async {
        let port = match &server {
            Some((_, at)) => at.port,
            None => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .map_err(cfg_err)?;
                let port = listener.local_addr().map_err(cfg_err)?.port();
                tokio::spawn(tonic_over_tcp(listener));
                port
            }
        };
        let uri = format!("http://127.0.0.1:{port}");
        let channel = tonic::transport::Endpoint::from_shared(uri)
            .map_err(cfg_err)?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(cfg_err)?;
        let client = EchoClient::new(channel);
        let payload = Bytes::from(vec![0x5a; cfg.size]);
        Ok(load(cfg, server.as_ref().map(|(s, _)| s), &[], || {
            let mut c = client.clone();
            let data = payload.clone();
            async move { c.unary(Payload { data }).await.is_ok() }
        })
        .await)
    })
}

/// Runs both sides; the `results` of the report.
pub fn run_rpc(cfg: &RpcConfig) -> Result<Value, BenchError> {
    let binary = match &cfg.uniplaned {
        Some(p) => p.clone(),
        None => sibling_binary("uniplaned").ok_or_else(|| {
            cfg_err("no uniplaned next to this program: cargo build --release -p uniplane-services --bin uniplaned (or pass --uniplaned PATH)")
        })?,
    };
    let base = std::env::temp_dir().join(format!("uniplane-bench-rpc-{}", std::process::id()));
    let daemons = daemons(cfg, &binary, &base)?;
    let ours = measure_uniplane(cfg, &daemons)?;
    drop(daemons);
    let _ = std::fs::remove_dir_all(&base);
    // tonic in both of its best shapes here; the ratios take the faster.
    let split = measure_tcp(cfg, PeerRuntime::Split)?;
    let shared = measure_tcp(cfg, PeerRuntime::Shared)?;
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let p50 = |m: &Measured| m.hist.quantile(0.5) as f64;
    let (best_p50, p50_from) = if p50(&shared) < p50(&split) {
        (p50(&shared), "shared")
    } else {
        (p50(&split), "split")
    };
    let (best_rps, rps_from) = if shared.rps() > split.rps() {
        (shared.rps(), "shared")
    } else {
        (split.rps(), "split")
    };
    let mut results = ours.json();
    results["p50_ratio"] = json!(ratio(p50(&ours), best_p50));
    results["rps_ratio"] = json!(ratio(ours.rps(), best_rps));
    results["peer"] = json!({
        "name": "tonic over TCP loopback on current-thread runtimes",
        "split": split.json(),
        "shared": shared.json(),
        "best_p50_from": p50_from,
        "best_rps_from": rps_from,
    });
    results["peer"]["split"]["runtime"] =
        json!("client and server each on its own thread's current-thread runtime");
    results["peer"]["shared"]["runtime"] =
        json!("client and server on one current-thread runtime (CPU all counted as client)");
    Ok(results)
}
