"""The compiled loop of :func:`commflow.ir.match_transfers` (numba): three passes over the
steps, no sort of them, memory linear in the number of connections beyond the output.

A *connection* is a sending stream (participant channel) and a receiver. Connections are
numbered per stream in order of first use, so a receive finds its connection by a binary
search among the sending stream's connections (sorted by receiver), and its send as the next
unmatched message of that connection (the head of the connection's list of sends).
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
    # connections of each sending stream, numbered by first use: counted, then numbered
    stamp = np.full(nparts, -1, dtype=np.int64)
    nconn = 0
    for s in range(nstreams):
        for i in range(stream_starts[s], stream_starts[s + 1]):
            if kind[i] == 0:
                continue
            if not 0 <= peer[i] < nparts:
                return False
            if kind[i] == SEND and stamp[peer[i]] != s:
                stamp[peer[i]] = s
                nconn += 1
    conn_of_dst = np.empty(nparts, dtype=np.int64)
    conn_start = np.zeros(nstreams + 1, dtype=np.int64)
    conn_dst = np.empty(nconn, dtype=np.int64)
    # each connection's unmatched messages as a list in send order, linked through
    # ``matched`` (a send's entry holds the next send of its connection until it is matched)
    head = np.full(nconn, -1, dtype=np.int64)
    tail = np.empty(nconn, dtype=np.int64)
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
            c = conn_of_dst[d]
            if head[c] < 0:
                head[c] = i
            else:
                matched[tail[c]] = i
            tail[c] = i
    conn_start[nstreams] = nconn
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
        j = head[c]
        if j < 0 or count[j] != count[i]:
            return False
        head[c] = matched[j]
        matched[i] = j
        matched[j] = i if mirror else -1
    return (head < 0).all()
