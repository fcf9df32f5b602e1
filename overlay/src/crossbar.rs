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

use uniplane_dataplane::sched::{Policy, PolicyError, Scheduler};
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
}

/// A value on a cache line of its own.
#[repr(align(64))]
struct Line<T>(T);

impl Crossbar {
    /// A crossbar of `ports` inputs and outputs, each queue holding `depth`
    /// messages; round-robin on every output.
    pub fn new(ports: usize, depth: usize) -> Self {
        let depth = depth.max(1);
        Crossbar {
            ports,
            depth,
            voq: (0..ports * ports)
                .map(|_| VecDeque::with_capacity(depth))
                .collect(),
            backlog: (0..ports).map(|_| Line(0)).collect(),
            sched: (0..ports).map(|_| Line(Scheduler::new(ports))).collect(),
        }
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
        let ports = self.ports;
        let voq = &self.voq;
        let head = |input: usize| {
            voq[input * ports + out]
                .front()
                .map(|m| m.encoded_len() as u32)
        };
        let input = self.sched[out].0.pick(&head)?;
        let m = self.voq[input * ports + out].pop_front()?;
        self.backlog[out].0 -= 1;
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
        }
        let _ = self.sched[o].0.set_policy(Policy::RoundRobin);
    }

    /// The policy of `output`.
    pub fn policy(&self, output: PortId) -> &Policy {
        self.sched[output as usize].0.policy()
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
}
