"""Throughput-optimal spanning-tree packing (the Blink / ForestColl family).

Every root ``r`` must send one unit (its shard) to every other rank along spanning out-trees
of the logical edges (:mod:`commflow.synth.links`, switches split off). A packing gives root
``r`` trees ``t`` with weights ``y[r, t]`` summing to 1; link ``l`` then carries
``sum y[r, t] * load_t[l]`` units. The packing minimises the time per unit

    ``T = max over links l of  sum_{r,t} y[r, t] * seconds_t[l]``

by column generation: the master LP (scipy HiGHS) over the trees found so far gives link
prices ``pi`` (its duals); for each root, the cheapest spanning arborescence under those prices
(Chu-Liu/Edmonds) enters when its price is below the root's dual ``mu[r]``. When no tree
enters, the packing is optimal over all trees, and (Edmonds' branching theorem with
ForestColl's switch splitting) ``T`` equals the cut bound of :func:`commflow.sim.lower_bound`
(``T * shard bytes`` seconds) on topologies whose routes the router already splits
(cost per unit ``max_S |S ∩ R| / B(S)``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.sparse.csgraph import shortest_path

from commflow.errors import AlgorithmError
from commflow.synth.links import LogicalEdges
from commflow.synth.rounding import apportion, balanced_round, whole_counts

_TOLERANCE = 1e-9
"""Relative reduced cost below which a tree counts as improving."""
_SMOOTHING = 0.5
"""Wentges dual smoothing: trees are priced at this mix of the best-bound prices and the
LP's, which damps the oscillation of plain column generation (fewer rounds)."""
_MOST_COLUMNS = 2000
"""Columns the master LP keeps: beyond them, unused ones of the highest reduced cost go
(those of the last :data:`_FRESH_ROUNDS` rounds stay, so dropped columns do not cycle back)."""
_FRESH_ROUNDS = 10
"""Rounds for which a new column is safe from :data:`_MOST_COLUMNS` pruning."""
_TIE = 1e-6
"""Relative cost per hop from the root that breaks ties towards shallow trees."""


@dataclass(frozen=True)
class WeightedTree:
    """One spanning out-tree of a packing."""

    root: int
    """The rank whose data the tree carries."""
    parent: tuple[int, ...]
    """``parent[v]``: the rank ``v`` receives from (-1 at the root)."""
    weight: float
    """Fraction of the root's data on this tree (weights of one root sum to 1)."""


@dataclass(frozen=True)
class TreePacking:
    """Trees for every root and the time per byte of each root's data they achieve."""

    trees: tuple[WeightedTree, ...]
    """Trees with weight > 0, grouped by root."""
    seconds_per_byte: float
    """``T``: seconds to move one byte from every root to every rank, all roots at once."""
    candidates: tuple[WeightedTree, ...]
    """Every tree the column generation produced (weights as in the optimum, 0 for unused)."""
    iterations: int
    """Column-generation rounds the solve took."""
    elapsed: float
    """Seconds the solve took."""

    def of_root(self, root: int) -> list[WeightedTree]:
        """The trees carrying ``root``'s data."""
        return [t for t in self.trees if t.root == root]


def pack_trees(
    edges: LogicalEdges, roots: list[int] | None = None, *, max_rounds: int = 500
) -> TreePacking:
    """Optimal fractional packing of spanning out-trees of ``edges``, one unit per root.

    ``roots`` defaults to every rank (allgather); a single root gives broadcast. Raises
    ``AlgorithmError`` when the LP fails or does not converge in ``max_rounds`` rounds.
    """
    start = time.perf_counter()
    roots = list(range(edges.nranks)) if roots is None else roots
    pricer = _Pricer(edges)
    uniform = np.ones(len(edges.src))
    columns = [pricer.column(r, pricer.arborescence(r, uniform)) for r in roots]
    retired: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    center, best = None, -np.inf
    for rounds in range(1, max_rounds + 1):
        value, y, prices, mu = master_lp(columns, roots)
        point = prices if center is None else _SMOOTHING * center + (1 - _SMOOTHING) * prices
        found = pricer.price(roots, point)
        bound = sum(float(c[2] @ point) for c in found)
        if bound > best:
            center, best = point, bound
        entering = _entering(found, prices, mu, value)
        if not entering and point is not prices:  # mispriced at the smoothed point
            entering = _entering(pricer.price(roots, prices), prices, mu, value)
        if not entering:
            weights = [float(w) if w > 1e-12 else 0.0 for w in y] + [0.0] * len(retired)
            every = tuple(
                WeightedTree(r, parent, w)
                for (r, parent, _), w in zip(columns + retired, weights, strict=True)
            )
            trees = tuple(t for t in every if t.weight > 0)
            elapsed = time.perf_counter() - start
            return TreePacking(trees, value / pricer.scale, every, rounds, elapsed)
        columns, dropped = _prune(columns, y, prices, mu, roots)
        retired += dropped
        columns += entering
    raise AlgorithmError(
        f"tree packing on {edges.topology.name} did not converge in {max_rounds} rounds; "
        "raise max_rounds"
    )


def _prune(columns, y, prices, mu, roots):
    """``(kept, dropped)``: beyond :data:`_MOST_COLUMNS`, the unused columns of the highest
    reduced cost leave the master LP (they stay candidates for integral shares)."""
    if len(columns) <= _MOST_COLUMNS:
        return columns, []
    position = {r: i for i, r in enumerate(roots)}
    reduced = np.array([c[2] @ prices - mu[position[c[0]]] for c in columns])
    reduced[y > 1e-12] = -np.inf
    reduced[-_FRESH_ROUNDS * len(roots) :] = -np.inf
    keep = np.zeros(len(columns), dtype=bool)
    keep[np.argsort(reduced, kind="stable")[:_MOST_COLUMNS]] = True
    return (
        [c for c, k in zip(columns, keep, strict=True) if k],
        [c for c, k in zip(columns, keep, strict=True) if not k],
    )


def _entering(found, prices, mu, value):
    """The columns of ``found`` (one per root, in ``mu``'s order) priced below their root's
    dual ``mu`` at the LP's link ``prices``: those that improve the master LP."""
    return [
        c
        for c, m in zip(found, mu, strict=True)
        if c[2] @ prices < m - _TOLERANCE * max(abs(m), value)
    ]


class _Pricer:
    """What the column generation needs of ``edges`` at hand: dense edge x link seconds per
    byte (scaled so the slowest edge takes 1 per byte), the edge id of each rank pair, and
    each root's hop counts for the shallow-tree tie-break."""

    def __init__(self, edges: LogicalEdges) -> None:
        self.edges = edges
        self.scale = 1.0 / edges.seconds.max()
        self.seconds = edges.seconds.toarray() * self.scale
        self.ids = _edge_ids(edges)
        self.hops = _hops(edges)

    def arborescence(self, root: int, cost: np.ndarray) -> tuple[int, ...]:
        """Parents of the cheapest spanning out-tree rooted at ``root`` under edge ``cost``;
        among trees of (nearly) equal cost, shallow ones: an edge leaving a rank ``h`` hops
        from the root costs ``h * TIE`` more (relative to the largest cost), and shallow trees
        pipeline with less fill and drain.

        Raises ``AlgorithmError`` when ``root`` cannot reach every rank over the edges."""
        edges = self.edges
        n = edges.nranks
        weights = np.full((n, n), np.inf)
        tie = _TIE * max(float(cost.max()), 1e-300)
        weights[edges.src, edges.dst] = cost + tie * self.hops[root, edges.src]
        parent = _edmonds(weights, root)
        if parent is None:
            raise AlgorithmError(
                f"{edges.topology.name}: rank {root} cannot reach every rank over logical edges"
            )
        return tuple(int(p) for p in parent)

    def price(self, roots: list[int], prices: np.ndarray) -> list[tuple]:
        """The cheapest column of every root at link ``prices`` (see :meth:`column`)."""
        cost = self.seconds @ prices
        return [self.column(r, self.arborescence(r, cost)) for r in roots]

    def column(self, root: int, parent: tuple[int, ...]) -> tuple[int, tuple[int, ...], np.ndarray]:
        """``(root, parent, scaled seconds per byte the tree puts on each link)``."""
        return root, parent, self.seconds[_tree_edges(self.ids, parent)].sum(axis=0)


def tree_loads(edges: LogicalEdges, trees: Sequence[WeightedTree]) -> np.ndarray:
    """Link x tree matrix: seconds per byte each tree puts on each link."""
    seconds = edges.seconds.toarray()
    ids = _edge_ids(edges)
    return np.stack([seconds[_tree_edges(ids, t.parent)].sum(axis=0) for t in trees], axis=1)


def tree_seconds(edges: LogicalEdges, trees: Sequence[WeightedTree]) -> np.ndarray | None:
    """Seconds per byte of each root's data that the weighted ``trees`` put on each link;
    ``None`` when some tree arc is not a logical edge."""
    ids = _edge_ids(edges)
    if any((_tree_edges(ids, t.parent) < 0).any() for t in trees):
        return None
    return tree_loads(edges, trees) @ np.array([t.weight for t in trees])


def integral_shares(
    edges: LogicalEdges,
    packing: TreePacking,
    *,
    units: Sequence[int] = range(1, 25),
    slack: float = 0.005,
    nodes: int = 10,
    time_limit: float = 2.0,
    budget: float = 10.0,
) -> tuple[tuple[WeightedTree, ...], int]:
    """Trees whose weights are whole ``units``-ths of each root's data, and ``units``.

    For each of ``units`` in turn, the first of these within ``slack`` (relative) of the
    optimum wins: the optimum rounded root by root
    (:func:`~commflow.synth.rounding.balanced_round`), else (until ``budget`` seconds have
    passed) integer shares over every candidate tree found by a MILP (scipy HiGHS, at most
    ``nodes`` branch-and-bound nodes, which keeps the result independent of machine load,
    and ``time_limit`` seconds). Else the fastest rounding. Weights are ``count / units``.
    """
    candidates = packing.candidates
    loads = tree_loads(edges, candidates)
    loads = loads[loads.any(axis=1)] / packing.seconds_per_byte
    roots = sorted({t.root for t in candidates})
    group = np.searchsorted(roots, [t.root for t in candidates])
    weights = np.array([t.weight for t in candidates])
    counts, total = whole_counts(loads, group, weights, units=units, slack=slack, nodes=nodes,
                                 time_limit=time_limit, budget=budget)
    return _weighted(candidates, counts, total), total


def balanced_shares(
    edges: LogicalEdges, trees: Sequence[WeightedTree], units: int
) -> tuple[WeightedTree, ...]:
    """``trees`` reweighted to whole ``units``-ths of each root's data, each count the floor or
    the ceiling of ``weight * units``: the rounding of :func:`~commflow.synth.rounding.
    balanced_round` or each root's largest remainders (:func:`~commflow.synth.rounding.
    apportion`), whichever leaves the busiest link less loaded; trees left with no share are
    dropped. MI250 x2 allgather, 48 per root: the busiest link 1.0% above the optimum, 2.3%
    with largest remainders (MI250, 12 per root: 3.6%, 7.1%)."""
    roots = sorted({t.root for t in trees})
    group = np.searchsorted(roots, [t.root for t in trees])
    weights = np.array([t.weight for t in trees])
    weights /= np.bincount(group, weights)[group]
    loads = tree_loads(edges, trees)
    remainders = np.zeros(len(trees))
    for g in range(len(roots)):
        members = np.flatnonzero(group == g)
        remainders[members] = apportion(weights[members].tolist(), units)
    balanced = balanced_round(loads, group, weights, units)
    counts = min((remainders, balanced), key=lambda c: float((loads @ c).max()))
    return tuple(t for t in _weighted(trees, counts, units) if t.weight > 0)


def _weighted(candidates, counts, total) -> tuple[WeightedTree, ...]:
    """The candidates with a count, weighted ``count / total``."""
    return tuple(
        WeightedTree(t.root, t.parent, c / total)
        for t, c in zip(candidates, counts.tolist(), strict=True)
        if c > 0
    )


def _edge_ids(edges: LogicalEdges) -> np.ndarray:
    """``[src][dst]`` id of the logical edge between two ranks (-1 where there is none)."""
    ids = np.full((edges.nranks, edges.nranks), -1, dtype=np.int64)
    ids[edges.src, edges.dst] = np.arange(len(edges.src))
    return ids


def _tree_edges(ids: np.ndarray, parent: tuple[int, ...]) -> np.ndarray:
    """Edge ids (from :func:`_edge_ids`) of the tree with these parents."""
    p = np.asarray(parent)
    v = np.flatnonzero(p >= 0)
    return ids[p[v], v]


def _hops(edges: LogicalEdges) -> np.ndarray:
    """``[root][rank]``: fewest logical edges from ``root`` to ``rank``."""
    n = edges.nranks
    adjacency = sp.csr_array((np.ones(len(edges.src)), (edges.src, edges.dst)), shape=(n, n))
    hops = shortest_path(adjacency, unweighted=True)
    return np.where(np.isinf(hops), n, hops)


def _edmonds(weights: np.ndarray, root: int) -> np.ndarray | None:
    """Chu-Liu/Edmonds minimum arborescence on a dense ``[src][dst]`` cost matrix (``inf``: no
    edge): parents (-1 at ``root``), or ``None`` when some node is unreachable. Each round
    takes every node's cheapest incoming edge; all cycles among them are contracted at once
    (edges into a cycle cost what they save over the cycle edge they replace) and the
    contracted graph is solved recursively."""
    n = len(weights)
    weights = weights.copy()
    np.fill_diagonal(weights, np.inf)
    weights[:, root] = np.inf
    parent = weights.argmin(axis=0)
    parent[root] = -1
    best = weights[parent, np.arange(n)]
    best[root] = 0.0
    if np.isinf(best).any():
        return None
    labels, cyclic = _contraction(parent)
    if not cyclic.any():
        return parent
    adjusted = weights - np.where(cyclic, best, 0.0)[None, :]
    adjusted[labels[:, None] == labels[None, :]] = np.inf
    order = np.argsort(labels, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(labels[order]) != 0])
    small = np.minimum.reduceat(np.minimum.reduceat(adjusted[order], starts, axis=0)[:, order],
                                starts, axis=1)  # fmt: skip
    sub = _edmonds(small, int(labels[root]))
    if sub is None:
        return None
    source = sub[labels]  # the component each node's component hangs from (-1: the root's)
    entering = np.where(labels[:, None] == source[None, :], adjusted, np.inf)
    tail = entering.argmin(axis=0)
    cost = entering[tail, np.arange(n)]
    by_cost = np.lexsort((cost, labels))
    head = by_cost[np.r_[True, np.diff(labels[by_cost]) != 0]]  # cheapest entry per component
    head = head[source[head] >= 0]
    parent[head] = tail[head]
    return parent


def _contraction(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Component labels (``0 ..``) of the parent pointers' nodes, each cycle one component and
    every other node its own, and which nodes lie on a cycle."""
    n = len(parent)
    mark = np.full(n, -1)
    labels = np.full(n, -1)
    cyclic = np.zeros(n, dtype=bool)
    count = 0
    for start in range(n):
        v = start
        while v != -1 and mark[v] == -1:
            mark[v] = start
            v = int(parent[v])
        if v != -1 and mark[v] == start:
            u = v
            while True:
                labels[u], cyclic[u] = count, True
                u = int(parent[u])
                if u == v:
                    break
            count += 1
    alone = np.flatnonzero(labels < 0)
    labels[alone] = count + np.arange(len(alone))
    return labels, cyclic


def master_lp(columns: list[tuple], roots: list[int]) -> tuple[float, np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """The master LP of a packing: columns ``(group, key, seconds per byte on each link)``,
    weights ``y >= 0`` summing to 1 in each of the ``roots`` groups, minimising the busiest
    link's time ``T``. Returns ``(T, y, link prices, group duals)``; raises
    ``AlgorithmError`` when HiGHS fails."""
    ncol = len(columns)
    loads = np.stack([c[2] for c in columns], axis=1)
    used = np.flatnonzero(loads.any(axis=1))
    a_ub = sp.hstack([sp.csr_array(-np.ones((len(used), 1))), sp.csr_array(loads[used])])
    position = {r: i for i, r in enumerate(roots)}
    a_eq = sp.csr_array(
        (np.ones(ncol), ([position[r] for r, _, _ in columns], np.arange(1, ncol + 1))),
        shape=(len(roots), ncol + 1),
    )
    cost = np.zeros(ncol + 1)
    cost[0] = 1.0
    res = linprog(
        cost,
        A_ub=a_ub,
        b_ub=np.zeros(len(used)),
        A_eq=a_eq,
        b_eq=np.ones(len(roots)),
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0:
        raise AlgorithmError(f"packing LP failed: {res.message}")
    prices = np.zeros(len(loads))
    prices[used] = -res.ineqlin.marginals
    return float(res.x[0]), res.x[1:], prices, res.eqlin.marginals
