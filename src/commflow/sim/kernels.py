"""The simulator's compiled loops (numba), each one pass over its steps with no temporaries:
numbering a program's connections (:mod:`commflow.sim.paths`), and the step codes and Kahn
sweep of :mod:`commflow.sim.dag` (step codes use its bits, passed in so both modules agree).

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
    which the model times) 0. (``cost`` is indexed, not unpacked: unpacking its arrays here
    would add reference counting to every step of the sweep.)"""
    send, reduces, copies, contended = bits[2], bits[4], bits[5], bits[6]
    if c & send:
        return 0.0 if c & contended else cost[0][i] * cost[4] * cost[3][cost[1][i]]
    if c & reduces and cost[5] > 0:
        return cost[0][i] * cost[4] / cost[5]
    if c & copies and cost[6] > 0:
        return cost[0][i] * cost[4] / cost[6]
    return 0.0


@njit(cache=True, nogil=True)
def step_codes(
    op: np.ndarray,
    op_code: np.ndarray,
    channel_starts: np.ndarray,
    dep_ptr: np.ndarray,
    has_deps: bool,
    bits: tuple,
    code: np.ndarray,
    indegree: np.ndarray,
) -> None:
    """Fill ``code`` (per step ``op_code[op]`` plus the first/last bits of its channel,
    channels starting at ``channel_starts``) and ``indegree`` (its predecessors: the
    previous step of its channel, a receive's send, its explicit dependencies, read from
    ``dep_ptr`` only with ``has_deps``)."""
    first, last, recv = bits[0], bits[1], bits[3]
    for s in range(len(channel_starts) - 1):
        lo, hi = channel_starts[s], channel_starts[s + 1]
        for i in range(lo, hi):
            c = op_code[op[i]]
            d = 0 if i == lo else 1
            if i == lo:
                c |= first
            if i == hi - 1:
                c |= last
            if c & recv:
                d += 1
            if has_deps:
                d += dep_ptr[i + 1] - dep_ptr[i]
            code[i] = c
            indegree[i] = d


@njit(cache=True, nogil=True)
def run_sweep(
    ready: np.ndarray,
    done: np.ndarray,
    finish: np.ndarray,
    indegree: np.ndarray,
    graph: tuple,
    cost: tuple,
    bits: tuple,
    hold: bool,
    depth_first: bool,
    capacity: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Kahn sweep from the ``ready`` steps and the successors of the ``done`` steps (completed
    by the model, ``finish`` set) while no step needs the model: a contended send.

    Every swept step gets ``finish`` = its start (the latest of its channel predecessor's
    finish, its dependencies' finishes and, for a receive, its send's finish plus the
    connection's latency) plus its :func:`duration`; its successors whose last predecessor
    it was become ready (``indegree`` counts down; -1 marks a step taken). Successors: the
    next step of the channel, a send's receive, the steps listing it as a dependency.

    Wave by wave (first in, first out), unless ``depth_first``: then each step's channel
    runs on while its next step is ready, so the sweep walks memory along channels (only
    valid when no step is contended: any topological order then gives the same times).
    With ``hold``, contended sends are set aside (started, not completed) and the sweep goes
    on without them; otherwise it stops at the first wave holding one, started, not
    completed. ``capacity``: the number of channels (at most one ready step each). Returns
    ``(held, held_start, stopped_wave, completed)``: the held sends and their start times
    (seconds), the stopped wave (empty if none) and the number of steps swept and
    completed."""
    code, partner, dep_ptr, dep_idx, succ_ptr, succ_idx, has_deps = graph
    of_step, latency = cost[1], cost[2]
    first, last, send, recv, contended = bits[0], bits[1], bits[2], bits[3], bits[6]
    held = np.empty(16, dtype=np.int64)
    held_start = np.empty(16, dtype=np.float64)
    nheld = completed = 0
    wave = np.empty(capacity, dtype=np.int64)
    nxt = np.empty(capacity, dtype=np.int64)
    n, m = len(done), len(ready)
    wave[:n] = done
    nxt[:m] = ready
    timed = False  # the first pass releases the successors of ``done`` only
    while True:
        stop = False
        if timed and not hold:
            for k in range(n):
                if code[wave[k]] & contended:
                    stop = True
                    break
        for k in range(n):
            i = wave[k]
            while True:
                c = code[i]
                if timed:
                    t = 0.0 if c & first else finish[i - 1]
                    if has_deps:
                        for e in range(dep_ptr[i], dep_ptr[i + 1]):
                            t = max(t, finish[dep_idx[e]])
                    if c & recv:
                        j = partner[i]
                        t = max(t, finish[j] + latency[of_step[j]])
                    finish[i] = t + duration(i, c, cost, bits)
                    if stop:
                        break
                    if c & contended:
                        if nheld == len(held):
                            held = np.concatenate((held, np.empty(nheld, dtype=np.int64)))
                            held_start = np.concatenate((held_start, np.empty(nheld)))
                        held[nheld] = i
                        held_start[nheld] = t
                        nheld += 1
                        break
                    completed += 1
                run_on = False  # whether to go on with the channel's next step, now ready
                if not c & last:
                    indegree[i + 1] -= 1
                    if indegree[i + 1] == 0:
                        indegree[i + 1] = -1
                        run_on = depth_first and timed
                        if not run_on:
                            nxt[m] = i + 1
                            m += 1
                # the other successors: a send's receive, then the dependent steps
                j = partner[i] if c & send else -1
                e, end = (succ_ptr[i], succ_ptr[i + 1]) if has_deps else (0, 0)
                while True:
                    if j >= 0:
                        indegree[j] -= 1
                        if indegree[j] == 0:
                            indegree[j] = -1
                            nxt[m] = j
                            m += 1
                    if e == end:
                        break
                    j = succ_idx[e]
                    e += 1
                if not run_on:
                    break
                i += 1
        if stop:
            return held[:0], held_start[:0], wave[:n].copy(), completed
        if not m:
            return held[:nheld], held_start[:nheld], wave[:0], completed
        wave, nxt = nxt, wave
        n, m = m, 0
        timed = True


@njit(cache=True, nogil=True)
def number_connections(
    peer: np.ndarray,
    count: np.ndarray,
    op: np.ndarray,
    send: int,
    channel_starts: np.ndarray,
    channel_part: np.ndarray,
    nparts: int,
    of_step: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Number the connections (sender, receiver) of the send steps (``op == send``) in
    increasing ``sender * nparts + receiver`` order, one participant at a time (channel ``s``
    holds the steps ``channel_starts[s]:channel_starts[s+1]`` of participant
    ``channel_part[s]``, participants in increasing order). Fills ``of_step`` (per step, left
    as is for other steps) with connection ids; returns per connection its key, the chunks
    it carries, and the lowest and highest channel ``s`` sending on it."""
    nchannels = len(channel_starts) - 1
    size = 16
    keys = np.empty(size, dtype=np.int64)
    chunks = np.empty(size, dtype=np.float64)
    lowest = np.empty(size, dtype=np.int64)
    highest = np.empty(size, dtype=np.int64)
    stamp = np.full(nparts, -1, dtype=np.int64)
    local = np.empty(nparts, dtype=np.int64)
    found = np.empty(nparts, dtype=np.int64)
    nconn = 0
    s = 0
    while s < nchannels:
        p = channel_part[s]
        e = s + 1
        while e < nchannels and channel_part[e] == p:
            e += 1
        # the participant's receivers (its steps are then in cache for the second scan)
        nfound = 0
        for i in range(channel_starts[s], channel_starts[e]):
            if op[i] == send and stamp[peer[i]] != p:
                stamp[peer[i]] = p
                found[nfound] = peer[i]
                nfound += 1
        if nconn + nfound > size:
            size = max(2 * size, nconn + nfound)
            keys = np.concatenate((keys, np.empty(size - len(keys), dtype=np.int64)))
            chunks = np.concatenate((chunks, np.empty(size - len(chunks))))
            lowest = np.concatenate((lowest, np.empty(size - len(lowest), dtype=np.int64)))
            highest = np.concatenate((highest, np.empty(size - len(highest), dtype=np.int64)))
        dsts = np.sort(found[:nfound])
        for j in range(nfound):
            local[dsts[j]] = nconn + j
            keys[nconn + j] = p * nparts + dsts[j]
            chunks[nconn + j] = 0.0
            lowest[nconn + j] = nchannels
            highest[nconn + j] = -1
        for channel in range(s, e):
            for i in range(channel_starts[channel], channel_starts[channel + 1]):
                if op[i] != send:
                    continue
                c = local[peer[i]]
                of_step[i] = c
                chunks[c] += count[i]
                lowest[c] = min(lowest[c], channel)
                highest[c] = max(highest[c], channel)
        nconn += nfound
        s = e
    return keys[:nconn], chunks[:nconn], lowest[:nconn], highest[:nconn]


@njit(cache=True, nogil=True)
def water_fill(
    ptr: np.ndarray, link: np.ndarray, fraction: np.ndarray, capacity: np.ndarray, rtol: float
) -> np.ndarray:
    """Max-min fair rates (bytes/s) of flows ``i`` crossing links ``link[ptr[i]:ptr[i+1]]``
    with ``fraction`` of their rate, by progressive filling: all growing flows rise together
    until a link is within ``rtol`` of its ``capacity``; the flows crossing it stop growing,
    and so on. A flow's link weights leave the per-link sums when it stops (incremental, so
    a round costs the links still in use, not every flow)."""
    nflows, nlinks = len(ptr) - 1, len(capacity)
    owner = np.empty(len(link), dtype=np.int64)
    by_link = np.zeros(nlinks + 1, dtype=np.int64)
    weight = np.zeros(nlinks)
    users = np.zeros(nlinks, dtype=np.int64)
    for f in range(nflows):
        for e in range(ptr[f], ptr[f + 1]):
            owner[e] = f
            by_link[link[e] + 1] += 1
            weight[link[e]] += fraction[e]
            users[link[e]] += 1
    for lk in range(nlinks):
        by_link[lk + 1] += by_link[lk]
    fill = by_link[:-1].copy()
    entries = np.empty(len(link), dtype=np.int64)
    for e in range(len(link)):
        entries[fill[link[e]]] = e
        fill[link[e]] += 1
    used = np.flatnonzero(users)
    residual = capacity.copy()
    rate = np.zeros(nflows)
    growing = np.ones(nflows, dtype=np.bool_)
    level = 0.0
    while len(used):
        tight, headroom = -1, np.inf
        for lk in used:
            h = residual[lk] / weight[lk]
            if h < headroom:
                tight, headroom = lk, h
        level += headroom
        for lk in used:
            residual[lk] -= headroom * weight[lk]
        residual[tight] = 0.0
        for lk in used:
            if residual[lk] > rtol * capacity[lk]:
                continue
            for j in range(by_link[lk], by_link[lk + 1]):
                f = owner[entries[j]]
                if not growing[f]:
                    continue
                growing[f] = False
                rate[f] = level
                for e in range(ptr[f], ptr[f + 1]):
                    users[link[e]] -= 1
                    weight[link[e]] -= fraction[e]
        used = used[users[used] > 0]
    return rate
