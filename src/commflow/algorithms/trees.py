"""Spanning trees as data and the pipelined tree phases built on them: reduce up a tree,
broadcast down it, with every channel's data split over several trees (NCCL's double binary
tree uses two). Used by the binomial and double binary tree families."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from commflow.algorithms.common import (
    Action,
    ChunkLayout,
    copy,
    emit_eager,
    recv,
    recv_reduce,
    send,
)
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Buffer, Program, ProgramBuilder, Ref, inp, out


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
