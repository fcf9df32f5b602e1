//! The crossbar: a virtual output queue per (input, output) and a
//! scheduler per output.
//!
//! A message waits in the queue of its own input and output, so a busy
//! output never blocks traffic from the same input to another output
//! (no head-of-line blocking between outputs). Queues are bounded and
//! preallocated; a full queue refuses the message and the engine stops
//! reading that input — backpressure that reaches the sender as
//! `poll_ready` returning `Pending`. Nothing is ever dropped for
//! congestion.

use std::collections::VecDeque;

use uniplane_dataplane::sched::{Backlog, Policy, PolicyError, Scheduler};
use uniplane_dataplane::Message;

use crate::PortId;

/// Virtual output queues and output schedulers of `ports` × `ports`.
pub struct Crossbar {
    ports: usize,
    depth: usize,
    /// Queue of (input, output) at `input * ports + output`.
    voq: Vec<VecDeque<Message>>,
    /// Messages queued per output. Each output's count and scheduler sit
    /// on cache lines of their own: senders forwarding inline on
    /// different cores each write their own output's.
    backlog: Vec<Line<usize>>,
    sched: Vec<Line<Scheduler>>,
    /// A bit per input that has messages queued, per output: `lines`
    /// lines of each output's own, so the scheduler finds the next
    /// backlogged input in a word instead of looking at every queue, and
    /// senders on different cores write different lines.
    occupied: Vec<Line<[u64; WORDS]>>,
    /// Lines of `occupied` per output.
    lines: usize,
}

/// A value on a cache line of its own.
#[repr(align(64))]
struct Line<T>(T);

/// Words of input bits on one cache line.
const WORDS: usize = 8;

impl Crossbar {
    /// A crossbar of `ports` inputs and outputs, each queue holding `depth`
    /// messages; round-robin on every output.
    pub fn new(ports: usize, depth: usize) -> Self {
        let depth = depth.max(1);
        let lines = ports.div_ceil(64 * WORDS).max(1);
        Crossbar {
            ports,
            depth,
            voq: (0..ports * ports)
                .map(|_| VecDeque::with_capacity(depth))
                .collect(),
            backlog: (0..ports).map(|_| Line(0)).collect(),
            sched: (0..ports).map(|_| Line(Scheduler::new(ports))).collect(),
            occupied: (0..ports * lines).map(|_| Line([0; WORDS])).collect(),
            lines,
        }
    }

    /// The word of `output`'s bits that holds `input`'s, and its bit.
    #[inline]
    fn bit(&mut self, input: usize, output: usize) -> (&mut u64, u64) {
        let word = input / 64;
        let line = &mut self.occupied[output * self.lines + word / WORDS].0;
        (&mut line[word % WORDS], 1 << (input % 64))
    }

    /// Number of ports.
    pub fn ports(&self) -> usize {
        self.ports
    }

    /// Messages each queue holds.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Free places in the queue from `input` to `output`.
    #[inline]
    pub fn room(&self, input: PortId, output: PortId) -> usize {
        self.depth - self.voq[input as usize * self.ports + output as usize].len()
    }

    /// Queues `m` from `input` to `output`, or gives it back when full.
    #[inline]
    pub fn push(&mut self, input: PortId, output: PortId, m: Message) -> Result<(), Message> {
        let q = &mut self.voq[input as usize * self.ports + output as usize];
        if q.len() == self.depth {
            return Err(m);
        }
        q.push_back(m);
        self.backlog[output as usize].0 += 1;
        let (word, bit) = self.bit(input as usize, output as usize);
        *word |= bit;
        Ok(())
    }

    /// Messages waiting for `output`.
    #[inline]
    pub fn backlog(&self, output: PortId) -> usize {
        self.backlog[output as usize].0
    }

    /// The next message for `output` as its scheduler picks it, with the
    /// input it came from.
    #[inline]
    pub fn pop(&mut self, output: PortId) -> Option<(PortId, Message)> {
        let out = output as usize;
        if self.backlog[out].0 == 0 {
            return None;
        }
        let heads = Heads {
            voq: &self.voq,
            ports: self.ports,
            output: out,
            occupied: &self.occupied[out * self.lines..(out + 1) * self.lines],
        };
        let input = self.sched[out].0.pick(&heads)?;
        let q = &mut self.voq[input * self.ports + out];
        let m = q.pop_front()?;
        let emptied = q.is_empty();
        self.backlog[out].0 -= 1;
        if emptied {
            let (word, bit) = self.bit(input, out);
            *word &= !bit;
        }
        Some((input as PortId, m))
    }

    /// Sets the policy of `output`'s scheduler (queues are kept: nothing
    /// is lost or reordered). Lists may be shorter than the number of
    /// ports: the inputs left out get weight 1 and the least urgent class.
    pub fn set_policy(&mut self, output: PortId, policy: Policy) -> Result<(), PolicyError> {
        self.sched[output as usize]
            .0
            .set_policy(padded(policy, self.ports))
    }

    /// Drops every message queued for `output` (its port is gone), and
    /// every message its input had queued for others.
    pub fn clear_output(&mut self, output: PortId) {
        let o = output as usize;
        for input in 0..self.ports {
            let q = &mut self.voq[input * self.ports + o];
            self.backlog[o].0 -= q.len();
            q.clear();
            let q = &mut self.voq[o * self.ports + input];
            self.backlog[input].0 -= q.len();
            q.clear();
            for (i, out) in [(input, o), (o, input)] {
                let (word, bit) = self.bit(i, out);
                *word &= !bit;
            }
        }
        let _ = self.sched[o].0.set_policy(Policy::RoundRobin);
    }

    /// The policy of `output`.
    pub fn policy(&self, output: PortId) -> &Policy {
        self.sched[output as usize].0.policy()
    }
}

/// One output's queues as its scheduler sees them.
struct Heads<'a> {
    voq: &'a [VecDeque<Message>],
    ports: usize,
    output: usize,
    /// The output's lines of input bits.
    occupied: &'a [Line<[u64; WORDS]>],
}

impl Heads<'_> {
    /// The word of input bits number `w`.
    #[inline]
    fn word(&self, w: usize) -> u64 {
        self.occupied[w / WORDS].0[w % WORDS]
    }
}

impl Backlog for Heads<'_> {
    #[inline]
    fn head_len(&self, input: usize) -> Option<u32> {
        self.voq[input * self.ports + self.output]
            .front()
            .map(|m| m.encoded_len() as u32)
    }

    #[inline]
    fn has_head(&self, input: usize) -> bool {
        self.word(input / 64) & (1 << (input % 64)) != 0
    }

    /// The first set bit from `from` on, then from the first word.
    #[inline]
    fn next_backlogged(&self, from: usize, queues: usize) -> Option<usize> {
        let words = queues.div_ceil(64);
        if words == 0 {
            return None;
        }
        let first = from / 64;
        if first < words {
            // Bits below `from` in its own word are looked at last.
            let w = self.word(first) & (u64::MAX << (from % 64));
            if w != 0 {
                return Some(first * 64 + w.trailing_zeros() as usize);
            }
        }
        (first + 1..words)
            .chain(0..=first.min(words - 1))
            .find_map(|i| {
                let w = self.word(i);
                (w != 0).then(|| i * 64 + w.trailing_zeros() as usize)
            })
            .filter(|&q| q < queues)
    }
}

/// `policy` with its lists made as long as `n` inputs: the inputs left
/// out get weight 1 and the least urgent class.
pub(crate) fn padded(policy: Policy, n: usize) -> Policy {
    let pad = |mut v: Vec<u32>, fill: u32| {
        if v.len() < n {
            v.resize(n, fill);
        }
        v
    };
    match policy {
        Policy::RoundRobin => Policy::RoundRobin,
        Policy::Weighted(w) => Policy::Weighted(pad(w, 1)),
        Policy::StrictPriority { mut class, weights } => {
            let last = class.iter().copied().max().unwrap_or(0);
            if class.len() < n {
                class.resize(n, last);
            }
            Policy::StrictPriority {
                class,
                weights: pad(weights, 1),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;
    use uniplane_dataplane::Uid;

    fn msg(input: u16, seq: u32) -> Message {
        let u = Uid::new(std::net::Ipv4Addr::LOCALHOST, input);
        let mut m = Message::send(u.port(1), u.port(2), Bytes::new()).unwrap();
        m.set_seqnum(seq);
        m
    }

    #[test]
    fn a_full_output_does_not_block_another() {
        let mut x = Crossbar::new(3, 2);
        x.push(0, 1, msg(0, 0)).unwrap();
        x.push(0, 1, msg(0, 1)).unwrap();
        assert!(x.push(0, 1, msg(0, 2)).is_err(), "queue 0→1 is full");
        x.push(0, 2, msg(0, 3)).unwrap();
        assert_eq!(x.pop(2).unwrap().1.header().seqnum, 3);
    }

    #[test]
    fn outputs_serve_inputs_round_robin_in_fifo_order() {
        let mut x = Crossbar::new(3, 8);
        for s in 0..3 {
            x.push(0, 2, msg(0, s)).unwrap();
            x.push(1, 2, msg(1, 10 + s)).unwrap();
        }
        let order: Vec<(u16, u32)> = std::iter::from_fn(|| x.pop(2))
            .map(|(i, m)| (i, m.header().seqnum))
            .collect();
        assert_eq!(
            order,
            vec![(0, 0), (1, 10), (0, 1), (1, 11), (0, 2), (1, 12)]
        );
        assert_eq!(x.backlog(2), 0);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(usize, usize),
        Pop(usize),
        Clear(usize),
    }

    fn ops(ports: usize) -> impl Strategy<Value = Vec<Op>> {
        let op = prop_oneof![
            4 => (0..ports, 0..ports).prop_map(|(i, o)| Op::Push(i, o)),
            3 => (0..ports).prop_map(Op::Pop),
            1 => (0..ports).prop_map(Op::Clear),
        ];
        proptest::collection::vec(op, 0..300)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The bits of backlogged inputs pick what looking at every queue
        /// in turn picks, over one word and across words.
        #[test]
        fn round_robin_by_bits_picks_as_a_scan_of_every_queue(
            (ports, ops) in prop_oneof![Just(3usize), Just(64), Just(70), Just(130)]
                .prop_flat_map(|p| (Just(p), ops(p)))
        ) {
            let depth = 2;
            let mut x = Crossbar::new(ports, depth);
            let mut model: Vec<VecDeque<u32>> = vec![VecDeque::new(); ports * ports];
            let mut next = vec![0usize; ports];
            for (seq, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Push(i, o) => {
                        let q = &mut model[i * ports + o];
                        let pushed = x.push(i as PortId, o as PortId, msg(i as u16, seq as u32));
                        prop_assert_eq!(pushed.is_ok(), q.len() < depth);
                        if q.len() < depth {
                            q.push_back(seq as u32);
                        }
                    }
                    Op::Pop(o) => {
                        let want = (0..ports)
                            .map(|k| (next[o] + k) % ports)
                            .find(|&i| !model[i * ports + o].is_empty())
                            .map(|i| {
                                next[o] = (i + 1) % ports;
                                (i as PortId, model[i * ports + o].pop_front().unwrap())
                            });
                        let got = x.pop(o as PortId).map(|(i, m)| (i, m.header().seqnum));
                        prop_assert_eq!(got, want);
                    }
                    Op::Clear(p) => {
                        x.clear_output(p as PortId);
                        next[p] = 0;
                        for k in 0..ports {
                            model[k * ports + p].clear();
                            model[p * ports + k].clear();
                        }
                    }
                }
            }
            for o in 0..ports {
                let queued: usize = (0..ports).map(|i| model[i * ports + o].len()).sum();
                prop_assert_eq!(x.backlog(o as PortId), queued);
            }
        }
    }
}
