//! Chains: a kernel device that sends what it computes on to a next
//! device (`next` in the configuration) does so over a connection the
//! core keeps open for it — set up once the device is attached, set up
//! again while it is down (the next device's server not up yet, a peer
//! that failed, a rule that refused it), every [`CHAIN_RETRY`]. The
//! driver learns of each change by [`Action::Chain`].

use super::*;
use crate::config::CHAIN_PORT;

/// How long a chain that could not be set up waits before the next try.
pub const CHAIN_RETRY: Duration = Duration::from_secs(1);

/// The session and request a chain's set-up is made under: the driver
/// numbers its own from 1, so these are answered to nobody.
pub(super) const CHAIN_SESSION: SessionId = 0;
const CHAIN_REQUEST: RequestId = 0;

/// One chained device's state.
#[derive(Clone, Debug, Default)]
pub(super) struct ChainState {
    /// Last reported to the driver as installed.
    up: bool,
    /// When to try again while not installed.
    next_try: Duration,
    /// The last refusal, logged once rather than every try.
    refused: Option<String>,
}

impl Control {
    /// The connection of the `i`th configured device's chain, once the
    /// device is attached.
    fn chain_key(&self, i: usize) -> Option<(ConnKey, u8)> {
        let d = &self.config.devices[i];
        let next = d.next?;
        let uid = self.resources.values().find(|r| r.name == d.name)?.uid;
        Some((
            ConnKey {
                src: uid,
                src_port: CHAIN_PORT,
                dst: next.uid,
                dst_port: CHAIN_PORT,
            },
            next.class,
        ))
    }

    /// Reports chains that came up or went down, and sets up those that
    /// are down and due. Only between batches: what a batch installs is
    /// up once it is done.
    pub(super) fn chains(&mut self) {
        if self.stopping {
            return;
        }
        for i in 0..self.config.devices.len() {
            if self.job.is_some() {
                return;
            }
            let Some((key, class)) = self.chain_key(i) else {
                continue;
            };
            let up = self.connections.contains_key(&key);
            let now = self.now;
            let state = self.chains.entry(i).or_default();
            if up != state.up {
                state.up = up;
                if up {
                    state.refused = None;
                    tracing::info!(from = %key.src, to = %key.dst, "chain up");
                } else {
                    tracing::warn!(from = %key.src, to = %key.dst, "chain down");
                }
                self.actions.push_back(Action::Chain {
                    device: key.src,
                    conn: key,
                    up,
                });
            }
            if up || self.pending.contains_key(&key) || state.next_try > now {
                continue;
            }
            state.next_try = now + CHAIN_RETRY;
            let peer = (key.dst.server() != self.config.server).then(|| key.dst.server());
            let tried = self
                .class_allowed(class, peer)
                .and_then(|()| self.connect(CHAIN_SESSION, CHAIN_REQUEST, key, class));
            if let Err(e) = tried {
                let e = e.to_string();
                let state = self.chains.entry(i).or_default();
                if state.refused.as_deref() != Some(e.as_str()) {
                    tracing::warn!(from = %key.src, to = %key.dst, "chain not set up: {e} (retried every {CHAIN_RETRY:?})");
                    state.refused = Some(e);
                }
            }
        }
    }

    /// Makes every chain that is down due now (a peer came up).
    pub(super) fn chains_due(&mut self) {
        let now = self.now;
        for s in self.chains.values_mut().filter(|s| !s.up) {
            s.next_try = now;
        }
    }

    /// When a chain that is down is next due for a try.
    pub(super) fn chain_timeout(&self) -> Option<Duration> {
        if self.stopping {
            return None;
        }
        self.chains
            .iter()
            .filter(|(i, s)| {
                !s.up
                    && self
                        .chain_key(**i)
                        .is_some_and(|(k, _)| !self.pending.contains_key(&k))
            })
            .map(|(_, s)| s.next_try)
            .min()
    }
}
