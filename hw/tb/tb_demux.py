"""up_demux: each message goes whole to the output of the first matching
rule (destination key/mask and type set), else to the default, else it
is dropped; counted as the Rust Demux counts."""

import random

import cocotb
from cocotb.triggers import Edge, RisingEdge

from tbutil import HDR, Sink, Source, drive, header, message_beats, set_slice, start

MASK48 = (1 << 48) - 1
TYPES = [HDR["UP_REQ_SEND"], HDR["UP_REQ_WRTE"]]
DSTS = [0x0A0000010001, 0x0A0000010002, 0x0A0000020001, 0x0A0000020002]


@cocotb.test()
async def messages_go_where_the_first_matching_rule_says(dut):
    m = len(dut.m_tvalid)
    d = len(dut.cfg_type_rules)
    for sig in ("cfg_type_rules", "cfg_rule_count", "cfg_key", "cfg_mask", "cfg_out",
                "cfg_default_valid", "cfg_default", "s_tvalid", "s_tdata", "s_tfirst", "s_tlast", "m_tready"):
        drive(getattr(dut, sig), 0)
    await start(dut)
    rng = random.Random(m)
    type_rules = {}

    async def type_memory():
        # The type memory lives outside the demux: answer its reads in the
        # same time step, as the asynchronous read port does.
        while True:
            await Edge(dut.lk_type)
            try:
                t = int(dut.lk_type.value)
            except ValueError:
                continue
            drive(dut.cfg_type_rules, type_rules.get(t, 0))

    counts = {"classified": 0, "miss": 0, "dropped": 0}

    async def count():
        while True:
            await RisingEdge(dut.clk)
            for k in counts:
                counts[k] += int(getattr(dut, f"ev_{k}").value)

    cocotb.start_soon(type_memory())
    cocotb.start_soon(count())
    src = Source(dut, "s", None, idle=0.3, rng=random.Random(1))
    sinks = [Sink(dut, "m", None, stall=0.3, rng=random.Random(10 + o), valid_index=o) for o in range(m)]
    want = [[] for _ in range(m)]
    want_counts = dict(counts)
    for round_ in range(6):
        rules = []
        for r in range(d):
            key = rng.choice(DSTS)
            mask = rng.choice([MASK48, MASK48 & ~0xFFFF])
            types = rng.choice([set(TYPES), {TYPES[1]}])
            out = rng.randrange(m + 1)  # m: no such output
            rules.append((key, mask, types, out))
            set_slice(dut.cfg_key, r, 48, key)
            set_slice(dut.cfg_mask, r, 48, mask)
            set_slice(dut.cfg_out, r, 8, out)
        count_ = rng.randrange(d + 1)
        drive(dut.cfg_rule_count, count_)
        default = rng.randrange(m) if rng.random() < 0.5 else None
        drive(dut.cfg_default_valid, int(default is not None))
        drive(dut.cfg_default, default or 0)
        type_rules.clear()
        for t in TYPES:
            type_rules[t] = sum(1 << r for r, rule in enumerate(rules) if t in rule[2])
        try:
            drive(dut.cfg_type_rules, type_rules.get(int(dut.lk_type.value), 0))
        except ValueError:
            pass
        await RisingEdge(dut.clk)
        await RisingEdge(dut.clk)
        for k in range(30):
            t = rng.choice(TYPES)
            dst = rng.choice(DSTS)
            length = rng.randrange(100)
            beats = message_beats(header(0x0A0000090009, dst, t, length, k), (length + 31) // 32, round_ << 8 | k)
            hit = None
            for key, mask, types, out in rules[:count_]:
                if (dst ^ key) & mask == 0 and t in types:
                    hit = out
                    break
            want_counts["classified"] += 1
            target = hit if hit is not None else default
            if hit is None:
                want_counts["miss"] += 1
            if target is None or target >= m:
                want_counts["dropped"] += 1
            else:
                want[target].append(beats)
            src.send(beats)
        for _ in range(5000):
            await RisingEdge(dut.clk)
            if src.idle_now() and all(len(s.messages) == len(w) for s, w in zip(sinks, want)):
                break
        for _ in range(10):
            await RisingEdge(dut.clk)
        for o in range(m):
            assert sinks[o].messages == want[o], f"round {round_} output {o}"
        assert counts == want_counts, f"round {round_}: {counts} != {want_counts}"
