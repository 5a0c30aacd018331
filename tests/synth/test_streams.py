"""One stream per edge (:mod:`commflow.synth.streams`): programs of any weighted trees verify
(keys never deadlock), chunks follow the weights, and synthesized programs on edges with links
of their own reach the cut bound."""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow import topology
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Op, verify
from commflow.sim import lower_bound, simulate
from commflow.synth import (
    WeightedTree,
    apportion,
    logical_edges,
    stream_schedule,
    streams,
    synthesize,
)
from commflow.synth.boxes import dedicated_edges
from commflow.synth.list_schedule import DOWN_HOP, UP_HOP, list_schedule
from commflow.synth.merge import merged
from commflow.synth.streams import deal, lower_streams

SIZE = 2**30
_DOWN = (Collective.ALLGATHER, Collective.BROADCAST, Collective.ALLREDUCE)
DGX1 = topology.dgx1()
EDGES = logical_edges(DGX1)


def _tree(edges, root: int, rng) -> tuple[int, ...]:
    """A random spanning out-tree of ``edges`` rooted at ``root``."""
    parent = [-1] * edges.nranks
    reached = {root}
    arcs = list(zip(edges.src.tolist(), edges.dst.tolist(), strict=True))
    while len(reached) < edges.nranks:
        u, v = rng.choice([(u, v) for u, v in arcs if u in reached and v not in reached])
        parent[v] = u
        reached.add(v)
    return tuple(parent)


def _trees(edges, roots, rng, weights) -> list[WeightedTree]:
    out = []
    for r in roots:
        share = weights[: rng.randint(1, len(weights))]
        out += [WeightedTree(r, _tree(edges, r, rng), w / sum(share)) for w in share]
    return out


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(["allgather", "reducescatter", "allreduce", "broadcast", "reduce"]),
    st.randoms(use_true_random=False),
    st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3),
    st.integers(1, 12),
    st.integers(0, 7),
    st.one_of(st.none(), st.tuples(st.integers(0, 2), st.integers(1, 4)),
              st.tuples(st.lists(st.integers(1, 3), max_size=3).map(tuple), st.integers(1, 4))),
)
def test_any_weighted_trees_give_a_program_that_verifies(collective, rng, weights, pieces, root,
                                                         merge):  # fmt: skip
    kind = Collective(collective)
    roots = [root] if kind.rooted else range(8)
    down = _trees(EDGES, roots, rng, weights) if kind in _DOWN else []
    up = _trees(EDGES.reversed(), roots, rng, weights) if kind.reduces else []
    program = lower_streams(kind, EDGES, down=down, up=up, pieces=pieces, name="t",
                            root=root if kind.rooted else None, merge=merge)  # fmt: skip
    verify(program)  # postcondition (merged messages cover every chunk), no deadlock, no race
    sends = program.table.op == int(Op.SEND)
    channel = program.table.chan[sends]
    assert np.array_equal(channel, program.table.part[sends] * 8 + program.table.peer[sends])


@given(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=6), st.integers(1, 200))
def test_deal_gives_each_tree_its_share_spread_evenly(weights, pieces):
    trees = [WeightedTree(0, (-1, 0), w) for w in weights]
    owner = deal(trees, pieces)
    counts = apportion(weights, pieces)
    assert np.bincount(owner, minlength=len(weights)).tolist() == counts
    for t, c in enumerate(counts):
        where = np.flatnonzero(owner == t)
        if not c:
            continue
        ideal = (np.arange(c) + 0.5) / c * pieces
        assert np.abs(where + 0.5 - ideal).max() <= len(weights)


def test_merged_messages_keep_the_ends_of_each_tree_single_and_its_chunks_together():
    up_of = np.array([0, 1] * 5)  # two trees, alternating over 10 chunks
    down_of = np.full(10, -1)
    position, start, count = merged(up_of, down_of, (1, 3))
    # tree 0 holds positions 0 2 4 6 8 and buffer chunks 0-4; tree 1: 1 3 5 7 9 and 5-9
    assert position.tolist() == [0, 1, 2, 3, 8, 9]
    assert start.tolist() == [0, 5, 1, 6, 4, 9]
    assert count.tolist() == [1, 1, 3, 3, 1, 1]
    position, start, count = merged(up_of, down_of, None)
    assert position.tolist() == start.tolist() == list(range(10)) and set(count) == {1}
    with pytest.raises(AlgorithmError, match="merge"):
        lower_streams(Collective.ALLGATHER, EDGES, down=[], pieces=1, name="t", merge=(1, 0))


def test_merged_messages_ramp_up_and_down_at_the_ends_of_each_tree():
    up_of = np.array([0, 1] * 10)  # two trees of 10 chunks each
    down_of = np.full(20, -1)
    position, start, count = merged(up_of, down_of, ((1, 2), 3))
    # each tree: messages of 1, 2, then 3 (the middle 4: one of 3 and one of 1), then 2, 1
    assert position.tolist() == [0, 1, 2, 3, 6, 7, 12, 13, 14, 15, 18, 19]
    assert start.tolist() == [0, 10, 1, 11, 3, 13, 6, 16, 7, 17, 9, 19]
    assert count.tolist() == [1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 1, 1]
    few = np.zeros(5, dtype=np.int64)  # 5 chunks: too few for 1 + 2 at either end, so 1, 3, 1
    assert merged(few, np.full(5, -1), ((1, 2), 3))[2].tolist() == [1, 3, 1]
    for a, b in zip(merged(up_of, down_of, (2, 3)), merged(up_of, down_of, ((1, 1), 3)),
                    strict=True):
        assert a.tolist() == b.tolist()  # an int head is that many single chunks
    with pytest.raises(AlgorithmError, match="merge"):
        lower_streams(Collective.ALLGATHER, EDGES, down=[], pieces=1, name="t",
                      merge=((1, 0), 3))
    assert dict(synthesize("allgather", DGX1, pieces=24, merge=((1, 2), 4)).params)[
        "merge"] == "1,2:4"


def test_merged_programs_take_fewer_steps_and_keep_the_bound():
    whole = synthesize("allgather", DGX1, pieces=24)
    merged_program = synthesize("allgather", DGX1, pieces=24, merge=(2, 4))
    assert dict(merged_program.params)["merge"] == "2:4"
    assert len(merged_program.table.op) < 0.6 * len(whole.table.op)
    bound = lower_bound("allgather", DGX1, SIZE).time
    for program in (whole, merged_program):
        assert bound <= simulate(program, DGX1, SIZE, model="flow").time < 1.02 * bound


def test_every_stream_is_one_edge_one_way():
    program = synthesize("allreduce", DGX1, pieces=2)
    t = program.table
    assert dict(program.params)["lowering"] == "streams"
    for part, chan in set(zip(t.part.tolist(), t.chan.tolist(), strict=True)):
        on = (t.part == part) & (t.chan == chan)
        ops = {Op(int(o)) for o in t.op[on]}
        if chan == 64:  # local copies
            assert ops == {Op.COPY}
            continue
        sender, receiver = divmod(chan, 8)
        if part == sender:
            assert ops == {Op.SEND} and set(t.peer[on].tolist()) == {receiver}
        else:
            assert part == receiver and ops <= {Op.RECV, Op.RECV_REDUCE}
            assert set(t.peer[on].tolist()) == {sender}


def test_dedicated_edges_are_direct_links_and_rails():
    assert len(dedicated_edges(EDGES).src) == len(EDGES.src)  # DGX-1: NVLinks only
    assert dedicated_edges(logical_edges(topology.load("dgx-a100x2"))) is None  # NVSwitch
    cluster = topology.load("mi250x2")
    own = dedicated_edges(logical_edges(cluster))
    users = (own.load.toarray() > 0).sum(axis=0)
    assert users.max() == 1
    crossing = [(u, v) for u, v in zip(own.src.tolist(), own.dst.tolist(), strict=True)
                if (u < 16) != (v < 16)]  # fmt: skip
    assert sorted(crossing) == sorted([(i, i + 16) for i in range(16)] +
                                      [(i + 16, i) for i in range(16)])  # fmt: skip


@pytest.mark.parametrize(
    "collective", ["allgather", "reducescatter", "allreduce", "broadcast", "reduce"]
)
def test_dgx1_programs_reach_99_percent_of_the_bound(collective):
    program = synthesize(collective, DGX1, root=3)
    params = dict(program.params)
    assert params["lowering"] == "streams" and params["packing"] == "forest"
    result = simulate(program, DGX1, SIZE, model="flow")
    ratio = lower_bound(collective, DGX1, SIZE, root=3).time / result.time
    assert 0.99 <= ratio <= 1 + 1e-9


def test_switched_boxes_keep_the_shares_lowering():
    params = dict(synthesize("allgather", topology.dgx_a100(), pieces=4).params)
    assert "lowering" not in params or params["lowering"] != "streams"


def test_bad_arguments_raise():
    trees = [WeightedTree(r, _tree(EDGES, r, random.Random(r)), 1.0) for r in range(8)]
    with pytest.raises(AlgorithmError, match="pieces"):
        lower_streams(Collective.ALLGATHER, EDGES, down=trees, pieces=0, name="t")
    with pytest.raises(AlgorithmError, match="alltoall"):
        lower_streams(Collective.ALLTOALL, EDGES, down=trees, pieces=1, name="t")
    with pytest.raises(AlgorithmError, match="root 3"):
        lower_streams(Collective.ALLGATHER, EDGES, down=trees[:3], pieces=1, name="t")


def _line_schedule(up_parent, down_parent, priority, dur=1.0, lat=0.5, bonus=None, trees=None):
    n = 3
    count = len(priority)
    down_tree = np.zeros(count, dtype=np.int64) if trees is None else np.array(trees)
    return list_schedule(
        n,
        np.zeros(count, dtype=np.int64),
        np.zeros(count, dtype=np.int64) if len(up_parent) else np.full(count, -1),
        down_tree if len(down_parent) else np.full(count, -1),
        np.array(priority),
        np.array(up_parent, dtype=np.int64).reshape(-1, n),
        np.array(down_parent, dtype=np.int64).reshape(-1, n),
        np.full(n * n, dur),
        np.full(n * n, lat),
        np.full(n * n, 2 * count, dtype=np.int64),
        np.zeros(2 * count * n) if bonus is None else np.array(bonus, dtype=float),
        np.ones(2 * count * n),
    )


def test_list_schedule_pipelines_a_chain_one_chunk_per_edge_at_a_time():
    arrival = _line_schedule([], [(-1, 0, 1)], [0.0, 0.5])  # 0 -> 1 -> 2, two chunks
    down = arrival[: 2 * 3].reshape(2, 3)
    # chunk 0: edge 0->1 sends during [0, 1], arrives 1.5; 1->2 sends [1.5, 2.5], arrives 3
    # chunk 1: edge 0->1 sends [1, 2], arrives 2.5; 1->2 sends [2.5, 3.5], arrives 4
    assert down.tolist() == [[-1.0, 1.5, 3.0], [-1.0, 2.5, 4.0]]


def test_list_schedule_sends_first_the_hop_whose_bonus_lowers_its_key():
    # chunk 0 (priority 0) on 0 -> 1, 0 -> 2; chunk 1 (priority 0.5) on 0 -> 1 -> 2
    trees = [(-1, 0, 0), (-1, 0, 1)]
    fifo = _line_schedule([], trees, [0.0, 0.5], trees=[0, 1])
    # edge 0->1: chunk 0 [0, 1], chunk 1 [1, 2] (arrives 2.5), then 1->2 [2.5, 3.5]
    assert fifo[:6].tolist() == [-1.0, 1.5, 1.5, -1.0, 2.5, 4.0]
    bonus = np.zeros(2 * 2 * 3)
    bonus[[1, 4]] = [-1.0, -2.0]  # the hops into rank 1: chunk 1 has two hops ahead
    ahead = _line_schedule([], trees, [0.0, 0.5], bonus=bonus, trees=[0, 1])
    # edge 0->1: chunk 1 [0, 1] (arrives 1.5), 1->2 [1.5, 2.5]; chunk 0 [1, 2]
    assert ahead[:6].tolist() == [-1.0, 2.5, 1.5, -1.0, 1.5, 3.0]


def test_forward_backward_rounds_pack_the_tail_of_a_first_come_schedule():
    # as above: first come, chunk 1 reaches rank 2 at 4.0; the reversed problem sends first
    # the hop that arrived last, and the forward round after it puts chunk 1 first on 0 -> 1
    trees = [(-1, 0, 0), (-1, 0, 1)]
    fifo = _line_schedule([], trees, [0.0, 0.5], trees=[0, 1])
    problem = (3, np.zeros(2, dtype=np.int64), np.full(2, -1), np.array([0, 1]),
               np.zeros((0, 3), dtype=np.int64), np.array(trees, dtype=np.int64),
               np.full(9, 1.0), np.full(9, 0.5), np.full(9, 4, dtype=np.int64),
               np.ones(12))  # fmt: skip
    best = stream_schedule.forward_backward(problem, fifo, 1)
    assert best[:6].tolist() == [-1.0, 2.5, 1.5, -1.0, 1.5, 3.0]
    assert stream_schedule.forward_backward(problem, best, 2).tolist() == best.tolist()
    assert stream_schedule.forward_backward(problem, fifo, 0) is fifo


def test_list_schedule_sends_down_once_every_partial_is_up():
    arrival = _line_schedule([(-1, 0, 0)], [(-1, 0, 0)], [0.0])  # a star around rank 0
    assert arrival[:3].tolist() == [-1.0, 3.0, 3.0]  # down: after both partials (1.5)
    assert arrival[3:].tolist() == [-1.0, 1.5, 1.5]  # up, in parallel


@pytest.mark.parametrize("merge", [None, (1, 3)])
def test_programs_replay_their_list_schedule_exactly(monkeypatch, merge):
    seen = []

    def spy(*args):
        seen.append(list_schedule(*args))
        return seen[-1]

    monkeypatch.setattr(stream_schedule, "list_schedule", spy)
    for collective in ("allgather", "reducescatter", "allreduce"):
        before = len(seen)
        program = synthesize(collective, DGX1, pieces=16, merge=merge)
        result = simulate(program, DGX1, streams.REFERENCE_SIZE, model="flow")
        per_weight = 1 + 2 * stream_schedule.BACKWARD_ROUNDS  # a first, then back and forth
        assert len(seen) - before == len(stream_schedule.TAIL_WEIGHTS) * per_weight
        forward = [a.max() for k, a in enumerate(seen[before:]) if k % per_weight % 2 == 0]
        assert result.time == pytest.approx(min(forward), rel=1e-9)  # the first to finish


def test_hops_ahead_count_the_longest_path_left_from_each_hop():
    # an allreduce chunk on the line 0 - 1 - 2 rooted at 0: up 2 -> 1 -> 0, then down again
    line = np.array([[-1, 0, 1]])
    one = np.zeros(1, dtype=np.int64)
    ahead = stream_schedule.hops_ahead(one, one, one, line, line)
    assert ahead[DOWN_HOP].tolist() == [[0.0, 2.0, 1.0]]  # into 1: it and 1 -> 2
    assert ahead[UP_HOP].tolist() == [[0.0, 3.0, 4.0]]  # out of 2: two up, two down
    gather = stream_schedule.hops_ahead(one, np.full(1, -1), one, np.zeros((0, 3)), line)
    assert gather[UP_HOP].tolist() == [[0.0, 0.0, 0.0]]
