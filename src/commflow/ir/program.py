"""The program IR: one collective on ``nranks`` ranks as per-participant channels of steps.

A :class:`Program` is plain, immutable data. Steps are stored column-wise in a
:class:`StepTable` (numpy arrays, read-only) so that programs of millions of steps (a 1024-rank
pipelined ring) stay compact; :meth:`Program.steps` gives them back as :class:`Step` values.
Steps are ordered by participant, then channel, then position in the channel; a step runs
after the previous step of its channel and after its explicit ``deps``.

Participants ``0 .. nranks-1`` are the ranks; later participants (switches doing in-network
aggregation) have scratch buffers only.

Sends and receives match in FIFO order per connection ``(src, dst, channel)``: the k-th send of
``src`` to ``dst`` on channel c pairs with the k-th receive of ``dst`` from ``src`` on channel c.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from commflow.collectives import Collective, buffer_shape, chunk_bytes
from commflow.errors import ProgramError
from commflow.ir.step import Buffer, Op, ParticipantKind, Ref, Step

_COLUMNS = ("part", "chan", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off", "count")
_DTYPES = {"part": np.int32, "chan": np.int32, "op": np.int8, "peer": np.int32,
           "src_buf": np.int8, "src_off": np.int64, "dst_buf": np.int8, "dst_off": np.int64,
           "count": np.int32}


@dataclass(frozen=True, eq=False)
class StepTable:
    """All steps of a program, column-wise, sorted by ``(part, chan, position)``.

    Columns (one entry per step): ``part`` participant, ``chan`` channel id, ``op`` (:class:`Op`),
    ``peer`` (-1 for local steps), ``src_buf``/``src_off`` and ``dst_buf``/``dst_off``
    (:class:`Buffer`, chunk index; -1 when unused), ``count`` chunks. Explicit dependencies are
    CSR: the deps of step ``i`` are global step indices ``dep_idx[dep_ptr[i]:dep_ptr[i+1]]``.
    """

    part: np.ndarray
    chan: np.ndarray
    op: np.ndarray
    peer: np.ndarray
    src_buf: np.ndarray
    src_off: np.ndarray
    dst_buf: np.ndarray
    dst_off: np.ndarray
    count: np.ndarray
    dep_ptr: np.ndarray
    dep_idx: np.ndarray

    def __len__(self) -> int:
        return len(self.op)

    @staticmethod
    def from_columns(columns: dict[str, np.ndarray], dep_ptr: np.ndarray | None = None,
                     dep_idx: np.ndarray | None = None) -> StepTable:
        """Build a table from columns already sorted by ``(part, chan, position)``.

        Raises ``ProgramError`` when columns are missing, of unequal length or out of order.
        """
        missing = set(_COLUMNS) - set(columns)
        if missing:
            raise ProgramError(f"step table lacks columns {sorted(missing)}")
        arrays = {k: np.ascontiguousarray(columns[k], dtype=_DTYPES[k]) for k in _COLUMNS}
        n = len(arrays["op"])
        if any(len(a) != n for a in arrays.values()):
            raise ProgramError("step table columns differ in length")
        if dep_ptr is None:
            dep_ptr = np.zeros(n + 1, dtype=np.int64)
            dep_idx = np.zeros(0, dtype=np.int64)
        dep_ptr = np.ascontiguousarray(dep_ptr, dtype=np.int64)
        dep_idx = np.ascontiguousarray(dep_idx, dtype=np.int64)
        if len(dep_ptr) != n + 1:
            raise ProgramError("step table dep_ptr must have one entry more than steps")
        key = arrays["part"].astype(np.int64) << 32 | arrays["chan"].astype(np.int64)
        if n > 1 and np.any(np.diff(key) < 0):
            raise ProgramError("step table is not sorted by (participant, channel)")
        for a in (*arrays.values(), dep_ptr, dep_idx):
            a.flags.writeable = False
        return StepTable(**arrays, dep_ptr=dep_ptr, dep_idx=dep_idx)

    @cached_property
    def position(self) -> np.ndarray:
        """Position of each step within its channel."""
        n = len(self)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        starts = self.channel_starts
        pos = np.arange(n, dtype=np.int64)
        first = np.repeat(starts[:-1], np.diff(starts))
        return pos - first

    @cached_property
    def channel_starts(self) -> np.ndarray:
        """Offsets where each ``(part, chan)`` group begins, plus the total at the end."""
        n = len(self)
        if n == 0:
            return np.zeros(1, dtype=np.int64)
        change = np.flatnonzero((self.part[1:] != self.part[:-1])
                                | (self.chan[1:] != self.chan[:-1])) + 1
        return np.concatenate(([0], change, [n])).astype(np.int64)

    def deps_of(self, i: int) -> np.ndarray:
        """Global indices of the explicit dependencies of step ``i``."""
        return self.dep_idx[self.dep_ptr[i]:self.dep_ptr[i + 1]]


@dataclass(frozen=True)
class Participant:
    """One participant's kind and buffer sizes in chunks."""

    kind: ParticipantKind
    input_chunks: int
    output_chunks: int
    scratch_chunks: int

    def chunks(self, buffer: Buffer) -> int:
        """Size of ``buffer`` in chunks."""
        return (self.input_chunks, self.output_chunks, self.scratch_chunks)[buffer]


@dataclass(frozen=True, eq=False)
class Program:
    """A collective algorithm as a program.

    ``chunk_factor`` is MSCCL's: chunks per block (see :mod:`commflow.collectives` for buffer
    shapes). ``root`` is set for rooted collectives only. ``params`` records how the program
    was generated (algorithm parameters), for display and export.
    """

    name: str
    collective: Collective
    nranks: int
    chunk_factor: int
    root: int | None
    participants: tuple[Participant, ...]
    table: StepTable
    params: tuple[tuple[str, object], ...] = field(default=())

    @property
    def nsteps(self) -> int:
        """Total steps over all participants and channels."""
        return len(self.table)

    @cached_property
    def channels(self) -> tuple[tuple[int, ...], ...]:
        """Channel ids per participant."""
        starts = self.table.channel_starts[:-1]
        per: list[list[int]] = [[] for _ in self.participants]
        for p, c in zip(self.table.part[starts].tolist(), self.table.chan[starts].tolist(),
                        strict=True):
            per[p].append(c)
        return tuple(tuple(c) for c in per)

    def step_range(self, participant: int, channel: int) -> range:
        """Global indices of one channel's steps, in order (empty if it has none)."""
        starts = self.table.channel_starts
        t = self.table
        keys = t.part[starts[:-1]].astype(np.int64) << 32 | t.chan[starts[:-1]]
        j = int(np.searchsorted(keys, np.int64(participant) << 32 | channel))
        if j < len(keys) and keys[j] == (np.int64(participant) << 32 | channel):
            return range(int(starts[j]), int(starts[j + 1]))
        return range(0)

    def step(self, i: int) -> Step:
        """Step ``i`` (global index) as a :class:`Step` value."""
        t = self.table
        op = Op(int(t.op[i]))
        src = Ref(Buffer(int(t.src_buf[i])), int(t.src_off[i]), int(t.count[i])) \
            if t.src_buf[i] >= 0 else None
        dst = Ref(Buffer(int(t.dst_buf[i])), int(t.dst_off[i]), int(t.count[i])) \
            if t.dst_buf[i] >= 0 else None
        deps = tuple((int(t.chan[d]), int(t.position[d])) for d in t.deps_of(i))
        return Step(op, int(t.peer[i]) if op.communicates else None, src, dst, deps)

    def steps(self, participant: int, channel: int) -> tuple[Step, ...]:
        """One channel's steps, in order."""
        return tuple(self.step(i) for i in self.step_range(participant, channel))

    def where(self, i: int) -> tuple[int, int, int]:
        """``(participant, channel, position)`` of global step ``i``."""
        t = self.table
        return int(t.part[i]), int(t.chan[i]), int(t.position[i])

    def chunk_bytes(self, size: float) -> float:
        """Bytes per chunk when the collective moves ``size`` bytes (nccl-tests convention)."""
        return chunk_bytes(self.collective, self.nranks, self.chunk_factor, size)

    def expected_buffers(self) -> tuple[int, int]:
        """Input and output chunk counts every rank must have."""
        shape = buffer_shape(self.collective, self.nranks, self.chunk_factor)
        return shape.input, shape.output
