"""Double binary tree (NCCL 2.4; Sanders, Speck & Träff 2009, "Two-tree algorithms for full
bandwidth broadcast, reduction and scan").

Two complementary binary trees each carry half of the data. Tree 1 is NCCL's in-order binary
tree over positions ``0 .. m-1`` (a node's lowest set bit gives its level; position 0 is the
root, with one child); tree 2 is its mirror (position ``m-1-i``) when m is even and its shift
by one (position ``i-1 mod m``) when m is odd, so the leaves of tree 1 (odd positions) are
inner nodes of tree 2.

- allreduce (NCCL): the trees span all p ranks (roots 0 and p-1, or 1 for odd p); each half is
  reduced to its tree's root and broadcast back, both pipelined over ``chunks``.
- broadcast and reduce (Sanders et al.): the trees span the p-1 other ranks and the root sits
  above both tree roots, sending (receiving) alternate halves.

Cost in the alpha-beta model where a send keeps its rank busy for ``alpha + bytes·beta``
(tree depth ``d = O(lg p)``, ``chunks = k``, ``u = alpha + n/(2k)·beta``): a broadcast takes
about ``(2k + 2d)·u = n·beta + 2(k + d)·alpha + d·n/k·beta``, which the best k brings to
``n·beta + O(lg p·alpha + sqrt(n·lg p·alpha·beta))`` (Sanders et al.); a reduce takes the same
(plus ``n·gamma``) when every rank is inner in at most one tree (an even number of tree nodes)
and up to about ``(3k + 2d)·u`` otherwise; an allreduce is a reduce, then a broadcast.
Binomial trees, for comparison, need ``ceil(lg p)·(k·alpha + n·beta)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from commflow.algorithms.registry import register
from commflow.algorithms.trees import Tree, tree_program
from commflow.collectives import Collective
from commflow.ir import Program

NAME = "double_binary_tree"


def binary_tree_parents(m: int) -> list[int]:
    """Parent position of each of positions ``0 .. m-1`` in NCCL's in-order binary tree (-1 at
    the root 0): ``v`` with lowest set bit ``b`` hangs below ``(v ^ b) | 2b``, or below
    ``v ^ b`` when that is out of range."""
    parent = [-1] * m
    for v in range(1, m):
        bit = v & -v
        up = (v ^ bit) | (bit << 1)
        parent[v] = up if up < m else v ^ bit
    return parent


def double_binary_trees(
    nodes: Sequence[int], nranks: int, top: int | None = None
) -> tuple[Tree, Tree]:
    """The two complementary trees over ``nodes`` (ranks, in position order), as trees over
    ``nranks`` ranks; ``top`` (a rank not in ``nodes``) becomes the parent of both tree
    roots. Every rank of ``0 .. nranks-1`` must be in ``nodes`` or be ``top``."""
    m = len(nodes)
    base = binary_tree_parents(m)
    if m % 2 == 0:
        position = [m - 1 - i for i in range(m)]
        node_at = position
    else:
        position = [(i - 1) % m for i in range(m)]
        node_at = [(j + 1) % m for j in range(m)]
    trees = []
    for mapped in (False, True):
        parent = [-1] * nranks
        for i, rank in enumerate(nodes):
            up = base[position[i]] if mapped else base[i]
            if mapped and up >= 0:
                up = node_at[up]
            parent[rank] = nodes[up] if up >= 0 else (-1 if top is None else top)
        trees.append(Tree.from_parents(parent))
    return trees[0], trees[1]


def _generate(
    collective: Collective, nranks: int, *, chunks: int, channels: int, root: int | None
) -> Program:
    if collective is Collective.ALLREDUCE:
        trees = double_binary_trees(range(nranks), nranks)
    else:
        others = [(root + 1 + i) % nranks for i in range(nranks - 1)]
        trees = double_binary_trees(others, nranks, top=root)
    return tree_program(
        collective, nranks, trees, name=NAME, chunks=chunks, channels=channels, root=root
    )


register(
    [Collective.ALLREDUCE],
    NAME,
    _generate,
    "two complementary binary trees, half the data each, reduce then broadcast "
    "(NCCL 2.4): ~2·(2d + 2k)·(a + n/(2k)·b) + n·g, d = tree depth, k = chunks",
)
register(
    [Collective.BROADCAST, Collective.REDUCE],
    NAME,
    _generate,
    "root feeds two complementary binary trees over the other ranks, half the data "
    "each (Sanders, Speck & Träff 2009): ~(2d + 2k)·(a + n/(2k)·b)",
)
