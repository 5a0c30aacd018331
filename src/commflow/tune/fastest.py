"""Choosing among synthesized and predefined programs the one the simulator says is fastest
for one message size (the ``balanced`` objective of ``commflow synth``).

Candidates (:func:`candidates`): the bandwidth synthesis (tree packing, or the alltoall LP)
lowered with 1, 2, 4, ... up to ``pieces`` chunks per share; the latency step schedule
(allgather on at most :data:`STEP_RANKS` ranks, where its MILP is cheap); and every registered
algorithm placed on the topology (:func:`commflow.algorithms.build_for`). Each is timed with
``commflow.sim.simulate(program, topology, size, model="alphabeta")`` and the fastest whose
:func:`message_depth` is within ``max_steps`` wins (ties: the smaller depth, then the first
generated). Few pieces pay fewer per-message latencies, many pieces pipeline deep trees:
which wins depends on ``size``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

from commflow.algorithms import available, build_for
from commflow.collectives import Collective, parse_collective
from commflow.errors import AlgorithmError
from commflow.ir import Program
from commflow.sim import simulate
from commflow.synth import ALLTOALL_CHUNKS, synthesize
from commflow.topology.graph import Topology
from commflow.topology.synthetic import fully_connected

DEFAULT_SIZE = 1 << 20
"""Message size (bytes, nccl-tests meaning) :func:`choose` optimises by default."""

DEFAULT_PIECES = 128
"""Most pipelined chunks per share :func:`choose` tries in tree programs by default."""

STEP_RANKS = 8
"""Largest rank count for which the latency step schedule (a MILP) is a candidate."""

STEP_TIME_LIMIT = 5.0
"""Seconds each step-schedule MILP may take by default; an undecided one drops the candidate."""

@dataclass(frozen=True)
class Candidate:
    """One program :func:`choose` considers."""

    method: str
    """``"bandwidth"``, ``"latency"`` or the registered algorithm's name (e.g. ``"ring"``)."""
    program: Program
    """The candidate program."""


def message_depth(program: Program) -> int:
    """The most messages on any chain of dependent steps of ``program``: a receive waits for
    its send, a step for the previous step of its channel and for its dependencies. This is
    the number of latencies the program pays at size 0 (SCCL's step count for its schedules;
    ``p - 1`` for ring allgather; a tree's depth however many pieces pipeline along it).

    Computed as the simulated time (alphabeta model, size 0) on a full mesh of 1-second links.
    Raises ``SimulationError`` when the program deadlocks.
    """
    mesh = fully_connected(program.nranks, latency=1.0)
    return round(simulate(program, mesh, 0, model="alphabeta").time)


def candidates(
    kind: Collective,
    topology: Topology,
    *,
    pieces: int,
    root: int | None = None,
    time_limit: float = STEP_TIME_LIMIT,
) -> Iterator[Candidate]:
    """Every program :func:`choose` compares for ``kind`` on ``topology``.

    ``pieces``: the most chunks per share (alltoall: per block) of the bandwidth synthesis,
    tried at 1, 2, 4, ... and ``pieces``; ``time_limit``: seconds per step-schedule MILP.
    Methods that do not cover ``kind`` (and a step schedule undecided in ``time_limit``) are
    left out.
    """
    extra = {"root": root} if kind.rooted else {}
    try:
        for p in _doubling(pieces):
            program = synthesize(kind, topology, objective="bandwidth", pieces=p, **extra)
            yield Candidate("bandwidth", program)
    except AlgorithmError:  # tree packing does not cover gather and scatter
        pass
    if kind is Collective.ALLGATHER and topology.nranks <= STEP_RANKS:
        try:
            program = synthesize(kind, topology, objective="latency", time_limit=time_limit)
            yield Candidate("latency", program)
        except AlgorithmError:  # undecided within time_limit
            pass
    for algorithm in available(kind):
        try:
            yield Candidate(algorithm.name, build_for(kind, algorithm.name, topology, **extra))
        except AlgorithmError:  # e.g. a power-of-two algorithm on 6 ranks
            continue


def choose(
    collective: Collective | str,
    topology: Topology,
    *,
    pieces: int | None = None,
    size: float | None = None,
    max_steps: int | None = None,
    root: int | None = None,
    time_limit: float | None = None,
) -> Program:
    """The fastest of :func:`candidates` at ``size`` bytes (default :data:`DEFAULT_SIZE`)
    under the alphabeta model, among those whose :func:`message_depth` is at most
    ``max_steps`` (default: no limit). ``pieces``: the most chunks per share of the bandwidth
    synthesis tried (1, 2, 4, ... ``pieces``; default :data:`DEFAULT_PIECES`, alltoall:
    :data:`commflow.synth.ALLTOALL_CHUNKS` per block). ``time_limit`` (seconds, default
    :data:`STEP_TIME_LIMIT`) bounds each step-schedule MILP.

    The result is the winning program with ``params`` extended by ``method`` (see
    :class:`Candidate`), ``depth`` (its message depth), ``balanced_size`` (bytes) and
    ``balanced_time`` (simulated seconds at that size). Raises ``AlgorithmError`` for a bad
    ``size``, ``max_steps`` or ``time_limit``, or when no candidate is within ``max_steps``.
    """
    kind = parse_collective(collective)
    if pieces is None:
        pieces = ALLTOALL_CHUNKS if kind is Collective.ALLTOALL else DEFAULT_PIECES
    size = DEFAULT_SIZE if size is None else size
    if isinstance(size, bool) or not (isinstance(size, int | float) and 0 < size < math.inf):
        raise AlgorithmError(f"choose: size must be a positive number of bytes, got {size!r}")
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise AlgorithmError(f"choose: max_steps must be an integer >= 1, got {max_steps!r}")
    if pieces < 1:
        raise AlgorithmError(f"choose: pieces must be >= 1, got {pieces}")
    if time_limit is not None and not time_limit > 0:
        raise AlgorithmError(f"choose: time_limit must be > 0 seconds, got {time_limit!r}")
    best: tuple[float, int, Candidate] | None = None
    depths = []
    limit = STEP_TIME_LIMIT if time_limit is None else time_limit
    found = candidates(kind, topology, pieces=pieces, root=root, time_limit=limit)
    for candidate in found:
        depth = message_depth(candidate.program)
        depths.append(depth)
        if max_steps is not None and depth > max_steps:
            continue
        seconds = simulate(candidate.program, topology, size, model="alphabeta").time
        if best is None or (seconds, depth) < best[:2]:
            best = (seconds, depth, candidate)
    if best is None:
        fewest = f"the fewest any has is {min(depths)}" if depths else "there are none"
        raise AlgorithmError(
            f"choosing {kind.value} on {topology.name}: no candidate program within "
            f"max_steps={max_steps} sequential messages ({fewest}); raise max_steps"
        )
    seconds, depth, winner = best
    params = {
        **dict(winner.program.params),
        "method": winner.method,
        "depth": depth,
        "balanced_size": size,
        "balanced_time": seconds,
    }
    return dataclasses.replace(winner.program, params=tuple(sorted(params.items())))


def _doubling(most: int) -> list[int]:
    """``1, 2, 4, ...`` below ``most``, then ``most``."""
    counts = [1 << i for i in range(max(most, 1).bit_length()) if 1 << i < most]
    return [*counts, most]
