"""Routing on a topology: equal-cost shortest paths (ECMP) and rank-to-rank hop counts.

A path is a tuple of link indices into ``topology.links``. Paths are shortest by hop count and
never transit a compute rank when a path through switches/NICs only exists; otherwise (direct
networks such as a ring, a torus, or two DGX-1 GPUs without an NVLink) they may transit ranks.

Distances are computed once per destination and cached per topology (the cache dies with the
topology), so ``routes`` costs one breadth-first search per new destination and then time
proportional to the paths it returns.
"""

from __future__ import annotations

import weakref
from functools import cached_property

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

from commflow.errors import TopologyError
from commflow.topology.graph import NodeKind, Topology

Path = tuple[int, ...]
"""A path: link indices into ``topology.links``, in order from source to destination."""


class _Router:
    """Per-topology routing state: link adjacency and per-destination distance tables."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        n = topology.nnodes
        self.is_rank = [node.kind is NodeKind.RANK for node in topology.nodes]
        src = np.array([lk.src for lk in topology.links], dtype=np.int64)
        dst = np.array([lk.dst for lk in topology.links], dtype=np.int64)
        ones = np.ones(len(src))
        self.forward = csr_matrix((ones, (src, dst)), shape=(n, n))
        # Reversed graphs: searching from a destination walks links backwards. The switch-only
        # one keeps a link only when its head is a switch/NIC, so the search never expands
        # through a rank.
        self.reverse_all = csr_matrix((ones, (dst, src)), shape=(n, n))
        via_switch = ~np.array(self.is_rank, dtype=bool)[dst]
        self.reverse_switched = csr_matrix(
            (ones[via_switch], (dst[via_switch], src[via_switch])), shape=(n, n)
        )
        self.out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.into: list[list[int]] = [[] for _ in range(n)]
        for i, lk in enumerate(topology.links):
            self.out[lk.src].append((i, lk.dst))
            self.into[lk.dst].append(lk.src)
        self.switched: dict[int, list[int]] = {}
        self.direct: dict[int, list[int]] = {}

    def distances(self, dst: int, *, switched: bool) -> list[int]:
        """Hops from every node to ``dst`` (-1 if unreachable); ``switched``: through
        switches/NICs only."""
        cache = self.switched if switched else self.direct
        dist = cache.get(dst)
        if dist is None:
            if switched:
                preds = self.into[dst]
                d = np.full(self.topology.nnodes, np.inf)
                if preds:
                    d = dijkstra(
                        self.reverse_switched, indices=preds, unweighted=True, min_only=True
                    )
                    d = d + 1
                d[dst] = 0
            else:
                d = dijkstra(self.reverse_all, indices=dst, unweighted=True)
            dist = np.where(np.isinf(d), -1, d).astype(np.int64).tolist()
            cache[dst] = dist
        return dist

    def prefetch(self, destinations: list[int]) -> None:
        """Switch-only distances to many destinations in one batched search."""
        todo = [d for d in dict.fromkeys(destinations) if d not in self.switched]
        preds = sorted({p for d in todo for p in self.into[d]})
        if not todo or not preds:
            return
        row = {p: i for i, p in enumerate(preds)}
        table = dijkstra(self.reverse_switched, indices=preds, unweighted=True)
        for d in todo:
            rows = [row[p] for p in self.into[d]]
            dist = table[rows].min(axis=0) + 1 if rows else np.full(self.topology.nnodes, np.inf)
            dist[d] = 0
            self.switched[d] = np.where(np.isinf(dist), -1, dist).astype(np.int64).tolist()

    def routes(self, src: int, dst: int) -> tuple[Path, ...]:
        if src == dst:
            return ((),)
        switched = True
        dist = self.distances(dst, switched=True)
        if dist[src] < 0:
            switched = False
            dist = self.distances(dst, switched=False)
        if dist[src] < 0:
            t = self.topology
            raise TopologyError(
                f"{t.name}: no route from node {src} ({t.nodes[src].name}) to node {dst} "
                f"({t.nodes[dst].name}); check the topology's links"
            )
        is_rank, out = self.is_rank, self.out
        paths: list[Path] = []
        stack: list[tuple[int, Path]] = [(src, ())]
        while stack:  # depth-first, paths in the order of the links leaving each node
            node, prefix = stack.pop()
            if node == dst:
                paths.append(prefix)
                continue
            want = dist[node] - 1
            if want == 0:  # the last hop: one link at most, found without a scan
                link = self.topology._index.get((node, dst))
                if link is not None:
                    stack.append((dst, (*prefix, link)))
                continue
            for link, nxt in reversed(out[node]):
                if dist[nxt] == want and not (switched and is_rank[nxt] and nxt != dst):
                    stack.append((nxt, (*prefix, link)))
        return tuple(paths)

    @cached_property
    def rank_hops(self) -> np.ndarray:
        """``[src][dst]`` rank-to-rank hops with switches/NICs transparent (-1: unreachable)."""
        # A link leaving a rank costs 1, a link leaving a switch/NIC costs less than
        # 1/(2 * nnodes): a simple path's switch costs then sum to < 0.5, so the floor of the
        # cheapest distance is the fewest rank hops.
        t = self.topology
        fwd = self.forward.tocoo()
        cost = np.where(np.array(self.is_rank)[fwd.row], 1.0, 1.0 / (2 * t.nnodes + 1))
        graph = csr_matrix((cost, (fwd.row, fwd.col)), shape=fwd.shape)
        dist = dijkstra(graph, indices=np.arange(t.nranks))[:, : t.nranks]
        hops = np.floor(dist)
        return np.where(np.isinf(hops), -1, hops).astype(np.int64)


_ROUTERS: weakref.WeakKeyDictionary[Topology, _Router] = weakref.WeakKeyDictionary()


def _router(topology: Topology) -> _Router:
    router = _ROUTERS.get(topology)
    if router is None:
        router = _ROUTERS[topology] = _Router(topology)
    return router


def _check_node(topology: Topology, node: int, role: str) -> None:
    if isinstance(node, bool) or not isinstance(node, int | np.integer):
        raise TopologyError(f"{topology.name}: route {role} must be a node id, got {node!r}")
    if not 0 <= node < topology.nnodes:
        raise TopologyError(
            f"{topology.name}: route {role} {node} is not a node (ids 0..{topology.nnodes - 1})"
        )


def routes(topology: Topology, src: int, dst: int) -> tuple[Path, ...]:
    """All equal-cost shortest paths (by hop count) from node ``src`` to node ``dst``.

    Each path is a tuple of link indices into ``topology.links``; ``src == dst`` gives the one
    empty path. Paths avoid transiting ranks whenever a path through switches/NICs only exists.
    Raises ``TopologyError`` when a node id is invalid or ``dst`` is unreachable from ``src``.
    """
    _check_node(topology, src, "source")
    _check_node(topology, dst, "destination")
    return _router(topology).routes(int(src), int(dst))


def prefetch_routes(topology: Topology, destinations) -> None:
    """Prepare :func:`routes` to many ``destinations`` (node ids) with one batched search
    instead of one per destination; purely an optimisation."""
    for d in destinations:
        _check_node(topology, int(d), "destination")
    _router(topology).prefetch([int(d) for d in destinations])


def rank_hops(topology: Topology) -> np.ndarray:
    """``[src][dst]`` number of rank-to-rank hops (int matrix over the ranks).

    A hop is one transfer from a rank to another rank through switches/NICs only (switches are
    transparent); ``-1`` marks an unreachable pair, ``0`` the diagonal.
    """
    return _router(topology).rank_hops.copy()


def diameter(topology: Topology) -> int:
    """Largest :func:`rank_hops` over all rank pairs (the latency lower bound in steps).

    Raises ``TopologyError`` naming a pair when some rank cannot reach another.
    """
    hops = _router(topology).rank_hops
    unreachable = np.argwhere(hops < 0)
    if len(unreachable):
        src, dst = unreachable[0]
        raise TopologyError(
            f"{topology.name}: rank {src} cannot reach rank {dst}, so the diameter is infinite; "
            "check the topology's links"
        )
    return int(hops.max())
