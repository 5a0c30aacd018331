"""Compiled (numba) incremental maximum flows for :mod:`commflow.synth.forest`.

The forest construction changes arc capacities one small step at a time and after each
step asks whether a source ``s`` still sends ``need`` units to every one of several sinks.
Instead of solving each max-flow anew, one flow per sink is kept and repaired: the flow
through an arc whose capacity fell below it is cancelled along flow paths (or cycles), and
augmenting paths (breadth-first, so shortest) refill it up to ``need``.

Networks are dense: ``cap[a, b]`` is the integer capacity of arc ``a -> b`` and
``flows[i, a, b]`` the flow of sink ``i``'s flow on it; a flow never uses both directions of a
pair, never enters ``s`` and never leaves its sink.
"""

from __future__ import annotations

import numpy as np
from numba import njit

RESIDUAL, FORWARD, BACKWARD = 0, 1, 2
"""Arcs a search follows: residual capacity left, flow carried, flow carried against them."""


@njit(cache=True, nogil=True)
def _search(
    f: np.ndarray, cap: np.ndarray, start: int, stop: np.ndarray, arcs: int, prev: np.ndarray
) -> int:
    """Breadth-first search from ``start`` along ``arcs`` (:data:`RESIDUAL`, :data:`FORWARD`
    or :data:`BACKWARD`) until a node marked in ``stop``; returns it (-1: none), with
    ``prev[v]`` the node the search reached ``v`` from (-1: not reached)."""
    n = len(f)
    prev[:] = -1
    prev[start] = start
    if stop[start]:
        return start
    queue = np.empty(n, dtype=np.int64)
    queue[0] = start
    head, tail = 0, 1
    while head < tail:
        x = queue[head]
        head += 1
        for y in range(n):
            if prev[y] >= 0:
                continue
            if arcs == RESIDUAL:
                follow = cap[x, y] - f[x, y] + f[y, x] > 0
            elif arcs == FORWARD:
                follow = f[x, y] > 0
            else:
                follow = f[y, x] > 0
            if follow:
                prev[y] = x
                if stop[y]:
                    return y
                queue[tail] = y
                tail += 1
    return -1


@njit(cache=True, nogil=True)
def reached(cap: np.ndarray, f: np.ndarray, s: int) -> np.ndarray:
    """Nodes ``s`` reaches in the residual network of flow ``f``: after a max-flow, the
    source side of a minimum cut."""
    prev = np.empty(len(cap), dtype=np.int64)
    _search(f, cap, s, np.zeros(len(cap), dtype=np.bool_), RESIDUAL, prev)
    return prev >= 0


@njit(cache=True, nogil=True)
def _augment(f: np.ndarray, cap: np.ndarray, s: int, t: int, value: int, need: int) -> int:
    """Push flow along augmenting paths until the value reaches ``need`` or no path is left;
    returns the new value."""
    if value >= need:
        return value
    prev = np.empty(len(cap), dtype=np.int64)
    sink = np.zeros(len(cap), dtype=np.bool_)
    sink[t] = True
    while value < need and _search(f, cap, s, sink, RESIDUAL, prev) >= 0:
        push = need - value
        y = t
        while y != s:
            x = prev[y]
            push = min(push, cap[x, y] - f[x, y] + f[y, x])
            y = x
        y = t
        while y != s:
            x = prev[y]
            back = min(push, f[y, x])
            f[y, x] -= back
            f[x, y] += push - back
            y = x
        value += push
    return value


@njit(cache=True, nogil=True)
def _cancel(f: np.ndarray, s: int, t: int, a: int, b: int, amount: int) -> int:
    """Remove ``amount`` units of flow from arc ``a -> b`` (it carries at least that much)
    along flow paths ``s .. a -> b .. t`` or flow cycles through it; returns how much the
    value fell. A path from ``b`` that meets the path ``s .. a`` closes a cycle there."""
    n = len(f)
    ahead = np.empty(n, dtype=np.int64)
    behind = np.empty(n, dtype=np.int64)
    lost = 0
    while amount > 0:
        on_path = np.zeros(n, dtype=np.bool_)
        on_path[s] = True
        fed = _search(f, f, a, on_path, BACKWARD, behind) >= 0  # else only a cycle feeds a
        on_path[s] = False
        y = s if fed else a
        while y != a:
            y = behind[y]
            on_path[y] = True
        on_path[a] = True
        on_path[t] = fed
        end = _search(f, f, b, on_path, FORWARD, ahead)
        if end < 0:
            raise RuntimeError("a flow broke conservation")
        first = s if end == t else end  # where the stretch along the path to a starts
        cut = min(amount, f[a, b])
        y = first
        while y != a:
            cut = min(cut, f[y, behind[y]])
            y = behind[y]
        y = end
        while y != b:
            cut = min(cut, f[ahead[y], y])
            y = ahead[y]
        y = first
        while y != a:
            f[y, behind[y]] -= cut
            y = behind[y]
        y = end
        while y != b:
            f[ahead[y], y] -= cut
            y = ahead[y]
        f[a, b] -= cut
        amount -= cut
        if end == t:
            lost += cut
    return lost


@njit(cache=True, nogil=True)
def repair(
    cap: np.ndarray,
    flows: np.ndarray,
    values: np.ndarray,
    sinks: np.ndarray,
    s: int,
    arcs: np.ndarray,
    need: int,
) -> int:
    """After the capacities of ``arcs`` (rows ``(a, b)``) changed, make every sink's flow fit
    ``cap`` again and refill it towards ``need``; returns ``need``, or the value of the first
    sink that falls short, stopping there (callers undo the change, and the next call
    repairs the sinks not reached)."""
    for i in range(len(sinks)):
        f = flows[i]
        for k in range(len(arcs)):
            a, b = arcs[k, 0], arcs[k, 1]
            if f[a, b] > cap[a, b]:
                values[i] -= _cancel(f, s, sinks[i], a, b, f[a, b] - cap[a, b])
        values[i] = _augment(f, cap, s, sinks[i], values[i], need)
        if values[i] < need:
            return values[i]
    return need


@njit(cache=True, nogil=True)
def split(
    cap: np.ndarray,
    flows: np.ndarray,
    values: np.ndarray,
    sinks: np.ndarray,
    s: int,
    u: int,
    w: int,
    t: int,
    gamma: int,
    need: int,
) -> int:
    """Split off ``gamma`` units of the arc pair ``u -> w -> t`` into an arc ``u -> t`` (a
    negative ``gamma`` undoes a split); flow moves along with the capacity where it can and
    the flows are repaired towards ``need`` (:func:`repair`: the value of the first sink
    short of it, else ``need``)."""
    cap[u, w] -= gamma
    cap[w, t] -= gamma
    cap[u, t] += gamma
    for i in range(len(sinks)):
        f = flows[i]
        if gamma > 0:
            moved = min(gamma, f[u, w], f[w, t])
            f[u, w] -= moved
            f[w, t] -= moved
            f[u, t] += moved
        else:
            moved = min(-gamma, f[u, t])
            f[u, t] -= moved
            f[u, w] += moved
            f[w, t] += moved
    arcs = np.array([[u, w], [w, t], [u, t]], dtype=np.int64)
    return repair(cap, flows, values, sinks, s, arcs, need)
