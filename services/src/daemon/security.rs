//! What the daemon refused from outside, counted, and logged at a bounded
//! rate: a flood of forged handshakes or frames costs a counter increment
//! each, never a log line each.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Counters of refusals, exported as metrics.
pub(super) struct Security {
    /// Peer-channel handshakes or sealed lines refused.
    pub peer_refused: AtomicU64,
    /// Tunnel handshakes refused.
    pub tunnel_refused: AtomicU64,
    /// Tunnel frames whose tag failed.
    pub frames_bad_tag: AtomicU64,
    /// Tunnel frames seen before (replayed) or too old to tell.
    pub frames_replayed: AtomicU64,
    /// Tunnel frames naming a source that is not on the tunnel's server.
    pub frames_foreign_source: AtomicU64,
    /// Tunnel frames too short to carry a seal.
    pub frames_unsealed: AtomicU64,
    /// Tunnel frames sealed and handed to a stack.
    pub frames_sealed: AtomicU64,
    /// Tunnel frames opened and believed.
    pub frames_opened: AtomicU64,
    started: Instant,
    /// Second (since `started`) of the last warning logged.
    last_warning: AtomicU64,
}

impl Security {
    pub fn new() -> Security {
        Security {
            peer_refused: AtomicU64::new(0),
            tunnel_refused: AtomicU64::new(0),
            frames_bad_tag: AtomicU64::new(0),
            frames_replayed: AtomicU64::new(0),
            frames_foreign_source: AtomicU64::new(0),
            frames_unsealed: AtomicU64::new(0),
            frames_sealed: AtomicU64::new(0),
            frames_opened: AtomicU64::new(0),
            started: Instant::now(),
            last_warning: AtomicU64::new(u64::MAX),
        }
    }

    /// Whether a warning may be logged now: at most one a second.
    fn may_warn(&self) -> bool {
        let now = self.started.elapsed().as_secs();
        let last = self.last_warning.load(Relaxed);
        last != now && self.last_warning.swap(now, Relaxed) != now
    }

    /// A peer channel refused.
    pub fn refuse_peer(&self, who: &str, why: &str) {
        self.peer_refused.fetch_add(1, Relaxed);
        if self.may_warn() {
            tracing::warn!(
                from = who,
                "peer channel refused: {why} (further refusals this second are only counted)"
            );
        } else {
            tracing::debug!(from = who, "peer channel refused: {why}");
        }
    }

    /// A tunnel refused.
    pub fn refuse_tunnel(&self, who: &str, why: &str) {
        self.tunnel_refused.fetch_add(1, Relaxed);
        if self.may_warn() {
            tracing::warn!(
                from = who,
                "tunnel refused: {why} (further refusals this second are only counted)"
            );
        } else {
            tracing::debug!(from = who, "tunnel refused: {why}");
        }
    }

    /// Every counter, with its metric name and help.
    pub fn metrics(&self) -> [(&'static str, &'static str, u64); 8] {
        [
            (
                "uniplane_peer_refused_total",
                "Peer-channel handshakes or sealed lines refused.",
                self.peer_refused.load(Relaxed),
            ),
            (
                "uniplane_tunnel_refused_total",
                "Tunnel handshakes refused.",
                self.tunnel_refused.load(Relaxed),
            ),
            (
                "uniplane_tunnel_frames_bad_tag_total",
                "Tunnel frames dropped: authentication failed.",
                self.frames_bad_tag.load(Relaxed),
            ),
            (
                "uniplane_tunnel_frames_replayed_total",
                "Tunnel frames dropped: replayed or older than the replay window.",
                self.frames_replayed.load(Relaxed),
            ),
            (
                "uniplane_tunnel_frames_foreign_source_total",
                "Tunnel frames dropped: source UID not on the tunnel's server.",
                self.frames_foreign_source.load(Relaxed),
            ),
            (
                "uniplane_tunnel_frames_unsealed_total",
                "Tunnel frames dropped: no seal.",
                self.frames_unsealed.load(Relaxed),
            ),
            (
                "uniplane_tunnel_frames_sealed_total",
                "Tunnel frames sealed for a stack.",
                self.frames_sealed.load(Relaxed),
            ),
            (
                "uniplane_tunnel_frames_opened_total",
                "Tunnel frames opened and believed.",
                self.frames_opened.load(Relaxed),
            ),
        ]
    }
}
