"""A compiled copy and sum with non-temporal ("streaming") stores, for the fast path's
copies and reductions out of its staging areas into large output buffers
(:mod:`commflow.runtime.fastpath`, variant ``store="stream"``).

A plain store first reads the destination's cache line (read for ownership), so copying
``n`` bytes into memory that is not cached moves ``3n`` bytes over the memory bus; a
non-temporal store writes the line without reading it (``2n``) and leaves the caches to
the staging areas, which the next segment reuses. glibc's ``memcpy`` switches to such
stores only for copies larger than about three quarters of the last-level cache, far
above a staging segment. The stores are weakly ordered: the kernels end with ``sfence``,
so every byte is visible before the caller raises a flag. A sum adds lane by lane, the same
IEEE additions as ``numpy.add``, so the bits are numpy's. x86-64 only (:data:`AVAILABLE`).
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

AVAILABLE = platform.machine().lower() in ("x86_64", "amd64")
"""Whether this machine has the non-temporal vector stores and ``sfence`` the kernel uses."""

_VECTOR = 32
"""Bytes per store (32-byte AVX non-temporal stores, ``vmovntps`` as LLVM emits them on this
machine; their destination must be aligned to this)."""


@intrinsic
def _pointer(typingctx, address):
    """The address as a ``void*`` (for ``carray``)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))
    return types.voidptr(types.intp), codegen


def _emit(context, builder, args, vector: ir.VectorType, add: bool):
    """Stores at ``args[0]`` of ``args[3]`` bytes: ``args[1]`` copied or, ``add``, the
    element-wise sum of ``args[1]`` and ``args[2]`` (lane by lane: the same IEEE additions as
    ``numpy.add``), non-temporal, then ``sfence``."""
    d, x, y, n = args[:4]
    i64 = ir.IntType(64)
    pointer = vector.as_pointer()
    hint = builder.module.add_metadata([ir.IntType(32)(1)])
    with cgutils.for_range_slice(builder, i64(0), n, i64(_VECTOR), inc=True) as (at, _):
        value = builder.load(builder.inttoptr(builder.add(x, at), pointer), align=1)
        if add:
            other = builder.load(builder.inttoptr(builder.add(y, at), pointer), align=1)
            floating = isinstance(vector.element, (ir.FloatType, ir.DoubleType))
            value = builder.fadd(value, other) if floating else builder.add(value, other)
        store = builder.store(value, builder.inttoptr(builder.add(d, at), pointer),
                              align=_VECTOR)
        store.set_metadata("nontemporal", hint)
    fence = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                           "llvm.x86.sse.sfence")
    builder.call(fence, [])
    return context.get_dummy_value()


@intrinsic
def _copy_aligned(typingctx, dst, src, nbytes):
    """Copy ``nbytes`` (a multiple of :data:`_VECTOR`) from ``src`` to ``dst`` (aligned to
    :data:`_VECTOR`) with non-temporal stores."""
    def codegen(context, builder, signature, args):
        vector = ir.VectorType(ir.IntType(64), _VECTOR // 8)
        return _emit(context, builder, [args[0], args[1], None, args[2]], vector, add=False)
    return types.void(types.intp, types.intp, types.intp), codegen


@intrinsic
def _add_aligned(typingctx, dst, a, b, nbytes, sample):
    """``dst = a + b`` over ``nbytes`` (a multiple of :data:`_VECTOR`; ``dst`` aligned to
    it) with non-temporal stores, for elements of ``sample``'s type."""
    def codegen(context, builder, signature, args):
        element = context.get_value_type(signature.args[4])
        vector = ir.VectorType(element, _VECTOR // context.get_abi_sizeof(element))
        return _emit(context, builder, args, vector, add=True)
    return types.void(types.intp, types.intp, types.intp, types.intp, sample), codegen


@njit(cache=True, nogil=True)
def _stream(dst, src, nbytes):
    head = min((-dst) % _VECTOR, nbytes)
    body = (nbytes - head) // _VECTOR * _VECTOR
    out = carray(_pointer(dst), nbytes, np.uint8)
    into = carray(_pointer(src), nbytes, np.uint8)
    out[:head] = into[:head]
    _copy_aligned(dst + head, src + head, body)
    out[head + body:] = into[head + body:]


@njit(cache=True, nogil=True)
def _stream_add(out, x, y):
    count = len(out)
    if count == 0:
        return
    size = out.itemsize
    dst = out.ctypes.data
    head = min((-dst) % _VECTOR // size, count)
    body = (count - head) * size // _VECTOR * _VECTOR // size
    out[:head] = x[:head] + y[:head]
    _add_aligned(dst + head * size, x.ctypes.data + head * size, y.ctypes.data + head * size,
                 body * size, x[0])
    out[head + body:] = x[head + body:] + y[head + body:]


ADDS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64))
"""Element types :func:`stream_add` sums itself (others: ``numpy.add``, then a streamed
copy)."""


def stream_add(out: np.ndarray, x: np.ndarray, y: np.ndarray) -> bool:
    """``out = x + y`` with non-temporal stores for three contiguous arrays of the same shape
    and a dtype of :data:`ADDS`, where ``out`` overlaps neither input; returns False (and
    does nothing) where it cannot."""
    if not (AVAILABLE and out.dtype in ADDS and x.dtype == y.dtype == out.dtype
            and x.shape == y.shape == out.shape and out.flags.c_contiguous
            and x.flags.c_contiguous and y.flags.c_contiguous
            and not np.may_share_memory(out, x) and not np.may_share_memory(out, y)):
        return False
    _stream_add(out, x, y)
    return True


def stream_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` with non-temporal stores for two contiguous arrays of the same
    dtype and shape that do not overlap; a plain copy (numpy's) otherwise, or where streaming
    is not :data:`AVAILABLE`."""
    if (not AVAILABLE or dst.dtype != src.dtype or dst.shape != src.shape
            or not dst.flags.c_contiguous or not src.flags.c_contiguous
            or np.may_share_memory(dst, src)):
        dst[...] = src
        return
    _stream(dst.ctypes.data, src.ctypes.data, dst.nbytes)
