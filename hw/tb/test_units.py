"""Runs the unit testbenches on Icarus (cocotb), sweeping parameters.

    python3 -m pytest -q hw/tb        (or: cargo test -p uniplane-hw-sim --test rtl_units)
"""

import os

import pytest
from cocotb.runner import get_runner

HERE = os.path.dirname(os.path.abspath(__file__))
RTL = os.path.join(HERE, "..", "rtl")


# Build products go under UNIPLANE_TB_BUILD (cargo's target directory when
# cargo runs these), else next to this file.
BUILD = os.environ.get("UNIPLANE_TB_BUILD", os.path.join(HERE, "sim_build"))


def run(toplevel, module, parameters, sources):
    name = "_".join([toplevel] + [f"{k}{v}" for k, v in sorted(parameters.items())])
    build = os.path.join(BUILD, name)
    runner = get_runner("icarus")
    runner.build(
        verilog_sources=[os.path.join(RTL, s) for s in sources],
        includes=[RTL],
        hdl_toplevel=toplevel,
        parameters=parameters,
        build_dir=build,
        always=True,
    )
    runner.test(
        hdl_toplevel=toplevel,
        test_module=module,
        build_dir=build,
        test_dir=build,
        extra_env={"PYTHONPATH": HERE},
    )


@pytest.mark.parametrize("depth", [2, 4, 16])
def test_fifo(depth):
    run("up_fifo", "tb_fifo", {"W": 37, "DEPTH": depth}, ["up_fifo.v"])


def test_skid():
    run("up_skid", "tb_fifo", {"W": 37}, ["up_skid.v"])


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_arb_mux(n):
    run("up_arb_mux", "tb_arb", {"N": n, "DW": 32}, ["up_arb_mux.v", "up_sched.v", "up_skid.v"])


@pytest.mark.parametrize("entries", [4, 32])
def test_fwd_table(entries):
    run("up_fwd_table", "tb_fwd_table", {"E": entries}, ["up_fwd_table.v"])


def test_filter():
    run("up_filter", "tb_filter", {"S": 4}, ["up_filter.v", "up_skid.v"])


@pytest.mark.parametrize("m", [2, 3])
def test_demux(m):
    run("up_demux", "tb_demux", {"M": m, "D": 4}, ["up_demux.v", "up_skid.v"])


@pytest.mark.parametrize("n,res,pool", [(2, 1, 0), (2, 2, 3), (4, 2, 8), (4, 8, 40), (8, 4, 32)])
def test_voq_buf(n, res, pool):
    run("up_voq_buf", "tb_voq_buf", {"N": n, "W": 32, "RES": res, "POOL": pool}, ["up_voq_buf.v"])


@pytest.mark.parametrize("n,res,pool,ports", [(2, 1, 0, 1), (4, 2, 8, 1), (4, 8, 40, 1),
                                             (2, 1, 0, 2), (4, 2, 8, 2), (4, 8, 40, 3)])
def test_voq_buf_read_ports(n, res, pool, ports):
    run("up_voq_buf", "tb_voq_one",
        {"N": n, "W": 32, "RES": res, "POOL": pool, "ONE_PORT": 1, "PORTS": ports, "HW": 8},
        ["up_voq_buf.v"])


@pytest.mark.parametrize("kernel", ["echo", "sum32"])
def test_kernel(kernel):
    run(f"up_kernel_{kernel}", "tb_kernels", {}, [f"kernels/up_kernel_{kernel}.v", "up_skid.v"])


@pytest.mark.parametrize("n,iters,patience,ports",
                         [(2, 1, 2, 1), (3, 2, 4, 1), (4, 1, 4, 1), (4, 3, 16, 1), (8, 2, 8, 1),
                          (2, 1, 2, 2), (3, 2, 4, 2), (4, 1, 4, 2), (4, 2, 16, 2), (4, 2, 4, 3), (8, 2, 8, 2)])
def test_match(n, iters, patience, ports):
    run("up_match", "tb_match", {"N": n, "ITER": iters, "PATIENCE": patience, "PORTS": ports},
        ["up_match.v", "up_sched.v"])
