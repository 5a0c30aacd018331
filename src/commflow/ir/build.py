"""Constructing programs: :func:`make_program` from columns (vectorised generators) and
:class:`ProgramBuilder` for step-by-step construction. Both validate structure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from commflow.collectives import Collective, buffer_shape, check_root
from commflow.errors import ProgramError
from commflow.ir.program import Participant, Program, StepTable
from commflow.ir.step import Buffer, Op, ParticipantKind, Ref


def make_program(
    name: str,
    collective: Collective,
    nranks: int,
    *,
    chunk_factor: int,
    columns: Mapping[str, np.ndarray],
    root: int | None = None,
    dep_ptr: np.ndarray | None = None,
    dep_idx: np.ndarray | None = None,
    switches: int = 0,
    params: Mapping[str, object] | None = None,
) -> Program:
    """Build and structurally validate a program from step columns (see :class:`StepTable`).

    Columns must be sorted by ``(part, chan)`` with channel order preserved. Scratch buffers are
    sized from the highest scratch chunk referenced. Raises ``ProgramError`` naming the first
    malformed step (bad op, peer, buffer reference, dependency).
    """
    if nranks < 1 or chunk_factor < 1:
        raise ProgramError(f"{name}: nranks and chunk_factor must be >= 1")
    root = check_root(collective, nranks, root)
    table = StepTable.from_columns(dict(columns), dep_ptr, dep_idx)
    nparts = nranks + switches
    shape = buffer_shape(collective, nranks, chunk_factor)
    scratch = _scratch_sizes(table, nparts)
    participants = tuple(
        Participant(ParticipantKind.RANK, shape.input, shape.output, int(scratch[p]))
        if p < nranks else Participant(ParticipantKind.SWITCH, 0, 0, int(scratch[p]))
        for p in range(nparts)
    )
    program = Program(name, collective, nranks, chunk_factor, root, participants, table,
                      tuple(sorted((params or {}).items())))
    _check_structure(program)
    return program


def _scratch_sizes(t: StepTable, nparts: int) -> np.ndarray:
    size = np.zeros(nparts, dtype=np.int64)
    for buf, off in ((t.src_buf, t.src_off), (t.dst_buf, t.dst_off)):
        mask = buf == Buffer.SCRATCH
        if mask.any():
            parts = t.part[mask]
            if parts.min() < 0 or parts.max() >= nparts:
                raise ProgramError("a step names a participant outside the program")
            np.maximum.at(size, parts, off[mask] + t.count[mask])
    return size


def _fail(program: Program, mask: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(mask)
    if len(bad):
        part, chan, pos = program.where(int(bad[0]))
        raise ProgramError(
            f"{program.name}: participant {part}, channel {chan}, step {pos}: {what}"
            f" ({len(bad)} step(s) affected)"
        )


def _check_structure(program: Program) -> None:
    """Whole-array checks first (a few passes over the columns); the offending steps are
    located only when a check fails."""
    t = program.table
    if len(t) == 0:
        return
    nparts = len(program.participants)

    def check(ok: bool, bad: Callable[[], np.ndarray], what: str) -> None:
        if not ok:
            _fail(program, bad(), what)

    part, peer, op = t.part, t.peer, t.op
    check(part.min() >= 0 and part.max() < nparts, lambda: (part < 0) | (part >= nparts),
          "participant out of range")
    check(t.chan.min() >= 0, lambda: t.chan < 0, "negative channel id")
    check(op.min() >= 0 and op.max() <= max(Op), lambda: (op < 0) | (op > max(Op)), "unknown op")
    check(t.count.min() >= 1, lambda: t.count < 1, "count must be >= 1")
    comm = op <= Op.RECV_REDUCE
    check(peer.max() < nparts, lambda: peer >= nparts, "peer out of range")
    check(bool(np.array_equal(comm, peer >= 0)), lambda: comm != (peer >= 0),
          "peer missing on a communication step, or present on a local one")
    check(peer.min() >= -1, lambda: peer < -1, "peer out of range")
    check(not (peer == part).any(), lambda: peer == part, "peer is the participant itself")
    check(bool(np.array_equal(op != Op.RECV, t.src_buf >= 0)),
          lambda: (op != Op.RECV) != (t.src_buf >= 0), "src present/absent contrary to the op")
    check(bool(np.array_equal(op != Op.SEND, t.dst_buf >= 0)),
          lambda: (op != Op.SEND) != (t.dst_buf >= 0), "dst present/absent contrary to the op")
    rank = program.participants[0]
    unbounded = np.iinfo(np.int64).max
    caps = np.array([unbounded, rank.input_chunks, rank.output_chunks, unbounded])
    for buf, off, label in ((t.src_buf, t.src_off, "src"), (t.dst_buf, t.dst_off, "dst")):
        check(buf.max() <= Buffer.SCRATCH, lambda buf=buf: buf > Buffer.SCRATCH,
              f"{label} names an unknown buffer")
        check(bool(np.array_equal(buf >= 0, off >= 0)), lambda buf=buf, off=off:
              (buf >= 0) != (off >= 0), f"{label} chunk reference outside its buffer")
        end = off + t.count
        over = end > caps[buf + 1]
        if nparts > program.nranks:
            over |= (part >= program.nranks) & (buf >= 0) & (buf < Buffer.SCRATCH)
        check(not over.any(), lambda over=over: over, f"{label} chunk reference outside its buffer")
    if len(t.dep_idx):
        owner = np.repeat(np.arange(len(t), dtype=np.int64), np.diff(t.dep_ptr))
        bad = (t.dep_idx < 0) | (t.dep_idx >= len(t))
        _fail(program, np.bincount(owner[bad], minlength=len(t)) > 0, "dependency out of range")
        cross = (t.part[t.dep_idx] != t.part[owner]) | (t.dep_idx == owner)
        _fail(program, np.bincount(owner[cross], minlength=len(t)) > 0,
              "dependency on itself or on another participant")


@dataclass(frozen=True)
class StepId:
    """Handle of a step added to a :class:`ProgramBuilder`, usable in ``deps``."""

    participant: int
    channel: int
    position: int


class ProgramBuilder:
    """Builds a program step by step.

    >>> b = ProgramBuilder(Collective.ALLGATHER, 2, chunk_factor=1, name="demo")
    >>> b.transfer(0, 1, inp(0), out(0))  # doctest: +SKIP
    """

    def __init__(self, collective: Collective, nranks: int, *, chunk_factor: int, name: str,
                 root: int | None = None, params: Mapping[str, object] | None = None) -> None:
        self.collective = collective
        self.nranks = nranks
        self.chunk_factor = chunk_factor
        self.name = name
        self.root = root
        self.params = dict(params or {})
        self._switches = 0
        self._rows: list[tuple[int, int, int, int, int, int, int, int, int]] = []
        self._deps: list[tuple[StepId, ...]] = []
        self._ids: list[StepId] = []
        self._next: dict[tuple[int, int], int] = {}

    def add_switch(self) -> int:
        """Add an in-network participant (scratch buffers only); returns its id."""
        self._switches += 1
        return self.nranks + self._switches - 1

    def _add(self, part: int, chan: int, op: Op, peer: int, src: Ref | None, dst: Ref | None,
             deps: Iterable[StepId]) -> StepId:
        if src is not None and dst is not None and src.count != dst.count:
            raise ProgramError(f"{self.name}: {op.name} of {src} into {dst}: counts differ")
        count = (src or dst).count  # type: ignore[union-attr]
        pos = self._next.get((part, chan), 0)
        self._next[(part, chan)] = pos + 1
        sid = StepId(part, chan, pos)
        self._rows.append((part, chan, int(op), peer,
                           -1 if src is None else int(src.buffer), -1 if src is None else src.index,
                           -1 if dst is None else int(dst.buffer), -1 if dst is None else dst.index,
                           count))
        self._deps.append(tuple(deps))
        self._ids.append(sid)
        return sid

    def send(self, rank: int, peer: int, src: Ref, *, channel: int = 0,
             deps: Iterable[StepId] = ()) -> StepId:
        """``rank`` sends ``src`` to ``peer``."""
        return self._add(rank, channel, Op.SEND, peer, src, None, deps)

    def recv(self, rank: int, peer: int, dst: Ref, *, channel: int = 0,
             deps: Iterable[StepId] = ()) -> StepId:
        """``rank`` receives from ``peer`` into ``dst``."""
        return self._add(rank, channel, Op.RECV, peer, None, dst, deps)

    def recv_reduce(self, rank: int, peer: int, src: Ref, dst: Ref, *, channel: int = 0,
                    deps: Iterable[StepId] = ()) -> StepId:
        """``rank`` receives from ``peer``, reduces with local ``src`` and writes ``dst``."""
        return self._add(rank, channel, Op.RECV_REDUCE, peer, src, dst, deps)

    def copy(self, rank: int, src: Ref, dst: Ref, *, channel: int = 0,
             deps: Iterable[StepId] = ()) -> StepId:
        """Local copy ``src -> dst`` on ``rank``."""
        return self._add(rank, channel, Op.COPY, -1, src, dst, deps)

    def reduce(self, rank: int, src: Ref, dst: Ref, *, channel: int = 0,
               deps: Iterable[StepId] = ()) -> StepId:
        """Local ``dst = dst (op) src`` on ``rank``."""
        return self._add(rank, channel, Op.REDUCE, -1, src, dst, deps)

    def transfer(self, src_rank: int, dst_rank: int, src: Ref, dst: Ref, *, reduce: bool = False,
                 channel: int = 0, operand: Ref | None = None) -> tuple[StepId, StepId]:
        """A send on ``src_rank`` and its receive on ``dst_rank`` (a receive-reduce with local
        ``operand`` (default ``dst``) when ``reduce``)."""
        s = self.send(src_rank, dst_rank, src, channel=channel)
        if reduce:
            r = self.recv_reduce(dst_rank, src_rank, operand or dst, dst, channel=channel)
        else:
            r = self.recv(dst_rank, src_rank, dst, channel=channel)
        return s, r

    def build(self) -> Program:
        """The program; raises ``ProgramError`` if it is malformed."""
        rows = np.array(self._rows, dtype=np.int64).reshape(-1, 9)
        n = len(rows)
        order = np.lexsort((np.arange(n), rows[:, 1], rows[:, 0]))
        rows = rows[order]
        names = ("part", "chan", "op", "peer", "src_buf", "src_off", "dst_buf", "dst_off",
                 "count")
        columns = {k: rows[:, j] for j, k in enumerate(names)}
        index = {self._ids[int(o)]: i for i, o in enumerate(order)}
        counts = np.zeros(n + 1, dtype=np.int64)
        flat: list[int] = []
        for i, o in enumerate(order):
            deps = self._deps[int(o)]
            for d in deps:
                if d not in index:
                    raise ProgramError(f"{self.name}: dependency on unknown step {d}")
                flat.append(index[d])
            counts[i + 1] = len(deps)
        return make_program(self.name, self.collective, self.nranks,
                            chunk_factor=self.chunk_factor, columns=columns, root=self.root,
                            dep_ptr=np.cumsum(counts), dep_idx=np.array(flat, dtype=np.int64),
                            switches=self._switches, params=self.params)
