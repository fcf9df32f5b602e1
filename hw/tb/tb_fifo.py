"""up_fifo and up_skid: every beat comes out once, in order, under any
pattern of idle inputs and stalled outputs, and one beat moves per cycle
when nothing stalls."""

import random

import cocotb
from cocotb.triggers import RisingEdge

from tbutil import start


async def pump(dut, n, idle, stall, seed):
    rng = random.Random(seed)
    width = len(dut.s_data)
    sent = [rng.getrandbits(width) for _ in range(n)]
    got = []
    i = 0
    cycles = 0
    valid = False
    dut.s_valid.value = 0
    dut.m_ready.value = 0
    while len(got) < n:
        assert cycles < 20 * n + 100, "stuck"
        if i < n and not valid and rng.random() >= idle:
            dut.s_data.value = sent[i]
            valid = True
        dut.s_valid.value = int(valid)
        ready = rng.random() >= stall
        dut.m_ready.value = int(ready)
        await RisingEdge(dut.clk)
        cycles += 1
        if valid and int(dut.s_ready.value):
            i += 1
            valid = False
            if i < n and rng.random() >= idle:
                dut.s_data.value = sent[i]
                valid = True
        if ready and int(dut.m_valid.value):
            got.append(int(dut.m_data.value))
    assert got == sent
    return cycles


@cocotb.test()
async def every_beat_once_in_order_under_random_patterns(dut):
    dut.s_valid.value = 0
    dut.m_ready.value = 0
    await start(dut)
    for seed, (idle, stall) in enumerate([(0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (0.3, 0.7), (0.8, 0.2)]):
        await pump(dut, 300, idle, stall, seed)


@cocotb.test()
async def one_beat_per_cycle_when_nothing_stalls(dut):
    dut.s_valid.value = 0
    dut.m_ready.value = 0
    await start(dut)
    cycles = await pump(dut, 500, 0.0, 0.0, 9)
    assert cycles <= 500 + 4, cycles
