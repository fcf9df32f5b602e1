"""up_voq_buf with ONE_PORT = 1 and PORTS read ports: read port p gives
the head of the queue m_sel[p], only the queues some port selects are
read (once, when two ports select the same one), and every cycle h_valid
/ h_len show for every queue the head it will have after this cycle's
read (the top HW bits of that beat), under random writes, random
selections and random backpressure per queue; every beat once, on its
queue, in order."""

import random

import cocotb
from cocotb.triggers import FallingEdge, RisingEdge

from tbutil import start


@cocotb.test()
async def the_read_ports_read_the_selected_queues_and_every_head_is_shown(dut):
    n = len(dut.m_valid)
    w, hw = len(dut.s_data), int(dut.HW.value)
    res, pool = int(dut.RES.value), int(dut.POOL.value)
    ports = int(dut.PORTS.value)
    iw = max(1, (n - 1).bit_length())
    dut.s_valid.value = 0
    dut.s_data.value = 0
    dut.s_dest.value = 0
    dut.m_ready.value = 0
    dut.m_sel.value = 0
    await start(dut)
    rng = random.Random(n * 7 + res + 1000 * ports)
    queues = [[] for _ in range(n)]
    sent = [[] for _ in range(n)]
    got = [[] for _ in range(n)]
    seq = 0
    for cycle in range(3000):
        # Inputs for this cycle: a random write, a random queue per port,
        # random readiness per queue (only selected queues may read).
        write = rng.random() < 0.6 and cycle < 2700
        dest = rng.randrange(n)
        data = rng.randrange(1 << hw) << (w - hw) | seq
        sel = [rng.randrange(n) for _ in range(ports)]
        ready = [rng.random() < 0.7 for _ in range(n)]
        dut.s_valid.value = int(write)
        dut.s_data.value = data
        dut.s_dest.value = dest
        dut.m_sel.value = sum(q << (p * iw) for p, q in enumerate(sel))
        dut.m_ready.value = sum(1 << q for q in range(n) if ready[q])
        await FallingEdge(dut.clk)
        reads = {q for q in sel if ready[q] and queues[q]}
        # A port on an empty queue shows whatever its slot held (x at first).
        md = dut.m_data.value.binstr
        for p, q in enumerate(sel):
            if queues[q]:
                beat = int(md[len(md) - (p + 1) * w:len(md) - p * w], 2)
                assert beat == queues[q][0], f"cycle {cycle}: port {p}, queue {q}'s head"
        hv = int(dut.h_valid.value)
        # The bits of an empty queue's head are whatever its slot held (x at first).
        hl = dut.h_len.value.binstr
        for q in range(n):
            rest = queues[q][1:] if q in reads else queues[q]
            assert (hv >> q & 1) == bool(rest), f"cycle {cycle}: h_valid of queue {q}"
            if rest:
                want = rest[0] >> (w - hw)
                got_len = int(hl[len(hl) - (q + 1) * hw:len(hl) - q * hw], 2)
                assert got_len == want, f"cycle {cycle}: h_len of queue {q}"
        accepted = write and int(dut.s_ready.value)
        await RisingEdge(dut.clk)
        for q in reads:
            got[q].append(queues[q].pop(0))
        if accepted:
            queues[dest].append(data)
            sent[dest].append(data)
            seq += 1
    assert sum(len(g) for g in got) > 500, "too little was read"
    for q in range(n):
        assert got[q] == sent[q][:len(got[q])], f"queue {q}: lost, duplicated or reordered"
        assert got[q] + queues[q] == sent[q]
