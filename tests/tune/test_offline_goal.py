"""Issue 16's offline goal: on DGX A100 x4 and DGX H100 x8, tune's choice is never slower in
simulation than the NCCL-like baselines (multi_ring: NCCL's rings over rails; the double
binary tree) at any size from 1 KiB to 4 GiB."""

import pytest

from commflow import topology
from commflow.sim import simulate
from commflow.tune import offline_table, registered
from commflow.units import size_range

SIZES = size_range(1 << 10, 4 << 30, 16)
BASELINES = ("multi_ring", "double_binary_tree")


@pytest.mark.parametrize("name", ["dgx-a100x4", "dgx-h100x8"])
def test_auto_never_slower_than_nccl_like_baselines(name):
    topo = topology.load(name)
    table = offline_table(["allreduce"], topo, SIZES)
    programs = {c.method: c.program for c in registered("allreduce", topo)}
    assert set(BASELINES) <= set(programs)
    beaten = 0
    for size in SIZES:
        chosen = table.lookup("allreduce", topo.nranks, size)
        mine = simulate(programs[chosen], topo, size).time
        base = min(simulate(programs[b], topo, size).time for b in BASELINES)
        assert mine <= base * (1 + 1e-12), (size, chosen)
        beaten += mine < base * 0.99
    assert beaten >= 2  # at small sizes the one-message and log-step algorithms win outright
