//! What a run found and measured.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::SimConfig;

/// The first broken invariant of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    /// Virtual time it was found at, in milliseconds.
    pub at_ms: f64,
    /// What broke.
    pub what: String,
}

/// The outcome of one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Servers simulated.
    pub servers: usize,
    /// The command line that repeats the run.
    pub replay: String,
    /// Events processed.
    pub events: u64,
    /// Wall-clock seconds the run took.
    pub wall_s: f64,
    /// Events processed per wall-clock second.
    pub events_per_sec: f64,
    /// Virtual time simulated, in milliseconds.
    pub sim_ms: f64,
    /// A hash of every event and decision, in order: equal for equal runs.
    pub trace_hash: String,
    /// The broken invariant, if one was found (the run stops there).
    pub violation: Option<Violation>,
    /// Crashes injected.
    pub crashes: u64,
    /// Partitions injected.
    pub partitions: u64,
    /// Time from each crash until every surviving neighbour's state was
    /// consistent again (milliseconds).
    pub convergence: Vec<f64>,
    /// Connections set up to a peer server.
    pub remote_setups: u64,
    /// Connections set up within one server.
    pub local_setups: u64,
    /// Connect requests answered with success.
    pub connected: u64,
    /// Connect requests refused, in all.
    pub refused: u64,
    /// Refusals by kind.
    pub refusals: BTreeMap<String, u64>,
    /// Sum of connect latencies (request to answer), nanoseconds.
    pub connect_latency_ns: u64,
    /// Peer messages and tunnel opens that set connections up (connect,
    /// verdict, tunnel open).
    pub setup_msgs: u64,
    /// Peer close messages.
    pub close_msgs: u64,
    /// Heartbeats sent.
    pub heartbeats: u64,
    /// Data messages sent by clients.
    pub sent: u64,
    /// Data messages delivered to listeners.
    pub delivered: u64,
    /// Error answers that came back to senders.
    pub error_answers: u64,
    /// Messages that left a plane through a port nobody holds.
    pub dropped_at_plane: u64,
    /// Packets the wire lost (and the transport sent again).
    pub retransmissions: u64,
    /// Connections to a crashed server checked for their notice at the
    /// deadline.
    pub notify_checks: u64,
    /// Plane-against-core state checks made.
    pub state_checks: u64,
}

impl Report {
    /// An empty report for `config`.
    pub fn new(config: &SimConfig) -> Report {
        Report {
            seed: config.seed,
            servers: config.servers,
            replay: config.replay_command(),
            ..Report::default()
        }
    }

    /// Works out the rates once the counts are in.
    pub fn finish(&mut self) {
        self.events_per_sec = if self.wall_s > 0.0 {
            self.events as f64 / self.wall_s
        } else {
            0.0
        };
    }

    /// Setup messages per connection set up to a peer.
    pub fn control_msgs_per_setup(&self) -> f64 {
        if self.remote_setups == 0 {
            0.0
        } else {
            self.setup_msgs as f64 / self.remote_setups as f64
        }
    }

    /// The longest convergence after a crash, in milliseconds.
    pub fn convergence_ms(&self) -> Option<f64> {
        self.convergence.iter().copied().reduce(f64::max)
    }
}
