"""Binomial trees (MPICH; Thakur, Rabenseifner & Gropp 2005): broadcast, reduce and allreduce
through :mod:`commflow.algorithms.trees`, and binomial gather and scatter.

Relative rank ``v = (rank - root) mod p``; the parent of ``v`` is ``v`` with its lowest set
bit cleared, so a broadcast reaches everyone in ``ceil(lg p)`` rounds. Costs with
``chunks == channels == 1`` (p ranks, n bytes, alpha s/message, beta s/byte, gamma s/byte
reduced; exact for broadcast and scatter, and for the others when p is a power of two; for
other p a rank receiving from several children at once finishes sooner):

- broadcast: ``ceil(lg p)·(alpha + n·beta)``;
- reduce: ``ceil(lg p)·(alpha + n·beta + n·gamma)``;
- allreduce (reduce to rank 0, then broadcast from it):
  ``2·ceil(lg p)·(alpha + n·beta) + ceil(lg p)·n·gamma``;
- gather and scatter (n = the gathered array): ``ceil(lg p)·alpha + (p-1)/p·n·beta``.

With ``chunks = k`` every block moves as k pieces and a rank forwards piece j before it
receives piece j+1. When a rank sends one message at a time this does not pay off (the root
sends every piece ``ceil(lg p)`` times: ``ceil(lg p)·(k·alpha + n·beta)``); when it can feed
all its links at once a broadcast takes about ``(ceil(lg p) + k - 1)·(alpha + n/k·beta)``.
"""

from __future__ import annotations

from commflow.algorithms.common import (
    ChunkLayout,
    merge_runs,
)
from commflow.algorithms.registry import register
from commflow.algorithms.trees import Tree, tree_program
from commflow.collectives import Collective
from commflow.ir import Program, ProgramBuilder, inp, out, scr

NAME = "binomial_tree"


def _lowbit(v: int) -> int:
    return v & -v


def _subtree_size(v: int, nranks: int) -> int:
    """Ranks in the binomial subtree of relative rank ``v`` (itself included)."""
    return nranks if v == 0 else min(_lowbit(v), nranks - v)


def _child_masks(v: int, nranks: int) -> list[int]:
    """Offsets ``m`` of the children ``v + m`` of relative rank ``v``, smallest first."""
    limit = nranks if v == 0 else _lowbit(v)
    masks, m = [], 1
    while m < limit and v + m < nranks:
        masks.append(m)
        m <<= 1
    return masks


def binomial_tree(nranks: int, root: int) -> Tree:
    """MPICH's binomial tree rooted at ``root``; children served largest subtree first."""
    parent = [-1] * nranks
    children: list[tuple[int, ...]] = [()] * nranks
    for v in range(nranks):
        rank = (v + root) % nranks
        if v:
            parent[rank] = (v - _lowbit(v) + root) % nranks
        masks = _child_masks(v, nranks)
        children[rank] = tuple((v + m + root) % nranks for m in reversed(masks))
    return Tree(root, tuple(parent), tuple(children))


def _tree_collective(
    collective: Collective, nranks: int, *, chunks: int, channels: int, root: int | None
) -> Program:
    tree = binomial_tree(nranks, 0 if root is None else root)
    return tree_program(
        collective, nranks, [tree], name=NAME, chunks=chunks, channels=channels, root=root
    )


def _children(v: int, nranks: int) -> list[tuple[int, int]]:
    """``(offset, subtree size)`` of the children of relative rank ``v``, smallest first."""
    return [(m, _subtree_size(v + m, nranks)) for m in _child_masks(v, nranks)]


def _gather_scatter(
    collective: Collective, nranks: int, *, chunks: int, channels: int, root: int | None
) -> Program:
    """Binomial gather (children's subtrees flow up, smallest first) or scatter (the root
    hands each child its subtree's blocks, largest first), MPICH style.

    Each rank keeps its subtree's blocks contiguously in scratch, ordered by relative rank,
    one run per pipelined piece (``lane``), so a subtree moves as one message. The root
    receives (sends) straight into (from) its output (input) when the subtree's blocks are
    contiguous there, and otherwise stages them in scratch with local copies.
    """
    p, root = nranks, root or 0
    layout = ChunkLayout(1, chunks, channels)
    cf = layout.cf
    gather = collective is Collective.GATHER
    b = ProgramBuilder(
        collective,
        p,
        chunk_factor=cf,
        name=NAME,
        root=root,
        params={"chunks": chunks, "channels": channels},
    )
    for c in range(channels):
        for k in range(chunks):
            lane = layout.index(0, c, 0, k)
            for v in range(p):
                rank, size = (v + root) % p, _subtree_size(v, p)
                parent = (v - _lowbit(v) + root) % p
                kids = _children(v, p) if gather else _children(v, p)[::-1]
                if v == 0:
                    for m, sc in kids:
                        blocks = [((root + m + i) % p) * cf + lane for i in range(sc)]
                        staged = list(range(lane * p + m, lane * p + m + sc))
                        _root_exchange(b, rank, (m + root) % p, blocks, staged, gather, c)
                elif size == 1 and gather:
                    b.send(rank, parent, inp(lane), channel=c)
                elif size == 1:
                    b.recv(rank, parent, out(lane), channel=c)
                elif gather:
                    b.copy(rank, inp(lane), scr(lane * size), channel=c)
                    for m, sc in kids:
                        b.recv(rank, (v + m + root) % p, scr(lane * size + m, sc), channel=c)
                    b.send(rank, parent, scr(lane * size, size), channel=c)
                else:
                    b.recv(rank, parent, scr(lane * size, size), channel=c)
                    for m, sc in kids:
                        b.send(rank, (v + m + root) % p, scr(lane * size + m, sc), channel=c)
                    b.copy(rank, scr(lane * size), out(lane), channel=c)
        own = (
            (inp(layout.index(0, c), chunks), out(layout.index(root, c), chunks))
            if gather
            else (inp(layout.index(root, c), chunks), out(layout.index(0, c), chunks))
        )
        b.copy(root, *own, channel=c)
    return b.build()


def _root_exchange(
    b: ProgramBuilder,
    root: int,
    child: int,
    blocks: list[int],
    staged: list[int],
    gather: bool,
    channel: int,
) -> None:
    """The root's side of one child's subtree: receive (gather) or send (scatter) the chunks
    at ``blocks`` of its output (input), through scratch chunks ``staged`` unless the blocks
    are contiguous."""
    count = len(blocks)
    if blocks == list(range(blocks[0], blocks[0] + count)):
        if gather:
            b.recv(root, child, out(blocks[0], count), channel=channel)
        else:
            b.send(root, child, inp(blocks[0], count), channel=channel)
        return
    runs = merge_runs(staged, blocks)
    if gather:
        b.recv(root, child, scr(staged[0], count), channel=channel)
        for s, d, n in runs:
            b.copy(root, scr(s, n), out(d, n), channel=channel)
    else:
        for s, d, n in runs:
            b.copy(root, inp(d, n), scr(s, n), channel=channel)
        b.send(root, child, scr(staged[0], count), channel=channel)


_COST = "ceil(lg p)"
register(
    [Collective.BROADCAST],
    NAME,
    _tree_collective,
    f"binomial tree broadcast (MPICH): {_COST}·(a + n·b), pipelined over chunks",
)
register(
    [Collective.REDUCE],
    NAME,
    _tree_collective,
    f"binomial tree reduce (MPICH): {_COST}·(a + n·b + n·g), pipelined over chunks",
)
register(
    [Collective.ALLREDUCE],
    NAME,
    _tree_collective,
    f"binomial reduce to rank 0, then binomial broadcast: 2·{_COST}·(a + n·b) + {_COST}·n·g",
)
register(
    [Collective.GATHER, Collective.SCATTER],
    NAME,
    _gather_scatter,
    f"binomial gather/scatter (MPICH): {_COST}·a + (p-1)/p·n·b",
)
