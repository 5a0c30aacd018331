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
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse.csgraph import shortest_path

from commflow.errors import AlgorithmError
from commflow.synth.links import LogicalEdges
from commflow.synth.rounding import balanced_round

_TOLERANCE = 1e-9
"""Relative reduced cost below which a tree counts as improving."""
_SMOOTHING = 0.5
"""Wentges dual smoothing: trees are priced at this mix of the best-bound prices and the
LP's, which damps the oscillation of plain column generation (fewer rounds)."""
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
    center, best = None, -np.inf
    for rounds in range(1, max_rounds + 1):
        value, y, prices, mu = _master(columns, roots)
        point = prices if center is None else _SMOOTHING * center + (1 - _SMOOTHING) * prices
        found = pricer.price(roots, point)
        bound = sum(float(c[2] @ point) for c in found)
        if bound > best:
            center, best = point, bound
        entering = _entering(found, prices, mu, value)
        if not entering and point is not prices:  # mispriced at the smoothed point
            entering = _entering(pricer.price(roots, prices), prices, mu, value)
        if not entering:
            every = tuple(
                WeightedTree(r, parent, float(w) if w > 1e-12 else 0.0)
                for (r, parent, _), w in zip(columns, y, strict=True)
            )
            trees = tuple(t for t in every if t.weight > 0)
            elapsed = time.perf_counter() - start
            return TreePacking(trees, value / pricer.scale, every, rounds, elapsed)
        columns += entering
    raise AlgorithmError(
        f"tree packing on {edges.topology.name} did not converge in {max_rounds} rounds; "
        "raise max_rounds"
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


def _loads(edges: LogicalEdges, trees: Sequence[WeightedTree]) -> np.ndarray:
    """Link x tree matrix: seconds per byte each tree puts on each link."""
    seconds = edges.seconds.toarray()
    ids = _edge_ids(edges)
    return np.stack([seconds[_tree_edges(ids, t.parent)].sum(axis=0) for t in trees], axis=1)


def integral_shares(
    edges: LogicalEdges,
    packing: TreePacking,
    *,
    units: Sequence[int] = range(1, 13),
    slack: float = 0.005,
    time_limit: float = 1.0,
    budget: float = 3.0,
) -> tuple[tuple[WeightedTree, ...], int]:
    """Trees whose weights are whole ``units``-ths of each root's data, and ``units``.

    First, for each of ``units``: the optimum rounded root by root
    (:func:`~commflow.synth.rounding.balanced_round`); the first within ``slack`` (relative)
    of the optimum wins. Else, for each of ``units`` in turn until ``budget`` seconds have
    passed: integer shares over every candidate tree within ``slack`` of the optimum, found
    by a MILP (scipy HiGHS, at most ``time_limit`` seconds); the first found wins. Else the
    fastest rounding. Weights are ``count / units``.
    """
    deadline = time.perf_counter() + budget
    candidates = packing.candidates
    loads = _loads(edges, candidates)
    loads = loads[loads.any(axis=1)] / packing.seconds_per_byte
    roots = sorted({t.root for t in candidates})
    group = np.searchsorted(roots, [t.root for t in candidates])
    weights = np.array([t.weight for t in candidates])
    target = 1 + slack
    tried = []
    for total in units:
        counts = balanced_round(loads, group, weights, total)
        tried.append((float((loads @ counts).max()) / total, total, counts))
        if tried[-1][0] <= target:
            return _weighted(candidates, counts, total), total
    for total in units:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        counts = _integer_shares(loads, group, total, target, min(time_limit, left))
        if counts is not None:
            return _weighted(candidates, counts, total), total
    _, total, counts = min(tried, key=lambda x: x[:2])
    return _weighted(candidates, counts, total), total


def _weighted(candidates, counts, total) -> tuple[WeightedTree, ...]:
    """The candidates with a count, weighted ``count / total``."""
    return tuple(
        WeightedTree(t.root, t.parent, c / total)
        for t, c in zip(candidates, counts.tolist(), strict=True)
        if c > 0
    )


def _integer_shares(loads, group, units, target, time_limit) -> np.ndarray | None:
    """Integer counts of the columns of ``loads``, ``units`` per ``group``, with every row of
    ``loads @ counts`` at most ``target * units``; ``None`` when HiGHS finds none in
    ``time_limit`` seconds."""
    ncol = loads.shape[1]
    a_eq = np.zeros((int(group.max()) + 1, ncol))
    a_eq[group, np.arange(ncol)] = 1.0
    res = milp(
        np.zeros(ncol),
        constraints=[
            LinearConstraint(loads, -np.inf, target * units),
            LinearConstraint(a_eq, units, units),
        ],
        integrality=np.ones(ncol),
        bounds=Bounds(0, units),
        options={"time_limit": time_limit},
    )
    return None if res.x is None else np.round(res.x)


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
    takes every node's cheapest incoming edge; a cycle among them is contracted (edges into
    it cost what they save over the cycle edge they replace) and solved recursively."""
    n = len(weights)
    weights = weights.copy()
    np.fill_diagonal(weights, np.inf)
    weights[:, root] = np.inf
    parent = weights.argmin(axis=0)
    parent[root] = -1
    best = weights[parent, np.arange(n)]
    if np.isinf(np.delete(best, root)).any():
        return None
    cycle = _cycle(parent)
    if cycle is None:
        return parent
    inside = np.zeros(n, dtype=bool)
    inside[cycle] = True
    others = np.flatnonzero(~inside)
    c = len(others)
    into = weights[np.ix_(others, cycle)] - best[cycle][None, :]
    leave = weights[np.ix_(cycle, others)]
    small = np.full((c + 1, c + 1), np.inf)
    small[:c, :c] = weights[np.ix_(others, others)]
    small[:c, c] = into.min(axis=1)
    small[c, :c] = leave.min(axis=0)
    sub = _edmonds(small, int(np.searchsorted(others, root)))
    if sub is None:
        return None
    result = parent.copy()
    for j, v in enumerate(others.tolist()):
        p = sub[j]
        if p >= 0:
            result[v] = cycle[int(leave[:, j].argmin())] if p == c else others[p]
    enter = int(sub[c])
    result[cycle[int(into[enter].argmin())]] = others[enter]
    return result


def _cycle(parent: np.ndarray) -> list[int] | None:
    """Nodes of one cycle of the parent pointers, or ``None`` when they form a tree."""
    mark = np.full(len(parent), -1)
    for start in range(len(parent)):
        v = start
        while v != -1 and mark[v] == -1:
            mark[v] = start
            v = int(parent[v])
        if v != -1 and mark[v] == start:
            cycle, u = [v], int(parent[v])
            while u != v:
                cycle.append(u)
                u = int(parent[u])
            return cycle
    return None


def _master(columns, roots):
    """Solve the master LP; returns ``(T, y, link prices, root duals)``."""
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
        raise AlgorithmError(f"tree packing LP failed: {res.message}")
    prices = np.zeros(len(loads))
    prices[used] = -res.ineqlin.marginals
    return float(res.x[0]), res.x[1:], prices, res.eqlin.marginals
