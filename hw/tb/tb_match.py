"""up_match: iSLIP-style matching, a message at a time, an input holding up
to PORTS matches (one per read port).

Random requests that persist for a while, outputs paused now and then,
and messages of random length whose last beat leaves under random
backpressure (`done`). Every cycle the matching is valid (no input or
output twice, a new pair only where a request was, on an enabled
output, an input on at most PORTS outputs, each through its own port),
a pair holds until its message is done, and a pair whose message ends
may be replaced in that same cycle. With round-robin outputs the
matching, the grant pointers and the accept pointers are cycle for cycle
those of a Python iSLIP (McKeown 1999: pointers move one beyond the
partner only on a first-iteration accept; with several ports an input
accepts a grant per free port, lowest port first, and its pointer moves
one beyond the last output it accepted). With every
request persistent, each one is granted within a bound; under DRR with
random weights and lengths too."""

import random

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from tbutil import drive, start

LW = 17


def cycles(n):
    """Cycles a test runs (fewer for 8 ports: Icarus is slow there)."""
    return 3000 if n <= 4 else 1500


def first_from(cands, start, n):
    for k in range(n):
        j = (start + k) % n
        if j in cands:
            return j
    return None


class Islip:
    """The reference: iSLIP with round-robin grants, held until done, with
    up_match's reservations against starvation."""

    def __init__(self, n, iters, patience, ports):
        self.n = n
        self.iters = iters
        self.patience = patience
        self.ports = ports
        self.skip = [[0] * n for _ in range(n)]   # [o][i]
        self.ob = [None] * n    # input matched to output o
        self.op = [None] * n    # through this port of it
        self.ib = [None] * (n * ports)    # output matched to port p of input i, i*ports+p
        self.g = [0] * n        # grant pointers
        self.a = [0] * n        # accept pointers

    def step(self, req, done, enable):
        n, k = self.n, self.ports
        raw = req
        out_free = [self.ob[o] is None or done[o] for o in range(n)]
        port_free = [self.ib[p] is None or done[self.ib[p]] for p in range(n * k)]
        in_free = [any(port_free[i * k:(i + 1) * k]) for i in range(n)]
        res = {}
        for o in range(n):
            full = {i for i in range(n) if self.skip[o][i] == self.patience}
            if full and enable[o]:
                res[o] = first_from(full, self.g[o], n)
        held = set(res.values())
        req = [[req[i][o] and res.get(o, i) == i and (i not in held or res.get(o) == i)
                for o in range(n)] for i in range(n)]
        m_out, m_port, moved = {}, {}, {}
        for it in range(self.iters):
            def open_ports(i):
                return [q for q in range(k) if port_free[i * k + q] and i * k + q not in m_port]
            grants = {}
            for o in range(n):
                if not (out_free[o] and enable[o]) or o in m_out:
                    continue
                cands = {i for i in range(n) if req[i][o] and open_ports(i)}
                if cands:
                    grants.setdefault(first_from(cands, self.g[o], n), set()).add(o)
            for i, outs in grants.items():
                for q in open_ports(i):
                    if not outs:
                        break
                    o = first_from(outs, self.a[i], n)
                    outs.discard(o)
                    m_port[i * k + q], m_out[o] = o, (i, q)
                    if it == 0:
                        moved.setdefault(i, []).append(o)
        for o in range(n):
            for j in range(n):
                if not raw[j][o]:
                    self.skip[o][j] = 0
                elif o in m_out:
                    if m_out[o][0] == j:
                        self.skip[o][j] = 0
                    elif not in_free[j] and self.skip[o][j] != self.patience:
                        self.skip[o][j] += 1
        for i, outs in moved.items():
            for o in outs:
                self.g[o] = (i + 1) % n
            self.a[i] = (outs[-1] + 1) % n
        for o in range(n):
            if out_free[o]:
                self.ob[o], self.op[o] = m_out.get(o, (None, None))
        for p in range(n * k):
            if port_free[p]:
                self.ib[p] = m_port.get(p)


def setup(dut):
    n = len(dut.enable)
    iw = max(1, (n - 1).bit_length())
    drive(dut.req, 0)
    drive(dut.len, 0)
    drive(dut.enable, (1 << n) - 1)
    drive(dut.done, 0)
    drive(dut.cfg_drr, 0)
    drive(dut.cfg_weight, 0)
    drive(dut.cfg_class, 0)
    drive(dut.cfg_load, 0)
    return n, iw


def sample(dut, n, iw, k):
    """The matching as the DUT holds it: input of each output and the port
    of that input, output of each port of each input (i*k+p)."""
    pw = max(1, (k - 1).bit_length())
    ob, oin, oport = int(dut.o_busy.value), int(dut.o_in.value), int(dut.o_port.value)
    ib, iout = int(dut.i_busy.value), int(dut.i_out.value)
    m = (1 << iw) - 1
    outs = [(oin >> (o * iw) & m) if ob >> o & 1 else None for o in range(n)]
    ports = [(oport >> (o * pw) & ((1 << pw) - 1)) if ob >> o & 1 else None for o in range(n)]
    ins = [(iout >> (p * iw) & m) if ib >> p & 1 else None for p in range(n * k)]
    return outs, ports, ins


def pointers(dut, n, iw):
    m = (1 << iw) - 1
    g, a = int(dut.gptr_reg.value), int(dut.aptr_reg.value)
    return [g >> (k * iw) & m for k in range(n)], [a >> (k * iw) & m for k in range(n)]


async def run(dut, n, iw, rng, cycles, flip, pause, stall, max_len, on=0.5, refill=0.6, model=None):
    """Drives random traffic: requests on with probability `on`, each
    flipped with probability `flip` a cycle, a finished pair's request
    again on with probability `refill`; outputs paused with probability
    `pause`, a matched message's beat held with probability `stall`.
    Returns the longest wait of a request (from the cycle it was on and
    its pair unmatched to its match) and the requests still waiting."""
    k = int(dut.PORTS.value)
    req = [[rng.random() < on for _ in range(n)] for _ in range(n)]
    lens = [[rng.randrange(64, 3000) for _ in range(n)] for _ in range(n)]
    left = [0] * n              # beats of the matched message still to leave
    since = {}                  # (i, o) -> cycle its request became persistent
    worst = 0
    prev = None
    prev_req = req
    prev_done = [False] * n
    prev_enable = [True] * n
    for cycle in range(cycles):
        await RisingEdge(dut.clk)
        await ReadOnly()
        outs, ports, ins = sample(dut, n, iw, k)
        # A valid matching, both views agreeing: an input on at most k
        # outputs, each through its own port.
        matched = [o for o in range(n) if outs[o] is not None]
        assert len({(outs[o], ports[o]) for o in matched}) == len(matched), f"a port twice: {outs} {ports}"
        for o in matched:
            assert ports[o] < k, f"output {o} on port {ports[o]} of {k}"
            assert ins[outs[o] * k + ports[o]] == o, f"views disagree: outs {outs} ports {ports} ins {ins}"
        assert sum(x is not None for x in ins) == len(matched), f"outs {outs} ins {ins}"
        if prev is not None:
            for o in range(n):
                if prev[o] is not None and not prev_done[o]:
                    assert outs[o] == prev[o], f"output {o} let go of input {prev[o]} before done"
                new = outs[o] is not None and (prev[o] is None or prev_done[o])
                if new:
                    i = outs[o]
                    assert prev_req[i][o], f"({i}, {o}) matched without a request"
                    assert prev_enable[o], f"paused output {o} matched"
                    left[o] = rng.randrange(1, max_len + 1)
                    if (i, o) in since:
                        worst = max(worst, cycle - since.pop((i, o)))
        if model is not None:
            assert (outs, ports, ins) == (model.ob, model.op, model.ib), (
                f"cycle {cycle}: rtl outs {outs} ports {ports} ins {ins}, "
                f"islip outs {model.ob} ports {model.op} ins {model.ib}")
            g, a = pointers(dut, n, iw)
            assert (g, a) == (model.g, model.a), f"pointers rtl {g} {a}, islip {model.g} {model.a}"
        prev = outs

        await FallingEdge(dut.clk)
        done = [False] * n
        for o in range(n):
            if outs[o] is not None and rng.random() >= stall:
                left[o] -= 1
                done[o] = left[o] == 0
        new_req = [[(not r) if rng.random() < flip else r for r in row] for row in req]
        for o in range(n):
            if done[o]:
                # The next message of the pair may or may not be queued.
                i = outs[o]
                new_req[i][o] = rng.random() < refill
                lens[i][o] = rng.randrange(64, 3000)
        req = new_req
        enable = [rng.random() >= pause for _ in range(n)]
        for i in range(n):
            for o in range(n):
                if req[i][o] and not (outs[o] == i and not done[o]):
                    since.setdefault((i, o), cycle)
                else:
                    since.pop((i, o), None)
        drive(dut.req, sum(1 << (i * n + o) for i in range(n) for o in range(n) if req[i][o]))
        drive(dut.len, sum(lens[i][o] << ((i * n + o) * LW) for i in range(n) for o in range(n)))
        drive(dut.done, sum(1 << o for o in range(n) if done[o]))
        drive(dut.enable, sum(1 << o for o in range(n) if enable[o]))
        if model is not None:
            model.step(req, done, enable)
        prev_req, prev_done, prev_enable = req, done, enable
    return worst, since


@cocotb.test()
async def round_robin_matching_is_islip_cycle_for_cycle(dut):
    n, iw = setup(dut)
    await start(dut)
    iters = int(dut.ITER.value)
    ports = int(dut.PORTS.value)
    model = Islip(n, iters, int(dut.PATIENCE.value), ports)
    rng = random.Random(17 * n + iters + 100 * ports)
    await run(dut, n, iw, rng, cycles(n), flip=0.1, pause=0.1, stall=0.3, max_len=5, model=model)


@cocotb.test()
async def every_persistent_request_is_granted_within_a_bound(dut):
    n, iw = setup(dut)
    await start(dut)
    rng = random.Random(5 + n)
    # Every request always on: each (input, output) pair must keep being
    # matched. A bound: the output passes over the busy input at most
    # PATIENCE times (a message each, at most max_len cycles without
    # stalls), then reserves it; it finishes its message, the input its
    # own and up to n - 1 more for other outputs reserving it too.
    max_len = 4
    bound = (int(dut.PATIENCE.value) + 2 * n) * (max_len + 1)
    worst, waiting = await run(dut, n, iw, rng, cycles(n), flip=0.0, pause=0.0, stall=0.0,
                                 max_len=max_len, on=1.0, refill=1.0)
    dut._log.info("longest wait %d cycles, bound %d", worst, bound)
    assert worst <= bound, f"a request waited {worst} cycles (bound {bound})"
    assert not waiting or max(cycles(n) - c for c in waiting.values()) <= bound


@cocotb.test()
async def drr_outputs_match_validly_and_starve_no_one(dut):
    n, iw = setup(dut)
    await start(dut)
    rng = random.Random(300 + n)
    drive(dut.cfg_drr, (1 << n) - 1)
    drive(dut.cfg_weight, sum((1 + rng.randrange(4)) << (k * 32) for k in range(n * n)))
    drive(dut.cfg_load, (1 << n) - 1)
    await RisingEdge(dut.clk)
    drive(dut.cfg_load, 0)
    # Lengths up to 3000 bytes against 1536-byte quanta: a DRR decision
    # may take a few cycles; every request is still served.
    worst, waiting = await run(dut, n, iw, rng, cycles(n), flip=0.0, pause=0.0, stall=0.2,
                               max_len=6, on=1.0, refill=1.0)
    bound = 4 * (int(dut.PATIENCE.value) + 2 * n) * (6 + 1)
    dut._log.info("longest wait %d cycles, bound %d", worst, bound)
    assert worst <= bound, f"a request waited {worst} cycles (bound {bound})"
    assert not waiting or max(cycles(n) - c for c in waiting.values()) <= bound
