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
from commflow.ir import Op, Program, Ref, inp, make_program, out, scr
from commflow.synth.rounding import apportion
from commflow.synth.trees import WeightedTree


def _down(
    builder: _Template,
    tree: Tree,
    rank: int,
    base: int,
    src: Ref,
    dst: Ref,
    deps: tuple[int, ...],
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
    builder: _Template, tree: Tree, rank: int, base: int, data: Ref, partial: Ref, final: Ref
) -> int | None:
    """Reduce one chunk up ``tree``: ``data`` is the rank's own input, ``partial`` where an
    inner rank accumulates, ``final`` where the root leaves the total. Children's pieces are
    reduced in turn, each on the channel of its edge; returns the root's last step."""
    acc = final if rank == tree.root else partial
    deps: tuple[int, ...] = ()
    for child in tree.children[rank]:
        deps = (builder.recv_reduce(rank, child, data, acc, channel=base + child, deps=deps),)
        data = acc
    if rank != tree.root:
        builder.send(rank, tree.parent[rank], data, channel=base + rank, deps=deps)
        return None
    if data != acc:
        deps = (builder.copy(rank, data, acc, channel=base + rank, deps=deps),)
    return deps[0]


def depth(trees: Sequence[WeightedTree]) -> int:
    """Edges on the longest root-to-leaf path of any of ``trees`` (0 when there are none)."""
    deepest = 0
    for t in trees:
        tree = Tree.from_parents(t.parent)
        level, frontier = 0, list(tree.children[tree.root])
        while frontier:
            level += 1
            frontier = [c for v in frontier for c in tree.children[v]]
        deepest = max(deepest, level)
    return deepest


def steps_per_piece(collective: Collective, nranks: int, units: int) -> int:
    """Steps :func:`lower` makes per piece: a send and a receive per tree edge and share, a
    copy per allgather or broadcast share, both halves for allreduce."""
    roots = 1 if collective.rooted else nranks
    copies = collective in (Collective.ALLGATHER, Collective.BROADCAST)
    halves = 2 if collective is Collective.ALLREDUCE else 1
    return roots * units * (halves * 2 * (nranks - 1) + copies)


def _shares(trees: Sequence[WeightedTree], units: int) -> list[Tree]:
    """``units`` equal shares of one root's data over its trees (by :func:`apportion`), share
    ``u`` being chunks ``u*pieces ..``. Equal shares matter: trees sharing a link get equal
    rates from it, so unequal ones would finish apart and leave links idle."""
    counts = apportion([t.weight for t in trees], units)
    return [
        Tree.from_parents(t.parent) for t, c in zip(trees, counts, strict=True) for _ in range(c)
    ]


def step_row(
    part: int, chan: int, op: Op, peer: int, src: Ref | None, dst: Ref | None
) -> tuple[int, ...]:
    """One step as the ``make_program`` columns ``part, chan, op, peer, src_buf, src_off,
    dst_buf, dst_off, count`` (-1 for a missing reference)."""
    ref = src or dst
    return (
        part, chan, int(op), peer,
        -1 if src is None else int(src.buffer), -1 if src is None else src.index,
        -1 if dst is None else int(dst.buffer), -1 if dst is None else dst.index,
        ref.count,
    )  # fmt: skip


class _Template:
    """The steps of piece 0 of every share, recorded as rows with in-template dependencies
    (the ``ProgramBuilder`` methods the tree phases use); :meth:`columns` repeats them for
    every piece, each piece's chunk offsets one higher."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, ...]] = []
        self.deps: list[tuple[int, ...]] = []

    def _add(self, part, chan, op, peer, src, dst, deps) -> int:
        self.rows.append(step_row(part, chan, op, peer, src, dst))
        self.deps.append(tuple(deps))
        return len(self.rows) - 1

    def send(self, rank: int, peer: int, src: Ref, *, channel: int, deps=()) -> int:
        return self._add(rank, channel, Op.SEND, peer, src, None, deps)

    def recv(self, rank: int, peer: int, dst: Ref, *, channel: int, deps=()) -> int:
        return self._add(rank, channel, Op.RECV, peer, None, dst, deps)

    def recv_reduce(
        self, rank: int, peer: int, src: Ref, dst: Ref, *, channel: int, deps=()
    ) -> int:
        return self._add(rank, channel, Op.RECV_REDUCE, peer, src, dst, deps)

    def copy(self, rank: int, src: Ref, dst: Ref, *, channel: int, deps=()) -> int:
        return self._add(rank, channel, Op.COPY, -1, src, dst, deps)

    def columns(self, pieces: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Step columns sorted by ``(part, chan)`` (pieces in order within a channel) and the
        CSR dependencies, for :func:`commflow.ir.make_program`."""
        rows = np.array(self.rows, dtype=np.int64)
        m = len(rows)
        piece = np.repeat(np.arange(pieces, dtype=np.int64), m)
        every = np.tile(rows, (pieces, 1))
        for col in (5, 7):
            every[:, col] += np.where(every[:, col] >= 0, piece, 0)
        order = np.lexsort((np.tile(np.arange(m), pieces), piece, every[:, 1], every[:, 0]))
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        names = ("part", "chan", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off", "count")
        columns = {k: every[order, c] for c, k in enumerate(names)}
        counts = np.array([len(d) for d in self.deps], dtype=np.int64)
        flat = np.array([d for ds in self.deps for d in ds], dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(counts)))
        own = order % m
        per = counts[own]
        dep_ptr = np.concatenate(([0], np.cumsum(per)))
        seg = np.repeat(starts[own] - dep_ptr[:-1], per) + np.arange(dep_ptr[-1])
        dep_idx = position[np.repeat(order - own, per) + flat[seg]]
        return columns, dep_ptr, dep_idx


DOWN = (Collective.ALLGATHER, Collective.BROADCAST, Collective.ALLREDUCE)
UP = (Collective.REDUCESCATTER, Collective.REDUCE, Collective.ALLREDUCE)


def chunk_refs(collective: Collective, block: int, k: int) -> tuple[Ref, Ref, Ref, Ref]:
    """``(input, partial, final, output)`` references of chunk ``k`` of the data of the root
    owning ``block`` (the root's first chunk in the rank-indexed buffers)."""
    i = block + k
    if collective is Collective.ALLREDUCE:
        return inp(i), out(i), out(i), out(i)
    if collective is Collective.ALLGATHER:
        return inp(k), out(i), out(i), out(i)
    if collective is Collective.REDUCESCATTER:
        return inp(i), scr(i), out(k), out(k)
    return inp(k), scr(k), out(k), out(k)


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
    if collective not in DOWN + UP:
        raise AlgorithmError(f"{name}: tree lowering does not implement {collective.value}")
    if units < 1 or pieces < 1:
        raise AlgorithmError(f"{name}: units and pieces must be >= 1, got {units}, {pieces}")
    chunks = units * pieces
    roots = [root] if collective.rooted else list(range(nranks))
    cf = chunks * nranks if collective is Collective.ALLREDUCE else chunks
    builder = _Template()
    base = 0
    for r in roots:
        block = 0 if collective.rooted else r * chunks
        finals: dict[int, int] = {}
        for u, tree in enumerate(_shares(trees_of(up, r, collective in UP, name), units)):
            data, partial, final, _ = chunk_refs(collective, block, u * pieces)
            for rank in range(nranks):
                last = _up(builder, tree, rank, base, data, partial, final)
                if last is not None:
                    finals[u] = last
            base += nranks
        for u, tree in enumerate(_shares(trees_of(down, r, collective in DOWN, name), units)):
            data, _, final, dst = chunk_refs(collective, block, u * pieces)
            deps = (finals[u],) if u in finals else ()
            for rank in range(nranks):
                _down(builder, tree, rank, base, final if deps else data, dst, deps)
            if collective in (Collective.ALLGATHER, Collective.BROADCAST):
                builder.copy(r, data, dst, channel=base + r)
            base += nranks
    columns, dep_ptr, dep_idx = builder.columns(pieces)
    return make_program(
        name,
        collective,
        nranks,
        chunk_factor=cf,
        columns=columns,
        root=root,
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        params=params,
    )


def trees_of(
    trees: Sequence[WeightedTree], root: int, needed: bool, name: str
) -> list[WeightedTree]:
    """``root``'s trees when the collective needs them (``AlgorithmError`` if there are none)."""
    if not needed:
        return []
    mine = [t for t in trees if t.root == root]
    if not mine:
        raise AlgorithmError(f"{name}: root {root} has no tree")
    return mine
