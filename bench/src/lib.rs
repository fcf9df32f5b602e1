//! uniplane-bench: the packet generator and benchmarks of uniplane.
//!
//! Every figure the project quotes comes from a command of this crate's
//! binary, `uniplane-bench`, that anyone can rerun. Each subcommand prints
//! a line per second while it runs, a summary table, and with `--json` one
//! JSON document on the last line of stdout ([`report`]).
//!
//! - [`gen`]: a packet generator over any stack (picked by name through
//!   [`stacks::open_stack`]): fixed sizes, sweeps and IMIX ([`sizes`]),
//!   rates and patterns ([`args`], [`pacer`]), flows, warm-up; a stamp in
//!   each payload ([`stamp`]) gives one-way latency into an HDR histogram
//!   ([`hist`]) and loss and reordering by sequence number.
//! - [`rtt`]: closed-loop ping-pong against an echo side; [`shm_rtt`]:
//!   round trips over the PIO mailbox or the DMA ring beside a Unix socket.
//! - [`peer`]: real tools (iperf3, …) on the same workload in the same run,
//!   alternating with ours, and the ratio.
//! - [`plot`]: charts of a run as SVG or PNG.
//! - [`fabric`]: the overlay engine's throughput (DUA Table 2) and the
//!   latency it adds (DUA Fig. 11(a)).
//! - [`share`]: three applications sharing a shaped interface as the
//!   policy changes (DUA Fig. 11(b)); [`share_daemons`]: the same through
//!   two daemons, their underlay and a tunnel.
//! - [`path`]: the whole path of one server through a `uniplaned` started
//!   for the run; [`tunnel`]: one way between two servers, through two
//!   daemons and the sealed tunnel between them, beside the stack alone.
//! - [`rpc`]: unary RPC through uniplane (native or tonic) beside tonic
//!   over TCP loopback.
//! - [`devices`]: a memory device (host or GPU memory) written and read
//!   back through a daemon, beside memcpy or the driver's pinned copy.
//! - [`p2p`]: peer-to-peer transfers between two emulated devices beside
//!   memcpy of the same sizes.
//! - `hw` (feature `rtl`): the RTL crossbar's saturation throughput in
//!   co-simulation, beside the line rate or the head-of-line bound.
//! - [`collectives`]: OSU-style collective latency through
//!   uniplane-collectives beside OpenMPI and MPICH.
//!
//! - [`app_deep_crossing`]: DUA's deep crossing application, its dense
//!   layers in one kernel endpoint or split over two (FPGA Connect, LTL,
//!   TCP), latency and inferences/s in one run.
//!
//! - [`app_regex`]: DUA's multi-regex matching application, three
//!   stages chained through uniplane beside a relay through the CPU and
//!   one PCRE2 core, per input size.
//!
//! - [`suite`]: the headline rows of the performance issue in one run,
//!   one JSON file and one SVG summary.
//!
//! Sender and receiver run on separate OS threads, each with its own
//! current-thread runtime ([`engine`]), so figures are per core and honest;
//! only a slow paced `gen` (below [`gen::SHARED_BELOW_PPS`], or
//! `--threads shared`) runs both as tasks of one thread, which saves a
//! wake-up a message ([`gen::Threads`]).

#![deny(missing_docs)]

pub mod app_deep_crossing;
pub mod app_regex;
pub mod args;
pub mod clock;
pub mod collectives;
pub mod devices;
#[cfg(feature = "dpdk")]
pub mod dpdk_tx;
pub mod engine;
mod error;
pub mod ether_tx;
pub mod fabric;
pub mod fabric_shards;
pub mod gen;
pub mod hist;
#[cfg(feature = "rtl")]
pub mod hw;
pub mod p2p;
pub mod pacer;
pub mod path;
pub mod peer;
pub mod pgas;
pub mod plot;
pub mod report;
pub mod rpc;
pub mod rtt;
pub mod scale;
pub mod share;
pub mod share_daemons;
pub mod shm_rtt;
pub mod sizes;
pub mod smoltcp_tcp;
pub mod stacks;
pub mod stamp;
pub mod suite;
pub mod tunnel;
pub mod wake;

pub use error::BenchError;
