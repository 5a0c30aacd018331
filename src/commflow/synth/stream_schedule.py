"""The schedule the streams lowering (:mod:`commflow.synth.streams`) replays.

Every root's chunks, already dealt to its trees, are placed in the root's data (the roots
staggered by the golden ratio) and list-scheduled over the edges
(:func:`~commflow.synth.list_schedule.list_schedule`) once per weight in :data:`TAIL_WEIGHTS`
of the hops still ahead of each chunk (:func:`hops_ahead`), each schedule then improved by
forward-backward rounds (:func:`forward_backward`); the schedule that finishes first gives
every hop's arrival, the key of its steps. Also the depths and heights of a tree given by its
parents (:func:`tree_depths`, :func:`tree_heights`), which the lowering's channels by depth
use too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from commflow.synth.links import LogicalEdges
from commflow.synth.list_schedule import DOWN_HOP, UP_HOP, list_schedule

TAIL_WEIGHTS = tuple(k / 10 for k in range(11))
"""Weights of the hops still ahead of a chunk in its list-schedule priority (a hop with one
more ahead goes as if ``weight`` chunks earlier in its root's data): every one is scheduled
and the schedule that finishes first is lowered. FIFO alone (0) leaves the busiest links idle
for the last ~6% of MI250 x2 allgather at 48 pieces per root, waiting for chunks with long
paths still ahead; weighing them in shortens that tail (6.3% below the default synthesis,
then 4.9%)."""

TAILED_PIECES = 256
"""Most pieces per root for which every one of :data:`TAIL_WEIGHTS` is scheduled (FIFO alone
beyond: the tail shrinks with the pieces, MI250 x2 allgather at its default 4,032 gains
0.06%, and each schedule of its 129,024 chunks takes seconds)."""

BACKWARD_ROUNDS = 4
"""Forward-backward rounds after each first schedule (:func:`forward_backward`), up to
:data:`TAILED_PIECES` chunks per root. MI250 x2 at 1 GiB, one pass, against the default
synthesis: allgather at 56 pieces per root 3.53% -> 2.48%, reduce-scatter at 60 5.55% ->
3.44%, allreduce at 30 8.69% -> 4.28%; the fourth round gains at most 0.1 point, later ones
nothing or cycle."""

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
"""Stagger of the roots' chunk positions (root ``r`` starts at ``r * _GOLDEN mod 1`` of a
chunk), so that chunks of different roots rarely tie for an edge in the list schedule."""


def schedule_chunks(edges: LogicalEdges, dealt: list, pieces: int,
                    chunk_bytes: float) -> np.ndarray:  # fmt: skip
    """List-schedule every message of ``dealt`` over ``edges``, ``chunk_bytes`` bytes a chunk;
    the arrival of every hop as :func:`~commflow.synth.list_schedule.list_schedule` gives it.

    ``dealt`` holds per root ``(root, up-trees, each message's up-tree, down-trees, each
    message's down-tree, the position of its first chunk among the root's ``pieces``, its
    chunks)``. Messages are numbered in that order, root after root; the ``i``-th root's
    message at position ``c`` is placed in its root's data at ``(c + i * golden ratio mod 1)
    / pieces``."""
    n = edges.nranks
    ups = [t for _, trees, *_ in dealt for t in trees]
    downs = [t for _, _, _, trees, *_ in dealt for t in trees]
    up_parent = np.array([t.parent for t in ups] or np.zeros((0, n)), dtype=np.int64)
    down_parent = np.array([t.parent for t in downs] or np.zeros((0, n)), dtype=np.int64)
    roots, up_tree, down_tree, priority, sizes = [], [], [], [], []
    up_base = down_base = 0
    for i, (r, up_trees, up_of, down_trees, down_of, position, size) in enumerate(dealt):
        roots.append(np.full(len(size), r))
        up_tree.append(np.where(up_of >= 0, up_of + up_base, -1))
        down_tree.append(np.where(down_of >= 0, down_of + down_base, -1))
        priority.append((position + (i * _GOLDEN) % 1.0) / pieces)
        sizes.append(size)
        up_base += len(up_trees)
        down_base += len(down_trees)
    up_tree, down_tree = np.concatenate(up_tree), np.concatenate(down_tree)
    capacity = np.zeros(n * n, dtype=np.int64)
    for tree_of, parent, reverse in ((up_tree, up_parent, True), (down_tree, down_parent, False)):
        used = np.bincount(tree_of[tree_of >= 0], minlength=len(parent))
        for t, count in enumerate(used.tolist()):
            child = np.flatnonzero(parent[t] >= 0)
            ids = child * n + parent[t][child] if reverse else parent[t][child] * n + child
            capacity[ids] += count
    seconds = edges.seconds.toarray().max(axis=1) * chunk_bytes
    latency = edges.load @ np.array([link.latency for link in edges.topology.links])
    dur = np.zeros(n * n)
    lat = np.zeros(n * n)
    dur[edges.src * n + edges.dst] = seconds
    lat[edges.src * n + edges.dst] = latency
    roots = np.concatenate(roots).astype(np.int64)
    ahead = hops_ahead(roots, up_tree, down_tree, up_parent, down_parent).ravel() / pieces
    up_tree, down_tree = up_tree.astype(np.int64), down_tree.astype(np.int64)
    priority = np.concatenate(priority)
    size = np.tile(np.repeat(np.concatenate(sizes).astype(np.float64), n), 2)
    problem = (n, roots, up_tree, down_tree, up_parent, down_parent, dur, lat, capacity, size)
    best = None
    tailed = pieces <= TAILED_PIECES
    for weight in TAIL_WEIGHTS if tailed else TAIL_WEIGHTS[:1]:  # ties: the least weight
        arrival = list_schedule(n, roots, up_tree, down_tree, priority, up_parent, down_parent,
                                dur, lat, capacity, -weight * ahead, size)  # fmt: skip
        if tailed:
            arrival = forward_backward(problem, arrival, BACKWARD_ROUNDS)
        if best is None or arrival.max() < best.max():
            best = arrival
    return best


def forward_backward(problem: tuple, arrival: np.ndarray, rounds: int) -> np.ndarray:
    """The schedule finishing first among ``arrival`` and ``rounds`` forward-backward rounds
    from it (Li and Willis 1992, "An iterative scheduling technique for resource-constrained
    project scheduling").

    ``problem`` is ``(n, roots, up_tree, down_tree, up_parent, down_parent, dur, lat,
    capacity, size)`` as :func:`~commflow.synth.list_schedule.list_schedule` takes them. A
    round list-schedules the time-reversed problem (every edge turned around, each chunk's
    out-tree an in-tree and its in-tree an out-tree, so a hop down into a rank becomes the hop
    up out of it) with the hop arriving last going first, then the problem itself again with
    the hop arriving last in the reversed schedule (the earliest there, counted from the end)
    going first. The reversed schedule packs the end of the forward one tight, so each round
    shortens the tail where chunks with hops ahead waited for busy edges."""
    n, roots, up_tree, down_tree, up_parent, down_parent, dur, lat, capacity, size = problem
    turned = (n, roots, down_tree, up_tree, np.zeros(len(roots)), down_parent, up_parent,
              *(x.reshape(n, n).T.ravel() for x in (dur, lat, capacity)))  # fmt: skip
    forward = (n, roots, up_tree, down_tree, np.zeros(len(roots)), up_parent, down_parent,
               dur, lat, capacity)  # fmt: skip
    turned_size = _swapped(size)
    best = current = arrival
    for _ in range(rounds):
        back = list_schedule(*turned, -_swapped(np.maximum(current, 0.0)), turned_size)
        current = list_schedule(*forward, -_swapped(np.maximum(back, 0.0)), size)
        if current.max() < best.max():
            best = current
    return best


def _swapped(hops: np.ndarray) -> np.ndarray:
    """Per-hop values for the time-reversed problem (see :func:`forward_backward`): the two
    phases swapped, a hop down into a rank <-> the hop up out of it. Applied to minus a
    schedule's arrivals it gives the reversed problem's keys: the hop arriving last first."""
    down, up = np.split(hops, 2)
    return np.concatenate((up, down))


def hops_ahead(roots: np.ndarray, up_tree: np.ndarray, down_tree: np.ndarray,
                up_parent: np.ndarray, down_parent: np.ndarray) -> np.ndarray:
    """Hops on the longest path still ahead of each hop's chunk, the hop included, indexed as
    the list schedule's arrivals: down into ``v``, one more than the height of ``v`` in its
    out-tree; up out of ``v``, its depth in the in-tree plus the height of the out-tree that
    follows from the root (allreduce); 0 where there is no hop."""
    n = up_parent.shape[1] if len(up_parent) else down_parent.shape[1]
    height = np.array([tree_heights(p, tree_depths(p)) for p in down_parent.tolist()],
                      dtype=np.float64).reshape(-1, n)
    depth = np.array([tree_depths(p) for p in up_parent.tolist()], dtype=np.float64).reshape(-1, n)
    ahead = np.zeros((2, len(roots), n))
    down, up = down_tree >= 0, up_tree >= 0
    ahead[DOWN_HOP, down] = 1.0 + height[down_tree[down]]
    after = np.zeros(len(roots))
    both = up & down
    after[both] = height[down_tree[both], roots[both]]
    ahead[UP_HOP, up] = depth[up_tree[up]] + after[up, None]
    ahead[DOWN_HOP, down] *= down_parent[down_tree[down]] >= 0  # no hop into a root
    ahead[UP_HOP, up] *= up_parent[up_tree[up]] >= 0
    return ahead


def tree_depths(parent: Sequence[int]) -> list[int]:
    """Hops from the root to each rank of the tree with these parents."""
    depth = [-1] * len(parent)
    for rank in range(len(parent)):
        path = [rank]
        while parent[path[-1]] >= 0 and depth[path[-1]] < 0:
            path.append(parent[path[-1]])
        base = depth[path[-1]] if depth[path[-1]] >= 0 else 0
        for hops, v in enumerate(reversed(path)):
            depth[v] = base + hops
    return depth


def tree_heights(parent: Sequence[int], depth: Sequence[int]) -> list[int]:
    """Hops from each rank down to the deepest rank below it."""
    height = [0] * len(parent)
    for v in sorted(range(len(parent)), key=lambda v: -depth[v]):
        if parent[v] >= 0:
            height[parent[v]] = max(height[parent[v]], height[v] + 1)
    return height
