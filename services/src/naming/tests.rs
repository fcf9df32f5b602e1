//! The naming decisions on virtual time, against a model directory.

use std::collections::BTreeMap;

use super::*;

const MS: Duration = Duration::from_millis(1);

/// A directory as etcd keeps it: keys with their lease, leases with their
/// expiry; `up` false answers nothing but failures.
struct Model {
    keys: BTreeMap<String, (String, LeaseId)>,
    leases: BTreeMap<LeaseId, Duration>,
    next: LeaseId,
    up: bool,
}

impl Model {
    fn new() -> Model {
        Model {
            keys: BTreeMap::new(),
            leases: BTreeMap::new(),
            next: 1,
            up: true,
        }
    }

    fn expire(&mut self, now: Duration) {
        let dead: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, e)| **e <= now)
            .map(|(l, _)| *l)
            .collect();
        for l in dead {
            self.leases.remove(&l);
            self.keys.retain(|_, (_, kl)| *kl != l);
        }
    }

    /// Carries out `c`'s actions until it is quiet; the answers.
    fn run(&mut self, c: &mut Claims, now: Duration) -> Vec<(Waiter, Result<(), NamingError>)> {
        let mut answers = Vec::new();
        self.expire(now);
        while let Some(a) = c.poll_action() {
            let event = match a {
                NamingAction::GrantLease { ttl } => {
                    if self.up {
                        let lease = self.next;
                        self.next += 1;
                        self.leases.insert(lease, now + ttl);
                        NamingEvent::LeaseGranted { lease, ttl }
                    } else {
                        NamingEvent::LeaseFailed {
                            error: "no quorum".into(),
                        }
                    }
                }
                NamingAction::KeepAlive { lease } => {
                    if !self.up {
                        NamingEvent::KeepAliveFailed {
                            lease,
                            gone: false,
                            error: "no quorum".into(),
                        }
                    } else if let Some(e) = self.leases.get_mut(&lease) {
                        *e = now + 5000 * MS;
                        NamingEvent::KeptAlive {
                            lease,
                            ttl: 5000 * MS,
                        }
                    } else {
                        NamingEvent::KeepAliveFailed {
                            lease,
                            gone: true,
                            error: "lease not found".into(),
                        }
                    }
                }
                NamingAction::Claim {
                    key,
                    value,
                    lease,
                    previous,
                } => {
                    let outcome = if !self.up {
                        ClaimOutcome::Failed("no quorum".into())
                    } else if !self.leases.contains_key(&lease) {
                        ClaimOutcome::Failed("lease not found".into())
                    } else {
                        match self.keys.get(&key) {
                            Some((v, l))
                                if (*l != lease || *v != value) && Some(*l) != previous =>
                            {
                                ClaimOutcome::Taken(v.clone())
                            }
                            _ => {
                                self.keys.insert(key.clone(), (value, lease));
                                ClaimOutcome::Held
                            }
                        }
                    };
                    NamingEvent::Claimed {
                        key,
                        lease,
                        outcome,
                    }
                }
                NamingAction::Release { key, lease } => {
                    if self.up && self.keys.get(&key).is_some_and(|(_, l)| *l == lease) {
                        self.keys.remove(&key);
                    }
                    continue;
                }
                NamingAction::Answer { waiter, result } => {
                    answers.push((waiter, result));
                    continue;
                }
            };
            c.handle(event, now);
        }
        answers
    }

    /// Runs `c` on virtual time from `from` to `to`, waking when it asks.
    fn advance(&mut self, c: &mut Claims, from: Duration, to: Duration) {
        let mut now = from;
        self.run(c, now);
        while let Some(t) = c.poll_timeout() {
            if t > to {
                break;
            }
            now = t.max(now);
            c.handle_timeout(now);
            self.run(c, now);
        }
    }
}

/// A client's claim (with a waiter: forgotten when it fails) or a
/// daemon's own (without: kept until held).
fn want(key: &str, value: &str, waiter: Option<Waiter>) -> NamingEvent {
    NamingEvent::Want {
        key: key.into(),
        value: value.into(),
        waiter,
        keep: waiter.is_none(),
    }
}

#[test]
fn a_name_is_claimed_under_a_lease_and_answered() {
    let mut dir = Model::new();
    let mut c = Claims::new(ClaimsConfig::default());
    c.handle(want("servers/10.0.0.1", "a", None), Duration::ZERO);
    c.handle(want("names/job", "10.0.0.1:3", Some(7)), Duration::ZERO);
    let answers = dir.run(&mut c, Duration::ZERO);
    assert_eq!(answers, vec![(7, Ok(()))]);
    assert_eq!(c.state("servers/10.0.0.1"), Some(&ClaimState::Held));
    assert_eq!(dir.keys.len(), 2);
    // Renewed for a minute of virtual time: still held, nothing expired.
    dir.advance(&mut c, Duration::ZERO, 60_000 * MS);
    assert_eq!(dir.keys.len(), 2);
    assert!(c.view().lease.is_some());
}

#[test]
fn two_daemons_never_hold_the_same_name() {
    let mut dir = Model::new();
    let mut a = Claims::new(ClaimsConfig::default());
    let mut b = Claims::new(ClaimsConfig::default());
    a.handle(want("names/job", "10.0.0.1:3", Some(1)), Duration::ZERO);
    assert_eq!(dir.run(&mut a, Duration::ZERO), vec![(1, Ok(()))]);
    b.handle(want("names/job", "10.0.0.2:4", Some(2)), Duration::ZERO);
    let answers = dir.run(&mut b, Duration::ZERO);
    assert_eq!(
        answers,
        vec![(
            2,
            Err(NamingError::Taken {
                name: "names/job".into(),
                holder: "10.0.0.1:3".into()
            })
        )]
    );
    assert_eq!(b.state("names/job"), None, "a refused claim is forgotten");
    assert_eq!(dir.keys["names/job"].0, "10.0.0.1:3");
}

#[test]
fn a_persistent_claim_in_conflict_takes_the_key_once_its_holder_lets_go() {
    let mut dir = Model::new();
    let mut a = Claims::new(ClaimsConfig::default());
    let mut b = Claims::new(ClaimsConfig::default());
    a.handle(want("servers/10.0.0.1", "a", None), Duration::ZERO);
    dir.run(&mut a, Duration::ZERO);
    b.handle(want("servers/10.0.0.1", "b", None), Duration::ZERO);
    dir.run(&mut b, Duration::ZERO);
    assert_eq!(
        b.state("servers/10.0.0.1"),
        Some(&ClaimState::Conflict("a".into()))
    );
    // A dies: nothing renews its lease, which runs out after 5 s.
    dir.advance(&mut b, Duration::ZERO, 20_000 * MS);
    assert_eq!(b.state("servers/10.0.0.1"), Some(&ClaimState::Held));
    assert_eq!(dir.keys["servers/10.0.0.1"].0, "b");
}

#[test]
fn without_the_directory_a_new_claim_fails_at_once_and_held_ones_stay_while_the_lease_may_live() {
    let mut dir = Model::new();
    let mut c = Claims::new(ClaimsConfig::default());
    c.handle(want("servers/10.0.0.1", "a", None), Duration::ZERO);
    dir.run(&mut c, Duration::ZERO);
    dir.up = false;
    // The renewal at ttl/3 fails: still held (the lease may be alive).
    dir.advance(&mut c, Duration::ZERO, 2000 * MS);
    assert_eq!(c.state("servers/10.0.0.1"), Some(&ClaimState::Held));
    assert!(c.view().error.is_some());
    c.handle(want("names/late", "x", Some(9)), 2000 * MS);
    let answers = dir.run(&mut c, 2000 * MS);
    assert!(
        matches!(answers.as_slice(), [(9, Err(NamingError::Unavailable(_)))]),
        "{answers:?}"
    );
    assert_eq!(c.state("names/late"), None);
    // Past the TTL the lease is gone: the claim is unclaimed again.
    dir.advance(&mut c, 2000 * MS, 6000 * MS);
    assert_eq!(c.state("servers/10.0.0.1"), Some(&ClaimState::Unclaimed));
    // The directory comes back (its own copy of the lease expired too):
    // the key is claimed again under a new lease, once.
    dir.up = true;
    dir.advance(&mut c, 6000 * MS, 20_000 * MS);
    assert_eq!(c.state("servers/10.0.0.1"), Some(&ClaimState::Held));
    assert_eq!(dir.keys.len(), 1);
    assert!(c.view().error.is_none());
}

#[test]
fn a_claim_waiting_for_the_first_lease_fails_when_the_lease_cannot_be_had() {
    let mut dir = Model::new();
    dir.up = false;
    let mut c = Claims::new(ClaimsConfig::default());
    c.handle(want("names/a", "x", Some(3)), Duration::ZERO);
    let answers = dir.run(&mut c, Duration::ZERO);
    assert!(matches!(
        answers.as_slice(),
        [(3, Err(NamingError::Unavailable(_)))]
    ));
    assert!(c.view().keys.is_empty());
}

#[test]
fn retries_back_off_and_stop_growing() {
    let mut dir = Model::new();
    dir.up = false;
    let config = ClaimsConfig::default();
    let mut c = Claims::new(config);
    c.handle(want("servers/10.0.0.1", "a", None), Duration::ZERO);
    let mut now = Duration::ZERO;
    dir.run(&mut c, now);
    let mut gaps = Vec::new();
    for _ in 0..12 {
        let next = c.poll_timeout().expect("a retry is planned");
        gaps.push(next - now);
        now = next;
        c.handle_timeout(now);
        dir.run(&mut c, now);
    }
    assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "{gaps:?}");
    assert_eq!(*gaps.last().unwrap(), config.max_backoff);
}

#[test]
fn a_dropped_name_is_released_and_a_late_claim_given_back() {
    let mut dir = Model::new();
    let mut c = Claims::new(ClaimsConfig::default());
    c.handle(want("names/a", "x", Some(1)), Duration::ZERO);
    dir.run(&mut c, Duration::ZERO);
    c.handle(
        NamingEvent::Drop {
            key: "names/a".into(),
        },
        Duration::ZERO,
    );
    dir.run(&mut c, Duration::ZERO);
    assert!(dir.keys.is_empty());
    // Dropped while its claim was in flight: released when it lands.
    c.handle(want("names/b", "y", None), Duration::ZERO);
    let Some(NamingAction::Claim {
        key, lease, value, ..
    }) = c.poll_action()
    else {
        panic!("expected a claim");
    };
    c.handle(NamingEvent::Drop { key: key.clone() }, Duration::ZERO);
    dir.keys.insert(key.clone(), (value, lease));
    c.handle(
        NamingEvent::Claimed {
            key: key.clone(),
            lease,
            outcome: ClaimOutcome::Held,
        },
        Duration::ZERO,
    );
    dir.run(&mut c, Duration::ZERO);
    assert!(dir.keys.is_empty());
}

#[test]
fn the_number_of_names_is_bounded() {
    let mut dir = Model::new();
    let mut c = Claims::new(ClaimsConfig {
        max_keys: 2,
        ..ClaimsConfig::default()
    });
    for i in 0..3 {
        c.handle(want(&format!("names/{i}"), "x", Some(i)), Duration::ZERO);
    }
    let answers = dir.run(&mut c, Duration::ZERO);
    assert_eq!(answers.iter().filter(|(_, r)| r.is_ok()).count(), 2);
    assert!(matches!(
        answers.iter().find(|(w, _)| *w == 2),
        Some((2, Err(NamingError::Unavailable(_))))
    ));
}

#[test]
fn names_are_checked() {
    assert!(check_name("job-1.rank0@a").is_ok());
    for bad in ["", "a/b", "a b", "x\u{7}", &"n".repeat(129)] {
        assert!(
            matches!(check_name(bad), Err(NamingError::BadName { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn a_kept_claim_with_a_waiter_hears_the_first_outcome_and_goes_on_trying() {
    let mut dir = Model::new();
    dir.up = false;
    let mut c = Claims::new(ClaimsConfig::default());
    c.handle(
        NamingEvent::Want {
            key: "servers/10.0.0.1".into(),
            value: "a".into(),
            waiter: Some(4),
            keep: true,
        },
        Duration::ZERO,
    );
    let answers = dir.run(&mut c, Duration::ZERO);
    assert!(matches!(
        answers.as_slice(),
        [(4, Err(NamingError::Unavailable(_)))]
    ));
    dir.up = true;
    dir.advance(&mut c, Duration::ZERO, 10_000 * MS);
    assert_eq!(c.state("servers/10.0.0.1"), Some(&ClaimState::Held));
}

#[test]
fn keys_still_attached_to_the_lost_lease_are_taken_back_not_lost() {
    let mut dir = Model::new();
    let mut c = Claims::new(ClaimsConfig::default());
    c.handle(want("servers/10.0.0.1", "a", None), Duration::ZERO);
    c.handle(want("names/sink", "10.0.0.1:4", Some(1)), Duration::ZERO);
    dir.run(&mut c, Duration::ZERO);
    // The directory freezes past the TTL; this daemon gives its lease up,
    // but the directory has not expired it yet when it answers again.
    dir.up = false;
    dir.advance(&mut c, Duration::ZERO, 6000 * MS);
    assert_eq!(c.state("names/sink"), Some(&ClaimState::Unclaimed));
    for e in dir.leases.values_mut() {
        *e = 60_000 * MS;
    }
    dir.up = true;
    dir.advance(&mut c, 6000 * MS, 12_000 * MS);
    assert_eq!(c.state("names/sink"), Some(&ClaimState::Held));
    assert_eq!(c.state("servers/10.0.0.1"), Some(&ClaimState::Held));
    let lease = c.view().lease.unwrap().0;
    assert!(dir.keys.values().all(|(_, l)| *l == lease));
}

#[test]
fn with_nothing_to_hold_there_is_nothing_to_wake_for() {
    let mut c = Claims::new(ClaimsConfig::default());
    assert_eq!(c.poll_timeout(), None);
    c.handle_timeout(Duration::from_secs(1));
    assert_eq!(c.poll_action(), None);
    c.handle(want("names/a", "x", Some(1)), Duration::from_secs(1));
    assert!(c.poll_timeout().is_some() || c.poll_action().is_some());
}
