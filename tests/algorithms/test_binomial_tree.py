"""Binomial trees: MPICH's tree shape, the alpha-beta closed forms, message counts."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commflow.algorithms import build
from commflow.algorithms.binomial_tree import binomial_tree
from commflow.algorithms.trees import Tree
from commflow.errors import AlgorithmError
from commflow.ir import Op

from .alphabeta import alpha_beta_time, message_count
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2 * 3 * 5 * 7 * 11 * 13 * 16)
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def _depth(tree: Tree, rank: int) -> int:
    return 0 if rank == tree.root else 1 + _depth(tree, tree.parent[rank])


@given(st.integers(1, 40).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p - 1))))
def test_tree_shape_is_mpich(case):
    p, root = case
    tree = binomial_tree(p, root)
    assert tree.root == root and tree.parent[root] == -1
    for rank in range(p):
        v = (rank - root) % p
        if v:
            # the parent clears the lowest set bit of the relative rank
            assert (tree.parent[rank] - root) % p == v & (v - 1)
        kids = [(c - root) % p for c in tree.children[rank]]
        assert kids == sorted(kids, reverse=True)  # largest subtree first
        assert all(tree.parent[c] == rank for c in tree.children[rank])
        assert _depth(tree, rank) == v.bit_count()


def test_from_parents_orders_children_and_rejects_non_trees():
    tree = Tree.from_parents([-1, 0, 0, 2])
    assert tree.children == ((2, 1), (), (3,), ())
    with pytest.raises(AlgorithmError, match="exactly one root"):
        Tree.from_parents([-1, -1])
    with pytest.raises(AlgorithmError, match="cycle"):
        Tree.from_parents([-1, 2, 1])


def _time(collective: str, p: int, root: int | None = None, **kw) -> Fraction:
    return alpha_beta_time(
        build(collective, "binomial_tree", p, root=root, **kw), ALPHA, BETA, SIZE
    )


@pytest.mark.parametrize("p", range(1, 18))
def test_broadcast_and_scatter_closed_forms(p):
    lg = math.ceil(math.log2(p))
    for root in {0, p - 1, p // 2}:
        assert _time("broadcast", p, root) == lg * (ALPHA + SIZE * BETA)
        assert _time("scatter", p, root) == lg * ALPHA + Fraction(p - 1, p) * SIZE * BETA


@pytest.mark.parametrize("p", range(1, 18))
def test_reduce_gather_allreduce_closed_forms(p):
    """Exact for powers of two; other p finish no later (a root receives from several
    children at once)."""
    lg = math.ceil(math.log2(p))
    exact = p & (p - 1) == 0
    want = {
        "reduce": lg * (ALPHA + SIZE * BETA),
        "gather": lg * ALPHA + Fraction(p - 1, p) * SIZE * BETA,
    }
    for root in {0, p - 1}:
        for coll, closed in want.items():
            got = _time(coll, p, root)
            assert got == closed if exact else got <= closed
    got = _time("allreduce", p)
    closed = 2 * lg * (ALPHA + SIZE * BETA)
    assert got == closed if exact else got <= closed


@pytest.mark.parametrize("p", [1, 5, 8, 13])
@pytest.mark.parametrize("coll", ROOTED)
def test_one_message_per_edge_and_piece(coll, p):
    for chunks, channels in ((1, 1), (3, 2)):
        program = build(coll, "binomial_tree", p, root=p - 1, chunks=chunks, channels=channels)
        assert message_count(program) == (p - 1) * chunks * channels


def test_pipelined_broadcast_forwards_each_piece_before_the_next_arrives():
    program = build("broadcast", "binomial_tree", 8, root=0, chunks=3)
    # rank 4 receives from 0 and forwards to 6 and 5, piece by piece
    ops = [(s.op, s.peer, s.dst.index if s.dst else s.src.index) for s in program.steps(4, 0)]
    assert ops == [
        (op, peer, k) for k in range(3) for op, peer in ((Op.RECV, 0), (Op.SEND, 6), (Op.SEND, 5))
    ]


@pytest.mark.parametrize("coll", [*ROOTED, "allreduce"])
def test_channel_ids_are_the_data_channels(coll):
    program = build(coll, "binomial_tree", 6, root=None if coll == "allreduce" else 2, channels=3)
    assert set(program.table.chan.tolist()) == {0, 1, 2}


def test_one_rank_only_copies():
    for coll in ("broadcast", "reduce", "gather", "scatter", "allreduce"):
        program = build(coll, "binomial_tree", 1, chunks=2, channels=2)
        assert set(program.table.op.tolist()) == {Op.COPY}


@pytest.mark.parametrize("p", [2, 7, 12])
@pytest.mark.parametrize("coll", [*ROOTED, "allreduce"])
def test_numeric(coll, p):
    for root in [None] if coll == "allreduce" else [0, p - 2]:
        check_numerically(build(coll, "binomial_tree", p, root=root, chunks=2, channels=2))
        check_numerically(build(coll, "binomial_tree", p, root=root), seed=1)
