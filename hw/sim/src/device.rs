//! The simulated device: the model, the traffic around it and its
//! AXI-Lite register port, all advanced one clock cycle at a time.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use uniplane_dataplane::{Message, SplitMix64};

use crate::plane::Shadow;
use crate::regs::{self, Block};
use crate::sim::{AxilIn, AxilOut, Beat, Model, Sim, Stream};

/// Idle and backpressure patterns of the simulated traffic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Traffic {
    /// Probability that an input with a beat to send waits a cycle before
    /// presenting it (idle gaps between and inside messages).
    pub input_idle: f64,
    /// Probability that an output is not ready in a cycle (backpressure).
    pub output_stall: f64,
    /// Seed of the pattern.
    pub seed: u64,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic {
            input_idle: 0.0,
            output_stall: 0.0,
            seed: 1,
        }
    }
}

/// A message that left an output, with the cycles its first and last
/// beats did.
#[derive(Clone, Debug)]
pub struct Delivered {
    /// The message, decoded.
    pub message: Message,
    /// Cycle of the first beat's handshake.
    pub first_cycle: u64,
    /// Cycle of the last beat's handshake.
    pub last_cycle: u64,
}

/// A message that entered an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Cycle of the first beat's handshake.
    pub first_cycle: u64,
}

#[derive(Default)]
struct Input {
    beats: VecDeque<Beat>,
    presenting: bool,
    accepted: Vec<Accepted>,
    beats_in: u64,
}

#[derive(Default)]
struct Output {
    partial: BytesMut,
    first_cycle: u64,
    delivered: Vec<Delivered>,
    malformed: u64,
    beats_out: u64,
    held: bool,
    ready_now: bool,
}

/// Why a register access failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The slave did not complete the access in time.
    #[error("AXI-Lite access to {0:#x} timed out")]
    Timeout(u32),
}

const KINDS: [Stream; 3] = [Stream::Port, Stream::Stack, Stream::Interface];

fn kind_index(kind: Stream) -> usize {
    match kind {
        Stream::Port => 0,
        Stream::Stack => 1,
        Stream::Interface => 2,
    }
}

/// The beats of `m`: its encoding cut into 32-byte beats, the last
/// zero-padded, FIRST on the first and LAST on the last.
pub fn beats_of(m: &Message) -> Vec<Beat> {
    let mut buf = BytesMut::new();
    m.encode(&mut buf);
    let n = buf.len().div_ceil(32);
    (0..n)
        .map(|i| {
            let mut data = [0u8; 32];
            let chunk = &buf[i * 32..buf.len().min(i * 32 + 32)];
            data[..chunk.len()].copy_from_slice(chunk);
            Beat {
                data,
                first: i == 0,
                last: i + 1 == n,
            }
        })
        .collect()
}

/// The simulated `uniplane_top`: traffic in and out of every stream, and
/// the register port. Every method that takes time advances the clock;
/// traffic keeps flowing during register accesses, as on hardware.
pub struct RtlDevice {
    sim: Sim,
    model: Model,
    rng: SplitMix64,
    traffic: Traffic,
    inputs: [Vec<Input>; 3],
    outputs: [Vec<Output>; 3],
    axil: AxilIn,
    blocks: Vec<Block>,
    pub(crate) shadow: Shadow,
}

impl RtlDevice {
    /// A fresh device of `model`, its register blocks discovered and its
    /// header layout checked against this build's field table.
    ///
    /// # Panics
    /// When the RTL was built from another header layout than the one
    /// this crate was compiled with.
    pub fn new(model: Model) -> RtlDevice {
        let sim = Sim::new(model);
        let counts = [sim.ports(), sim.stacks(), 1];
        let inputs = counts.map(|n| (0..n).map(|_| Input::default()).collect());
        let outputs = counts.map(|n| (0..n).map(|_| Output::default()).collect());
        let ports = sim.ports();
        let mut dev = RtlDevice {
            sim,
            model,
            rng: SplitMix64::new(1),
            traffic: Traffic::default(),
            inputs,
            outputs,
            axil: AxilIn::default(),
            blocks: Vec::new(),
            shadow: Shadow::new(ports, 0, 0, 0, 0),
        };
        let blocks = regs::discover(|a| dev.read(a).unwrap_or(0));
        dev.blocks = blocks;
        let hash = dev.read(regs::id::LAYOUT_HASH).unwrap_or(0);
        assert_eq!(
            hash,
            uniplane_hw_gen::layout_hash(),
            "the RTL's header layout differs from this build's field table"
        );
        let entries = dev.read(regs::id::TABLE_ENTRIES).unwrap_or(0) as usize;
        let conns = dev.read(regs::id::ACL_CONNECTIONS).unwrap_or(0) as usize;
        let rules = dev.read(regs::id::ACL_RULES).unwrap_or(0) as usize;
        let translations = dev.read(regs::id::TRANSLATIONS).unwrap_or(0) as usize;
        dev.shadow = Shadow::new(ports, entries, conns, rules, translations);
        dev
    }

    /// The model simulated.
    pub fn model(&self) -> Model {
        self.model
    }

    /// Overlay ports.
    pub fn ports(&self) -> usize {
        self.sim.ports()
    }

    /// The register blocks, as discovered.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// Base address of the first block of `kind` at or after index `nth`.
    pub fn block_base(&self, kind: u32, nth: usize) -> Option<u32> {
        self.blocks
            .iter()
            .filter(|b| b.kind == kind)
            .nth(nth)
            .map(|b| b.base)
    }

    /// Clock cycles since reset.
    pub fn cycle(&self) -> u64 {
        self.sim.cycle()
    }

    /// Sets the idle and backpressure patterns from now on.
    pub fn set_traffic(&mut self, traffic: Traffic) {
        self.traffic = traffic;
        self.rng = SplitMix64::new(traffic.seed);
    }

    /// Holds output `i` of `kind` (ready low) until released.
    pub fn hold_output(&mut self, kind: Stream, i: usize, held: bool) {
        self.outputs[kind_index(kind)][i].held = held;
    }

    /// Queues `m` on input `i` of `kind`.
    pub fn send(&mut self, kind: Stream, i: usize, m: &Message) {
        self.inputs[kind_index(kind)][i].beats.extend(beats_of(m));
    }

    /// Queues raw beats on input `i` of `kind` (for malformed traffic).
    pub fn send_beats(&mut self, kind: Stream, i: usize, beats: &[Beat]) {
        self.inputs[kind_index(kind)][i]
            .beats
            .extend(beats.iter().copied());
    }

    /// Beats queued on input `i` of `kind` and not yet accepted.
    pub fn queued_beats(&self, kind: Stream, i: usize) -> usize {
        self.inputs[kind_index(kind)][i].beats.len()
    }

    /// Drops what is queued on input `i` of `kind` and has not begun to
    /// enter, keeping the rest of a message already partly presented or
    /// accepted (a message is never cut). Returns the beats dropped.
    pub fn discard_queued(&mut self, kind: Stream, i: usize) -> usize {
        let q = &mut self.inputs[kind_index(kind)][i];
        let started = q.presenting || q.beats.front().is_some_and(|b| !b.first);
        let keep = if started {
            q.beats
                .iter()
                .position(|b| b.last)
                .map_or(q.beats.len(), |e| e + 1)
        } else {
            0
        };
        let dropped = q.beats.len() - keep;
        q.beats.truncate(keep);
        dropped
    }

    /// Whether every input has sent everything queued.
    pub fn inputs_drained(&self) -> bool {
        self.inputs.iter().flatten().all(|q| q.beats.is_empty())
    }

    /// Messages accepted so far on input `i` of `kind`.
    pub fn accepted(&self, kind: Stream, i: usize) -> &[Accepted] {
        &self.inputs[kind_index(kind)][i].accepted
    }

    /// Beats accepted so far on input `i` of `kind`.
    pub fn beats_in(&self, kind: Stream, i: usize) -> u64 {
        self.inputs[kind_index(kind)][i].beats_in
    }

    /// Messages delivered so far by output `i` of `kind`.
    pub fn delivered(&self, kind: Stream, i: usize) -> &[Delivered] {
        &self.outputs[kind_index(kind)][i].delivered
    }

    /// Beats delivered so far by output `i` of `kind`.
    pub fn beats_out(&self, kind: Stream, i: usize) -> u64 {
        self.outputs[kind_index(kind)][i].beats_out
    }

    /// Messages delivered by output `i` of `kind` that did not decode.
    pub fn malformed(&self, kind: Stream, i: usize) -> u64 {
        self.outputs[kind_index(kind)][i].malformed
    }

    /// Takes the messages delivered so far by output `i` of `kind`.
    pub fn take_delivered(&mut self, kind: Stream, i: usize) -> Vec<Delivered> {
        std::mem::take(&mut self.outputs[kind_index(kind)][i].delivered)
    }

    /// Messages delivered by every output so far.
    pub fn delivered_total(&self) -> usize {
        self.outputs
            .iter()
            .flatten()
            .map(|o| o.delivered.len())
            .sum()
    }

    /// One clock cycle: inputs presented, outputs sampled, edge. Returns
    /// what the AXI-Lite slave drove before the edge.
    pub fn step(&mut self) -> AxilOut {
        let cycle = self.sim.cycle();
        for kind in KINDS {
            let k = kind_index(kind);
            for i in 0..self.inputs[k].len() {
                let idle = self.traffic.input_idle;
                let q = &mut self.inputs[k][i];
                if !q.presenting && !q.beats.is_empty() {
                    q.presenting = !self.rng.chance(idle);
                }
                let beat = if q.presenting { q.beats.front() } else { None };
                self.sim.set_input(kind, i, beat);
            }
            for i in 0..self.outputs[k].len() {
                let ready = !self.outputs[k][i].held && !self.rng.chance(self.traffic.output_stall);
                self.sim.set_output_ready(kind, i, ready);
                self.outputs[k][i].ready_now = ready;
            }
        }
        self.sim.set_axil(self.axil);
        self.sim.eval();
        for kind in KINDS {
            let k = kind_index(kind);
            for i in 0..self.inputs[k].len() {
                if self.inputs[k][i].presenting && self.sim.input_ready(kind, i) {
                    let q = &mut self.inputs[k][i];
                    if let Some(b) = q.beats.pop_front() {
                        q.beats_in += 1;
                        if b.first {
                            q.accepted.push(Accepted { first_cycle: cycle });
                        }
                    }
                    q.presenting = false;
                }
            }
            for i in 0..self.outputs[k].len() {
                if !self.outputs[k][i].ready_now {
                    continue;
                }
                if let Some(b) = self.sim.output(kind, i) {
                    self.outputs[k][i].collect(b, cycle);
                }
            }
        }
        let axil = self.sim.axil();
        self.sim.tick();
        axil
    }

    /// Runs `cycles` cycles.
    pub fn run(&mut self, cycles: u64) {
        for _ in 0..cycles {
            self.step();
        }
    }

    /// Runs until `done` holds (checked every cycle) or `max` cycles
    /// passed; whether it held.
    pub fn run_until(&mut self, max: u64, mut done: impl FnMut(&RtlDevice) -> bool) -> bool {
        for _ in 0..max {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    /// Writes register `addr` (an AXI-Lite write transaction).
    pub fn write(&mut self, addr: u32, data: u32) -> Result<(), BusError> {
        self.axil.awaddr = addr;
        self.axil.wdata = data;
        self.axil.awvalid = true;
        self.axil.wvalid = true;
        self.axil.bready = true;
        let mut ok = false;
        for _ in 0..64 {
            let o = self.step();
            if o.awready && o.wready {
                ok = true;
                break;
            }
        }
        self.axil.awvalid = false;
        self.axil.wvalid = false;
        if ok {
            ok = false;
            for _ in 0..64 {
                if self.step().bvalid {
                    ok = true;
                    break;
                }
            }
        }
        self.axil.bready = false;
        ok.then_some(()).ok_or(BusError::Timeout(addr))
    }

    /// Reads register `addr` (an AXI-Lite read transaction).
    pub fn read(&mut self, addr: u32) -> Result<u32, BusError> {
        self.axil.araddr = addr;
        self.axil.arvalid = true;
        let mut ok = false;
        for _ in 0..64 {
            if self.step().arready {
                ok = true;
                break;
            }
        }
        self.axil.arvalid = false;
        self.axil.rready = true;
        let mut data = None;
        if ok {
            for _ in 0..64 {
                let o = self.step();
                if o.rvalid {
                    data = Some(o.rdata);
                    break;
                }
            }
        }
        self.axil.rready = false;
        data.ok_or(BusError::Timeout(addr))
    }

    /// Reads a 64-bit counter at `addr` (low word, then the latched high).
    pub fn read64(&mut self, addr: u32) -> Result<u64, BusError> {
        let lo = self.read(addr)?;
        let hi = self.read(addr + 4)?;
        Ok(u64::from(hi) << 32 | u64::from(lo))
    }
}

impl Output {
    fn collect(&mut self, b: Beat, cycle: u64) {
        self.beats_out += 1;
        if b.first {
            self.partial.clear();
            self.first_cycle = cycle;
        }
        self.partial.extend_from_slice(&b.data);
        if b.last {
            let buf: Bytes = std::mem::take(&mut self.partial).freeze();
            match Message::decode(&buf) {
                Ok((message, _)) => self.delivered.push(Delivered {
                    message,
                    first_cycle: self.first_cycle,
                    last_cycle: cycle,
                }),
                Err(_) => self.malformed += 1,
            }
        }
    }
}
