"""Simulation of programs on topologies: predicted time, bus bandwidth, link load.

:func:`simulate` times a :class:`~commflow.ir.Program` on a
:class:`~commflow.topology.graph.Topology` under one of two models:

- ``"alphabeta"`` (:mod:`commflow.sim.alphabeta`): a message takes ``alpha + bytes /
  bandwidth``, link contention counted among the sends of one wave of the step graph;
- ``"flow"`` (:mod:`commflow.sim.flow`): messages are flows sharing links max-min fairly,
  simulated event by event.

Both share the step semantics of :mod:`commflow.sim.dag` (a step starts when its channel
predecessor, its dependencies and, for a receive, its message are done; a send completes when
its bytes are injected, its message arrives one latency later; each channel runs its own local
work, so reductions on different channels overlap) and the routing of :mod:`commflow.sim.paths`
(all equal-cost shortest routes at once: packet spraying). :func:`lower_bound`
(:mod:`commflow.sim.bounds`) gives what no program can beat on a topology.

>>> from commflow.algorithms import build
>>> from commflow.topology import ring
>>> result = simulate(build("allreduce", "ring", 4), ring(4, bandwidth=10e9, latency=1e-6), 1e6)
>>> round(result.time * 1e6, 3)  # 2(p-1)α + 2(p-1)/p·nβ in microseconds
156.0
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from commflow.errors import DeadlockError, SimulationError
from commflow.ir import Program
from commflow.ir.msccl import fused_sends
from commflow.ir.target import Target, bounded, get_target
from commflow.ir.transform import repeat, repeated, split_messages
from commflow.sim.alphabeta import run_alphabeta
from commflow.sim.bounds import Bound, lower_bound
from commflow.sim.dag import StepCosts, StepGraph, Sweep
from commflow.sim.flow import run_flow
from commflow.sim.paths import Connections, place
from commflow.sim.result import CriticalStep, SimResult, make_result
from commflow.topology.graph import Topology

_RUNNERS = {"alphabeta": run_alphabeta, "flow": run_flow}
MODELS = tuple(_RUNNERS)
"""Names of the cost models :func:`simulate` accepts."""


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_bandwidth(name: str, value: float | None) -> None:
    if value is not None and not (_is_number(value) and 0 < value < math.inf):
        raise SimulationError(f"{name} must be a positive number of bytes/s or None, got {value!r}")


def simulate(
    program: Program,
    topology: Topology,
    size: float,
    *,
    model: str = "alphabeta",
    placement: Sequence[int] | None = None,
    reduce_bandwidth: float | None = None,
    copy_bandwidth: float | None = None,
    target: Target | str | None = None,
) -> SimResult:
    """Predict how long ``program`` takes on ``topology`` for a ``size``-byte collective.

    ``size`` in bytes (nccl-tests meaning; each chunk is ``program.chunk_bytes(size)``).
    ``placement`` gives the topology node of each participant (default: rank ``i`` on node
    ``i``; in-network participants need one). ``reduce_bandwidth`` and ``copy_bandwidth``
    (bytes/s) price local reductions and copies; ``None`` makes them free. ``target`` (see
    :mod:`commflow.ir.target`; default ``live``, unbounded buffering) bounds each
    connection's buffer as that runtime does (a send waits for room), runs chunks larger
    than the runtime's in several loops (:func:`~commflow.ir.transform.repeat`) and a step
    of more chunks than one of its messages holds as several messages
    (:func:`~commflow.ir.transform.split_messages`); a send
    that the export to an XML target writes fused with the receive before it (``rcs``,
    :func:`~commflow.ir.msccl.fused_sends`) holds that receive until it has room, as the
    kernel's fused step does (apart where that deadlocks: the export then writes them
    apart). Raises
    ``SimulationError`` for an unknown model, a bad size, bandwidth or placement, a missing
    route or a deadlock (also one that only the target's bounded buffers cause), and
    ``VerificationError`` when sends and receives do not pair up.
    """
    if model not in _RUNNERS:
        raise SimulationError(f"unknown model {model!r}; use one of {', '.join(MODELS)}")
    if not (_is_number(size) and 0 <= size < math.inf):
        raise SimulationError(f"size must be a finite number of bytes >= 0, got {size!r}")
    _check_bandwidth("reduce_bandwidth", reduce_bandwidth)
    _check_bandwidth("copy_bandwidth", copy_bandwidth)
    where = get_target(target)
    fused = fused_sends(program, where) if where.bounded else None
    if where.chunk_bytes is not None and size > 0:
        whole = program.chunk_bytes(size)
        loops = max(1, math.ceil(whole / where.chunk_bytes))
        fused = None if fused is None else repeated(program, loops, fused)
        program, fused = split_messages(repeat(program, loops), where.chunks_per_message(whole),
                                        fused)
    chunk_bytes = program.chunk_bytes(size)
    nodes = place(program, topology, placement)

    def swept(fused: np.ndarray | None) -> tuple[Program, Connections, Sweep]:
        """The program with its bounded-buffer waits, its connections and its sweep."""
        timed = bounded(program, where, chunk_bytes=chunk_bytes or None, fused=fused)
        conns = Connections(timed, topology, nodes)
        graph = StepGraph(timed, conns.contended_sends())
        costs = StepCosts(graph, conns, chunk_bytes, reduce_bandwidth, copy_bandwidth)
        return timed, conns, _RUNNERS[model](graph, conns, costs)

    try:
        timed, conns, sweep = swept(fused)
    except DeadlockError:
        if fused is None or not len(fused):
            raise
        timed, conns, sweep = swept(None)  # the export writes these steps apart
    return make_result(
        model,
        timed,
        float(size),
        sweep.finish,
        sweep.critical_path(),
        conns.link_bytes(chunk_bytes),
        conns.bandwidth,
    )


__all__ = ["MODELS", "Bound", "CriticalStep", "SimResult", "lower_bound", "simulate"]
