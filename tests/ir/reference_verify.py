"""The verifier as it was before it was compiled (pure Python, vector clocks of steps x
channels), kept as the oracle the compiled verifier must agree with on small programs."""

from __future__ import annotations

import numpy as np

from commflow.collectives import Element, postcondition, precondition
from commflow.errors import VerificationError
from commflow.ir.matching import match_transfers
from commflow.ir.program import Program
from commflow.ir.step import Buffer, Op


def reference_verify(program: Program) -> None:
    """Verify ``program`` as the earlier verifier did."""
    _Execution(program).run()


def reference_trace(program: Program) -> np.ndarray:
    """The element trace of ``program``, as the earlier verifier computed it."""
    execution = _Execution(program, trace=True)
    execution.run()
    return execution.trace


class _Execution:
    def __init__(self, program: Program, trace: bool = False) -> None:
        self.p = program
        self.t = program.table
        self.trace_ptr = np.concatenate(([0], np.cumsum(self.t.count, dtype=np.int64))) \
            if trace else None
        self.trace = np.full(int(self.trace_ptr[-1]), -1, dtype=np.int64) if trace else None
        self.sender = match_transfers(program)
        self.buffers = [[[None] * part.chunks(b) for b in Buffer] for part in program.participants]
        for (rank, buf, i), value in precondition(program.collective, program.nranks,
                                                   program.chunk_factor, program.root).items():
            self.buffers[rank][Buffer[buf.upper()]][i] = value
        self.messages: dict[int, list[Element | None]] = {}
        starts = self.t.channel_starts
        self.group = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
        self.position = self.t.position
        multi = np.bincount(self.t.part[starts[:-1]], minlength=len(program.participants)) > 1
        ngroups = len(starts) - 1
        self.track_races = bool(multi.any())
        self.clock = np.zeros((len(self.t), ngroups), dtype=np.int32) if self.track_races \
            else None
        self.last_write: dict[tuple[int, int, int], int] = {}
        self.readers: dict[tuple[int, int, int], list[int]] = {}

    def error(self, i: int, message: str, chunk: tuple[Buffer, int] | None = None):
        part, chan, pos = self.p.where(i)
        return VerificationError(f"{self.p.name}: {message}", rank=part, channel=chan, step=pos,
                                 chunk=None if chunk is None else (chunk[0].label, chunk[1]))

    def run(self) -> None:
        t = self.t
        n = len(t)
        starts = t.channel_starts
        indegree = np.diff(t.dep_ptr).astype(np.int64)
        indegree[self.sender >= 0] += 1
        first = np.zeros(n, dtype=bool)
        first[starts[:-1]] = True
        indegree[~first] += 1
        succ: list[list[int]] = [[] for _ in range(n)]
        owners = np.repeat(np.arange(n), np.diff(t.dep_ptr))
        for d, o in zip(t.dep_idx.tolist(), owners.tolist(), strict=True):
            succ[d].append(o)
        for r, s in enumerate(self.sender.tolist()):
            if s >= 0:
                succ[s].append(r)
        last = np.zeros(n, dtype=bool)
        last[starts[1:] - 1] = True
        ready = [int(i) for i in np.flatnonzero(indegree == 0)]
        done = np.zeros(n, dtype=bool)
        while ready:
            i = ready.pop()
            self.execute(i)
            done[i] = True
            nxt = succ[i] if last[i] else [*succ[i], i + 1]
            for j in nxt:
                indegree[j] -= 1
                if indegree[j] == 0:
                    ready.append(j)
        if not done.all():
            self.deadlock(done)
        self.check_post()

    def deadlock(self, done: np.ndarray) -> None:
        t = self.t
        stuck = [int(t.channel_starts[g] + np.argmin(done[t.channel_starts[g]:
                                                          t.channel_starts[g + 1]]))
                 for g in range(len(t.channel_starts) - 1)
                 if not done[t.channel_starts[g]:t.channel_starts[g + 1]].all()]
        i = stuck[0]
        waits = []
        if self.sender[i] >= 0 and not done[self.sender[i]]:
            waits.append(f"a message from rank {t.peer[i]}")
        waits += [f"step {self.position[d]} of channel {t.chan[d]}" for d in t.deps_of(i)
                  if not done[d]]
        raise self.error(i, f"deadlock: {len(stuck)} channel(s) never finish; this step waits "
                            f"for {' and '.join(waits) or 'an earlier step'}")

    def access(self, i: int, buf: Buffer, index: int, write: bool) -> None:
        if not self.track_races:
            return
        key = (int(self.t.part[i]), int(buf), index)
        clock = self.clock[i]
        earlier = [self.last_write.get(key, -1)]
        if write:
            earlier += self.readers.get(key, [])
        for a in earlier:
            if a >= 0 and a != i and clock[self.group[a]] <= self.position[a]:
                raise self.error(i, f"data race with step {self.position[a]} of channel "
                                    f"{self.t.chan[a]}: add a dependency between them",
                                 (buf, index))
        if write:
            self.last_write[key] = i
            self.readers[key] = []
        else:
            self.readers.setdefault(key, []).append(i)

    def stamp(self, i: int) -> None:
        if not self.track_races:
            return
        t = self.t
        c = self.clock[i]
        if self.position[i] > 0:
            np.maximum(c, self.clock[i - 1], out=c)
        for d in t.deps_of(i):
            np.maximum(c, self.clock[d], out=c)
        if self.sender[i] >= 0:
            np.maximum(c, self.clock[self.sender[i]], out=c)
        c[self.group[i]] = self.position[i] + 1

    def read(self, i: int, buf: Buffer, index: int) -> Element:
        value = self.buffers[self.t.part[i]][buf][index]
        if value is None:
            raise self.error(i, "missing data: reads a chunk that holds no data", (buf, index))
        self.access(i, buf, index, write=False)
        return value

    def write(self, i: int, buf: Buffer, index: int, value: Element) -> None:
        self.access(i, buf, index, write=True)
        self.buffers[self.t.part[i]][buf][index] = value

    def combine(self, i: int, a: Element, b: Element, where: tuple[Buffer, int]) -> Element:
        if a.index != b.index:
            raise self.error(i, f"reduces different elements ({a.describe()} with "
                                f"{b.describe()})", where)
        if a.ranks & b.ranks:
            twice = Element(a.index, a.ranks & b.ranks).describe()
            raise self.error(i, f"double counting: {twice} reduced twice", where)
        return Element(a.index, a.ranks | b.ranks)

    def execute(self, i: int) -> None:
        t = self.t
        self.stamp(i)
        op = Op(int(t.op[i]))
        count = int(t.count[i])
        src_buf = Buffer(int(t.src_buf[i])) if t.src_buf[i] >= 0 else None
        dst_buf = Buffer(int(t.dst_buf[i])) if t.dst_buf[i] >= 0 else None
        src0, dst0 = int(t.src_off[i]), int(t.dst_off[i])
        if op is Op.SEND:
            self.messages[i] = [self.read(i, src_buf, src0 + k) for k in range(count)]
            if self.trace is not None:
                self.trace[self.trace_ptr[i]:self.trace_ptr[i + 1]] = \
                    [v.index for v in self.messages[i]]
            return
        if op.receives:
            incoming = self.messages.pop(int(self.sender[i]))
        for k in range(count):
            where = (dst_buf, dst0 + k)
            if op is Op.RECV:
                value = incoming[k]
            elif op is Op.RECV_REDUCE:
                value = self.combine(i, self.read(i, src_buf, src0 + k), incoming[k], where)
            elif op is Op.COPY:
                value = self.read(i, src_buf, src0 + k)
            else:
                value = self.combine(i, self.read(i, dst_buf, dst0 + k),
                                     self.read(i, src_buf, src0 + k), where)
            self.write(i, dst_buf, dst0 + k, value)
            if self.trace is not None:
                self.trace[self.trace_ptr[i] + k] = value.index

    def check_post(self) -> None:
        post = postcondition(self.p.collective, self.p.nranks, self.p.chunk_factor, self.p.root)
        for (rank, buf, index), want in post.items():
            got = self.buffers[rank][Buffer.OUTPUT][index]
            if got != want:
                have = "no data" if got is None else got.describe()
                raise VerificationError(
                    f"{self.p.name}: postcondition of {self.p.collective.value} fails: holds "
                    f"{have}, expected {want.describe()}", rank=rank, chunk=(buf, index))
