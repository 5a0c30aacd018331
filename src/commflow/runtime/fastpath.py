"""Shared-buffer fast paths for the ranks of one host (``algo="shm"``).

Each rank copies its data into its own staging area in the host's segment and raises a flag;
once every rank's flag is up, rank r reduces block r of every rank's stage in place (own data
first, then the others by rank, so every element is reduced once, in a fixed order) and raises
a second flag; then every rank copies the reduced blocks out (small allreduces, and any
allreduce on two ranks where it moves fewer bytes: every rank reduces everything after the
first flag, in rank order, so both ranks agree to the bit) (reduce-scatter: rank r reduces
straight into its output; allgather/broadcast: one flag, then copies out). That is the two-shot
reduce-scatter + allgather of the ``direct`` family, with the messages replaced by loads from
shared memory: per byte, one copy in, one read of every stage for the reduction and one copy
out. Staging areas are double-buffered: a half is refilled only after every rank raised a flag
for the following segment, i.e. finished reading the half. Flags carry the operation's
sequence number and signature: ranks that called different operations abort with
``CommMismatchError``.

Applies to the world communicator when all its ranks share one host. In-place calls need no
copy of the input: a segment is staged before any of its output is written, and a rank writes
only the part of its output that the staged segment covers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from commflow.collectives import Collective
from commflow.runtime.errors import CommMismatchError, CommTimeoutError
from commflow.runtime.ops import Reducer
from commflow.runtime.protocol import Signature
from commflow.runtime.transport.shm import ABORT_MISMATCH, ShmEndpoint

NAME = "shm"
SEGMENT = int(os.environ.get("COMMFLOW_SHM_SEGMENT", 512 << 10))
"""Bytes staged per round: small enough that a segment is still in the caches when the peers
read it (larger messages go through in several rounds)."""
ONE_SHOT = 64 << 10
"""Allreduce segments up to this many bytes are reduced whole by every rank (one flag, no
second pass), in rank order so every rank computes the same result."""
COLLECTIVES = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER,
               Collective.BROADCAST)
SUMMARY = ("shared staging buffers: copy in, reduce block r on rank r, copy out "
           "(two-shot RS+AG through memory); one host, world communicator")


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

    def run(self, collective: Collective, send: np.ndarray, recv: np.ndarray, unit: int,
            reduce: Reducer, root: int, *, seq: int, signature: Signature,
            deadline: float) -> None:
        """Run ``collective`` on flat arrays (shapes as the communicator passes them)."""
        if collective is Collective.ALLREDUCE and 0 < unit * send.dtype.itemsize <= ONE_SHOT:
            self.small_allreduce(send, recv, reduce, seq, signature, deadline)
            return
        endpoint = self.endpoint_factory(seq, signature, send.dtype)
        host = endpoint.t.host
        half_bytes = host.layout.stage_bytes // 2
        n, me = self.n, self.me
        others = [r for r in range(n) if r != me]
        per_stage = n if collective is Collective.REDUCESCATTER else 1
        seg = max(1, min(half_bytes, SEGMENT) // send.dtype.itemsize // per_stage)
        wait = lambda: self.phase(endpoint, seq, signature, deadline)  # noqa: E731
        for lo in range(0, max(unit, 1), seg):
            hi = min(unit, lo + seg)
            m = hi - lo
            half = self.segments % 2
            self.segments += 1
            stages = self._stages(host, half, half_bytes, send.dtype)
            mine = stages[me]
            if collective is Collective.ALLREDUCE and n == 2:
                mine[:m] = send[lo:hi]
                wait()
                reduce(stages[0][:m], stages[1][:m], recv[lo:hi])  # in rank order
            elif collective is Collective.ALLREDUCE and m * send.dtype.itemsize <= ONE_SHOT:
                mine[:m] = send[lo:hi]
                wait()
                out = recv[lo:hi]
                out[...] = stages[0][:m]
                for r in range(1, n):
                    reduce(out, stages[r][:m], out)
            elif collective is Collective.ALLREDUCE:
                mine[:m] = send[lo:hi]
                wait()
                bounds = [m * r // n for r in range(n + 1)]
                s = slice(bounds[me], bounds[me + 1])
                for r in others:
                    reduce(mine[s], stages[r][s], mine[s])
                wait()
                for r in range(n):
                    a, b = bounds[r], bounds[r + 1]
                    recv[lo + a:lo + b] = stages[r][a:b]
            elif collective is Collective.REDUCESCATTER:
                for r in range(n):
                    mine[r * m:(r + 1) * m] = send[r * unit + lo:r * unit + hi]
                wait()
                s = slice(me * m, (me + 1) * m)
                out = recv[lo:hi]
                out[...] = mine[s]
                for r in others:
                    reduce(out, stages[r][s], out)
            elif collective is Collective.ALLGATHER:
                mine[:m] = send[lo:hi]
                wait()
                for r in range(n):
                    recv[r * unit + lo:r * unit + hi] = stages[r][:m]
            else:
                if me == root:
                    mine[:m] = send[lo:hi]
                wait()
                if me != root:
                    recv[lo:hi] = stages[root][:m]

    def small_allreduce(self, send: np.ndarray, recv: np.ndarray, reduce: Reducer, seq: int,
                        signature: Signature, deadline: float) -> None:
        """One-shot allreduce of ``send`` (flat, at most :data:`ONE_SHOT` bytes) into
        ``recv``, reduced from the staged copies in rank order, as the compiled path
        (:mod:`commflow.runtime.lean`) does: every rank gets the same bits whichever path it
        takes (``minimum(0.0, -0.0)`` is not ``minimum(-0.0, 0.0)``)."""
        unit = len(send)
        endpoint = self.endpoint_factory(seq, signature, send.dtype)
        host = endpoint.t.host
        stages = self._stages(host, self.segments & 1, host.layout.stage_bytes // 2, send.dtype)
        self.segments += 1
        stages[self.me][:unit] = send
        self.phase(endpoint, seq, signature, deadline)
        if self.n == 1:
            recv[...] = stages[0][:unit]
            return
        reduce(stages[0][:unit], stages[1][:unit], recv)
        for r in range(2, self.n):
            reduce(recv, stages[r][:unit], recv)

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
               deadline: float) -> None:
        """Raise this rank's flag to the next epoch and wait for every rank's."""
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
                endpoint.idle(rounds, deadline)
