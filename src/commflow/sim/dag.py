"""The step graph of a program and the vectorised sweep both cost models run on.

A step's predecessors are the previous step of its channel, its explicit ``deps`` and, for a
receive, the send it matches (:func:`commflow.ir.match_transfers`). Timing rules shared by the
models (times in seconds, bandwidths in bytes/s):

- a step starts when all its predecessors have completed; for a receive, its send counts as
  completed when the message has *arrived*: the send's completion (its bytes injected) plus
  the connection's latency;
- a step completes at ``start + duration``: a send's duration is set by the model; ``COPY``
  lasts ``bytes / copy_bandwidth``, ``REDUCE`` and ``RECV_REDUCE`` ``bytes /
  reduce_bandwidth`` (each free when its bandwidth is ``None``); ``RECV`` lasts 0.

:class:`Sweep` walks the graph in Kahn order, a whole frontier at a time. *Wave 0* is the set
of steps with no predecessor; wave ``w + 1`` is the set of steps whose last outstanding
predecessor completed in wave ``w`` (equivalently: the steps whose longest chain of
predecessors has ``w + 1`` steps). Every operation on a wave is a numpy operation over the
wave's steps; Python iterates once per wave (the depth of the graph), never per step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commflow.errors import SimulationError
from commflow.ir import Op, Program, match_transfers
from commflow.sim.paths import Connections, gather_ranges, gather_segments

FIRST, LAST, SEND, RECV, REDUCES, COPIES, CONTENDED = 1, 2, 4, 8, 16, 32, 64
"""Bits of :attr:`StepGraph.code`: first/last step of its channel, a send, a receive, a step
that reduces (``REDUCE``, ``RECV_REDUCE``), a copy, a send on a contended connection."""

_ONE = np.int32(1)
_OP_CODE = np.zeros(max(Op) + 1, dtype=np.uint8)
_OP_CODE[[Op.SEND, Op.RECV, Op.RECV_REDUCE, Op.COPY, Op.REDUCE]] = [
    SEND,
    RECV,
    RECV | REDUCES,
    COPIES,
    REDUCES,
]


class StepGraph:
    """Predecessors and successors of every step of a program.

    ``code`` holds per step the bits ``FIRST | LAST | SEND | RECV | REDUCES | COPIES``, and
    ``CONTENDED`` for the steps ``contended`` (sends on contended connections);
    ``partner`` is, for a receive, the send it matches and, for a send, its receive (-1
    otherwise); ``indegree`` counts predecessors. Raises ``VerificationError`` (from
    :func:`~commflow.ir.match_transfers`) when sends and receives do not pair up.
    """

    def __init__(self, program: Program, contended: np.ndarray) -> None:
        t = program.table
        n = len(t)
        self.program = program
        self.nsteps = n
        self.code = _OP_CODE[t.op]
        self.code[contended] |= CONTENDED
        if n:
            starts = t.channel_starts
            self.code[starts[:-1]] |= FIRST
            self.code[starts[1:] - 1] |= LAST
        self.partner = match_transfers(program)
        recv = np.flatnonzero(self.partner >= 0)
        self.partner[self.partner[recv]] = recv
        self.indegree = ((self.code & FIRST) == 0).astype(np.int32)
        self.indegree[recv] += 1
        self.has_deps = len(t.dep_idx) > 0
        self.dep_target = self.dep_owner = np.zeros(0, dtype=np.int64)
        if self.has_deps:
            ndeps = np.diff(t.dep_ptr)
            self.indegree += ndeps.astype(np.int32)
            order = np.argsort(t.dep_idx, kind="stable")
            self.dep_target = t.dep_idx[order]
            self.dep_owner = np.repeat(np.arange(n, dtype=np.int64), ndeps)[order]

    def critical_predecessor(
        self, i: int, latency: Callable[[np.ndarray], np.ndarray], finish: np.ndarray
    ) -> int:
        """The predecessor of step ``i`` that determined its start, given completion times
        ``finish`` (-1 when it had none). On ties the message wins over a dependency, and a
        dependency over the channel predecessor."""
        t = self.program.table
        start, pred = 0.0, -1
        if not self.code[i] & FIRST:
            start, pred = float(finish[i - 1]), i - 1
        deps = t.dep_idx[t.dep_ptr[i] : t.dep_ptr[i + 1]]
        if len(deps):
            best = int(deps[np.argmax(finish[deps])])
            if finish[best] >= start:
                start, pred = float(finish[best]), best
        if self.code[i] & RECV:
            send = int(self.partner[i])
            if finish[send] + latency(np.array([send]))[0] >= start:
                pred = send
        return pred


class Sweep:
    """Kahn-order traversal of a :class:`StepGraph` with per-step completion times.

    ``latency(sends)`` gives, for send steps, the seconds between a send's completion and its
    message's arrival. ``finish`` (seconds) is filled in by the model as steps complete. The
    sweep counts down ``graph.indegree`` in place (no copy of a large array): a graph is swept
    once.
    """

    def __init__(self, graph: StepGraph, latency: Callable[[np.ndarray], np.ndarray]) -> None:
        self.graph = graph
        self.latency = latency
        self.indegree = graph.indegree
        self.finish = np.zeros(graph.nsteps, dtype=np.float64)
        self.completed = 0
        sources = np.flatnonzero(self.indegree == 0)
        self.indegree[sources] = -1
        self._ready = [sources]

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """The current wave: every step that became ready since the last call, and their
        :attr:`StepGraph.code`."""
        ready = self._ready
        self._ready = []
        steps = ready[0] if len(ready) == 1 else np.concatenate(ready or [np.zeros(0, np.int64)])
        return steps, self.graph.code[steps]

    def start(self, steps: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Start times (seconds) of ready ``steps`` whose codes are ``codes``."""
        g = self.graph
        start = np.where(codes & FIRST, 0.0, self.finish[steps - 1])
        if g.has_deps:
            self._dep_starts(steps, start)
        recv = (codes & RECV).nonzero()[0]
        if len(recv):
            sends = g.partner[steps[recv]]
            start[recv] = np.maximum(start[recv], self.finish[sends] + self.latency(sends))
        return start

    def _dep_starts(self, steps: np.ndarray, start: np.ndarray) -> None:
        t = self.graph.program.table
        sel = np.flatnonzero(t.dep_ptr[steps + 1] > t.dep_ptr[steps])
        if len(sel):
            seg_ptr, entry = gather_segments(t.dep_ptr, steps[sel])
            latest = np.maximum.reduceat(self.finish[t.dep_idx[entry]], seg_ptr[:-1])
            start[sel] = np.maximum(start[sel], latest)

    def complete(self, steps: np.ndarray, codes: np.ndarray) -> None:
        """Mark ``steps`` (codes ``codes``, ``finish`` set) completed; successors whose last
        predecessor this was join the next wave."""
        g = self.graph
        self.completed += len(steps)
        indegree = self.indegree
        # channel successors and matched receives are each distinct within a wave, so a
        # plain fancy-index decrement is exact for them; dependencies may repeat
        succ = [steps[(codes & LAST) == 0] + 1, g.partner[steps[(codes & SEND) != 0]]]
        for distinct in succ:
            indegree[distinct] -= _ONE
        if g.has_deps:
            lo = np.searchsorted(g.dep_target, steps, side="left")
            hi = np.searchsorted(g.dep_target, steps, side="right")
            owners = g.dep_owner[gather_ranges(lo, hi)[1]]
            np.subtract.at(indegree, owners, _ONE)
            succ.append(owners)
        succ = np.concatenate(succ)
        ready = succ[indegree[succ] == 0]
        if len(ready):
            # A step with several predecessors in this wave appears once per predecessor:
            # tag each occurrence with a distinct negative number and keep the one whose tag
            # stuck (negative indegree also marks the step as taken).
            tag = -1 - np.arange(len(ready), dtype=indegree.dtype)
            indegree[ready] = tag
            self._ready.append(ready[indegree[ready] == tag])

    def check_done(self) -> None:
        """Raise ``SimulationError`` when steps never became ready (a deadlock)."""
        stuck = self.graph.nsteps - self.completed
        if stuck:
            first = int(np.flatnonzero(self.indegree > 0)[0])
            part, chan, pos = self.graph.program.where(first)
            raise SimulationError(
                f"{self.graph.program.name}: {stuck} step(s) never start (deadlock), the first "
                f"at participant {part}, channel {chan}, step {pos}; run commflow.ir.verify on "
                "the program to locate the cycle"
            )

    def critical_path(self) -> tuple[int, ...]:
        """Global step indices from the first to the last-finishing step, each being the
        predecessor that determined the next one's start (empty without steps)."""
        if not self.graph.nsteps:
            return ()
        step = int(np.argmax(self.finish))
        path = [step]
        while True:
            step = self.graph.critical_predecessor(step, self.latency, self.finish)
            if step < 0:
                return tuple(reversed(path))
            path.append(step)


class StepCosts:
    """Bytes of every step, and the duration (seconds) of every step whose duration does not
    depend on other traffic: local work, receives, and sends on uncontended connections
    (``bytes * solo_time_per_byte``). Contended sends get 0: the model times them.

    ``chunk_bytes`` bytes per chunk; ``reduce_bandwidth`` and ``copy_bandwidth`` in bytes/s,
    ``None`` for free local work.
    """

    def __init__(
        self,
        graph: StepGraph,
        conns: Connections,
        chunk_bytes: float,
        reduce_bandwidth: float | None,
        copy_bandwidth: float | None,
    ) -> None:
        self.count = graph.program.table.count
        self.chunk_bytes = chunk_bytes
        self.duration = np.zeros(graph.nsteps, dtype=np.float64)
        alone = ~conns.contended[conns.send_conn]
        sends = conns.sends[alone]
        self.duration[sends] = self.nbytes(sends) * conns.solo_time_per_byte[conns.send_conn[alone]]
        for bandwidth, bit in ((reduce_bandwidth, REDUCES), (copy_bandwidth, COPIES)):
            if bandwidth is not None:
                steps = np.flatnonzero(graph.code & bit)
                self.duration[steps] = self.nbytes(steps) / bandwidth

    def nbytes(self, steps: np.ndarray) -> np.ndarray:
        """Bytes each of ``steps`` moves or touches."""
        return self.count[steps] * self.chunk_bytes
