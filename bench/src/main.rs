//! `uniplane-bench`: uniplane's packet generator and benchmarks.
//!
//! ```text
//! uniplane-bench gen  --stack mem --size 64 --seconds 10 --json
//! uniplane-bench gen  --stack udp --sizes 64..1024 --rate 1Mpps --plot sweep.svg
//! uniplane-bench rtt  --stack mem --size 64 --seconds 5
//! uniplane-bench peer --tool iperf3 --seconds 3 --rounds 2 --json
//! uniplane-bench tunnel --stack udp --size 64 --seconds 2 --json
//! ```

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use serde_json::{json, Value};
use uniplane_bench::args::{parse_size, Pattern, Rate, SizeSweep};
use uniplane_bench::engine::{Observer, Progress, Sample, L1_OVERHEAD, THREADING};
use uniplane_bench::gen::{loss_probability, run_gen, GenConfig, GenRun, Stop, Threads};
use uniplane_bench::hist::Percentiles;
use uniplane_bench::peer::{self, Iperf3Udp, Peer, Round, Workload};
use uniplane_bench::plot::{self, Chart};
use uniplane_bench::report::{
    GenParams, GenResults, LtlSenderCounters, LtlSenderPhases, PerSecond, Report, RttParams,
    RttResults, SIZE_COUNTS,
};
use uniplane_bench::rtt::{open_rtt_stack, run_rtt, RttConfig};
use uniplane_bench::sizes::SizeMix;
use uniplane_bench::stacks::{default_endpoints, open_lossy_ltl, open_stack, Endpoints};
use uniplane_bench::BenchError;
use uniplane_dataplane::wire::HEADER_LEN;
use uniplane_dataplane::Locator;

/// uniplane's packet generator and benchmarks.
#[derive(Parser)]
#[command(name = "uniplane-bench", version, about)]
struct Cli {
    /// Print one JSON document on the last line of stdout.
    #[arg(long, global = true)]
    json: bool,
    /// No per-second lines and no progress indicator.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate traffic over a stack; measure rate, one-way latency, loss.
    Gen(GenArgs),
    /// Closed-loop ping-pong over a stack; measure round-trip time.
    Rtt(RttArgs),
    /// Run a real peer tool and uniplane on the same workload, alternating.
    Peer(PeerArgs),
    /// The overlay engine's throughput on one core (DUA Table 2).
    Fabric(FabricArgs),
    /// The latency the overlay adds to a path (DUA Fig. 11(a)).
    Overhead(OverheadArgs),
    /// Three applications share a shaped interface; fair, then weighted (DUA Fig. 11(b)).
    Share(ShareArgs),
    /// The whole path through a uniplaned started here: application →
    /// plane → echo → application, and one way between two applications.
    Path(PathArgs),
    /// One way between two servers: through two uniplaned started here,
    /// peers over a sealed tunnel, beside the stack alone and the cost of
    /// sealing.
    Tunnel(TunnelArgs),
    /// Unary RPC of one Echo service through uniplane (native frames or
    /// tonic over the byte-stream adapter) beside tonic over TCP loopback.
    Rpc(RpcArgs),
    /// OSU-style latency of one collective through uniplane-collectives
    /// beside OpenMPI and MPICH, same sizes and rank counts.
    Collectives(CollectivesArgs),
    /// PGAS active messages (uniplane-pgas) beside OpenSHMEM, same sizes.
    Pgas(PgasArgs),
    /// How the engine's cost grows: ports (4 → 64), installed connections
    /// (1 → 100,000) and message size (64 B → 64 KiB); heap per connection.
    Scale(ScaleArgs),
    /// A memory device (host or GPU memory) written and read back through
    /// a daemon started in this process, beside memcpy (host) or the
    /// driver's pinned host-to-device copy (gpu).
    Devices(DevicesArgs),
    /// Peer-to-peer transfers between two emulated devices (push, pull,
    /// staged, pipelined) over a sweep of sizes, beside memcpy of the same
    /// sizes between the same memories.
    P2p(P2pArgs),
    /// The RTL crossbar in co-simulation (a build with `--features rtl`):
    /// beats per cycle per output with every input backlogged, beside the
    /// line rate (all-to-one) or the head-of-line bound (uniform).
    Hw(HwArgs),
    /// Every headline row of the performance issue, each through its own
    /// subcommand: ours, the peer, the ratio, the target; one JSON file and
    /// one SVG summary.
    Suite(SuiteArgs),
    /// DUA's applications (NSDI'19 §8.2) through daemons started here.
    App(AppArgs),
    /// The floor of a paced sender's CPU: a thread that only wakes at the
    /// rate (clock_nanosleep to absolute times) and does nothing else.
    Wake(WakeArgs),
    /// Writes this command's manual pages and shell completions into DIR
    /// (for packaging).
    #[command(hide = true)]
    GenerateManual {
        /// Where to write them.
        dir: std::path::PathBuf,
    },
}

#[derive(Args)]
struct WakeArgs {
    /// Wake-ups per second, as a message rate: 2kpps, 500pps.
    #[arg(long, default_value = "2kpps")]
    rate: Rate,
    /// Seconds of wake-ups.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
}

#[derive(Args)]
struct AppArgs {
    #[command(subcommand)]
    app: AppCommand,
}

#[derive(Subcommand)]
enum AppCommand {
    /// Deep crossing (Fig. 12): latency and inferences/s with the dense
    /// layers in one kernel endpoint and split over two, per path.
    DeepCrossing(uniplane_bench::app_deep_crossing::DeepCrossingArgs),
    /// Multi-regex matching (Fig. 13): three stages through uniplane, a
    /// relay through the CPU and one PCRE2 core, per input size.
    Regex(uniplane_bench::app_regex::RegexArgs),
}

#[derive(Args)]
struct CollectivesArgs {
    /// The collective (int32 sums for reductions).
    #[arg(long, default_value = "allreduce", value_parser = ["allreduce", "bcast", "reduce", "allgather", "alltoall", "barrier"])]
    op: String,
    /// Ranks.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..=16))]
    ranks: u32,
    /// Bytes per rank (per block for allgather/alltoall): `8..4M` doubles.
    #[arg(long, default_value = "8..4M")]
    sizes: String,
    /// Timed calls per size (0: by size, 1000 to 40).
    #[arg(long, default_value_t = 0)]
    iterations: usize,
    /// shm: one daemon; tcp or ltl: two daemons peered over that tunnel, ranks alternating.
    #[arg(long, default_value = "shm", value_parser = ["shm", "tcp", "ltl"])]
    stack: String,
    /// busy: sessions and engine poll (as MPI does); park: sessions park at once, the engine spins then parks.
    #[arg(long, default_value = "busy", value_parser = ["busy", "park"])]
    wait: String,
    /// Eager threshold of the uniplane side in bytes (default 64 KiB).
    #[arg(long)]
    eager: Option<usize>,
    /// Skip OpenMPI and MPICH.
    #[arg(long)]
    no_mpi: bool,
    /// Also run allreduce/reduce through a reduction operator endpoint (same run).
    #[arg(long)]
    operator: bool,
    /// The uniplaned binary (default: the one next to this program).
    #[arg(long)]
    uniplaned: Option<PathBuf>,
    /// Draw latency against size, one line per library (SVG or PNG).
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Args)]
struct ScaleArgs {
    /// Seconds per point.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Port counts, uniform traffic of 64 B.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,32,64")]
    ports: Vec<usize>,
    /// Installed connections (routes and ACL entries on one input).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,10,100,1000,10000,100000"
    )]
    connections: Vec<usize>,
    /// Payload sizes, four ports to one.
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "64,256,1024,4096,16384,65535")]
    sizes: Vec<usize>,
    /// Draw each sweep (M msgs/s and ns per message): PREFIX-ports.svg,
    /// PREFIX-connections.svg, PREFIX-sizes.svg.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Args)]
struct DevicesArgs {
    /// Where the device keeps its bytes (gpu needs a build with `--features gpu`).
    #[arg(long, default_value = "host", value_parser = ["host", "gpu"])]
    memory: String,
    /// A kernel device instead of memory: round trips to an echo kernel
    /// behind the emulated PCIe path (PIO mailbox or FPGA Connect by size).
    #[arg(long, value_parser = ["emulated"])]
    backend: Option<String>,
    /// Bytes written and read back (K, M, G: powers of 1024; at most 1G);
    /// with --backend, bytes per message (at most 65535). Default: 64M,
    /// with --backend 64.
    #[arg(long)]
    size: Option<String>,
    /// With --backend: how the application, engine and kernel thread wait.
    #[arg(long, default_value = "park", value_parser = ["busy", "park"])]
    wait: String,
    /// With --backend: round trips measured.
    #[arg(long, default_value_t = 20_000)]
    count: usize,
    /// Compare the bytes read back with those written.
    #[arg(long)]
    verify: bool,
    /// The CUDA device ordinal (--memory gpu).
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// Timed rounds of each figure; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
}

#[derive(Args)]
struct SuiteArgs {
    /// Short measurements (the default seconds become 1): every row in
    /// well under 3 minutes.
    #[arg(long)]
    quick: bool,
    /// Seconds per measurement (default 3, 1 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=60))]
    seconds: Option<u64>,
    /// Only these rows, comma-separated (see the report for their names).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Where to write the report: OUT.json and OUT.svg.
    #[arg(long, default_value = "uniplane-suite")]
    out: PathBuf,
    /// Print the rows as a Markdown table (the one in docs/benchmarks.md).
    #[arg(long)]
    markdown: bool,
    /// Render the table and the SVG from an earlier report (OUT.json of a
    /// run) instead of measuring.
    #[arg(long)]
    from: Option<PathBuf>,
    /// Draw the summary here instead of OUT.svg (.svg or .png).
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Args)]
struct HwArgs {
    /// all-to-one (inputs 1..N to port 0) or uniform (every input, random outputs).
    #[arg(long, default_value = "uniform", value_parser = ["all-to-one", "uniform"])]
    pattern: String,
    /// Payload bytes of every message (at most 9000).
    #[arg(long, default_value_t = 1500)]
    size: usize,
    /// The model: 4 or 8 ports.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(4..=8))]
    ports: u32,
    /// The crossbar: ports (a read port per output in every input's
    /// buffer, no matching) or islip (two read ports per input,
    /// iSLIP-style matching).
    #[arg(long, default_value = "ports", value_parser = ["ports", "islip"])]
    crossbar: String,
    /// Measured clock cycles (after 2,000 of warm-up).
    #[arg(long, default_value_t = 20_000)]
    cycles: u64,
    /// Seed of the uniform destinations.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Draw beats per cycle per output beside the reference (SVG or PNG).
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Args)]
struct P2pArgs {
    /// Transfer modes, comma-separated: push, pull, staged, pipelined, or all.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    mode: Vec<String>,
    /// Bytes per transfer: sizes and FROM..TO ranges that double, with K or
    /// M suffixes (at most 256M), e.g. 4..32M or 64,4K,1M.
    #[arg(long, default_value = "4..32M")]
    sizes: String,
    /// Milliseconds spent on each point (at least 3 transfers each).
    #[arg(long, default_value_t = 60)]
    budget_ms: u64,
    /// Clear B before each point and compare its bytes with A's after.
    #[arg(long)]
    verify: bool,
    /// A PCIe link model for both engines: none (memory speed), gen2x4, gen3x8.
    #[arg(long, default_value = "none")]
    model: String,
    /// Where the modelled link goes: direct, switch or rc (root complex).
    #[arg(long, default_value = "direct")]
    link_path: String,
    /// Draw GB/s against size, a line per mode and memcpy's (SVG or PNG).
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Args)]
struct PgasArgs {
    /// short: active message round trip; put: put-with-signal round trip;
    /// get; atomic: 64-bit fetch-add; put-quiet: long message + quiet;
    /// window: one-sided WRITEs into a window, completed.
    #[arg(long, default_value = "put", value_parser = ["short", "put", "get", "atomic", "put-quiet", "window"])]
    op: String,
    /// shm: both ranks on one daemon; tcp, ltl, udp: rank 1 on a second
    /// daemon, the two peered over a tunnel of that stack on loopback.
    #[arg(long, default_value = "shm", value_parser = ["shm", "tcp", "ltl", "udp"])]
    stack: String,
    /// Rank 1: software (a second session's endpoint) or hardware (a
    /// `pgas-target` kernel device; short, get, atomic, put-quiet).
    #[arg(long, default_value = "software", value_parser = ["software", "hardware"])]
    target: String,
    /// Payload sizes (put, get): sizes and FROM..TO ranges that double,
    /// with K or M suffixes, e.g. 8..4M or 8,4K,1M.
    #[arg(long, default_value = "8..4M")]
    sizes: String,
    /// busy: sessions and engine poll; park: sessions sleep when idle, the engine spins then sleeps.
    #[arg(long, default_value = "park", value_parser = ["busy", "park"])]
    wait: String,
    /// Skip the OpenSHMEM side.
    #[arg(long)]
    no_openshmem: bool,
    /// Keep the segments private: ranks of one server reach each other's
    /// by message only (the path before shared segments).
    #[arg(long)]
    no_share: bool,
    /// The uniplaned binary (default: the one next to this program).
    #[arg(long)]
    uniplaned: Option<PathBuf>,
}

#[derive(Args)]
struct TunnelArgs {
    /// The tunnel's stack (and the peer's): udp, ltl or tcp.
    #[arg(long, default_value = "udp", value_parser = ["udp", "ltl", "tcp"])]
    stack: String,
    /// Payload bytes.
    #[arg(long, value_parser = parse_size, default_value = "64")]
    size: usize,
    /// Measured seconds, through the tunnel and over the stack alone each.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Seconds of warm-up before each of the two, excluded.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// The uniplaned binary (default: the one next to this program).
    #[arg(long)]
    uniplaned: Option<PathBuf>,
}

#[derive(Args)]
struct RpcArgs {
    /// native: uniplane-rpc's frames; tonic: tonic over the byte-stream adapter.
    #[arg(long, default_value = "native", value_parser = ["native", "tonic"])]
    mode: String,
    /// shm: one daemon; tcp or ltl: two daemons peered over that tunnel.
    #[arg(long, default_value = "shm", value_parser = ["shm", "tcp", "ltl"])]
    stack: String,
    /// Calls in flight.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Payload bytes of each request and response (a call may span
    /// several overlay messages: up to 4 MiB).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(0..=4 << 20))]
    size: u32,
    /// Measured seconds per side.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// busy: sessions and engine poll; spin: spin 50 µs then park; park: park at once.
    #[arg(long, default_value = "park", value_parser = ["busy", "spin", "park"])]
    wait: String,
    /// The uniplaned binary (default: the one next to this program).
    #[arg(long)]
    uniplaned: Option<PathBuf>,
}

#[derive(Args)]
struct PathArgs {
    /// Payload bytes.
    #[arg(long, value_parser = parse_size, default_value = "64")]
    size: usize,
    /// Seconds, split between the round-trip and one-way phases.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// The daemon's forwarding plane: engine or rtl (a daemon built with --features rtl).
    #[arg(long, default_value = "engine", value_parser = ["engine", "rtl"])]
    plane: String,
    /// busy: the application and the engine poll; park: they sleep when idle.
    #[arg(long, default_value = "busy", value_parser = ["busy", "park"])]
    wait: String,
    /// The uniplaned binary (default: the one next to this program).
    #[arg(long)]
    uniplaned: Option<PathBuf>,
    /// Round trips of `uniplane ping self` run beside (0: none).
    #[arg(long, default_value_t = 2000)]
    ping_count: u64,
}

#[derive(Args)]
struct FabricArgs {
    /// Sending ports.
    #[arg(long, default_value_t = 4)]
    ports: usize,
    /// all-to-one or uniform.
    #[arg(long, default_value = "all-to-one")]
    pattern: String,
    /// Payload bytes.
    #[arg(long, value_parser = parse_size, default_value = "64")]
    size: usize,
    /// Seconds.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Run the sharded engine on this many threads and measure by wall
    /// clock (without it: the single engine stepped here, timed by its
    /// CPU time).
    #[arg(long)]
    shards: Option<usize>,
    /// With --shards: `replay` (devices inside the shards replay
    /// pre-built messages) or `threads` (an application thread per port).
    #[arg(long, default_value = "replay")]
    source: String,
    /// With --shards: CPUs to pin the shards to, e.g. `0,2,4` (shard k
    /// on the k-th, round).
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// With --shards: messages a shard reads from one input per pass
    /// (each pass hands its queues to other cores once, so larger bursts
    /// spread that cost over more messages).
    #[arg(long, default_value_t = 256)]
    burst: usize,
    /// With --shards: messages each virtual output queue holds.
    #[arg(long, default_value_t = 1024)]
    voq_depth: usize,
}

#[derive(Args)]
struct OverheadArgs {
    /// Payload bytes.
    #[arg(long, value_parser = parse_size, default_value = "64")]
    size: usize,
    /// Round trips with and without the overlay (each).
    #[arg(long, default_value_t = 100_000)]
    count: u64,
}

#[derive(Args)]
struct ShareArgs {
    /// Weights of apps 1:2:3 after the policy change.
    #[arg(long, default_value = "1:1:2")]
    weights: String,
    /// Length of each of the four phases.
    #[arg(long, default_value_t = 250)]
    phase_ms: u64,
    /// Shaped interface rate, Gbit/s (default: 8 for `mux`, 0.2 for
    /// `daemons`).
    #[arg(long)]
    gbps: Option<f64>,
    /// Sampling interval.
    #[arg(long, default_value_t = 10)]
    interval_ms: u64,
    /// Draw the figure (throughput of each app over time): .svg or .png.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// `mux`: the underlay's multiplexer alone, in this process;
    /// `daemons`: two uniplaned peered over a tunnel, three applications
    /// on each side, the weights changed live halfway (two phases).
    #[arg(long, default_value = "mux")]
    through: String,
    /// The tunnel's stack, through the daemons: tcp, ltl or udp.
    #[arg(long, default_value = "tcp")]
    tunnel: String,
    /// Payload bytes per message, through the daemons.
    #[arg(long, default_value_t = 968)]
    size: usize,
    /// The daemon binary (default: next to this program).
    #[arg(long)]
    uniplaned: Option<PathBuf>,
}

#[derive(Args)]
struct Where {
    /// Stack, by name: mem, udp, udp-unpacked, udp-uring, udp-unpacked-uring, tcp, ltl, ether, …
    #[arg(long, default_value = "mem")]
    stack: String,
    /// Where the receiving side listens (default: a fresh name for mem, a
    /// free 127.0.0.1 port for IP stacks).
    #[arg(long)]
    listen: Option<Locator>,
    /// Where the sending side connects (default: the listen locator).
    #[arg(long)]
    connect: Option<Locator>,
}

impl Where {
    fn endpoints(&self) -> Result<Endpoints, BenchError> {
        match (&self.listen, &self.connect) {
            (Some(l), Some(c)) => Ok(Endpoints {
                listen: l.clone(),
                connect: c.clone(),
            }),
            (Some(l), None) | (None, Some(l)) => Ok(Endpoints {
                listen: l.clone(),
                connect: l.clone(),
            }),
            (None, None) => default_endpoints(&self.stack),
        }
    }
}

#[derive(Args)]
struct RunLength {
    /// Measured seconds (default 1).
    #[arg(long, conflicts_with = "count")]
    seconds: Option<f64>,
    /// Measured messages (or round trips) instead of seconds.
    #[arg(long)]
    count: Option<u64>,
    /// Seconds of warm-up before measuring, excluded from every figure.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
}

impl RunLength {
    fn stop(&self) -> Stop {
        match (self.seconds, self.count) {
            (_, Some(n)) => Stop::Count(n),
            (Some(s), None) => Stop::Seconds(s),
            (None, None) => Stop::Seconds(1.0),
        }
    }

    fn warmup(&self) -> Result<Duration, BenchError> {
        Duration::try_from_secs_f64(self.warmup)
            .map_err(|_| BenchError::Config(format!("bad warm-up `{}`", self.warmup)))
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum PlotKind {
    /// Sweep for a size sweep, throughput for longer runs, CDF otherwise.
    Auto,
    /// Received Mpps per second.
    Throughput,
    /// Latency CDF.
    Cdf,
    /// Mpps and Mbit/s per size.
    Sweep,
}

/// `gen --threads`: where the receiver runs.
#[derive(Clone, Copy, ValueEnum)]
enum ThreadsArg {
    /// On the sender's thread for a paced rate below 20 kpps (without
    /// --busy-poll), on its own thread otherwise.
    Auto,
    /// Sender and receiver each on its own OS thread.
    Split,
    /// Sender and receiver as two tasks of one OS thread.
    Shared,
}

impl From<ThreadsArg> for Threads {
    fn from(a: ThreadsArg) -> Threads {
        match a {
            ThreadsArg::Auto => Threads::Auto,
            ThreadsArg::Split => Threads::Split,
            ThreadsArg::Shared => Threads::Shared,
        }
    }
}

#[derive(Args)]
struct GenArgs {
    #[command(flatten)]
    at: Where,
    /// Payload bytes of each overlay message (default 64; the 32-byte
    /// overlay header comes on top).
    #[arg(long, value_parser = parse_size, conflicts_with_all = ["sizes", "imix"])]
    size: Option<usize>,
    /// A sweep, one run per size: 64,256,1500 or 64..4096 (doubling) or
    /// 64..1500:256 (step).
    #[arg(long, conflicts_with = "imix")]
    sizes: Option<SizeSweep>,
    /// The simple IMIX: 64, 594 and 1518 bytes in the ratio 7:4:1.
    #[arg(long)]
    imix: bool,
    /// Rate: max, 1Mpps, 500kpps, 10Gbps (bits of encoded messages, L2).
    #[arg(long, default_value = "max")]
    rate: Rate,
    /// Spacing: constant, burst, burst:N, poisson.
    #[arg(long, default_value = "constant")]
    pattern: Pattern,
    /// Flows, differing in source port and UID, sent round-robin.
    #[arg(long, default_value_t = 1)]
    flows: u32,
    #[command(flatten)]
    time: RunLength,
    /// Messages per send and receive call.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Seed of Poisson gaps.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Busy-poll the receiver instead of parking it.
    #[arg(long)]
    busy_poll: bool,
    /// Where the receiver runs: auto (on the sender's thread for a paced
    /// rate below 20 kpps, which saves a wake-up per message), split (its
    /// own thread), shared (the sender's thread).
    #[arg(long, value_enum, default_value = "auto")]
    threads: ThreadsArg,
    /// Draw a chart into this .svg or .png file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Which chart.
    #[arg(long, value_enum, default_value = "auto")]
    plot_kind: PlotKind,
    /// Loss in percent (0 to 100; --stack ltl only): each LTL endpoint
    /// drops that share of the datagrams it receives. The run then measures
    /// in four phases of half its length, each on a fresh stack: without
    /// loss, with, with, without; and reports goodput with loss ÷ goodput
    /// without. --seed seeds the drops.
    #[arg(long, allow_negative_numbers = true, conflicts_with = "sizes")]
    loss: Option<f64>,
}

#[derive(Args)]
struct RttArgs {
    #[command(flatten)]
    at: Where,
    /// Payload bytes.
    #[arg(long, value_parser = parse_size, default_value = "64")]
    size: usize,
    /// Requests outstanding at once.
    #[arg(long, default_value_t = 1)]
    inflight: usize,
    #[command(flatten)]
    time: RunLength,
    /// Busy-poll both sides instead of parking them.
    #[arg(long)]
    busy_poll: bool,
    /// Milliseconds after which an unanswered request counts as lost.
    #[arg(long, default_value_t = 200)]
    timeout_ms: u64,
    /// With --stack shm: round trips over a device path of shared memory
    /// instead of a link — pio (the PIO mailbox) or dma (the DMA ring) —
    /// beside a Unix-socket ping-pong of the same size in the same run.
    #[arg(long, value_parser = ["pio", "dma"])]
    path: Option<String>,
    /// Draw the RTT CDF (or throughput) into this .svg or .png file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Which chart.
    #[arg(long, value_enum, default_value = "auto")]
    plot_kind: PlotKind,
}

#[derive(Clone, Copy, ValueEnum)]
enum Tool {
    /// iperf3 UDP at full speed (-u -b 0): delivered datagrams per second.
    Iperf3,
    /// iperf3 TCP: payload Gbit/s received (use with --stack tcp).
    Iperf3Tcp,
    /// sockperf ping-pong over UDP: median round trip (use with --stack udp-unpacked or udp).
    Sockperf,
    /// dpdk-testpmd txonly on DPDK net_null ports: frames sent per second
    /// (use with --stack dpdk, in a build with --features dpdk).
    Testpmd,
    /// dpdk-testpmd rxonly on DPDK net_null ports, whose receive makes
    /// 64-byte frames: frames received per second (use with --stack dpdk,
    /// in a build with --features dpdk).
    TestpmdRx,
    /// netsniff-ng's trafgen on a veth between two namespaces: frames sent
    /// per second (use with --stack ether; root).
    Trafgen,
}

#[derive(Args)]
struct PeerArgs {
    /// The peer tool.
    #[arg(long, value_enum, default_value = "iperf3")]
    tool: Tool,
    /// Our stack for the same workload.
    #[arg(long, default_value = "udp-unpacked")]
    stack: String,
    /// Payload bytes.
    #[arg(long, value_parser = parse_size, default_value = "64")]
    size: usize,
    /// Seconds per measurement (whole seconds).
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Measurements of each side, alternating ours, peer, ours, peer, …
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Round trips with both sides spinning on their sockets: sockperf
    /// with non-blocking sockets, ours busy-polling.
    #[arg(long)]
    busy_poll: bool,
    /// Draw each round's figure, ours beside the peer's (SVG or PNG).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// `--tool iperf3-tcp --stack smoltcp`: the veth's MTU (9000: jumbo).
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
}

/// Per-second lines on stdout, a progress indicator on a terminal's stderr.
struct Live {
    label: String,
    quiet: bool,
    tty: bool,
    drawn: bool,
}

impl Live {
    fn new(label: String, quiet: bool) -> Self {
        Live {
            label,
            quiet,
            tty: std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    fn clear(&mut self) {
        if self.drawn {
            eprint!("\r{:79}\r", "");
            self.drawn = false;
        }
    }
}

impl Observer for Live {
    fn sample(&mut self, s: &Sample) {
        if self.quiet {
            return;
        }
        self.clear();
        println!(
            "{:>8} {:6.2} s  tx {:8.3} Mpps  rx {:8.3} Mpps  L2 {:9.1} Mbit/s  L1 {:9.1} Mbit/s  lat {:>9}  drops {}  errors {}",
            self.label,
            s.t_s,
            s.tx_pps / 1e6,
            s.rx_pps / 1e6,
            s.mbps_l2,
            s.mbps_l1,
            ns(s.mean_latency_ns),
            s.drops,
            s.errors
        );
    }

    fn progress(&mut self, p: &Progress) {
        if self.quiet || !self.tty {
            return;
        }
        let frac = match (p.planned_s, p.planned_count) {
            (Some(s), _) if s > 0.0 => p.elapsed_s / s,
            (_, Some(n)) if n > 0 => p.sent as f64 / n as f64,
            _ => 0.0,
        }
        .clamp(0.0, 1.0);
        let width = 30;
        let done = (frac * width as f64) as usize;
        let what = if p.warming_up { "warm-up" } else { "measuring" };
        eprint!(
            "\r{} [{}{}] {:3.0}% {}   ",
            self.label,
            "#".repeat(done),
            ".".repeat(width - done),
            frac * 100.0,
            what
        );
        let _ = std::io::stderr().flush();
        self.drawn = true;
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Progress on a terminal's stderr for a benchmark without progress of
/// its own: its name and the seconds so far (against the planned seconds
/// when known), redrawn every 200 ms from a thread until dropped; nothing
/// with `--json`, `--quiet` or without a terminal.
struct Ticker {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    fn start(cli: &Cli, label: &str, planned_s: Option<f64>) -> Ticker {
        if cli.quiet || cli.json || !std::io::stderr().is_terminal() {
            return Ticker {
                stop: None,
                thread: None,
            };
        }
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let label = label.to_owned();
        let thread = std::thread::spawn(move || {
            let start = std::time::Instant::now();
            let spin = ['|', '/', '-', '\\'];
            let mut i = 0;
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_millis(200))
            {
                let t = start.elapsed().as_secs_f64();
                let of = planned_s.map_or(String::new(), |p| format!(" of ~{p:.0} s"));
                eprint!("\r{label} {} {t:.1} s{of}   ", spin[i % spin.len()]);
                let _ = std::io::stderr().flush();
                i += 1;
            }
            eprint!("\r{:79}\r", "");
        });
        Ticker {
            stop: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A latency in the unit that reads best.
fn ns(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2} s", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2} ms", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.2} us", v / 1e3)
    } else {
        format!("{v:.0} ns")
    }
}

fn print_percentiles(what: &str, p: &Percentiles) {
    println!(
        "  {what:<10} p50 {}  p90 {}  p99 {}  p99.9 {}  p99.99 {}  max {}  (n={})",
        ns(p.p50 as f64),
        ns(p.p90 as f64),
        ns(p.p99 as f64),
        ns(p.p999 as f64),
        ns(p.p9999 as f64),
        ns(p.max as f64),
        p.count
    );
}

fn print_per_second(p: &PerSecond, rate_word: &str) {
    println!(
        "  per second (mean ± stddev over n={}): {rate_word} {:.3} ± {:.3} M   L2 {:.1} ± {:.1} Mbit/s   L1 {:.1} ± {:.1} Mbit/s",
        p.pps.n,
        p.pps.mean / 1e6,
        p.pps.stddev / 1e6,
        p.mbps_l2.mean,
        p.mbps_l2.stddev,
        p.mbps_l1.mean,
        p.mbps_l1.stddev
    );
}

/// The lines `gen --loss` adds: goodput in both phases, and what the
/// sender paid for repairs.
fn print_loss_comparison(
    percent: f64,
    without: &GenRun,
    with: &GenResults,
    senders: &LtlSenderPhases,
) {
    let ratio = with
        .goodput_vs_lossless
        .map_or("n/a (nothing received without loss)".to_owned(), |r| {
            format!("{r:.3}")
        });
    println!(
        "  goodput (payload): lossless {:.3} Gbit/s ({:.3} Mpps), loss {percent}% {:.3} Gbit/s ({:.3} Mpps): {ratio} of lossless",
        without.goodput_gbps(),
        without.pps() / 1e6,
        with.goodput_gbps.unwrap_or(0.0),
        with.pps / 1e6,
    );
    for (phase, c) in [("lossless", &senders.lossless), ("lossy", &senders.lossy)] {
        println!(
            "  ltl sender, {phase:<8}: {} frames sent, {} again (fast {}, probe {}, timeout {}), {} received, {} timeouts, blocked {:.3} s",
            c.tx_frames,
            c.retransmits,
            c.fast_retransmits,
            c.probe_retransmits,
            c.timeout_retransmits,
            c.rx_frames,
            c.timeouts,
            c.blocked_micros as f64 / 1e6
        );
    }
}

fn emit<P: Serialize, R: Serialize>(json: bool, report: &Report<P, R>) -> Result<(), BenchError> {
    if json {
        println!("{}", report.to_json_line()?);
    }
    Ok(())
}

fn gen(cli: &Cli, a: &GenArgs) -> Result<(), BenchError> {
    let loss = a
        .loss
        .map(|percent| loss_probability(&a.at.stack, percent))
        .transpose()?;
    let stack = open_stack(&a.at.stack)?;
    let mixes: Vec<SizeMix> = if a.imix {
        vec![SizeMix::imix()]
    } else if let Some(s) = &a.sizes {
        s.0.iter().map(|&n| SizeMix::fixed(n)).collect()
    } else {
        vec![SizeMix::fixed(a.size.unwrap_or(64))]
    };
    let mut base = GenConfig {
        sizes: mixes[0].clone(),
        rate: a.rate,
        pattern: a.pattern,
        flows: a.flows,
        stop: a.time.stop(),
        warmup: a.time.warmup()?,
        batch: a.batch,
        seed: a.seed,
        busy_poll: a.busy_poll,
        threads: a.threads.into(),
        ..GenConfig::default()
    };
    // One mode for every run of the invocation: shared only where each
    // size's rate (a bit rate differs in messages by size) takes it.
    let mut all_shared = true;
    for mix in &mixes {
        let cfg = GenConfig {
            sizes: mix.clone(),
            ..base.clone()
        };
        uniplane_bench::gen::check(&*stack, &cfg)?;
        all_shared &= cfg.resolved_threads()? == Threads::Shared;
    }
    let asked = base.threads;
    base.threads = if all_shared {
        Threads::Shared
    } else {
        Threads::Split
    };
    let label_of = |mix: &SizeMix| {
        if mix.label() == "imix" {
            "imix".to_owned()
        } else {
            format!("{} B", mix.label())
        }
    };
    let mut at_used = None;
    let mut runs: Vec<(String, GenRun)> = Vec::new();
    let mut lossless: Option<(GenRun, LtlSenderPhases)> = None;
    if let (Some(p), Some(mix)) = (loss, mixes.first()) {
        // Four phases, each on a fresh stack and half the run long:
        // without loss, with, with, without (A B B A), so that whatever
        // drifts over the invocation (the machine's load, the first run's
        // warm-up) weighs on both sides alike. Each side is the sum of its
        // two halves.
        let lossy_tag = format!("loss {}%", a.loss.unwrap_or_default());
        let halves = base.stop.halves();
        let mut without = GenRun::default();
        let mut with = GenRun::default();
        let mut senders = LtlSenderPhases::default();
        for (i, lossy) in [false, true, true, false].into_iter().enumerate() {
            let cfg = GenConfig {
                sizes: mix.clone(),
                stop: halves[i / 2],
                ..base.clone()
            };
            let stack = open_lossy_ltl(if lossy { p } else { 0.0 }, a.seed)?;
            let at = a.at.endpoints()?;
            let tag = if lossy {
                lossy_tag.as_str()
            } else {
                "lossless"
            };
            let mut live = Live::new(format!("{} {tag}", label_of(mix)), cli.quiet || cli.json);
            let run = run_gen(stack.clone(), &at, &cfg, &mut live)?;
            let sender = LtlSenderCounters::from(stack.client_stats().unwrap_or_default());
            if lossy {
                with.absorb(&run);
                senders.lossy += sender;
            } else {
                without.absorb(&run);
                senders.lossless += sender;
            }
            at_used = Some(at);
        }
        runs.push((mix.label().to_owned(), with));
        lossless = Some((without, senders));
    }
    for mix in mixes.iter().filter(|_| loss.is_none()) {
        let at = a.at.endpoints()?;
        let cfg = GenConfig {
            sizes: mix.clone(),
            ..base.clone()
        };
        let label = label_of(mix);
        let mut live = Live::new(label.clone(), cli.quiet || cli.json);
        let run = run_gen(stack.clone(), &at, &cfg, &mut live)?;
        drop(live);
        if mixes.len() > 1 && !cli.quiet {
            println!(
                "{label:>8}  total: rx {:.3} Mpps  L2 {:.1} Mbit/s  L1 {:.1} Mbit/s  p50 {}  p99 {}  lost {}",
                run.pps() / 1e6,
                run.mbps_l2(),
                run.mbps_l1(),
                ns(run.latency.quantile(0.5) as f64),
                ns(run.latency.quantile(0.99) as f64),
                run.lost
            );
        }
        at_used.get_or_insert(at);
        runs.push((mix.label().to_owned(), run));
    }
    let results = match (&lossless, runs.first()) {
        (Some((without, senders)), Some(with)) => {
            GenResults::of_loss_comparison(without, with, Some(*senders))
        }
        _ => GenResults::from_runs(&runs),
    };
    let at = at_used.unwrap_or(Endpoints {
        listen: Locator::Name("-".into()),
        connect: Locator::Name("-".into()),
    });
    let size_mode = if a.imix {
        "imix"
    } else if a.sizes.is_some() {
        "sweep"
    } else {
        "fixed"
    };
    let (seconds, count) = base.stop.plan();
    let params = GenParams {
        stack: a.at.stack.clone(),
        listen: at.listen.to_string(),
        connect: at.connect.to_string(),
        size_mode: size_mode.to_owned(),
        sizes: if a.imix {
            SizeMix::imix().cycle().to_vec()
        } else {
            mixes.iter().map(SizeMix::max).collect()
        },
        size_counts: SIZE_COUNTS,
        rate: a.rate.to_string(),
        pattern: a.pattern.to_string(),
        flows: a.flows,
        seconds,
        count,
        warmup_s: a.time.warmup,
        batch: a.batch,
        seed: a.seed,
        busy_poll: a.busy_poll,
        threads: base.threads.describe(),
        threading: base.threads.name(),
        threading_asked: asked.name(),
        l1_overhead_bytes: L1_OVERHEAD,
        loss: a.loss,
    };

    println!(
        "gen over {}: payload {} (+{HEADER_LEN} B overlay header at L2, +{L1_OVERHEAD} B Ethernet framing at L1), rate {}, {} pattern, {} flow(s)",
        a.at.stack,
        if a.imix { "imix 7:4:1 of 64/594/1518 B".to_owned() } else { format!("{:?} B", params.sizes) },
        a.rate,
        a.pattern,
        a.flows
    );
    if let Some(p) = a.loss {
        println!(
            "  loss {p}% of the datagrams each LTL endpoint receives; the figures below are of the lossy phases, run between two lossless ones (A B B A, each half the run, each on a fresh stack)"
        );
    }
    println!(
        "  {:.3} s measured: sent {}, received {}, lost {}, reordered {}, bad stamps {}, errors {}",
        results.seconds,
        results.sent,
        results.received,
        results.lost,
        results.reordered,
        results.bad_stamps,
        results.errors
    );
    println!(
        "  overall: tx {:.3} Mpps  rx {:.3} Mpps  L2 {:.1} Mbit/s  L1 {:.1} Mbit/s",
        results.tx_pps / 1e6,
        results.pps / 1e6,
        results.mbps_l2,
        results.mbps_l1
    );
    print_per_second(&results.per_second, "Mpps");
    print_percentiles("one-way", &results.latency_ns);
    if let (Some((without, senders)), Some(p)) = (&lossless, a.loss) {
        print_loss_comparison(p, without, &results, senders);
    }
    println!(
        "  (threads {}: {})",
        base.threads.name(),
        base.threads.describe()
    );

    if let Some(path) = &a.plot {
        let kind = match a.plot_kind {
            PlotKind::Auto if runs.len() > 1 => PlotKind::Sweep,
            PlotKind::Auto if results.per_second.samples.len() >= 2 => PlotKind::Throughput,
            PlotKind::Auto => PlotKind::Cdf,
            k => k,
        };
        let mut merged = uniplane_bench::hist::LatencyHistogram::new();
        runs.iter().for_each(|(_, r)| merged.merge(&r.latency));
        let cdf = merged.cdf();
        let throughput: Vec<(f64, f64)> = results
            .per_second
            .samples
            .iter()
            .map(|s| (s.t_s, s.rx_pps / 1e6))
            .collect();
        let sweep: Vec<(f64, f64, f64)> = runs
            .iter()
            .map(|(_, r)| {
                (
                    r.rx_bytes as f64 / r.received.max(1) as f64 - HEADER_LEN as f64,
                    r.pps() / 1e6,
                    r.mbps_l2(),
                )
            })
            .collect();
        let chart = match kind {
            PlotKind::Throughput => Chart::Throughput(&throughput),
            PlotKind::Sweep => Chart::SizeSweep(&sweep),
            _ => Chart::LatencyCdf {
                what: "one-way latency",
                points: &cdf,
            },
        };
        plot::draw(path, &chart)?;
        println!("  plot: {}", path.display());
    }
    emit(cli.json, &Report::new("gen", params, results))
}

fn rtt(cli: &Cli, a: &RttArgs) -> Result<(), BenchError> {
    if let Some(path) = &a.path {
        return shm_path_rtt(cli, a, path);
    }
    let stack = open_rtt_stack(&a.at.stack, a.busy_poll)?;
    let at = a.at.endpoints()?;
    let cfg = RttConfig {
        size: a.size,
        inflight: a.inflight,
        stop: a.time.stop(),
        warmup: a.time.warmup()?,
        busy_poll: a.busy_poll,
        timeout: Duration::from_millis(a.timeout_ms.max(1)),
        ..RttConfig::default()
    };
    let mut live = Live::new("rtt".into(), cli.quiet || cli.json);
    let run = run_rtt(stack, &at, &cfg, &mut live)?;
    drop(live);
    let (seconds, count) = cfg.stop.plan();
    let params = RttParams {
        stack: a.at.stack.clone(),
        listen: at.listen.to_string(),
        connect: at.connect.to_string(),
        size: a.size,
        inflight: a.inflight,
        seconds,
        count,
        warmup_s: a.time.warmup,
        busy_poll: a.busy_poll,
        threads: THREADING,
    };
    let results = RttResults {
        rtt_ns: run.rtt.percentiles(),
        round_trips_per_s: run.round_trips_per_s(),
        sent: run.sent,
        received: run.received,
        lost: run.lost,
        errors: run.errors,
        seconds: run.seconds,
        per_second: PerSecond::of(&run.samples),
    };
    println!(
        "rtt over {}: {} B payload, {} in flight, {}",
        a.at.stack,
        a.size,
        a.inflight,
        if a.busy_poll {
            "busy-polling"
        } else {
            "parking when idle"
        }
    );
    println!(
        "  {:.3} s measured: {} round trips ({:.0}/s), lost {}, errors {}",
        results.seconds, results.received, results.round_trips_per_s, results.lost, results.errors
    );
    print_per_second(&results.per_second, "round trips/s");
    print_percentiles("round trip", &results.rtt_ns);
    println!("  ({THREADING})");
    if let Some(path) = &a.plot {
        let cdf = run.rtt.cdf();
        let throughput: Vec<(f64, f64)> = run
            .samples
            .iter()
            .map(|s| (s.t_s, s.rx_pps / 1e6))
            .collect();
        let chart = match a.plot_kind {
            PlotKind::Throughput => Chart::Throughput(&throughput),
            _ => Chart::LatencyCdf {
                what: "round-trip time",
                points: &cdf,
            },
        };
        plot::draw(path, &chart)?;
        println!("  plot: {}", path.display());
    }
    emit(cli.json, &Report::new("rtt", params, results))
}

/// `rtt --stack shm --path pio|dma`: round trips over a device path,
/// then the Unix-socket peer for as long.
fn shm_path_rtt(cli: &Cli, a: &RttArgs, path: &str) -> Result<(), BenchError> {
    use uniplane_bench::shm_rtt::{run_cache_line_rtt, run_shm_rtt, run_unix_rtt, ShmPath, PEER};
    if a.at.stack != "shm" {
        return Err(BenchError::Config(format!(
            "--path {path} is a path of the shm stack: use it with --stack shm, not `{}`",
            a.at.stack
        )));
    }
    let which = ShmPath::by_name(path)?;
    let cfg = RttConfig {
        size: a.size,
        inflight: a.inflight,
        stop: a.time.stop(),
        warmup: a.time.warmup()?,
        busy_poll: a.busy_poll,
        ..RttConfig::default()
    };
    let quiet = cli.quiet || cli.json;
    let mut live = Live::new(format!("shm {path}"), quiet);
    let ours = run_shm_rtt(which, &cfg, &mut live)?;
    drop(live);
    let mut live = Live::new("unix".into(), quiet);
    let peer = run_unix_rtt(&cfg, &mut live)?;
    drop(live);
    // The floor of any shared-memory round trip on this machine, for as long.
    let mut live = Live::new("cache line".into(), quiet);
    let line = run_cache_line_rtt(&cfg, &mut live)?;
    drop(live);
    let result_of = |run: &uniplane_bench::rtt::RttRun| RttResults {
        rtt_ns: run.rtt.percentiles(),
        round_trips_per_s: run.round_trips_per_s(),
        sent: run.sent,
        received: run.received,
        lost: run.lost,
        errors: run.errors,
        seconds: run.seconds,
        per_second: PerSecond::of(&run.samples),
    };
    let (o, p) = (result_of(&ours), result_of(&peer));
    let ratio = if p.rtt_ns.p50 > 0 {
        o.rtt_ns.p50 as f64 / p.rtt_ns.p50 as f64
    } else {
        0.0
    };
    let wait = match (which, a.busy_poll) {
        (ShmPath::Dma, _) => "the engine spins, the pinger spins on the notify word",
        (ShmPath::Pio, true) => "both sides busy-poll",
        (ShmPath::Pio, false) => "both sides spin 20 µs, then park",
    };
    println!(
        "rtt over shm, path {path}: {} B payload each way, {wait}",
        a.size
    );
    println!(
        "  {:.3} s measured: {} round trips ({:.0}/s)",
        o.seconds, o.received, o.round_trips_per_s
    );
    print_percentiles(&format!("shm {path}"), &o.rtt_ns);
    print_percentiles("unix sock", &p.rtt_ns);
    let floor = line.rtt.percentiles();
    print_percentiles("cache line", &floor);
    println!("  p50 ratio shm {path} / Unix socket: {ratio:.3}  (peer: {PEER}); the floor, one cache line each way between the same two CPUs: p50 {} ns", floor.p50);
    if let Some(file) = &a.plot {
        let ours_label = format!("shm {path}");
        let lines = [
            (ours_label.as_str(), ours.rtt.cdf()),
            ("Unix socket (peer)", peer.rtt.cdf()),
        ];
        plot::draw(
            file,
            &Chart::Cdfs {
                what: "round-trip time",
                lines: &lines,
            },
        )?;
        println!("  plot: {}", file.display());
    }
    let (seconds, count) = cfg.stop.plan();
    let params = json!({
        "stack": "shm", "path": path, "size": a.size, "inflight": 1, "seconds": seconds,
        "count": count, "warmup_s": a.time.warmup, "busy_poll": a.busy_poll, "wait": wait,
    });
    let mut results = serde_json::to_value(&o)?;
    if let Value::Object(m) = &mut results {
        m.insert("path".into(), json!(path));
        m.insert(
            "peer".into(),
            json!({ "name": PEER, "rtt_ns": p.rtt_ns, "round_trips_per_s": p.round_trips_per_s,
                    "seconds": p.seconds, "per_second": p.per_second }),
        );
        m.insert("p50_ratio".into(), json!(ratio));
        m.insert(
            "cache_line_floor".into(),
            json!({ "what": "one 64-bit word each way, a cache line of its own each, the same two CPUs: the machine's cost of moving a line between the cores, twice",
                    "rtt_ns": floor, "seconds": line.seconds }),
        );
    }
    emit(cli.json, &Report::new("rtt", params, results))
}

/// What the comparison's reader must know about the two transports.
fn transport_note(stack: &str, tool: &dyn Peer) -> (bool, String) {
    let (like, note) = transport_note_epoll(stack, tool);
    if stack.ends_with("-uring") {
        let note = note.replace(
            "(sendmmsg/GSO, recvmmsg/GRO)",
            "(through an io_uring ring per socket, without GSO)",
        );
        return (like, format!("{note}; ours on the io_uring backend"));
    }
    (like, note)
}

fn transport_note_epoll(stack: &str, tool: &dyn Peer) -> (bool, String) {
    match stack {
        "udp-unpacked" | "udp-unpacked-uring" => (
            true,
            format!(
                "both sides move each payload as one UDP datagram over 127.0.0.1 ({}); ours adds the \
                 {HEADER_LEN}-byte overlay header to each datagram and batches system calls \
                 (sendmmsg/GSO, recvmmsg/GRO)",
                tool.transport()
            ),
        ),
        "tcp" if tool.metric() == peer::Metric::Gbps => (
            true,
            format!(
                "both sides stream {{}}-byte writes over kernel TCP on 127.0.0.1 ({}); ours frames each \
                 payload as an overlay message ({HEADER_LEN}-byte header) and coalesces writes",
                tool.transport()
            )
            .replace("{}", "the same"),
        ),
        // One request in flight: a packing link has one message to put in
        // each datagram, as the unpacked one does.
        "udp" | "udp-uring" if tool.metric() == peer::Metric::RttP50Ns => (
            true,
            format!(
                "both sides move each payload as one UDP datagram over 127.0.0.1 ({}): with one \
                 request in flight `udp` has nothing to pack; ours adds the {HEADER_LEN}-byte \
                 overlay header",
                tool.transport()
            ),
        ),
        "udp" | "udp-uring" => (
            false,
            "ours packs many messages into each UDP datagram while the peer sends one payload per \
             datagram: same transport, different framing; use --stack udp-unpacked for one message per datagram"
                .to_owned(),
        ),
        other => (
            false,
            format!(
                "different transports: ours runs over the `{other}` stack, the peer over {}; \
                 the comparison is like-for-like with --stack udp-unpacked",
                tool.transport()
            ),
        ),
    }
}

fn peer(cli: &Cli, a: &PeerArgs) -> Result<(), BenchError> {
    if a.busy_poll && !matches!(a.tool, Tool::Sockperf) {
        return Err(BenchError::Config(
            "--busy-poll compares round trips: use it with --tool sockperf".into(),
        ));
    }
    let w = Workload {
        size: a.size,
        seconds: a.seconds.max(1),
        busy_poll: a.busy_poll,
    };
    // Frame-layer peers run on what they set up themselves (a veth, an EAL).
    let tool: Box<dyn Peer> = match a.tool {
        // User-space TCP/IP sits on an interface: both sides on a veth.
        Tool::Iperf3Tcp if a.stack == "smoltcp" => return peer_smoltcp(cli, a, &w),
        Tool::Iperf3 => Box::new(Iperf3Udp::default()),
        Tool::Iperf3Tcp => Box::new(peer::Iperf3Tcp::default()),
        Tool::Sockperf => Box::new(peer::Sockperf::default()),
        Tool::Testpmd | Tool::TestpmdRx | Tool::Trafgen => return frame_peer(a)?(cli, a, &w),
    };
    let stack_name = a.stack.clone();
    open_stack(&stack_name)?;
    let (like_for_like, note) = transport_note(&stack_name, &*tool);
    let metric = tool.metric();
    let mut ours = |w: &Workload| -> Result<(f64, Value), BenchError> {
        let at = default_endpoints(&stack_name)?;
        match metric {
            peer::Metric::Pps | peer::Metric::Gbps => {
                let stack = open_stack(&stack_name)?;
                let cfg = GenConfig {
                    sizes: SizeMix::fixed(w.size),
                    stop: Stop::Seconds(w.seconds as f64),
                    warmup: Duration::ZERO,
                    ..GenConfig::default()
                };
                let r = run_gen(stack, &at, &cfg, &mut Live::new("ours".into(), true))?;
                Ok(if metric == peer::Metric::Pps {
                    (
                        r.pps(),
                        json!({"tx_pps": r.tx_pps(), "sent": r.sent, "received": r.received, "lost": r.lost,
                               "latency_ns": r.latency.percentiles()}),
                    )
                } else {
                    let gbps = r.goodput_gbps();
                    (
                        gbps,
                        json!({"gbps": gbps, "pps": r.pps(), "sent": r.sent, "received": r.received}),
                    )
                })
            }
            peer::Metric::RttP50Ns => {
                let stack = open_rtt_stack(&stack_name, w.busy_poll)?;
                let cfg = RttConfig {
                    size: w.size,
                    stop: Stop::Seconds(w.seconds as f64),
                    warmup: Duration::ZERO,
                    busy_poll: w.busy_poll,
                    ..RttConfig::default()
                };
                let r = run_rtt(stack, &at, &cfg, &mut Live::new("ours".into(), true))?;
                let p = r.rtt.percentiles();
                Ok((p.p50 as f64, json!({"rtt_ns": p, "lost": r.lost})))
            }
        }
    };
    compare_and_report(cli, a, &*tool, &w, (like_for_like, note), &mut ours)
}

/// The runner of a frame-layer comparison (`--tool testpmd` or
/// `--tool trafgen`), after checking the stack it needs.
type FramePeer = fn(&Cli, &PeerArgs, &Workload) -> Result<(), BenchError>;

fn frame_peer(a: &PeerArgs) -> Result<FramePeer, BenchError> {
    let (name, stack, run): (&str, &str, FramePeer) = match a.tool {
        Tool::Trafgen => ("trafgen", "ether", peer_trafgen),
        Tool::TestpmdRx => ("testpmd-rx", "dpdk", peer_testpmd_rx),
        _ => ("testpmd", "dpdk", peer_testpmd),
    };
    if a.stack != stack {
        return Err(BenchError::Config(format!(
            "--tool {name} compares frames sent or received: use it with --stack {stack}"
        )));
    }
    Ok(run)
}

fn peer_trafgen(cli: &Cli, a: &PeerArgs, w: &Workload) -> Result<(), BenchError> {
    use uniplane_bench::ether_tx::{frame_len, Trafgen, Veth};
    if peer::find_tool("trafgen").is_none() {
        return Err(peer::PeerError::Missing {
            tool: "trafgen",
            package: "netsniff-ng",
        }
        .into());
    }
    let veth = Veth::new()?;
    let tool = Trafgen::new(&veth);
    let len = frame_len(w.size);
    let note = format!(
        "both sides send {len}-byte broadcast frames ({} on the wire with the FCS) on one end of a \
         veth between two namespaces, from CPU 0: ours through the frame layer's AF_PACKET \
         transmit ring, timed by wall clock; trafgen through its own, its figure its count over \
         its worker's time",
        len + 4
    );
    let mut ours = |w: &Workload| -> Result<(f64, Value), BenchError> {
        let (pps, frames) = veth.raw_tx(len, w.seconds as f64)?;
        Ok((pps, json!({ "tx_pps": pps, "frames": frames })))
    };
    compare_and_report(cli, a, &tool, w, (true, note), &mut ours)
}

fn peer_smoltcp(cli: &Cli, a: &PeerArgs, w: &Workload) -> Result<(), BenchError> {
    use uniplane_bench::smoltcp_tcp::VethTcp;
    if peer::find_tool("iperf3").is_none() {
        return Err(peer::PeerError::Missing {
            tool: "iperf3",
            package: "iperf3",
        }
        .into());
    }
    let veth = VethTcp::new(a.mtu)?;
    let tool = veth.iperf3();
    let note = format!(
        "TCP over a veth between two namespaces, MTU {}: ours smoltcp on the AF_PACKET rings of \
         one end sending {}-byte messages to a kernel socket on the other end, which counts what \
         arrives from the first byte to the last; the peer iperf3 on both ends ({}-byte writes), \
         what its receiver got",
        veth.mtu(),
        w.size,
        w.size
    );
    let mut ours = |w: &Workload| veth.smoltcp(w.size, w.seconds as f64);
    compare_and_report(cli, a, &tool, w, (false, note), &mut ours)
}

#[cfg(not(feature = "dpdk"))]
fn peer_testpmd(_: &Cli, _: &PeerArgs, _: &Workload) -> Result<(), BenchError> {
    Err(BenchError::Config(
        "`peer --tool testpmd --stack dpdk` needs DPDK: this uniplane-bench was built without \
         the `dpdk` feature (cargo build --release -p uniplane-bench --features dpdk; needs \
         libdpdk-dev and libclang-dev)"
            .into(),
    ))
}

#[cfg(not(feature = "dpdk"))]
fn peer_testpmd_rx(cli: &Cli, a: &PeerArgs, w: &Workload) -> Result<(), BenchError> {
    peer_testpmd(cli, a, w)
}

#[cfg(feature = "dpdk")]
fn peer_testpmd_rx(cli: &Cli, a: &PeerArgs, w: &Workload) -> Result<(), BenchError> {
    let tool = peer::Testpmd {
        rx: true,
        ..peer::Testpmd::default()
    };
    let note = format!(
        "both sides receive the 64-byte frames a DPDK net_null port makes (no hardware, no \
         hugepages) on one core, looking at each one's length only: ours through the frame \
         layer on DPDK (uniplane-dpdk), the peer {}",
        tool.transport()
    );
    testpmd_beside(cli, a, w, &tool, note, |p, w| {
        let (pps, frames) = p.receive(w.seconds as f64)?;
        Ok((pps, json!({ "rx_pps": pps, "frames": frames })))
    })
}

#[cfg(feature = "dpdk")]
fn peer_testpmd(cli: &Cli, a: &PeerArgs, w: &Workload) -> Result<(), BenchError> {
    let tool = peer::Testpmd::default();
    let note = format!(
        "both sides transmit {}-byte frames on DPDK net_null ports (no hardware, no hugepages) \
         from one core: ours through the frame layer on DPDK (uniplane-dpdk), the peer {}",
        w.size.clamp(64, 1514),
        tool.transport()
    );
    testpmd_beside(cli, a, w, &tool, note, |p, w| {
        let (pps, frames) = p.transmit(w.size, w.seconds as f64)?;
        Ok((pps, json!({ "tx_pps": pps, "frames": frames })))
    })
}

/// `measure` on one `net_null` port of this process (opened at the first
/// measurement: the EAL starts once), alternating with testpmd.
#[cfg(feature = "dpdk")]
fn testpmd_beside(
    cli: &Cli,
    a: &PeerArgs,
    w: &Workload,
    tool: &peer::Testpmd,
    note: String,
    measure: impl Fn(
        &mut uniplane_bench::dpdk_tx::NullPort,
        &Workload,
    ) -> Result<(f64, Value), BenchError>,
) -> Result<(), BenchError> {
    use uniplane_bench::dpdk_tx::NullPort;
    let mut port: Option<NullPort> = None;
    let mut ours = |w: &Workload| -> Result<(f64, Value), BenchError> {
        let p = match &mut port {
            Some(p) => p,
            None => port.insert(NullPort::open()?),
        };
        measure(p, w)
    };
    compare_and_report(cli, a, tool, w, (true, note), &mut ours)
}

/// Runs our side and `tool` alternately and prints and reports the
/// comparison (the second half of every `peer` run).
fn compare_and_report(
    cli: &Cli,
    a: &PeerArgs,
    tool: &dyn Peer,
    w: &Workload,
    (like_for_like, note): (bool, String),
    ours: &mut peer::OurSide<'_>,
) -> Result<(), BenchError> {
    let stack_name = a.stack.clone();
    let metric = tool.metric();
    let quiet = cli.quiet || cli.json;
    println!(
        "peer: {} vs uniplane over `{stack_name}`, {} B payloads, {} s per measurement, {} rounds each (A B A B)",
        tool.tool(),
        w.size,
        w.seconds,
        a.rounds.max(1)
    );
    println!("  note: {note}");
    // Frame-layer peers count frames transmitted; the others what arrived.
    let verb = if matches!(a.tool, Tool::Testpmd | Tool::Trafgen) {
        "sent"
    } else {
        "received"
    };
    let unit = |v: f64| match metric {
        peer::Metric::Pps => format!("{:.3} Mpps", v / 1e6),
        peer::Metric::RttP50Ns => ns(v),
        peer::Metric::Gbps => format!("{v:.2} Gbit/s"),
    };
    let c = peer::compare(tool, w, a.rounds, ours, |r: &Round| {
        if !quiet {
            let sent = r
                .detail
                .get("tx_pps")
                .and_then(Value::as_f64)
                .filter(|_| verb == "received")
                .map(|tx| format!("  (sent {})", unit(tx)))
                .unwrap_or_default();
            let side = if r.side == "ours" {
                "ours"
            } else {
                tool.tool()
            };
            println!(
                "  round {} {side:<6} {} {verb}{sent}",
                r.order + 1,
                unit(r.value)
            );
        }
    })?;
    println!(
        "  {}: ours {}  {} {}  ratio ours/peer {:.2}",
        c.metric,
        unit(c.ours),
        tool.tool(),
        unit(c.peer),
        c.ratio
    );
    if let Some(path) = &a.plot {
        let (scale, y_label) = match metric {
            peer::Metric::Pps => (1e-6, "Mpps"),
            peer::Metric::RttP50Ns => (1e-3, "round trip p50, µs"),
            peer::Metric::Gbps => (1.0, "Gbit/s of payload"),
        };
        let side = |which: &str| -> Vec<(f64, f64)> {
            c.rounds
                .iter()
                .filter(|r| r.side == which)
                .enumerate()
                .map(|(i, r)| ((i + 1) as f64, r.value * scale))
                .collect()
        };
        let peer_label = format!("{} (peer)", tool.tool());
        let ours_label = format!("uniplane over {stack_name}");
        let lines = [
            (ours_label.as_str(), side("ours")),
            (peer_label.as_str(), side("peer")),
        ];
        let title = format!("{} per round: ours ÷ peer = {:.2}", c.metric, c.ratio);
        plot::draw(
            path,
            &Chart::Points {
                title: &title,
                x_label: "round (ours, then the peer, alternating)",
                y_label,
                lines: &lines,
            },
        )?;
        println!("  plot: {}", path.display());
    }
    let params = json!({
        "tool": tool.tool(),
        "stack": stack_name,
        "size": w.size,
        "seconds": w.seconds,
        "rounds": a.rounds.max(1),
        "busy_poll": a.busy_poll,
        "order": "ours, peer, ours, peer, …",
        "peer_commands": tool.commands(w),
    });
    let results = json!({
        "metric": c.metric,
        "ours": c.ours,
        "peer": c.peer,
        "ratio": c.ratio,
        "higher_is_better": c.higher_is_better,
        "ours_stack": stack_name,
        "peer_tool": tool.tool(),
        "peer_transport": tool.transport(),
        "like_for_like": like_for_like,
        "note": note,
        "rounds": c.rounds,
    });
    emit(cli.json, &Report::new("peer", params, results))
}

fn scale(cli: &Cli, a: &ScaleArgs) -> Result<(), BenchError> {
    use uniplane_bench::scale::{run_scale, ScaleConfig};
    let cfg = ScaleConfig {
        ports: a.ports.clone(),
        connections: a.connections.clone(),
        sizes: a.sizes.clone(),
        seconds: a.seconds,
    };
    let ticker = Ticker::start(cli, "scale", None);
    let results = run_scale(&cfg)?;
    drop(ticker);
    for (sweep, key) in [
        ("ports", "ports"),
        ("connections", "connections"),
        ("sizes", "size"),
    ] {
        for p in results[sweep].as_array().into_iter().flatten() {
            println!(
                "{key} {:>7}: {:7.2} M msgs/s, {:7.1} ns/msg{}",
                p[key],
                p["msgs_per_sec"].as_f64().unwrap_or(0.0) / 1e6,
                p["ns_per_msg"].as_f64().unwrap_or(0.0),
                p["heap_bytes_per_connection"]
                    .as_f64()
                    .map_or(String::new(), |b| format!(", {b:.0} B heap per connection")),
            );
        }
    }
    if let Some(prefix) = &a.plot {
        for (sweep, key, label) in [
            ("ports", "ports", "ports"),
            ("connections", "connections", "installed connections"),
            ("sizes", "size", "payload bytes"),
        ] {
            let pts = results[sweep].as_array().cloned().unwrap_or_default();
            let line = |f: &dyn Fn(&Value) -> f64| -> Vec<(f64, f64)> {
                pts.iter()
                    .map(|p| (p[key].as_f64().unwrap_or(1.0), f(p)))
                    .filter(|&(x, y)| x > 0.0 && y > 0.0)
                    .collect()
            };
            let lines = [
                (
                    "M msgs/s",
                    line(&|p| p["msgs_per_sec"].as_f64().unwrap_or(0.0) / 1e6),
                ),
                (
                    "ns per message",
                    line(&|p| p["ns_per_msg"].as_f64().unwrap_or(0.0)),
                ),
            ];
            let mut path = prefix.clone().into_os_string();
            path.push(format!("-{sweep}.svg"));
            let path = PathBuf::from(path);
            plot::draw(
                &path,
                &Chart::LogLog {
                    title: "engine cost",
                    x_label: label,
                    y_label: "M msgs/s · ns/msg",
                    lines: &lines,
                },
            )?;
            println!("  plot: {}", path.display());
        }
    }
    let params = json!({ "ports": a.ports, "connections": a.connections, "sizes": a.sizes, "seconds": a.seconds });
    emit(cli.json, &Report::new("scale", params, results))
}

fn fabric_sharded(
    cli: &Cli,
    a: &FabricArgs,
    matrix: uniplane_bench::fabric::Matrix,
    shards: usize,
) -> Result<(), BenchError> {
    use uniplane_bench::fabric_shards::{run_sharded, ShardedFabric};
    let cfg = ShardedFabric {
        senders: a.ports,
        matrix,
        size: a.size,
        seconds: a.seconds,
        shards,
        cpus: a.cpus.clone(),
        source: a.source.parse()?,
        burst: a.burst,
        voq_depth: a.voq_depth,
    };
    let ticker = Ticker::start(cli, "fabric", None);
    let results = run_sharded(&cfg)?;
    drop(ticker);
    println!(
        "fabric {} {}×{} B on {} shards ({} source, {} cores): {:.2} M msgs/s end to end ({:.2} GB/s)",
        a.pattern,
        a.ports,
        a.size,
        results["shards"],
        a.source,
        results["cores"],
        results["msgs_per_sec"].as_f64().unwrap_or(0.0) / 1e6,
        results["gbytes_per_sec"].as_f64().unwrap_or(0.0),
    );
    let params = json!({ "ports": a.ports, "pattern": a.pattern, "size": a.size,
        "seconds": a.seconds, "shards": shards, "source": a.source, "cpus": a.cpus });
    emit(cli.json, &Report::new("fabric", params, results))
}

fn fabric(cli: &Cli, a: &FabricArgs) -> Result<(), BenchError> {
    use uniplane_bench::fabric::{run_fabric, Matrix};
    let matrix = match a.pattern.as_str() {
        "all-to-one" => Matrix::AllToOne,
        "uniform" => Matrix::Uniform,
        other => {
            return Err(BenchError::Config(format!(
                "--pattern `{other}`: all-to-one or uniform"
            )))
        }
    };
    if let Some(shards) = a.shards {
        return fabric_sharded(cli, a, matrix, shards);
    }
    let ticker = Ticker::start(cli, "fabric", None);
    let results = run_fabric(a.ports, matrix, a.size, a.seconds)?;
    drop(ticker);
    println!(
        "fabric {} {}×{} B: {:.2} M msgs/s on the engine core ({:.2} GB/s), end to end {:.2} M msgs/s; bare SPSC ring {:.2} M msgs/s; memcpy {:.1} GB/s; latency p50 {} ns p99 {} ns",
        a.pattern,
        a.ports,
        a.size,
        results["msgs_per_sec"].as_f64().unwrap_or(0.0) / 1e6,
        results["gbytes_per_sec"].as_f64().unwrap_or(0.0),
        results["e2e_msgs_per_sec"].as_f64().unwrap_or(0.0) / 1e6,
        results["reference_msgs_per_sec"].as_f64().unwrap_or(0.0) / 1e6,
        results["memcpy_gbytes_per_sec"].as_f64().unwrap_or(0.0),
        results["latency_ns"]["p50"],
        results["latency_ns"]["p99"],
    );
    let params =
        json!({ "ports": a.ports, "pattern": a.pattern, "size": a.size, "seconds": a.seconds });
    emit(cli.json, &Report::new("fabric", params, results))
}

fn overhead(cli: &Cli, a: &OverheadArgs) -> Result<(), BenchError> {
    let ticker = Ticker::start(cli, "overhead", None);
    let results = uniplane_bench::fabric::run_overhead(a.size, a.count)?;
    drop(ticker);
    let f = |path: &str, q: &str| results[path][q].as_f64().unwrap_or(0.0);
    println!(
        "overhead {} B: the overlay adds p50 {:.0} ns, p99 {:.0} ns per traversal inline; through the engine's thread p50 {:.0} ns, p99 {:.0} ns (round trips p50: without {} ns, inline {} ns, engine thread {} ns)",
        a.size,
        f("added_ns", "p50"),
        f("added_ns", "p99"),
        f("added_through_engine_thread_ns", "p50"),
        f("added_through_engine_thread_ns", "p99"),
        results["rtt_without_ns"]["p50"],
        results["rtt_inline_ns"]["p50"],
        results["rtt_through_engine_thread_ns"]["p50"],
    );
    let params = json!({ "size": a.size, "count": a.count });
    emit(cli.json, &Report::new("overhead", params, results))
}

fn share(cli: &Cli, a: &ShareArgs) -> Result<(), BenchError> {
    use uniplane_bench::share::{run_share, ShareOptions};
    let weights: Result<Vec<u32>, _> = a.weights.split(':').map(str::parse).collect();
    let weights = weights
        .map_err(|_| BenchError::Config(format!("--weights `{}`: like 1:1:2", a.weights)))?;
    match a.through.as_str() {
        "mux" => {}
        "daemons" => return share_through_daemons(cli, a, weights),
        other => {
            return Err(BenchError::Config(format!(
                "--through `{other}`: mux or daemons"
            )))
        }
    }
    let gbps = a.gbps.unwrap_or(8.0);
    let opts = ShareOptions {
        weights,
        phase_ms: a.phase_ms,
        rate_bps: (gbps * 1e9) as u64,
        interval_ms: a.interval_ms,
    };
    let ticker = Ticker::start(cli, "share", Some(4.0 * a.phase_ms as f64 / 1000.0));
    let r = run_share(&opts)?;
    drop(ticker);
    share_phases(a, &r.results, &r.series)?;
    println!(
        "max_share_error {:.3}, jain_min {:.3}, utilization_min {:.3}, settle_ms_max {}",
        r.results["max_share_error"].as_f64().unwrap_or(0.0),
        r.results["jain_min"].as_f64().unwrap_or(0.0),
        r.results["utilization_min"].as_f64().unwrap_or(0.0),
        r.results["settle_ms_max"],
    );
    let params = json!({ "weights": a.weights, "phase_ms": a.phase_ms, "gbps": gbps, "interval_ms": a.interval_ms, "through": "mux" });
    emit(cli.json, &Report::new("share", params, r.results))
}

/// Draws the figure when asked, and prints each phase of a `share` run.
fn share_phases(
    a: &ShareArgs,
    results: &Value,
    series: &[(f64, [f64; 3])],
) -> Result<(), BenchError> {
    if let Some(path) = &a.plot {
        uniplane_bench::share::plot(path, series)?;
        println!("  plot: {}", path.display());
    }
    for p in results["phases"].as_array().into_iter().flatten() {
        println!(
            "phase {}: target {} achieved {} error {:.3} utilization {:.3} settled after {} ms",
            p["phase"],
            p["target"],
            p["achieved"],
            p["share_error"].as_f64().unwrap_or(0.0),
            p["utilization"].as_f64().unwrap_or(0.0),
            p["settle_ms"],
        );
    }
    Ok(())
}

fn share_through_daemons(cli: &Cli, a: &ShareArgs, weights: Vec<u32>) -> Result<(), BenchError> {
    use uniplane_bench::share_daemons::{run_share_through_daemons, DaemonShareOptions};
    use uniplane_bench::tunnel::TunnelStack;
    let stack = TunnelStack::by_name(&a.tunnel)
        .ok_or_else(|| BenchError::Config(format!("--tunnel `{}`: tcp, ltl or udp", a.tunnel)))?;
    let gbps = a.gbps.unwrap_or(0.2);
    let opts = DaemonShareOptions {
        weights,
        phase_ms: a.phase_ms,
        rate_bps: (gbps * 1e9).round() as u64,
        interval_ms: a.interval_ms,
        size: a.size,
        stack,
        uniplaned: a.uniplaned.clone(),
    };
    let ticker = Ticker::start(cli, "share", None);
    let r = run_share_through_daemons(&opts)?;
    drop(ticker);
    share_phases(a, &r.results, &r.series)?;
    println!(
        "through daemons over {}: max_share_error {:.3}, utilization {:.3}, settle_ms {:.1} after the live change (its requests took {:.1} ms)",
        a.tunnel,
        r.results["max_share_error"].as_f64().unwrap_or(0.0),
        r.results["utilization"].as_f64().unwrap_or(0.0),
        r.results["settle_ms"].as_f64().unwrap_or(0.0),
        r.results["change_took_ms"].as_f64().unwrap_or(0.0),
    );
    let params = json!({ "weights": a.weights, "phase_ms": a.phase_ms, "gbps": gbps, "interval_ms": a.interval_ms, "through": "daemons", "tunnel": a.tunnel, "size": a.size });
    emit(cli.json, &Report::new("share", params, r.results))
}

fn path(cli: &Cli, a: &PathArgs) -> Result<(), BenchError> {
    use uniplane_bench::path::{run_path, PathConfig, PlaneKind, WaitMode};
    let cfg = PathConfig {
        size: a.size,
        seconds: a.seconds,
        plane: if a.plane == "rtl" {
            PlaneKind::Rtl
        } else {
            PlaneKind::Engine
        },
        wait: if a.wait == "park" {
            WaitMode::Park
        } else {
            WaitMode::Busy
        },
        uniplaned: a.uniplaned.clone(),
        ping_count: a.ping_count,
    };
    let ticker = Ticker::start(cli, "path", None);
    let r = run_path(&cfg)?;
    drop(ticker);
    let ns = |v: &Value| {
        v.as_f64()
            .map_or("-".to_string(), |x| format!("{:.2}", x / 1000.0))
    };
    println!(
        "path {} B, plane {}, wait {}: rtt p50 {} µs, p99 {} µs ({} round trips); one way {:.2} M msgs/s",
        a.size,
        a.plane,
        a.wait,
        ns(&r["rtt_ns"]["p50"]),
        ns(&r["rtt_ns"]["p99"]),
        r["round_trips"],
        r["msgs_per_sec"].as_f64().unwrap_or(0.0) / 1e6,
    );
    println!(
        "  beside it, uniplane ping self: p50 {} µs, p99 {} µs",
        ns(&r["ping_rtt_ns"]["p50"]),
        ns(&r["ping_rtt_ns"]["p99"]),
    );
    let params = json!({ "size": a.size, "seconds": a.seconds, "plane": a.plane, "wait": a.wait });
    emit(cli.json, &Report::new("path", params, r))
}

fn tunnel(cli: &Cli, a: &TunnelArgs) -> Result<(), BenchError> {
    use uniplane_bench::tunnel::{
        peer_name, run_tunnel, tunnel_handoff, TunnelConfig, TunnelStack, SERVER_A, SERVER_B,
    };
    let stack = TunnelStack::by_name(&a.stack)
        .ok_or_else(|| BenchError::Config(format!("--stack `{}`: udp, ltl or tcp", a.stack)))?;
    let warmup = Duration::try_from_secs_f64(a.warmup)
        .map_err(|_| BenchError::Config(format!("bad warm-up `{}`", a.warmup)))?;
    let cfg = TunnelConfig {
        stack,
        size: a.size,
        seconds: a.seconds,
        warmup,
        uniplaned: a.uniplaned.clone(),
    };
    let ticker = Ticker::start(cli, "tunnel", Some(2.0 * (a.seconds + a.warmup)));
    let r = run_tunnel(&cfg)?;
    drop(ticker);
    let peer = peer_name(stack);
    let (t, lost) = (&r.tunnel, r.lost());
    let note = r.note();
    let handoff = tunnel_handoff(&t.daemons);
    let mps = |v: f64| format!("{:.3} M", v / 1e6);
    println!(
        "tunnel over {}: {} B payloads, {} s measured after {} s of warm-up, {SERVER_A} → {SERVER_B} \
         through two uniplaned on 127.0.0.1 (sealed tunnel, cluster secret)",
        a.stack, a.size, a.seconds, a.warmup
    );
    println!(
        "  {:<58} {:>12} {:>14}",
        "one way, at the receiver", "msgs/s", "payload Gbit/s"
    );
    println!(
        "  {:<58} {:>12} {:>14.3}",
        "through the two daemons",
        mps(t.msgs_per_sec()),
        t.gbit_per_sec()
    );
    println!(
        "  {:<58} {:>12} {:>14.3}",
        format!("peer: {peer}"),
        mps(r.peer.msgs_per_sec),
        r.peer.gbit_per_sec
    );
    println!(
        "  ratio tunnel / peer {}",
        r.ratio()
            .map_or("n/a (the peer received nothing)".to_owned(), |x| format!(
                "{x:.3}"
            ))
    );
    println!(
        "  seal + open {:.0} ns of CPU per message (seal {:.0}, open {:.0}; one thread, no I/O): {:.3} of a core at the measured rate",
        r.seal.seal_open_ns(),
        r.seal.seal_ns,
        r.seal.open_ns,
        r.seal_share_of_a_core()
    );
    println!(
        "  sent {}, received {} (warm-up included); {note}; the peer lost {}",
        t.sent, t.received, r.peer.lost
    );
    let params = json!({
        "stack": a.stack,
        "size": a.size,
        "seconds": a.seconds,
        "warmup_s": a.warmup,
        "servers": [SERVER_A.to_string(), SERVER_B.to_string()],
        "daemons": "two uniplaned on 127.0.0.1, engine spin-then-park, peers over the stack with a cluster secret",
        "sessions": "park; sender and receiver each on their own OS thread with a current-thread runtime",
        "peer": peer,
    });
    let results = json!({
        "msgs_per_sec": t.msgs_per_sec(),
        "gbit_per_sec": t.gbit_per_sec(),
        "sent": t.sent,
        "received": t.received,
        "lost": lost,
        "measured": t.measured,
        "seconds": t.seconds,
        "seal_ns_per_msg": r.seal.seal_ns,
        "open_ns_per_msg": r.seal.open_ns,
        "seal_open_ns_per_msg": r.seal.seal_open_ns(),
        "seal_share_of_a_core": r.seal_share_of_a_core(),
        "peer": peer,
        "peer_msgs_per_sec": r.peer.msgs_per_sec,
        "peer_gbit_per_sec": r.peer.gbit_per_sec,
        "peer_lost": r.peer.lost,
        "stack_reliable": r.reliable,
        "ratio": r.ratio(),
        "note": note,
        "tunnel_port_tx": handoff.map(|h| h.0),
        "tunnel_port_rx": handoff.map(|h| h.1),
        "daemons": t.daemons,
    });
    emit(cli.json, &Report::new("tunnel", params, results))
}

fn rpc(cli: &Cli, a: &RpcArgs) -> Result<(), BenchError> {
    use uniplane_bench::rpc::{run_rpc, RpcConfig, RpcMode, RpcStack, RpcWait};
    let cfg = RpcConfig {
        mode: if a.mode == "tonic" {
            RpcMode::Tonic
        } else {
            RpcMode::Native
        },
        stack: match a.stack.as_str() {
            "tcp" => RpcStack::Tcp,
            "ltl" => RpcStack::Ltl,
            _ => RpcStack::Shm,
        },
        concurrency: a.concurrency.max(1),
        size: a.size as usize,
        seconds: a.seconds,
        wait: match a.wait.as_str() {
            "busy" => RpcWait::Busy,
            "park" => RpcWait::Park,
            _ => RpcWait::Spin,
        },
        uniplaned: a.uniplaned.clone(),
    };
    let ticker = Ticker::start(cli, "rpc", None);
    let r = run_rpc(&cfg)?;
    drop(ticker);
    let us = |v: &Value| {
        v.as_f64()
            .map_or("-".to_string(), |x| format!("{:.1}", x / 1000.0))
    };
    let line = |name: &str, v: &Value| {
        println!(
            "  {name:<28} p50 {:>8} µs  p99 {:>8} µs  {:>10.0} req/s  CPU/req: client {:>6} µs, server {:>6} µs, daemons {:>6} µs",
            us(&v["latency_ns"]["p50"]),
            us(&v["latency_ns"]["p99"]),
            v["requests_per_sec"].as_f64().unwrap_or(0.0),
            us(&v["cpu_ns_per_request"]["client"]),
            us(&v["cpu_ns_per_request"]["server"]),
            us(&v["cpu_ns_per_request"]["daemons"]),
        )
    };
    println!(
        "rpc {} over {}, {} B, concurrency {}, wait {}:",
        a.mode, a.stack, a.size, a.concurrency, a.wait
    );
    line(&format!("uniplane ({})", a.mode), &r);
    line("tonic/TCP, split runtimes", &r["peer"]["split"]);
    line("tonic/TCP, one shared runtime", &r["peer"]["shared"]);
    println!(
        "  ratios against the faster tonic/TCP: p50 {:.2}x (vs {}), req/s {:.2}x (vs {})",
        r["p50_ratio"].as_f64().unwrap_or(0.0),
        r["peer"]["best_p50_from"].as_str().unwrap_or("-"),
        r["rps_ratio"].as_f64().unwrap_or(0.0),
        r["peer"]["best_rps_from"].as_str().unwrap_or("-"),
    );
    let params = json!({ "mode": a.mode, "stack": a.stack, "concurrency": a.concurrency, "size": a.size, "seconds": a.seconds, "wait": a.wait });
    emit(cli.json, &Report::new("rpc", params, r))
}

fn collectives(cli: &Cli, a: &CollectivesArgs) -> Result<(), BenchError> {
    use uniplane_bench::collectives::{run_collectives, CollConfig, CollOp};
    use uniplane_bench::path::WaitMode;
    let sizes = uniplane_bench::collectives::parse_sizes(&a.sizes)
        .map_err(|e| BenchError::Config(format!("--sizes: {e}")))?;
    let cfg = CollConfig {
        op: CollOp::parse(&a.op).unwrap_or(CollOp::Allreduce),
        ranks: a.ranks as usize,
        sizes: sizes.clone(),
        iterations: a.iterations,
        wait: if a.wait == "park" {
            WaitMode::Park
        } else {
            WaitMode::Busy
        },
        uniplaned: a.uniplaned.clone(),
        mpi: !a.no_mpi,
        eager_threshold: a.eager,
        stack: a.stack.clone(),
        operator: a.operator,
    };
    let ticker = Ticker::start(cli, "collectives", None);
    let r = run_collectives(&cfg)?;
    drop(ticker);
    let us = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.1}"));
    println!(
        "{} with {} ranks over {}, wait {} (avg µs over ranks; CPU µs per op, all ranks):",
        a.op, a.ranks, a.stack, a.wait
    );
    println!(
        "  {:>9} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}",
        "size", "uniplane", "OpenMPI", "MPICH", "cpu:ours", "cpu:ompi", "cpu:mpich"
    );
    for p in r["points"].as_array().into_iter().flatten() {
        println!(
            "  {:>9} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9}",
            p["size"].as_u64().unwrap_or(0),
            us(&p["uniplane_us"]),
            us(&p["openmpi_us"]),
            us(&p["mpich_us"]),
            us(&p["cpu_us_per_op"]["uniplane"]),
            us(&p["cpu_us_per_op"]["openmpi"]),
            us(&p["cpu_us_per_op"]["mpich"]),
        );
    }
    if a.operator {
        println!("  through the reduction operator endpoint (same run):");
        for p in r["points"].as_array().into_iter().flatten() {
            println!(
                "  {:>9} {:>10} {:>9}",
                p["size"].as_u64().unwrap_or(0),
                us(&p["uniplane_operator_us"]),
                us(&p["cpu_us_per_op"]["uniplane_operator"]),
            );
        }
    }
    for lib in ["openmpi", "mpich"] {
        if let Some(why) = r[lib].as_str() {
            println!("  {lib}: {why}");
        }
    }
    if let Some(path) = &a.plot {
        let line = |key: &str| -> Vec<(f64, f64)> {
            r["points"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| Some((p["size"].as_f64()?, p[key].as_f64()?)))
                .collect()
        };
        let lines = [
            ("uniplane", line("uniplane_us")),
            ("uniplane via operator", line("uniplane_operator_us")),
            ("OpenMPI", line("openmpi_us")),
            ("MPICH", line("mpich_us")),
        ];
        let lines: Vec<(&str, Vec<(f64, f64)>)> =
            lines.into_iter().filter(|(_, v)| !v.is_empty()).collect();
        let title = format!("{} with {} ranks over {}", a.op, a.ranks, a.stack);
        plot::draw(
            path,
            &Chart::LogLog {
                title: &title,
                x_label: "bytes per rank",
                y_label: "µs per call (avg)",
                lines: &lines,
            },
        )?;
        println!("  plot: {}", path.display());
    }
    let params = json!({ "op": a.op, "ranks": a.ranks, "sizes": sizes, "stack": a.stack, "wait": a.wait, "iterations": a.iterations, "eager": a.eager, "operator": a.operator });
    emit(cli.json, &Report::new("collectives", params, r))
}

fn pgas(cli: &Cli, a: &PgasArgs) -> Result<(), BenchError> {
    use uniplane_bench::path::WaitMode;
    use uniplane_bench::pgas::{parse_sizes, run_pgas, PgasConfig, PgasOp, PgasTarget};
    use uniplane_bench::tunnel::TunnelStack;
    let sizes = parse_sizes(&a.sizes).map_err(|e| BenchError::Config(format!("--sizes: {e}")))?;
    let cfg = PgasConfig {
        op: match a.op.as_str() {
            "short" => PgasOp::Short,
            "get" => PgasOp::Get,
            "atomic" => PgasOp::Atomic,
            "put-quiet" => PgasOp::PutQuiet,
            "window" => PgasOp::Window,
            _ => PgasOp::Put,
        },
        sizes: sizes.clone(),
        wait: if a.wait == "busy" {
            WaitMode::Busy
        } else {
            WaitMode::Park
        },
        uniplaned: a.uniplaned.clone(),
        openshmem: !a.no_openshmem,
        share: !a.no_share,
        target: if a.target == "hardware" {
            PgasTarget::Hardware
        } else {
            PgasTarget::Software
        },
        tunnel: TunnelStack::ALL.into_iter().find(|t| t.name() == a.stack),
    };
    let ticker = Ticker::start(cli, "pgas", None);
    let r = run_pgas(&cfg)?;
    drop(ticker);
    println!(
        "pgas {} to a {} rank over {}, wait {} (median µs):",
        a.op, a.target, a.stack, a.wait
    );
    println!(
        "  {:>9} {:>12} {:>12} {:>7}",
        "size", "uniplane", "OpenSHMEM", "ratio"
    );
    for p in r["points"].as_array().into_iter().flatten() {
        let u = p["uniplane_us"].as_f64();
        let o = p["openshmem_us"].as_f64();
        let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
        let ratio = u.zip(o).map(|(u, o)| u / o);
        println!(
            "  {:>9} {:>12} {:>12} {:>7}",
            p["size"],
            f(u),
            f(o),
            ratio.map_or("-".to_string(), |x| format!("{x:.2}x"))
        );
    }
    if let Some(p50) = r["rtt_ns"]["p50"].as_u64() {
        println!(
            "  short round trip p50 {p50} ns, p99 {} ns",
            r["rtt_ns"]["p99"]
        );
    }
    let params =
        json!({ "op": a.op, "stack": a.stack, "target": a.target, "sizes": sizes, "wait": a.wait });
    emit(cli.json, &Report::new("pgas", params, r))
}

fn devices(cli: &Cli, a: &DevicesArgs) -> Result<(), BenchError> {
    use uniplane_bench::devices::{parse_bytes, run_devices, DevicesConfig, MemoryKind};
    if a.backend.is_some() {
        return kernel_devices(cli, a);
    }
    let size = parse_bytes(a.size.as_deref().unwrap_or("64M"))
        .map_err(|e| BenchError::Config(format!("--size: {e}")))?;
    let cfg = DevicesConfig {
        memory: if a.memory == "gpu" {
            MemoryKind::Gpu
        } else {
            MemoryKind::Host
        },
        size,
        verify: a.verify,
        gpu: a.gpu,
        rounds: a.rounds as usize,
    };
    let ticker = Ticker::start(cli, "devices", None);
    let r = run_devices(&cfg)?;
    drop(ticker);
    let f = |v: &serde_json::Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.2}"));
    println!(
        "devices: {} bytes of {} memory through the daemon (GB/s, median of {}):",
        size, a.memory, a.rounds
    );
    println!(
        "  {:>6} {:>10} {:>7} {:>10} {:>7} {:>10}",
        "", "messages", "ratio", "mapped", "ratio", "peer"
    );
    for way in ["write", "read"] {
        println!(
            "  {:>6} {:>10} {:>6}x {:>10} {:>6}x {:>10}",
            way,
            f(&r["gbytes_per_sec"][way]),
            f(&r["ratio"][way]),
            f(&r["mapped"]["gbytes_per_sec"][way]),
            f(&r["mapped"]["ratio"][way]),
            f(&r["peer"]["gbytes_per_sec"][way]),
        );
    }
    println!("  peer: {}", r["peer"]["name"].as_str().unwrap_or("?"));
    if let Some(points) = r["transfers"]["points"].as_array() {
        println!("  writes by message size (GB/s): staged, direct");
        for p in points {
            println!(
                "  {:>8} {:>8} {:>8}",
                p["message_bytes"],
                f(&p["staged_gbytes_per_sec"]),
                f(&p["direct_gbytes_per_sec"])
            );
        }
    }
    if let Some(v) = r["verified"].as_bool() {
        println!("  verified: {v}");
    }
    let params = json!({
        "memory": a.memory, "size": size, "verify": a.verify, "gpu": a.gpu, "rounds": a.rounds,
    });
    emit(cli.json, &Report::new("devices", params, r))
}

/// `devices --backend emulated`: round trips to an echo kernel device.
fn kernel_devices(cli: &Cli, a: &DevicesArgs) -> Result<(), BenchError> {
    use uniplane_bench::devices::{parse_bytes, run_kernel_rtt, KernelRttConfig};
    use uniplane_bench::path::WaitMode;
    let size = parse_bytes(a.size.as_deref().unwrap_or("64"))
        .map_err(|e| BenchError::Config(format!("--size: {e}")))?;
    let wait = if a.wait == "busy" {
        WaitMode::Busy
    } else {
        WaitMode::Park
    };
    let cfg = KernelRttConfig {
        size,
        wait,
        count: a.count.max(1),
    };
    let ticker = Ticker::start(cli, "devices", None);
    let r = run_kernel_rtt(&cfg)?;
    drop(ticker);
    println!(
        "devices: {size}-byte round trips to an echo kernel (emulated, wait {}), path {}:",
        a.wait,
        r["path"].as_str().unwrap_or("?")
    );
    let p = |v: &Value| Percentiles {
        count: v["count"].as_u64().unwrap_or(0),
        min: v["min"].as_u64().unwrap_or(0),
        mean: v["mean"].as_f64().unwrap_or(0.0),
        p50: v["p50"].as_u64().unwrap_or(0),
        p90: v["p90"].as_u64().unwrap_or(0),
        p99: v["p99"].as_u64().unwrap_or(0),
        p999: v["p999"].as_u64().unwrap_or(0),
        p9999: v["p9999"].as_u64().unwrap_or(0),
        max: v["max"].as_u64().unwrap_or(0),
    };
    print_percentiles("kernel", &p(&r["rtt_ns"]));
    print_percentiles("echo", &p(&r["inline_echo_rtt_ns"]));
    print_percentiles("port", &p(&r["port_rtt_ns"]));
    print_percentiles("mailbox", &p(&r["mailbox_rtt_ns"]));
    println!(
        "  (kernel: application → daemon → kernel → back; echo: the daemon's inline echo \
         device, same path without the kernel; port: the kernel's host end driven \
         directly; mailbox: the PIO mailbox alone)"
    );
    let d = &r["dma"];
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    println!(
        "  one-sided 4 MiB into the kernel's memory by DMA: write {:.2} GB/s ({:.2}× memcpy), \
         read {:.2} GB/s ({:.2}× memcpy)",
        f(&d["gbytes_per_sec"]["write"]),
        f(&d["ratio"]["write"]),
        f(&d["gbytes_per_sec"]["read"]),
        f(&d["ratio"]["read"]),
    );
    println!("  DMA write by mode, median ns: {}", d["mode_write_ns"]);
    let params = json!({
        "backend": a.backend, "size": size, "wait": a.wait, "count": cfg.count,
    });
    emit(cli.json, &Report::new("devices", params, r))
}

fn app_regex(cli: &Cli, a: &uniplane_bench::app_regex::RegexArgs) -> Result<(), BenchError> {
    use uniplane_bench::app_regex::{print, run_regex};
    let ticker = Ticker::start(cli, "app regex", None);
    let r = run_regex(a)?;
    drop(ticker);
    print(&r);
    let params = json!({
        "app": "regex", "engine": a.engine, "sizes": a.sizes, "count": a.count,
        "depth": a.depth, "seed": a.seed, "rules": a.rules,
    });
    emit(cli.json, &Report::new("app", params, r))
}

fn app_deep_crossing(
    cli: &Cli,
    a: &uniplane_bench::app_deep_crossing::DeepCrossingArgs,
) -> Result<(), BenchError> {
    use uniplane_bench::app_deep_crossing::{print, run_deep_crossing};
    let ticker = Ticker::start(cli, "app deep-crossing", None);
    let r = run_deep_crossing(a)?;
    drop(ticker);
    print(&r);
    let params = json!({
        "app": "deep-crossing", "count": a.count, "pipeline": a.pipeline, "seed": a.seed,
        "dims": a.dims, "nnz": a.nnz, "cut": a.cut, "paths": a.paths, "rounds": a.rounds,
    });
    emit(cli.json, &Report::new("app", params, r))
}

fn suite(cli: &Cli, a: &SuiteArgs) -> Result<(), BenchError> {
    use uniplane_bench::suite::{markdown, run_suite, target_text, RowResult, SuiteConfig};
    let with_ext = |ext: &str| {
        let mut p = a.out.clone().into_os_string();
        p.push(format!(".{ext}"));
        PathBuf::from(p)
    };
    let (json_path, svg_path) = (with_ext("json"), a.plot.clone().unwrap_or(with_ext("svg")));
    let started = std::time::Instant::now();
    let (report, rows): (Value, Vec<Value>) = if let Some(from) = &a.from {
        let text = std::fs::read_to_string(from)
            .map_err(|e| BenchError::Config(format!("--from {}: {e}", from.display())))?;
        let v: Value = serde_json::from_str(&text)?;
        let rows = v["results"]["rows"].as_array().cloned().ok_or_else(|| {
            BenchError::Config(format!("--from {}: no results.rows", from.display()))
        })?;
        (v, rows)
    } else {
        let seconds = a.seconds.unwrap_or(if a.quick { 1 } else { 3 });
        let cfg = SuiteConfig {
            seconds,
            only: a.only.clone(),
            exe: std::env::current_exe()
                .map_err(|e| BenchError::Config(format!("finding this program: {e}")))?,
        };
        let quiet = cli.quiet || cli.json;
        let tty = std::io::stderr().is_terminal();
        let rows = run_suite(&cfg, |i, n, row| {
            if !quiet && tty {
                eprint!("\r{:79}\rsuite [{}/{n}] {}", "", i + 1, row.id);
                let _ = std::io::stderr().flush();
            }
        })?;
        if !quiet && tty {
            eprint!("\r{:79}\r", "");
        }
        let rows: Vec<Value> = rows
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        let params = json!({ "quick": a.quick, "seconds": seconds, "only": a.only });
        let results = json!({
            "rows": rows,
            "seconds": started.elapsed().as_secs_f64(),
            "ok": rows.iter().filter(|r| r["status"] == "ok").count(),
            "skipped": rows.iter().filter(|r| r["status"] == "skipped").count(),
            "failed": rows.iter().filter(|r| r["status"] == "failed").count(),
        });
        let v = serde_json::to_value(Report::new("suite", params, results))?;
        std::fs::write(&json_path, format!("{v}\n"))
            .map_err(|e| BenchError::Config(format!("writing {}: {e}", json_path.display())))?;
        (v, rows)
    };
    let typed: Vec<RowResult> = rows.iter().filter_map(row_result).collect();
    for r in &typed {
        let figures = match r.status {
            "ok" => format!(
                "ours {} {}{}  ratio {}  target {} {}",
                r.ours.map_or("-".into(), |x| format!("{x:.3}")),
                r.unit,
                match (r.peer, r.peer_name) {
                    (Some(p), Some(n)) => format!("  peer {p:.3} {} ({n})", r.unit),
                    _ => String::new(),
                },
                r.ratio.map_or("-".into(), |x| format!("{x:.2}")),
                target_text(r),
                match r.target_met {
                    Some(true) => "met",
                    Some(false) => "NOT met",
                    None => "",
                }
            ),
            other => format!("{other}: {}", r.reason.as_deref().unwrap_or("")),
        };
        println!("{:<24} {figures}", r.id);
    }
    let bars: Vec<(String, f64, Option<bool>)> = typed
        .iter()
        .filter_map(|r| {
            let ratio = r.ratio?;
            let vs = match (r.peer, r.peer_name) {
                (Some(p), Some(n)) => format!("{p:.3} {} ({n})", r.unit),
                _ => format!("target {}", target_text(r)),
            };
            Some((
                format!(
                    "{}: ours {:.3} {} vs {vs}: {ratio:.2}×",
                    r.id, r.ours?, r.unit
                ),
                ratio,
                r.target_met,
            ))
        })
        .collect();
    if !bars.is_empty() {
        plot::draw(
            &svg_path,
            &Chart::Ratios {
                title: "uniplane-bench suite: ours ÷ peer per row",
                rows: &bars,
            },
        )?;
    }
    if a.from.is_none() {
        println!("  report: {}", json_path.display());
    }
    if !bars.is_empty() {
        println!("  summary: {}", svg_path.display());
    }
    if a.markdown {
        print!("{}", markdown(&typed));
    }
    if cli.json {
        println!("{report}");
    }
    Ok(())
}

/// A row of a suite report read back (from this run or an earlier one).
fn row_result(v: &Value) -> Option<uniplane_bench::suite::RowResult> {
    use uniplane_bench::suite::{rows, RowResult};
    let def = rows().into_iter().find(|r| v["id"] == r.id)?;
    let status = match v["status"].as_str()? {
        "ok" => "ok",
        "skipped" => "skipped",
        _ => "failed",
    };
    Some(RowResult {
        id: def.id,
        what: def.what,
        command: v["command"].as_str()?.to_owned(),
        status,
        reason: v["reason"].as_str().map(str::to_owned),
        ours: v["ours"].as_f64(),
        peer: v["peer"].as_f64(),
        peer_name: def.peer.map(|p| p.1),
        ratio: v["ratio"].as_f64(),
        ratio_of: match v["ratio_of"].as_str() {
            Some("peer") => Some("peer"),
            Some("target") => Some("target"),
            _ => None,
        },
        unit: def.unit,
        higher_is_better: def.higher_is_better,
        target: def.target,
        target_met: v["target_met"].as_bool(),
        seconds: v["seconds"].as_f64().unwrap_or(0.0),
    })
}

#[cfg(not(feature = "rtl"))]
fn hw(_: &Cli, _: &HwArgs) -> Result<(), BenchError> {
    Err(BenchError::Config(
        "`hw` needs the RTL co-simulation: this uniplane-bench was built without the `rtl` \
         feature (cargo build --release -p uniplane-bench --features rtl; needs Verilator)"
            .into(),
    ))
}

fn wake(cli: &Cli, a: &WakeArgs) -> Result<(), BenchError> {
    let pps = match a.rate {
        Rate::Pps(p) => p,
        other => {
            return Err(BenchError::Config(format!(
                "wake: --rate is a message rate (2kpps), not {other}"
            )))
        }
    };
    let r = uniplane_bench::wake::run_wake(pps, a.seconds)?;
    let late = r.late.percentiles();
    println!(
        "wake at {pps} per second: {} wake-ups in {:.3} s, the thread's CPU {:.1} ms ({:.2} % of a core, {:.1} us a wake-up); late p50 {} ns, p99 {} ns",
        r.wakeups,
        r.seconds,
        r.cpu.as_secs_f64() * 1e3,
        r.cpu_percent(),
        r.cpu.as_secs_f64() * 1e6 / r.wakeups.max(1) as f64,
        late.p50,
        late.p99,
    );
    let params = json!({ "rate": a.rate.to_string(), "seconds": a.seconds });
    let results = json!({
        "wakeups": r.wakeups,
        "seconds": r.seconds,
        "thread_cpu_percent": r.cpu_percent(),
        "cpu_ns_per_wakeup": r.cpu.as_nanos() as f64 / r.wakeups.max(1) as f64,
        "late_ns": late,
    });
    emit(cli.json, &Report::new("wake", params, results))
}

#[cfg(feature = "rtl")]
fn hw(cli: &Cli, a: &HwArgs) -> Result<(), BenchError> {
    use uniplane_bench::hw::{run_hw, HwBench, HwPattern};
    use uniplane_hw_sim::Model;
    let model = match (a.ports, a.crossbar.as_str()) {
        (4, "islip") => Model::N4Islip,
        (4, _) => Model::N4,
        (8, "islip") => Model::N8Islip,
        (8, _) => Model::N8,
        (other, _) => {
            return Err(BenchError::Config(format!(
                "--ports {other}: the RTL is built with 4 or 8"
            )))
        }
    };
    let cfg = HwBench {
        model,
        pattern: if a.pattern == "all-to-one" {
            HwPattern::AllToOne
        } else {
            HwPattern::Uniform
        },
        size: a.size,
        cycles: a.cycles,
        seed: a.seed,
    };
    let mut live = Live::new("hw".into(), cli.quiet || cli.json);
    let r = run_hw(&cfg, &mut live)?;
    drop(live);
    let per_output: Vec<f64> = r["beats_per_cycle"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_f64)
        .collect();
    println!(
        "hw {} with {} ports ({} crossbar), {} B payloads ({} beats each), {} cycles after {} of warm-up:",
        a.pattern,
        a.ports,
        a.crossbar,
        a.size,
        r["beats_per_message"],
        r["cycles"],
        r["warmup_cycles"]
    );
    println!(
        "  beats per cycle per output: {}",
        per_output
            .iter()
            .map(|b| format!("{b:.3}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let reference = r["reference"]["beats_per_cycle"].as_f64().unwrap_or(0.0);
    println!(
        "  mean {:.3}, lowest {:.3} beside {:.3} ({}): ratio {:.3}",
        r["beats_per_cycle_mean"].as_f64().unwrap_or(0.0),
        r["beats_per_cycle_min"].as_f64().unwrap_or(0.0),
        reference,
        r["reference"]["name"].as_str().unwrap_or("?"),
        r["ratio"].as_f64().unwrap_or(0.0),
    );
    println!(
        "  {} messages delivered; {:.0} simulated cycles per second",
        r["messages_delivered"],
        r["simulated_cycles_per_sec"].as_f64().unwrap_or(0.0)
    );
    if let Some(path) = &a.plot {
        let ours: Vec<(f64, f64)> = per_output
            .iter()
            .enumerate()
            .map(|(o, &b)| (o as f64, b))
            .collect();
        let refline: Vec<(f64, f64)> = (0..per_output.len())
            .map(|o| (o as f64, reference))
            .collect();
        let lines = [("RTL crossbar", ours), ("reference", refline)];
        let title = format!("{} {} B, beats per cycle by output port", a.pattern, a.size);
        plot::draw(
            path,
            &Chart::Points {
                title: &title,
                x_label: "output port",
                y_label: "beats per cycle (1 = line rate)",
                lines: &lines,
            },
        )?;
        println!("  plot: {}", path.display());
    }
    let params = json!({ "pattern": a.pattern, "size": a.size, "ports": a.ports,
        "cycles": a.cycles, "seed": a.seed });
    emit(cli.json, &Report::new("hw", params, r))
}

fn p2p(cli: &Cli, a: &P2pArgs) -> Result<(), BenchError> {
    use uniplane_bench::p2p::{parse_mode, parse_model, run_p2p, P2pBench, MAX_P2P_SIZE};
    use uniplane_shm::p2p::TransferMode;
    let mut modes = Vec::new();
    for m in &a.mode {
        if m == "all" {
            modes.extend(TransferMode::ALL);
        } else {
            modes.push(parse_mode(m)?);
        }
    }
    modes.dedup();
    let sizes = uniplane_bench::sizes::parse_byte_sizes(&a.sizes, MAX_P2P_SIZE)
        .map_err(|e| BenchError::Config(format!("--sizes: {e}")))?;
    let cfg = P2pBench {
        modes,
        sizes: sizes.clone(),
        budget: Duration::from_millis(a.budget_ms),
        verify: a.verify,
        model: parse_model(&a.model, &a.link_path)?,
    };
    let mut live = Live::new("p2p".into(), cli.quiet || cli.json);
    let r = run_p2p(&cfg, &mut live)?;
    drop(live);
    let f = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.3}"));
    println!(
        "p2p device A → device B, model {}{}, {} ms per point (median time; GB/s of payload):",
        a.model,
        if a.model == "none" {
            String::new()
        } else {
            format!(" via {}", a.link_path)
        },
        a.budget_ms
    );
    let names: Vec<&str> = cfg.modes.iter().map(|m| m.name()).collect();
    print!("  {:>10} {:>9}", "bytes", "memcpy");
    for n in &names {
        print!(" {n:>17}");
    }
    println!();
    for (i, size) in sizes.iter().enumerate() {
        print!("  {size:>10} {:>9}", f(&r["memcpy_gbytes_per_sec"][i]));
        for m in r["modes"].as_array().into_iter().flatten() {
            let p = &m["points"][i];
            let bad = if p["verified"] == json!(false) {
                " BAD"
            } else {
                ""
            };
            print!(
                " {:>9} {:>7}",
                f(&p["gbytes_per_sec"]),
                format!("{}x{bad}", f(&p["vs_memcpy"]))
            );
        }
        println!();
    }
    for m in r["modes"].as_array().into_iter().flatten() {
        match m["fit"].as_object() {
            Some(fit) => println!(
                "  fit {}: {:.2} µs + size ÷ {:.2} GB/s",
                m["mode"].as_str().unwrap_or("?"),
                fit["latency_us"].as_f64().unwrap_or(0.0),
                fit["gbytes_per_sec"].as_f64().unwrap_or(0.0)
            ),
            None => println!(
                "  fit {}: needs two sizes or more",
                m["mode"].as_str().unwrap_or("?")
            ),
        }
    }
    if let Some(v) = r["verified"].as_bool() {
        println!("  verified: {v}");
    }
    if let Some(path) = &a.plot {
        let line = |ys: &Value| -> Vec<(f64, f64)> {
            sizes
                .iter()
                .zip(ys.as_array().into_iter().flatten())
                .filter_map(|(&s, y)| Some((s as f64, y.as_f64().filter(|y| *y > 0.0)?)))
                .collect()
        };
        let mut lines: Vec<(&str, Vec<(f64, f64)>)> = Vec::new();
        for m in r["modes"].as_array().into_iter().flatten() {
            let ys: Vec<Value> = m["points"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| p["gbytes_per_sec"].clone())
                .collect();
            lines.push((m["mode"].as_str().unwrap_or("?"), line(&Value::Array(ys))));
        }
        lines.push(("memcpy (peer)", line(&r["memcpy_gbytes_per_sec"])));
        plot::draw(
            path,
            &Chart::LogLog {
                title: "device A → device B",
                x_label: "bytes per transfer",
                y_label: "GB/s",
                lines: &lines,
            },
        )?;
        println!("  plot: {}", path.display());
    }
    let fails = r["verified"] == json!(false);
    let params = json!({
        "modes": names, "sizes": sizes, "budget_ms": a.budget_ms, "verify": a.verify,
        "model": a.model, "link_path": a.link_path,
    });
    emit(cli.json, &Report::new("p2p", params, r))?;
    if fails {
        return Err(BenchError::Config(
            "device B's bytes differ from device A's after a transfer".into(),
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    // Read buffers freed and allocated again must not cost page faults
    // (see uniplane_stacks::alloc).
    uniplane_stacks::alloc::retain_freed_memory();
    // Before any benchmark pins a thread (see report::cores).
    uniplane_bench::report::cores();
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::Gen(a) => gen(&cli, a),
        Command::Rtt(a) => rtt(&cli, a),
        Command::Peer(a) => peer(&cli, a),
        Command::Fabric(a) => fabric(&cli, a),
        Command::Overhead(a) => overhead(&cli, a),
        Command::Share(a) => share(&cli, a),
        Command::Path(a) => path(&cli, a),
        Command::Tunnel(a) => tunnel(&cli, a),
        Command::Rpc(a) => rpc(&cli, a),
        Command::Collectives(a) => collectives(&cli, a),
        Command::Pgas(a) => pgas(&cli, a),
        Command::Scale(a) => scale(&cli, a),
        Command::Devices(a) => devices(&cli, a),
        Command::P2p(a) => p2p(&cli, a),
        Command::Hw(a) => hw(&cli, a),
        Command::Suite(a) => suite(&cli, a),
        Command::Wake(a) => wake(&cli, a),
        Command::App(a) => match &a.app {
            AppCommand::DeepCrossing(d) => app_deep_crossing(&cli, d),
            AppCommand::Regex(r) => app_regex(&cli, r),
        },
        Command::GenerateManual { dir } => {
            use clap::CommandFactory;
            uniplane_services::manual::write(Cli::command(), "1", dir)
                .map_err(|e| BenchError::Config(format!("writing the manual: {e}")))
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uniplane-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
