"""Routing all rank pairs at once: a multi-commodity flow for the pairs that pair-by-pair
routing already sends over a maximum flow.

Pair by pair, a maximum flow splits a transfer in proportion to what each route can take
alone (:func:`commflow.topology.weighted_routes`); when every pair sends at once (as a
collective's trees do), the routes of one pair fill links that another pair needs, and a
direct link that only its own pair can use carries too little. :func:`joint_routes` routes
those pairs together: every rank sends one unit to every other rank, the pairs kept on
equal-cost shortest paths (ECMP) load their links as before, and a linear program (scipy's
HiGHS) spreads the flow-routed pairs over their allowed links (switches and NICs, inside the
box for a pair of one box, and a direct link) so that the most loaded link, relative to its
bandwidth, carries the least (minimum congestion; a small cost per byte-second of every link
keeps the other routes on few, fast links).
The joint routes replace the pair-by-pair ones only where they lower that congestion; on
topologies whose pairs all stay on ECMP (every preset) nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from commflow.topology.graph import Topology

Path = tuple[int, ...]
Routes = tuple[tuple[Path, float], ...]

MOST_VARIABLES = 200_000
"""Largest linear program (pairs x links) :func:`joint_routes` solves; larger topologies keep
their pair-by-pair routes."""

_LINK_COST = 1e-6
"""Cost of a unit of flow on a link per unit of its time (the fastest link's bandwidth over
the link's), against congestion 1: among optimal routings, fewer and faster links."""

_GAIN = 1e-6
"""Relative congestion the joint routes must save to replace the pair-by-pair ones."""


def congestion(routes: dict[tuple[int, int], Routes], bandwidth: np.ndarray) -> np.ndarray:
    """Per link: the units it carries when every pair of ``routes`` sends one, over its
    bandwidth."""
    load = np.zeros(len(bandwidth))
    for split in routes.values():
        for path, share in split:
            load[list(path)] += share
    return load / bandwidth


def joint_routes(topology: Topology, pairs: dict[tuple[int, int], Routes],
                 flow_pairs: Sequence[tuple[int, int]],
                 allowed: Callable[[int, int], np.ndarray], link_src: np.ndarray,
                 link_dst: np.ndarray, bandwidth: np.ndarray) -> dict[tuple[int, int], Routes]:
    """New routes for ``flow_pairs`` (a subset of the keys of ``pairs``, every rank pair's
    pair-by-pair routes on ``topology``) when routing them jointly lowers the most loaded
    link's congestion; else ``{}``. ``allowed(src, dst)`` is the boolean mask of links the
    pair may use; ``link_src``, ``link_dst`` and ``bandwidth`` describe every link."""
    nlinks = len(bandwidth)
    if not flow_pairs or len(flow_pairs) * nlinks > MOST_VARIABLES:
        return {}
    scale = float(bandwidth.max())
    capacity = bandwidth / scale
    background = congestion({p: r for p, r in pairs.items() if p not in set(flow_pairs)},
                            bandwidth) * bandwidth
    before = float(congestion(pairs, bandwidth).max()) * scale
    arcs = [np.flatnonzero(allowed(u, v)) for u, v in flow_pairs]
    offsets = np.concatenate(([0], np.cumsum([len(a) for a in arcs])))
    nvars = int(offsets[-1]) + 1  # the arcs' flows, then the congestion
    rows, cols, vals, rhs = [], [], [], []
    row = 0
    for k, ((u, v), links) in enumerate(zip(flow_pairs, arcs, strict=True)):
        index = offsets[k] + np.arange(len(links))
        nodes = np.unique(np.concatenate((link_src[links], link_dst[links])))
        where = {int(n): row + i for i, n in enumerate(nodes)}
        rows += [where[int(s)] for s in link_src[links]] + [where[int(d)]
                                                             for d in link_dst[links]]
        cols += index.tolist() * 2
        vals += [1.0] * len(links) + [-1.0] * len(links)
        demand = np.zeros(len(nodes))
        demand[where[u] - row], demand[where[v] - row] = 1.0, -1.0
        rhs += demand.tolist()
        row += len(nodes)
    equal = sp.csr_array((vals, (rows, cols)), shape=(row, nvars))
    every = np.concatenate(arcs)
    upper = sp.csr_array((np.ones(len(every)), (every, np.arange(len(every)))),
                         shape=(nlinks, nvars)).tolil()
    upper[:, nvars - 1] = -capacity.reshape(-1, 1)
    cost = np.concatenate([_LINK_COST / capacity[links] for links in arcs] + [[1.0]])
    result = linprog(cost, A_ub=upper.tocsr(), b_ub=-background, A_eq=equal, b_eq=rhs,
                     bounds=(0, None), method="highs")
    if result.status != 0 or result.x[-1] >= before * (1 - _GAIN):
        return {}
    found = {}
    units = 1 << 30
    for k, ((u, v), links) in enumerate(zip(flow_pairs, arcs, strict=True)):
        amounts = np.round(result.x[offsets[k]:offsets[k + 1]] * units).astype(np.int64)
        flow: dict[int, dict[int, int]] = {}
        for link, amount in zip(links.tolist(), amounts.tolist(), strict=True):
            if amount > 0:
                flow.setdefault(int(link_src[link]), {})[int(link_dst[link])] = amount
        split = decompose(topology, flow, u, v, max(1, sum(flow.get(u, {}).values())))
        total = sum(share for _, share in split)
        found[(u, v)] = tuple((path, share / total) for path, share in split)
    return found


def decompose(topology: Topology, flow: dict[int, dict[int, int]], src: int, dst: int,
               total: int) -> tuple[tuple[Path, float], ...]:
    """Paths from ``src`` to ``dst`` carrying the integer ``flow`` (``flow[u][v]`` on arc
    ``u -> v``; consumed), each with its fraction of ``total``; flow on cycles is dropped."""
    found: list[tuple[Path, float]] = []
    while flow.get(src):
        path, node, seen = [], src, {src}
        while node != dst:
            nxt = next((v for v in sorted(flow.get(node, {})) if v not in seen), None)
            if nxt is None:
                break
            path.append((node, nxt))
            seen.add(nxt)
            node = nxt
        if node != dst:  # a dead end: the flow on its last arc only runs round a cycle
            u, v = path[-1]
            del flow[u][v]
            continue
        amount = min(flow[u][v] for u, v in path)
        for u, v in path:
            flow[u][v] -= amount
            if flow[u][v] == 0:
                del flow[u][v]
        found.append((tuple(topology._index[(u, v)] for u, v in path), amount / total))
    return tuple(found)
