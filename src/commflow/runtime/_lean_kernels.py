"""Compiled kernels of the small-message path (:mod:`commflow.runtime.lean`).

They work on the host's shared-memory segment by address (Python ints: an address costs the
call less than an array argument) with the layout of
:class:`~commflow.runtime.transport.shm_host.ShmLayout` and the flag protocol of
:mod:`commflow.runtime.fastpath`. A rank's flag line holds its epoch (word 0), the sequence
number and digest of its last two epochs (words 2-3 for even epochs, 4-5 for odd ones) and
its current call (6: communicator and sequence number, ``transport.shm.call_word``; 7: its
digest; word 6 is cleared before 7 is written, a seqlock); a rank's doorbell
line holds "something changed" (int32 0) and "I sleep" (int32 1).

Flag words are read with acquire and written with release ordering (plain moves on x86, but
the compiler may not cache or reorder them), so a spin loop sees a peer's store and a peer
that sees the epoch sees the staged data written before it. Every wait here is bounded by a
spin count: the caller sleeps, checks deadlines, aborts and dead peers between calls.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

DONE = 0
"""Every peer posted the same operation (the reduction, if any, is done)."""
WAITING = 1
"""Some peer has not posted this epoch yet."""
MISMATCH = 2
"""``MISMATCH + r``: rank r posted another operation (sequence number or digest) here."""

SUM, PROD, MIN, MAX = 0, 1, 2, 3
"""Operator codes (``avg`` reduces as ``SUM``; bool ``sum``/``max`` as ``MAX``, ``prod``/``min``
as ``MIN``: logical or and and)."""

WINDOW = 2
"""Bit of a kernel's result: the call it logged closes a straggler window."""

_LINE = 64
_CLOCK_MONOTONIC = 1  # Linux
_LOG_HEAD, _LOG_ENTRY = 8, 3  # flight.LOG_HEAD, flight.LOG_ENTRY (no import: numba only here)


@intrinsic
def _pointer(typingctx, address):
    """The address as a ``void*`` (for ``carray``)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))
    return types.voidptr(types.intp), codegen


def _word_intrinsics(bits: int, numba_type):
    width = ir.IntType(bits)

    @intrinsic
    def load(typingctx, address):
        def codegen(context, builder, signature, args):
            ptr = builder.inttoptr(args[0], width.as_pointer())
            return builder.load_atomic(ptr, "acquire", bits // 8)
        return numba_type(types.intp), codegen

    @intrinsic
    def store(typingctx, address, value):
        def codegen(context, builder, signature, args):
            ptr = builder.inttoptr(args[0], width.as_pointer())
            val = context.cast(builder, args[1], signature.args[1], numba_type)
            builder.store_atomic(val, ptr, "release", bits // 8)
            return context.get_dummy_value()
        return types.void(types.intp, value), codegen

    return load, store


_load64, _store64 = _word_intrinsics(64, types.int64)
_load32, _store32 = _word_intrinsics(32, types.int32)


@intrinsic
def _fence(typingctx):
    """A full memory fence: our stores are visible before the loads that follow."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _sched_yield(typingctx):
    """libc's ``sched_yield()``: give the CPU to another runnable thread of this core."""
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                            "sched_yield")
        builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _clock_ns(typingctx):
    """libc's ``clock_gettime(CLOCK_MONOTONIC)`` in ns (the clock of ``time.monotonic``)."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        spec = builder.bitcast(cgutils.alloca_once(builder, ir.ArrayType(i64, 2)),
                               i64.as_pointer())
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), [ir.IntType(32), i64.as_pointer()]),
            "clock_gettime")
        builder.call(fn, [ir.Constant(ir.IntType(32), _CLOCK_MONOTONIC), spec])
        seconds = builder.load(spec)
        nanos = builder.load(builder.gep(spec, [ir.Constant(ir.IntType(32), 1)]))
        return builder.add(builder.mul(seconds, ir.Constant(i64, 1_000_000_000)), nanos)
    return types.int64(), codegen


@njit(cache=True)
def _log(ctx, seq):
    """Log call ``seq`` as completed now in the flight recorder's log (address at ``ctx +
    64``, 0 for none; kind at ``ctx + 72``; layout of ``FlightRecorder.log``). Returns
    ``WINDOW`` when ``seq`` closes the straggler window, else 0."""
    log = _load64(ctx + 64)
    if log == 0:
        return 0
    count = _load64(log)
    slot = log + (_LOG_HEAD + _LOG_ENTRY * (count % _load64(log + 16))) * 8
    _store64(slot, seq)
    _store64(slot + 8, _load64(ctx + 72))
    _store64(slot + 16, _clock_ns())
    _store64(log, count + 1)
    return WINDOW if seq >= _load64(log + 8) else 0


@njit(cache=True)
def _post(flags, bells, me, n, epoch, seq, digest, comm):
    """Post this rank's current call and raise its flag to ``epoch``; ring every peer's
    doorbell. Returns 1 when some peer sleeps (the caller wakes it), else 0."""
    mine = flags + me * _LINE
    _store64(mine + 48, 0)  # the posted call, as transport.shm.call_word writes it (a seqlock)
    _store64(mine + 56, digest)
    _store64(mine + 48, (comm & 0x7FFFFFFF) << 32 | (seq % 0xFFFFFFFF + 1))
    slot = mine + (2 + 2 * (epoch % 2)) * 8
    _store64(slot, seq)
    _store64(slot + 8, digest)
    _store64(mine, epoch)
    for r in range(n):
        if r != me:
            _store32(bells + r * _LINE, 1)
    _fence()
    for r in range(n):
        if r != me and _load32(bells + r * _LINE + 4) != 0:
            return 1
    return 0


@njit(cache=True)
def _arrived(flags, me, n, epoch, seq, digest, spin, yielding):
    """Spin at most ``spin`` rounds until every peer's flag reaches ``epoch`` (``yielding``:
    with ``sched_yield`` between rounds, for more ranks than CPUs); then compare their
    sequence numbers and digests. Returns DONE, WAITING or MISMATCH + rank."""
    slot = (2 + 2 * (epoch % 2)) * 8
    for _ in range(spin):
        ready = True
        for r in range(n):
            if r != me and _load64(flags + r * _LINE) < epoch:
                ready = False
                break
        if ready:
            for r in range(n):
                theirs = flags + r * _LINE + slot
                if r != me and (_load64(theirs) != seq or _load64(theirs + 8) != digest):
                    return MISMATCH + r
            return DONE
        if yielding:
            _sched_yield()
    return WAITING


def context(*, stages: tuple[int, int], stride: int, flags: int, bells: int, me: int, n: int,
            op: int, spin: int, poll_spin: int, digest: int, yielding: bool, log: int,
            kind: int) -> np.ndarray:
    """The constants of one kind of call, as the kernels read them from the array's address
    (one argument costs a call less than eight): the two staging halves of rank 0, the
    stride between ranks' stages, the flag and doorbell lines of rank 0, ``me, n, op, spin,
    yielding`` packed, the same with ``poll_spin``, the signature digest, the address of the
    flight recorder's log (0: none) and the call's kind there. Keep the array alive while
    its address is used."""
    def packed(rounds: int) -> int:
        return me | n << 16 | op << 32 | int(yielding) << 39 | rounds << 40

    return np.array([*stages, stride, flags, bells, packed(spin), packed(poll_spin), digest,
                     log, kind], np.int64)


@njit(cache=True, inline="always")
def _unpack(ctx):
    return ctx & 0xFFFF, ctx >> 16 & 0xFFFF, ctx >> 32 & 0x7F, ctx >> 40, ctx >> 39 & 1


@njit(cache=True)
def _reduce(recv, stage, stride, n, op):
    """``recv`` = the ranks' staged arrays reduced in rank order (the same on every rank)."""
    m = recv.size
    first = carray(_pointer(stage), (m,), recv.dtype)
    for i in range(m):
        recv[i] = first[i]
    for r in range(1, n):
        other = carray(_pointer(stage + r * stride), (m,), recv.dtype)
        if op == SUM:
            for i in range(m):
                recv[i] = recv[i] + other[i]
        elif op == PROD:
            for i in range(m):
                recv[i] = recv[i] * other[i]
        elif op == MIN:
            for i in range(m):
                a, b = recv[i], other[i]
                recv[i] = a if a < b or a != a else b  # numpy.minimum: NaN wins
        else:
            for i in range(m):
                a, b = recv[i], other[i]
                recv[i] = a if a > b or a != a else b


@njit(cache=True)
def allreduce(send, recv, ctx, half, epoch, seq):
    """Stage ``send`` in this rank's staging half ``half``, post, wait up to ``spin`` rounds,
    reduce into ``recv`` (constants at address ``ctx``, see :func:`context`) and log the call
    when it is done. Returns ``4 * status + window + wake`` (status DONE, WAITING or
    MISMATCH + rank; window: :data:`WINDOW` from the log; wake: 1 when a peer sleeps and must
    be woken), or -1 without doing anything when the sizes differ."""
    m = send.size
    if recv.size != m:
        return -1
    stage, stride, flags, bells = _load64(ctx + half * 8), _load64(ctx + 16), \
        _load64(ctx + 24), _load64(ctx + 32)
    me, n, op, spin, yielding = _unpack(_load64(ctx + 40))
    digest = _load64(ctx + 56)
    own = carray(_pointer(stage + me * stride), (m,), send.dtype)
    for i in range(m):
        own[i] = send[i]
    wake = _post(flags, bells, me, n, epoch, seq, digest, 0)
    status = _arrived(flags, me, n, epoch, seq, digest, spin, yielding)
    if status == DONE:
        _reduce(recv, stage, stride, n, op)
        return _log(ctx, seq) + wake
    return 4 * status + wake


@njit(cache=True)
def complete(recv, ctx, half, epoch, seq):
    """:func:`allreduce` after its post: wait up to ``poll_spin`` rounds more, then reduce;
    returns the status."""
    stage, stride, flags = _load64(ctx + half * 8), _load64(ctx + 16), _load64(ctx + 24)
    me, n, op, spin, yielding = _unpack(_load64(ctx + 48))
    status = _arrived(flags, me, n, epoch, seq, _load64(ctx + 56), spin, yielding)
    if status == DONE:
        _reduce(recv, stage, stride, n, op)
    return status


@njit(cache=True)
def barrier(ctx, epoch, seq):
    """Post, then wait up to ``spin`` rounds; log the call when it is done. Returns ``4 *
    status + window + wake`` as :func:`allreduce` does."""
    flags, bells, digest = _load64(ctx + 24), _load64(ctx + 32), _load64(ctx + 56)
    me, n, _, spin, yielding = _unpack(_load64(ctx + 40))
    wake = _post(flags, bells, me, n, epoch, seq, digest, 0)
    status = _arrived(flags, me, n, epoch, seq, digest, spin, yielding)
    if status == DONE:
        return _log(ctx, seq) + wake
    return 4 * status + wake


@njit(cache=True)
def arrived(ctx, epoch, seq):
    """:func:`barrier` after its post: wait up to ``poll_spin`` rounds more; returns the
    status."""
    me, n, _, spin, yielding = _unpack(_load64(ctx + 48))
    return _arrived(_load64(ctx + 24), me, n, epoch, seq, _load64(ctx + 56), spin, yielding)
