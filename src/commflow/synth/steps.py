"""Latency-aware allgather schedules: SCCL's (steps, rounds, chunks) instances as a MILP
(scipy HiGHS), and the Pareto frontier of steps against bandwidth cost.

An instance ``(S, R, C)`` cuts every rank's shard into ``C`` chunks and asks for ``S``
synchronous steps, step ``s`` lasting ``r_s >= 1`` rounds with ``sum r_s = R``; in one round a
link carries as many chunks as it has unit links (its bandwidth over the slowest link's). A
chunk can be forwarded in the step after it arrives. The time is ``S·α + (R/C)·shard·β``
(Cai et al., SCCL, PPoPP'21). Links are the logical edges of
:mod:`commflow.synth.links`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from commflow.collectives import Collective, parse_collective
from commflow.errors import AlgorithmError
from commflow.ir import Program, ProgramBuilder, StepId, inp, out
from commflow.synth.links import LogicalEdges, logical_edges
from commflow.topology.graph import Topology
from commflow.topology.routing import diameter


@dataclass(frozen=True)
class StepSchedule:
    """A feasible instance: which chunk crosses which edge in which step."""

    steps: int
    """``S``: synchronous steps (latency cost ``S·α``)."""
    rounds: int
    """``R``: rounds over all steps."""
    chunks: int
    """``C``: chunks per shard (bandwidth cost ``R/C`` shard-times)."""
    sends: tuple[tuple[int, int, int, int], ...]
    """``(chunk, src, dst, step)``; chunk ``c`` starts on rank ``c // chunks``, steps from 1."""


def edge_capacity(edges: LogicalEdges) -> np.ndarray:
    """Chunks per round of each edge: its bottleneck bandwidth over the slowest edge's,
    rounded down (at least 1)."""
    per_byte = np.asarray(edges.seconds.max(axis=1).todense()).ravel()
    return np.maximum(1, np.floor(per_byte.max() / per_byte + 1e-9)).astype(np.int64)


def solve_instance(
    edges: LogicalEdges, steps: int, rounds: int, chunks: int, *, time_limit: float = 30.0
) -> StepSchedule | None:
    """An allgather schedule for ``(steps, rounds, chunks)``, or ``None`` when HiGHS proves
    none exists. Raises ``AlgorithmError`` when it decides nothing in ``time_limit`` s."""
    n, m = edges.nranks, len(edges.src)
    k = n * chunks
    cap = edge_capacity(edges)
    nsend, nhas = k * m * steps, k * n * (steps + 1)

    def send(c, e, s):  # s = 1..steps
        return (c * m + e) * steps + (s - 1)

    def has(c, v, s):  # s = 0..steps
        return nsend + (c * (n) + v) * (steps + 1) + s

    def rnd(s):
        return nsend + nhas + (s - 1)

    nvar = nsend + nhas + steps
    rows, cols, vals, lo, hi = [], [], [], [], []

    def constraint(terms, low, high):
        r = len(lo)
        for col, val in terms:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        lo.append(low)
        hi.append(high)

    into = [np.flatnonzero(edges.dst == v) for v in range(n)]
    for c in range(k):
        for s in range(1, steps + 1):
            for v in range(n):
                terms = [(has(c, v, s), 1.0), (has(c, v, s - 1), -1.0)]
                terms += [(send(c, int(e), s), -1.0) for e in into[v]]
                constraint(terms, -np.inf, 0.0)
            for e in range(m):
                u, v = int(edges.src[e]), int(edges.dst[e])
                constraint([(send(c, e, s), 1.0), (has(c, u, s - 1), -1.0)], -np.inf, 0.0)
                # never to a rank that already holds the chunk
                constraint([(send(c, e, s), 1.0), (has(c, v, s - 1), 1.0)], -np.inf, 1.0)
        for v in range(n):  # each rank but the origin receives each chunk exactly once
            terms = [(send(c, int(e), s), 1.0) for e in into[v] for s in range(1, steps + 1)]
            once = 0.0 if v == c // chunks else 1.0
            constraint(terms, once, once)
    for s in range(1, steps + 1):
        for e in range(m):
            terms = [(send(c, e, s), 1.0) for c in range(k)] + [(rnd(s), -float(cap[e]))]
            constraint(terms, -np.inf, 0.0)
    constraint([(rnd(s), 1.0) for s in range(1, steps + 1)], rounds, rounds)
    lower = np.zeros(nvar)
    upper = np.ones(nvar)
    for c in range(k):
        for v in range(n):
            start = 1.0 if v == c // chunks else 0.0
            lower[has(c, v, 0)] = upper[has(c, v, 0)] = start
            lower[has(c, v, steps)] = 1.0
    lower[nsend + nhas :] = 1
    upper[nsend + nhas :] = rounds
    matrix = sp.csr_array((vals, (rows, cols)), shape=(len(lo), nvar))
    res = milp(
        np.zeros(nvar),
        constraints=[LinearConstraint(matrix, lo, hi)],
        integrality=np.ones(nvar),
        bounds=Bounds(lower, upper),
        options={"time_limit": time_limit},
    )
    if res.status == 2:  # infeasible
        return None
    if res.x is None:
        raise AlgorithmError(
            f"({steps}, {rounds}, {chunks}) on {edges.topology.name}: undecided after "
            f"{time_limit} s; raise time_limit"
        )
    x = np.round(res.x[:nsend]).reshape(k, m, steps)
    sends = tuple(
        (int(c), int(edges.src[e]), int(edges.dst[e]), int(s) + 1)
        for c, e, s in zip(*np.nonzero(x), strict=True)
    )
    return StepSchedule(steps, rounds, chunks, sends)


def pareto(
    collective: Collective | str,
    topology: Topology,
    *,
    max_steps: int | None = None,
    max_chunks: int = 6,
    time_limit: float = 30.0,
) -> list[StepSchedule]:
    """The Pareto frontier of (steps, rounds/chunks) for allgather on ``topology``.

    From the rank-hop diameter up to ``max_steps`` (default diameter + 2) steps, the
    instance with the smallest ``R/C`` (``C <= max_chunks``, ties: fewest chunks) that is
    feasible; a step count enters the frontier only when it lowers ``R/C``, and the search
    stops at the bandwidth bound. Raises ``AlgorithmError`` for other collectives or an
    undecided instance.
    """
    kind = parse_collective(collective)
    if kind is not Collective.ALLGATHER:
        raise AlgorithmError(f"pareto covers allgather only, not {kind.value}")
    edges = logical_edges(topology)
    floor = _bandwidth_floor(edges)
    first = diameter(topology)
    frontier: list[StepSchedule] = []
    best = None
    for steps in range(first, (max_steps or first + 2) + 1):
        ratios = sorted(
            {
                (Fraction(r, c), c, r)
                for c in range(1, max_chunks + 1)
                for r in range(steps, 4 * c * steps + 1)
                if Fraction(r, c) >= floor and (best is None or Fraction(r, c) < best)
            }
        )
        for ratio, c, r in ratios:
            found = solve_instance(edges, steps, r, c, time_limit=time_limit)
            if found is not None:
                frontier.append(found)
                best = ratio
                break
        if best is not None and best <= floor:
            break
    return frontier


def _bandwidth_floor(edges: LogicalEdges) -> Fraction:
    """Smallest ``R/C`` any instance can have: the allgather cut bound in rounds per shard."""
    from commflow.synth.trees import pack_trees

    unit = float(np.asarray(edges.seconds.max(axis=1).todense()).ravel().max())
    packing = pack_trees(edges)
    return Fraction(packing.seconds_per_byte / unit).limit_denominator(64)


def schedule_program(schedule: StepSchedule, nranks: int, *, name: str) -> Program:
    """The allgather program of ``schedule``: chunk ``c`` lands in output chunk ``c`` on every
    rank; each send waits for the receive that brought its chunk; the sends between two ranks
    share one channel, in step order. A chunk sent to a rank that already has it is dropped."""
    chunks = schedule.chunks
    builder = ProgramBuilder(
        Collective.ALLGATHER,
        nranks,
        chunk_factor=chunks,
        name=name,
        params={"steps": schedule.steps, "rounds": schedule.rounds, "chunks": chunks},
    )
    arrived: dict[tuple[int, int], StepId] = {}
    for c, u, v, _ in sorted(schedule.sends, key=lambda x: (x[3], x[0], x[1], x[2])):
        origin = c // chunks
        if v == origin or (c, v) in arrived:
            continue
        own = u == origin
        src = inp(c % chunks) if own else out(c)
        deps = () if own else (arrived[(c, u)],)
        channel = u * nranks + v if u < v else v * nranks + u
        builder.send(u, v, src, channel=channel, deps=deps)
        arrived[(c, v)] = builder.recv(v, u, out(c), channel=channel)
    for r in range(nranks):
        builder.copy(r, inp(0, chunks), out(r * chunks, chunks), channel=nranks * nranks)
    return builder.build()
