"""The compiled loop of :func:`commflow.ir.match_transfers` (numba): one pass over the steps,
no sort, memory linear in the number of steps.

A *connection* is a sending stream (participant channel) and a receiver. Connections are
numbered per stream in order of first use, so a receive finds its connection by a binary
search among the sending stream's connections (sorted by receiver), and its send as the next
unmatched message of that connection.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SEND, RECV = 1, 2
"""Values of the ``kind`` array: a send, a receive (``RECV`` or ``RECV_REDUCE``), else 0."""


@njit(cache=True, nogil=True)
def match(
    part: np.ndarray,
    chan: np.ndarray,
    peer: np.ndarray,
    count: np.ndarray,
    kind: np.ndarray,
    stream_starts: np.ndarray,
    nparts: int,
    matched: np.ndarray,
    mirror: bool,
) -> bool:
    """Set ``matched[i]`` (filled with -1 by the caller) to the send that receive ``i``
    receives from and, with ``mirror``, ``matched[j]`` to the receive of send ``j``. Returns
    False when sends and receives do not pair up one to one on every connection with equal
    chunk counts (the caller explains why)."""
    n = len(kind)
    nstreams = len(stream_starts) - 1
    for i in range(n):
        if kind[i] != 0 and not 0 <= peer[i] < nparts:
            return False
    # connections of each sending stream, numbered by first use: counted, then numbered
    stamp = np.full(nparts, -1, dtype=np.int64)
    nconn = 0
    for s in range(nstreams):
        for i in range(stream_starts[s], stream_starts[s + 1]):
            if kind[i] == SEND and stamp[peer[i]] != s:
                stamp[peer[i]] = s
                nconn += 1
    conn_of_dst = np.empty(nparts, dtype=np.int64)
    conn_start = np.zeros(nstreams + 1, dtype=np.int64)
    conn_dst = np.empty(nconn, dtype=np.int64)
    conn_msgs = np.zeros(nconn, dtype=np.int64)
    nconn = 0
    for s in range(nstreams):
        conn_start[s] = nconn
        for i in range(stream_starts[s], stream_starts[s + 1]):
            if kind[i] != SEND:
                continue
            d = peer[i]
            if stamp[d] != nstreams + s:
                stamp[d] = nstreams + s
                conn_of_dst[d] = nconn
                conn_dst[nconn] = d
                nconn += 1
            conn_msgs[conn_of_dst[d]] += 1
    conn_start[nstreams] = nconn
    # message slots of each connection, in send order
    base = np.zeros(nconn + 1, dtype=np.int64)
    for c in range(nconn):
        base[c + 1] = base[c] + conn_msgs[c]
    slot = np.empty(base[nconn], dtype=matched.dtype)
    fill = base[:-1].copy()
    nconn = 0
    for s in range(nstreams):
        for i in range(stream_starts[s], stream_starts[s + 1]):
            if kind[i] != SEND:
                continue
            d = peer[i]
            if stamp[d] != 2 * nstreams + s:  # the same first-use order as above
                stamp[d] = 2 * nstreams + s
                conn_of_dst[d] = nconn
                nconn += 1
            c = conn_of_dst[d]
            slot[fill[c]] = i
            fill[c] += 1
    # each stream's connections sorted by receiver, for the receives' binary search
    by_dst = np.empty(nconn, dtype=np.int64)
    for s in range(nstreams):
        lo, hi = conn_start[s], conn_start[s + 1]
        order = np.argsort(conn_dst[lo:hi])
        for k in range(hi - lo):
            by_dst[lo + k] = lo + order[k]
    # streams of each participant (sorted by channel), to find a receive's sending stream
    part_start = np.zeros(nparts + 1, dtype=np.int64)
    for s in range(nstreams):
        part_start[part[stream_starts[s]] + 1] = s + 1
    for p in range(nparts):
        if part_start[p + 1] < part_start[p]:
            part_start[p + 1] = part_start[p]
    stream_chan = np.empty(nstreams, dtype=np.int64)
    for s in range(nstreams):
        stream_chan[s] = chan[stream_starts[s]]
    taken = np.zeros(nconn, dtype=np.int64)
    for i in range(n):
        if kind[i] != RECV:
            continue
        src = peer[i]
        lo, hi = part_start[src], part_start[src + 1]
        s = lo + np.searchsorted(stream_chan[lo:hi], chan[i])
        if s >= hi or stream_chan[s] != chan[i]:
            return False
        lo, hi = conn_start[s], conn_start[s + 1]
        while lo < hi:  # first of the stream's connections (by receiver) to >= part[i]
            mid = (lo + hi) // 2
            if conn_dst[by_dst[mid]] < part[i]:
                lo = mid + 1
            else:
                hi = mid
        k = lo
        if k >= conn_start[s + 1] or conn_dst[by_dst[k]] != part[i]:
            return False
        c = by_dst[k]
        if taken[c] >= conn_msgs[c]:
            return False
        j = slot[base[c] + taken[c]]
        taken[c] += 1
        if count[j] != count[i]:
            return False
        matched[i] = j
        if mirror:
            matched[j] = i
    return np.array_equal(taken, conn_msgs)
