"""up_fwd_table: the first valid entry (in index order) whose key/mask
matches gives the port; else the default; else a miss. One lookup per
cycle, result in the next cycle; entries read back as written."""

import random

import cocotb
from cocotb.triggers import RisingEdge

from tbutil import drive, start

MASK48 = (1 << 48) - 1


def model(entries, default, uid):
    for valid, key, mask, port in entries:
        if valid and (uid ^ key) & mask == 0:
            return True, True, port
    if default is not None:
        return False, True, default
    return False, False, None


async def write_entry(dut, e, valid, key, mask, port):
    words = [key & 0xFFFFFFFF, (valid << 31) | (port << 16) | (key >> 32),
             mask & 0xFFFFFFFF, mask >> 32]
    for w, v in enumerate(words):
        drive(dut.wr_en, 1)
        drive(dut.wr_entry, e)
        drive(dut.wr_word, w)
        drive(dut.wr_data, v)
        await RisingEdge(dut.clk)
    drive(dut.wr_en, 0)


@cocotb.test()
async def pipelined_lookups_match_the_reference(dut):
    n = 1 << len(dut.wr_entry)
    for s in ("wr_en", "wr_entry", "wr_word", "wr_data", "rd_entry", "rd_word",
              "default_valid", "default_port", "lk_valid", "lk_uid"):
        drive(getattr(dut, s), 0)
    await start(dut)
    rng = random.Random(n)
    pool = [rng.getrandbits(48) for _ in range(6)]
    for round_ in range(6):
        entries = []
        for e in range(n):
            key = rng.choice(pool)
            mask = rng.choice([MASK48, MASK48 & ~0xFFFF, 0, rng.getrandbits(48)])
            entry = (rng.random() < 0.8, key & mask, mask, rng.randrange(256))
            entries.append(entry)
            await write_entry(dut, e, *entry)
        default = rng.randrange(256) if round_ % 2 else None
        drive(dut.default_valid, int(default is not None))
        drive(dut.default_port, default or 0)
        # Read back.
        for e in range(n):
            drive(dut.rd_entry, e)
            drive(dut.rd_word, 1)
            await RisingEdge(dut.clk)
            await RisingEdge(dut.clk)
            word = int(dut.rd_data.value)
            valid, key, _, port = entries[e]
            assert word == (valid << 31) | (port << 16) | (key >> 32), f"entry {e}"
        # A lookup every cycle.
        expected = []
        for i in range(200):
            uid = rng.choice(pool) ^ (rng.getrandbits(16) if rng.random() < 0.3 else 0)
            drive(dut.lk_valid, 1)
            drive(dut.lk_uid, uid)
            await RisingEdge(dut.clk)
            expected.append(model(entries, default, uid))
            if i > 0:
                match, hit, port = expected[i - 1]
                assert int(dut.res_valid.value) == 1
                assert int(dut.res_match.value) == int(match)
                assert int(dut.res_hit.value) == int(hit)
                if hit:
                    assert int(dut.res_port.value) == port
        drive(dut.lk_valid, 0)
        await RisingEdge(dut.clk)
