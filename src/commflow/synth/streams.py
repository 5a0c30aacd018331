"""Lowering weighted tree packings to one stream per edge, chunks in schedule order.

:mod:`commflow.synth.lower` gives every share of a root's data channels of its own, so a link
splits its bandwidth evenly between the shares on it (right when the shares are equal), but a
chunk then crosses each link at the link's rate over the number of shares on it, and a
packing at the cut bound may need very many equal shares (MI250 x2: a multiple of 83 per
root). Here every directed edge ``u -> v`` is one stream (channel ``u * nranks + v``)
carrying every chunk that crosses it, each at the full rate of the edge, and tree weights
may be any reals:

1. Each root's data is cut into ``pieces`` equal chunks, dealt to its trees by weight
   (:func:`~commflow.synth.rounding.apportion`) in stride order, so that every tree's chunks
   are spread evenly over the data (allreduce deals to its up-trees and its down-trees apart).
2. Every step gets a schedule key: its chunk's position in the root's data (a fraction,
   staggered per root) plus the expected delay of the hops before it, :data:`SLACK` times
   the hop's time (one chunk at the edge's share of its busiest link, plus latency, at
   ``size`` bytes) over the time of the whole packing.
3. Every stream runs its steps in key order. Keys grow along every dependency, so the program
   cannot deadlock, and a busy link's chunks arrive in about the order it sends them.

Streams sharing a link get equal rates whatever their loads, and a stream short of its rate
holds up every chunk behind it: :func:`~commflow.synth.api.synthesize` uses this lowering on
edges with links of their own (:func:`~commflow.synth.boxes.dedicated_edges`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from commflow.algorithms.trees import Tree
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Op, Program, Ref, make_program
from commflow.synth.links import LogicalEdges
from commflow.synth.lower import DOWN, UP, chunk_refs, trees_of
from commflow.synth.rounding import apportion
from commflow.synth.trees import WeightedTree

SLACK = 6.0
"""Hop delays in the schedule keys, in hop times. Queues at busy links make a hop take longer
than one chunk's transfer, and a stream whose next chunk is late waits for it: MI250 x2
allgather (4,000 pieces) reaches 84.7% of the bound with 2, 98.4% with 3 and 98.2% with 4."""

LATENCY_SLACK = 2.0

REFERENCE_SIZE = float(2**30)
"""Bytes of the collective the hop latencies are weighed at by default (large messages,
where the bandwidth objective matters)."""

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
"""Stagger of the roots' chunk positions (root ``r`` starts at ``r * _GOLDEN mod 1`` of a
chunk), so that chunks of different roots rarely share a key."""


def lower_streams(
    collective: Collective,
    edges: LogicalEdges,
    *,
    down: Sequence[WeightedTree] = (),
    up: Sequence[WeightedTree] = (),
    pieces: int,
    name: str,
    root: int | None = None,
    size: float = REFERENCE_SIZE,
    params: dict[str, object] | None = None,
) -> Program:
    """The program moving every root's data along its weighted trees over ``edges``, in
    ``pieces`` chunks per root, one stream per edge (see the module).

    ``down`` are out-trees (broadcast, allgather, the second half of allreduce), ``up``
    in-trees given as out-trees of the reversed edges (reduce, reducescatter, the first half
    of allreduce); a rooted collective uses the trees of ``root`` only. ``size`` (bytes of
    the collective) weighs hop latency against chunk transfer in the schedule keys. Raises
    ``AlgorithmError`` for alltoall, gather and scatter, ``pieces < 1``, or a root without
    the trees its collective needs.
    """
    if collective not in DOWN + UP:
        raise AlgorithmError(f"{name}: tree lowering does not implement {collective.value}")
    if pieces < 1:
        raise AlgorithmError(f"{name}: pieces must be >= 1, got {pieces}")
    n = edges.nranks
    roots = [root] if collective.rooted else list(range(n))
    dealt = []
    for r in roots:
        ups = trees_of(up, r, collective in UP, name)
        downs = trees_of(down, r, collective in DOWN, name)
        dealt.append((r, ups, deal(ups, pieces), downs, deal(downs, pieces)))
    counts = np.zeros((n, n))
    for _, ups, up_of, downs, down_of in dealt:
        _count(counts, ups, up_of, reverse=True)
        _count(counts, downs, down_of, reverse=False)
    root_bytes = size if collective.rooted else size / n
    hop = _hop_keys(edges, counts, root_bytes / pieces)
    steps = _Steps(collective, n)
    for r, ups, up_of, downs, down_of in dealt:
        block = 0 if collective.rooted else r * pieces
        position = (np.arange(pieces) + (r * _GOLDEN) % 1.0) / pieces
        pairs = np.column_stack((up_of, down_of))
        for pair in np.unique(pairs, axis=0):
            chunks = np.flatnonzero((pairs == pair).all(axis=1))
            u, d = (int(x) for x in pair)
            steps.tree_pair(
                r,
                block,
                None if u < 0 else Tree.from_parents(ups[u].parent),
                None if d < 0 else Tree.from_parents(downs[d].parent),
                hop,
                chunks,
                position[chunks],
            )
    cf = pieces * n if collective is Collective.ALLREDUCE else pieces
    columns, dep_ptr, dep_idx = steps.columns()
    return make_program(
        name,
        collective,
        n,
        chunk_factor=cf,
        columns=columns,
        root=root,
        dep_ptr=dep_ptr,
        dep_idx=dep_idx,
        params=params,
    )


def deal(trees: Sequence[WeightedTree], pieces: int) -> np.ndarray:
    """The tree (index into ``trees``) of each of ``pieces`` chunks: counts by weight, each
    tree's chunks at even strides (-1 everywhere when there are no trees)."""
    if not trees:
        return np.full(pieces, -1, dtype=np.int64)
    counts = apportion([t.weight for t in trees], pieces)
    marks = np.concatenate([(np.arange(c) + 0.5) / c for c in counts if c])
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return owner[np.argsort(marks, kind="stable")]


def _count(counts: np.ndarray, trees: Sequence[WeightedTree], owner: np.ndarray, *,
           reverse: bool) -> None:
    """Add the chunks each tree edge carries to ``counts[u, v]`` (data moving ``u -> v``;
    ``reverse``: in-trees, whose data moves from a rank to its parent)."""
    dealt = np.bincount(owner[owner >= 0], minlength=len(trees))
    for tree, chunks in zip(trees, dealt.tolist(), strict=True):
        parent = np.asarray(tree.parent)
        child = np.flatnonzero(parent >= 0)
        if reverse:
            counts[child, parent[child]] += chunks
        else:
            counts[parent[child], child] += chunks


def _hop_keys(edges: LogicalEdges, counts: np.ndarray, chunk_bytes: float) -> np.ndarray:
    """Key delay of a hop over each edge ``[u, v]``: :data:`SLACK` times (one chunk's time at
    the edge's share of its busiest link + the edge's latency) over the time the busiest link
    of all needs for its chunks. Links are shared by their edges in proportion to chunks."""
    topology = edges.topology
    load = edges.load.toarray()
    bandwidth = np.array([link.bandwidth for link in topology.links])
    latency = np.array([link.latency for link in topology.links])
    on_edge = counts[edges.src, edges.dst]
    link_seconds = (on_edge @ load) * chunk_bytes / bandwidth
    total = float(link_seconds.max())
    share = np.where(load > 0, link_seconds[None, :], 0.0).max(axis=1) / np.maximum(on_edge, 1)
    hop = np.zeros((edges.nranks, edges.nranks))
    if total > 0:
        hop[edges.src, edges.dst] = (SLACK * share + LATENCY_SLACK * (load @ latency)) / total
    return hop


class _Steps:
    """Rows of every chunk's steps with their schedule keys and in-program dependencies."""

    def __init__(self, collective: Collective, nranks: int) -> None:
        self.collective, self.n = collective, nranks
        self.copy_channel = nranks * nranks
        self.blocks: list[tuple[np.ndarray, list[tuple[int, ...]], np.ndarray, np.ndarray,
                                np.ndarray]] = []
        self.rows: list[tuple[int, ...]] = []
        self.deps: list[tuple[int, ...]] = []
        self.keys: list[float] = []

    def _add(self, part, chan, op, peer, src: Ref | None, dst: Ref | None, deps, key) -> int:
        ref = src or dst
        self.rows.append((
            part, chan, int(op), peer,
            -1 if src is None else int(src.buffer), -1 if src is None else src.index,
            -1 if dst is None else int(dst.buffer), -1 if dst is None else dst.index,
            ref.count,
        ))  # fmt: skip
        self.deps.append(tuple(deps))
        self.keys.append(key)
        return len(self.rows) - 1

    def tree_pair(
        self,
        r: int,
        block: int,
        up: Tree | None,
        down: Tree | None,
        hop: np.ndarray,
        chunks: np.ndarray,
        position: np.ndarray,
    ) -> None:
        """The steps of ``chunks`` (indices in root ``r``'s data, at ``position``) reduced
        up ``up`` and/or sent down ``down``."""
        self.rows, self.deps, self.keys = [], [], []
        data, partial, final, dst = chunk_refs(self.collective, block, 0)
        last: tuple[int, ...] = ()
        start = 0.0
        if up is not None:
            last, start = self._up(up, hop, data, partial, final)
        if down is not None:
            self._down(down, hop, start, final if last else data, dst, last)
            if self.collective in (Collective.ALLGATHER, Collective.BROADCAST):
                self._add(r, self.copy_channel, Op.COPY, -1, data, dst, (), start)
        self.blocks.append((np.array(self.rows, dtype=np.int64), self.deps,
                            np.array(self.keys), chunks, position))  # fmt: skip

    def _up(self, tree: Tree, hop, data: Ref, partial: Ref, final: Ref):
        """Reduce a chunk up ``tree``; ``(root's last step, its key)``."""
        ready = _ready(tree, hop)
        arrive = {v: ready[v] + hop[v, tree.parent[v]] for v in ready if v != tree.root}
        last: tuple[int, ...] = ()
        for rank in range(self.n):
            acc = final if rank == tree.root else partial
            deps: tuple[int, ...] = ()
            src = data
            for child in sorted(tree.children[rank], key=arrive.__getitem__):
                channel = child * self.n + rank
                deps = (self._add(rank, channel, Op.RECV_REDUCE, child, src, acc, deps,
                                  arrive[child]),)  # fmt: skip
                src = acc
            if rank != tree.root:
                parent = tree.parent[rank]
                self._add(rank, rank * self.n + parent, Op.SEND, parent, src, None, deps,
                          arrive[rank])  # fmt: skip
                continue
            if src != acc:
                deps = (self._add(rank, self.copy_channel, Op.COPY, -1, src, acc, deps,
                                  ready[rank]),)  # fmt: skip
            last = deps
        return last, ready[tree.root]

    def _down(self, tree: Tree, hop, start: float, src: Ref, dst: Ref, after) -> None:
        """Broadcast a chunk down ``tree`` from its root's ``src`` (after ``after``), keys
        from ``start``."""
        sent = {tree.root: start}
        frontier = [tree.root]
        while frontier:
            frontier = [c for v in frontier for c in tree.children[v]]
            for c in frontier:
                sent[c] = sent[tree.parent[c]] + hop[tree.parent[c], c]
        for rank in range(self.n):
            deps, source = after, src
            if rank != tree.root:
                parent = tree.parent[rank]
                deps = (self._add(rank, parent * self.n + rank, Op.RECV, parent, None, dst, (),
                                  sent[rank]),)  # fmt: skip
                source = dst
            for child in tree.children[rank]:
                self._add(rank, rank * self.n + child, Op.SEND, child, source, None, deps,
                          sent[child])  # fmt: skip

    def columns(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Step columns sorted by ``(part, chan, key)`` and the CSR dependencies."""
        every, keys, counts, flat = [], [], [], []
        offset = 0
        for rows, deps, key, chunks, position in self.blocks:
            m, c = len(rows), len(chunks)
            chunk = np.repeat(chunks, m)
            tiled = np.tile(rows, (c, 1))
            for col in (5, 7):
                tiled[:, col] += np.where(tiled[:, col] >= 0, chunk, 0)
            every.append(tiled)
            keys.append(np.repeat(position, m) + np.tile(key, c))
            per = np.array([len(d) for d in deps], dtype=np.int64)
            own = np.array([x for d in deps for x in d], dtype=np.int64)
            counts.append(np.tile(per, c))
            flat.append(offset + np.repeat(np.arange(c, dtype=np.int64) * m, len(own))
                        + np.tile(own, c))  # fmt: skip
            offset += m * c
        rows = np.concatenate(every)
        order = np.argsort(np.concatenate(keys), kind="stable")
        stream = rows[order, 0] * (self.copy_channel + 1) + rows[order, 1]
        order = order[np.argsort(stream, kind="stable")]
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        names = ("part", "chan", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off", "count")
        ordered = rows[order].T
        columns = {k: np.ascontiguousarray(ordered[c]) for c, k in enumerate(names)}
        per = np.concatenate(counts)
        starts = np.concatenate(([0], np.cumsum(per)))
        dep_ptr = np.concatenate(([0], np.cumsum(per[order])))
        seg = np.repeat(starts[order] - dep_ptr[:-1], per[order]) + np.arange(dep_ptr[-1])
        dep_idx = position[np.concatenate(flat)[seg]]
        return columns, dep_ptr, dep_idx


def _ready(tree: Tree, hop: np.ndarray) -> dict[int, float]:
    """Key at which each rank of in-tree ``tree`` sends its partial up: leaves at 0, a rank
    one hop after its latest child (the root: when its total is complete)."""
    order = [tree.root]
    for v in order:
        order.extend(tree.children[v])
    ready: dict[int, float] = {}
    for v in reversed(order):
        ready[v] = max((ready[c] + hop[c, v] for c in tree.children[v]), default=0.0)
    return ready
