"""Helpers shared by the unit testbenches: the header package read from
the generated Verilog (so Python and RTL share one field table), stream
drivers with idle and backpressure patterns, and a reference scheduler
that replays uniplane_dataplane::sched::Scheduler."""

import os
import random
import re

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

RTL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "rtl")


def header_package():
    """localparams of uniplane_header.vh as a dict of name -> int."""
    with open(os.path.join(RTL, "uniplane_header.vh")) as f:
        text = f.read()
    out = {}
    for m in re.finditer(r"(UP_\w+)\s*=\s*(?:\d+'h([0-9a-f]+)|\d+'d(\d+)|(\d+))", text):
        name, hx, dd, dec = m.groups()
        out[name] = int(hx, 16) if hx else int(dd if dd is not None else dec)
    return out


HDR = header_package()


def put(beat, field, value):
    """Beat (int, 256 bits) with `field` (e.g. "DST_UID") set."""
    lsb, w = HDR[f"UP_{field}_LSB"], HDR[f"UP_{field}_W"]
    mask = (1 << w) - 1
    return beat & ~(mask << lsb) | (value & mask) << lsb


def get(beat, field):
    lsb, w = HDR[f"UP_{field}_LSB"], HDR[f"UP_{field}_W"]
    return beat >> lsb & ((1 << w) - 1)


def header(src, dst, req_type, length, seq=0):
    b = 0
    b = put(b, "SRC_UID", src)
    b = put(b, "DST_UID", dst)
    b = put(b, "MSG_LENGTH", length)
    b = put(b, "MSG_FLAG", HDR["UP_FLAG_WHOLE"])
    b = put(b, "MSG_SEQNUM", seq)
    b = put(b, "REQ_TYPE", req_type)
    return b


def message_beats(hdr, payload_beats, tag):
    """The header beat and `payload_beats` payload beats tagged with `tag`."""
    return [hdr] + [(tag << 16) | i for i in range(payload_beats)]


async def start(dut, rst_cycles=4):
    cocotb.start_soon(Clock(dut.clk, 2, units="ns").start())
    dut.rst.value = 1
    for _ in range(rst_cycles):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    await RisingEdge(dut.clk)


# Several coroutines drive bits of one vector (a valid per input): writes
# within a time step do not see each other, so every write goes through a
# shadow of the whole vector.
_shadow = {}


def drive(sig, value):
    """Sets a whole signal (and its shadow)."""
    _shadow[sig._path] = value
    sig.value = value


def set_bit(sig, i, v):
    cur = _shadow.get(sig._path, 0)
    drive(sig, cur | (1 << i) if v else cur & ~(1 << i))


def set_slice(sig, i, width, v):
    cur = _shadow.get(sig._path, 0)
    mask = ((1 << width) - 1) << (i * width)
    drive(sig, cur & ~mask | (v << (i * width)) & mask)


def get_slice(sig, i, width):
    return int(sig.value) >> (i * width) & ((1 << width) - 1)


class Scheduler:
    """uniplane_dataplane::sched::Scheduler, line for line."""

    QUANTUM = 1536

    def __init__(self, n, drr=False, weights=None, classes=None):
        self.n = n
        self.drr = drr
        self.next = 0
        weights = weights or [1] * n
        classes = classes or [0] * n
        top = max(classes)
        self.classes = []
        for c in range(top + 1):
            members = [q for q in range(n) if classes[q] == c]
            self.classes.append({
                "queues": members,
                "quantum": [weights[q] * self.QUANTUM for q in members],
                "deficit": [0] * len(members),
                "pos": 0,
                "topped": False,
            })

    def pick(self, head):
        """head(q) -> length of queue q's head message, or None."""
        if not self.drr:
            for i in range(self.n):
                q = (self.next + i) % self.n
                if head(q) is not None:
                    self.next = (q + 1) % self.n
                    return q
            return None
        for d in self.classes:
            if any(head(q) is not None for q in d["queues"]):
                return self._drr(d, head)
        return None

    @staticmethod
    def _drr(d, head):
        n = len(d["queues"])
        idle = 0
        while True:
            q = d["queues"][d["pos"]]
            length = head(q)
            if length is None:
                d["deficit"][d["pos"]] = 0
                idle += 1
                if idle >= n:
                    d["topped"] = False
                    return None
                d["pos"] = (d["pos"] + 1) % n
                d["topped"] = False
            else:
                idle = 0
                if not d["topped"]:
                    d["deficit"][d["pos"]] += d["quantum"][d["pos"]]
                    d["topped"] = True
                if d["deficit"][d["pos"]] >= length:
                    d["deficit"][d["pos"]] -= length
                    return q
                d["pos"] = (d["pos"] + 1) % n
                d["topped"] = False


def _bit(sig, i):
    v = int(sig.value)
    return v if i is None else v >> i & 1


def _drive_bit(sig, i, v):
    if i is None:
        drive(sig, int(v))
    else:
        set_bit(sig, i, v)


class Source:
    """Drives a stream (prefix_tdata/tvalid/tready/tfirst/tlast, and
    prefix_tlen when `lw` is given) from a queue of messages, with random
    idle cycles; valid stays high until the beat is taken."""

    def __init__(self, dut, prefix, index=None, width=256, idle=0.0, rng=None, lw=None,
                 idle_first=True):
        self.dut, self.p, self.i, self.w, self.idle = dut, prefix, index, width, idle
        self.lw = lw
        self.idle_first = idle_first
        self.rng = rng or random.Random(2)
        self.queue = []  # (beats, length)
        self.sent_messages = 0
        cocotb.start_soon(self._run())

    def send(self, beats, length=0):
        self.queue.append((list(beats), length))

    def idle_now(self):
        return not self.queue

    def _sig(self, name):
        return getattr(self.dut, f"{self.p}_{name}")

    def _present(self, beat, first, last, length):
        if self.i is None:
            drive(self._sig("tdata"), beat)
        else:
            set_slice(self._sig("tdata"), self.i, self.w, beat)
            if self.lw:
                set_slice(self._sig("tlen"), self.i, self.lw, length)
        _drive_bit(self._sig("tfirst"), self.i, first)
        _drive_bit(self._sig("tlast"), self.i, last)
        _drive_bit(self._sig("tvalid"), self.i, 1)

    async def _run(self):
        clk = self.dut.clk
        pos = 0
        presenting = False
        _drive_bit(self._sig("tvalid"), self.i, 0)
        while True:
            await RisingEdge(clk)
            if presenting and _bit(self._sig("tready"), self.i):
                pos += 1
                presenting = False
                if pos == len(self.queue[0][0]):
                    self.queue.pop(0)
                    self.sent_messages += 1
                    pos = 0
            if not presenting and self.queue:
                may_idle = self.idle_first or pos > 0
                presenting = not (may_idle and self.rng.random() < self.idle)
            if presenting:
                beats, length = self.queue[0]
                self._present(beats[pos], pos == 0, pos == len(beats) - 1, length)
            else:
                _drive_bit(self._sig("tvalid"), self.i, 0)


class Sink:
    """Collects messages (lists of data words) from a stream with random
    backpressure, and notes protocol errors."""

    def __init__(self, dut, prefix, index=None, width=256, stall=0.0, rng=None, valid_index=None):
        self.dut, self.p, self.i, self.w, self.stall = dut, prefix, index, width, stall
        # For a demux, data is shared and only valid/ready are per output.
        self.vi = index if valid_index is None else valid_index
        self.rng = rng or random.Random(1)
        self.messages = []
        self.cycles = []
        self.beats = 0
        self.cur = None
        self.protocol_errors = []
        cocotb.start_soon(self._run())

    def _sig(self, name):
        return getattr(self.dut, f"{self.p}_{name}")

    async def _run(self):
        clk = self.dut.clk
        cycle = 0
        while True:
            ready = self.rng.random() >= self.stall
            _drive_bit(self._sig("tready"), self.vi, ready)
            await RisingEdge(clk)
            cycle += 1
            if _bit(self._sig("tvalid"), self.vi) and _bit(self._sig("tready"), self.vi):
                if self.i is None:
                    data = int(self._sig("tdata").value)
                else:
                    data = get_slice(self._sig("tdata"), self.i, self.w)
                first = _bit(self._sig("tfirst"), self.i)
                last = _bit(self._sig("tlast"), self.i)
                self.beats += 1
                if first:
                    if self.cur is not None:
                        self.protocol_errors.append("first inside a message")
                    self.cur = []
                if self.cur is None:
                    self.protocol_errors.append("beat outside a message")
                    self.cur = []
                self.cur.append(data)
                if last:
                    self.messages.append(self.cur)
                    self.cycles.append(cycle)
                    self.cur = None
