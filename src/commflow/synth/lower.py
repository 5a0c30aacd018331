"""Lowering tree packings to programs: each root's data cut into chunks, each chunk moved
along one tree (down for broadcast/allgather, up with reductions for reduce/reducescatter,
up then down for allreduce). Every share of a root's data has its own tree and channels (the
edge into rank ``v`` is channel ``base + v``), so shares, and a rank's sends to different
children, progress independently while each edge stays in chunk order: forwarding is
pipelined chunk by chunk.

A root's data is cut into ``units`` equal shares given to its trees by weight (largest
remainders), so a link's load differs from the packing's by under ``1/units`` of a root's
data per tree; :func:`commflow.synth.trees.integral_shares` picks trees whose
weights are whole shares.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from commflow.algorithms.trees import Tree
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Program, ProgramBuilder, Ref, StepId, inp, out, scr
from commflow.synth.trees import WeightedTree


def apportion(weights: Sequence[float], chunks: int) -> list[int]:
    """Integer chunk counts summing to ``chunks`` proportional to ``weights`` (largest
    remainders, ties to the earlier weight)."""
    w = np.asarray(weights, dtype=np.float64)
    quota = w / w.sum() * chunks
    counts = np.floor(quota).astype(np.int64)
    order = np.argsort(-(quota - counts), kind="stable")
    counts[order[: chunks - int(counts.sum())]] += 1
    return counts.tolist()


def _down(
    builder: ProgramBuilder,
    tree: Tree,
    rank: int,
    base: int,
    src: Ref,
    dst: Ref,
    deps: tuple[StepId, ...],
) -> None:
    """Broadcast one chunk down ``tree``: the root sends ``src`` (after ``deps``), every other
    rank receives ``dst`` and forwards it. The edge into rank ``v`` is channel ``base + v``, so
    a rank's sends to its children run side by side."""
    if rank != tree.root:
        deps = (builder.recv(rank, tree.parent[rank], dst, channel=base + rank),)
        src = dst
    for child in tree.children[rank]:
        builder.send(rank, child, src, channel=base + child, deps=deps)


def _up(
    builder: ProgramBuilder, tree: Tree, rank: int, base: int, data: Ref, partial: Ref, final: Ref
) -> StepId | None:
    """Reduce one chunk up ``tree``: ``data`` is the rank's own input, ``partial`` where an
    inner rank accumulates, ``final`` where the root leaves the total. Children's pieces are
    reduced in turn, each on the channel of its edge; returns the root's last step."""
    acc = final if rank == tree.root else partial
    deps: tuple[StepId, ...] = ()
    for child in tree.children[rank]:
        deps = (builder.recv_reduce(rank, child, data, acc, channel=base + child, deps=deps),)
        data = acc
    if rank != tree.root:
        builder.send(rank, tree.parent[rank], data, channel=base + rank, deps=deps)
        return None
    if data != acc:
        deps = (builder.copy(rank, data, acc, channel=base + rank, deps=deps),)
    return deps[0]


def _shares(
    trees: Sequence[WeightedTree], units: int, pieces: int
) -> list[tuple[Tree, list[tuple[int, int]]]]:
    """``units`` equal shares of one root's data over its trees (by :func:`apportion`), each
    a tree and its ``pieces`` messages ``(first chunk, count)``, one chunk each (one message
    per chunk pipelines best: a large message stalls every hop). Equal shares matter:
    trees sharing a link get equal rates from it, so unequal ones would finish apart and leave
    links idle."""
    counts = apportion([t.weight for t in trees], units)
    shares = [
        Tree.from_parents(t.parent) for t, c in zip(trees, counts, strict=True) for _ in range(c)
    ]
    return [(tree, [(u * pieces + k, 1) for k in range(pieces)]) for u, tree in enumerate(shares)]


_DOWN = (Collective.ALLGATHER, Collective.BROADCAST, Collective.ALLREDUCE)
_UP = (Collective.REDUCESCATTER, Collective.REDUCE, Collective.ALLREDUCE)


def _refs(collective: Collective, block: int, k: int, n: int) -> tuple[Ref, Ref, Ref, Ref]:
    """``(input, partial, final, output)`` references of chunks ``k .. k+n-1`` of the data of
    the root owning ``block`` (the root's first chunk in the rank-indexed buffers)."""
    i = block + k
    if collective is Collective.ALLREDUCE:
        return inp(i, n), out(i, n), out(i, n), out(i, n)
    if collective is Collective.ALLGATHER:
        return inp(k, n), out(i, n), out(i, n), out(i, n)
    if collective is Collective.REDUCESCATTER:
        return inp(i, n), scr(i, n), out(k, n), out(k, n)
    return inp(k, n), scr(k, n), out(k, n), out(k, n)


def lower(
    collective: Collective,
    nranks: int,
    *,
    down: Sequence[WeightedTree] = (),
    up: Sequence[WeightedTree] = (),
    units: int,
    pieces: int,
    name: str,
    root: int | None = None,
    params: dict[str, object] | None = None,
) -> Program:
    """The program moving every root's data along its trees: ``units`` equal shares per root
    (trees get shares by weight), each cut into ``pieces`` pipelined chunks.

    ``down`` are out-trees (broadcast, allgather, the second half of allreduce), ``up``
    in-trees given as out-trees of the reversed edges (reduce, reducescatter, the first half
    of allreduce); a rooted collective uses the trees of ``root`` only. Raises
    ``AlgorithmError`` for alltoall, gather and scatter, or when a root lacks the trees its
    collective needs.
    """
    if collective not in _DOWN + _UP:
        raise AlgorithmError(f"{name}: tree lowering does not implement {collective.value}")
    if units < 1 or pieces < 1:
        raise AlgorithmError(f"{name}: units and pieces must be >= 1, got {units}, {pieces}")
    chunks = units * pieces
    roots = [root] if collective.rooted else list(range(nranks))
    cf = chunks * nranks if collective is Collective.ALLREDUCE else chunks
    builder = ProgramBuilder(
        collective, nranks, chunk_factor=cf, name=name, root=root, params=params
    )
    base = 0
    for r in roots:
        block = 0 if collective.rooted else r * chunks
        finals: dict[int, StepId] = {}
        for tree, ks in _shares(_of(up, r, collective in _UP, name), units, pieces):
            for k, n in ks:
                data, partial, final, _ = _refs(collective, block, k, n)
                for rank in range(nranks):
                    last = _up(builder, tree, rank, base, data, partial, final)
                    if last is not None:
                        finals[k] = last
            base += nranks
        for tree, ks in _shares(_of(down, r, collective in _DOWN, name), units, pieces):
            for k, n in ks:
                data, _, final, dst = _refs(collective, block, k, n)
                deps = (finals[k],) if k in finals else ()
                for rank in range(nranks):
                    _down(builder, tree, rank, base, final if deps else data, dst, deps)
                if collective in (Collective.ALLGATHER, Collective.BROADCAST):
                    builder.copy(r, data, dst, channel=base + r)
            base += nranks
    return builder.build()


def _of(trees: Sequence[WeightedTree], root: int, needed: bool, name: str) -> list[WeightedTree]:
    """``root``'s trees when the collective needs them (``AlgorithmError`` if there are none)."""
    if not needed:
        return []
    mine = [t for t in trees if t.root == root]
    if not mine:
        raise AlgorithmError(f"{name}: root {root} has no tree")
    return mine
