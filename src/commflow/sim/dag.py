"""The step graph of a program and the sweep both cost models run on.

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
predecessors has ``w + 1`` steps). The sweep itself is compiled (:mod:`commflow.sim.kernels`)
and runs wave after wave in one call until a contended send needs the model; Python sees
only those sends. A program without contended sends is timed by its predecessors alone, so
any topological order gives the same times: its sweep runs depth-first instead, each channel
on for as long as its next step is ready, which reads memory along channels rather than one
step of every channel per wave (at 4096 ranks ~5 ns per step instead of ~60).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commflow.errors import DeadlockError
from commflow.ir import Op, Program, match_transfers
from commflow.sim.kernels import run_sweep, step_codes
from commflow.sim.paths import Connections

FIRST, LAST, SEND, RECV, REDUCES, COPIES, CONTENDED = 1, 2, 4, 8, 16, 32, 64
"""Bits of :attr:`StepGraph.code`: first/last step of its channel, a send, a receive, a step
that reduces (``REDUCE``, ``RECV_REDUCE``), a copy, a send on a contended connection."""
_BITS = (FIRST, LAST, SEND, RECV, REDUCES, COPIES, CONTENDED)

_OP_CODE = np.zeros(max(Op) + 1, dtype=np.uint8)
_OP_CODE[[Op.SEND, Op.RECV, Op.RECV_REDUCE, Op.COPY, Op.REDUCE]] = [
    SEND,
    RECV,
    RECV | REDUCES,
    COPIES,
    REDUCES,
]


def _index_dtype(n: int) -> type:
    """The narrowest integer type holding step indices of an ``n``-step program (and -1)."""
    return np.int32 if n < 2**31 else np.int64


class StepGraph:
    """Predecessors and successors of every step of a program.

    ``code`` holds per step the bits ``FIRST | LAST | SEND | RECV | REDUCES | COPIES``, and
    ``CONTENDED`` for the steps ``contended`` (sends on contended connections);
    ``partner`` is, for a receive, the send it matches and, for a send, its receive (-1
    otherwise); ``indegree`` counts predecessors (int8 unless a step has more than 125
    dependencies). Raises ``VerificationError`` (from
    :func:`~commflow.ir.match_transfers`) when sends and receives do not pair up.
    """

    def __init__(self, program: Program, contended: np.ndarray) -> None:
        t = program.table
        n = len(t)
        self.program = program
        self.nsteps = n
        self.has_deps = len(t.dep_idx) > 0
        ndeps = np.diff(t.dep_ptr) if self.has_deps else np.zeros(1, dtype=np.int64)
        self.code = np.empty(n, dtype=np.uint8)
        # a step's predecessors: its channel's previous step, its send, its dependencies
        self.indegree = np.empty(n, dtype=np.int8 if 2 + ndeps.max() <= 127 else np.int32)
        step_codes(
            t.op, _OP_CODE, t.channel_starts, t.dep_ptr, self.has_deps, _BITS, self.code,
            self.indegree,
        )  # fmt: skip
        self.code[contended] |= CONTENDED
        self.partner = match_transfers(program, mirror=True, dtype=_index_dtype(n))
        self.any_order = not len(contended)
        """Whether no step is contended: every step's time then follows from its
        predecessors alone, so any topological order gives the same times."""
        self.nchannels = len(t.channel_starts) - 1
        # successors through explicit dependencies, CSR by the step depended on
        self.succ_ptr = np.zeros(n + 1 if self.has_deps else 1, dtype=np.int64)
        self.succ_idx = np.zeros(0, dtype=np.int64)
        if self.has_deps:
            order = np.argsort(t.dep_idx, kind="stable")
            self.succ_idx = np.repeat(np.arange(n, dtype=np.int64), ndeps)[order]
            np.cumsum(np.bincount(t.dep_idx, minlength=n), out=self.succ_ptr[1:])
        self.arrays = (
            self.code, self.partner, t.dep_ptr, t.dep_idx, self.succ_ptr, self.succ_idx,
            self.has_deps,
        )  # fmt: skip
        """The graph as :mod:`commflow.sim.kernels` takes it."""

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

    A message arrives its connection's latency (``conns``, seconds) after its send completes.
    ``finish`` (seconds) is filled in as steps are swept, and by the model for the contended
    sends it times. The sweep counts down ``graph.indegree`` in place (no copy of a large
    array): a graph is swept once.
    """

    def __init__(self, graph: StepGraph, conns: Connections, costs: StepCosts) -> None:
        self.graph = graph
        self.conns = conns
        self.costs = costs
        self.indegree = graph.indegree
        self.finish = np.zeros(graph.nsteps, dtype=np.float64)
        self.completed = 0
        firsts = graph.program.table.channel_starts[:-1]  # only these can lack predecessors
        self.ready = firsts[self.indegree[firsts] == 0]
        self.indegree[self.ready] = -1
        self.done = np.zeros(0, dtype=np.int64)

    def run(self, *, hold: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sweep from the ready steps while no contended send (code ``CONTENDED``, timed by
        the model) comes up; every step swept gets ``finish = start + duration``
        (:class:`StepCosts`).

        With ``hold``, contended sends are set aside, started but not completed, and the
        sweep goes on without them until nothing is ready; otherwise it stops at the first
        wave holding one, with that wave started but not completed. Returns ``(held,
        held_start, wave)``: the held sends, their start times (seconds) and the stopped
        wave (empty when the sweep ran out of ready steps). Complete held or stopped steps
        with :meth:`complete` once the model has set their ``finish``.
        """
        held, held_start, wave, completed = run_sweep(
            self.ready, self.done, self.finish, self.indegree, self.graph.arrays,
            self.costs.arrays, _BITS, hold, self.graph.any_order, self.graph.nchannels,
        )  # fmt: skip
        self.completed += completed
        self.ready = self.done = np.zeros(0, dtype=np.int64)
        return held, held_start, wave

    def complete(self, steps: np.ndarray) -> None:
        """Mark ``steps`` (``finish`` set) completed; the next :meth:`run` first releases
        their successors (those whose last predecessor they were become ready)."""
        self.completed += len(steps)
        self.done = np.concatenate((self.done, steps))

    def check_done(self) -> None:
        """Raise ``DeadlockError`` when steps never became ready."""
        stuck = self.graph.nsteps - self.completed
        if stuck:
            first = int(np.flatnonzero(self.indegree > 0)[0])
            part, chan, pos = self.graph.program.where(first)
            raise DeadlockError(
                f"{self.graph.program.name}: {stuck} step(s) never start (deadlock), the first "
                f"at participant {part}, channel {chan}, step {pos}; run commflow.ir.verify on "
                "the program (with the same target) to locate the cycle"
            )

    def critical_path(self) -> tuple[int, ...]:
        """Global step indices from the first to the last-finishing step, each being the
        predecessor that determined the next one's start (empty without steps)."""
        if not self.graph.nsteps:
            return ()
        step = int(np.argmax(self.finish))
        path = [step]
        while True:
            step = self.graph.critical_predecessor(step, self.conns.latency_of, self.finish)
            if step < 0:
                return tuple(reversed(path))
            path.append(step)


class StepCosts:
    """What steps cost: bytes per chunk, and the parameters of the duration of every step
    whose time does not depend on other traffic (:func:`commflow.sim.kernels.duration`:
    local work, receives, and sends on uncontended connections, ``bytes *
    solo_time_per_byte``; contended sends are timed by the model).

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
        self.arrays = (
            self.count, conns.of_step, conns.latency, conns.solo_time_per_byte,
            float(chunk_bytes), float(reduce_bandwidth or 0.0), float(copy_bandwidth or 0.0),
        )  # fmt: skip
        """The costs as :mod:`commflow.sim.kernels` takes them."""

    def nbytes(self, steps: np.ndarray) -> np.ndarray:
        """Bytes each of ``steps`` moves or touches."""
        return self.count[steps] * self.chunk_bytes
