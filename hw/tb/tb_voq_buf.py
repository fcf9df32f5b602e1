"""up_voq_buf: one input's virtual output queues in one shared buffer.
Every beat comes out once, on its own queue, in the order it went in,
under random destinations, idle input and independent backpressure on
each output; ready drops only when the beat's queue has used its reserve
and the pool is full, so one queue may take its reserve and the whole
pool; every queue can be read in the same cycle; the held count is
exact."""

import random

import cocotb
from cocotb.triggers import RisingEdge

from tbutil import start


def setup(dut):
    n = len(dut.m_valid)
    res, pool = int(dut.RES.value), int(dut.POOL.value)
    dut.s_valid.value = 0
    dut.s_data.value = 0
    dut.s_dest.value = 0
    dut.m_ready.value = 0
    return n, res, pool


def beat(dest, seq):
    return (dest << 24) | seq


async def pump(dut, beats, idle, stall, seed, ready_of=None):
    """Sends `beats` (a list of destinations), collects every queue; returns
    (per-queue beats received, cycles). `ready_of(q, cycle)` overrides the
    random backpressure."""
    n, w = len(dut.m_valid), len(dut.s_data)
    res, pool = int(dut.RES.value), int(dut.POOL.value)
    rng = random.Random(seed)
    sent = [[] for _ in range(n)]
    got = [[] for _ in range(n)]
    i = 0
    valid = False
    cycle = 0
    while sum(len(g) for g in got) < len(beats):
        assert cycle < 50 * len(beats) + 200, "stuck"
        if i < len(beats) and not valid and rng.random() >= idle:
            d = beats[i]
            data = beat(d, i)
            dut.s_data.value = data
            dut.s_dest.value = d
            valid = True
        dut.s_valid.value = int(valid)
        ready = [(ready_of(q, cycle) if ready_of else rng.random() >= stall) for q in range(n)]
        dut.m_ready.value = sum(1 << q for q in range(n) if ready[q])
        await RisingEdge(dut.clk)
        cycle += 1
        held = sum(len(sent[q]) - len(got[q]) for q in range(n))
        assert int(dut.count.value) == held, (int(dut.count.value), held)
        if valid:
            d = beats[i]
            pooled = sum(max(0, len(sent[q]) - len(got[q]) - res) for q in range(n))
            room = len(sent[d]) - len(got[d]) < res or pooled < pool
            assert int(dut.s_ready.value) == int(room), "ready must drop only when there is no room"
        if valid and int(dut.s_ready.value):
            sent[beats[i]].append(data)
            i += 1
            valid = False
        mv = int(dut.m_valid.value)
        # The head of an empty queue is whatever its slot held (x at first).
        md = dut.m_data.value.binstr
        for q in range(n):
            if ready[q] and mv >> q & 1:
                got[q].append(int(md[len(md) - (q + 1) * w:len(md) - q * w], 2))
    dut.s_valid.value = 0
    dut.m_ready.value = 0
    await RisingEdge(dut.clk)
    for q in range(n):
        assert got[q] == sent[q], f"queue {q}: lost, duplicated or reordered"
    return got, cycle


@cocotb.test()
async def every_beat_once_on_its_queue_in_order_under_random_patterns(dut):
    n, res, pool = setup(dut)
    await start(dut)
    depth = n * res + pool
    rng = random.Random(n * 100 + depth)
    for seed, (idle, stall) in enumerate([(0.0, 0.0), (0.5, 0.0), (0.0, 0.5), (0.3, 0.7), (0.0, 0.9)]):
        # Bursts to one destination mixed with random ones.
        beats = []
        while len(beats) < 400:
            d = rng.randrange(n)
            beats += [d] * (1 + rng.randrange(2 * depth if rng.random() < 0.2 else 3))
        await pump(dut, beats[:400], idle, stall, seed)


@cocotb.test()
async def one_queue_may_take_its_reserve_and_the_whole_pool(dut):
    n, res, pool = setup(dut)
    await start(dut)
    # Queue 0's output is stalled: the input keeps its ready up to
    # res + pool beats for queue 0 (pump checks ready every cycle), then
    # waits; then the output resumes and everything drains.
    beats = [0] * (res + pool + 4) + [q % n for q in range(20)]

    def ready_of(q, cycle):
        return cycle > res + pool + 10 or q != 0

    got, _ = await pump(dut, beats, 0.0, 0.0, 1, ready_of)
    assert len(got[0]) == res + pool + 4 + len([q for q in range(20) if q % n == 0])


@cocotb.test()
async def a_full_queue_leaves_the_others_their_reserve(dut):
    n, res, pool = setup(dut)
    await start(dut)
    # Queue 0 stalled and filled past its reserve and the pool; beats for
    # the other queues sent first still pass, each queue keeping order.
    beats = [1 + k % (n - 1) for k in range(3 * n)] + [0] * (res + pool + 2)

    def ready_of(q, cycle):
        return cycle > res + pool + 6 * n or q != 0

    await pump(dut, beats, 0.0, 0.0, 3, ready_of)


@cocotb.test()
async def every_queue_moves_a_beat_per_cycle_at_once(dut):
    n, res, pool = setup(dut)
    await start(dut)
    # The input writes one beat per cycle round-robin over the queues and
    # every output reads in the same cycles: no slot is lost, nothing waits.
    beats = [k % n for k in range(50 * n)]
    _, cycles = await pump(dut, beats, 0.0, 0.0, 2)
    assert cycles <= len(beats) + 3, cycles
