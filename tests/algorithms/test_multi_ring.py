"""multi_ring: NCCL's channels, one ring per rail on clusters with a NIC per GPU."""

import pytest

from commflow import topology
from commflow.algorithms import build, build_for
from commflow.errors import AlgorithmError
from commflow.ir import verify
from commflow.sim import simulate


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter"])
def test_rail_rings_on_dgx_a100x2_take_eight_nics_where_one_ring_takes_one(collective):
    """Each of 8 rings carries 1/8 of the data through one 25 GB/s NIC hop each way: the ring
    cost on n/8 bytes, 2(p-1)/p * n/8 / 25 GB/s for allreduce (flow model), 4 times the single
    ring (which crosses between rails through a GPU, on two NICs)."""
    topo = topology.load("dgx-a100x2")
    program = build_for(collective, "multi_ring", topo)
    verify(program)
    assert dict(program.params)["rings"] == 8
    one = simulate(build_for(collective, "ring", topo), topo, 1 << 30, model="flow").algbw
    eight = simulate(program, topo, 1 << 30, model="flow").algbw
    assert eight > 3.9 * one
    hops = 2 * 15 / 16 if collective == "allreduce" else 15 / 16
    assert eight == pytest.approx(8 * 25e9 / hops, rel=0.01)


def test_default_is_channels_rings_in_rank_order():
    program = build("allgather", "multi_ring", 4, channels=3)
    verify(program)
    assert dict(program.params)["rings"] == 3 and program.chunk_factor == 3
    with pytest.raises(AlgorithmError, match="permutation"):
        build("allgather", "multi_ring", 4, orders=[(0, 1, 2, 2)])
