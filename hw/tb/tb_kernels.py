"""up_kernel_echo and up_kernel_sum32: every answer byte-exact against a
Python reference of the Rust kernels (services/kernel `Echo` and `Sum32`,
framed as the daemon's kernel device frames them), on random messages
with random idle input cycles and output back-pressure; and the cycles a
message takes, printed.

UNIPLANE_TB_KERNEL_MESSAGES sets how many random messages each run sends
(1,000 by default, so CI stays short; 10,000 is the acceptance run)."""

import os
import random

import cocotb
from cocotb.triggers import RisingEdge

from tbutil import HDR, Source, drive, get, put, start

MESSAGES = int(os.environ.get("UNIPLANE_TB_KERNEL_MESSAGES", "1000"))

SEND, PUSH = HDR["UP_REQ_SEND"], HDR["UP_REQ_PUSH"]
FLAG_ERROR = HDR["UP_FLAG_ERROR"]
FLAG_WHOLE = HDR["UP_FLAG_WHOLE"]
BAD_REQUEST = HDR["UP_STATUS_BAD_REQUEST"]
ANSWER = {SEND: HDR["UP_REQ_SEND_CMPL"], PUSH: HDR["UP_REQ_PUSH_CMPL"]}
# Types that are not data for a kernel (answers, one-sided, control, user).
OTHER = [HDR[f"UP_REQ_{t}"] for t in
         ["SEND_CMPL", "RECV", "WRTE", "READ", "FLSH", "COPY", "CNFG", "FWRD",
          "PUSH_CMPL", "CONNECT", "ACCEPT", "CLOSE", "NOTIFY"]] + [0x80, 0xfe]
SECOND_BEAT = {HDR["UP_REQ_READ"], HDR["UP_REQ_COPY"]}


# ------------------------------------------------- the Rust kernels, in Python

def echo(payload):
    """services/kernel Echo::on_message: the payload itself."""
    return payload, None


def sum32(payload):
    """services/kernel Sum32::sum: the wrapping sum of little-endian u32s as
    4 little-endian bytes, or Misaligned."""
    if len(payload) % 4:
        return None, "misaligned"
    s = sum(int.from_bytes(payload[i:i + 4], "little") for i in range(0, len(payload), 4))
    return (s & 0xFFFFFFFF).to_bytes(4, "little"), None


def reply_header(h, length):
    """The kernel device's reply_header: back to the source on its ports,
    the request's type, flags and seqnum, req_flag 0."""
    r = 0
    r = put(r, "SRC_UID", get(h, "DST_UID"))
    r = put(r, "DST_UID", get(h, "SRC_UID"))
    r = put(r, "MSG_LENGTH", length)
    r = put(r, "MSG_FLAG", get(h, "MSG_FLAG"))
    r = put(r, "MSG_SEQNUM", get(h, "MSG_SEQNUM"))
    r = put(r, "REQ_TYPE", get(h, "REQ_TYPE"))
    r = put(r, "PORT_SRC_PORT", get(h, "PORT_DST_PORT"))
    r = put(r, "PORT_DST_PORT", get(h, "PORT_SRC_PORT"))
    return r


def error_answer(h, status):
    """Message::error_answer for a port-form request."""
    r = 0
    r = put(r, "SRC_UID", get(h, "DST_UID"))
    r = put(r, "DST_UID", get(h, "SRC_UID"))
    r = put(r, "MSG_FLAG", FLAG_WHOLE | FLAG_ERROR)
    r = put(r, "MSG_SEQNUM", get(h, "MSG_SEQNUM"))
    r = put(r, "REQ_TYPE", ANSWER[get(h, "REQ_TYPE")])
    r = put(r, "PORT_REQ_FLAG", status)
    r = put(r, "PORT_SRC_PORT", get(h, "PORT_DST_PORT"))
    r = put(r, "PORT_DST_PORT", get(h, "PORT_SRC_PORT"))
    return r


def to_beats(data, rng):
    """Payload bytes in 32-byte beats (byte 0 at bits 255..248); the last
    beat's padding is random, so a kernel must go by msg_length."""
    beats = []
    for i in range(0, len(data), 32):
        chunk = data[i:i + 32]
        pad = bytes(rng.getrandbits(8) for _ in range(32 - len(chunk)))
        beats.append(int.from_bytes(chunk + pad, "big"))
    return beats


def expected(kernel, h, payload_beats, payload):
    """(beats, tlen) the kernel answers, or None when it drops the message."""
    kind = get(h, "REQ_TYPE")
    if kind not in (SEND, PUSH) or get(h, "MSG_FLAG") & FLAG_ERROR:
        return None
    if kernel == "echo":
        return [reply_header(h, len(payload))] + payload_beats, 32 + len(payload)
    answer, err = sum32(payload)
    if err:
        return [error_answer(h, BAD_REQUEST)], 32
    return [reply_header(h, 4), int.from_bytes(answer.ljust(32, b"\0"), "big")], 36


# --------------------------------------------------------------- the traffic

def payload_length(rng, aligned_bias):
    pick = rng.random()
    if pick < 0.4:
        n = rng.randint(0, 2048)
    elif pick < 0.7:
        n = rng.randint(0, 80)
    else:
        n = max(0, 32 * rng.randint(0, 64) + rng.choice([-4, -3, -1, 0, 1, 2, 4]))
    if rng.random() < aligned_bias:
        n -= n % 4
    return n


def random_message(rng, aligned_bias):
    """(header beats, payload, payload beats): mostly SEND and PUSH, now and
    then something a kernel does not answer."""
    data = rng.random() < 0.92
    if data:
        kind = rng.choice([SEND, PUSH])
        flags = rng.choice([FLAG_WHOLE, FLAG_WHOLE | 0x04, 0x01, 0x02, 0x00])
    else:
        kind = rng.choice(OTHER + [SEND, PUSH])
        flags = FLAG_WHOLE | (FLAG_ERROR if kind in (SEND, PUSH) else rng.choice([0, FLAG_ERROR]))
    n = payload_length(rng, aligned_bias)
    payload = bytes(rng.getrandbits(8) for _ in range(n))
    h = 0
    h = put(h, "SRC_UID", rng.getrandbits(48))
    h = put(h, "DST_UID", rng.getrandbits(48))
    h = put(h, "MSG_LENGTH", n)
    h = put(h, "MSG_FLAG", flags)
    h = put(h, "MSG_SEQNUM", rng.getrandbits(32))
    h = put(h, "REQ_TYPE", kind)
    h = put(h, "REQ_PARAM", rng.getrandbits(96) if rng.random() < 0.2 else 0)
    h = put(h, "PORT_SRC_PORT", rng.getrandbits(16))
    h = put(h, "PORT_DST_PORT", rng.getrandbits(16))
    headers = [h] + ([rng.getrandbits(256)] if kind in SECOND_BEAT else [])
    return headers, payload, to_beats(payload, rng)


class LenSource(Source):
    """Source that also drives s_tlen (bytes, header included) on each beat."""

    def send_message(self, beats, tlen):
        self.send(beats, tlen)

    def _present(self, beat, first, last, length):
        super()._present(beat, first, last, length)
        drive(self.dut.s_tlen, length)


class Monitor:
    """Takes answers off m_* with random back-pressure (beats, tlen on the
    first beat, cycle of the last beat) and notes the cycle each request's
    first beat went in."""

    def __init__(self, dut, stall, rng):
        self.dut, self.stall, self.rng = dut, stall, rng
        self.answers = []
        self.out_cycles = []
        self.in_cycles = []
        self.cycle = 0
        self.errors = []
        self.cur = None
        cocotb.start_soon(self._run())

    async def _run(self):
        d = self.dut
        while True:
            drive(d.m_tready, int(self.rng.random() >= self.stall))
            await RisingEdge(d.clk)
            self.cycle += 1
            if int(d.s_tvalid.value) and int(d.s_tready.value) and int(d.s_tfirst.value):
                self.in_cycles.append(self.cycle)
            if int(d.m_tvalid.value) and int(d.m_tready.value):
                first, last = int(d.m_tfirst.value), int(d.m_tlast.value)
                if first:
                    if self.cur is not None:
                        self.errors.append("first inside a message")
                    self.cur = ([], int(d.m_tlen.value))
                if self.cur is None:
                    self.errors.append("beat outside a message")
                    self.cur = ([], None)
                self.cur[0].append(int(d.m_tdata.value))
                if last:
                    self.answers.append(self.cur)
                    self.out_cycles.append(self.cycle)
                    self.cur = None


def kernel_of(dut):
    return "sum32" if hasattr(dut, "misaligned") else "echo"


async def setup(dut, idle, stall, seed):
    drive(dut.s_tvalid, 0)
    drive(dut.s_tlen, 0)
    drive(dut.m_tready, 0)
    await start(dut)
    rng = random.Random(seed)
    src = LenSource(dut, "s", idle=idle, rng=random.Random(seed + 1))
    mon = Monitor(dut, stall, random.Random(seed + 2))
    return rng, src, mon


async def drain(dut, src, mon, want_answers, limit):
    for _ in range(limit):
        await RisingEdge(dut.clk)
        if src.idle_now() and len(mon.answers) >= want_answers and mon.cur is None:
            break
    for _ in range(8):
        await RisingEdge(dut.clk)


async def random_traffic(dut, count, idle, stall, seed):
    kernel = kernel_of(dut)
    rng, src, mon = await setup(dut, idle, stall, seed)
    want, dropped, misaligned, beats = [], 0, 0, 0
    for _ in range(count):
        headers, payload, pbeats = random_message(rng, 0.6 if kernel == "sum32" else 0.0)
        h = headers[0]
        src.send(headers + pbeats, 32 * len(headers) + len(payload))
        beats += len(headers) + len(pbeats)
        e = expected(kernel, h, pbeats, payload)
        if e is None:
            dropped += 1
        else:
            want.append(e)
            if kernel == "sum32" and len(e[0]) == 1:
                misaligned += 1
    await drain(dut, src, mon, len(want), 40 * beats + 1000)
    assert not mon.errors, mon.errors[:5]
    assert len(mon.answers) == len(want), f"{len(mon.answers)} answers, {len(want)} expected"
    for i, (got, exp) in enumerate(zip(mon.answers, want)):
        assert got[0] == exp[0], f"answer {i}: beats differ\n got {[hex(b) for b in got[0][:3]]}\n want {[hex(b) for b in exp[0][:3]]}"
        assert got[1] == exp[1], f"answer {i}: tlen {got[1]}, want {exp[1]}"
    assert int(dut.dropped.value) == dropped
    assert int(dut.answered.value) == len(want) - misaligned
    if kernel == "sum32":
        assert int(dut.misaligned.value) == misaligned
    dut._log.info("%s: %d messages (%d beats), %d answers, %d dropped, %d misaligned, %d cycles",
                  kernel, count, beats, len(want), dropped, misaligned, mon.cycle)


@cocotb.test()
async def answers_are_byte_exact_under_idle_and_back_pressure(dut):
    await random_traffic(dut, MESSAGES, idle=0.2, stall=0.3, seed=11)


@cocotb.test()
async def answers_are_byte_exact_at_full_rate(dut):
    await random_traffic(dut, max(MESSAGES // 4, 100), idle=0.0, stall=0.0, seed=12)


@cocotb.test()
async def answers_are_byte_exact_with_a_mostly_stalled_output(dut):
    await random_traffic(dut, max(MESSAGES // 10, 100), idle=0.0, stall=0.8, seed=13)


def send_message(n, seq, rng):
    payload = bytes(rng.getrandbits(8) for _ in range(n))
    h = 0
    h = put(h, "SRC_UID", 0x0a0000000001)
    h = put(h, "DST_UID", 0x0a0000000002)
    h = put(h, "MSG_LENGTH", n)
    h = put(h, "MSG_FLAG", FLAG_WHOLE)
    h = put(h, "MSG_SEQNUM", seq)
    h = put(h, "REQ_TYPE", SEND)
    h = put(h, "PORT_SRC_PORT", 5)
    h = put(h, "PORT_DST_PORT", 7)
    return [h] + to_beats(payload, rng), 32 + n


@cocotb.test()
async def cycles_per_message(dut):
    """With m_tready always high and no idle input: the latency of a lone
    message (its first beat in to its answer's last beat out) and the
    cycles per message of a back-to-back stream."""
    kernel = kernel_of(dut)
    rng, src, mon = await setup(dut, 0.0, 0.0, 21)
    report = []
    for n in [0, 64, 1500, 2048]:
        # Latency: one message alone.
        beats, tlen = send_message(n, 1, rng)
        start_answers = len(mon.answers)
        src.send(beats, tlen)
        await drain(dut, src, mon, start_answers + 1, 10000)
        latency = mon.out_cycles[-1] - mon.in_cycles[-1]
        # Throughput: 100 messages back to back.
        k = 100
        for i in range(k):
            b, t = send_message(n, i, rng)
            src.send(b, t)
        await drain(dut, src, mon, start_answers + 1 + k, 100000)
        # Between the answers of the first and the last of the stream.
        per = (mon.out_cycles[-1] - mon.out_cycles[-k]) / (k - 1)
        in_beats = len(beats)
        report.append((n, in_beats, latency, per))
        assert per <= in_beats + (1 if kernel == "sum32" and n == 0 else 0) + 0.01, (n, per)
    for n, in_beats, latency, per in report:
        dut._log.info("%s: payload %4d B (%2d beats in): latency %2d cycles first beat in -> "
                      "last beat out; %.2f cycles per message back to back",
                      kernel, n, in_beats, latency, per)
        print(f"KERNEL-CYCLES {kernel} payload={n} beats_in={in_beats} latency={latency} "
              f"cycles_per_message={per:.2f}")
