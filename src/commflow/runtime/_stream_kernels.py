"""A compiled copy with non-temporal ("streaming") stores, for the fast path's copies out
of its staging areas into large output buffers (:mod:`commflow.runtime.fastpath`, variant
``store="stream"``).

A plain store first reads the destination's cache line (read for ownership), so copying
``n`` bytes into memory that is not cached moves ``3n`` bytes over the memory bus; a
non-temporal store writes the line without reading it (``2n``) and leaves the caches to
the staging areas, which the next segment reuses. glibc's ``memcpy`` switches to such
stores only for copies larger than about three quarters of the last-level cache, far
above a staging segment. The stores are weakly ordered: the kernel ends with ``sfence``,
so every byte is visible before the caller raises a flag. x86-64 only (:data:`AVAILABLE`).
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
"""Bytes per store (an AVX ``vmovntdq``; its destination must be aligned to this)."""


@intrinsic
def _pointer(typingctx, address):
    """The address as a ``void*`` (for ``carray``)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))
    return types.voidptr(types.intp), codegen


@intrinsic
def _stream_aligned(typingctx, dst, src, nbytes):
    """Copy ``nbytes`` (a multiple of :data:`_VECTOR`) from ``src`` to ``dst`` (aligned to
    :data:`_VECTOR`) with non-temporal stores, then ``sfence``."""
    def codegen(context, builder, signature, args):
        d, s, n = args
        i64 = ir.IntType(64)
        vector = ir.VectorType(i64, _VECTOR // 8).as_pointer()
        hint = builder.module.add_metadata([ir.IntType(32)(1)])
        with cgutils.for_range_slice(builder, i64(0), n, i64(_VECTOR), inc=True) as (at, _):
            value = builder.load(builder.inttoptr(builder.add(s, at), vector), align=1)
            store = builder.store(value, builder.inttoptr(builder.add(d, at), vector),
                                  align=_VECTOR)
            store.set_metadata("nontemporal", hint)
        fence = cgutils.get_or_insert_function(builder.module,
                                               ir.FunctionType(ir.VoidType(), []),
                                               "llvm.x86.sse.sfence")
        builder.call(fence, [])
        return context.get_dummy_value()
    return types.void(types.intp, types.intp, types.intp), codegen


@njit(cache=True, nogil=True)
def _stream(dst, src, nbytes):
    head = min((-dst) % _VECTOR, nbytes)
    body = (nbytes - head) // _VECTOR * _VECTOR
    out = carray(_pointer(dst), nbytes, np.uint8)
    into = carray(_pointer(src), nbytes, np.uint8)
    out[:head] = into[:head]
    _stream_aligned(dst + head, src + head, body)
    out[head + body:] = into[head + body:]


def stream_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for two contiguous arrays of the same dtype and size that do not
    overlap, with non-temporal stores (a plain copy where they are not
    :data:`AVAILABLE` or an array is not contiguous)."""
    if (not AVAILABLE or dst.dtype != src.dtype or dst.shape != src.shape
            or not dst.flags.c_contiguous or not src.flags.c_contiguous):
        dst[...] = src
        return
    _stream(dst.ctypes.data, src.ctypes.data, dst.nbytes)
