"""Binomial trees (MPICH; Thakur, Rabenseifner & Gropp 2005), and the pipelined tree phases
that the double binary tree reuses.

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

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from commflow.algorithms.common import (
    Action,
    ChunkLayout,
    copy,
    emit_eager,
    merge_runs,
    recv,
    recv_reduce,
    send,
)
from commflow.algorithms.registry import register
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Buffer, Program, ProgramBuilder, Ref, inp, out, scr

NAME = "binomial_tree"


@dataclass(frozen=True)
class Tree:
    """A tree spanning ranks ``0 .. len(parent)-1``.

    ``parent[r]`` is ``r``'s parent (-1 at ``root``); ``children[r]`` lists ``r``'s children in
    the order a broadcast serves them (a reduction receives from them in reverse order).
    """

    root: int
    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]

    @staticmethod
    def from_parents(parent: Sequence[int]) -> Tree:
        """The tree with these parents; children are served largest subtree first (ties: lower
        rank first). Raises ``AlgorithmError`` unless ``parent`` is one tree over all ranks."""
        n = len(parent)
        roots = [r for r in range(n) if parent[r] == -1]
        if len(roots) != 1:
            raise AlgorithmError(f"a tree needs exactly one root, got {roots} in {list(parent)}")
        kids: list[list[int]] = [[] for _ in range(n)]
        for r in range(n):
            if r != roots[0]:
                kids[parent[r]].append(r)
        order = [roots[0]]
        for r in order:
            order.extend(kids[r])
        if len(order) != n:
            raise AlgorithmError(f"parents {list(parent)} contain a cycle: not a tree")
        size = [1] * n
        for r in reversed(order[1:]):
            size[parent[r]] += size[r]
        children = tuple(tuple(sorted(k, key=lambda c: (-size[c], c))) for k in kids)
        return Tree(roots[0], tuple(parent), children)


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


def broadcast_actions(tree: Tree, rank: int, piece: Ref, source: Buffer) -> list[Action]:
    """``rank``'s steps to broadcast the chunks of ``piece`` (index and count; its buffer is
    not used) down ``tree``: the root sends them from its ``source`` buffer, every other rank
    receives them into its output and forwards them to its children."""
    data = (
        Ref(source, piece.index, piece.count)
        if rank == tree.root
        else out(piece.index, piece.count)
    )
    actions = [] if rank == tree.root else [recv(tree.parent[rank], data)]
    return actions + [send(child, data) for child in tree.children[rank]]


def reduce_actions(tree: Tree, rank: int, piece: Ref, partial: Buffer) -> list[Action]:
    """``rank``'s steps to sum the input chunks of ``piece`` (index and count) over all ranks
    into the root's output up ``tree``: an inner rank accumulates its children's pieces in
    its ``partial`` buffer (same chunk indices) and sends the sum to its parent; a root
    without children copies its input."""
    acc = Ref(Buffer.OUTPUT if rank == tree.root else partial, piece.index, piece.count)
    data = inp(piece.index, piece.count)
    actions = []
    for child in reversed(tree.children[rank]):
        actions.append(recv_reduce(child, data, acc))
        data = acc
    if rank != tree.root:
        actions.append(send(tree.parent[rank], data))
    elif data != acc:
        actions.append(copy(data, acc))
    return actions


def tree_program(
    collective: Collective,
    nranks: int,
    trees: Sequence[Tree],
    *,
    name: str,
    chunks: int,
    channels: int,
    root: int | None,
) -> Program:
    """Allreduce, broadcast or reduce with part ``t`` of every channel's data moving along
    ``trees[t]``, each part cut into ``chunks`` pipelined pieces.

    Allreduce reduces every piece to its tree's root, then broadcasts it back from there
    (rank outputs hold the partial sums in between). Broadcast and reduce need every tree
    rooted at ``root``. A rank handles pieces in order, except that its leaf roles wait for
    nothing and feed nothing: leaf sends of a reduction go first and leaf receives of a
    broadcast go last, so they never hold up the trees in which the rank is an inner node
    (see :func:`_leaf_roles`); every send is as early as its data allows. Raises
    ``AlgorithmError`` for other collectives.
    """
    if collective not in (Collective.ALLREDUCE, Collective.BROADCAST, Collective.REDUCE):
        raise AlgorithmError(
            f"{name}: tree phases implement allreduce, broadcast and reduce, not {collective.value}"
        )
    layout = ChunkLayout(len(trees), chunks, channels)
    builder = ProgramBuilder(
        collective,
        nranks,
        chunk_factor=layout.cf,
        name=name,
        root=root,
        params={"chunks": chunks, "channels": channels},
    )
    allreduce = collective is Collective.ALLREDUCE
    for c, rank in itertools.product(range(channels), range(nranks)):
        aside = _leaf_roles(trees, rank)
        pieces = [
            (t, out(layout.index(0, c, t, k))) for k in range(chunks) for t in range(len(trees))
        ]
        apart = [(trees[t], piece) for t, piece in pieces if t in aside]
        rest = [(trees[t], piece) for t, piece in pieces if t not in aside]
        actions: list[Action] = []
        if collective is not Collective.BROADCAST:
            partial = Buffer.OUTPUT if allreduce else Buffer.SCRATCH
            for tree, piece in apart + rest:
                actions += reduce_actions(tree, rank, piece, partial)
        if collective is not Collective.REDUCE:
            source = Buffer.OUTPUT if allreduce else Buffer.INPUT
            for tree, piece in rest + apart:
                actions += broadcast_actions(tree, rank, piece, source)
        if collective is Collective.BROADCAST and rank == root:
            own = layout.index(0, c)
            actions.append(copy(inp(own, layout.per_channel), out(own, layout.per_channel)))
        emit_eager(builder, rank, c, actions)
    return builder.build()


def _leaf_roles(trees: Sequence[Tree], rank: int) -> set[int]:
    """Indices of the trees in which ``rank`` is a leaf whose parent is not its parent in a
    tree where it is an inner node: its pieces there can move apart from the others and still
    pair with the parent's sends and receives in FIFO order."""
    inner_parents = {t.parent[rank] for t in trees if t.children[rank]}
    return {
        i
        for i, t in enumerate(trees)
        if not t.children[rank] and rank != t.root and t.parent[rank] not in inner_parents
    }


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
