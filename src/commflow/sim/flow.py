"""The flow model: messages as flows sharing links max-min fairly, simulated event by event.

Every send is a flow on its connection's routes (traffic split evenly across the equal-cost
routes: packet spraying, so a flow puts ``fraction_l * rate`` on link ``l``). Whenever the
set of active flows changes, rates are recomputed by progressive filling (water-filling):
all unfrozen flows grow at the same rate until a link saturates, the flows crossing it freeze,
and so on, giving the max-min fair allocation
(compiled: :func:`commflow.sim.kernels.water_fill`). A send completes when its last byte has been
injected; its message arrives one connection latency later (:mod:`commflow.sim.paths`).

Exact shortcut: a send whose links are crossed by the sends of no other stream (participant
channel) never shares them, because the sends of one stream run one after another. Its rate
is fixed, ``1 / max(fraction_l / bandwidth_l)``, so it is timed directly in the Kahn sweep of
:mod:`commflow.sim.dag`; only the remaining (contended) sends go through the event loop. The
loop is conservative: every step that does not wait on an active flow has already been swept,
so no flow can start before the next event it computes.

Vectorisation: all events within a relative ``1e-9`` of the earliest one are processed
together (each such event is moved by at most that much), per-flow state lives in numpy
arrays, and water-filling runs compiled over the (flow, link) incidence in CSR form.
"""

from __future__ import annotations

import numpy as np

from commflow.sim.dag import StepCosts, StepGraph, Sweep
from commflow.sim.kernels import water_fill
from commflow.sim.paths import Connections

RTOL = 1e-9
"""Relative time within which events are merged into one."""


def maxmin_rates(conns: Connections, sends: np.ndarray) -> np.ndarray:
    """Max-min fair rates (bytes/s) of the flows of the send steps ``sends``, by progressive
    filling over their links (each flow must cross at least one link)."""
    ptr, link, fraction = conns.expand(sends)
    return water_fill(ptr, link, fraction, conns.bandwidth, RTOL)


class _Flows:
    """Pending (start time known, in the future) and active flows, as numpy arrays."""

    def __init__(self, conns: Connections) -> None:
        self.conns = conns
        self.now = 0.0
        self.pending_step = np.zeros(0, dtype=np.int64)
        self.pending_start = np.zeros(0)
        self.pending_bytes = np.zeros(0)
        self.step = np.zeros(0, dtype=np.int64)
        self.left = np.zeros(0)
        self.rate = np.zeros(0)

    @property
    def idle(self) -> bool:
        return not (len(self.step) or len(self.pending_step))

    def add(self, steps: np.ndarray, start: np.ndarray, nbytes: np.ndarray) -> None:
        self.pending_step = np.concatenate((self.pending_step, steps))
        self.pending_start = np.concatenate((self.pending_start, start))
        self.pending_bytes = np.concatenate((self.pending_bytes, nbytes))

    def next_time(self) -> float:
        """Time of the next event: a pending flow starting or an active flow draining."""
        t = self.pending_start.min() if len(self.pending_step) else np.inf
        if len(self.step):
            t = min(t, self.now + (self.left / self.rate).min())
        return float(t)

    def advance(self, t: float) -> np.ndarray:
        """Move to time ``t``: start due flows, drain active ones; returns the send steps
        whose flows finished (at ``t``) and recomputes rates if the flow set changed."""
        self.left -= self.rate * (t - self.now)
        self.now = t
        horizon = t + RTOL * t
        due = self.pending_start <= horizon
        if due.any():
            self.step = np.concatenate((self.step, self.pending_step[due]))
            self.left = np.concatenate((self.left, self.pending_bytes[due]))
            self.rate = np.concatenate((self.rate, np.zeros(int(due.sum()))))
            keep = ~due
            self.pending_step = self.pending_step[keep]
            self.pending_start = self.pending_start[keep]
            self.pending_bytes = self.pending_bytes[keep]
        done = self.left <= self.rate * (RTOL * t)
        finished = self.step[done]
        if done.any():
            keep = ~done
            self.step, self.left, self.rate = self.step[keep], self.left[keep], self.rate[keep]
        if (due.any() or done.any()) and len(self.step):
            self.rate = maxmin_rates(self.conns, self.step)
        return finished


def run_flow(graph: StepGraph, conns: Connections, costs: StepCosts) -> Sweep:
    """Time every step of ``graph`` under max-min fair flows; returns the finished
    :class:`Sweep`. Raises ``SimulationError`` when the program deadlocks."""
    sweep = Sweep(graph, conns, costs)
    flows = _Flows(conns)
    while True:
        held, start, _ = sweep.run(hold=True)
        if len(held):
            flows.add(held, start, costs.nbytes(held))
        if flows.idle:
            break
        finished = flows.advance(flows.next_time())
        sweep.finish[finished] = flows.now
        sweep.complete(finished)
    sweep.check_done()
    return sweep
