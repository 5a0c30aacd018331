"""SCCL step schedules: DGX-1 allgather's Pareto frontier is exactly (2,3,2) and (3,7,6)."""

import pytest

from commflow import topology
from commflow.errors import AlgorithmError
from commflow.ir import to_msccl_xml, verify
from commflow.synth import logical_edges, pareto, solve_instance, synthesize
from commflow.synth.steps import edge_capacity


def test_dgx1_allgather_pareto_frontier():
    frontier = pareto("allgather", topology.dgx1())
    assert [(s.steps, s.rounds, s.chunks) for s in frontier] == [(2, 3, 2), (3, 7, 6)]


@pytest.mark.parametrize(
    ("instance", "feasible"),
    [((2, 3, 2), True), ((2, 2, 2), False), ((2, 4, 3), False), ((1, 7, 1), False)],
)
def test_dgx1_instances(instance, feasible):
    assert (solve_instance(logical_edges(topology.dgx1()), *instance) is not None) == feasible


def test_double_nvlinks_carry_two_chunks_per_round():
    edges = logical_edges(topology.dgx1())
    cap = dict(
        zip(
            zip(edges.src.tolist(), edges.dst.tolist(), strict=True),
            edge_capacity(edges).tolist(),
            strict=True,
        )
    )
    assert cap[(0, 1)] == 2 and cap[(0, 2)] == 1


def test_latency_objective_gives_the_two_step_program():
    program = synthesize("allgather", topology.dgx1(), objective="latency")
    verify(program)
    assert dict(program.params) == {"steps": 2, "rounds": 3, "chunks": 2}
    assert "<algo" in to_msccl_xml(program)
    with pytest.raises(AlgorithmError, match="allgather only"):
        synthesize("allreduce", topology.dgx1(), objective="latency")
