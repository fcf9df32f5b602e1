//! Output schedulers: which queue sends next.
//!
//! Sans-IO: a [`Scheduler`] holds no messages. It looks at the queues
//! through [`Backlog`] (the size of each queue's head message) and answers
//! which queue to serve; the caller dequeues from that queue. The queues
//! own the messages, so changing the policy at run time — [`Scheduler::set_policy`]
//! — can neither lose nor reorder anything.
//!
//! Policies:
//! - [`Policy::RoundRobin`]: one message per backlogged queue in turn.
//! - [`Policy::Weighted`]: deficit round-robin (Shreedhar and Varghese,
//!   SIGCOMM'95), byte-accurate: over time queue *i* gets
//!   `weight_i / Σ weights` of the bytes while all are backlogged.
//! - [`Policy::StrictPriority`]: the highest backlogged class always goes
//!   first; queues inside one class share by weight (deficit round-robin).

/// The scheduler's view of the queues it serves.
pub trait Backlog {
    /// Bytes of the message at the head of `queue`, or `None` when empty.
    fn head_len(&self, queue: usize) -> Option<u32>;
    /// Whether `queue` holds a message: what round robin and strict
    /// priority's class test need, without reading the message (queues
    /// filled by another core answer from their indices alone).
    #[inline]
    fn has_head(&self, queue: usize) -> bool {
        self.head_len(queue).is_some()
    }
    /// The first of `queues` queues that holds a message, looking from
    /// `from` on and wrapping around: round robin's next turn. Queues
    /// that keep a bit per backlogged queue answer from those words
    /// instead of looking at every queue.
    #[inline]
    fn next_backlogged(&self, from: usize, queues: usize) -> Option<usize> {
        let from = from.min(queues);
        (from..queues)
            .find(|&q| self.has_head(q))
            .or_else(|| (0..from).find(|&q| self.has_head(q)))
    }
}

impl<F: Fn(usize) -> Option<u32>> Backlog for F {
    fn head_len(&self, queue: usize) -> Option<u32> {
        self(queue)
    }
}

/// How an output shares itself among its queues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Fair by message: one message per backlogged queue in turn.
    RoundRobin,
    /// Fair by bytes in proportion to the weights (one per queue, ≥ 1).
    Weighted(Vec<u32>),
    /// `class[i]` is queue *i*'s traffic class (0 is served first);
    /// `weights[i]` its share inside its class.
    StrictPriority {
        /// Class of each queue; lower is more urgent.
        class: Vec<u8>,
        /// Weight of each queue inside its class (≥ 1).
        weights: Vec<u32>,
    },
}

/// Why a policy does not fit the scheduler's queues.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A per-queue list has the wrong length.
    #[error("policy lists {given} queues, the output has {expected}")]
    WrongLength {
        /// Queues the output has.
        expected: usize,
        /// Entries the policy gave.
        given: usize,
    },
    /// A weight of zero would starve its queue.
    #[error("weight of queue {0} is zero")]
    ZeroWeight(usize),
}

/// Bytes a weight-1 queue may send per round. A message larger than the
/// deficit waits for later rounds, so any size is served exactly.
pub const DEFAULT_QUANTUM: u32 = 1536;

/// Deficit round-robin over a subset of the queues.
#[derive(Clone, Debug)]
struct Drr {
    queues: Vec<usize>,
    quantum: Vec<u64>,
    deficit: Vec<u64>,
    /// Index into `queues` of the queue being served.
    pos: usize,
    /// Whether the queue at `pos` already got this round's quantum.
    topped_up: bool,
}

impl Drr {
    fn new(queues: Vec<usize>, weights: &[u32], quantum: u32) -> Self {
        let n = queues.len();
        Drr {
            quantum: queues
                .iter()
                .map(|&q| {
                    u64::from(weights.get(q).copied().unwrap_or(1).max(1)) * u64::from(quantum)
                })
                .collect(),
            deficit: vec![0; n],
            queues,
            pos: 0,
            topped_up: false,
        }
    }

    fn advance(&mut self) {
        self.pos += 1;
        if self.pos == self.queues.len() {
            self.pos = 0;
        }
        self.topped_up = false;
    }

    fn pick(&mut self, backlog: &impl Backlog) -> Option<usize> {
        let n = self.queues.len();
        if n == 0 {
            return None;
        }
        let mut idle_in_a_row = 0;
        // Each full round adds a quantum to every backlogged queue, so some
        // head fits within max_len / min_quantum rounds: the loop is bounded.
        loop {
            let q = self.queues[self.pos];
            match backlog.head_len(q) {
                None => {
                    self.deficit[self.pos] = 0;
                    idle_in_a_row += 1;
                    if idle_in_a_row >= n {
                        self.topped_up = false;
                        return None;
                    }
                    self.advance();
                }
                Some(len) => {
                    idle_in_a_row = 0;
                    if !self.topped_up {
                        self.deficit[self.pos] += self.quantum[self.pos];
                        self.topped_up = true;
                    }
                    if self.deficit[self.pos] >= u64::from(len) {
                        self.deficit[self.pos] -= u64::from(len);
                        return Some(q);
                    }
                    self.advance();
                }
            }
        }
    }

    fn any(&self, backlog: &impl Backlog) -> bool {
        self.queues.iter().any(|&q| backlog.has_head(q))
    }
}

#[derive(Clone, Debug)]
enum State {
    RoundRobin { next: usize },
    Weighted(Drr),
    StrictPriority(Vec<Drr>),
}

/// A scheduler for one output with a fixed number of input queues.
#[derive(Clone, Debug)]
pub struct Scheduler {
    queues: usize,
    quantum: u32,
    policy: Policy,
    state: State,
}

impl Scheduler {
    /// A round-robin scheduler over `queues` queues.
    pub fn new(queues: usize) -> Self {
        Scheduler {
            queues,
            quantum: DEFAULT_QUANTUM,
            policy: Policy::RoundRobin,
            state: State::RoundRobin { next: 0 },
        }
    }

    /// A scheduler over `queues` queues with `policy`.
    pub fn with_policy(queues: usize, policy: Policy) -> Result<Self, PolicyError> {
        let mut s = Scheduler::new(queues);
        s.set_policy(policy)?;
        Ok(s)
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Number of queues served.
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// Switches policy. The queues are untouched, so nothing is lost or
    /// reordered; credit earned under the old policy is forgotten.
    pub fn set_policy(&mut self, policy: Policy) -> Result<(), PolicyError> {
        let check = |v: &[u32]| -> Result<(), PolicyError> {
            if v.len() != self.queues {
                return Err(PolicyError::WrongLength {
                    expected: self.queues,
                    given: v.len(),
                });
            }
            match v.iter().position(|&w| w == 0) {
                Some(i) => Err(PolicyError::ZeroWeight(i)),
                None => Ok(()),
            }
        };
        self.state = match &policy {
            Policy::RoundRobin => State::RoundRobin { next: 0 },
            Policy::Weighted(w) => {
                check(w)?;
                State::Weighted(Drr::new((0..self.queues).collect(), w, self.quantum))
            }
            Policy::StrictPriority { class, weights } => {
                check(weights)?;
                if class.len() != self.queues {
                    return Err(PolicyError::WrongLength {
                        expected: self.queues,
                        given: class.len(),
                    });
                }
                let top = class.iter().copied().max().unwrap_or(0) as usize;
                let classes = (0..=top)
                    .map(|c| {
                        let members = (0..self.queues)
                            .filter(|&q| class[q] as usize == c)
                            .collect();
                        Drr::new(members, weights, self.quantum)
                    })
                    .collect();
                State::StrictPriority(classes)
            }
        };
        self.policy = policy;
        Ok(())
    }

    /// The queue to serve next (one message), or `None` when all are empty.
    /// The caller must then dequeue exactly one message from that queue.
    #[inline]
    pub fn pick(&mut self, backlog: &impl Backlog) -> Option<usize> {
        match &mut self.state {
            State::RoundRobin { next } => {
                let q = backlog.next_backlogged(*next, self.queues)?;
                *next = if q + 1 == self.queues { 0 } else { q + 1 };
                Some(q)
            }
            State::Weighted(drr) => drr.pick(backlog),
            State::StrictPriority(classes) => {
                let class = classes.iter().position(|c| c.any(backlog))?;
                classes[class].pick(backlog)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::VecDeque;

    /// Queues of message sizes; serve() dequeues what the scheduler picks.
    struct Queues(RefCell<Vec<VecDeque<u32>>>);

    impl Backlog for Queues {
        fn head_len(&self, q: usize) -> Option<u32> {
            self.0.borrow()[q].front().copied()
        }
    }

    impl Queues {
        fn backlogged(sizes: &[u32], count: usize) -> Self {
            Queues(RefCell::new(
                sizes
                    .iter()
                    .map(|&s| std::iter::repeat_n(s, count).collect())
                    .collect(),
            ))
        }

        /// Serves `n` messages and returns the bytes each queue sent.
        fn serve(&self, s: &mut Scheduler, n: usize) -> Vec<u64> {
            let mut bytes = vec![0u64; self.0.borrow().len()];
            for _ in 0..n {
                let q = s.pick(self).expect("backlogged");
                bytes[q] += u64::from(self.0.borrow_mut()[q].pop_front().unwrap());
            }
            bytes
        }
    }

    fn shares(bytes: &[u64]) -> Vec<f64> {
        let total: u64 = bytes.iter().sum();
        bytes.iter().map(|&b| b as f64 / total as f64).collect()
    }

    #[test]
    fn round_robin_alternates_messages() {
        let q = Queues::backlogged(&[64, 1500, 64], 10);
        let mut s = Scheduler::new(3);
        let order: Vec<usize> = (0..6)
            .map(|_| {
                let i = s.pick(&q).unwrap();
                q.0.borrow_mut()[i].pop_front();
                i
            })
            .collect();
        assert_eq!(order, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn round_robin_skips_empty_queues_and_wraps_past_the_last() {
        let q = Queues(RefCell::new(vec![
            VecDeque::from([64]),
            VecDeque::new(),
            VecDeque::from([64, 64]),
        ]));
        let mut s = Scheduler::new(3);
        let order: Vec<usize> = std::iter::from_fn(|| {
            let i = s.pick(&q)?;
            q.0.borrow_mut()[i].pop_front();
            Some(i)
        })
        .collect();
        assert_eq!(order, vec![0, 2, 2]);
    }

    #[test]
    fn weighted_shares_bytes_by_weight_within_one_percent() {
        // Sizes differ per queue: shares are of bytes, not messages.
        let q = Queues::backlogged(&[64, 1500, 512], 200_000);
        let mut s = Scheduler::with_policy(3, Policy::Weighted(vec![1, 1, 2])).unwrap();
        let got = shares(&q.serve(&mut s, 100_000));
        for (g, want) in got.iter().zip([0.25, 0.25, 0.5]) {
            assert!((g - want).abs() < 0.01, "{got:?}");
        }
    }

    #[test]
    fn weighted_serves_messages_larger_than_the_quantum() {
        let q = Queues::backlogged(&[65_000, 100], 100);
        let mut s = Scheduler::with_policy(2, Policy::Weighted(vec![1, 1])).unwrap();
        let got = q.serve(&mut s, 150);
        assert!(got[0] > 0 && got[1] > 0);
    }

    #[test]
    fn strict_priority_starves_lower_classes_and_weighs_within_a_class() {
        let q = Queues::backlogged(&[100, 100, 100], 50_000);
        let policy = Policy::StrictPriority {
            class: vec![1, 0, 0],
            weights: vec![1, 3, 1],
        };
        let mut s = Scheduler::with_policy(3, policy).unwrap();
        let got = q.serve(&mut s, 40_000);
        assert_eq!(got[0], 0, "class 1 waits while class 0 is backlogged");
        let share = got[1] as f64 / (got[1] + got[2]) as f64;
        assert!((share - 0.75).abs() < 0.01, "{share}");
    }

    #[test]
    fn an_idle_queue_earns_no_credit() {
        let q = Queues::backlogged(&[100, 100], 1000);
        q.0.borrow_mut()[1].clear();
        let mut s = Scheduler::with_policy(2, Policy::Weighted(vec![1, 1])).unwrap();
        q.serve(&mut s, 500);
        q.0.borrow_mut()[1].extend(std::iter::repeat_n(100, 1000));
        let got = q.serve(&mut s, 200);
        let diff = got[0].abs_diff(got[1]);
        assert!(diff <= 1600, "{got:?}");
    }

    #[test]
    fn empty_queues_give_none() {
        let q = Queues::backlogged(&[1, 1], 0);
        for policy in [
            Policy::RoundRobin,
            Policy::Weighted(vec![1, 2]),
            Policy::StrictPriority {
                class: vec![0, 1],
                weights: vec![1, 1],
            },
        ] {
            let mut s = Scheduler::with_policy(2, policy).unwrap();
            assert_eq!(s.pick(&q), None);
        }
    }

    #[test]
    fn bad_policies_are_refused() {
        let mut s = Scheduler::new(2);
        assert_eq!(
            s.set_policy(Policy::Weighted(vec![1])),
            Err(PolicyError::WrongLength {
                expected: 2,
                given: 1
            })
        );
        assert_eq!(
            s.set_policy(Policy::Weighted(vec![1, 0])),
            Err(PolicyError::ZeroWeight(1))
        );
        assert_eq!(s.policy(), &Policy::RoundRobin);
    }

    #[test]
    fn switching_policy_mid_flight_keeps_every_message_in_order() {
        // Each queue holds increasing sequence numbers encoded as sizes.
        let q = Queues(RefCell::new(
            (0..3)
                .map(|_| (1..=3000u32).collect::<VecDeque<u32>>())
                .collect(),
        ));
        let mut s = Scheduler::new(3);
        let mut last = [0u32; 3];
        let mut served = 0;
        let policies = [
            Policy::Weighted(vec![1, 2, 3]),
            Policy::StrictPriority {
                class: vec![0, 1, 1],
                weights: vec![1, 1, 1],
            },
            Policy::RoundRobin,
        ];
        for round in 0..9000 {
            if round % 1000 == 999 {
                s.set_policy(policies[(round / 1000) % 3].clone()).unwrap();
            }
            let Some(i) = s.pick(&q) else { break };
            let v = q.0.borrow_mut()[i].pop_front().unwrap();
            assert_eq!(v, last[i] + 1, "queue {i} reordered");
            last[i] = v;
            served += 1;
        }
        assert_eq!(served, 9000);
        assert_eq!(last, [3000, 3000, 3000]);
    }
}
