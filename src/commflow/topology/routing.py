"""Routing on a topology: equal-cost shortest paths (ECMP), bandwidth-aware splits, and
rank-to-rank hop counts.

A path is a tuple of link indices into ``topology.links``. Paths are shortest by hop count and
never transit a compute rank when a path through switches/NICs only exists; otherwise (direct
networks such as a ring, a torus, or two DGX-1 GPUs without an NVLink) they may transit ranks.

:func:`weighted_routes` is how traffic actually moves (the simulator and synthesis use it):
ECMP, each shortest path carrying an equal share, unless a maximum flow through switches and
NICs only gives the pair more bandwidth (a slow switch offering a path with as few hops as a
fast one, two switches or NICs side by side, a slow direct link beside a fast switch); then the
flow's paths, each carrying its share of the flow (adaptive routing that fills links in
proportion to what they can take). Traffic between two ranks of one box never leaves the box
on such a flow path, as NCCL never loops intra-node traffic through the network. Only
rank-to-rank transfers take flow paths; those to or from switches (in-network aggregation)
keep ECMP, whose shortest routes are what a switch tree is built on. Once some pair needs a
flow, the flow-routed pairs of the topology are routed jointly (:mod:`._joint`: minimum
congestion with every rank pair sending), where that loads the busiest link less than their
own flows do.

Distances are computed once per destination and cached per topology (the cache dies with the
topology), so ``routes`` costs one breadth-first search per new destination and then time
proportional to the paths it returns.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from functools import cached_property

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components, dijkstra, maximum_flow

from commflow.errors import TopologyError
from commflow.topology._joint import MOST_VARIABLES, decompose, joint_routes
from commflow.topology.graph import NodeKind, Topology

Path = tuple[int, ...]
"""A path: link indices into ``topology.links``, in order from source to destination."""

_CAPACITY_STEPS = 2**20
"""Largest integer capacity of a link in the max-flow searches."""

_GAIN = 1e-6
"""Relative bandwidth a flow must add over ECMP for :func:`weighted_routes` to take it."""


class _Router:
    """Per-topology routing state: link adjacency and per-destination distance tables."""

    def __init__(self, topology: Topology) -> None:
        self._topology = weakref.ref(topology)
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
        self.weighted: dict[tuple[int, int], tuple[tuple[Path, float], ...]] = {}
        self.joint_done = False
        self.allowed: dict[int | None, np.ndarray] = {}
        self.components: dict[int | None, np.ndarray] = {}
        bandwidth = np.array([lk.bandwidth for lk in topology.links], dtype=np.float64)
        self.bandwidth = bandwidth
        self.unit = _unit(bandwidth)
        self.capacity = np.maximum(1, np.round(bandwidth / self.unit)).astype(np.int32)
        self.link_src, self.link_dst = src, dst

    @property
    def topology(self) -> Topology:
        """The topology routed. The router holds it weakly: it lives in :data:`_ROUTERS`,
        keyed weakly by that topology, so a strong reference here would keep every topology
        ever routed (and its router) alive."""
        topology = self._topology()
        if topology is None:
            raise RuntimeError("a router outlived its topology: report this as a bug")
        return topology

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

    def weighted_routes(self, src: int, dst: int) -> tuple[tuple[Path, float], ...]:
        """ECMP, or the max-flow paths when they carry more, routed jointly with every other
        such pair where that helps (see the module docstring)."""
        key = (src, dst)
        found = self.weighted.get(key)
        if found is None:
            found, flow = self._pair_routes(src, dst)
            if flow and not self.joint_done:
                self._route_jointly()
                found = self.weighted.get(key, found)
            self.weighted[key] = found
        return found

    def _pair_routes(self, src: int, dst: int) -> tuple[tuple[tuple[Path, float], ...], bool]:
        """The pair's own routes (ECMP or its maximum flow) and whether they are the flow."""
        paths = self.routes(src, dst)
        found = tuple((p, 1.0 / len(paths)) for p in paths)
        if src != dst and self.is_rank[src] and self.is_rank[dst]:
            flow = self._flow_routes(src, dst, _rate(found, self.bandwidth))
            if flow:
                return flow, True
        return found, False

    def _route_jointly(self) -> None:
        """Route every rank pair, the flow-routed ones jointly (:mod:`._joint`), into the
        cache, once per topology and only where the linear program stays small."""
        self.joint_done = True
        n = self.topology.nranks
        if n * (n - 1) * len(self.bandwidth) > MOST_VARIABLES:
            return
        pairs, flow_pairs = {}, []
        for u in range(n):
            for v in range(n):
                if u != v:
                    pairs[(u, v)], flow = self._pair_routes(u, v)
                    if flow:
                        flow_pairs.append((u, v))
        self.weighted.update(pairs)
        self.weighted.update(joint_routes(self.topology, pairs, flow_pairs, self._flow_links,
                                          self.link_src, self.link_dst, self.bandwidth))

    def _flow_links(self, src: int, dst: int) -> np.ndarray:
        """Mask of the links a flow from ``src`` to ``dst`` may use: through switches and NICs
        (of their box when they share one), or a direct link."""
        nodes = self.topology.nodes
        box = nodes[src].box if nodes[src].box == nodes[dst].box else None
        allowed = self._allowed(box).copy()
        allowed[[src, dst]] = True
        return (allowed[self.link_src] & allowed[self.link_dst]
                & (self.link_dst != src) & (self.link_src != dst))

    def _flow_routes(self, src: int, dst: int, ecmp: float) -> tuple[tuple[Path, float], ...]:
        """The paths of a maximum flow from ``src`` to ``dst`` through switches and NICs (and
        inside their box when they share one) with their shares, when it beats ``ecmp``
        bytes/s; else ``()``."""
        nodes = self.topology.nodes
        box = nodes[src].box if nodes[src].box == nodes[dst].box else None
        if self._most_flow(src, dst, box) <= ecmp * (1 + _GAIN):
            return ()
        keep = self._flow_links(src, dst)
        n = self.topology.nnodes
        graph = csr_matrix((self.capacity[keep], (self.link_src[keep], self.link_dst[keep])),
                           shape=(n, n))
        result = maximum_flow(graph, src, dst)
        if result.flow_value * self.unit <= ecmp * (1 + _GAIN):
            return ()
        arcs = result.flow.tocoo()
        flow: dict[int, dict[int, int]] = {}
        for u, v, f in zip(arcs.row.tolist(), arcs.col.tolist(), arcs.data.tolist(),
                           strict=True):
            if f > 0:
                flow.setdefault(u, {})[v] = f
        return decompose(self.topology, flow, src, dst, result.flow_value)

    def _allowed(self, box: int | None) -> np.ndarray:
        """Switches and NICs a flow may cross: all, or those of ``box``."""
        found = self.allowed.get(box)
        if found is None:
            nodes = self.topology.nodes
            found = np.array([not rank and (box is None or n.box == box)
                              for n, rank in zip(nodes, self.is_rank, strict=True)])
            self.allowed[box] = found
        return found

    def _components(self, box: int | None) -> np.ndarray:
        """Connected component of every allowed switch/NIC (-1 for other nodes)."""
        found = self.components.get(box)
        if found is None:
            allowed = self._allowed(box)
            keep = allowed[self.link_src] & allowed[self.link_dst]
            n = self.topology.nnodes
            graph = csr_matrix((np.ones(int(keep.sum())),
                                (self.link_src[keep], self.link_dst[keep])), shape=(n, n))
            labels = connected_components(graph, directed=False)[1]
            found = np.where(allowed, labels, -1)
            self.components[box] = found
        return found

    def _most_flow(self, src: int, dst: int, box: int | None) -> float:
        """An upper bound on the flow from ``src`` to ``dst`` through allowed switches and
        NICs: a direct link, plus per switch component the lesser of what ``src`` sends into
        it and what ``dst`` receives from it."""
        label = self._components(box)
        sent: Counter[int] = Counter()
        direct = 0.0
        for link, nxt in self.out[src]:
            if nxt == dst:
                direct += self.bandwidth[link]
            elif label[nxt] >= 0:
                sent[label[nxt]] += self.bandwidth[link]
        got: Counter[int] = Counter()
        for prev in self.into[dst]:
            if label[prev] >= 0:
                got[label[prev]] += self.bandwidth[self.topology._index[(prev, dst)]]
        return direct + sum(min(v, got[c]) for c, v in sent.items())

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


def _unit(bandwidth: np.ndarray) -> float:
    """Bytes/s of one integer capacity unit: the bandwidths' greatest common divisor when it
    keeps every capacity within :data:`_CAPACITY_STEPS` (exact), else the fastest link over
    :data:`_CAPACITY_STEPS`."""
    if not len(bandwidth):
        return 1.0
    top = float(bandwidth.max())
    whole = [int(b) for b in bandwidth if float(b).is_integer()]
    if len(whole) == len(bandwidth):
        step = math.gcd(*whole)
        if top / step <= _CAPACITY_STEPS:
            return float(step)
    return top / _CAPACITY_STEPS


def _rate(routes: tuple[tuple[Path, float], ...], bandwidth: np.ndarray) -> float:
    """Bytes/s of one transfer split over ``routes``: its busiest link's limit."""
    load: Counter[int] = Counter()
    for path, share in routes:
        for link in path:
            load[link] += share
    return min((bandwidth[link] / share for link, share in load.items()), default=np.inf)


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


def weighted_routes(topology: Topology, src: int, dst: int) -> tuple[tuple[Path, float], ...]:
    """How a transfer from node ``src`` to node ``dst`` moves: ``(path, fraction of the
    bytes)`` pairs whose fractions sum to 1.

    ECMP (:func:`routes`, equal fractions) unless both nodes are ranks and a maximum flow
    through switches and NICs only (staying inside the box when both are in the same one)
    carries more; then the paths of that flow, each with its share, or of all such pairs'
    joint routing where it lowers the busiest link's load (module docstring). Raises
    ``TopologyError`` as :func:`routes`.
    """
    _check_node(topology, src, "source")
    _check_node(topology, dst, "destination")
    return _router(topology).weighted_routes(int(src), int(dst))


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
