"""The simulator's compiled loops (numba), each one pass over its steps with no temporaries:
numbering a program's connections (:mod:`commflow.sim.paths`), and the Kahn sweep of
:mod:`commflow.sim.dag` (step codes use its bits, passed in so both modules agree).

The sweep's arrays travel in two tuples:

- ``graph = (code, partner, dep_ptr, dep_idx, succ_ptr, succ_idx, has_deps)``: per step its
  code, matched send/receive (-1), explicit dependencies (CSR) and the steps depending on it
  (CSR, by the step depended on); the dependency arrays are read only with ``has_deps``;
- ``cost = (count, of_step, latency, solo_time_per_byte, chunk_bytes, reduce_bandwidth,
  copy_bandwidth)``: per step its chunks and connection (-1 unless a send), per connection its
  latency (seconds) and seconds per byte alone, bytes per chunk, and the local bandwidths
  (bytes/s; 0 for free local work).

``bits = (first, last, send, recv, reduces, copies, contended)`` are the step codes.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def duration(i: int, c: int, cost: tuple, bits: tuple) -> float:
    """Seconds step ``i`` (code ``c``) takes when its time does not depend on other traffic:
    a send not contended, its bytes times its connection's seconds per byte alone; a step
    that reduces or copies, its bytes over that bandwidth; else (and for contended sends,
    which the model times) 0."""
    count, of_step, _, solo, chunk_bytes, reduce_bandwidth, copy_bandwidth = cost
    _, _, send, _, reduces, copies, contended = bits
    if c & send:
        return 0.0 if c & contended else count[i] * chunk_bytes * solo[of_step[i]]
    if c & reduces and reduce_bandwidth > 0:
        return count[i] * chunk_bytes / reduce_bandwidth
    if c & copies and copy_bandwidth > 0:
        return count[i] * chunk_bytes / copy_bandwidth
    return 0.0


@njit(cache=True, nogil=True)
def wave_start(
    steps: np.ndarray, finish: np.ndarray, graph: tuple, cost: tuple, bits: tuple
) -> np.ndarray:
    """Start time (seconds) of each of ``steps``: the latest of its channel predecessor's
    finish (unless it is the first of its channel), its dependencies' finishes and, for a
    receive, its send's finish plus the send's connection latency. Sets each step's
    ``finish`` to its start plus its :func:`duration`."""
    code, partner, dep_ptr, dep_idx, _, _, has_deps = graph
    of_step, latency = cost[1], cost[2]
    first, recv = bits[0], bits[3]
    start = np.empty(len(steps), dtype=np.float64)
    for k in range(len(steps)):
        i = steps[k]
        c = code[i]
        t = 0.0 if c & first else finish[i - 1]
        if has_deps:
            for e in range(dep_ptr[i], dep_ptr[i + 1]):
                t = max(t, finish[dep_idx[e]])
        if c & recv:
            j = partner[i]
            t = max(t, finish[j] + latency[of_step[j]])
        start[k] = t
        finish[i] = t + duration(i, c, cost, bits)
    return start


@njit(cache=True, nogil=True)
def wave_complete(steps: np.ndarray, indegree: np.ndarray, graph: tuple, bits: tuple) -> np.ndarray:
    """Count down the predecessors of the successors of the completed ``steps`` and return
    those now ready, each once, marked taken (indegree -1). Successors: the next step of the
    channel unless ``steps`` is its last, a send's receive, and the steps listing it as a
    dependency."""
    code, partner, _, _, succ_ptr, succ_idx, has_deps = graph
    last, send = bits[1], bits[2]
    bound = 2 * len(steps)
    if has_deps:
        for k in range(len(steps)):
            bound += succ_ptr[steps[k] + 1] - succ_ptr[steps[k]]
    ready = np.empty(bound, dtype=np.int64)
    n = 0
    for k in range(len(steps)):
        i = steps[k]
        c = code[i]
        if not c & last:
            n = _release(indegree, i + 1, ready, n)
        if c & send:
            n = _release(indegree, partner[i], ready, n)
        if has_deps:
            for e in range(succ_ptr[i], succ_ptr[i + 1]):
                n = _release(indegree, succ_idx[e], ready, n)
    return ready[:n]


@njit(cache=True, nogil=True, inline="always")
def _release(indegree: np.ndarray, j: int, ready: np.ndarray, n: int) -> int:
    """Count down step ``j``'s predecessors; append it to ``ready[n:]`` (marked taken) when
    none is left. Returns the new length of ``ready``."""
    indegree[j] -= 1
    if indegree[j] == 0:
        indegree[j] = -1
        ready[n] = j
        n += 1
    return n


@njit(cache=True, nogil=True)
def run_waves(
    ready: np.ndarray,
    finish: np.ndarray,
    indegree: np.ndarray,
    graph: tuple,
    cost: tuple,
    bits: tuple,
    hold: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Sweep wave after wave from the ``ready`` steps (:func:`wave_start`, then
    :func:`wave_complete`) while no step needs the model: a contended send.

    With ``hold``, contended sends are set aside (started, not completed) and the sweep goes
    on without them; otherwise the sweep stops at the first wave holding one, started, not
    completed. Returns ``(held, held_start, stopped_wave, completed)``: the held sends and
    their start times (seconds), the stopped wave (empty if none) and the number of steps
    completed."""
    code = graph[0]
    contended = bits[6]
    held = np.empty(16, dtype=np.int64)
    held_start = np.empty(16, dtype=np.float64)
    nheld = 0
    completed = 0
    wave = ready
    while len(wave):
        start = wave_start(wave, finish, graph, cost, bits)
        nfree = 0
        for k in range(len(wave)):
            i = wave[k]
            if code[i] & contended:
                if not hold:
                    return held[:0], held_start[:0], wave, completed
                if nheld == len(held):
                    held = np.concatenate((held, np.empty(nheld, dtype=np.int64)))
                    held_start = np.concatenate((held_start, np.empty(nheld)))
                held[nheld] = i
                held_start[nheld] = start[k]
                nheld += 1
            else:
                wave[nfree] = i
                nfree += 1
        completed += nfree
        wave = wave_complete(wave[:nfree], indegree, graph, bits)
    return held[:nheld], held_start[:nheld], wave, completed


@njit(cache=True, nogil=True)
def number_connections(
    part: np.ndarray,
    peer: np.ndarray,
    chan: np.ndarray,
    count: np.ndarray,
    sends: np.ndarray,
    nparts: int,
    send_conn: np.ndarray,
    of_step: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Number the connections (sender, receiver) of the send steps ``sends`` (sorted by
    participant) in increasing ``sender * nparts + receiver`` order. Fills ``send_conn``
    (per send) and ``of_step`` (per step) with connection ids; returns per connection its
    key, the chunks it carries, and the lowest and highest stream ``part * nchan + chan``
    sending on it."""
    m = len(sends)
    nchan = 1
    for k in range(m):
        nchan = max(nchan, chan[sends[k]] + 1)
    stamp = np.full(nparts, -1, dtype=np.int64)
    nconn = 0
    for k in range(m):
        i = sends[k]
        if stamp[peer[i]] != part[i]:
            stamp[peer[i]] = part[i]
            nconn += 1
    keys = np.empty(nconn, dtype=np.int64)
    chunks = np.zeros(nconn, dtype=np.float64)
    lowest = np.full(nconn, np.iinfo(np.int64).max, dtype=np.int64)
    highest = np.full(nconn, -1, dtype=np.int64)
    local = np.empty(nparts, dtype=np.int64)
    found = np.empty(nparts, dtype=np.int64)
    stamp[:] = -1
    first = 0
    lo = 0
    while lo < m:
        p = part[sends[lo]]
        hi = lo
        nfound = 0
        while hi < m and part[sends[hi]] == p:
            d = peer[sends[hi]]
            if stamp[d] != p:
                stamp[d] = p
                found[nfound] = d
                nfound += 1
            hi += 1
        dsts = np.sort(found[:nfound])
        for j in range(nfound):
            local[dsts[j]] = first + j
            keys[first + j] = p * nparts + dsts[j]
        for k in range(lo, hi):
            i = sends[k]
            c = local[peer[i]]
            send_conn[k] = c
            of_step[i] = c
            chunks[c] += count[i]
            stream = p * nchan + chan[i]
            lowest[c] = min(lowest[c], stream)
            highest[c] = max(highest[c], stream)
        first += nfound
        lo = hi
    return keys, chunks, lowest, highest
