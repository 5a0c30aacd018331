"""Independent references for the bound tests: the cut formulas of REFERENCES.md enumerated
over every node subset, and rank-hop distances and hop latencies by plain graph walks."""

from __future__ import annotations

import itertools
import math

from commflow.collectives import Collective
from commflow.topology import Topology

ENTERING = {Collective.REDUCESCATTER, Collective.REDUCE, Collective.GATHER}
"""Collectives whose cuts count bandwidth entering S."""


def crossing(topology: Topology, inside: set[int], *, entering: bool) -> float:
    """Bandwidth (bytes/s) of the links leaving ``inside`` (entering it when ``entering``)."""
    total = 0.0
    for link in topology.links:
        tail, head = (link.dst, link.src) if entering else (link.src, link.dst)
        if tail in inside and head not in inside:
            total += link.bandwidth
    return total


def weight(kind: Collective, nranks: int, inside: set[int], root: int) -> int:
    """Blocks that must cross the boundary of ``inside`` (0: the cut does not constrain)."""
    held = sum(1 for r in range(nranks) if r in inside)
    if kind in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        return held if held < nranks else 0
    if kind in (Collective.BROADCAST, Collective.REDUCE):
        return int(root in inside and held < nranks)
    if kind in (Collective.SCATTER, Collective.GATHER):
        return nranks - held if root in inside else 0
    return held * (nranks - held)


def block_bytes(kind: Collective, nranks: int, size: float) -> float:
    """Bytes per block: the whole buffer for broadcast/reduce, else ``size / N``."""
    return size if kind in (Collective.BROADCAST, Collective.REDUCE) else size / nranks


def cut_time(topology: Topology, kind: Collective, inside: set[int], size: float, root: int):
    """Seconds the cut ``inside`` forces (``inf`` when blocks must cross but no link does)."""
    w = weight(kind, topology.nranks, inside, root)
    if w == 0:
        return 0.0
    bw = crossing(topology, inside, entering=kind in ENTERING)
    return math.inf if bw == 0 else w * block_bytes(kind, topology.nranks, size) / bw


def brute_force(topology: Topology, kind: Collective, size: float, root: int = 0) -> float:
    """Largest cut time over every node subset."""
    nodes = range(topology.nnodes)
    return max(
        cut_time(topology, kind, set(s), size, root)
        for k in range(topology.nnodes + 1)
        for s in itertools.combinations(nodes, k)
    )


def min_hop_latency(topology: Topology) -> float:
    """Smallest latency sum of a simple path rank -> switches/NICs only -> another rank."""
    best = math.inf

    def walk(node: int, start: int, total: float, seen: set[int]) -> None:
        nonlocal best
        for link in topology.out_links(node):
            if link.dst in seen:
                continue
            if link.dst < topology.nranks:
                best = min(best, total + link.latency)
            else:
                walk(link.dst, start, total + link.latency, seen | {link.dst})

    for r in range(topology.nranks):
        walk(r, r, 0.0, {r})
    return best


def hop_matrix(topology: Topology) -> list[list[float]]:
    """Rank-hop distances by Floyd-Warshall over the one-hop relation."""
    n = topology.nranks
    hops = [[0.0 if i == j else math.inf for j in range(n)] for i in range(n)]
    for r in range(n):
        stack, seen = [r], {r}
        while stack:
            for link in topology.out_links(stack.pop()):
                if link.dst < n:
                    hops[r][link.dst] = min(hops[r][link.dst], 1.0)
                elif link.dst not in seen:
                    seen.add(link.dst)
                    stack.append(link.dst)
    for k, i, j in itertools.product(range(n), repeat=3):
        hops[i][j] = min(hops[i][j], hops[i][k] + hops[k][j])
    return hops
