"""Synthetic topologies: ring, line, fully connected, single switch, torus and fat-tree.

Every preset takes keyword-only ``bandwidth`` (bytes/s per link per direction, default
:data:`DEFAULT_BANDWIDTH` = 25e9) and ``latency`` (seconds per link, default
:data:`DEFAULT_LATENCY` = 1e-6). These defaults are modelling choices, not measurements.
Ranks are named ``r<i>``; nodes carry no box except in :func:`switch`, where the ranks and their
switch form box 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

from commflow.errors import TopologyError
from commflow.topology.graph import Link, Node, NodeKind, Topology, duplex, make_topology

DEFAULT_BANDWIDTH = 25e9
"""Default per-link, per-direction bandwidth of the synthetic presets, bytes/s."""

DEFAULT_LATENCY = 1e-6
"""Default per-link latency of the synthetic presets, seconds."""


def _check_count(what: str, n: int, minimum: int = 1) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise TopologyError(f"{what} needs an integer >= {minimum}, got {n!r}")


def _ranks(n: int, box: int | None = None) -> list[Node]:
    return [Node(i, NodeKind.RANK, f"r{i}", box) for i in range(n)]


def _undirected(
    name: str,
    nodes: list[Node],
    pairs: Iterable[tuple[int, int]],
    bandwidth: float,
    latency: float,
) -> Topology:
    links: list[Link] = []
    for a, b in pairs:
        links += duplex(a, b, bandwidth, latency)
    return make_topology(name, nodes, links)


def line(
    n: int, *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY
) -> Topology:
    """``n`` ranks in a line: duplex links ``i <-> i+1``."""
    _check_count("line(n)", n)
    return _undirected(
        f"line{n}", _ranks(n), ((i, i + 1) for i in range(n - 1)), bandwidth, latency
    )


def ring(
    n: int, *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY
) -> Topology:
    """``n`` ranks in a ring: duplex links ``i <-> (i+1) mod n``; for ``n <= 2`` the same
    links as :func:`line` (no doubled link)."""
    _check_count("ring(n)", n)
    npairs = n if n > 2 else n - 1
    pairs = ((i, (i + 1) % n) for i in range(npairs))
    return _undirected(f"ring{n}", _ranks(n), pairs, bandwidth, latency)


def fully_connected(
    n: int, *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY
) -> Topology:
    """``n`` ranks with a duplex link between every pair."""
    _check_count("fully_connected(n)", n)
    pairs = itertools.combinations(range(n), 2)
    return _undirected(f"fully-connected{n}", _ranks(n), pairs, bandwidth, latency)


def switch(
    n: int, *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY
) -> Topology:
    """``n`` ranks, each with a duplex link to one switch (node ``n``, named ``sw``); the ranks
    and the switch are box 0."""
    _check_count("switch(n)", n)
    nodes = [*_ranks(n, box=0), Node(n, NodeKind.SWITCH, "sw", 0)]
    return _undirected(f"switch{n}", nodes, ((i, n) for i in range(n)), bandwidth, latency)


def torus(
    dims: Sequence[int], *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY
) -> Topology:
    """A torus with ``dims`` (e.g. ``(4, 4)``): ranks in row-major order of their coordinates
    (last coordinate fastest), a duplex link to the next rank along each dimension with
    wrap-around; a dimension of size <= 2 gets no wrap-around link (it would double a link)."""
    dims = tuple(dims)
    if not dims:
        raise TopologyError("torus(dims) needs at least one dimension, e.g. (4, 4)")
    for d in dims:
        _check_count(f"torus{dims} dimension", d)
    n = math.prod(dims)
    strides = [math.prod(dims[k + 1 :]) for k in range(len(dims))]
    pairs = []
    for rank in range(n):
        for size, stride in zip(dims, strides, strict=True):
            coord = rank // stride % size
            if size > 2 or coord + 1 < size:
                pairs.append((rank, rank + ((coord + 1) % size - coord) * stride))
    name = "torus" + "x".join(map(str, dims))
    return _undirected(name, _ranks(n), pairs, bandwidth, latency)


def fat_tree(
    k: int, *, bandwidth: float = DEFAULT_BANDWIDTH, latency: float = DEFAULT_LATENCY
) -> Topology:
    """Three-level k-ary fat-tree (Al-Fares, Loukissas, Vahdat, SIGCOMM 2008).

    ``k`` pods, each with ``k/2`` edge and ``k/2`` aggregation switches; ``(k/2)^2`` core
    switches; ``k^3/4`` hosts (the ranks), ``k/2`` per edge switch, numbered pod by pod, edge
    switch by edge switch. Every edge switch links to every aggregation switch of its pod;
    aggregation switch ``a`` of each pod links to core switches ``a*k/2 .. a*k/2 + k/2 - 1``.
    Node order: hosts, then edge (``edge<pod>.<i>``), aggregation (``agg<pod>.<i>``) and core
    (``core<i>``) switches. ``k`` must be even and >= 2 (``TopologyError`` otherwise).
    """
    _check_count("fat_tree(k)", k, minimum=2)
    if k % 2:
        raise TopologyError(f"fat_tree(k) needs an even k, got {k}")
    half = k // 2
    nhosts = k * half * half
    nodes = _ranks(nhosts)

    def add(kind_name: str, count: int) -> list[int]:
        start = len(nodes)
        for i in range(count):
            name = f"{kind_name}{i // half}.{i % half}" if kind_name != "core" else f"core{i}"
            nodes.append(Node(start + i, NodeKind.SWITCH, name))
        return list(range(start, start + count))

    edges = add("edge", k * half)
    aggs = add("agg", k * half)
    cores = add("core", half * half)
    pairs = []
    for pod in range(k):
        for e in range(half):
            edge = edges[pod * half + e]
            first_host = (pod * half + e) * half
            pairs += [(first_host + h, edge) for h in range(half)]
            pairs += [(edge, aggs[pod * half + a]) for a in range(half)]
        for a in range(half):
            pairs += [(aggs[pod * half + a], cores[a * half + c]) for c in range(half)]
    return _undirected(f"fat-tree{k}", nodes, pairs, bandwidth, latency)
