"""In-network aggregation: programs verify, reach size/B where the ring cannot, and respect
the in-network lower bound; trees read off switch topologies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.algorithms import aggregation_trees, build, build_for
from commflow.collectives import Collective
from commflow.errors import AlgorithmError, ProgramError
from commflow.ir import to_msccl_xml, verify
from commflow.sim import lower_bound, simulate
from commflow.topology import load

GIB = 1 << 30


@pytest.mark.parametrize("name", ["switch8", "fat-tree4"])
def test_ina_reaches_the_link_rate_where_the_ring_cannot(name):
    topo = load(name)
    program = build_for("allreduce", "ina", topo)
    verify(program)
    ina = simulate(program, topo, GIB, model="flow").algbw
    ring = simulate(build_for("allreduce", "ring", topo), topo, GIB, model="flow").algbw
    link = 25e9  # every link of these presets
    assert lower_bound("allreduce", topo, GIB, in_network=True).algbw == pytest.approx(link)
    assert 0.95 * link <= ina <= link * (1 + 1e-9)
    rs_ag = lower_bound("allreduce", topo, GIB).algbw
    n = topo.nranks
    assert rs_ag == pytest.approx(link * n / (2 * (n - 1)))
    assert ring <= rs_ag * (1 + 1e-9) < ina


def test_one_chunk_goes_up_then_down():
    topo = load("switch8")
    program = build_for("allreduce", "ina", topo, chunks=1)
    assert simulate(program, topo, GIB).time == pytest.approx(2 * GIB / 25e9, rel=1e-3)


def test_fat_tree_trees_hang_below_each_core_switch():
    topo = load("fat-tree4")
    trees, nodes = aggregation_trees(topo)
    names = [topo.nodes[v].name for v in nodes]
    assert len(trees) == 4 and len(nodes) == 8 + 8 + 4
    for parent in trees:
        roots = [p for p in range(16, len(parent)) if parent[p] == -1]
        assert len(roots) == 1 and names[roots[0] - 16].startswith("core")
        # every host hangs below its edge switch, every edge below an aggregation switch
        for host in range(16):
            edge = parent[host]
            assert names[edge - 16] == f"edge{host // 4}.{host % 4 // 2}"
            assert names[parent[edge] - 16].startswith(f"agg{host // 4}.")
            assert parent[parent[parent[edge]]] == -1


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 9), st.integers(1, 3), st.integers(1, 4), st.data())
def test_random_two_level_trees_verify(nranks, nleaves, chunks, data):
    leaves = [nranks + 1 + i for i in range(nleaves)]
    above = [data.draw(st.sampled_from(leaves)) for _ in range(nranks)]
    parent = tuple(above) + (-1,) + (nranks,) * nleaves
    used = set(above)
    parent = tuple(p if (i < nranks + 1 or i in used) else -2 for i, p in enumerate(parent))
    verify(build("allreduce", "ina", nranks, chunks=chunks, trees=(parent,)))


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: build_for("allreduce", "ina", load("dgx1")), AlgorithmError, "links to no switch"),
    (lambda: build("allgather", "ina", 4), AlgorithmError, "no algorithm 'ina' for allgather"),
    (lambda: build("allreduce", "ina", 4, channels=2), AlgorithmError, "use channels=1"),
    (lambda: build("allreduce", "ina", 2, trees=((2, 0, -1),)), AlgorithmError,
     "a switch above every rank"),
    (lambda: to_msccl_xml(build("allreduce", "ina", 4)), ProgramError, "no in-network"),
])
def test_bad_uses_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_live_runtime_and_tuning_leave_ina_out():
    from commflow.algorithms import available
    from commflow.runtime.programs import check_algorithm, names
    from commflow.tune import registered

    assert "ina" not in [a.name for a in available("allreduce")]
    assert "ina" in [a.name for a in available("allreduce", in_network=True)]
    assert "ina" not in names(Collective.ALLREDUCE)
    assert "ina" not in [c.method for c in registered("allreduce", load("switch8"))]
    with pytest.raises(AlgorithmError, match="aggregates in network switches"):
        check_algorithm(Collective.ALLREDUCE, "ina")
