"""The alpha-beta model with link contention counted per wave.

A send lasts ``bytes * max over its links l of (load_l / bandwidth_l)`` seconds, and its
message arrives ``alpha`` (the connection's latency, see :mod:`commflow.sim.paths`) later.
``load_l`` counts the sends of the same *wave* (:mod:`commflow.sim.dag`: the steps that
become ready together in a Kahn sweep) that cross link ``l``, each weighted by the fraction of
its traffic on ``l`` (1 for a single route; ``k/m`` when ``k`` of its ``m`` equal-cost routes
use ``l``). A send alone on single-route links thus takes ``bytes / bottleneck bandwidth``,
and ``c`` sends of one wave over one link take ``c`` times as long, as if they shared it
fairly. Loads are counts, not byte-weighted, and sends of different waves never contend even
when they overlap in time; use the ``flow`` model when that matters.

On a link-uniform network this reproduces the classic costs (Thakur, Rabenseifner & Gropp
2005), e.g. ring allreduce ``2(p-1)α + 2(p-1)/p·nβ``.
"""

from __future__ import annotations

import numpy as np

from commflow.sim.dag import CONTENDED, StepCosts, StepGraph, Sweep
from commflow.sim.paths import Connections, segment_max


def wave_time_per_byte(conns: Connections, sends: np.ndarray) -> np.ndarray:
    """Seconds per byte of each of ``sends``, the sends of one wave on contended connections,
    under the loads they put on their links. (Sends on uncontended connections never share a
    link within a wave: a stream has at most one step per wave.)"""
    ptr, link, fraction = conns.expand(sends)
    load = np.bincount(link, weights=fraction, minlength=len(conns.bandwidth))
    return segment_max(load[link] / conns.bandwidth[link], ptr)


def run_alphabeta(graph: StepGraph, conns: Connections, costs: StepCosts) -> Sweep:
    """Time every step of ``graph`` wave by wave; returns the finished :class:`Sweep`.

    Raises ``SimulationError`` when the program deadlocks.
    """
    sweep = Sweep(graph, conns, costs)
    while True:
        wave = sweep.run(hold=False)[2]
        if not len(wave):
            break
        shared = wave[(graph.code[wave] & CONTENDED) != 0]
        sweep.finish[shared] += costs.nbytes(shared) * wave_time_per_byte(conns, shared)
        sweep.complete(wave)
    sweep.check_done()
    return sweep
