"""Alltoall by a multi-commodity flow LP (the TE-CCL view): every rank's blocks are a
commodity (one block to every other rank); the LP (scipy HiGHS) routes all of them over the
logical edges (:mod:`commflow.synth.links`) so as to minimise the busiest link's time, each
commodity's flow is decomposed into paths per rank pair, and the paths are lowered to a
program: the block is cut into chunks shared among its paths by weight, relays store a chunk
in scratch and forward it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Program, ProgramBuilder, inp, out, scr
from commflow.synth.links import LogicalEdges
from commflow.synth.rounding import apportion

_EPS = 1e-9
_IPM_FROM = 100_000
"""LP variables from which HiGHS's interior point method (with crossover: a vertex, as the
simplex gives) is used: MI250 x4's 258,000 take it 30 s, the dual simplex over 140 s."""


@dataclass(frozen=True)
class Route:
    """One path of one commodity and the fraction of the block it carries."""

    src: int
    """Rank whose block it is."""
    dst: int
    """Rank that receives it."""
    ranks: tuple[int, ...]
    """Ranks visited, ``src`` first and ``dst`` last."""
    weight: float
    """Fraction of the block on this path (a commodity's weights sum to 1)."""


@dataclass(frozen=True)
class AlltoallFlow:
    """The LP's routing of every block and its time."""

    routes: tuple[Route, ...]
    """Paths of every commodity ``(src, dst)``, ``src != dst``."""
    seconds_per_byte: float
    """Seconds to move one byte of every block, all at once (times the block size: seconds)."""
    elapsed: float
    """Seconds the LP took."""


def alltoall_flow(edges: LogicalEdges) -> AlltoallFlow:
    """Optimal fractional routing of one block between every ordered pair of ranks.

    One commodity per source rank (its ``n - 1`` blocks leave it, one block ends at every
    other rank): the same optimum as a commodity per rank pair, since any per-pair routing
    sums to a per-source flow and every per-source flow decomposes into per-pair paths
    (:func:`_paths`), with ``n`` times fewer variables (32 ranks: 32 commodities, not 992).
    Raises ``AlgorithmError`` when the LP fails.
    """
    start = time.perf_counter()
    n, m = edges.nranks, len(edges.src)
    scale = 1.0 / edges.seconds.max()
    seconds = (edges.seconds * scale).tocsr()  # edge x link
    # node x edge: +1 where the edge leaves the node, -1 where it enters
    incidence = sp.csr_array(
        (np.r_[np.ones(m), -np.ones(m)], (np.r_[edges.src, edges.dst], np.r_[0:m, 0:m])),
        shape=(n, m),
    )
    a_eq = sp.hstack([sp.csr_array((n * n, 1)), sp.kron(sp.eye_array(n), incidence)])
    b_eq = -np.ones((n, n))
    np.fill_diagonal(b_eq, n - 1.0)
    load = sp.kron(sp.csr_array(np.ones((1, n))), seconds.T)  # link x (source, edge)
    a_ub = sp.hstack([-np.ones((seconds.shape[1], 1)), load])
    cost = np.zeros(1 + n * m)
    cost[0] = 1.0
    res = linprog(
        cost,
        A_ub=sp.csr_array(a_ub),
        b_ub=np.zeros(a_ub.shape[0]),
        A_eq=sp.csr_array(a_eq),
        b_eq=b_eq.ravel(),
        bounds=(0, None),
        method="highs-ipm" if cost.size >= _IPM_FROM else "highs",
    )
    if res.status != 0:
        raise AlgorithmError(f"alltoall LP on {edges.topology.name} failed: {res.message}")
    flows = res.x[1:].reshape(n, m)
    routes = tuple(route for s in range(n) for route in _paths(edges, s, flows[s]))
    return AlltoallFlow(routes, float(res.x[0]) / scale, time.perf_counter() - start)


def _path(edges: LogicalEdges, s: int, d: int, flow: np.ndarray) -> list[int] | None:
    """Edges of an ``s -> d`` path over edges with flow left (fewest hops), or ``None``."""
    parent_edge = {s: -1}
    frontier = [s]
    while frontier and d not in parent_edge:
        nxt = []
        for u in frontier:
            for e in np.flatnonzero((edges.src == u) & (flow > _EPS)).tolist():
                v = int(edges.dst[e])
                if v not in parent_edge:
                    parent_edge[v] = e
                    nxt.append(v)
        frontier = nxt
    if d not in parent_edge:
        return None
    path, v = [], d
    while v != s:
        path.append(parent_edge[v])
        v = int(edges.src[parent_edge[v]])
    return path[::-1]


def _paths(edges: LogicalEdges, s: int, flow: np.ndarray) -> list[Route]:
    """Decompose source ``s``'s edge flow into paths to every other rank, one block each
    (weights normalised per pair; flow on cycles is left over)."""
    flow = flow.copy()
    routes: list[Route] = []
    for d in range(edges.nranks):
        if d == s:
            continue
        found: list[Route] = []
        need = 1.0
        while need > _EPS and (path := _path(edges, s, d, flow)) is not None:
            amount = min(float(flow[path].min()), need)
            flow[path] -= amount
            need -= amount
            found.append(Route(s, d, (s, *(int(edges.dst[e]) for e in path)), amount))
        total = sum(r.weight for r in found)
        if not found:
            raise AlgorithmError(f"alltoall LP on {edges.topology.name}: no path from rank {s} "
                                 f"to rank {d} carries flow")
        routes += [Route(r.src, r.dst, r.ranks, r.weight / total) for r in found]
    return routes


def alltoall_program(flow: AlltoallFlow, nranks: int, *, chunks: int, name: str) -> Program:
    """The program sending each block's ``chunks`` chunks along its routes (shared by weight,
    largest remainders); each route is one channel, relays keep chunks in scratch. Raises
    ``AlgorithmError`` when ``chunks < 1``."""
    if chunks < 1:
        raise AlgorithmError(f"{name}: chunks must be >= 1, got {chunks}")
    builder = ProgramBuilder(
        Collective.ALLTOALL, nranks, chunk_factor=chunks, name=name, params={"chunks": chunks}
    )
    slot = [0] * nranks
    channel = 0
    by_pair: dict[tuple[int, int], list[Route]] = {}
    for route in flow.routes:
        by_pair.setdefault((route.src, route.dst), []).append(route)
    for (s, d), routes in by_pair.items():
        first = 0
        for route, count in zip(routes, apportion([r.weight for r in routes], chunks), strict=True):
            for k in range(first, first + count):
                src = inp(d * chunks + k)
                for u, v in zip(route.ranks[:-1], route.ranks[1:], strict=True):
                    dst = out(s * chunks + k) if v == d else scr(slot[v])
                    slot[v] += v != d
                    builder.transfer(u, v, src, dst, channel=channel)
                    src = dst
            first += count
            channel += 1
    for r in range(nranks):
        builder.copy(r, inp(r * chunks, chunks), out(r * chunks, chunks), channel=channel)
    return builder.build()
