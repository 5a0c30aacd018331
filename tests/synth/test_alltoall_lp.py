"""The alltoall LP reaches DGX-1's 8/3 cut bound; its program verifies and simulates near it."""

import pytest

from commflow import topology
from commflow.ir import to_msccl_xml, verify
from commflow.sim import lower_bound, simulate
from commflow.synth import alltoall_flow, logical_edges, synthesize
from tests.ir.msccl_conformance import violations

SIZE = 2**30


def test_dgx1_lp_time_is_the_eight_thirds_cut_bound():
    topo = topology.dgx1()
    flow = alltoall_flow(logical_edges(topo))
    block = SIZE / 8
    assert flow.seconds_per_byte * block == pytest.approx(
        lower_bound("alltoall", topo, SIZE).time, rel=1e-9
    )
    assert flow.seconds_per_byte == pytest.approx(8 / 3 / 25e9, rel=1e-9)
    for s in range(8):
        for d in range(8):
            if s != d:
                weights = [r.weight for r in flow.routes if (r.src, r.dst) == (s, d)]
                assert sum(weights) == pytest.approx(1.0)


def test_dgx1_program_within_five_percent_of_the_bound():
    topo = topology.dgx1()
    program = synthesize("alltoall", topo)
    verify(program)
    # a threadblock sends and receives on two commflow channels: each channel gets the least
    # number free on every pair of ranks it connects, 7 in all (MSCCL has 32)
    xml = to_msccl_xml(program)
    assert 'nchannels="7"' in xml and violations(xml, "msccl") == []
    bound = lower_bound("alltoall", topo, SIZE)
    result = simulate(program, topo, SIZE, model="flow")
    assert bound.time <= result.time <= bound.time / 0.95
