"""What a simulation returns: :class:`SimResult`, and its critical path as readable rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commflow.collectives import busbw_factor
from commflow.errors import SimulationError
from commflow.ir import Op, Program


@dataclass(frozen=True)
class CriticalStep:
    """One step of a critical path, located in its program."""

    participant: int
    """Participant (rank, or in-network participant) running the step."""
    channel: int
    """Channel id of the step on its participant."""
    position: int
    """Position of the step in its channel."""
    op: Op
    """What the step does."""
    peer: int | None
    """The other participant of a send or receive; ``None`` for local steps."""
    finish: float
    """Completion time of the step, seconds."""

    def describe(self) -> str:
        """One line, e.g. ``participant 3 channel 0 step 5: SEND to 4, done at 12.500 us``."""
        peer = ""
        if self.peer is not None:
            peer = f" {'to' if self.op is Op.SEND else 'from'} {self.peer}"
        return (
            f"participant {self.participant} channel {self.channel} step {self.position}: "
            f"{self.op.name}{peer}, done at {self.finish * 1e6:.3f} us"
        )


@dataclass(frozen=True, eq=False)
class SimResult:
    """Predicted time and link load of one program of one collective on one topology."""

    model: str
    """Cost model used: ``"alphabeta"`` or ``"flow"``."""
    size: float
    """Bytes the collective moves (nccl-tests meaning, see :mod:`commflow.collectives`)."""
    nranks: int
    """Ranks of the program."""
    time: float
    """Completion time of the last step, seconds (0 for a program with no steps)."""
    algbw: float
    """``size / time``, bytes/s; ``inf`` when ``time`` is 0."""
    busbw: float
    """``algbw`` times the collective's nccl-tests bus-bandwidth factor, bytes/s."""
    link_bytes: np.ndarray
    """Bytes carried by each link, aligned with ``topology.links``."""
    link_utilization: np.ndarray
    """``link_bytes / (bandwidth * time)`` per link, in [0, 1]; zeros when ``time`` is 0."""
    critical_path: tuple[int, ...]
    """Global step indices from the first to the last-finishing step, each the predecessor
    (channel predecessor, dependency or matched send) that determined the next one's start."""
    finish: np.ndarray
    """Completion time of every step (global step index), seconds. On an XML target, of
    the program as timed: in its loops (:func:`~commflow.ir.transform.repeat`) and messages
    (:func:`~commflow.ir.transform.split_messages`), where it runs in several."""

    def describe_critical_path(self, program: Program) -> tuple[CriticalStep, ...]:
        """The critical path as :class:`CriticalStep` rows, first to last.

        ``program`` must be the simulated one; ``SimulationError`` when its step count differs.
        """
        if program.nsteps != len(self.finish):
            raise SimulationError(
                f"{program.name} has {program.nsteps} steps but this result has "
                f"{len(self.finish)}; pass the program that was simulated"
            )
        rows = []
        for i in self.critical_path:
            part, chan, pos = program.where(i)
            op = Op(int(program.table.op[i]))
            peer = int(program.table.peer[i]) if op.communicates else None
            rows.append(CriticalStep(part, chan, pos, op, peer, float(self.finish[i])))
        return tuple(rows)


def make_result(
    model: str,
    program: Program,
    size: float,
    finish: np.ndarray,
    critical_path: tuple[int, ...],
    link_bytes: np.ndarray,
    link_bandwidth: np.ndarray,
) -> SimResult:
    """Assemble a :class:`SimResult` from per-step completion times (seconds), the critical
    path and per-link bytes and bandwidths (bytes/s)."""
    time = float(finish.max()) if len(finish) else 0.0
    algbw = size / time if time > 0 else float("inf")
    utilization = link_bytes / (link_bandwidth * time) if time > 0 else np.zeros_like(link_bytes)
    for array in (finish, link_bytes, utilization):
        array.flags.writeable = False
    return SimResult(
        model=model,
        size=size,
        nranks=program.nranks,
        time=time,
        algbw=algbw,
        busbw=algbw * busbw_factor(program.collective, program.nranks),
        link_bytes=link_bytes,
        link_utilization=utilization,
        critical_path=critical_path,
        finish=finish,
    )
