"""The one error root of commflow and its families.

Every message names what failed (operation, rank, peer, step or sequence number where they
apply) and what to try next.
"""

from __future__ import annotations


class CommflowError(Exception):
    """Root of every error commflow raises on purpose."""


class TopologyError(CommflowError):
    """A topology is unknown, malformed, or cannot carry what was asked of it."""


class ProgramError(CommflowError):
    """A program is structurally malformed (bad buffer reference, unknown op, bad field)."""


class VerificationError(ProgramError):
    """A program does not implement its collective.

    Attributes name where the problem was found, each ``None`` when it does not apply.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        channel: int | None = None,
        step: int | None = None,
        chunk: tuple[str, int] | None = None,
    ) -> None:
        where = []
        if rank is not None:
            where.append(f"rank {rank}")
        if channel is not None:
            where.append(f"channel {channel}")
        if step is not None:
            where.append(f"step {step}")
        if chunk is not None:
            where.append(f"chunk {chunk[0]}[{chunk[1]}]")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.rank = rank
        self.channel = channel
        self.step = step
        self.chunk = chunk


class AlgorithmError(CommflowError):
    """An algorithm is unknown, or does not apply to the collective/parameters given."""


class SimulationError(CommflowError):
    """A program cannot be simulated on a topology (ranks missing, no route)."""


class DeadlockError(SimulationError):
    """Steps of a simulated program never start: its sends and receives wait on each other."""
