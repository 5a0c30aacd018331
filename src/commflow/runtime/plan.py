"""Compiling a verified program for one rank and concrete buffer sizes: every step's chunks
become element ranges ("segments") of the input, output and scratch arrays.

Chunk ``k`` of a buffer holding whole units (a unit is one block: the array for allreduce, one
rank's share for allgather, ...) is piece ``k % cf`` of unit ``k // cf``; a unit of ``U``
elements is cut into ``cf`` pieces of ``L = ceil(U / cf)`` elements (the last ones shorter or
empty). Scratch chunks are ``L`` elements apart and hold whichever piece the program puts there
(:func:`commflow.ir.element_trace` says which).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commflow.errors import ProgramError
from commflow.ir import Buffer, Op, Program, element_trace

Segment = tuple[int, int, int]
"""``(buffer, first element, element count)``."""


@dataclass(frozen=True)
class PlannedStep:
    """One step of this rank with resolved element ranges."""

    op: Op
    peer: int
    channel: int
    src: tuple[Segment, ...]
    dst: tuple[Segment, ...]
    deps: tuple[int, ...]
    elements: int


@dataclass(frozen=True)
class RankPlan:
    """A rank's channels (lists of indices into ``steps``) and the scratch size it needs."""

    steps: tuple[PlannedStep, ...]
    channels: tuple[tuple[int, ...], ...]
    scratch_elements: int


def _merge(segments: list[Segment]) -> tuple[Segment, ...]:
    merged: list[Segment] = []
    for seg in segments:
        if seg[2] == 0:
            continue
        if merged and merged[-1][0] == seg[0] and merged[-1][1] + merged[-1][2] == seg[1]:
            merged[-1] = (seg[0], merged[-1][1], merged[-1][2] + seg[2])
        else:
            merged.append(seg)
    return tuple(merged)


class _Pieces:
    """Element ranges of chunks for units of ``unit`` elements cut into ``cf`` pieces."""

    def __init__(self, program: Program, unit: int, trace: np.ndarray | None) -> None:
        self.program = program
        self.cf = program.chunk_factor
        self.unit = unit
        self.piece = -(-unit // self.cf) if unit else 0
        self.trace = trace
        self.ptr = np.concatenate(([0], np.cumsum(program.table.count, dtype=np.int64)))
        self.scratch = 0

    def length(self, j: int) -> int:
        return max(0, min(self.piece, self.unit - j * self.piece))

    def segments(self, i: int, buf: int, off: int) -> tuple[Segment, ...]:
        """Element ranges of step ``i``'s ``count`` chunks of ``buf`` starting at ``off``."""
        cf, piece = self.cf, self.piece
        segs = []
        for k in range(int(self.program.table.count[i])):
            chunk = off + k
            j = chunk % cf if self.trace is None else int(self.trace[self.ptr[i] + k]) % cf
            if buf == Buffer.SCRATCH:
                start = chunk * piece
                self.scratch = max(self.scratch, start + piece)
            elif j != chunk % cf:
                part, ch, pos = self.program.where(i)
                raise ProgramError(
                    f"{self.program.name}: rank {part}, channel {ch}, step {pos} puts piece {j} "
                    f"into {Buffer(buf).label} chunk {chunk}; it can only run on sizes that "
                    f"divide into {cf} chunks per block")
            else:
                start = (chunk // cf) * self.unit + j * piece
            segs.append((buf, start, self.length(j)))
        return _merge(segs)


def plan_rank(program: Program, rank: int, unit_elements: int,
              trace: np.ndarray | None = None) -> RankPlan:
    """Resolve ``rank``'s steps of ``program`` for units of ``unit_elements`` elements.

    ``trace`` is ``element_trace(program)``, needed (and computed if not given) only when the
    unit does not divide evenly into chunks. Raises ``ProgramError`` when the program moves a
    piece into an input/output chunk of another length.
    """
    if unit_elements % program.chunk_factor and trace is None:
        trace = element_trace(program)
    pieces = _Pieces(program, unit_elements, trace if unit_elements % program.chunk_factor
                     else None)
    t = program.table
    steps: list[PlannedStep] = []
    channels: list[tuple[int, ...]] = []
    local_index: dict[int, int] = {}
    for chan in program.channels[rank]:
        ids = []
        for i in program.step_range(rank, chan):
            src = pieces.segments(i, int(t.src_buf[i]), int(t.src_off[i])) \
                if t.src_buf[i] >= 0 else ()
            dst = pieces.segments(i, int(t.dst_buf[i]), int(t.dst_off[i])) \
                if t.dst_buf[i] >= 0 else ()
            local_index[i] = len(steps)
            ids.append(len(steps))
            steps.append(PlannedStep(Op(int(t.op[i])), int(t.peer[i]), chan, src, dst,
                                     tuple(int(d) for d in t.deps_of(i)),
                                     sum(s[2] for s in (src or dst))))
        channels.append(tuple(ids))
    steps = [PlannedStep(s.op, s.peer, s.channel, s.src, s.dst,
                         tuple(local_index[d] for d in s.deps), s.elements) for s in steps]
    return RankPlan(tuple(steps), tuple(channels), pieces.scratch)
