"""Alltoall by a multi-commodity flow LP (the TE-CCL view): every ordered rank pair is a
commodity of one block; the LP (scipy HiGHS) routes all of them over the logical edges
(:mod:`commflow.synth.links`) so as to minimise the busiest link's time, each commodity's flow
is decomposed into paths, and the paths are lowered to a program: the block is cut into
chunks shared among its paths by weight, relays store a chunk in scratch and forward it.
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

    Raises ``AlgorithmError`` when the LP fails.
    """
    start = time.perf_counter()
    n, m = edges.nranks, len(edges.src)
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    k = len(pairs)
    scale = 1.0 / edges.seconds.max()
    seconds = (edges.seconds * scale).tocsr()  # edge x link
    # node x edge: +1 where the edge leaves the node, -1 where it enters
    incidence = sp.csr_array(
        (np.r_[np.ones(m), -np.ones(m)], (np.r_[edges.src, edges.dst], np.r_[0:m, 0:m])),
        shape=(n, m),
    )
    a_eq = sp.hstack([sp.csr_array((n * k, 1)), sp.kron(sp.eye_array(k), incidence)])
    b_eq = np.zeros(n * k)
    for c, (s, d) in enumerate(pairs):
        b_eq[c * n + s], b_eq[c * n + d] = 1.0, -1.0
    load = sp.kron(sp.csr_array(np.ones((1, k))), seconds.T)  # link x (commodity, edge)
    a_ub = sp.hstack([-np.ones((seconds.shape[1], 1)), load])
    cost = np.zeros(1 + k * m)
    cost[0] = 1.0
    res = linprog(
        cost,
        A_ub=sp.csr_array(a_ub),
        b_ub=np.zeros(a_ub.shape[0]),
        A_eq=sp.csr_array(a_eq),
        b_eq=b_eq,
        bounds=(0, None),
        method="highs",
    )
    if res.status != 0:
        raise AlgorithmError(f"alltoall LP on {edges.topology.name} failed: {res.message}")
    flows = res.x[1:].reshape(k, m)
    routes = tuple(
        route for c, (s, d) in enumerate(pairs) for route in _paths(edges, s, d, flows[c])
    )
    return AlltoallFlow(routes, float(res.x[0]) / scale, time.perf_counter() - start)


def _paths(edges: LogicalEdges, s: int, d: int, flow: np.ndarray) -> list[Route]:
    """Decompose one commodity's edge flow into ``s -> d`` paths (cycles are dropped)."""
    flow = flow.copy()
    routes: list[Route] = []
    while True:
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
            break
        path, v = [], d
        while v != s:
            path.append(parent_edge[v])
            v = int(edges.src[parent_edge[v]])
        path.reverse()
        amount = float(flow[path].min())
        flow[path] -= amount
        ranks = (s, *(int(edges.dst[e]) for e in path))
        routes.append(Route(s, d, ranks, amount))
    total = sum(r.weight for r in routes)
    return [Route(r.src, r.dst, r.ranks, r.weight / total) for r in routes]


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
