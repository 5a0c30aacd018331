"""Channels by tree depth (``lower_streams(levels=...)``): programs of any weighted trees
verify, also with the MSCCL targets' bounded buffers, and every wait between two edges'
channels points from a shallower depth to a deeper one."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Op, verify
from commflow.synth.streams import lower_streams

from .test_streams import _DOWN, DGX1, EDGES, _trees

N = EDGES.nranks


def _edge_waits(program, groups: int) -> list[tuple[int, int]]:
    """``(group waited on, group waiting)`` for every dependency between two edges'
    channels of one rank (local channels, numbered from ``N * N * groups``, left out)."""
    t = program.table
    pairs = []
    for i in range(len(t)):
        for d in t.dep_idx[t.dep_ptr[i] : t.dep_ptr[i + 1]].tolist():
            a, b = int(t.chan[d]), int(t.chan[i])
            if max(a, b) < N * N * groups and a // groups != b // groups:
                pairs.append((a % groups, b % groups))
    return pairs


@settings(max_examples=15, deadline=None)
@given(
    st.sampled_from(["allgather", "reducescatter", "allreduce", "broadcast", "reduce"]),
    st.randoms(use_true_random=False),
    st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3),
    st.integers(1, 4),
    st.integers(2, 16),
    st.integers(0, 7),
)
def test_any_trees_by_depth_verify_with_bounded_buffers(collective, rng, weights, pieces,
                                                        levels, root):  # fmt: skip
    kind = Collective(collective)
    roots = [root] if kind.rooted else range(N)
    down = _trees(EDGES, roots, rng, weights) if kind in _DOWN else []
    up = _trees(EDGES.reversed(), roots, rng, weights) if kind.reduces else []
    program = lower_streams(kind, EDGES, down=down, up=up, pieces=pieces, name="t",
                            root=root if kind.rooted else None, levels=levels)
    verify(program)
    verify(program, target="msccl")  # two chunks in flight per connection
    t = program.table
    sends = t.op == int(Op.SEND)
    edge = t.part[sends] * N + t.peer[sends]
    fits = [g for g in range(1, levels + 1) if np.array_equal(t.chan[sends] // g, edge)]
    assert len(fits) == 1  # every send on a channel of its edge, up to `levels` per edge
    assert all(a <= b for a, b in _edge_waits(program, fits[0]))  # depths share groups


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_dgx1_waits_point_to_the_next_depth_only(collective):
    from commflow.synth import synthesize

    program = synthesize(collective, DGX1, pieces=1, levels=8)
    depth = {"allgather": 4, "reducescatter": 4, "allreduce": 8}[collective]  # up + down
    waits = _edge_waits(program, depth)
    assert waits and all(b == a + 1 for a, b in waits)


def test_levels_must_not_be_negative():
    with pytest.raises(AlgorithmError, match="levels"):
        lower_streams(Collective.ALLGATHER, EDGES, down=[], pieces=1, name="t", levels=-1)


@pytest.mark.parametrize("levels", [2, 3, 5])
def test_depths_sharing_a_channel_never_deadlock(levels):
    # an allreduce's hops into the roots and out of them may share a channel: every channel
    # runs its hops up before its hops down
    from commflow.synth import synthesize

    verify(synthesize("allreduce", DGX1, pieces=1, levels=levels), target="msccl")
