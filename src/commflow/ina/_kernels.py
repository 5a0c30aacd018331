"""Compiled (numba) inner loop of the live switch: the aggregation of a batch of DATA
datagrams (the workers' loop is :mod:`commflow.ina._stream_kernels`). It does what
:mod:`commflow.ina.protocol` and the Python reference :meth:`commflow.ina.switch.Switch.handle`
state with numpy, without a per-packet Python object; ``tests/ina/test_compiled.py`` checks
they agree bit for bit.

Header offsets follow :data:`commflow.ina.protocol.HEADER` (network byte order, 34 bytes).
"""

from __future__ import annotations

import numba
import numpy as np

from commflow.ina.protocol import VERSION

HDR = 34
EMPTY = -(2**15)
_LO, _HI = -(2**31), 2**31 - 1

# what the switch kernel did with a datagram (``code``)
NONE, TO_ALL, TO_SENDER = 0, 1, 2
# counters the switch kernel keeps (``counters``)
AGGREGATED, RESULTS, DUPLICATES, STALE, SATURATED = range(5)


@numba.njit(cache=True, inline="always")
def _u16(b, o):
    return (np.int64(b[o]) << 8) | np.int64(b[o + 1])


@numba.njit(cache=True, inline="always")
def _u32(b, o):
    return (_u16(b, o) << 16) | _u16(b, o + 2)


@numba.njit(cache=True, inline="always")
def _put16(b, o, v):
    b[o] = np.uint8((v >> 8) & 0xFF)
    b[o + 1] = np.uint8(v & 0xFF)


@numba.njit(cache=True, inline="always")
def _copy(src, dst):
    """``dst[:] = src`` as a loop (numba's slice assignment is ~30x slower)."""
    for i in range(dst.size):
        dst[i] = src[i]


@numba.njit(cache=True, inline="always")
def _swap(v):
    """The low 32 bits of the int64 ``v`` with their bytes reversed (as uint32)."""
    return np.uint32(((v & 0xFF) << 24) | (((v >> 8) & 0xFF) << 16) | (((v >> 16) & 0xFF) << 8)
                     | ((v >> 24) & 0xFF))


@numba.njit(cache=True, nogil=True)
def switch_batch(buf, lens, first, npkts, nworkers, values, jobs, sessions, grants, ngrants,
                 touched, phase, seen, nseen, exp, off, cnt, acc, res, counters, code,
                 where):
    """Aggregate datagrams ``first .. npkts-1`` of ``buf`` (rows of ``lens`` bytes) into the
    slot state, in order, as :meth:`Switch.handle` would; stops at the first one that is not
    a well-formed DATA packet of a granted slot in phase order, and returns its index (the
    caller hands it to the Python path) or ``npkts``. Per datagram ``code`` says whom to
    answer and ``where`` which copy ``v * slots + g`` holds the reply (header and payload in
    ``res[v, g]``, the addressee's worker id left for the caller)."""
    full = np.int64(nworkers)
    words = np.empty(values, np.uint32)
    wbytes = words.view(np.uint8)
    for i in range(first, npkts):
        b = buf[i]
        n = lens[i]
        if n < HDR or b[0] != 67 or b[1] != 70 or b[2] != 73 or b[3] != 78:
            return i
        if b[4] != VERSION or b[5] != 1 or b[6] > 1 or b[7] != 0:
            return i
        job, session, worker = _u16(b, 8), _u16(b, 10), _u16(b, 12)
        nw, slot, count = _u16(b, 14), _u16(b, 16), _u16(b, 18)
        e = _u16(b, 20)
        e = e - 65536 if e >= 32768 else e
        ph = _u32(b, 22)
        offset = (_u32(b, 26) << 32) | _u32(b, 30)
        if n != HDR + 4 * count or nw != nworkers or worker >= nworkers or count > values:
            return i
        j = -1
        for k in range(jobs.size):
            if jobs[k] == job and sessions[k] == session:
                j = k
        if j < 0 or slot >= ngrants[j]:
            return i
        v = ph & 1
        if b[6] != v:
            return i
        g = grants[j, slot]
        bit = np.uint64(1) << np.uint64(worker)
        current = phase[v, g]
        row = acc[v, g]
        touched[j] = 1
        if ph == current:
            if seen[v, g] & bit:
                counters[DUPLICATES] += 1
                code[i] = TO_SENDER if nseen[v, g] == full else NONE
                where[i] = v * phase.shape[1] + g
                if code[i] == TO_SENDER:
                    _reply_header(res[v, g], b, v, exp[v, g])
                continue
            if off[v, g] != offset or cnt[v, g] != count:
                return i
            _add_payload(b, count, words, wbytes, row, True)
            seen[v, g] |= bit
            nseen[v, g] += 1
            exp[v, g] = max(exp[v, g], e)
        elif ph == current + 2 and (ph < 1 or (phase[1 - v, g] == ph - 1
                                               and nseen[1 - v, g] == full)):
            _add_payload(b, count, words, wbytes, row, False)
            phase[v, g] = ph
            seen[v, g] = bit
            nseen[v, g] = 1
            exp[v, g] = e
            off[v, g] = offset
            cnt[v, g] = count
        elif ph < current:
            counters[STALE] += 1
            code[i] = NONE
            continue
        else:
            return i
        counters[AGGREGATED] += 1
        code[i] = NONE
        if nseen[v, g] < full:
            continue
        counters[RESULTS] += 1
        out = res[v, g]
        clipped = 0
        total = row[:count]
        for t in range(count):
            c = min(max(total[t], _LO), _HI)
            clipped += c != total[t]
            words[t] = _swap(c)
        _copy(wbytes[:4 * count], out[HDR:HDR + 4 * count])
        counters[SATURATED] += clipped > 0
        _reply_header(out, b, v, exp[v, g])
        code[i] = TO_ALL
        where[i] = v * phase.shape[1] + g
    return npkts


@numba.njit(cache=True, inline="always")
def _add_payload(b, count, words, wbytes, row, add):
    """``row[:count] (+)= `` the big-endian int32 payload of the datagram ``b``, through the
    aligned scratch ``words`` (``wbytes`` its bytes): a copy, then a byte swap and add that
    vectorize."""
    _copy(b[HDR:HDR + 4 * count], wbytes[:4 * count])
    acc = row[:count]
    if add:
        for t in range(count):
            acc[t] += np.int32(_swap(np.int64(words[t])))
    else:
        for t in range(count):
            acc[t] = np.int32(_swap(np.int64(words[t])))


@numba.njit(cache=True)
def _reply_header(out, b, v, e):
    """RESULT header for the DATA header ``b``: same fields, kind RESULT, the agreed
    exponent, flags ``v``."""
    for t in range(HDR):
        out[t] = b[t]
    out[5] = 2
    out[6] = v
    out[7] = 0
    _put16(out, 20, e & 0xFFFF)
