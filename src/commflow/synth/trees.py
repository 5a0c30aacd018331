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
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from commflow.errors import AlgorithmError
from commflow.synth.links import LogicalEdges
from commflow.synth.rounding import apportion

_TOLERANCE = 1e-9
"""Relative reduced cost below which a tree counts as improving."""
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
    n = edges.nranks
    roots = list(range(n)) if roots is None else roots
    scale = 1.0 / edges.seconds.max()  # LP in units of the fastest edge's time per byte
    seconds = (edges.seconds * scale).tocsr()
    columns: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    uniform = np.ones(len(edges.src))
    for r in roots:
        columns.append(_column(edges, seconds, r, _arborescence(edges, r, uniform)))
    for rounds in range(1, max_rounds + 1):
        value, y, prices, mu = _master(columns, roots, seconds.shape[1])
        cost = seconds @ prices
        entered = 0
        for i, r in enumerate(roots):
            parent = _arborescence(edges, r, cost)
            price = sum(cost[e] for e in _edge_ids(edges, parent))
            if price < mu[i] - _TOLERANCE * max(abs(mu[i]), value):
                columns.append(_column(edges, seconds, r, parent))
                entered += 1
        if not entered:
            every = tuple(
                WeightedTree(r, parent, float(w) if w > 1e-12 else 0.0)
                for (r, parent, _), w in zip(columns, y, strict=True)
            )
            trees = tuple(t for t in every if t.weight > 0)
            return TreePacking(trees, value / scale, every, rounds, time.perf_counter() - start)
    raise AlgorithmError(
        f"tree packing on {edges.topology.name} did not converge in {max_rounds} rounds; "
        "raise max_rounds"
    )


def _loads(edges: LogicalEdges, trees: Sequence[WeightedTree]) -> np.ndarray:
    """Link x tree matrix: seconds per byte each tree puts on each link."""
    seconds = edges.seconds.tocsr()
    return np.stack(
        [np.asarray(seconds[_edge_ids(edges, t.parent)].sum(axis=0)).ravel() for t in trees],
        axis=1,
    )


def integral_shares(
    edges: LogicalEdges,
    packing: TreePacking,
    *,
    units: Sequence[int] = range(1, 13),
    slack: float = 0.005,
    time_limit: float = 2.0,
    budget: float = 5.0,
) -> tuple[tuple[WeightedTree, ...], int]:
    """Trees whose weights are whole ``units``-ths of each root's data, and ``units``.

    For each of ``units`` in turn: the largest-remainder rounding of the optimum, else a
    MILP (scipy HiGHS, ``time_limit`` seconds) over every candidate tree for integer shares
    whose time is within ``slack`` (relative) of the optimum. The first ``units`` that fits
    wins; when none does, or after ``budget`` seconds, the best rounding seen. Returned
    weights are ``count / units``.
    """
    candidates = packing.candidates
    loads = _loads(edges, candidates)
    roots = sorted({t.root for t in candidates})
    target = packing.seconds_per_byte * (1 + slack)
    best: tuple[float, np.ndarray, int] | None = None
    deadline = time.perf_counter() + budget
    for total in units:
        counts = np.zeros(len(candidates))
        for r in roots:
            mine = [i for i, t in enumerate(candidates) if t.root == r]
            counts[mine] = apportion([candidates[i].weight for i in mine], total)
        if (loads @ counts).max() / total > target:
            exact = _integer_shares(loads, candidates, roots, total, target, time_limit)
            counts = counts if exact is None else exact
        t = float((loads @ counts).max()) / total
        if best is None or t < best[0]:
            best = (t, counts, total)
        if t <= target or time.perf_counter() > deadline:
            break
    assert best is not None
    _, counts, total = best
    shares = tuple(
        WeightedTree(t.root, t.parent, c / total)
        for t, c in zip(candidates, counts.tolist(), strict=True)
        if c > 0
    )
    return shares, total


def _integer_shares(loads, candidates, roots, units, target, time_limit) -> np.ndarray | None:
    """Integer tree counts, ``units`` per root, with every link's time at most ``target`` per
    byte; ``None`` when HiGHS finds none in ``time_limit`` seconds."""
    scale = 1.0 / target
    used = np.flatnonzero(loads.any(axis=1))
    a_eq = np.zeros((len(roots), len(candidates)))
    position = {r: i for i, r in enumerate(roots)}
    for j, t in enumerate(candidates):
        a_eq[position[t.root], j] = 1.0
    res = milp(
        np.zeros(len(candidates)),
        constraints=[
            LinearConstraint(loads[used] * scale, -np.inf, units),
            LinearConstraint(a_eq, units, units),
        ],
        integrality=np.ones(len(candidates)),
        bounds=Bounds(0, units),
        options={"time_limit": time_limit},
    )
    if res.x is None:
        return None
    return np.round(res.x)


def _edge_index(edges: LogicalEdges) -> dict[tuple[int, int], int]:
    return {(int(u), int(v)): e for e, (u, v) in enumerate(zip(edges.src, edges.dst, strict=True))}


def _edge_ids(edges: LogicalEdges, parent: tuple[int, ...]) -> list[int]:
    index = _edge_index(edges)
    return [index[(p, v)] for v, p in enumerate(parent) if p >= 0]


def _column(edges, seconds, root, parent) -> tuple[int, tuple[int, ...], np.ndarray]:
    ids = _edge_ids(edges, parent)
    return root, parent, np.asarray(seconds[ids].sum(axis=0)).ravel()


def _arborescence(edges: LogicalEdges, root: int, cost: np.ndarray) -> tuple[int, ...]:
    """Parents of the cheapest spanning out-tree rooted at ``root`` under edge ``cost``; among
    trees of (nearly) equal cost, shallow ones: an edge leaving a rank ``h`` hops from the
    root costs ``h * TIE`` more (relative to the largest cost), and shallow trees pipeline
    with less fill and drain.

    Raises ``AlgorithmError`` when ``root`` cannot reach every rank over the edges."""
    n = edges.nranks
    hops = _hops(edges, root)
    weights = np.full((n, n), np.inf)
    weights[edges.src, edges.dst] = cost + _TIE * max(float(cost.max()), 1e-300) * hops[edges.src]
    parent = _edmonds(weights, root)
    if parent is None:
        raise AlgorithmError(
            f"{edges.topology.name}: rank {root} cannot reach every rank over logical edges"
        )
    return tuple(int(p) for p in parent)


def _hops(edges: LogicalEdges, root: int) -> np.ndarray:
    """Fewest logical edges from ``root`` to every rank."""
    hops = np.full(edges.nranks, edges.nranks, dtype=np.float64)
    hops[root] = 0
    frontier = [root]
    while frontier:
        reached = np.isin(edges.src, frontier) & (hops[edges.dst] == edges.nranks)
        frontier = np.unique(edges.dst[reached]).tolist()
        hops[frontier] = hops[edges.src[reached]].min() + 1 if frontier else 0
    return hops


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


def _master(columns, roots, nlinks):
    """Solve the master LP; returns ``(T, y, link prices, root duals)``."""
    ncol = len(columns)
    loads = np.stack([c[2] for c in columns], axis=1)
    used = np.flatnonzero(loads.any(axis=1))
    a_ub = np.hstack([-np.ones((len(used), 1)), loads[used]])
    a_eq = np.zeros((len(roots), ncol + 1))
    position = {r: i for i, r in enumerate(roots)}
    for j, (r, _, _) in enumerate(columns):
        a_eq[position[r], j + 1] = 1.0
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
    prices = np.zeros(nlinks)
    prices[used] = -res.ineqlin.marginals
    return float(res.x[0]), res.x[1:], prices, res.eqlin.marginals
