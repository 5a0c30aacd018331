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


def nccl_rings(topology: Topology, *, most: int = 16) -> tuple[tuple[int, ...], ...]:
    """Rings as NCCL builds its channels, at most ``most`` of them.

    - Several boxes whose ranks each have a NIC: one ring per local rank ``c``, entering every
      box at local rank ``c`` and leaving it from the next local rank whose NIC is on the same
      rail (the same first switch), so rings cross boxes rail to rail and together use every
      NIC once each way; within a box the ring visits the other ranks in local order.
    - Ranks joined by direct links (DGX-1, MI250): Hamiltonian cycles found one after another,
      each taking one of the parallel links (NVLinks, xGMI) of every hop it uses, until no
      cycle is left over the remaining links.
    - Otherwise (an NVSwitch box, one NIC per box): the single :func:`ring_order`.
    """
    rings = _rail_rings(topology) or _link_rings(topology, most)
    return tuple(rings[:most]) if rings else (ring_order(topology),)


def _rail_rings(topology: Topology) -> list[tuple[int, ...]]:
    n = topology.nranks
    rail: list[int | None] = [None] * n
    for link in topology.links:
        if link.src < n and topology.nodes[link.dst].kind is NodeKind.NIC:
            ups = [up.dst for up in topology.out_links(link.dst)
                   if topology.nodes[up.dst].kind is NodeKind.SWITCH]
            rail[link.src] = min(ups) if ups else None
    boxes: dict[int, list[int]] = {}
    for r in range(n):
        boxes.setdefault(topology.box_of(r), []).append(r)
    size = len(boxes[topology.box_of(0)])
    if (topology.nboxes < 2 or any(r is None for r in rail)
            or any(len(m) != size for m in boxes.values())):
        return []
    members, rings = boxes[topology.box_of(0)], []
    for c in range(size):
        out = next((d for d in range(1, size)
                    if rail[members[(c + d) % size]] == rail[members[c]]), None)
        if out is None:
            return []
        leave = (c + out) % size
        inner = [c] + [x for x in range(size) if x not in (c, leave)] + [leave]
        rings.append(tuple(m[x] for m in boxes.values() for x in inner))
    return rings


def _link_rings(topology: Topology, most: int) -> list[tuple[int, ...]]:
    n = topology.nranks
    left = np.zeros((n, n))
    for link in topology.links:
        if link.src < n and link.dst < n:
            left[link.src, link.dst] += link.count
    rings: list[tuple[int, ...]] = []
    while len(rings) < most and n > 2:
        cycle = _hamiltonian_cycle(left > 0, left)
        if cycle is None:
            break
        rings.append(cycle)
        for i, u in enumerate(cycle):
            left[u, cycle[(i + 1) % n]] -= 1
    return rings
