"""Verification of a program by symbolic execution.

Every chunk carries an :class:`~commflow.collectives.Element` (which logical element, and the
set of ranks whose contributions it holds). The verifier executes the program in a dependency
order (sends are buffered: a send completes without waiting for its receive), and proves:

- every send pairs with a receive of the same size on the same connection (FIFO order);
- no step waits forever (deadlock: a cycle of waits through channels, deps and messages);
- no step reads a chunk that holds no data, and no reduction combines different elements or
  counts a rank's contribution twice;
- steps of different channels of one participant that touch the same chunk (one writing) are
  ordered by dependencies (no data race);
- the collective's postcondition holds on every rank's output.
"""

from __future__ import annotations

import numpy as np

from commflow.collectives import Element, postcondition, precondition
from commflow.errors import VerificationError
from commflow.ir.matching import match_transfers
from commflow.ir.program import Program
from commflow.ir.step import Buffer, Op
from commflow.ir.target import Target, bounded, get_target

_SEND, _RECV, _RECV_REDUCE, _COPY = int(Op.SEND), int(Op.RECV), int(Op.RECV_REDUCE), int(Op.COPY)


def verify(program: Program, *, target: Target | str | None = None,
           max_bytes: float | None = None) -> None:
    """Prove that ``program`` implements its collective; raise ``VerificationError`` naming the
    rank, channel, step and chunk of the first problem found.

    ``target`` (a :class:`~commflow.ir.target.Target` or its name; default ``live``, which
    buffers sends without bound) sets where the program will run: on a target with bounded
    buffers a send waits for room (:func:`~commflow.ir.target.bounded`), so a program whose
    sends would block each other forever there fails as a deadlock. ``max_bytes``: the largest
    size (bytes) it will run at there (smaller chunks take fewer slots); default: any size.
    """
    where = get_target(target)
    chunk = None if max_bytes is None else program.chunk_bytes(max_bytes)
    _Execution(bounded(program, where, chunk_bytes=chunk), where).run()


def element_trace(program: Program) -> np.ndarray:
    """Verify ``program`` and return, per chunk a step moves, the logical element it carries.

    Entry ``ptr[i] + k`` is the element index of chunk ``k`` of step ``i`` (the value sent, or
    written), with ``ptr = [0, cumsum(count)]``. Executors use it to size chunks when a buffer
    does not divide evenly into chunks.
    """
    execution = _Execution(program, trace=True)
    execution.run()
    return execution.trace


class _Execution:
    def __init__(self, program: Program, target: Target | None = None,
                 trace: bool = False) -> None:
        self.p = program
        self.target = target
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
        t = self.t
        # plain lists: indexing them is several times cheaper than numpy scalars per step
        self.op, self.count, self.part = t.op.tolist(), t.count.tolist(), t.part.tolist()
        self.src_buf, self.src_off = t.src_buf.tolist(), t.src_off.tolist()
        self.dst_buf, self.dst_off = t.dst_buf.tolist(), t.dst_off.tolist()
        self.sender_l = self.sender.tolist()
        starts = self.t.channel_starts
        self.group = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
        self.group_l = self.group.tolist()
        self.position = self.t.position
        multi = np.bincount(self.t.part[starts[:-1]], minlength=len(program.participants)) > 1
        self.track_races = bool(multi.any())
        self.pairs: list[tuple[int, int, int, int]] = []
        """Accesses to one chunk from two channels, one writing: ``(earlier, later, buffer,
        index)``, checked for a happens-before order after the execution (:meth:`races`)."""
        self.order: list[int] = []
        self.last_write: dict[tuple[int, int, int], int] = {}
        self.readers: dict[tuple[int, int, int], list[int]] = {}

    def error(self, i: int, message: str, chunk: tuple[int, int] | None = None):
        part, chan, pos = self.p.where(i)
        where = None if chunk is None else (Buffer(chunk[0]).label, chunk[1])
        return VerificationError(f"{self.p.name}: {message}", rank=part, channel=chan, step=pos,
                                 chunk=where)

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
        self.races()
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
        waits += [f"step {self.position[d]} of channel {t.chan[d]}" if t.part[d] == t.part[i]
                  else f"buffer room toward rank {t.part[d]} (its step {self.position[d]} of "
                       f"channel {t.chan[d]} must receive first)"
                  for d in t.deps_of(i) if not done[d]]
        on = f" on {self.target.describe()}" if self.target and self.target.bounded else ""
        raise self.error(i, f"deadlock{on}: {len(stuck)} channel(s) never finish; this step "
                            f"waits for {' and '.join(waits) or 'an earlier step'}")

    def access(self, i: int, buf: int, index: int, write: bool) -> None:
        if not self.track_races:
            return
        key = (self.part[i], buf, index)
        group = self.group_l[i]
        a = self.last_write.get(key, -1)
        if a >= 0 and self.group_l[a] != group:
            self.pairs.append((a, i, buf, index))
        if write:
            for a in self.readers.get(key, ()):
                if self.group_l[a] != group:
                    self.pairs.append((a, i, buf, index))
            self.last_write[key] = i
            self.readers[key] = []
        else:
            self.readers.setdefault(key, []).append(i)

    def races(self) -> None:
        """Raise for the first recorded pair of accesses (in execution order) whose earlier
        step does not happen before the later one. Happens-before is computed one channel at
        a time, for the channels that hold an earlier access only: that channel's entry of
        every step's vector clock (:func:`~commflow.ir.verify_kernels.reach`), one pass over
        the execution order each; exact, and linear in steps per such channel."""
        if not self.pairs:
            return
        from commflow.ir.verify_kernels import reach

        t = self.t
        first = np.zeros(len(t), dtype=np.bool_)
        first[t.channel_starts[:-1]] = True
        order = np.asarray(self.order, dtype=np.int64)
        seen = np.empty(len(t), dtype=np.int64)
        seen[order] = np.arange(len(order))
        group = self.group.astype(np.int64)
        earlier = np.array([a for a, *_ in self.pairs], dtype=np.int64)
        later = np.array([b for _, b, *_ in self.pairs], dtype=np.int64)
        # most pairs are ordered by a dependency of the later step on the earlier one's
        # channel at or after it: settled here, the rest by the clocks
        ndeps = t.dep_ptr[later + 1] - t.dep_ptr[later]
        owner = np.repeat(np.arange(len(later)), ndeps)
        within = np.arange(int(ndeps.sum())) - np.repeat(np.cumsum(ndeps) - ndeps, ndeps)
        dep = t.dep_idx[np.repeat(t.dep_ptr[later], ndeps) + within]
        hit = (group[dep] == group[earlier[owner]]) & \
            (self.position[dep] >= self.position[earlier[owner]])
        open_pairs = np.flatnonzero(np.bincount(owner[hit], minlength=len(later)) == 0)
        clock = np.empty(len(t), dtype=np.int64)
        bad = []
        for r in np.unique(group[earlier[open_pairs]]).tolist():
            reach(order, first, t.dep_ptr, t.dep_idx, self.sender, group, self.position, r,
                  clock)
            mine = open_pairs[group[earlier[open_pairs]] == r]
            unordered = mine[clock[later[mine]] < self.position[earlier[mine]]]
            bad += unordered.tolist()
        if bad:
            k = min(bad, key=lambda k: (seen[later[k]], k))
            a, b, buf, index = self.pairs[k]
            raise self.error(b, f"data race with step {self.position[a]} of channel "
                                f"{t.chan[a]}: add a dependency between them", (buf, index))

    def read(self, i: int, buf: int, index: int) -> Element:
        value = self.buffers[self.part[i]][buf][index]
        if value is None:
            raise self.error(i, "missing data: reads a chunk that holds no data", (buf, index))
        self.access(i, buf, index, write=False)
        return value

    def write(self, i: int, buf: int, index: int, value: Element) -> None:
        self.access(i, buf, index, write=True)
        self.buffers[self.part[i]][buf][index] = value

    def combine(self, i: int, a: Element, b: Element, where: tuple[int, int]) -> Element:
        if a.index != b.index:
            raise self.error(i, f"reduces different elements ({a.describe()} with "
                                f"{b.describe()})", where)
        if a.ranks & b.ranks:
            twice = Element(a.index, a.ranks & b.ranks).describe()
            raise self.error(i, f"double counting: {twice} reduced twice", where)
        return Element(a.index, a.ranks | b.ranks)

    def execute(self, i: int) -> None:
        self.order.append(i)
        op, count = self.op[i], self.count[i]
        src_buf, dst_buf = self.src_buf[i], self.dst_buf[i]
        src0, dst0 = self.src_off[i], self.dst_off[i]
        if op == _SEND:
            message = [self.read(i, src_buf, src0 + k) for k in range(count)]
            self.messages[i] = message
            if self.trace is not None:
                self.trace[self.trace_ptr[i]:self.trace_ptr[i + 1]] = [v.index for v in message]
            return
        if op in (_RECV, _RECV_REDUCE):
            incoming = self.messages.pop(self.sender_l[i])
        for k in range(count):
            if op == _RECV:
                value = incoming[k]
            elif op == _RECV_REDUCE:
                value = self.combine(i, self.read(i, src_buf, src0 + k), incoming[k],
                                     (dst_buf, dst0 + k))
            elif op == _COPY:
                value = self.read(i, src_buf, src0 + k)
            else:
                value = self.combine(i, self.read(i, dst_buf, dst0 + k),
                                     self.read(i, src_buf, src0 + k), (dst_buf, dst0 + k))
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
