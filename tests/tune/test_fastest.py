"""Choosing: the fastest candidate at one size, within ``max_steps``."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import commflow.tune.fastest as fastest
from commflow import topology
from commflow.algorithms import available, build, build_for, get
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Program, match_transfers
from commflow.sim import simulate
from commflow.synth import synthesize
from commflow.tune import choose, message_depth

PIECES = 8
"""Most pieces the tests let ``choose`` try (1, 2, 4, 8): small programs, fast tests."""
TINY, LARGE = 1 << 10, 1 << 30


def longest_message_chain(program: Program) -> int:
    """Reference for :func:`message_depth`: the longest path of the step graph (networkx),
    a message edge send -> receive weighing 1, channel order and dependencies 0."""
    t = program.table
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(t)))
    starts = set(t.channel_starts.tolist())
    graph.add_edges_from((i - 1, i, {"w": 0}) for i in range(1, len(t)) if i not in starts)
    for i in range(len(t)):
        graph.add_edges_from((int(d), i, {"w": 0}) for d in t.deps_of(i))
    sends = match_transfers(program)
    for recv in np.flatnonzero(sends >= 0).tolist():
        graph.add_edge(int(sends[recv]), recv, w=1)
    return nx.dag_longest_path_length(graph, weight="w")


@settings(max_examples=12, deadline=None)
@given(n=st.integers(2, 9), chunks=st.integers(1, 3))
def test_depth_of_rings_is_their_hop_count_however_pipelined(n, chunks):
    assert message_depth(build("allgather", "ring", n, chunks=chunks)) == n - 1
    assert message_depth(build("allreduce", "ring", n, chunks=chunks)) == 2 * (n - 1)
    assert message_depth(build("allgather", "direct", n)) == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda t: synthesize("allgather", t, pieces=2),
        lambda t: synthesize("allreduce", t, pieces=2),
        lambda t: synthesize("alltoall", t, pieces=2),
        lambda t: synthesize("allgather", t, objective="latency"),
        lambda t: build_for("allreduce", "double_binary_tree", t),
    ],
    ids=["ag-trees", "ar-trees", "a2a-lp", "ag-steps", "ar-dbt"],
)
def test_depth_matches_the_longest_message_chain(make):
    program = make(topology.dgx1())
    assert message_depth(program) == longest_message_chain(program)


@pytest.fixture(scope="module")
def dgx1_allgather():
    """DGX-1 allgather candidates built here, independently of ``tune.candidates``:
    ``(label, program, depth)``."""
    topo = topology.dgx1()
    found = [(f"trees x{p}", synthesize("allgather", topo, pieces=p)) for p in (1, 2, 4, 8)]
    found.append(("steps", synthesize("allgather", topo, objective="latency")))
    found += [(a.name, build_for("allgather", a.name, topo)) for a in available("allgather")]
    return topo, [(label, p, longest_message_chain(p)) for label, p in found]


def _times(topo, found, size):
    return {label: simulate(p, topo, size, model="alphabeta").time for label, p, _ in found}


@pytest.mark.parametrize("size", [TINY, LARGE])
def test_choose_is_the_fastest_candidate(dgx1_allgather, size):
    topo, found = dgx1_allgather
    program = choose("allgather", topo, size=size, pieces=PIECES)
    params = dict(program.params)
    times = _times(topo, found, size)
    assert params["balanced_size"] == size
    assert params["balanced_time"] == pytest.approx(min(times.values()), rel=1e-12)
    assert simulate(program, topo, size, model="alphabeta").time == params["balanced_time"]
    if size == TINY:  # latency-bound: a one-message program beats the depth-4 trees
        assert params["method"] == "direct" and params["depth"] == 1
    else:  # bandwidth-bound: the trees with the most pieces
        assert params["method"] == "bandwidth" and params["pieces"] == PIECES
        assert times["trees x8"] < min(t for k, t in times.items() if k != "trees x8")


def test_max_steps_drops_deeper_candidates(dgx1_allgather):
    topo, found = dgx1_allgather
    times = _times(topo, found, LARGE)
    for most in (1, 3):
        program = choose("allgather", topo, size=LARGE, pieces=PIECES, max_steps=most)
        params = dict(program.params)
        allowed = [times[label] for label, _, depth in found if depth <= most]
        assert params["depth"] <= most
        assert params["balanced_time"] == pytest.approx(min(allowed), rel=1e-12)
        assert params["balanced_time"] > times["trees x8"]


def test_rooted_collectives_keep_their_root():
    program = choose("broadcast", topology.load("ring4"), root=2)
    assert program.root == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 0}, "size"),
        ({"size": float("inf")}, "size"),
        ({"max_steps": 0}, "max_steps"),
        ({"pieces": -1}, "pieces"),
        ({"time_limit": 0.0}, "time_limit"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(AlgorithmError, match=message):
        choose("allgather", topology.load("ring4"), **kwargs)


def test_no_candidate_within_max_steps_raises(monkeypatch):
    monkeypatch.setattr(fastest, "available", lambda kind: [get(kind, "ring")])
    ring4 = topology.load("ring4")
    found = fastest.candidates(Collective.ALLGATHER, ring4, pieces=PIECES)
    fewest = min(longest_message_chain(c.program) for c in found)
    with pytest.raises(
        AlgorithmError, match=rf"max_steps={fewest - 1} .*fewest any has is {fewest}"
    ):
        choose("allgather", ring4, pieces=PIECES, max_steps=fewest - 1)


def test_candidates_skip_methods_that_do_not_apply():
    ring4 = topology.load("ring4")
    found = fastest.candidates(Collective.GATHER, ring4, pieces=2, root=0)
    assert [c.method for c in found] == [a.name for a in available("gather")]
