"""up_filter: a message breaking the source, type or length rule is
dropped whole and counted under the first rule it breaks (the order of
underlay/src/filter.rs); the rest pass unchanged, under idle inputs and
backpressure."""

import random

import cocotb
from cocotb.triggers import RisingEdge

from tbutil import HDR, Sink, Source, drive, header, message_beats, set_slice, start

MASK48 = (1 << 48) - 1
TYPES = [HDR["UP_REQ_SEND"], HDR["UP_REQ_WRTE"], HDR["UP_REQ_READ"], HDR["UP_REQ_PUSH"]]


def beats_of(rng, seq):
    t = rng.choice(TYPES)
    src = rng.choice([0x0A0000010001, 0x0A0000010002, 0x0A0000020001])
    length = 0 if t == HDR["UP_REQ_READ"] else rng.randrange(300)
    hdr = header(src, 0x0A0000010003, t, length, seq)
    extra = 1 if t == HDR["UP_REQ_READ"] else 0
    hlen = 64 if extra else 32
    beats = message_beats(hdr, extra + (length + 31) // 32, seq)
    return beats, src, t, hlen + length


@cocotb.test()
async def violations_are_dropped_whole_and_counted_by_first_reason(dut):
    s = len(dut.cfg_src_valid)
    for sig in ("cfg_src_valid", "cfg_src_key", "cfg_src_mask", "cfg_types", "cfg_max_len",
                "s_tvalid", "s_tdata", "s_tfirst", "s_tlast", "m_tready"):
        drive(getattr(dut, sig), 0)
    await start(dut)
    rng = random.Random(5)
    counts = {"pass": 0, "source": 0, "type": 0, "length": 0}

    async def count():
        while True:
            await RisingEdge(dut.clk)
            for k in counts:
                counts[k] += int(getattr(dut, f"ev_{k}").value)

    cocotb.start_soon(count())
    src = Source(dut, "s", None, idle=0.3, rng=random.Random(1))
    sink = Sink(dut, "m", None, stall=0.3, rng=random.Random(2))
    want_counts = dict(counts)
    want = []
    for round_ in range(8):
        patterns = [(rng.choice([0x0A0000010001, 0x0A0000010000]), rng.choice([MASK48, MASK48 & ~0xFFFF]))
                    for _ in range(s)]
        valid = rng.getrandbits(s)
        types = sum(1 << t for t in TYPES if rng.random() < 0.7)
        max_len = 64 + rng.randrange(300)
        for i, (key, mask) in enumerate(patterns):
            set_slice(dut.cfg_src_key, i, 48, key)
            set_slice(dut.cfg_src_mask, i, 48, mask)
        drive(dut.cfg_src_valid, valid)
        drive(dut.cfg_types, types)
        drive(dut.cfg_max_len, max_len)
        await RisingEdge(dut.clk)
        for k in range(30):
            beats, s_uid, t, total = beats_of(rng, round_ << 8 | k)
            src_ok = any(valid >> i & 1 and (s_uid ^ key) & mask == 0 for i, (key, mask) in enumerate(patterns))
            if not src_ok:
                want_counts["source"] += 1
            elif not types >> t & 1:
                want_counts["type"] += 1
            elif total > max_len:
                want_counts["length"] += 1
            else:
                want_counts["pass"] += 1
                want.append(beats)
            src.send(beats)
        for _ in range(5000):
            await RisingEdge(dut.clk)
            if src.idle_now() and len(sink.messages) == len(want):
                break
        for _ in range(10):
            await RisingEdge(dut.clk)
        assert sink.messages == want, f"round {round_}"
        assert counts == want_counts, f"round {round_}: {counts} != {want_counts}"
    assert not sink.protocol_errors
