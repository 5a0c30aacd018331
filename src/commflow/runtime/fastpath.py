"""Shared-buffer fast paths for the ranks of one host (``algo="shm"``).

Each rank copies its data into its own staging area in the host's segment and raises a flag;
once every rank's flag is up, rank r reduces block r of every rank's stage in place (own data
first, then the others by rank, so every element is reduced once, in a fixed order) and raises
a second flag; then every rank copies the reduced blocks out (small allreduces, and by
default any allreduce on two ranks, which then wait once per segment: every rank reduces
everything after the first flag, in rank order, so both ranks agree to the bit)
(reduce-scatter: rank r reduces straight into its output; allgather/broadcast: one flag,
then copies out). That is the two-shot reduce-scatter + allgather of the ``direct``
family, with the messages replaced by loads from shared memory: per byte, one copy in, one
read of every stage for the reduction and one copy out. Staging areas are double-buffered: a
half is refilled only after every rank raised a flag for the following segment, i.e.
finished reading the half. Flags carry the operation's sequence number and signature: ranks
that called different operations abort with ``CommMismatchError``.

Applies to the world communicator when all its ranks share one host. In-place calls need no
copy of the input: a segment is staged before any of its output is written, and a rank writes
only the part of its output that the staged segment covers. A rank stages only what its peers
read: a reduce-scatter, and a two-shot allreduce, reduce its own block from its input (in
place: where it lies), an allgather in place leaves its own block where it is.

How a call is cut (segments, one-shot threshold, polling, staging or single-copy reads,
stores) is a :class:`~commflow.runtime.variants.Variant`, named ``shm`` or
``shm:FIELD=SIZE:...`` (:mod:`commflow.runtime.variants`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np

from commflow.collectives import Collective
from commflow.runtime.cma import CrossMemoryPaths
from commflow.runtime.errors import CommMismatchError, CommTimeoutError
from commflow.runtime.fastpath_output import PLAIN, Output
from commflow.runtime.ops import Reducer
from commflow.runtime.protocol import Signature
from commflow.runtime.transport.shm import ABORT_MISMATCH, ShmEndpoint
from commflow.runtime.variants import CMA, DEFAULT, SPIN, STREAM, Variant


def _reduce_into(out: np.ndarray, first: np.ndarray, stages: list[np.ndarray],
                 ranks: Iterable[int], where: slice, reduce: Reducer,
                 writer: Output = PLAIN) -> None:
    """``out`` = ``first`` reduced with ``stages[r][where]`` for ``r`` in ``ranks``, in that
    order (``first`` may be ``out``'s own memory); partial results go to
    ``writer.target(out)``, the last reduction into ``out`` through ``writer``."""
    ranks = list(ranks)
    if not ranks:  # no peer: one rank
        if first is not out:
            writer.copy(out, first)
        return
    partial = writer.target(out)
    for r in ranks[:-1]:
        reduce(first, stages[r][where], partial)
        first = partial
    writer.reduce(reduce, first, stages[ranks[-1]][where], out)


class SharedBufferPaths:
    """The fast paths of one rank over its host's staging areas."""

    def __init__(self, endpoint_factory: Callable[[int, Signature, np.dtype], ShmEndpoint],
                 nranks: int, rank: int) -> None:
        self.endpoint_factory = endpoint_factory
        self.n = nranks
        self.me = rank
        self.epoch = 0
        self.segments = 0
        self._views: dict[tuple[int, str], list[np.ndarray]] = {}
        self._scratch: dict[str, np.ndarray] = {}
        self.cma = CrossMemoryPaths(nranks, rank, self.phase)

    def run(self, collective: Collective, send: np.ndarray, recv: np.ndarray, unit: int,
            reduce: Reducer, root: int, *, seq: int, signature: Signature,
            deadline: float, options: Variant = DEFAULT, placed: bool = False) -> None:
        """Run ``collective`` on flat arrays (shapes as the communicator passes them), cut as
        ``options`` says. ``placed``: an in-place call (``calls.in_place``): an allgather's
        input is already its block of the output, a reduce-scatter's output its block of
        the input, so neither is copied there."""
        endpoint = self.endpoint_factory(seq, signature, send.dtype)
        host = endpoint.t.host
        half_bytes = host.layout.stage_bytes // 2
        one_shot = min(options.limit, half_bytes)
        if collective is Collective.ALLREDUCE and 0 < unit * send.dtype.itemsize <= one_shot:
            self.small_allreduce(send, recv, reduce, seq, signature, deadline, endpoint,
                                 options.spin)
            return
        if options.copy == CMA:
            self.cma.run(endpoint, collective, send, recv, unit, reduce, root, seq=seq,
                         signature=signature, deadline=deadline, segment=options.segment,
                         spin=options.spin)
            return
        n, me = self.n, self.me
        others = [r for r in range(n) if r != me]
        per_stage = n if collective is Collective.REDUCESCATTER else 1
        seg = max(1, min(half_bytes, options.segment) // send.dtype.itemsize // per_stage)
        wait = lambda: self.phase(endpoint, seq, signature, deadline, options.spin)  # noqa: E731
        out = self._output(options.store, send.dtype, half_bytes)
        for lo in range(0, max(unit, 1), seg):
            hi = min(unit, lo + seg)
            m = hi - lo
            half = self.segments % 2
            self.segments += 1
            stages = self._stages(host, half, half_bytes, send.dtype)
            mine = stages[me]
            if collective is Collective.ALLREDUCE and n == 2 and (
                    options.one_shot is None or m * send.dtype.itemsize <= one_shot):
                mine[:m] = send[lo:hi]
                wait()
                out.reduce(reduce, stages[0][:m], stages[1][:m], recv[lo:hi])  # in rank order
            elif collective is Collective.ALLREDUCE and m * send.dtype.itemsize <= one_shot:
                mine[:m] = send[lo:hi]
                wait()
                _reduce_into(recv[lo:hi], stages[0][:m], stages, range(1, n), slice(0, m),
                             reduce, out)
            elif collective is Collective.ALLREDUCE:
                bounds = [m * r // n for r in range(n + 1)]
                first, last = bounds[me], bounds[me + 1]
                mine[:first] = send[lo:lo + first]  # the blocks the peers reduce
                mine[last:m] = send[lo + last:hi]
                wait()
                # own block from the input, into the stage for the peers to copy out
                _reduce_into(mine[first:last], send[lo + first:lo + last], stages, others,
                             slice(first, last), reduce)
                wait()
                for r in range(n):
                    a, b = bounds[r], bounds[r + 1]
                    out.copy(recv[lo + a:lo + b], stages[r][a:b])
            elif collective is Collective.REDUCESCATTER:
                for r in others:  # only the peers read a stage's blocks
                    mine[r * m:(r + 1) * m] = send[r * unit + lo:r * unit + hi]
                wait()
                s = slice(me * m, (me + 1) * m)
                dst = recv[lo:hi]
                own = dst if placed else send[me * unit + lo:me * unit + hi]
                _reduce_into(dst, own, stages, others, s, reduce, out)
            elif collective is Collective.ALLGATHER:
                mine[:m] = send[lo:hi]
                wait()
                for r in others if placed else range(n):
                    out.copy(recv[r * unit + lo:r * unit + hi], stages[r][:m])
            else:
                if me == root:
                    mine[:m] = send[lo:hi]
                wait()
                if me != root:
                    out.copy(recv[lo:hi], stages[root][:m])

    def small_allreduce(self, send: np.ndarray, recv: np.ndarray, reduce: Reducer, seq: int,
                        signature: Signature, deadline: float,
                        endpoint: ShmEndpoint | None = None, spin: int = SPIN) -> None:
        """One-shot allreduce of ``send`` (flat, at most half a staging area) into
        ``recv``, reduced from the staged copies in rank order, as the compiled path
        (:mod:`commflow.runtime.lean`) does: every rank gets the same bits whichever path it
        takes (``minimum(0.0, -0.0)`` is not ``minimum(-0.0, 0.0)``)."""
        unit = len(send)
        if endpoint is None:
            endpoint = self.endpoint_factory(seq, signature, send.dtype)
        host = endpoint.t.host
        stages = self._stages(host, self.segments & 1, host.layout.stage_bytes // 2, send.dtype)
        self.segments += 1
        stages[self.me][:unit] = send
        self.phase(endpoint, seq, signature, deadline, spin)
        if self.n == 1:
            recv[...] = stages[0][:unit]
            return
        reduce(stages[0][:unit], stages[1][:unit], recv)
        for r in range(2, self.n):
            reduce(recv, stages[r][:unit], recv)

    def _output(self, store: str, dtype: np.dtype, nbytes: int) -> Output:
        """The writer of a call's output for ``store``, with a scratch segment of ``nbytes``
        (cached per dtype) for streaming."""
        if store != STREAM:
            return PLAIN
        scratch = self._scratch.get(dtype.str)
        if scratch is None or scratch.nbytes < nbytes:
            scratch = self._scratch[dtype.str] = np.empty(nbytes // dtype.itemsize, dtype)
        return Output(scratch)

    def _stages(self, host, half: int, half_bytes: int, dtype: np.dtype) -> list[np.ndarray]:
        """Every rank's staging half ``half`` viewed as ``dtype`` (cached)."""
        key = (half, dtype.str)
        views = self._views.get(key)
        if views is None:
            views = [host.stage[r][half * half_bytes:(half + 1) * half_bytes].view(dtype)
                     for r in range(self.n)]
            self._views[key] = views
        return views

    def phase(self, endpoint: ShmEndpoint, seq: int, signature: Signature,
              deadline: float, spin: int = SPIN) -> None:
        """Raise this rank's flag to the next epoch and wait for every rank's (polling
        ``spin`` times before yielding the CPU)."""
        host = endpoint.t.host
        self.epoch += 1
        digest = signature.digest & 0x7FFF_FFFF_FFFF_FFFF
        slot = 2 + 2 * (self.epoch % 2)  # a rank is at most one epoch ahead of any other
        flags = host.flags[self.me]
        flags[slot], flags[slot + 1] = seq, digest
        flags[0] = self.epoch
        for r in range(self.n):
            if r != self.me:
                host.ring(r)
        rounds = 0
        pending = [r for r in range(self.n) if r != self.me]
        while pending:
            still = []
            for r in pending:
                theirs = host.flags[r]
                if theirs[0] < self.epoch:
                    still.append(r)
                elif theirs[slot] != seq or theirs[slot + 1] != digest:
                    host.abort(ABORT_MISMATCH, host.me, seq)
                    raise CommMismatchError(
                        f"{signature.collective} #{seq} on rank {self.me}: rank {r} called "
                        f"another operation in this slot ({signature.describe()} here): every "
                        f"rank must call the same collectives in the same order")
            pending = still
            if pending:
                rounds += 1
                if time.monotonic() > deadline:
                    raise CommTimeoutError(
                        f"{signature.collective} #{seq} (shm) on rank {self.me}: timed out "
                        f"waiting for ranks {pending}", op=signature.collective, seq=seq,
                        peers=tuple(pending))
                endpoint.idle(rounds, deadline, spin)
