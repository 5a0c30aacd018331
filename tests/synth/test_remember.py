"""`synth.remembered`: within the block a synthesis is made once (the same program object
comes back for equal arguments and an equal topology); outside it, every call makes anew."""

from __future__ import annotations

import dataclasses

import commflow.synth.api as api
from commflow import topology
from commflow.synth import remember, remembered, synthesize
from commflow.topology.graph import make_topology


def test_the_same_call_returns_the_same_program_only_within_the_block(monkeypatch):
    made = []
    fresh = api._synthesize
    monkeypatch.setattr(api, "_synthesize", lambda *args: made.append(args) or fresh(*args))
    dgx1 = topology.dgx1()
    assert synthesize("allgather", dgx1, pieces=2) is not synthesize("allgather", dgx1,
                                                                       pieces=2)
    assert len(made) == 2
    with remembered():
        first = synthesize("allgather", dgx1, pieces=2)
        with remembered():  # nested: the outer block's memory
            again = synthesize("allgather", topology.dgx1(), pieces=2)  # an equal topology
        other = synthesize("allgather", dgx1, pieces=4)
        ring = synthesize("allgather", topology.load("ring4"), pieces=2)
    assert again is first and other is not first and len(made) == 5
    assert ring.nranks == 4 and dict(ring.params)["topology"] == "ring4"
    assert remember._MADE.get() is None  # forgotten after the block
    assert synthesize("allgather", dgx1, pieces=2) is not first and len(made) == 6


def test_a_topology_with_other_bandwidths_is_synthesized_anew():
    base = topology.load("ring4")
    faster = make_topology(base.name, base.nodes, [
        dataclasses.replace(lk, bandwidth=lk.bandwidth * 2) for lk in base.links])
    with remembered():
        assert synthesize("allgather", base) is synthesize("allgather", base)
        assert synthesize("allgather", faster) is not synthesize("allgather", base)


def test_every_pieces_count_shares_one_column_generation_within_the_block(monkeypatch):
    """MI250 x2's packing is fractional (column generation, seconds): made once for one and
    two pieces per root within the block."""
    packed = []
    fresh = api.pack_trees
    monkeypatch.setattr(api, "pack_trees",
                        lambda *args, **kw: packed.append(args) or fresh(*args, **kw))
    cluster = topology.load("mi250x2")
    with remembered():
        one = synthesize("allgather", cluster, pieces=1)
        two = synthesize("allgather", cluster, pieces=2)
    assert len(packed) == 1 and two.nsteps == 2 * one.nsteps
    assert dict(one.params)["packing"] == "columns"
