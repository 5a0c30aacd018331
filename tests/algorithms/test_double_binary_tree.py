"""Double binary tree: NCCL's tree construction, complementarity, pipelined cost bounds."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commflow.algorithms import build
from commflow.algorithms.double_binary_tree import binary_tree_parents, double_binary_trees
from commflow.algorithms.trees import Tree

from .alphabeta import alpha_beta_time
from .interpret import check_numerically

ALPHA, BETA, SIZE = Fraction(3), Fraction(1, 7), Fraction(2 * 3 * 5 * 7 * 11 * 13 * 16)


def _edges(pairs: str) -> dict[int, int]:
    """``"8>4 8>12"`` -> ``{4: 8, 12: 8}`` (child: parent)."""
    return {int(c): int(p) for p, c in (e.split(">") for e in pairs.split())}


# NCCL src/graph/trees.cc, the drawings in its comments.
NCCL_14 = _edges("0>8 8>4 8>12 4>2 4>6 12>10 12>13 2>1 2>3 6>5 6>7 10>9 10>11")
NCCL_12_MIRROR = _edges("11>3 3>1 3>7 1>0 1>2 7>5 7>9 5>4 5>6 9>8 9>10")
NCCL_13_SHIFT = _edges("1>9 9>5 9>0 5>3 5>7 0>11 3>2 3>4 7>6 7>8 11>10 11>12")


def _as_edges(tree: Tree) -> dict[int, int]:
    return {c: p for c, p in enumerate(tree.parent) if p >= 0}


def test_trees_match_nccl_drawings():
    assert _as_edges(Tree.from_parents(binary_tree_parents(14))) == NCCL_14
    assert _as_edges(double_binary_trees(range(12), 12)[1]) == NCCL_12_MIRROR
    assert _as_edges(double_binary_trees(range(13), 13)[1]) == NCCL_13_SHIFT


def _depth(tree: Tree, rank: int) -> int:
    return 0 if tree.parent[rank] == -1 else 1 + _depth(tree, tree.parent[rank])


@given(st.integers(1, 64))
def test_trees_are_complementary_binary_trees(m):
    first, second = double_binary_trees(range(m), m)
    for tree in (first, second):
        assert all(len(k) <= 2 for k in tree.children)
        assert max(_depth(tree, r) for r in range(m)) <= math.ceil(math.log2(m))
    inner_in_both = [r for r in range(m) if first.children[r] and second.children[r]]
    # even m: every rank is a leaf in exactly one tree; odd m: exactly one rank is inner twice
    assert len(inner_in_both) == (m % 2 if m > 1 else 0)
    if m % 2 == 0:
        assert all(bool(first.children[r]) != bool(second.children[r]) for r in range(m))
    assert (first.root, second.root) == (0, 1 if m % 2 and m > 1 else m - 1)


@given(st.integers(2, 40).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p - 1))))
def test_rooted_trees_hang_below_the_root(case):
    p, root = case
    others = [(root + 1 + i) % p for i in range(p - 1)]
    trees = double_binary_trees(others, p, top=root)
    for tree in trees:
        assert tree.root == root and len(tree.children[root]) == 1
    assert trees[0].children[root] == (others[0],)


def _bound_units(collective: str, p: int, k: int, depth: int) -> int:
    """Measured ceilings (module docstring): broadcast (2k + 2d + 2) sends, reduce 2k + 2d, or
    3k + 2d with a rank inner in both trees; allreduce is the sum of both."""
    nodes = p if collective == "allreduce" else p - 1
    reduce = (3 if nodes % 2 else 2) * k + 2 * depth
    if collective == "reduce":
        return reduce
    broadcast = 2 * k + 2 * depth + 2
    return broadcast if collective == "broadcast" else reduce + broadcast


@pytest.mark.parametrize("p", [2, 3, 8, 13, 16, 21])
@pytest.mark.parametrize("collective", ["broadcast", "reduce", "allreduce"])
def test_pipelined_time_is_within_the_documented_bound(collective, p):
    root = None if collective == "allreduce" else p // 2
    nodes = range(p) if root is None else [(root + 1 + i) % p for i in range(p - 1)]
    trees = double_binary_trees(nodes, p, top=root)
    depth = max(_depth(t, r) for t in trees for r in range(p))
    for k in (1, 4, 16):
        program = build(collective, "double_binary_tree", p, chunks=k, root=root)
        unit = ALPHA + SIZE / (2 * k) * BETA
        assert (
            alpha_beta_time(program, ALPHA, BETA, SIZE)
            <= _bound_units(collective, p, k, depth) * unit
        )


def test_pipelined_two_trees_beat_one_binomial_tree():
    def time(name, coll, k):
        root = None if coll == "allreduce" else 0
        return alpha_beta_time(build(coll, name, 16, chunks=k, root=root), ALPHA, BETA, SIZE)

    for coll in ("broadcast", "allreduce"):
        assert time("double_binary_tree", coll, 16) < time("binomial_tree", coll, 1) / 2


@pytest.mark.parametrize("p", [2, 5, 10])
@pytest.mark.parametrize("coll", ["broadcast", "reduce", "allreduce"])
def test_numeric_and_one_channel_per_data_channel(coll, p):
    for root in [None] if coll == "allreduce" else [0, p - 1]:
        program = build(coll, "double_binary_tree", p, root=root, chunks=3, channels=2)
        assert set(program.table.chan.tolist()) == {0, 1}  # both trees share each channel
        check_numerically(program)
