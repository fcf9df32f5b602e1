//! The naming service: names of resources and the servers of a cluster,
//! kept in a shared directory (etcd) so that any daemon and any client can
//! resolve a name to a UID.
//!
//! The decisions live in [`Claims`], a sans-IO state machine on virtual
//! time: which keys this daemon must hold in the directory, under which
//! lease, what to do when a claim is refused or the lease is lost, and how
//! long to wait before trying again. [`etcd`] carries out its actions
//! against an etcd cluster and feeds the outcomes back.
//!
//! ```text
//!  want(key, value) / drop(key) ─┐           ┌─► GrantLease / KeepAlive(lease)
//!  lease granted / failed ───────┤  Claims   ├─► Claim(key, value, lease) — create if absent
//!  kept alive / failed ──────────┤           ├─► Release(key)
//!  claimed / taken / failed ─────┘           └─► Answer(waiter, result)
//! ```
//!
//! Every key this daemon writes is attached to its one lease: when the
//! daemon dies, the lease runs out and its server record and names go
//! with it. A claim is a transaction that creates the key only if it does
//! not exist, so two daemons never hold the same name — and since a UID
//! is a server ID plus a device number, the server record (claimed the
//! same way) makes every UID of that server this daemon's alone.
//!
//! When the directory cannot be reached, what was claimed stays claimed
//! here as long as the lease can still be alive (its TTL from the last
//! keep-alive the directory answered); established connections never
//! depend on it. A new claim that asks for an answer fails at once with
//! [`NamingError::Unavailable`] instead of waiting. When the lease is
//! known lost, every held claim goes back to unclaimed and is claimed
//! again under a new lease once the directory answers — where another
//! daemon took a name meanwhile, the claim becomes a conflict, shown and
//! retried, never a second owner.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

pub mod etcd;
pub mod roster;

/// Why a naming request failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NamingError {
    /// The directory is not reachable (or has no quorum) now.
    #[error("the naming service is unreachable: {0}")]
    Unavailable(String),
    /// Another owner holds the name.
    #[error("`{name}` is held by {holder}")]
    Taken {
        /// The name.
        name: String,
        /// Who holds it (as the directory says).
        holder: String,
    },
    /// No such name.
    #[error("no resource is named `{0}`")]
    NotFound(String),
    /// The name cannot be used.
    #[error("bad name `{name}`: {why}")]
    BadName {
        /// The name.
        name: String,
        /// Why.
        why: &'static str,
    },
    /// This daemon runs with the local registry only.
    #[error("this daemon has no naming service (registry = \"local\")")]
    Local,
}

impl NamingError {
    /// The stable word the control protocol puts in its error answers.
    pub fn kind(&self) -> &'static str {
        match self {
            NamingError::Unavailable(_) => "unavailable",
            NamingError::Taken { .. } => "exists",
            NamingError::NotFound(_) => "not-found",
            NamingError::BadName { .. } => "bad-request",
            NamingError::Local => "unsupported",
        }
    }
}

/// Longest name a resource may claim.
pub const MAX_NAME: usize = 128;

/// Checks a name a client asks to claim: printable, no `/` (keys are
/// paths), not empty, bounded.
pub fn check_name(name: &str) -> Result<(), NamingError> {
    let bad = |why| {
        Err(NamingError::BadName {
            name: name.chars().take(MAX_NAME).collect(),
            why,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_NAME {
        return bad("longer than 128 bytes");
    }
    if name.contains('/') {
        return bad("contains `/`");
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("contains white space or control characters");
    }
    Ok(())
}

/// Names a request waiting for the outcome of a claim.
pub type Waiter = u64;

/// A directory lease.
pub type LeaseId = i64;

/// An input to [`Claims`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamingEvent {
    /// Hold `key` with `value`. The waiter, if any, hears the first
    /// outcome (held, taken, or unavailable). A claim that is not `kept`
    /// is forgotten when it fails (a client's name: the client hears why);
    /// a `kept` one is retried until it is held (the server record, the
    /// devices' names).
    Want {
        /// The key, relative to the directory prefix.
        key: String,
        /// Its value.
        value: String,
        /// Who waits for the outcome.
        waiter: Option<Waiter>,
        /// Whether it is retried after a failure.
        keep: bool,
    },
    /// Stop holding `key` (its owner went away).
    Drop {
        /// The key.
        key: String,
    },
    /// The directory granted a lease of `ttl`.
    LeaseGranted {
        /// The lease.
        lease: LeaseId,
        /// Its time to live.
        ttl: Duration,
    },
    /// Asking for a lease failed.
    LeaseFailed {
        /// What the directory or the network said.
        error: String,
    },
    /// The lease was renewed: it lives `ttl` from now.
    KeptAlive {
        /// The lease.
        lease: LeaseId,
        /// Its time to live from now.
        ttl: Duration,
    },
    /// Renewing failed; `gone` when the directory said the lease no
    /// longer exists (it expired), not merely that it could not be asked.
    KeepAliveFailed {
        /// The lease.
        lease: LeaseId,
        /// Whether the lease is known gone.
        gone: bool,
        /// Why.
        error: String,
    },
    /// The outcome of a [`NamingAction::Claim`].
    Claimed {
        /// The key.
        key: String,
        /// The lease it was claimed under.
        lease: LeaseId,
        /// Held; taken by someone else (their value); or the directory
        /// could not be asked.
        outcome: ClaimOutcome,
    },
}

/// What the directory answered to a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key is ours.
    Held,
    /// Someone else holds it; their value.
    Taken(String),
    /// The directory could not be asked.
    Failed(String),
}

/// An output of [`Claims`], for the driver to carry out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamingAction {
    /// Ask for a lease of `ttl`.
    GrantLease {
        /// Its time to live.
        ttl: Duration,
    },
    /// Renew the lease.
    KeepAlive {
        /// The lease.
        lease: LeaseId,
    },
    /// Create `key` = `value` under `lease` if the key does not exist (or
    /// already holds this value under this lease, or is still attached
    /// to `previous`, this daemon's lease before it was lost), and report
    /// [`NamingEvent::Claimed`].
    Claim {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// The lease.
        lease: LeaseId,
        /// This daemon's lost lease, whose keys it takes back.
        previous: Option<LeaseId>,
    },
    /// Delete `key` if it is still ours (held under `lease`).
    Release {
        /// The key.
        key: String,
        /// The lease it was held under.
        lease: LeaseId,
    },
    /// The outcome of a claim somebody waits for.
    Answer {
        /// Who waits.
        waiter: Waiter,
        /// Held, or why not.
        result: Result<(), NamingError>,
    },
}

/// How a key stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimState {
    /// To be claimed once there is a lease (and no back-off).
    Unclaimed,
    /// A claim is in flight.
    Claiming,
    /// Ours, under the current lease.
    Held,
    /// Someone else holds it (their value); retried after a back-off.
    Conflict(String),
}

#[derive(Clone, Debug)]
struct Want {
    value: String,
    state: ClaimState,
    waiter: Option<Waiter>,
    keep: bool,
    /// Not before this (after a conflict or a failure).
    retry_at: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
    /// None; ask at `retry_at`.
    None { retry_at: Duration },
    /// Asked for.
    Granting,
    /// Held; renew at `renew_at`; it may be gone after `expires_at`.
    Held {
        id: LeaseId,
        renew_at: Duration,
        expires_at: Duration,
        renewing: bool,
    },
}

/// How the naming service stands, for `uniplane cluster status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamingView {
    /// The lease and how long it has left, if one is held.
    pub lease: Option<(LeaseId, Duration)>,
    /// The last error the directory gave, if the last exchange failed.
    pub error: Option<String>,
    /// Every key this daemon wants, its value and state.
    pub keys: Vec<(String, String, ClaimState)>,
}

/// Tuning of [`Claims`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimsConfig {
    /// The lease's time to live.
    pub ttl: Duration,
    /// First back-off after a failure; doubles up to `max_backoff`.
    pub backoff: Duration,
    /// Longest back-off.
    pub max_backoff: Duration,
    /// Most keys this daemon holds (names claimed by clients count).
    pub max_keys: usize,
}

impl Default for ClaimsConfig {
    fn default() -> Self {
        ClaimsConfig {
            ttl: Duration::from_secs(5),
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            max_keys: 4096,
        }
    }
}

/// The naming decisions of one daemon (see the module documentation).
#[derive(Debug)]
pub struct Claims {
    config: ClaimsConfig,
    now: Duration,
    lease: Lease,
    wanted: BTreeMap<String, Want>,
    /// The lease this daemon held before it was lost: the directory may
    /// not have dropped it yet, and keys still attached to it are ours.
    previous: Option<LeaseId>,
    /// Consecutive failures, for the back-off.
    failures: u32,
    error: Option<String>,
    actions: VecDeque<NamingAction>,
}

impl Claims {
    /// A daemon's claims, holding nothing yet.
    pub fn new(config: ClaimsConfig) -> Claims {
        Claims {
            config,
            now: Duration::ZERO,
            lease: Lease::None {
                retry_at: Duration::ZERO,
            },
            wanted: BTreeMap::new(),
            previous: None,
            failures: 0,
            error: None,
            actions: VecDeque::new(),
        }
    }

    /// Takes one input at `now`.
    pub fn handle(&mut self, event: NamingEvent, now: Duration) {
        self.now = self.now.max(now);
        match event {
            NamingEvent::Want {
                key,
                value,
                waiter,
                keep,
            } => self.want(key, value, waiter, keep),
            NamingEvent::Drop { key } => {
                if let Some(w) = self.wanted.remove(&key) {
                    if let (ClaimState::Held, Lease::Held { id, .. }) = (&w.state, self.lease) {
                        self.actions
                            .push_back(NamingAction::Release { key, lease: id });
                    }
                    if let Some(waiter) = w.waiter {
                        self.answer(waiter, Err(NamingError::NotFound("dropped".into())));
                    }
                }
            }
            NamingEvent::LeaseGranted { lease, ttl } => {
                if self.lease == Lease::Granting {
                    self.succeeded();
                    self.lease = Lease::Held {
                        id: lease,
                        renew_at: self.now + ttl / 3,
                        expires_at: self.now + ttl,
                        renewing: false,
                    };
                }
            }
            NamingEvent::LeaseFailed { error } => {
                if self.lease == Lease::Granting {
                    let retry_at = self.failed(error);
                    self.lease = Lease::None { retry_at };
                    self.fail_waiters();
                }
            }
            NamingEvent::KeptAlive { lease, ttl } => {
                if let Lease::Held { id, .. } = self.lease {
                    if id == lease {
                        self.succeeded();
                        self.lease = Lease::Held {
                            id,
                            renew_at: self.now + ttl / 3,
                            expires_at: self.now + ttl,
                            renewing: false,
                        };
                    }
                }
            }
            NamingEvent::KeepAliveFailed { lease, gone, error } => {
                if let Lease::Held { id, expires_at, .. } = self.lease {
                    if id == lease {
                        let retry_at = self.failed(error);
                        if gone || self.now >= expires_at {
                            self.lose_lease(retry_at);
                        } else {
                            // Try again soon; the lease may still be alive.
                            self.lease = Lease::Held {
                                id,
                                renew_at: retry_at.min(expires_at),
                                expires_at,
                                renewing: false,
                            };
                        }
                        self.fail_waiters();
                    }
                }
            }
            NamingEvent::Claimed {
                key,
                lease,
                outcome,
            } => self.claimed(key, lease, outcome),
        }
        self.step();
    }

    /// Acts on time passing.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.now = self.now.max(now);
        if let Lease::Held { expires_at, .. } = self.lease {
            if self.now >= expires_at {
                let retry_at = self.now;
                self.error
                    .get_or_insert_with(|| "the lease ran out unrenewed".into());
                self.lose_lease(retry_at);
            }
        }
        self.step();
    }

    /// When [`Claims::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let lease = match self.lease {
            // Nothing to hold: no lease is asked for, no wake-up needed.
            Lease::None { .. } if self.wanted.is_empty() => None,
            Lease::None { retry_at } => Some(retry_at),
            Lease::Granting => None,
            Lease::Held {
                renew_at,
                expires_at,
                renewing,
                ..
            } => Some(if renewing {
                expires_at
            } else {
                renew_at.min(expires_at)
            }),
        };
        let held = matches!(self.lease, Lease::Held { .. });
        let retry = self
            .wanted
            .values()
            .filter(|w| held && matches!(w.state, ClaimState::Unclaimed | ClaimState::Conflict(_)))
            .map(|w| w.retry_at)
            .min();
        match (lease, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next thing to do.
    pub fn poll_action(&mut self) -> Option<NamingAction> {
        self.actions.pop_front()
    }

    /// The state, for listings.
    pub fn view(&self) -> NamingView {
        NamingView {
            lease: match self.lease {
                Lease::Held { id, expires_at, .. } => {
                    Some((id, expires_at.saturating_sub(self.now)))
                }
                _ => None,
            },
            error: self.error.clone(),
            keys: self
                .wanted
                .iter()
                .map(|(k, w)| (k.clone(), w.value.clone(), w.state.clone()))
                .collect(),
        }
    }

    /// The state of `key`, if it is wanted.
    pub fn state(&self, key: &str) -> Option<&ClaimState> {
        self.wanted.get(key).map(|w| &w.state)
    }

    fn want(&mut self, key: String, value: String, waiter: Option<Waiter>, keep: bool) {
        if let Some(w) = self.wanted.get(&key) {
            // The same claim again is answered by how it stands; another
            // value for a key we hold is someone else's business.
            let result = match (&w.state, w.value == value) {
                (ClaimState::Held, true) => Ok(()),
                _ => Err(NamingError::Taken {
                    name: key.clone(),
                    holder: w.value.clone(),
                }),
            };
            if let Some(waiter) = waiter {
                self.answer(waiter, result);
            }
            return;
        }
        if self.wanted.len() >= self.config.max_keys {
            if let Some(waiter) = waiter {
                self.answer(
                    waiter,
                    Err(NamingError::Unavailable(format!(
                        "this daemon holds {} names already",
                        self.config.max_keys
                    ))),
                );
            }
            return;
        }
        let mut waiter = waiter;
        if self.error.is_some() && !matches!(self.lease, Lease::Held { .. }) {
            // The directory is known unreachable: say so now.
            if let Some(w) = waiter.take() {
                let error = self.error.clone().unwrap_or_default();
                self.answer(w, Err(NamingError::Unavailable(error)));
                if !keep {
                    return;
                }
            }
        }
        self.wanted.insert(
            key,
            Want {
                value,
                state: ClaimState::Unclaimed,
                waiter,
                keep,
                retry_at: self.now,
            },
        );
    }

    fn claimed(&mut self, key: String, lease: LeaseId, outcome: ClaimOutcome) {
        let current = match self.lease {
            Lease::Held { id, .. } => Some(id),
            _ => None,
        };
        let Some(w) = self.wanted.get_mut(&key) else {
            // Dropped while the claim was in flight: give it back.
            if outcome == ClaimOutcome::Held {
                self.actions.push_back(NamingAction::Release { key, lease });
            }
            return;
        };
        if w.state != ClaimState::Claiming {
            return;
        }
        if current != Some(lease) {
            // Claimed under a lease that is gone: claim again.
            w.state = ClaimState::Unclaimed;
            return;
        }
        let waiter = w.waiter.take();
        match outcome {
            ClaimOutcome::Held => {
                w.state = ClaimState::Held;
                self.succeeded();
                if let Some(waiter) = waiter {
                    self.answer(waiter, Ok(()));
                }
            }
            ClaimOutcome::Taken(holder) => {
                let result = Err(NamingError::Taken {
                    name: key.clone(),
                    holder: holder.clone(),
                });
                tracing::warn!(%key, %holder, kept = w.keep, "naming: the key is held by another owner");
                if w.keep {
                    w.state = ClaimState::Conflict(holder);
                    w.retry_at = self.now + self.config.max_backoff;
                } else {
                    self.wanted.remove(&key);
                }
                if let Some(waiter) = waiter {
                    self.answer(waiter, result);
                }
            }
            ClaimOutcome::Failed(error) => {
                let retry_at = self.failed(error.clone());
                let w = self.wanted.get_mut(&key).expect("present above");
                if w.keep {
                    w.state = ClaimState::Unclaimed;
                    w.retry_at = retry_at;
                } else {
                    self.wanted.remove(&key);
                }
                if let Some(waiter) = waiter {
                    self.answer(waiter, Err(NamingError::Unavailable(error)));
                }
            }
        }
    }

    /// Issues what the state calls for now.
    fn step(&mut self) {
        match self.lease {
            Lease::None { retry_at } => {
                if !self.wanted.is_empty() && self.now >= retry_at {
                    self.lease = Lease::Granting;
                    self.actions.push_back(NamingAction::GrantLease {
                        ttl: self.config.ttl,
                    });
                }
            }
            Lease::Granting => {}
            Lease::Held {
                id,
                renew_at,
                expires_at,
                renewing,
            } => {
                if !renewing && self.now >= renew_at {
                    self.lease = Lease::Held {
                        id,
                        renew_at,
                        expires_at,
                        renewing: true,
                    };
                    self.actions
                        .push_back(NamingAction::KeepAlive { lease: id });
                }
                let now = self.now;
                let previous = self.previous;
                for (key, w) in self.wanted.iter_mut() {
                    let due = match w.state {
                        ClaimState::Unclaimed | ClaimState::Conflict(_) => w.retry_at <= now,
                        _ => false,
                    };
                    if due {
                        w.state = ClaimState::Claiming;
                        self.actions.push_back(NamingAction::Claim {
                            key: key.clone(),
                            value: w.value.clone(),
                            lease: id,
                            previous,
                        });
                    }
                }
            }
        }
    }

    fn lose_lease(&mut self, retry_at: Duration) {
        tracing::warn!("naming: the lease is lost; claiming again under a new one");
        if let Lease::Held { id, .. } = self.lease {
            self.previous = Some(id);
        }
        self.lease = Lease::None { retry_at };
        for w in self.wanted.values_mut() {
            if matches!(w.state, ClaimState::Held | ClaimState::Claiming) {
                w.state = ClaimState::Unclaimed;
                w.retry_at = retry_at;
            }
        }
    }

    /// Answers every waiter whose claim has not gone out yet: the
    /// directory is unreachable now.
    fn fail_waiters(&mut self) {
        let error = self.error.clone().unwrap_or_default();
        let waiting: Vec<String> = self
            .wanted
            .iter()
            .filter(|(_, w)| w.waiter.is_some() && w.state == ClaimState::Unclaimed)
            .map(|(k, _)| k.clone())
            .collect();
        for key in waiting {
            let Some(w) = self.wanted.get_mut(&key) else {
                continue;
            };
            let waiter = w.waiter.take().expect("filtered");
            if !w.keep {
                self.wanted.remove(&key);
            }
            self.answer(waiter, Err(NamingError::Unavailable(error.clone())));
        }
    }

    fn failed(&mut self, error: String) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.error = Some(error);
        let factor = 1u32 << self.failures.saturating_sub(1).min(10);
        self.now + (self.config.backoff * factor).min(self.config.max_backoff)
    }

    fn succeeded(&mut self) {
        self.failures = 0;
        self.error = None;
    }

    fn answer(&mut self, waiter: Waiter, result: Result<(), NamingError>) {
        self.actions
            .push_back(NamingAction::Answer { waiter, result });
    }
}

#[cfg(test)]
mod tests;
