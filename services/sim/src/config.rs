//! What one simulated run is: the fabric, the workload, the faults, the
//! timing, and the seed that picks every random choice.

use std::fmt::Write as _;
use std::time::Duration;

/// What the clients do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Each client opens connections to random neighbours, sends on each,
    /// closes it, and opens the next.
    Churn,
    /// Each client connects to every neighbour and streams to each.
    AllToAll,
    /// A ring exchange like allreduce: each server sends a chunk to its
    /// successor once it has the previous chunk from its predecessor.
    Collective,
}

/// A kind of fault the run injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Servers crash (losing every state) and restart.
    Crash,
    /// Links between two servers, or all of one server's, are cut for a
    /// while.
    Partition,
    /// The wire loses packets (the transport retransmits after a timeout).
    Loss,
    /// The wire delays packets by random amounts (the transport puts them
    /// back in order).
    Reorder,
}

/// A defect planted in the simulated tunnels, to show the checker sees
/// what it is meant to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bug {
    /// A tunnel now and then delivers a message twice.
    Duplicate,
    /// A tunnel now and then drops a message and tells nobody.
    Drop,
    /// A tunnel now and then swaps two messages.
    Reorder,
}

/// One run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Servers in the fabric.
    pub servers: usize,
    /// The seed of every random choice.
    pub seed: u64,
    /// Connections each server's client sets up (churn) or keeps per
    /// neighbour (all-to-all, collective: rounds).
    pub connections: usize,
    /// What the clients do.
    pub workload: Workload,
    /// Faults injected.
    pub faults: Vec<Fault>,
    /// Crashes, when crashes are injected.
    pub crashes: usize,
    /// Partitions, when partitions are injected.
    pub partitions: usize,
    /// Loss probability per packet, when loss is injected.
    pub loss: f64,
    /// Largest extra delay per packet, when reordering is injected.
    pub jitter: Duration,
    /// Neighbours of each server (peers with a channel and tunnels).
    pub degree: usize,
    /// Messages each connection carries.
    pub messages: u32,
    /// Connections a client has in flight at once.
    pub window: usize,
    /// Longest time a client keeps a connection open once its messages
    /// are delivered (each keeps it a random time up to this).
    pub hold: Duration,
    /// Whether each server runs the overlay engine (else its connectors
    /// alone decide each message).
    pub engine: bool,
    /// One-way latency of every link.
    pub latency: Duration,
    /// Link bandwidth in bits per second.
    pub bandwidth: u64,
    /// Heartbeat interval of the control cores.
    pub heartbeat: Duration,
    /// Heartbeats missed before a peer is declared failed.
    pub misses: u32,
    /// How long a peer has to answer a connection request.
    pub verdict_timeout: Duration,
    /// Check a server's plane against its core after every n-th batch.
    pub check_every: u32,
    /// A planted defect.
    pub bug: Option<Bug>,
}

impl SimConfig {
    /// A run of `servers` servers from `seed` with the defaults: churn of
    /// 8 connections per server, no faults, 8 neighbours, the engine.
    pub fn new(servers: usize, seed: u64) -> SimConfig {
        SimConfig {
            servers,
            seed,
            connections: 8,
            workload: Workload::Churn,
            faults: Vec::new(),
            crashes: 1,
            partitions: 1,
            loss: 0.01,
            jitter: Duration::from_micros(30),
            degree: 8,
            messages: 4,
            window: 4,
            hold: Duration::from_millis(20),
            engine: true,
            latency: Duration::from_micros(20),
            bandwidth: 10_000_000_000,
            heartbeat: Duration::from_millis(10),
            misses: 4,
            verdict_timeout: Duration::from_millis(200),
            check_every: 1,
            bug: None,
        }
    }

    /// Whether `f` is injected.
    pub fn has(&self, f: Fault) -> bool {
        self.faults.contains(&f)
    }

    /// Silence after which a peer is declared failed.
    pub fn failure_after(&self) -> Duration {
        self.heartbeat * self.misses.max(1)
    }

    /// How long after a crash every connection to the dead server must
    /// have been notified: the failure detector's silence, one heartbeat
    /// of phase, and a plane batch and a link latency of slack.
    pub fn notify_within(&self) -> Duration {
        self.failure_after() + self.heartbeat + self.latency * 4 + Duration::from_millis(1)
    }

    /// The command line that repeats this run.
    pub fn replay_command(&self) -> String {
        let mut c = format!(
            "uniplane-sim --servers {} --seed {} --connections {} --workload {} --degree {} --messages {} --window {} --hold-us {}",
            self.servers,
            self.seed,
            self.connections,
            value(self.workload),
            self.degree,
            self.messages,
            self.window,
            self.hold.as_micros(),
        );
        if !self.faults.is_empty() {
            let f: Vec<String> = self.faults.iter().map(|f| value(*f)).collect();
            let _ = write!(
                c,
                " --faults {} --crashes {} --partitions {} --loss {} --jitter-us {}",
                f.join(","),
                self.crashes,
                self.partitions,
                self.loss,
                self.jitter.as_micros()
            );
        }
        let _ = write!(
            c,
            " --latency-us {} --heartbeat-ms {} --misses {} --check-every {}",
            self.latency.as_micros(),
            self.heartbeat.as_millis(),
            self.misses,
            self.check_every
        );
        if !self.engine {
            c.push_str(" --no-engine");
        }
        if let Some(b) = self.bug {
            let _ = write!(c, " --bug {}", value(b));
        }
        c
    }
}

fn value<T: clap::ValueEnum>(v: T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}
