"""Throughput-optimal spanning-tree packing (the Blink / ForestColl family).

Every root ``r`` must send one unit (its shard) to every other rank along spanning out-trees
of the logical edges (:mod:`commflow.synth.links`, switches split off). A packing gives root
``r`` trees ``t`` with weights ``y[r, t]`` summing to 1; link ``l`` then carries
``sum y[r, t] * load_t[l]`` units. The packing minimises the time per unit

    ``T = max over links l of  sum_{r,t} y[r, t] * seconds_t[l]``

by column generation: the master LP (scipy HiGHS) over the trees found so far gives link
prices ``pi`` (its duals); for each root, the cheapest spanning arborescence under those prices
(Edmonds' algorithm) enters when its price is below the root's dual ``mu[r]``. When no tree
enters, the packing is optimal over all trees, and (Edmonds' branching theorem with
ForestColl's switch splitting) ``T`` equals the cut bound of :func:`commflow.sim.lower_bound`
(``T * shard bytes`` seconds) on topologies whose routes the router already splits
(cost per unit ``max_S |S ∩ R| / B(S)``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from commflow.errors import AlgorithmError
from commflow.synth.links import LogicalEdges

_TOLERANCE = 1e-9
"""Relative reduced cost below which a tree counts as improving."""


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
    max_units: int = 12,
    slack: float = 0.005,
    time_limit: float = 2.0,
) -> tuple[tuple[WeightedTree, ...], int]:
    """Trees whose weights are whole ``units``-ths of each root's data, and ``units``.

    For ``units = 1 .. max_units``: the largest-remainder rounding of the optimum, else a
    MILP (scipy HiGHS, ``time_limit`` seconds) over every candidate tree for integer shares
    whose time is within ``slack`` (relative) of the optimum. The first ``units`` that fits
    wins; when none does, the best rounding seen. Returned weights are ``count / units``.
    """
    from commflow.synth.lower import apportion

    candidates = packing.candidates
    loads = _loads(edges, candidates)
    roots = sorted({t.root for t in candidates})
    target = packing.seconds_per_byte * (1 + slack)
    best: tuple[float, np.ndarray, int] | None = None
    for units in range(1, max_units + 1):
        counts = np.zeros(len(candidates))
        for r in roots:
            mine = [i for i, t in enumerate(candidates) if t.root == r]
            counts[mine] = apportion([candidates[i].weight for i in mine], units)
        found = counts if (loads @ counts).max() / units <= target else None
        if found is None:
            found = _integer_shares(loads, candidates, roots, units, target, time_limit)
        if found is None:
            found = counts
        t = float((loads @ found).max()) / units
        if best is None or t < best[0]:
            best = (t, found, units)
        if t <= target:
            break
    assert best is not None
    _, counts, units = best
    shares = tuple(
        WeightedTree(t.root, t.parent, c / units)
        for t, c in zip(candidates, counts.tolist(), strict=True)
        if c > 0
    )
    return shares, units


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
    """Parents of the cheapest spanning out-tree rooted at ``root`` under edge ``cost``."""
    graph = nx.DiGraph()
    graph.add_nodes_from(range(edges.nranks))
    for e, (u, v) in enumerate(zip(edges.src.tolist(), edges.dst.tolist(), strict=True)):
        if v != root:
            graph.add_edge(u, v, weight=float(cost[e]))
    try:
        tree = nx.minimum_spanning_arborescence(graph, preserve_attrs=False)
    except nx.NetworkXException:
        raise AlgorithmError(
            f"{edges.topology.name}: rank {root} cannot reach every rank over logical edges"
        ) from None
    parent = [-1] * edges.nranks
    for u, v in tree.edges:
        parent[v] = u
    return tuple(parent)


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
