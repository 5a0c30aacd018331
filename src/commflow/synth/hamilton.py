"""The cheapest directed Hamiltonian cycle of a small graph: the Held-Karp dynamic programme,
compiled (numba). ``best[S, v]`` is the cheapest path from rank 0 through the ranks of set
``S`` ending at ``v``; closing it back to 0 gives every cycle, so the result is exact. Time
``2**n * n**2``, memory ``2**n * n`` entries: :data:`MOST_RANKS` keeps it under a second and
16 MiB.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MOST_RANKS = 16
"""Most ranks :func:`cheapest_cycle` takes."""


@njit(cache=True, nogil=True)
def _held_karp(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(best, previous)`` over every set of ranks containing rank 0 (see the module);
    ``cost[u, v]`` is ``inf`` where there is no edge."""
    n = cost.shape[0]
    full = 1 << n
    best = np.full((full, n), np.inf)
    previous = np.full((full, n), -1, dtype=np.int64)
    best[1, 0] = 0.0
    for mask in range(1, full, 2):  # sets holding rank 0
        for v in range(n):
            here = best[mask, v]
            if here == np.inf:
                continue
            for u in range(1, n):
                if mask & (1 << u) or cost[v, u] == np.inf:
                    continue
                grown = mask | (1 << u)
                if here + cost[v, u] < best[grown, u]:
                    best[grown, u] = here + cost[v, u]
                    previous[grown, u] = v
    return best, previous


def cheapest_cycle(cost: np.ndarray) -> tuple[float, tuple[int, ...]] | None:
    """The cheapest cycle through every rank once under ``cost`` (``[src][dst]``, ``inf``
    where there is no edge), as ``(cost, ranks in order from 0)``; ``None`` when there is
    none. Raises ``ValueError`` beyond :data:`MOST_RANKS` ranks."""
    n = len(cost)
    if n > MOST_RANKS:
        raise ValueError(f"cheapest_cycle takes at most {MOST_RANKS} ranks, got {n}")
    if n < 2:
        return None
    best, previous = _held_karp(np.ascontiguousarray(cost, dtype=np.float64))
    full = (1 << n) - 1
    closed = best[full] + cost[:, 0]
    end = int(np.argmin(closed))
    if not np.isfinite(closed[end]):
        return None
    order, mask, v = [], full, end
    while v >= 0:
        order.append(v)
        v, mask = int(previous[mask, v]), mask ^ (1 << v)
    return float(closed[end]), tuple(reversed(order))
