"""Exact integer tree packings (ForestColl, Zhao et al. 2024): ``k`` spanning out-trees per
root, each carrying ``1/k`` of the root's data, whose busiest link takes exactly the cut
bound.

1. **Optimal rate** (:mod:`commflow.sim.cuts`): the binding cut S* gives ``x* = B(S*) /
   |S* ∩ ranks|`` (exact integer units). With ``k`` trees per root each tree gets rate
   ``x*/k``, and a link of capacity ``c`` can carry ``c·k/x*`` trees: the smallest ``k``
   for which every link carries a whole number of trees (or, failing that up to
   ``most_trees``, for which the rounded-down counts still pass the check below) wins.
2. **Check** (Edmonds' branching theorem, as in ForestColl): a source ``s`` feeding every
   root ``k`` units must send ``k·roots`` units to every rank (max-flow).
3. **Switch removal by edge splitting** (Bang-Jensen, Frank and Jackson): at every switch
   or NIC ``w``, arc pairs ``u -> w -> t`` become direct arcs ``u -> t`` as far as the check
   allows, keeping only pairs on a shortest route (the simulator routes ``u -> t`` that
   way too), until ``w`` carries nothing.
4. **Trees** (Edmonds' theorem for root sets, grown as in Lovász's proof): all trees grow
   at once, an arc each in turn from their shallowest rank possible, by arcs that keep every
   rank set entered by as many arcs as trees still outside it (a hub per tree feeds its
   ranks; ``s`` must still send one unit per unfinished tree to every rank).

The max-flows are kept and repaired (:mod:`commflow.synth.flow_kernels`) rather than solved
anew. The result is checked against the simulator's routes (every tree arc a logical edge,
the busiest link at the bound); topologies where any step fails get ``None`` and the caller
falls back to column generation (:mod:`commflow.synth.trees`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
from scipy.sparse.csgraph import shortest_path

from commflow.synth.flow_kernels import reached, repair, split
from commflow.synth.links import LogicalEdges
from commflow.synth.trees import WeightedTree, tree_seconds

if TYPE_CHECKING:
    from commflow.sim.cuts import FlowNetwork, RatioCut

MOST_TREES = 24
"""Most trees per root tried."""
RATIOS = tuple(Fraction(1000 + d, 1000) for d in (0, 1, 2, 5, 10, 20, 50))
"""Times over the bound tried in turn (an exact packing may need more than ``MOST_TREES``
trees per root; a little slack makes whole tree counts fit with fewer)."""
MOST_SPLIT_FAILURES = 3
"""Tree counts whose switch splitting fails before the construction gives up (on a
three-level fat-tree every count fails; on MI250 x2 two trees per root fail, three work)."""
MOST_NODES = 256
"""Largest topology (nodes of every kind) the construction takes on (dense flows)."""


@dataclass(frozen=True)
class Forest:
    """``k`` trees per root whose busiest link takes ``ratio`` times the cut bound."""

    trees: tuple[WeightedTree, ...]
    """The trees, each of weight ``1/k``."""
    k: int
    """Trees per root."""
    ratio: float
    """Time of the packing over the cut bound's (1: exact)."""
    elapsed: float
    """Seconds the construction took."""


def forest(
    edges: LogicalEdges,
    roots: list[int] | None = None,
    *,
    most_trees: int = MOST_TREES,
    ratios: Sequence[Fraction] = RATIOS,
) -> Forest | None:
    """``k`` out-trees per root over ``edges`` (reversed edges: in-trees) whose busiest
    link takes the cut bound times the first of ``ratios`` (1: exact) that some
    ``k <= most_trees`` reaches, the smallest such ``k``; ``None`` when none does or the
    topology is beyond this construction (see the module)."""
    start = time.perf_counter()
    topology = edges.topology
    if topology.nnodes > MOST_NODES:
        return None
    roots = list(range(topology.nranks)) if roots is None else roots
    net, best = binding_cut(edges, roots)
    failures = 0
    for ratio in ratios:
        for k in range(1, most_trees + 1):
            network = _Network(net, roots, k, Fraction(k * best.weight, best.capacity) * ratio)
            if network.lowest() < network.need:
                continue
            if not network.remove_switches():
                failures += 1
                if failures == MOST_SPLIT_FAILURES:
                    return None  # the routes leave capacity that no split can use
                continue
            growth = _Growth(network.cap[: network.nranks, : network.nranks], roots * k)
            trees = tuple(WeightedTree(r, parent, 1.0 / k) for r, parent in growth.trees())
            if at_bound(edges, trees, best.weight / float(best.bandwidth) * float(ratio)):
                return Forest(trees, k, float(ratio), time.perf_counter() - start)
    return None


def mirror(found: Forest, edges: LogicalEdges, roots: list[int] | None = None) -> Forest | None:
    """``found``'s trees with every arc turned round (out-trees as in-trees) when, on
    ``edges`` (the opposite direction), they are as close to that direction's cut bound as
    ``found`` is to its own: on topologies whose links are symmetric, reductions reuse the
    allgather trees this way. ``None`` otherwise."""
    if at_bound(edges, found.trees, cut_bound(edges, roots) * found.ratio):
        return found
    return None


def cut_bound(edges: LogicalEdges, roots: list[int] | None = None) -> float:
    """The cut bound of ``edges``' direction for ``roots`` (default: every rank), in seconds
    per byte of each root's data."""
    _, best = binding_cut(edges, list(range(edges.nranks)) if roots is None else roots)
    return best.weight / float(best.bandwidth)


def binding_cut(edges: LogicalEdges, roots: list[int]) -> tuple[FlowNetwork, RatioCut]:
    """The flow network of ``edges``' direction and its binding cut for ``roots`` (one root:
    the broadcast cut); the cut's ``weight / bandwidth`` is the bound in seconds per byte of
    each root's data."""
    from commflow.sim.cuts import allgather_search, broadcast_cut, flow_network

    net = flow_network(edges.topology, reverse=edges.reverse)
    best = allgather_search(net)[-1] if len(roots) > 1 else broadcast_cut(net, roots[0])
    return net, best


class _Flows:
    """Integer capacities ``cap`` (dense, the source ``s`` among the nodes) and one repaired
    max-flow from ``s`` to each of ranks ``0 .. nranks-1``, which must each get ``need``."""

    def __init__(self, cap: np.ndarray, s: int, nranks: int, need: int) -> None:
        self.cap, self.s, self.nranks, self.need = cap, s, nranks, need
        self.sinks = np.arange(nranks, dtype=np.int64)
        self.flows = np.zeros((nranks, *cap.shape), dtype=np.int64)
        self.values = np.zeros(nranks, dtype=np.int64)

    def lowest(self, arcs: np.ndarray | None = None) -> int:
        """Repair the flows after the capacities of ``arcs`` changed (rows ``(a, b)``); the
        value of the first rank short of ``need``, else ``need``."""
        arcs = np.zeros((0, 2), dtype=np.int64) if arcs is None else arcs
        return repair(self.cap, self.flows, self.values, self.sinks, self.s, arcs, self.need)


class _Network(_Flows):
    """The topology's links as whole tree counts, a source ``s`` feeding each root ``k``."""

    def __init__(self, net, roots: list[int], k: int, per_unit: Fraction) -> None:
        n = net.nnodes
        cap = np.zeros((n + 1, n + 1), dtype=np.int64)
        for a, b, c in zip(net.src.tolist(), net.dst.tolist(), net.capacity, strict=True):
            cap[a, b] += math.floor(c * per_unit)
        cap[n, roots] = k
        super().__init__(cap, n, net.nranks, k * len(roots))
        hops = shortest_path(cap[:n, :n] > 0, unweighted=True)
        self.hops = np.where(np.isinf(hops), 2 * n, hops)

    def remove_switches(self) -> bool:
        """Split off every arc at the switches and NICs, fewest neighbours first; whether
        every one could be split (capacity left over must be unneeded)."""
        n = self.s
        others = range(self.nranks, n)
        degree = {w: int((self.cap[:n, w] > 0).sum()) for w in others}
        for w in sorted(others, key=lambda w: (degree[w], w)):
            for u in np.flatnonzero(self.cap[:n, w]).tolist():
                heads = [
                    t
                    for t in np.flatnonzero(self.cap[w, :n]).tolist()
                    if t != u and self.hops[u, w] + self.hops[w, t] == self.hops[u, t]
                ]
                shift = u % max(len(heads), 1)
                self._spread(u, w, heads[shift:] + heads[:shift])
            left = np.array([[u, w] for u in np.flatnonzero(self.cap[:n, w])]
                            + [[w, t] for t in np.flatnonzero(self.cap[w, :n])],
                            dtype=np.int64).reshape(-1, 2)  # fmt: skip
            self.cap[left[:, 0], left[:, 1]] = 0
            if self.lowest(left) < self.need:
                return False
        return True

    def _spread(self, u: int, w: int, heads: list[int]) -> None:
        """Split ``u -> w`` over the arcs ``w -> t`` of ``heads`` in turn, an equal share of
        it at a time (spread capacity makes shallow trees), until it is used up or no head
        takes more."""
        while self.cap[u, w] > 0 and heads:
            share, extra = divmod(int(self.cap[u, w]), len(heads))
            heads = [t for i, t in enumerate(heads) if self._split(u, w, t, share + (i < extra))]

    def _split(self, u: int, w: int, t: int, most: int) -> bool:
        """Split off as many units of ``u -> w -> t`` (up to ``most``) as keep every flow at
        ``need``; whether all that were asked for were split (the arc may take more)."""
        gamma = int(min(most, self.cap[u, w], self.cap[w, t]))
        if gamma == 0:
            return most == 0 and self.cap[w, t] > 0
        args = (self.cap, self.flows, self.values, self.sinks, self.s, u, w, t)
        short = self.need - split(*args, gamma, self.need)
        kept = gamma
        while short > 0:  # each undo fixes the rank that fell short; others may need more
            back = min(short, kept)
            kept -= back
            short = self.need - split(*args, -back, self.need)
        return kept == most


class _Growth(_Flows):
    """All trees grown at once, an arc each in turn, so they grow alike and shallow
    (Edmonds' theorem for root sets: trees ``F_i`` extend to disjoint spanning trees iff
    every rank set ``X`` is entered by as many arcs as there are trees ``F_i`` outside it).
    A hub per unfinished tree, fed one unit by ``s``, reaches the tree's ranks; ``s`` must
    send one unit per unfinished tree to every rank."""

    def __init__(self, ranks: np.ndarray, roots: list[int]) -> None:
        n, count = len(ranks), len(roots)
        self.hubs = n + 1 + np.arange(count)
        cap = np.zeros((n + 1 + count, n + 1 + count), dtype=np.int64)
        cap[:n, :n] = ranks
        cap[n, self.hubs] = 1
        cap[self.hubs, roots] = count
        super().__init__(cap, n, n, count)
        self.parents = [[-1] * n for _ in roots]
        self.depths = [{r: 0} for r in roots]
        self.roots = roots
        if self.lowest() < self.need:
            raise AssertionError("split network lost Edmonds' condition")

    def trees(self) -> list[tuple[int, tuple[int, ...]]]:
        """``(root, parents)`` of every tree, grown round-robin."""
        growing = list(range(len(self.roots)))
        while growing:
            for i in growing:
                self._extend(i)
            done = [i for i in growing if len(self.depths[i]) == self.nranks]
            if done:
                self.cap[self.s, self.hubs[done]] = 0
                self.need -= len(done)
                self.lowest(np.column_stack([np.full(len(done), self.s), self.hubs[done]]))
                growing = [i for i in growing if len(self.depths[i]) < self.nranks]
        return [(r, tuple(p)) for r, p in zip(self.roots, self.parents, strict=True)]

    def _extend(self, i: int) -> None:
        """Add one arc to tree ``i``, from the shallowest rank possible to a rank outside.
        A rejected arc reveals a tight set (a minimum cut of a rank it starved); the next
        arc is sought inside that set, where Lovász's lemma puts a valid one."""
        n, hub, depth = self.nranks, self.hubs[i], self.depths[i]
        outside = np.ones(n, dtype=bool)
        outside[list(depth)] = False
        order = sorted(depth, key=depth.get)
        rejected = np.zeros((n, n), dtype=bool)
        tight = np.ones(n, dtype=bool)
        while True:
            arc = self._candidate(order, outside & tight, tight, rejected)
            if arc is None and not tight.all():
                tight[:] = True
                continue
            if arc is None:
                raise AssertionError("Edmonds' condition held but no arc extends a tree")
            x, y = arc
            self.cap[x, y] -= 1
            self.cap[hub, y] = self.need  # as many as trees still growing: never binding
            if self.lowest(np.array([arc])) >= self.need:
                self.parents[i][y] = x
                depth[y] = depth[x] + 1
                return
            starved = int(np.argmin(self.values))
            tight = ~reached(self.cap, self.flows[starved], self.s)[:n]
            self.cap[x, y] += 1
            self.cap[hub, y] = 0
            self.lowest(np.array([[hub, y]]))
            rejected[x, y] = True

    def _candidate(self, order, heads, tails, rejected) -> tuple[int, int] | None:
        """The first untried arc from a rank of ``order`` in ``tails`` to one in ``heads``."""
        for x in order:
            if tails[x]:
                ys = np.flatnonzero(heads & (self.cap[x, : self.nranks] > 0) & ~rejected[x])
                if len(ys):
                    return x, int(ys[0])
        return None


def at_bound(edges: LogicalEdges, trees: tuple[WeightedTree, ...], bound: float) -> bool:
    """Whether every tree arc is a logical edge and the busiest link takes at most
    ``bound`` seconds per byte of each root's data."""
    loads = tree_seconds(edges, trees)
    if loads is None:
        return False
    return float(loads.max()) <= bound * (1 + 1e-9)
