"""The small-message path: allreduce of at most :data:`~commflow.runtime.variants.ONE_SHOT`
bytes and barrier in one compiled call each.

The same exchange as :meth:`SharedBufferPaths.small_allreduce
<commflow.runtime.fastpath.SharedBufferPaths.small_allreduce>` (same staging halves, epochs,
flag words, sequence numbers and signatures, so ranks may mix the two), but the copy in,
the posting, the first wait, the reduction and the flight record run in one numba kernel
(:mod:`commflow.runtime._lean_kernels`), and the Python entry does only what the call needs:
a plan made on the first call per (dtype, op, size) and the sequence number. A call the
kernel finished is logged by the kernel in the recorder's
:attr:`~commflow.runtime.flight.FlightRecorder.log`; a call that has to wait is recorded as
started, then completed, from Python. Reductions run in
rank order from the staged copies, so every rank gets the same, numpy-exact result, whatever
``out`` overlaps.

Waiting: the kernel spins a bounded number of rounds (when the host has more ranks than
CPUs, a few polls with ``sched_yield`` between them, :data:`YIELDS` in all); then the rank
sleeps on its doorbell in slices, checking the deadline (``CommTimeoutError``),
aborts, dead peers and peers' current calls (``CommMismatchError``) as the other paths do.

Used for numpy arrays of the types numba compiles (not float16, bfloat16) on the world
communicator of one host, without ``async_op``; anything else takes the general path. The
kernels compile on first use (a few seconds, said on standard error) and are cached on disk.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.runtime import fastpath, programs, variants
from commflow.runtime.errors import CommMismatchError, CommTimeoutError
from commflow.runtime.ops import finish, reducer
from commflow.runtime.protocol import Signature
from commflow.runtime.transport.shm import ABORT_MISMATCH
from commflow.runtime.world import shared_cpus

COMPILING = "commflow: compiling the small-message kernels (first use, cached afterwards)..."
"""The line written on standard error before the kernels compile (once per process)."""
YIELDS = 128
"""``sched_yield`` calls, one between two polls of the peers' flags, before a waiting rank
sleeps on its doorbell when the host has more ranks than CPUs (the peer may be waiting for
this CPU, as Open MPI assumes when oversubscribed: it yields without end). The kernels yield
(compiled: a Python loop costs a few us a round) in polls of ``_POLL_YIELDS`` rounds, with the
deadline, abort and dead-peer checks between polls: a 4-rank allreduce of 8 B on 2 cores
takes 7-12 us (Open MPI 9-12 us; 39-42 us with 8 yields from Python). More lengthens the tail
on a loaded machine, where ``sched_yield`` hands the core to other jobs for whole time slices
(p99 4-8 ms with 1000). With a CPU per rank a waiting rank never yields (8 B
allreduce p99 12 ms with 64 yields on a loaded machine, 5 us without): a sleeper is woken by
the peer's doorbell at once."""
_SPIN, _SPIN_SHARED, _POLL_SPIN, _POLL_YIELDS = 1 << 14, 64, 32, 16
_OPS = {"sum": 0, "avg": 0, "prod": 1, "min": 2, "max": 3}
_BOOL_OPS = {"sum": 3, "max": 3, "prod": 2, "min": 2}
_BARRIER = Signature("collective", "barrier", "none", 0, "none", 0, variants.NAME)
_BARRIER_CALL = ("barrier", np.dtype(np.uint8), 0, None)
_ALLREDUCE = Collective.ALLREDUCE.value
_NAME = variants.NAME
_announced = False


def _kernels():
    """The kernel module (imports numba on first use)."""
    from commflow.runtime import _lean_kernels

    return _lean_kernels


def attach(comm, fast: fastpath.SharedBufferPaths | None) -> LeanPath | None:
    """The small-message path of ``comm`` over its fast path ``fast``, or ``None`` when it has
    none, when its staging halves are smaller than a one-shot allreduce, or when
    ``COMMFLOW_LEAN=0`` turns the path off."""
    if fast is None or os.environ.get("COMMFLOW_LEAN") == "0" \
            or comm.transport.host.layout.stage_bytes // 2 < variants.ONE_SHOT:
        return None
    return LeanPath(comm, fast)


class LeanPath:
    """The small-message entry of a :class:`~commflow.runtime.communicator.Communicator` whose
    shared-memory fast path is ``fast``."""

    def __init__(self, comm, fast: fastpath.SharedBufferPaths) -> None:
        host = comm.transport.host
        layout = host.layout
        base = host.region.address(0)
        stage = base + layout.stage_offset
        self._comm = comm
        self._fast = fast
        self._host = host
        self._me, self._n = fast.me, fast.n
        self._stage = (stage, stage + layout.stage_bytes // 2)
        self._stride = layout.stage_bytes
        self._flags = base + layout.flags_offset
        self._bells = host.bell_addr[0]
        shared = layout.nlocal > shared_cpus(host.attached.tolist())
        self._shared = shared
        self._spin = _SPIN_SHARED if shared else _SPIN
        self._polls = YIELDS // _POLL_YIELDS if shared else 0
        self._plans: dict[tuple, tuple | None] = {}
        self._decided: dict[tuple, tuple | None] = {}
        self._last: dict[str, tuple] = {}
        self._barrier_kernel = self._barrier_poll = self._barrier_constants = None
        self._barrier_ctx = 0

    # -- allreduce --------------------------------------------------------------------------
    def allreduce(self, x, op: str, out, timeout: float | None, algo: str = _NAME):
        """Run ``allreduce(x, op, out=out, algo=algo)`` (``shm`` or ``auto``) and return its
        result, or ``None`` when the call is not for this path (the caller then takes the
        general one, which also raises for bad arguments; ``auto`` where a loaded tuning
        table chooses otherwise). The kernel's own dispatch checks the arrays: it is
        compiled only for writable, C-contiguous 1-D arrays of one dtype."""
        try:
            dtype = x.dtype
            nbytes = x.nbytes
        except AttributeError:  # not an array: the general path says so
            return None
        last = self._last.get(algo)  # per algo: callers may alternate auto and shm
        if last is not None and last[0] is dtype and last[1] == nbytes and last[2] == op \
                and last[3] == programs.generation:
            plan = last[4]
        else:
            plan = self._lookup(dtype, op, nbytes, algo)
            if plan is None:
                return None
        if out is None:
            out = np.empty(x.shape, dtype)
        comm = self._comm
        if comm._broken is not None or comm._lanes is not None:
            return None
        run, complete, ctx, _, signature = plan
        fast = self._fast
        seq = comm._seq
        epoch = fast.epoch + 1
        segments = fast.segments
        half = segments & 1
        try:
            status = run(x, out, ctx, half, epoch, seq)
        except TypeError:  # not two matching 1-D arrays: reshape, or take the general path
            if x.ndim == 1 or x.shape != out.shape or not out.flags.c_contiguous \
                    or not x.flags.c_contiguous:
                return None
            done = self.allreduce(x.reshape(-1), op, out.reshape(-1), timeout, algo)
            return None if done is None else out
        if status < 0:  # sizes differ
            return None
        comm._seq = seq + 1
        fast.epoch = epoch
        fast.segments = segments + 1
        if status:
            self._settle(status, seq, epoch, signature, timeout,
                         lambda: complete(out, ctx, half, epoch, seq),
                         (_ALLREDUCE, dtype, nbytes, op))
        if op == "avg":
            finish(op, out, self._n)
        return out

    def _lookup(self, dtype, op: str, nbytes: int, algo: str) -> tuple | None:
        """The plan for ``(dtype, op, nbytes, algo)`` under the current tuning table (decided
        once per table), remembered as ``algo``'s last; ``None`` when ``auto`` runs something
        else."""
        key = (dtype, op, nbytes, algo, programs.generation)
        plan = self._decided.get(key, False)
        if plan is False:
            if len(self._decided) > 1024:
                self._decided.clear()
            plan = self._decided[key] = self._decide(dtype, op, nbytes, algo)
        if plan is not None:
            self._last[algo] = (dtype, nbytes, op, programs.generation, plan)
        return plan

    def _decide(self, dtype, op: str, nbytes: int, algo: str) -> tuple | None:
        """:meth:`_lookup` without its caches."""
        if algo != _NAME and programs.tuned() and not self._follows(nbytes):
            return None
        key = (dtype, op, nbytes)
        plan = self._plans.get(key, False)
        if plan is False:
            plan = self._plans[key] = self._plan(dtype, op, nbytes)
        return plan

    def _follows(self, nbytes: int) -> bool:
        """Whether ``auto`` runs an allreduce of ``nbytes`` as ``shm`` under the loaded
        tuning table in both placements (:func:`~commflow.runtime.programs.choices` remembers
        them; where they differ, the general path looks at the call's placement)."""
        names = set(programs.choices(Collective.ALLREDUCE, self._n, nbytes, fast_path=True))
        return all(variants.is_fast(name) and variants.effective(
            variants.variant(name), Collective.ALLREDUCE, nbytes, self._n) == variants.DEFAULT
            for name in names)

    def _plan(self, dtype: np.dtype, op: str, nbytes: int) -> tuple | None:
        """``(allreduce kernel, completion kernel, address of the constants, their array,
        signature)`` for a call, or ``None`` when it is not for this path (the general path
        raises for a bad op)."""
        if not (isinstance(dtype, np.dtype) and 0 < nbytes <= variants.ONE_SHOT and op in _OPS
                and _compiled(dtype)):
            return None
        try:
            reducer(op, dtype)
        except CommflowError:  # avg on integers or bool
            return None
        numba_type = _numba_type(dtype)
        kernel = _kernels()
        array = _array_type(numba_type)
        int64 = _int64()
        _compile(kernel.allreduce, (array, array, *[int64] * 4))
        _compile(kernel.complete, (array, *[int64] * 4))
        signature = self._comm._signature(Collective.ALLREDUCE, dtype, nbytes, op, 0,
                                          variants.NAME)
        constants = self._context(kernel, (_BOOL_OPS if dtype == np.bool_ else _OPS)[op],
                                  signature, (_ALLREDUCE, dtype, nbytes, op))
        return (kernel.allreduce, kernel.complete, constants.ctypes.data, constants,
                signature)

    def _context(self, kernel, op: int, signature: Signature, call: tuple) -> np.ndarray:
        """The kernels' constants for calls with operator code ``op`` and ``signature``, logged
        in the flight recorder as ``call`` (operation, dtype, bytes, reduction)."""
        poll = _POLL_YIELDS if self._shared else _POLL_SPIN
        fr = self._comm._flight
        log, kind = (0, 0) if fr is None else (fr.log.ctypes.data, fr.kind(*call, _NAME))
        return kernel.context(stages=self._stage, stride=self._stride, flags=self._flags,
                              bells=self._bells, me=self._me, n=self._n, op=op,
                              spin=self._spin, poll_spin=poll,
                              digest=signature.digest & 0x7FFF_FFFF_FFFF_FFFF,
                              yielding=self._shared, log=log, kind=kind)

    # -- barrier ------------------------------------------------------------------------------
    def barrier(self, timeout: float | None) -> bool:
        """Run a barrier; ``False`` when the communicator must take the general path."""
        comm = self._comm
        if comm._broken is not None or comm._lanes is not None:
            return False
        kernel = self._barrier_kernel
        if kernel is None:
            kernels = _kernels()
            _compile(kernels.barrier, (_int64(),) * 3)
            _compile(kernels.arrived, (_int64(),) * 3)
            self._barrier_constants = self._context(kernels, 0, _BARRIER, _BARRIER_CALL)
            self._barrier_ctx = self._barrier_constants.ctypes.data
            self._barrier_poll = kernels.arrived
            kernel = self._barrier_kernel = kernels.barrier
        seq = comm._seq
        comm._seq = seq + 1
        fast = self._fast
        fast.epoch = epoch = fast.epoch + 1
        ctx = self._barrier_ctx
        status = kernel(ctx, epoch, seq)
        if status:
            self._settle(status, seq, epoch, _BARRIER, timeout,
                         lambda: self._barrier_poll(ctx, epoch, seq), _BARRIER_CALL)
        return True

    # -- waiting ------------------------------------------------------------------------------
    def _settle(self, status: int, seq: int, epoch: int, signature: Signature,
                timeout: float | None, poll, call: tuple) -> None:
        """After a kernel returned ``4 * status + window + wake`` (not 0): close the flight
        recorder's straggler window, wake sleeping peers; a call not done yet is recorded as
        ``call`` (operation, dtype, bytes, reduction) and waited for as
        :mod:`commflow.runtime.fastpath` does (``poll()`` polls briefly, returns the
        status)."""
        comm, host = self._comm, self._host
        fr = comm._flight
        if status & _WINDOW:
            fr.close_window()
        if status & 1:
            for r in range(self._n):
                if r != self._me:
                    host.ring(r)
        status >>= 2
        if status:
            op, dtype, nbytes, reduce = call
            entry = None if fr is None else fr.record(
                seq, op, dtype, nbytes, reduce=reduce, root=None, peer=None, algo=_NAME,
                started=True)
            comm._guarded(lambda: self._wait(status, seq, epoch, signature, timeout, poll))
            if entry is not None:
                fr.complete(entry)

    def _wait(self, status: int, seq: int, epoch: int, signature: Signature,
              timeout: float | None, poll) -> None:
        comm, host, me = self._comm, self._host, self._me
        deadline = time.monotonic() + (comm.timeout if timeout is None else timeout)
        endpoint = comm.transport.endpoint(seq, signature, np.dtype(np.uint8), comm.ranks,
                                           comm.comm_id)
        bell = host.bells[me]
        rounds = 0
        while status == _WAITING:
            rounds += 1
            if host.aborted():
                endpoint.raise_abort()
            if time.monotonic() > deadline:
                pending = [r for r in range(self._n)
                           if r != me and host.flags[r][0] < epoch]
                raise CommTimeoutError(
                    f"{signature.collective} #{seq} (shm) on rank {me}: timed out waiting "
                    f"for ranks {pending}", op=signature.collective, seq=seq,
                    peers=tuple(pending))
            if rounds > self._polls:  # before: poll() alone, yielding between its rounds
                if bell[0]:
                    bell[0] = 0
                else:
                    if rounds % 16 == 0:
                        endpoint.check_peers_alive()
                        endpoint.check_peers_calls()
                    host.sleep(lambda: bool(bell[0]), max(0.0, deadline - time.monotonic()))
            status = poll()
        if status != _DONE:
            rank = status - _MISMATCH
            host.abort(ABORT_MISMATCH, host.me, seq)
            raise CommMismatchError(
                f"{signature.collective} #{seq} on rank {me}: rank {rank} called another "
                f"operation in this slot ({signature.describe()} here): every rank must call "
                f"the same collectives in the same order")


# The kernels' statuses and window bit, kept here: importing the kernel module imports numba.
_DONE, _WAITING, _MISMATCH, _WINDOW = 0, 1, 2, 2


def _compiled(dtype: np.dtype) -> bool:
    """Whether the kernels cover ``dtype``: native-order bool, integers, float32/64 (numba
    has no float16 arithmetic on CPU, nor bfloat16)."""
    return dtype.isnative and (dtype.kind in "biu" or dtype.kind == "f" and dtype.itemsize >= 4)


def _numba_type(dtype: np.dtype):
    from numba import from_dtype

    return from_dtype(dtype)


def _array_type(numba_type):
    from numba import types

    return types.Array(numba_type, 1, "C")


def _int64():
    from numba import types

    return types.int64


def _compile(dispatcher, signature: tuple) -> None:
    """Compile (or load from numba's cache) ``dispatcher`` for ``signature``, first writing
    :data:`COMPILING` on standard error when it really compiles (once per process). Calls
    never compile: arguments of other types raise ``TypeError`` (the caller's type check)."""
    from numba.core import event

    class Announce(event.Listener):
        def on_start(self, ev) -> None:
            global _announced
            if not _announced:
                _announced = True
                print(COMPILING, file=sys.stderr, flush=True)

        def on_end(self, ev) -> None:
            pass

    dispatcher.disable_compile(False)
    try:
        with event.install_listener("numba:compile", Announce()):
            dispatcher.compile(signature)
    finally:
        dispatcher.disable_compile(True)
