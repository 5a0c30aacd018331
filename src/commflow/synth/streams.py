"""Lowering weighted tree packings to one stream per edge, chunks in list-schedule order.

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
   Each chunk is a message of its own, or with ``merge`` each tree's chunks travel several
   to a message, in smaller ones at either end (:func:`~commflow.synth.merge.merged`).
2. The messages are list-scheduled at ``size`` bytes (:mod:`commflow.synth.stream_schedule`):
   each edge sends one at a time and never idles while one waits for it, the one earliest
   in its root's data first, moved earlier by a weight of the hops still ahead of it (each
   of :data:`~commflow.synth.stream_schedule.TAIL_WEIGHTS`), each schedule improved by
   forward-backward rounds; the schedule that finishes first is kept. A step's key is the
   time its hop arrives.
3. Every stream runs its steps in key order and every rank reduces its children's partials
   of a chunk in the order they arrive, so the program replays that schedule (exactly, on
   links no other stream uses, as the flow model times them), and keys grow along every
   dependency: the program cannot deadlock.

Streams sharing a link get equal rates whatever their loads, and a stream short of its rate
holds up every chunk behind it: :func:`~commflow.synth.api.synthesize` uses this lowering on
edges with links of their own (:func:`~commflow.synth.boxes.dedicated_edges`).

**Channels by depth** (``levels`` > 0, for MSCCL-family runtimes): the kernel runs a program
in loops, each threadblock all its steps of one loop before the next, so one stream per
edge fills and drains the trees' pipeline once per loop. Giving each depth of the trees a
channel of its own on every edge (hops out of the roots, hops one level further, ...; up-trees
counted from their root the same way) makes the channels' waits point from one depth to the
next only, so a deeper channel may run a loop behind a shallower one and the pipeline fills
once per run. Within a channel, hops with more of their tree still ahead of the chunk go
first (down: the height below the receiving rank; up: the height below the sender goes
last), and a rank receives all but its first child's partial of a chunk into scratch and
adds them in the channel of its own send (the root: one local channel per child), so that
no receive waits for another edge's channel. :func:`~commflow.synth.synthesize_for` uses
this on MSCCL targets.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from commflow.algorithms.trees import Tree
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Buffer, Op, Program, Ref, make_program
from commflow.synth.links import LogicalEdges
from commflow.synth.list_schedule import DOWN_HOP, UP_HOP
from commflow.synth.lower import DOWN, UP, chunk_refs, step_row, trees_of
from commflow.synth.merge import Merge, merge_head, merged
from commflow.synth.rounding import apportion
from commflow.synth.stream_schedule import schedule_chunks, tree_depths, tree_heights
from commflow.synth.trees import WeightedTree

REFERENCE_SIZE = float(2**30)
"""Bytes of the collective the chunks are scheduled at by default (large messages, where the
bandwidth objective matters)."""


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
    levels: int = 0,
    merge: Merge | None = None,
) -> Program:
    """The program moving every root's data along its weighted trees over ``edges``, in
    ``pieces`` chunks per root, one stream per edge (see the module).

    ``down`` are out-trees (broadcast, allgather, the second half of allreduce), ``up``
    in-trees given as out-trees of the reversed edges (reduce, reducescatter, the first half
    of allreduce); a rooted collective uses the trees of ``root`` only. The chunks are
    scheduled at ``size`` bytes of the collective (latency against transfer time).
    ``levels`` > 0 splits each edge's stream into up to ``levels`` channels by tree depth
    (consecutive depths share one when the trees are deeper; see the module). ``merge`` =
    ``(head, group)`` sends each tree's (allreduce: tree pair's) chunks of a root in messages
    of the ``head`` sizes at either end and of ``group`` chunks between
    (:func:`~commflow.synth.merge.merged`).
    Raises ``AlgorithmError`` for alltoall, gather and scatter, ``pieces < 1``, ``levels <
    0``, a ``merge`` with a negative head or a size below 1, or a root without the trees its
    collective needs.
    """
    if collective not in DOWN + UP:
        raise AlgorithmError(f"{name}: tree lowering does not implement {collective.value}")
    if pieces < 1:
        raise AlgorithmError(f"{name}: pieces must be >= 1, got {pieces}")
    if levels < 0:
        raise AlgorithmError(f"{name}: levels must be >= 0, got {levels}")
    if merge is not None and (isinstance(merge[0], int) and merge[0] < 0
                              or min((*merge_head(merge), merge[1])) < 1):
        raise AlgorithmError(f"{name}: merge needs a head of sizes >= 1 (or a count >= 0) "
                             f"and a group >= 1, got {merge}")
    n = edges.nranks
    roots = [root] if collective.rooted else list(range(n))
    dealt, starts = [], []
    for r in roots:
        ups = trees_of(up, r, collective in UP, name)
        downs = trees_of(down, r, collective in DOWN, name)
        up_of, down_of = deal(ups, pieces), deal(downs, pieces)
        position, start, count = merged(up_of, down_of, merge)
        dealt.append((r, ups, up_of[position], downs, down_of[position], position, count))
        starts.append(start)
    root_bytes = size if collective.rooted else size / n
    arrival = schedule_chunks(edges, dealt, pieces, root_bytes / pieces)
    depths = (max((max(tree_depths(t.parent)) for t in up), default=0),
              max((max(tree_depths(t.parent)) for t in down), default=0))
    messages = sum(len(count) for *_, count in dealt)
    steps = _Steps(collective, n, len(dealt) * pieces, messages, arrival, levels, depths)
    first = 0
    for (r, ups, up_of, downs, down_of, _, count), start in zip(dealt, starts, strict=True):
        block = 0 if collective.rooted else r * pieces
        pairs = np.column_stack((up_of, down_of))
        for pair in np.unique(pairs, axis=0):
            pick = np.flatnonzero((pairs == pair).all(axis=1))
            u, d = (int(x) for x in pair)
            steps.tree_pair(
                r,
                block,
                None if u < 0 else Tree.from_parents(ups[u].parent),
                None if d < 0 else Tree.from_parents(downs[d].parent),
                start[pick],
                first + pick,
                count[pick],
            )
        first += len(count)
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


class _Steps:
    """Rows of every message's steps, the hop each send and receive belongs to (its key is
    the hop's arrival), and in-program dependencies: ``chunks`` in all, moved as
    ``messages`` scheduled messages. With ``levels``, channels by hop depth (``depths``: the
    deepest up-tree and down-tree) and decoupled reductions."""

    def __init__(self, collective: Collective, nranks: int, chunks: int, messages: int,
                 arrival: np.ndarray, levels: int = 0,
                 depths: tuple[int, int] = (0, 0)):  # fmt: skip
        self.collective, self.n, self.chunks, self.arrival = collective, nranks, chunks, arrival
        self.messages = messages
        self.up_depth, self.down_depth = depths
        self.depth_count = max(1, sum(depths))
        self.groups = min(levels, self.depth_count) if levels else 1
        self.copy_channel = nranks * nranks * self.groups
        self.blocks: list[tuple[np.ndarray, list[tuple[int, ...]], np.ndarray, np.ndarray,
                                np.ndarray]] = []
        self.rows: list[tuple[int, ...]] = []
        self.deps: list[tuple[int, ...]] = []
        self.hops: list[int] = []
        self.stage: list[int] = []
        self.hop_weight = 1.0 + float(arrival.max(initial=0.0))

    @property
    def leveled(self) -> bool:
        return self.groups > 1

    def _down_stage(self, height: int) -> int:
        """Stage of a hop down into a rank with ``height`` hops below it: after every hop up
        (stages 0 .. up-tree depth - 1: the sender's height), the more below, the sooner."""
        return self.up_depth + self.down_depth - height

    def _chan(self, src: int, dst: int, level: int) -> int:
        """The channel of hops ``src -> dst`` of depth index ``level`` (0: the first hops)."""
        return (src * self.n + dst) * self.groups + level * self.groups // self.depth_count

    def _add(self, part, chan, op, peer, src: Ref | None, dst: Ref | None, deps, hop,
             stage: int = 0) -> int:  # fmt: skip
        """Append a step; with levels, a channel runs its steps by ``stage`` first (it grows
        along every dependency), then by key."""
        self.rows.append(step_row(part, chan, op, peer, src, dst))
        self.deps.append(tuple(deps))
        self.hops.append(hop)
        self.stage.append(stage)
        return len(self.rows) - 1

    def _arrivals(self, phase: int, rank: int, instances: np.ndarray) -> np.ndarray:
        return self.arrival[(phase * self.messages + instances) * self.n + rank]

    def tree_pair(
        self, r: int, block: int, up: Tree | None, down: Tree | None, chunks: np.ndarray,
        instances: np.ndarray, counts: np.ndarray,
    ) -> None:  # fmt: skip
        """The steps of messages of ``counts`` chunks from ``chunks`` on (indices in root
        ``r``'s data; scheduled as ``instances``) reduced up ``up`` and/or sent down
        ``down``: one template per order in which the ranks' children arrive."""
        joins = [] if up is None else [v for v in range(self.n) if len(up.children[v]) > 1]
        if not joins:
            self._template(r, block, up, down, {}, chunks, instances, counts)
            return
        firsts = [np.argsort(np.stack([self._arrivals(UP_HOP, c, instances)
                                       for c in up.children[v]], axis=1), axis=1, kind="stable")
                  for v in joins]  # fmt: skip
        orders, group = np.unique(np.concatenate(firsts, axis=1), axis=0, return_inverse=True)
        for g, order in enumerate(orders.tolist()):
            pick = group.ravel() == g
            children, at = {}, 0
            for v in joins:
                kids = up.children[v]
                children[v] = [kids[i] for i in order[at : at + len(kids)]]
                at += len(kids)
            self._template(r, block, up, down, children, chunks[pick], instances[pick],
                           counts[pick])

    def _template(self, r, block, up, down, children, chunks, instances, counts) -> None:
        """Steps of the messages at ``chunks`` (``counts`` chunks each) whose up-tree ranks
        take their children in the order of ``children`` (rank -> children; others as the
        tree lists them)."""
        self.rows, self.deps, self.hops, self.stage = [], [], [], []
        data, partial, final, dst = chunk_refs(self.collective, block, 0)
        last: tuple[int, ...] = ()
        if up is not None:
            last = self._up(up, children, data, partial, final)
        if down is not None:
            self._down(down, final if last else data, dst, last)
            if self.collective in (Collective.ALLGATHER, Collective.BROADCAST):
                self._add(r, self.copy_channel, Op.COPY, -1, data, dst, (), -1)
        phase, rank = np.divmod(np.array(self.hops, dtype=np.int64), self.n)
        at = (phase[None, :] * self.messages + instances[:, None]) * self.n + rank[None, :]
        keys = np.where(phase[None, :] >= 0, self.arrival[np.maximum(at, 0)], 0.0)
        if self.leveled:  # one stage outweighs any arrival time (seconds)
            keys = keys + np.array(self.stage, dtype=float)[None, :] * self.hop_weight
        self.blocks.append((np.array(self.rows, dtype=np.int64), self.deps, keys, chunks,
                            counts))  # fmt: skip

    def _up(self, tree: Tree, children, data: Ref, partial: Ref, final: Ref) -> tuple[int, ...]:
        """Reduce a chunk up ``tree``, each rank taking its children in the order of
        ``children``; the root's last step."""
        n = self.n
        last: tuple[int, ...] = ()
        depth = tree_depths(tree.parent)
        height = tree_heights(tree.parent, depth)
        for rank in range(n):
            acc = final if rank == tree.root else partial
            deps: tuple[int, ...] = ()
            src = data
            up = rank != tree.root
            out = self._chan(rank, tree.parent[rank], self.up_depth - depth[rank]) if up else -1
            for j, child in enumerate(children.get(rank, tree.children[rank])):
                chan = self._chan(child, rank, self.up_depth - depth[child])
                if j == 0 or not self.leveled:
                    deps = (self._add(rank, chan, Op.RECV_REDUCE, child, src, acc, deps,
                                      UP_HOP * n + child, height[child]),)  # fmt: skip
                    src = acc
                    continue
                spare = j - (partial.buffer is not Buffer.SCRATCH)  # after the partials
                slot = Ref(Buffer.SCRATCH, self.chunks * spare + data.index, acc.count)
                got = self._add(rank, chan, Op.RECV, child, None, slot, (), UP_HOP * n + child,
                                height[child])  # fmt: skip
                home = out if up else self.copy_channel + j
                deps = (self._add(rank, home, Op.REDUCE, -1, slot, acc, deps + (got,),
                                  UP_HOP * n + child, height[rank]),)  # fmt: skip
            if up:
                self._add(rank, out, Op.SEND, tree.parent[rank], src, None, deps,
                          UP_HOP * n + rank, height[rank])  # fmt: skip
                continue
            if src != acc:
                deps = (self._add(rank, self.copy_channel, Op.COPY, -1, src, acc, deps, -1),)
            last = deps
        return last

    def _down(self, tree: Tree, src: Ref, dst: Ref, after) -> None:
        """Broadcast a chunk down ``tree`` from its root's ``src`` (after ``after``)."""
        n = self.n
        depth = tree_depths(tree.parent)
        height = tree_heights(tree.parent, depth)
        for rank in range(n):
            deps, source = after, src
            if rank != tree.root:
                parent = tree.parent[rank]
                chan = self._chan(parent, rank, self.up_depth + depth[rank] - 1)
                deps = (self._add(rank, chan, Op.RECV, parent, None, dst, (),
                                  DOWN_HOP * n + rank, self._down_stage(height[rank])),)
                source = dst
            for child in tree.children[rank]:
                chan = self._chan(rank, child, self.up_depth + depth[child] - 1)
                self._add(rank, chan, Op.SEND, child, source, None, deps,
                          DOWN_HOP * n + child, self._down_stage(height[child]))

    def columns(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Step columns sorted by ``(part, chan, key)`` and the CSR dependencies."""
        every, keys, counts, flat = [], [], [], []
        offset = 0
        for rows, deps, key, chunks, sizes in self.blocks:
            m, c = len(rows), len(chunks)
            chunk = np.repeat(chunks, m)
            tiled = np.tile(rows, (c, 1))
            for col in (5, 7):
                tiled[:, col] += np.where(tiled[:, col] >= 0, chunk, 0)
            tiled[:, 8] *= np.repeat(sizes, m)
            every.append(tiled)
            keys.append(key.ravel())
            per = np.array([len(d) for d in deps], dtype=np.int64)
            own = np.array([x for d in deps for x in d], dtype=np.int64)
            counts.append(np.tile(per, c))
            flat.append(offset + np.repeat(np.arange(c, dtype=np.int64) * m, len(own))
                        + np.tile(own, c))  # fmt: skip
            offset += m * c
        rows = np.concatenate(every)
        order = np.argsort(np.concatenate(keys), kind="stable")
        stream = rows[order, 0] * (self.copy_channel + self.n) + rows[order, 1]
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
