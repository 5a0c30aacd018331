"""Synthesized programs verify, export and simulate never faster than the bound."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commflow import topology
from commflow.errors import AlgorithmError
from commflow.ir import to_msccl_xml, verify
from commflow.sim import lower_bound, simulate
from commflow.synth import apportion, synthesize

SIZE = 2**30


@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=8), st.integers(1, 50))
def test_apportion_sums_and_stays_within_one_of_quota(weights, chunks):
    counts = apportion(weights, chunks)
    assert sum(counts) == chunks
    total = sum(weights)
    for w, c in zip(weights, counts, strict=True):
        assert abs(c - w / total * chunks) < 1


@pytest.mark.parametrize(
    "collective", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce"]
)
def test_small_instances_verify_export_and_respect_the_bound(collective):
    topo = topology.dgx1()
    program = synthesize(collective, topo, pieces=3, root=3)
    verify(program)
    assert "<algo" in to_msccl_xml(program)
    bound = lower_bound(collective, topo, SIZE, root=3)
    result = simulate(program, topo, SIZE, model="flow")
    assert result.time >= bound.time * (1 - 1e-9)


def test_dgx_a100_allgather_reaches_the_bound_within_two_percent():
    topo = topology.dgx_a100()
    program = synthesize("allgather", topo, pieces=128)
    bound = lower_bound("allgather", topo, SIZE)
    result = simulate(program, topo, SIZE, model="flow")
    assert bound.time <= result.time <= bound.time / 0.98


def test_unknown_objective_and_uncovered_collective_raise():
    with pytest.raises(AlgorithmError, match="objective"):
        synthesize("allgather", topology.dgx1(), objective="fastest")
    with pytest.raises(AlgorithmError, match="gather"):
        synthesize("gather", topology.dgx1())
