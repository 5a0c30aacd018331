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

The execution is compiled (:mod:`commflow.ir.verify_kernels`, which also says why its race
check is sound): memory linear in steps and chunks, no clock of steps x channels, so
synthesized multi-box programs of millions of steps verify in seconds.
"""

from __future__ import annotations

import numpy as np

from commflow.collectives import ChunkValues, Element, final_chunks, initial_chunks
from commflow.errors import VerificationError
from commflow.ir import verify_kernels as vk
from commflow.ir.matching import match_transfers
from commflow.ir.program import Program
from commflow.ir.step import Buffer, Op
from commflow.ir.target import Target, bounded, get_target

assert (Op.SEND, Op.RECV, Op.RECV_REDUCE, Op.COPY, Op.REDUCE) == (
    vk.SEND, vk.RECV, vk.RECV_REDUCE, vk.COPY, vk.REDUCE)


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
    execution = _Execution(program)
    execution.run()
    return execution.trace


def _words(ranks: int, words: int) -> np.ndarray:
    """The bit set ``ranks`` as ``words`` little-endian 64-bit words."""
    return np.array([ranks >> (64 * w) & (2**64 - 1) for w in range(words)], dtype=np.uint64)


def _ranks(words: np.ndarray) -> int:
    """The bit set held in ``words`` (inverse of :func:`_words`)."""
    return sum(int(x) << (64 * w) for w, x in enumerate(words.tolist()))


class _Execution:
    """One symbolic run of a program: its chunk values, as slots numbered per participant and
    buffer, and the trace of moved elements."""

    def __init__(self, program: Program, target: Target | None = None) -> None:
        self.p = program
        self.target = target
        self.t = t = program.table
        self.ptr = np.concatenate(([0], np.cumsum(t.count, dtype=np.int64)))
        self.trace = np.full(int(self.ptr[-1]), -1, dtype=np.int64)
        self.partner = match_transfers(program, mirror=True)
        sizes = [part.chunks(b) for part in program.participants for b in Buffer]
        self.base = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
        self.words = max(1, (program.nranks + 63) // 64)
        self.elem = np.full(int(self.base[-1]), -1, dtype=np.int64)
        self.bits = np.zeros((int(self.base[-1]), self.words), dtype=np.uint64)
        init = initial_chunks(program.collective, program.nranks, program.chunk_factor,
                              program.root)
        slots = self.slots(init, Buffer.INPUT)
        self.elem[slots] = init.element
        self.bits[slots] = self.bit_sets(init)

    def slots(self, values: ChunkValues, buf: Buffer) -> np.ndarray:
        """The slots of ``values``' chunks in buffer ``buf``."""
        return self.base[3 * values.rank + buf] + values.index

    def bit_sets(self, values: ChunkValues) -> np.ndarray:
        """The contributor bit sets of ``values``, one row of words each."""
        out = np.zeros((len(values.rank), self.words), dtype=np.uint64)
        out[values.contributor < 0] = _words((1 << self.p.nranks) - 1, self.words)
        one = np.flatnonzero(values.contributor >= 0)
        c = values.contributor[one]
        out[one, c // 64] = np.left_shift(np.uint64(1), (c % 64).astype(np.uint64))
        return out

    def element(self, index: int, words: np.ndarray) -> Element:
        return Element(int(index), _ranks(words))

    def error(self, i: int, message: str, chunk: tuple[int, int] | None = None):
        part, chan, pos = self.p.where(i)
        return VerificationError(f"{self.p.name}: {message}", rank=part, channel=chan, step=pos,
                                 chunk=None if chunk is None else (Buffer(chunk[0]).label,
                                                                   chunk[1]))

    def run(self) -> None:
        t = self.t
        starts = t.channel_starts
        group = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
        multi = np.bincount(t.part[starts[:-1]], minlength=len(self.p.participants)) > 1
        err = np.zeros(7, dtype=np.int64)
        err_bits = np.zeros((2, self.words), dtype=np.uint64)
        table = (t.part, t.op, t.src_buf, t.src_off, t.dst_buf, t.dst_off, t.count, t.dep_ptr,
                 t.dep_idx, group, t.position)
        done = vk.execute(table, self.partner, self.base, multi, self.elem, self.bits, self.ptr,
                          self.trace, err, err_bits)
        if err[0] != vk.OK:
            self.explain(err, err_bits)
        if not done.all():
            self.deadlock(done)
        self.check_post()

    def explain(self, err: np.ndarray, err_bits: np.ndarray) -> None:
        code, i, buf, index, other, ea, eb = err.tolist()
        where = (buf, index)
        if code == vk.MISSING:
            raise self.error(i, "missing data: reads a chunk that holds no data", where)
        if code == vk.RACE:
            raise self.error(i, f"data race with step {self.t.position[other]} of channel "
                                f"{self.t.chan[other]}: add a dependency between them", where)
        a, b = self.element(ea, err_bits[0]), self.element(eb, err_bits[1])
        if code == vk.DIFFERENT:
            raise self.error(i, f"reduces different elements ({a.describe()} with "
                                f"{b.describe()})", where)
        twice = Element(a.index, a.ranks & b.ranks).describe()
        raise self.error(i, f"double counting: {twice} reduced twice", where)

    def deadlock(self, done: np.ndarray) -> None:
        t = self.t
        starts = t.channel_starts
        stuck = [int(starts[g] + np.argmin(done[starts[g]:starts[g + 1]]))
                 for g in np.flatnonzero(np.logical_and.reduceat(done, starts[:-1]) == 0)]
        i = stuck[0]
        waits = []
        sender = self.partner[i] if t.op[i] in (Op.RECV, Op.RECV_REDUCE) else -1
        if sender >= 0 and not done[sender]:
            waits.append(f"a message from rank {t.peer[i]}")
        waits += [f"step {t.position[d]} of channel {t.chan[d]}" if t.part[d] == t.part[i]
                  else f"buffer room toward rank {t.part[d]} (its step {t.position[d]} of "
                       f"channel {t.chan[d]} must receive first)"
                  for d in t.deps_of(i) if not done[d]]
        on = f" on {self.target.describe()}" if self.target and self.target.bounded else ""
        raise self.error(i, f"deadlock{on}: {len(stuck)} channel(s) never finish; this step "
                            f"waits for {' and '.join(waits) or 'an earlier step'}")

    def check_post(self) -> None:
        post = final_chunks(self.p.collective, self.p.nranks, self.p.chunk_factor, self.p.root)
        slots = self.slots(post, Buffer.OUTPUT)
        bad = np.flatnonzero((self.elem[slots] != post.element)
                             | (self.bits[slots] != self.bit_sets(post)).any(axis=1))
        if len(bad) == 0:
            return
        k = int(bad[0])
        s = int(slots[k])
        have = "no data" if self.elem[s] < 0 else self.element(self.elem[s], self.bits[s]) \
            .describe()
        want = self.element(post.element[k], self.bit_sets(post)[k]).describe()
        raise VerificationError(
            f"{self.p.name}: postcondition of {self.p.collective.value} fails: holds "
            f"{have}, expected {want}", rank=int(post.rank[k]), chunk=("output",
                                                                        int(post.index[k])))
