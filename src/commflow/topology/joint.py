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
bandwidth, carries the least (minimum congestion; a small cost per hop keeps routes short).
The joint routes replace the pair-by-pair ones only where they lower that congestion; on
topologies whose pairs all stay on ECMP (every preset) nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

Path = tuple[int, ...]
Routes = tuple[tuple[Path, float], ...]

MOST_VARIABLES = 200_000
"""Largest linear program (pairs x links) :func:`joint_routes` solves; larger topologies keep
their pair-by-pair routes."""

_HOP_COST = 1e-6
"""Cost per unit of flow per link, against congestion 1: prefers short routes among optimal."""

_GAIN = 1e-6
"""Relative congestion the joint routes must save to replace the pair-by-pair ones."""


def rate(split: Routes, bandwidth: np.ndarray) -> float:
    """Bytes/s of one transfer alone on ``split``: its busiest link's limit."""
    load: dict[int, float] = {}
    for path, share in split:
        for link in path:
            load[link] = load.get(link, 0.0) + share
    return min((bandwidth[link] / share for link, share in load.items()), default=np.inf)


def congestion(routes: dict[tuple[int, int], Routes], bandwidth: np.ndarray) -> np.ndarray:
    """Per link: the bytes/s it carries when every pair of ``routes`` sends at the rate it
    would have alone, over its bandwidth."""
    load = np.zeros(len(bandwidth))
    for split in routes.values():
        for path, share in split:
            load[list(path)] += share
    return load / bandwidth


def joint_routes(pairs: dict[tuple[int, int], Routes], flow_pairs: Sequence[tuple[int, int]],
                 allowed: Callable[[int, int], np.ndarray], link_src: np.ndarray,
                 link_dst: np.ndarray, bandwidth: np.ndarray,
                 decompose: Callable[[dict[int, dict[int, int]], int, int, int], Routes],
                 ) -> dict[tuple[int, int], Routes]:
    """New routes for ``flow_pairs`` (a subset of the keys of ``pairs``, every rank pair's
    pair-by-pair routes) when routing them jointly lowers the most loaded link's congestion;
    else ``{}``. ``allowed(src, dst)`` is the boolean mask of links the pair may use;
    ``decompose(flow, src, dst, total)`` turns an integer arc flow into paths with shares."""
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
    cost = np.concatenate([_HOP_COST / capacity[links] for links in arcs] + [[1.0]])
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
        split = decompose(flow, u, v, max(1, sum(flow.get(u, {}).values())))
        total = sum(share for _, share in split)
        found[(u, v)] = tuple((path, share / total) for path, share in split)
    return found
