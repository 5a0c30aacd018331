"""Synthesized programs verify, export and simulate never faster than the bound."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import commflow.synth.api as api
from commflow import topology
from commflow.collectives import Collective
from commflow.errors import AlgorithmError, ProgramError
from commflow.ir import to_msccl_xml, verify
from commflow.sim import lower_bound, simulate
from commflow.synth import WeightedTree, apportion, synthesize
from commflow.synth.lower import depth, steps_per_piece

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
    program = synthesize(collective, topo, pieces=2, root=3)
    verify(program)
    if program.root is None:
        assert "<algo" in to_msccl_xml(program)
    else:  # XML has no root: only root 0 exports
        with pytest.raises(ProgramError, match="carries no root"):
            to_msccl_xml(program)
        assert "<algo" in to_msccl_xml(synthesize(collective, topo, pieces=2, root=0))
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


@pytest.mark.parametrize(
    ("name", "collective", "model"),
    [
        ("ndv2x2", "allgather", "flow"),
        ("fat-tree4", "allreduce", "flow"),
        ("mi250", "reducescatter", "alphabeta"),
        ("dgx-h100x2", "reducescatter", "flow"),
        ("torus4x4", "allgather", "alphabeta"),
    ],
)
def test_default_programs_reach_98_percent_of_the_bound_and_never_beat_it(name, collective, model):
    topo = topology.load(name)
    program = synthesize(collective, topo)
    ratio = (
        lower_bound(collective, topo, SIZE).time / simulate(program, topo, SIZE, model=model).time
    )
    assert 0.98 <= ratio <= 1 + 1e-9


def test_depth_is_the_longest_root_to_leaf_path():
    chain = WeightedTree(0, (-1, 0, 1, 2), 1.0)
    star = WeightedTree(2, (2, 2, -1, 2), 1.0)
    assert depth([chain]) == 3
    assert depth([star]) == 1
    assert depth([star, chain]) == 3
    assert depth([]) == 0


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "broadcast"])
def test_steps_per_piece_counts_the_lowered_steps(collective):
    program = synthesize(collective, topology.dgx1(), pieces=2, root=1)
    units = dict(program.params)["units"]
    assert len(program.table) == 2 * steps_per_piece(Collective(collective), 8, units)


def test_default_pieces_per_tree_level_stay_within_the_step_budget(monkeypatch):
    topo = topology.fat_tree(4)  # every rank one switch hop from every other: depth 1
    assert dict(synthesize("allgather", topo).params)["pieces"] == api.PIECES_PER_LEVEL
    assert dict(synthesize("allreduce", topo).params)["pieces"] == 2 * api.PIECES_PER_LEVEL
    monkeypatch.setattr(api, "MAX_STEPS", 5000)
    program = synthesize("allgather", topo)
    assert dict(program.params)["pieces"] == 5000 // steps_per_piece(Collective.ALLGATHER, 16, 1)
    assert len(program.table) <= 5000


def test_step_budget_keeps_the_pieces_of_sixteen_ranks_up_to_a_cap():
    assert api.step_budget(8) == api.step_budget(16) == api.MAX_STEPS
    assert api.step_budget(32) == 4 * api.MAX_STEPS
    assert api.step_budget(64) == api.MOST_STEPS < 16 * api.MAX_STEPS
