"""The compiled loop of the verifier's race check (numba).

For one channel ``r``, :func:`reach` computes for every step ``s`` the highest position of a
step of ``r`` that happens before ``s`` or is ``s`` (-1 when none): the ``r`` entry of ``s``'s
vector clock, computed alone in one pass over a topological order of the steps. A step's
predecessors are the previous step of its channel, its explicit dependencies and, for a
receive, the send it matches, as in the verifier's execution.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def reach(
    order: np.ndarray,
    first: np.ndarray,
    dep_ptr: np.ndarray,
    dep_idx: np.ndarray,
    sender: np.ndarray,
    group: np.ndarray,
    position: np.ndarray,
    r: int,
    out: np.ndarray,
) -> None:
    """Fill ``out`` (one int64 per step) with the ``r`` entry of each step's vector clock,
    visiting steps in ``order`` (a topological order of the step graph)."""
    for k in range(len(order)):
        s = order[k]
        best = -1
        if not first[s]:
            best = out[s - 1]
        for e in range(dep_ptr[s], dep_ptr[s + 1]):
            v = out[dep_idx[e]]
            if v > best:
                best = v
        m = sender[s]
        if m >= 0 and out[m] > best:
            best = out[m]
        if group[s] == r and position[s] > best:
            best = position[s]
        out[s] = best
