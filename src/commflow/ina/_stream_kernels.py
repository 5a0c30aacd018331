"""Compiled (numba) inner loop of a worker's data stream: each block's exponent, computed when
its packet is built (no pass over the whole array before the stream starts), and the handling
of a batch of RESULT datagrams (validate, decode into the output, build the slot's next DATA
packet) without a per-packet Python object. :mod:`commflow.ina._stream` drives it; the wire
format is :data:`commflow.ina.protocol.HEADER` (network byte order, 34 bytes).

A block holding inf or nan has the exponent :data:`NONFINITE`, the largest ``i16``: the
switch's maximum over the workers carries it to every worker, which sends zeros for that block
and reports it (every rank raises, none waits for a timeout).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from commflow.ina._kernels import EMPTY, HDR, _copy, _put16, _swap, _u16, _u32
from commflow.ina.protocol import VERSION

NONFINITE = 2**15 - 1
"""The exponent of a block holding inf or nan."""

# ``ident``: what the stream's datagrams must carry
JOB, SESSION, WORKER, NRANKS, SHIFT, VALUES, SLOTS, NBLOCKS = range(8)
# per datagram (``code``): what the caller must do
NONE, SEND, DONE, OTHER, BAD_BLOCK = range(5)
# ``counters``
RESULTS, GROUP_RESULTS, DUPLICATES, MALFORMED, FIRST_NONFINITE = range(5)
_GROUP = 0xFFFF
_ROUND = 1.5 * 2.0**52


def float_bits(x: np.ndarray) -> tuple[np.ndarray, int, int, int]:
    """The finite-or-not float32/float64 ``x`` read as integers of its width, with its
    mantissa bits, exponent bias and the mask of all bits but the sign."""
    if x.dtype == np.float32:
        return x.view(np.int32), 23, 127, 0x7FFF_FFFF
    return x.view(np.int64), 52, 1023, 0x7FFF_FFFF_FFFF_FFFF


@numba.njit(cache=True, nogil=True)
def block_exponent(bits, lo, hi, mbits, bias, mask):
    """``frexp(max |x[lo:hi]|)[1]`` of the floats whose bits are ``bits`` (see
    :func:`float_bits`); ``EMPTY`` when all are zero, :data:`NONFINITE` when one is inf or
    nan. The largest magnitude is the largest of the bits without the sign (an integer
    maximum that vectorizes); its exponent field ``E`` gives ``E - bias + 1``, a subnormal
    mantissa ``m`` gives ``bit_length(m) + 1 - bias - mbits``."""
    part = bits[lo:hi]  # a slice and a loop from 0 vectorize, ``range(lo, hi)`` does not
    m = np.int64(0)
    for t in range(part.size):
        v = part[t] & mask
        m = v if v > m else m
    top = np.int64(m >> mbits)
    if top == (mask >> mbits):
        return NONFINITE
    if top:
        return top - bias + 1
    if m:
        length = 0
        while m >> length:
            length += 1
        return length + 1 - bias - mbits
    return EMPTY


@numba.njit(cache=True, nogil=True)
def first_exponents(bits, values, count, mbits, bias, mask):
    """The exponents (:func:`block_exponent`) of the first ``count`` blocks of ``values``."""
    exps = np.empty(count, np.int64)
    for b in range(count):
        exps[b] = block_exponent(bits, b * values, min((b + 1) * values, bits.size), mbits,
                                 bias, mask)
    return exps


@numba.njit(cache=True, nogil=True)
def fill(s, ident, phase, agreed, flat, bits, mbits, bias, mask, packets, sizes):
    """Build slot ``s``'s DATA packet of phase ``phase[s]`` in ``packets[s]`` (its length in
    ``sizes[s]``): the exponent of the slot's next block, and for phase ``j >= 1`` block
    ``s + (j - 1) k`` quantized under the agreed exponent ``agreed[s]`` (zeros when that is
    ``EMPTY`` or ``NONFINITE``)."""
    k, values, nblocks = ident[SLOTS], ident[VALUES], ident[NBLOCKS]
    j = phase[s]
    ahead = s + j * k
    exp = EMPTY
    if ahead < nblocks:
        exp = block_exponent(bits, ahead * values, min((ahead + 1) * values, bits.size),
                             mbits, bias, mask)
    lo = (s + (j - 1) * k) * values if j else 0
    count = min(values, flat.size - lo) if j else 0
    pkt = packets[s]
    pkt[0], pkt[1], pkt[2], pkt[3] = 67, 70, 73, 78  # b"CFIN"
    pkt[4], pkt[5], pkt[6], pkt[7] = VERSION, 1, j & 1, 0  # version, DATA, flags, reason
    for o, field in ((8, ident[JOB]), (10, ident[SESSION]), (12, ident[WORKER]),
                     (14, ident[NRANKS]), (16, s), (18, count), (20, exp & 0xFFFF),
                     (22, j >> 16), (24, j & 0xFFFF), (26, lo >> 48), (28, (lo >> 32) & 0xFFFF),
                     (30, (lo >> 16) & 0xFFFF), (32, lo & 0xFFFF)):
        _put16(pkt, o, field)
    e = agreed[s]
    if count:
        scale = math.ldexp(1.0, ident[SHIFT] - e) if e != EMPTY and e != NONFINITE else 0.0
        words = np.zeros(count, np.uint32)
        src = flat[lo:lo + count]
        if scale:
            for t in range(src.size):
                words[t] = _swap(np.int64((np.float64(src[t]) * scale + _ROUND) - _ROUND))
        _copy(words.view(np.uint8), pkt[HDR:HDR + 4 * count])
    sizes[s] = HDR + 4 * count


@numba.njit(cache=True, nogil=True)
def take_results(buf, lens, count, ident, phase, last, agreed, out, flat, bits, mbits, bias,
                 mask, packets, sizes, code, slot, counters):
    """Handle datagrams ``0 .. count-1`` of ``buf`` (rows of ``lens`` bytes; 0: not from the
    switch) in order. A RESULT of this session for a slot's current phase is decoded into
    ``out`` and moves the slot on: ``code`` ``SEND`` (its next packet is built, send
    ``packets[slot]``) or ``DONE`` (its last block is in). Stale or repeated results and
    malformed datagrams are counted (``NONE``); other valid datagrams (a REJECT) are left to
    the caller (``OTHER``), and a result for the wrong block is ``BAD_BLOCK``."""
    k, values, q = ident[SLOTS], ident[VALUES], ident[SHIFT]
    for i in range(count):
        b = buf[i]
        n = lens[i]
        code[i] = NONE
        if n < HDR or b[0] != 67 or b[1] != 70 or b[2] != 73 or b[3] != 78 or b[4] != VERSION:
            counters[MALFORMED] += 1
            continue
        if b[5] != 2:
            code[i] = OTHER
            continue
        job, session, worker = _u16(b, 8), _u16(b, 10), _u16(b, 12)
        s, cnt = _u16(b, 16), _u16(b, 18)
        e = _u16(b, 20)
        e = e - 65536 if e >= 32768 else e
        ph = _u32(b, 22)
        offset = (_u32(b, 26) << 32) | _u32(b, 30)
        if (n != HDR + 4 * cnt or b[6] > 1 or job != ident[JOB] or session != ident[SESSION]
                or (worker != ident[WORKER] and worker != _GROUP) or s >= k):
            counters[MALFORMED] += 1
            continue
        if ph != phase[s] or phase[s] > last[s]:
            counters[DUPLICATES] += 1
            continue
        if ph:
            lo = (s + (ph - 1) * k) * values
            if offset != lo or cnt != min(values, flat.size - lo):
                code[i] = BAD_BLOCK
                slot[i] = s
                continue
            a = agreed[s]
            if a == NONFINITE:
                if not counters[FIRST_NONFINITE]:
                    counters[FIRST_NONFINITE] = lo // values + 1
            else:
                scale = math.ldexp(1.0, a - q) if a != EMPTY else 1.0
                words = np.empty(cnt, np.uint32)
                _copy(b[HDR:HDR + 4 * cnt], words.view(np.uint8))
                dst = out[lo:lo + cnt]
                for t in range(dst.size):
                    dst[t] = np.float64(np.int32(_swap(np.int64(words[t])))) * scale
        counters[RESULTS] += 1
        counters[GROUP_RESULTS] += worker == _GROUP
        agreed[s] = e
        phase[s] += 1
        slot[i] = s
        if phase[s] <= last[s]:
            fill(s, ident, phase, agreed, flat, bits, mbits, bias, mask, packets, sizes)
            code[i] = SEND
        else:
            code[i] = DONE
