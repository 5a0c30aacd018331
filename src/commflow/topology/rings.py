"""Ring orders: in which order ranks should pass data around a ring on a given topology."""

from __future__ import annotations

import numpy as np

from commflow.topology.graph import NodeKind, Topology

SEARCH_LIMIT = 200_000
"""Depth-first search expansions before :func:`ring_order` settles for the best cycle found."""


def ring_order(topology: Topology) -> tuple[int, ...]:
    """An order of the ranks for ring algorithms: a directed Hamiltonian cycle over direct
    rank-to-rank links whose slowest link is as fast as possible (NCCL's rings on DGX-1
    follow NVLinks the same way). When ranks are not all joined by direct links (they meet
    through switches, as in NVSwitch boxes), or no cycle is found within
    :data:`SEARCH_LIMIT` expansions, each box's ranks are ordered by such a cycle of their own
    and the boxes follow each other (ranks keep their order where a box has none)."""
    n = topology.nranks
    bw = np.zeros((n, n))
    for link in topology.links:
        if link.src < n and link.dst < n:
            bw[link.src, link.dst] = link.bandwidth
    order = _best_cycle(bw)
    if order is not None or topology.nboxes == 1:
        return order or tuple(range(n))
    boxes: dict[int, list[int]] = {}
    for r in range(n):
        boxes.setdefault(topology.box_of(r), []).append(r)
    chained: list[int] = []
    for members in boxes.values():
        inner = _best_cycle(bw[np.ix_(members, members)]) or tuple(range(len(members)))
        chained += [members[i] for i in inner]
    return tuple(chained)


def _best_cycle(bw: np.ndarray) -> tuple[int, ...] | None:
    """The fastest-bottleneck Hamiltonian cycle over ``bw > 0`` if it beats the identity
    order, the identity if that is as good, ``None`` if there is none."""
    n = len(bw)
    identity = tuple(range(n))
    if n <= 3:
        return identity
    if not (bw > 0).any(axis=1).all():
        return None
    best: tuple[int, ...] | None = None
    for threshold in sorted({float(b) for b in bw[bw > 0].ravel()}, reverse=True):
        cycle = _hamiltonian_cycle(bw >= threshold, bw)
        if cycle is not None:
            best = cycle
            break
    if best is None:
        return None
    return identity if _bottleneck(identity, bw) >= _bottleneck(best, bw) else best


def _bottleneck(order: tuple[int, ...], bw: np.ndarray) -> float:
    return min(bw[order[i], order[(i + 1) % len(order)]] for i in range(len(order)))


def _hamiltonian_cycle(allowed: np.ndarray, bw: np.ndarray) -> tuple[int, ...] | None:
    """A Hamiltonian cycle from rank 0 using ``allowed[u][v]`` edges (fastest first), or
    ``None``."""
    n = len(allowed)
    succ = [sorted(np.flatnonzero(allowed[u]).tolist(), key=lambda v, u=u: (-bw[u, v], v))
            for u in range(n)]
    path = [0]
    used = [False] * n
    used[0] = True
    stack = [iter(succ[0])]
    expansions = 0
    while stack:
        expansions += 1
        if expansions > SEARCH_LIMIT:
            return None
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            used[path.pop()] = False
            continue
        if used[nxt]:
            continue
        path.append(nxt)
        used[nxt] = True
        if len(path) == n:
            if allowed[nxt, 0]:
                return tuple(path)
            used[path.pop()] = False
            continue
        stack.append(iter(succ[nxt]))
    return None


def rail_rings(topology: Topology) -> tuple[tuple[int, ...], ...]:
    """NCCL's rings on a cluster whose ranks each have a NIC of their own (DGX A100/H100):
    one ring per local rank ``c``, which enters every box at local rank ``c`` and leaves it
    from the next local rank whose NIC is on the same rail (the same first switch), so that
    the ring crosses boxes rail to rail and the rings together use every NIC once each way.
    Within a box the ring visits the other ranks in local order. Topologies without a NIC per
    rank, or with one box, get the single :func:`ring_order`."""
    n = topology.nranks
    rail = [None] * n
    for link in topology.links:
        if link.src < n and topology.nodes[link.dst].kind is NodeKind.NIC:
            ups = [up.dst for up in topology.out_links(link.dst)
                   if topology.nodes[up.dst].kind is NodeKind.SWITCH]
            rail[link.src] = min(ups) if ups else None
    boxes: dict[int, list[int]] = {}
    for r in range(n):
        boxes.setdefault(topology.box_of(r), []).append(r)
    size = len(next(iter(boxes.values())))
    if (topology.nboxes < 2 or any(r is None for r in rail)
            or any(len(m) != size for m in boxes.values())):
        return (ring_order(topology),)
    rings = []
    for c in range(size):
        members = boxes[0]
        out = next((d for d in range(1, size) if rail[members[(c + d) % size]] == rail[members[c]]),
                   None)
        if out is None:
            return (ring_order(topology),)
        leave = (c + out) % size
        inner = [c] + [x for x in range(size) if x not in (c, leave)] + [leave]
        rings.append(tuple(m[x] for m in boxes.values() for x in inner))
    return tuple(rings)
