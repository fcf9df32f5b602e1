//! Real peer tools measured beside uniplane in the same run.
//!
//! A [`Peer`] runs one measurement of a [`Workload`] and returns a figure
//! in its [`Metric`]; [`compare`] alternates our side and the peer (A B A
//! B …) so slow drifts of the machine hit both, and reports both means and
//! the ratio ours ÷ peer. [`Iperf3Udp`] is the first peer; sockperf and
//! trafgen implement the same trait.
//!
//! Peer processes only ever use 127.0.0.1, run in their own process group,
//! are bounded in time (their own limits and ours), and are killed with
//! their whole group when the run ends, fails or panics; on Linux they are
//! also killed if this process dies.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

/// Why a peer could not be measured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    /// The tool is not on `PATH`.
    #[error("`{tool}` is not installed (Debian package `{package}`)")]
    Missing {
        /// The executable.
        tool: &'static str,
        /// Where to get it.
        package: &'static str,
    },
    /// The tool could not be started.
    #[error("starting `{tool}`: {source}")]
    Spawn {
        /// The executable.
        tool: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The tool did not finish (or get ready) in time; it was killed.
    #[error("`{tool}` did not {what} within {secs:.1} s; killed")]
    Timeout {
        /// The executable.
        tool: &'static str,
        /// What it failed to do.
        what: &'static str,
        /// The limit.
        secs: f64,
    },
    /// The tool exited unsuccessfully.
    #[error("`{tool}` failed ({status}): {stderr}")]
    Failed {
        /// The executable.
        tool: &'static str,
        /// How it exited.
        status: String,
        /// The end of what it printed on stderr.
        stderr: String,
    },
    /// The tool's output is not what this parser understands.
    #[error("`{tool}` output not understood: {why}")]
    BadOutput {
        /// The executable.
        tool: &'static str,
        /// What was wrong.
        why: String,
    },
}

/// What both sides run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Workload {
    /// Payload bytes per message.
    pub size: usize,
    /// Seconds per measurement (whole seconds: the tools take no fractions).
    pub seconds: u64,
    /// Both sides spin on their sockets instead of sleeping in the kernel
    /// (round trips only: sockperf then opens non-blocking sockets).
    pub busy_poll: bool,
}

/// The figure compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Messages delivered to the receiver per second.
    Pps,
    /// Median round-trip time in ns.
    RttP50Ns,
    /// Payload gigabits per second delivered.
    Gbps,
}

impl Metric {
    /// The name reports use.
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Pps => "pps",
            Metric::RttP50Ns => "rtt_p50_ns",
            Metric::Gbps => "gbps",
        }
    }

    /// Whether a larger figure is better.
    pub fn higher_is_better(&self) -> bool {
        matches!(self, Metric::Pps | Metric::Gbps)
    }
}

/// One measurement by a peer tool.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeerFigure {
    /// The figure in the peer's metric.
    pub value: f64,
    /// What else the tool reported.
    pub detail: Value,
}

/// A tool measured beside uniplane.
pub trait Peer {
    /// The executable (`iperf3`).
    fn tool(&self) -> &'static str;
    /// The Debian package that has it.
    fn package(&self) -> &'static str;
    /// What is compared.
    fn metric(&self) -> Metric;
    /// The transport the tool measures, in words.
    fn transport(&self) -> &'static str;
    /// The command lines it runs for `w` (for reports).
    fn commands(&self, w: &Workload) -> Vec<String>;
    /// One measurement.
    fn run(&self, w: &Workload) -> Result<PeerFigure, PeerError>;
}

/// The first executable called `tool` on `PATH`.
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A child process leading its own process group; dropping it kills the
/// group and reaps the child.
pub struct ProcessGroup {
    child: Child,
    tool: &'static str,
    reaped: bool,
}

impl ProcessGroup {
    /// Starts `cmd` in a new process group with stdin closed and stdout and
    /// stderr piped; on Linux the child is also killed if this process dies.
    pub fn spawn(tool: &'static str, cmd: &mut Command) -> Result<Self, PeerError> {
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        #[cfg(target_os = "linux")]
        // SAFETY: between fork and exec only async-signal-safe calls are
        // allowed; prctl is one, and nothing is allocated here.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|source| PeerError::Spawn { tool, source })?;
        Ok(ProcessGroup {
            child,
            tool,
            reaped: false,
        })
    }

    /// The child's process id (also its group id).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Takes the child's stdout.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Kills the whole group and reaps the child.
    pub fn kill(&mut self) {
        if self.reaped {
            return;
        }
        if let Ok(pgid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) with a negative pid signals that process
            // group; the group is the child's own, created at spawn.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }

    /// Waits up to `limit` for the child to exit, collecting stdout (unless
    /// taken) and stderr; kills the group on time-out.
    pub fn wait_output(
        mut self,
        limit: Duration,
        what: &'static str,
    ) -> Result<(ExitStatus, String, String), PeerError> {
        let out = self.child.stdout.take().map(read_all);
        let err = self.child.stderr.take().map(read_all);
        let deadline = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(None) => {
                    self.kill();
                    return Err(PeerError::Timeout {
                        tool: self.tool,
                        what,
                        secs: limit.as_secs_f64(),
                    });
                }
                Err(source) => {
                    self.kill();
                    return Err(PeerError::Spawn {
                        tool: self.tool,
                        source,
                    });
                }
            }
        };
        self.reaped = true;
        // Anything the tool left running in its group goes too, so the
        // pipes close and the readers finish.
        if let Ok(pgid) = i32::try_from(self.child.id()) {
            // SAFETY: as in `kill`; the group may already be empty.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        let collect =
            |h: Option<JoinHandle<String>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        Ok((status, collect(out), collect(err)))
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_all<R: Read + Send + 'static>(mut r: R) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

fn tail(s: &str, max: usize) -> String {
    let t = s.trim();
    let start = t.char_indices().rev().nth(max).map(|(i, _)| i).unwrap_or(0);
    t[start..].to_owned()
}

/// iperf3 sending UDP datagrams of the workload's size as fast as it can
/// (`-u -b 0 -l SIZE`) to a one-shot server, both on 127.0.0.1.
///
/// The figure is the datagrams the server received per second (sent minus
/// lost, over the server's measured time); what the client sent is in the
/// detail.
#[derive(Clone, Debug, Default)]
pub struct Iperf3Udp {
    /// The executable; `None` looks up `iperf3` on `PATH`.
    pub binary: Option<PathBuf>,
}

/// How long the server may take to say it listens.
const READY_WITHIN: Duration = Duration::from_secs(5);
/// Slack beyond the measured seconds before a tool is killed.
const SLACK: Duration = Duration::from_secs(15);

/// The executable of `tool`: `configured`, else `tool` on `PATH`.
pub(crate) fn locate(
    configured: &Option<PathBuf>,
    tool: &'static str,
    package: &'static str,
) -> Result<PathBuf, PeerError> {
    configured
        .clone()
        .or_else(|| find_tool(tool))
        .ok_or(PeerError::Missing { tool, package })
}

/// A TCP and UDP port on 127.0.0.1 that was free a moment ago.
fn free_port(tool: &'static str) -> Result<u16, PeerError> {
    crate::stacks::free_port()
        .map(|a| a.port())
        .map_err(|e| PeerError::BadOutput {
            tool,
            why: format!("no free port: {e}"),
        })
}

/// One measurement of a client-server tool: starts `server`, waits (up to
/// [`READY_WITHIN`]) for `ready` on its stdout, then runs `client` for the
/// workload's seconds (killed past them plus [`SLACK`]) and stops the
/// server. Returns the client's exit status, stdout and stderr.
fn server_then_client(
    tool: &'static str,
    server: &mut Command,
    ready: &'static str,
    client: &mut Command,
    w: &Workload,
) -> Result<(ExitStatus, String, String), PeerError> {
    let mut server = ProcessGroup::spawn(tool, server)?;
    let stdout = server.take_stdout().ok_or(PeerError::BadOutput {
        tool,
        why: "server stdout not captured".into(),
    })?;
    if !wait_for_line(stdout, ready, READY_WITHIN) {
        server.kill();
        return Err(PeerError::Timeout {
            tool,
            what: "start its server",
            secs: READY_WITHIN.as_secs_f64(),
        });
    }
    let client = ProcessGroup::spawn(tool, client)?;
    let limit = Duration::from_secs(w.seconds) + SLACK;
    let output = client.wait_output(limit, "finish its test");
    // A one-shot server exits after its client; if not, drop kills it.
    drop(server);
    output
}

impl Iperf3Udp {
    fn binary(&self) -> Result<PathBuf, PeerError> {
        locate(&self.binary, "iperf3", "iperf3")
    }

    fn server_args(port: u16, w: &Workload) -> Vec<String> {
        vec![
            "-s".into(),
            "-1".into(),
            "-B".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            "--forceflush".into(),
            "--idle-timeout".into(),
            (w.seconds + SLACK.as_secs()).to_string(),
        ]
    }

    fn client_args(port: u16, w: &Workload) -> Vec<String> {
        vec![
            "-c".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            "-u".into(),
            "-b".into(),
            "0".into(),
            "-l".into(),
            w.size.to_string(),
            "-t".into(),
            w.seconds.max(1).to_string(),
            "--json".into(),
        ]
    }
}

/// Waits for a line containing `needle` on `stdout`, then keeps draining it
/// in the background so the child never blocks on a full pipe.
fn wait_for_line(stdout: ChildStdout, needle: &'static str, limit: Duration) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut told = false;
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if !told && line.contains(needle) {
                told = true;
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(limit).is_ok()
}

impl Peer for Iperf3Udp {
    fn tool(&self) -> &'static str {
        "iperf3"
    }

    fn package(&self) -> &'static str {
        "iperf3"
    }

    fn metric(&self) -> Metric {
        Metric::Pps
    }

    fn transport(&self) -> &'static str {
        "kernel UDP on 127.0.0.1, one datagram per system call"
    }

    fn commands(&self, w: &Workload) -> Vec<String> {
        vec![
            format!("iperf3 {}", Self::server_args(0, w).join(" ")).replace("-p 0", "-p PORT"),
            format!("iperf3 {}", Self::client_args(0, w).join(" ")).replace("-p 0", "-p PORT"),
        ]
    }

    fn run(&self, w: &Workload) -> Result<PeerFigure, PeerError> {
        let bin = self.binary()?;
        let port = free_port("iperf3")?;
        let (status, out, err) = server_then_client(
            "iperf3",
            Command::new(&bin).args(Self::server_args(port, w)),
            "Server listening",
            Command::new(&bin).args(Self::client_args(port, w)),
            w,
        )?;
        if !status.success() {
            // iperf3 --json reports its errors inside the JSON.
            let why = serde_json::from_str::<Value>(&out)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| tail(&err, 400));
            return Err(PeerError::Failed {
                tool: "iperf3",
                status: status.to_string(),
                stderr: why,
            });
        }
        let r = parse_iperf3_udp(&out)?;
        let mut detail = serde_json::to_value(r).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut detail {
            map.insert("received_pps".into(), r.received_pps().into());
            map.insert("tx_pps".into(), r.sent_pps().into());
        }
        Ok(PeerFigure {
            value: r.received_pps(),
            detail,
        })
    }
}

/// The figures of an iperf3 UDP test (`--json`, client side).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Iperf3UdpResult {
    /// Datagram payload bytes (`-l`).
    pub blksize: u64,
    /// Datagrams the client sent.
    pub sent_packets: u64,
    /// Seconds the client sent for.
    pub sent_seconds: f64,
    /// Datagrams the server counted, received or lost.
    pub server_packets: u64,
    /// Datagrams the server found missing.
    pub lost_packets: u64,
    /// Seconds the server measured.
    pub received_seconds: f64,
    /// Jitter the server measured, ms.
    pub jitter_ms: f64,
}

impl Iperf3UdpResult {
    /// Datagrams received.
    pub fn received_packets(&self) -> u64 {
        self.server_packets.saturating_sub(self.lost_packets)
    }

    /// Datagrams received per second.
    pub fn received_pps(&self) -> f64 {
        if self.received_seconds > 0.0 {
            self.received_packets() as f64 / self.received_seconds
        } else {
            0.0
        }
    }

    /// Datagrams sent per second.
    pub fn sent_pps(&self) -> f64 {
        if self.sent_seconds > 0.0 {
            self.sent_packets as f64 / self.sent_seconds
        } else {
            0.0
        }
    }
}

/// Reads the output of `iperf3 -c … -u --json`.
///
/// Uses `end.sum_sent` and `end.sum_received` (iperf3 3.8 and later), or
/// `end.sum` alone from older versions (then sender and server figures are
/// the same object).
pub fn parse_iperf3_udp(json: &str) -> Result<Iperf3UdpResult, PeerError> {
    let bad = |why: String| PeerError::BadOutput {
        tool: "iperf3",
        why,
    };
    let v: Value = serde_json::from_str(json).map_err(|e| bad(format!("not JSON: {e}")))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(bad(format!("iperf3 reported: {e}")));
    }
    let protocol = v
        .pointer("/start/test_start/protocol")
        .and_then(Value::as_str)
        .unwrap_or("");
    if protocol != "UDP" {
        return Err(bad(format!("a UDP test was expected, got `{protocol}`")));
    }
    let end = v.get("end").ok_or_else(|| bad("no `end` section".into()))?;
    let sum = end.get("sum");
    let sent = end.get("sum_sent").or(sum);
    let received = end.get("sum_received").or(sum);
    let (Some(sent), Some(received)) = (sent, received) else {
        return Err(bad("no `end.sum_sent`/`end.sum_received`/`end.sum`".into()));
    };
    let uint = |o: &Value, k: &str| {
        o.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(format!("`{k}` missing or not a count")))
    };
    let float = |o: &Value, k: &str| {
        o.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| bad(format!("`{k}` missing or not a number")))
    };
    Ok(Iperf3UdpResult {
        blksize: v
            .pointer("/start/test_start/blksize")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        sent_packets: uint(sent, "packets")?,
        sent_seconds: float(sent, "seconds")?,
        server_packets: uint(received, "packets")?,
        lost_packets: uint(received, "lost_packets")?,
        received_seconds: float(received, "seconds")?,
        jitter_ms: float(received, "jitter_ms").unwrap_or(0.0),
    })
}

/// One measurement of a comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Round {
    /// Position in the run, from 0.
    pub order: usize,
    /// `ours` or `peer`.
    pub side: &'static str,
    /// The figure.
    pub value: f64,
    /// Everything else the side reported.
    pub detail: Value,
}

/// Both sides' figures and the ratio.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// The metric compared.
    pub metric: &'static str,
    /// Mean of our rounds.
    pub ours: f64,
    /// Mean of the peer's rounds.
    pub peer: f64,
    /// ours ÷ peer (0 when the peer measured 0).
    pub ratio: f64,
    /// Whether a larger figure is better.
    pub higher_is_better: bool,
    /// Every round in the order run.
    pub rounds: Vec<Round>,
}

/// Our side of a comparison: one measurement of a workload, as the figure
/// and whatever else it reported.
pub type OurSide<'a> = dyn FnMut(&Workload) -> Result<(f64, Value), crate::BenchError> + 'a;

/// Runs our side and `peer` alternately, `rounds` times each (ours first):
/// A B A B …
pub fn compare(
    peer: &dyn Peer,
    w: &Workload,
    rounds: usize,
    ours: &mut OurSide<'_>,
    mut progress: impl FnMut(&Round),
) -> Result<Comparison, crate::BenchError> {
    let mut all = Vec::with_capacity(rounds * 2);
    for _ in 0..rounds.max(1) {
        let (value, detail) = ours(w)?;
        let r = Round {
            order: all.len(),
            side: "ours",
            value,
            detail,
        };
        progress(&r);
        all.push(r);
        let f = peer.run(w)?;
        let r = Round {
            order: all.len(),
            side: "peer",
            value: f.value,
            detail: f.detail,
        };
        progress(&r);
        all.push(r);
    }
    let mean = |side: &str| {
        let v: Vec<f64> = all
            .iter()
            .filter(|r| r.side == side)
            .map(|r| r.value)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let (o, p) = (mean("ours"), mean("peer"));
    Ok(Comparison {
        metric: peer.metric().name(),
        ours: o,
        peer: p,
        ratio: if p > 0.0 { o / p } else { 0.0 },
        higher_is_better: peer.metric().higher_is_better(),
        rounds: all,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that answers from a list, for testing the alternation.
    struct Scripted(std::cell::RefCell<Vec<f64>>);

    impl Peer for Scripted {
        fn tool(&self) -> &'static str {
            "scripted"
        }
        fn package(&self) -> &'static str {
            "none"
        }
        fn metric(&self) -> Metric {
            Metric::Pps
        }
        fn transport(&self) -> &'static str {
            "none"
        }
        fn commands(&self, _: &Workload) -> Vec<String> {
            Vec::new()
        }
        fn run(&self, _: &Workload) -> Result<PeerFigure, PeerError> {
            Ok(PeerFigure {
                value: self.0.borrow_mut().remove(0),
                detail: Value::Null,
            })
        }
    }

    #[test]
    fn a_comparison_alternates_and_divides_the_means() {
        let peer = Scripted(std::cell::RefCell::new(vec![100.0, 300.0]));
        let w = Workload {
            size: 64,
            seconds: 1,
            busy_poll: false,
        };
        let mut ours_values = vec![400.0, 400.0].into_iter();
        let c = compare(
            &peer,
            &w,
            2,
            &mut |_| Ok((ours_values.next().unwrap_or(0.0), Value::Null)),
            |_| {},
        )
        .unwrap();
        let sides: Vec<&str> = c.rounds.iter().map(|r| r.side).collect();
        assert_eq!(sides, ["ours", "peer", "ours", "peer"]);
        assert_eq!((c.ours, c.peer, c.ratio), (400.0, 200.0, 2.0));
        assert_eq!(c.metric, "pps");
    }

    #[test]
    fn the_iperf3_commands_use_loopback_and_bounded_time() {
        let w = Workload {
            size: 64,
            seconds: 3,
            busy_poll: false,
        };
        let c = Iperf3Udp::default().commands(&w);
        assert!(c[0].contains("-s -1 -B 127.0.0.1 -p PORT"), "{c:?}");
        assert!(c[0].contains("--idle-timeout 18"), "{c:?}");
        assert!(
            c[1].contains("-c 127.0.0.1 -p PORT -u -b 0 -l 64 -t 3 --json"),
            "{c:?}"
        );
    }

    #[test]
    fn a_group_that_outlives_its_limit_is_killed() {
        let Some(sleep) = find_tool("sleep") else {
            return;
        };
        let g = ProcessGroup::spawn("sleep", Command::new(sleep).arg("30")).unwrap();
        let pid = g.id();
        let err = g
            .wait_output(Duration::from_millis(50), "finish")
            .unwrap_err();
        assert!(matches!(err, PeerError::Timeout { .. }));
        // The process is gone (reaped): signalling it fails.
        // SAFETY: signal 0 only checks for existence.
        let alive = unsafe { libc::kill(pid as i32, 0) } == 0;
        assert!(!alive);
    }

    #[test]
    fn dropping_a_group_kills_it() {
        let Some(sleep) = find_tool("sleep") else {
            return;
        };
        let g = ProcessGroup::spawn("sleep", Command::new(sleep).arg("30")).unwrap();
        let pid = g.id();
        drop(g);
        // SAFETY: signal 0 only checks for existence.
        assert!(unsafe { libc::kill(pid as i32, 0) } != 0);
    }

    #[test]
    fn a_missing_tool_is_named_with_its_package() {
        let p = Iperf3Udp { binary: None };
        let e = PeerError::Missing {
            tool: p.tool(),
            package: p.package(),
        };
        assert!(e.to_string().contains("Debian package `iperf3`"));
    }
}

/// sockperf ping-pong over UDP on 127.0.0.1 (`sockperf server` and
/// `sockperf ping-pong -m SIZE -t SECONDS`). sockperf reports one-way
/// latency as half the round trip; the figure here is the round trip
/// (twice its median), to compare with ours.
#[derive(Clone, Debug, Default)]
pub struct Sockperf {
    /// The executable; `None` looks up `sockperf` on `PATH`.
    pub binary: Option<PathBuf>,
}

/// The median one-way latency in µs from sockperf's summary lines
/// (`---> percentile 50.000 =    2.048`).
pub fn parse_sockperf_p50_us(out: &str) -> Result<f64, PeerError> {
    out.lines()
        .find_map(|l| {
            let rest = l.split("percentile 50.000").nth(1)?;
            rest.trim_start()
                .strip_prefix('=')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .ok_or(PeerError::BadOutput {
            tool: "sockperf",
            why: "no `percentile 50.000 = …` line".into(),
        })
}

impl Peer for Sockperf {
    fn tool(&self) -> &'static str {
        "sockperf"
    }

    fn package(&self) -> &'static str {
        "sockperf"
    }

    fn metric(&self) -> Metric {
        Metric::RttP50Ns
    }

    fn transport(&self) -> &'static str {
        "kernel UDP on 127.0.0.1, ping-pong, one socket each side (blocking recvfrom, or spinning on a non-blocking one with --busy-poll)"
    }

    fn commands(&self, w: &Workload) -> Vec<String> {
        let nb = if w.busy_poll { " --nonblocked" } else { "" };
        vec![
            format!("sockperf server -i 127.0.0.1 -p PORT{nb}"),
            format!(
                "sockperf ping-pong -i 127.0.0.1 -p PORT -m {} -t {}{nb}",
                w.size,
                w.seconds.max(1)
            ),
        ]
    }

    fn run(&self, w: &Workload) -> Result<PeerFigure, PeerError> {
        let bin = locate(&self.binary, "sockperf", "sockperf")?;
        let port = free_port("sockperf")?.to_string();
        // Non-blocking sockets make sockperf spin on recvfrom, as ours
        // spins when it busy-polls.
        let nonblocked: &[&str] = if w.busy_poll { &["--nonblocked"] } else { &[] };
        let secs = w.seconds.max(1).to_string();
        let size = w.size.to_string();
        let (status, out, err) = server_then_client(
            "sockperf",
            Command::new(&bin)
                .args(["server", "-i", "127.0.0.1", "-p", &port])
                .args(nonblocked),
            "Warmup stage",
            Command::new(&bin)
                .args([
                    "ping-pong",
                    "-i",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-m",
                    &size,
                    "-t",
                    &secs,
                ])
                .args(nonblocked),
            w,
        )?;
        if !status.success() {
            return Err(PeerError::Failed {
                tool: "sockperf",
                status: status.to_string(),
                stderr: tail(&err, 400),
            });
        }
        let one_way_us = parse_sockperf_p50_us(&out).or_else(|_| parse_sockperf_p50_us(&err))?;
        Ok(PeerFigure {
            value: one_way_us * 2.0 * 1000.0,
            detail: serde_json::json!({ "one_way_p50_us": one_way_us, "rtt_p50_ns": one_way_us * 2000.0 }),
        })
    }
}

/// iperf3 over TCP on 127.0.0.1 (`-l SIZE -t SECONDS`): payload Gbit/s
/// the receiver got.
#[derive(Clone, Debug, Default)]
pub struct Iperf3Tcp {
    /// The executable; `None` looks up `iperf3` on `PATH`.
    pub binary: Option<PathBuf>,
}

/// Gbit/s received from iperf3's TCP `--json` output (`end.sum_received`).
pub fn parse_iperf3_tcp_gbps(json: &str) -> Result<f64, PeerError> {
    let bad = |why: &str| PeerError::BadOutput {
        tool: "iperf3",
        why: why.to_owned(),
    };
    let v: Value = serde_json::from_str(json).map_err(|e| bad(&e.to_string()))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return Err(bad(e));
    }
    v.pointer("/end/sum_received/bits_per_second")
        .and_then(Value::as_f64)
        .map(|b| b / 1e9)
        .ok_or_else(|| bad("no end.sum_received.bits_per_second"))
}

impl Peer for Iperf3Tcp {
    fn tool(&self) -> &'static str {
        "iperf3"
    }

    fn package(&self) -> &'static str {
        "iperf3"
    }

    fn metric(&self) -> Metric {
        Metric::Gbps
    }

    fn transport(&self) -> &'static str {
        "kernel TCP on 127.0.0.1"
    }

    fn commands(&self, w: &Workload) -> Vec<String> {
        vec![
            "iperf3 -s -1 -B 127.0.0.1 -p PORT".into(),
            format!(
                "iperf3 -c 127.0.0.1 -p PORT -l {} -t {} --json",
                w.size,
                w.seconds.max(1)
            ),
        ]
    }

    fn run(&self, w: &Workload) -> Result<PeerFigure, PeerError> {
        let bin = locate(&self.binary, "iperf3", "iperf3")?;
        let port = free_port("iperf3")?;
        let gbps = iperf3_tcp(
            &mut Command::new(&bin),
            &mut Command::new(&bin),
            "127.0.0.1",
            port,
            w,
        )?;
        Ok(PeerFigure {
            value: gbps,
            detail: serde_json::json!({ "gbps": gbps }),
        })
    }
}

/// One iperf3 TCP test: `server` and `client` (iperf3 itself, or a
/// command that runs it, in a namespace say) get the arguments of a
/// one-shot server bound to `addr:port` and a client of `w`'s size and
/// seconds; the Gbit/s its receiver got.
pub(crate) fn iperf3_tcp(
    server: &mut Command,
    client: &mut Command,
    addr: &str,
    port: u16,
    w: &Workload,
) -> Result<f64, PeerError> {
    let port = port.to_string();
    let (secs, len) = (w.seconds.max(1).to_string(), w.size.to_string());
    server.args(["-s", "-1", "-B", addr, "-p", &port, "--forceflush"]);
    client.args(["-c", addr, "-p", &port, "-l", &len, "-t", &secs, "--json"]);
    let (status, out, err) = server_then_client("iperf3", server, "Server listening", client, w)?;
    if !status.success() {
        return Err(PeerError::Failed {
            tool: "iperf3",
            status: status.to_string(),
            stderr: tail(&err, 400),
        });
    }
    parse_iperf3_tcp_gbps(&out)
}

#[cfg(test)]
mod more_peer_tests {
    use super::*;

    #[test]
    fn sockperf_median_comes_from_its_percentile_line() {
        let out = "sockperf: ---> percentile 90.000 =    2.192\nsockperf: ---> percentile 50.000 =    2.048\n";
        assert_eq!(parse_sockperf_p50_us(out).unwrap(), 2.048);
        assert!(parse_sockperf_p50_us("sockperf: nothing here").is_err());
        assert!(parse_sockperf_p50_us("percentile 50.000 = x").is_err());
    }

    #[test]
    fn iperf3_tcp_json_gives_received_gbps() {
        let json = r#"{"end":{"sum_sent":{"bits_per_second":2.2e10},"sum_received":{"bits_per_second":2.1e10}}}"#;
        assert_eq!(parse_iperf3_tcp_gbps(json).unwrap(), 21.0);
        assert!(parse_iperf3_tcp_gbps(r#"{"error":"busy"}"#).is_err());
        assert!(parse_iperf3_tcp_gbps("{}").is_err());
    }
}

/// Where DPDK keeps the runtime files of a `--file-prefix` (as root).
pub const DPDK_RUNTIME: &str = "/var/run/dpdk";

/// `dpdk-testpmd --forward-mode=txonly` (or `rxonly`) on two DPDK
/// `net_null` ports (no hardware, no hugepages), one forwarding core:
/// frames transmitted (received) per second, the median of its per-second
/// samples (each summed over the ports; the first period, with start-up,
/// left out).
#[derive(Clone, Debug, Default)]
pub struct Testpmd {
    /// The executable; `None` looks up `dpdk-testpmd` on `PATH`.
    pub binary: Option<PathBuf>,
    /// Receive (`rxonly`: net_null's receive makes 64-byte frames, which
    /// testpmd frees a burst at a time) instead of transmit.
    pub rx: bool,
}

impl Testpmd {
    fn args(&self, prefix: &str, w: &Workload) -> Vec<String> {
        let mut a: Vec<String> = [
            "--no-huge",
            "-m",
            "1024",
            "--no-pci",
            "--file-prefix",
            prefix,
            "--vdev=net_null0",
            "--vdev=net_null1",
            "-l",
            "0,1",
            "--",
            if self.rx {
                "--forward-mode=rxonly"
            } else {
                "--forward-mode=txonly"
            },
            "--total-num-mbufs=16384",
            "-a",
            "--stats-period",
            "1",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        a.push(format!("--txpkts={}", w.size.clamp(64, 1514)));
        a
    }
}

/// The per-second transmit rates in testpmd's periodic statistics: each
/// "Port statistics" period's `Tx-pps:` summed over the ports, the first
/// period left out.
pub fn parse_testpmd_tx_pps(out: &str) -> Vec<f64> {
    parse_testpmd_pps(out, "Tx-pps:")
}

/// The same for `label` (`Tx-pps:` or `Rx-pps:`).
pub fn parse_testpmd_pps(out: &str, label: &str) -> Vec<f64> {
    out.split("Port statistics")
        .skip(2)
        .map(|period| {
            period
                .lines()
                .filter_map(|l| l.split(label).nth(1))
                .filter_map(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .filter(|pps| *pps > 0.0)
        .collect()
}

impl Peer for Testpmd {
    fn tool(&self) -> &'static str {
        "dpdk-testpmd"
    }

    fn package(&self) -> &'static str {
        "dpdk-dev"
    }

    fn metric(&self) -> Metric {
        Metric::Pps
    }

    fn transport(&self) -> &'static str {
        if self.rx {
            "DPDK net_null ports (no hardware), rxonly, one forwarding core"
        } else {
            "DPDK net_null ports (no hardware), txonly, one forwarding core"
        }
    }

    fn commands(&self, w: &Workload) -> Vec<String> {
        vec![format!(
            "dpdk-testpmd {} (stopped with SIGINT after {} statistics periods: start-up, then the seconds measured)",
            self.args("PREFIX", w).join(" "),
            w.seconds + 2
        )]
    }

    fn run(&self, w: &Workload) -> Result<PeerFigure, PeerError> {
        let tool = "dpdk-testpmd";
        let bin = locate(&self.binary, tool, "dpdk-dev")?;
        let prefix = format!("uniplane-testpmd-{}", std::process::id());
        let mut g = ProcessGroup::spawn(tool, Command::new(&bin).args(self.args(&prefix, w)))?;
        let stdout = g.take_stdout().ok_or(PeerError::BadOutput {
            tool,
            why: "no stdout".into(),
        })?;
        // Its first period includes start-up (which takes seconds under
        // load): wait for the workload's seconds of periods after it.
        let (tx, rx) = mpsc::channel::<usize>();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let mut periods = 0;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.contains("Port statistics") {
                    periods += 1;
                    let _ = tx.send(periods);
                }
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        let want = w.seconds as usize + 2;
        let deadline = Instant::now() + Duration::from_secs(w.seconds) + SLACK;
        let mut seen = 0;
        while seen < want {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(n) => seen = n,
                Err(_) => break,
            }
        }
        if let Ok(pgid) = i32::try_from(g.id()) {
            // SAFETY: signalling the process group this run started;
            // testpmd stops its ports and exits on SIGINT.
            unsafe {
                libc::kill(-pgid, libc::SIGINT);
            }
        }
        let stopped = g.wait_output(Duration::from_secs(10), "stop");
        // Its runtime files go whether it stopped or was killed.
        let _ = std::fs::remove_dir_all(Path::new(DPDK_RUNTIME).join(&prefix));
        let (status, _, err) = stopped?;
        let out = reader.join().unwrap_or_default();
        let (label, key) = if self.rx {
            ("Rx-pps:", "rx_pps")
        } else {
            ("Tx-pps:", "tx_pps")
        };
        let samples = parse_testpmd_pps(&out, label);
        if samples.is_empty() {
            return Err(PeerError::Failed {
                tool,
                status: status.to_string(),
                stderr: tail(&format!("{err}\n{out}"), 400),
            });
        }
        let mut sorted = samples.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let median = sorted[sorted.len() / 2];
        Ok(PeerFigure {
            value: median,
            detail: serde_json::json!({ format!("{key}_samples"): samples, key: median }),
        })
    }
}

#[cfg(test)]
mod testpmd_tests {
    use super::*;

    #[test]
    fn testpmd_periods_sum_their_ports_and_skip_the_first() {
        let out = "Port statistics ====\n  Tx-pps:  5\n  Tx-pps:  5\n\
                   Port statistics ====\n  Tx-pps:  100\n  Tx-pps:  200\n\
                   Port statistics ====\n  Tx-pps:  150\n  Tx-pps:  160\n";
        assert_eq!(parse_testpmd_tx_pps(out), vec![300.0, 310.0]);
        assert!(parse_testpmd_tx_pps("nothing").is_empty());
        let rx = "Port statistics ====\n  Rx-pps:  1  Rx-bps: 9\n  Tx-pps:  7\n\
                  Port statistics ====\n  Rx-pps:  40  Rx-bps: 99\n  Rx-pps:  2\n  Tx-pps:  7\n";
        assert_eq!(parse_testpmd_pps(rx, "Rx-pps:"), vec![42.0]);
    }
}
