"""Compiled (numba) list scheduling of chunks along trees over edges with links of their own,
for the streams lowering's schedule keys (:mod:`commflow.synth.stream_schedule`).

Every chunk of every root moves along its trees: up an in-tree (a rank sends its partial
once every child's has arrived), then down an out-tree from the root (a rank forwards what it
received to each child). Each edge sends one chunk at a time, taking ``dur[u, v]`` seconds,
and the chunk arrives ``lat[u, v]`` later; an edge that is free sends the waiting hop of
lowest key first (its chunk's priority, the position in its root's data, plus the hop's
``bonus``), so no edge idles while a chunk waits for it; a hop takes its ``size`` times
``dur`` (a message of several equal chunks). The result is the time each hop
arrives, in an array indexed by ``(phase * chunks + chunk) * nranks + rank``: phase 0 the hop
down into ``rank``, phase 1 the hop up out of ``rank``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

DOWN_HOP, UP_HOP = 0, 1
"""Phases of a hop in the arrival array."""


@njit(cache=True, nogil=True)
def _push(keys: np.ndarray, items: np.ndarray, base: int, size: int, key: float, item: int) -> None:
    """Push ``(key, item)`` onto the binary min-heap at ``keys[base:base+size]``."""
    i = size
    while i > 0:
        parent = (i - 1) // 2
        if keys[base + parent] <= key:
            break
        keys[base + i] = keys[base + parent]
        items[base + i] = items[base + parent]
        i = parent
    keys[base + i] = key
    items[base + i] = item


@njit(cache=True, nogil=True)
def _pop(keys: np.ndarray, items: np.ndarray, base: int, size: int) -> tuple[float, int]:
    """Pop the least ``(key, item)`` of the heap at ``keys[base:base+size]`` (``size`` > 0)."""
    key, item = keys[base], items[base]
    last_key, last_item = keys[base + size - 1], items[base + size - 1]
    size -= 1
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and keys[base + child + 1] < keys[base + child]:
            child += 1
        if keys[base + child] >= last_key:
            break
        keys[base + i] = keys[base + child]
        items[base + i] = items[base + child]
        i = child
    if size > 0:
        keys[base + i] = last_key
        items[base + i] = last_item
    return key, item


@njit(cache=True, nogil=True)
def list_schedule(
    n: int,
    roots: np.ndarray,
    up_tree: np.ndarray,
    down_tree: np.ndarray,
    priority: np.ndarray,
    up_parent: np.ndarray,
    down_parent: np.ndarray,
    dur: np.ndarray,
    lat: np.ndarray,
    capacity: np.ndarray,
    bonus: np.ndarray,
    size: np.ndarray,
) -> np.ndarray:
    """Arrival time (seconds) of every hop of every chunk (see the module).

    Chunk ``c`` belongs to root ``roots[c]`` and follows in-tree ``up_tree[c]`` (rows of
    ``up_parent``, -1: none) then out-tree ``down_tree[c]`` (rows of ``down_parent``);
    ``capacity[u * n + v]`` is at least the number of hops over edge ``u -> v``; ``bonus``,
    indexed as the result, is added to a hop's priority, and ``size``, indexed so too,
    scales its transfer time. Hops that never happen keep -1."""
    chunks = len(priority)
    arrival = np.full(2 * chunks * n, -1.0)
    waiting = np.zeros(chunks * n, dtype=np.int64)  # children an up-hop still waits for
    kids = np.zeros((len(down_parent), n + 1), dtype=np.int64)
    order = np.zeros((len(down_parent), n), dtype=np.int64)
    for t in range(len(down_parent)):  # children of every rank of every out-tree, CSR
        for v in range(n):
            if down_parent[t, v] >= 0:
                kids[t, down_parent[t, v] + 1] += 1
        for v in range(n):
            kids[t, v + 1] += kids[t, v]
        fill = kids[t, :n].copy()
        for v in range(n):
            p = down_parent[t, v]
            if p >= 0:
                order[t, fill[p]] = v
                fill[p] += 1
    base = np.zeros(n * n + 1, dtype=np.int64)
    base[1:] = np.cumsum(capacity)
    queue_key = np.empty(base[-1])
    queue_hop = np.empty(base[-1], dtype=np.int64)
    queued = np.zeros(n * n, dtype=np.int64)
    busy = np.zeros(n * n, dtype=np.bool_)
    event_key = np.empty(base[-1] + n * n)
    event_item = np.empty(base[-1] + n * n, dtype=np.int64)
    events = 0
    for c in range(chunks):
        t = up_tree[c]
        if t >= 0:
            for v in range(n):
                p = up_parent[t, v]
                if p >= 0:
                    waiting[c * n + p] += 1
            for v in range(n):
                p = up_parent[t, v]
                if p >= 0 and waiting[c * n + v] == 0:
                    e = v * n + p
                    hop = (UP_HOP * chunks + c) * n + v
                    _push(queue_key, queue_hop, base[e], queued[e], priority[c] + bonus[hop],
                          hop)  # fmt: skip
                    queued[e] += 1
        else:
            t = down_tree[c]
            r = roots[c]
            for k in range(kids[t, r], kids[t, r + 1]):
                v = order[t, k]
                e = r * n + v
                hop = (DOWN_HOP * chunks + c) * n + v
                _push(queue_key, queue_hop, base[e], queued[e], priority[c] + bonus[hop],
                      hop)  # fmt: skip
                queued[e] += 1
    for e in range(n * n):
        events = _start(e, 0.0, queue_key, queue_hop, base, queued, busy, event_key, event_item,
                        events, dur, lat, size)  # fmt: skip
    while events > 0:
        now, item = _pop(event_key, event_item, 0, events)
        events -= 1
        if item < 0:
            busy[-1 - item] = False
            events = _start(-1 - item, now, queue_key, queue_hop, base, queued, busy, event_key,
                            event_item, events, dur, lat, size)  # fmt: skip
            continue
        arrival[item] = now
        phase, rest = divmod(item, chunks * n)
        c, v = divmod(rest, n)
        if phase == UP_HOP:
            p = up_parent[up_tree[c], v]
            waiting[c * n + p] -= 1
            if waiting[c * n + p] > 0:
                continue
            if p != roots[c]:
                e = p * n + up_parent[up_tree[c], p]
                hop = (UP_HOP * chunks + c) * n + p
                events = _offer(e, priority[c] + bonus[hop], hop, now, queue_key,
                                queue_hop, base, queued, busy, event_key, event_item, events,
                                dur, lat, size)  # fmt: skip
                continue
            if down_tree[c] < 0:
                continue
            v = p  # the root's total is complete: down its out-tree
        t = down_tree[c]
        for k in range(kids[t, v], kids[t, v + 1]):
            w = order[t, k]
            hop = (DOWN_HOP * chunks + c) * n + w
            events = _offer(v * n + w, priority[c] + bonus[hop], hop, now,
                            queue_key, queue_hop, base, queued, busy, event_key, event_item,
                            events, dur, lat, size)  # fmt: skip
    return arrival


@njit(cache=True, nogil=True)
def _start(e, now, queue_key, queue_hop, base, queued, busy, event_key, event_item, events, dur,
           lat, size) -> int:  # fmt: skip
    """Start edge ``e``'s next chunk at ``now`` if it is free and one waits (it takes
    ``dur[e]`` times the hop's ``size``); returns the event count."""
    if busy[e] or queued[e] == 0:
        return events
    _, hop = _pop(queue_key, queue_hop, base[e], queued[e])
    queued[e] -= 1
    busy[e] = True
    end = now + dur[e] * size[hop]
    _push(event_key, event_item, 0, events, end, -1 - e)
    _push(event_key, event_item, 0, events + 1, end + lat[e], hop)
    return events + 2


@njit(cache=True, nogil=True)
def _offer(e, key, hop, now, queue_key, queue_hop, base, queued, busy, event_key, event_item,
           events, dur, lat, size) -> int:  # fmt: skip
    """Queue ``hop`` (priority ``key``) on edge ``e`` at ``now`` and start the edge if it is
    free; returns the event count."""
    _push(queue_key, queue_hop, base[e], queued[e], key, hop)
    queued[e] += 1
    return _start(e, now, queue_key, queue_hop, base, queued, busy, event_key, event_item, events,
                  dur, lat, size)  # fmt: skip
