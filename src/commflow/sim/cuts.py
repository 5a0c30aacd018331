"""Cuts of a topology and the exact maximum-flow searches that find the binding ones.

A cut is a node set S (ranks, switches and NICs alike); its bandwidth is the sum of the links
leaving S. Each search returns the cut that maximises ``weight / bandwidth`` for its
collective, where ``weight`` counts the blocks that must cross the boundary:

- allgather (ForestColl, Zhao et al. 2024): weight ``|S ∩ ranks|``, S holding some but not
  every rank;
- broadcast: weight 1, S holding the root but not every rank;
- scatter: weight ``|ranks \\ S|``, S holding the root;
- alltoall: weight ``|S ∩ ranks| * |ranks \\ S|``.

Reduce-scatter, reduce and gather are the same searches on the reversed network (bandwidth
entering S). The flow searches are exact: bandwidths are rescaled to integers with a common
unit (every bandwidth that is a multiple of 1e6 bytes/s gives small integers), the parametric
checks run ``scipy.sparse.csgraph.maximum_flow`` while capacities fit in int32 and networkx's
exact integer max-flow beyond that, and the ratio iteration is Dinkelbach's, which stops after
finitely many strictly improving cuts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, maximum_flow

from commflow.errors import TopologyError
from commflow.topology.graph import Topology

_INT32_MAX = 2**31 - 1
ENUMERATION_LIMIT = 20
"""Largest node count for which the alltoall bound enumerates every subset (2**20 cuts)."""


@dataclass(frozen=True)
class RatioCut:
    """A node set S, the blocks that must cross its boundary and the bandwidth there."""

    nodes: tuple[int, ...]
    """Sorted node ids of S."""
    weight: int
    """Blocks (shards, per-peer blocks, whole buffers) that must leave S."""
    capacity: int
    """Bandwidth leaving S in integer units of :attr:`FlowNetwork.unit`."""
    bandwidth: float
    """Bandwidth leaving S in bytes/s."""

    def seconds(self, block: float) -> float:
        """Time in seconds to move ``weight`` blocks of ``block`` bytes out of S."""
        return block * self.weight / self.bandwidth

    def beats(self, other: RatioCut) -> bool:
        """Whether this cut's ``weight / capacity`` is strictly larger (exact)."""
        return self.weight * other.capacity > other.weight * self.capacity


@dataclass(frozen=True)
class FlowNetwork:
    """A topology's links as exact integer capacities: link i carries ``capacity[i] * unit``."""

    topology: Topology
    """The topology the links come from."""
    reverse: bool
    """Whether every link is reversed (for bandwidth entering a set)."""
    src: np.ndarray
    """Link tails (int64), in the network's direction."""
    dst: np.ndarray
    """Link heads (int64), in the network's direction."""
    capacity: tuple[int, ...]
    """Link capacities in units."""
    unit: Fraction
    """Bytes/s of one capacity unit."""

    @property
    def nnodes(self) -> int:
        """Number of nodes of any kind."""
        return self.topology.nnodes

    @property
    def nranks(self) -> int:
        """Number of ranks (nodes ``0 .. nranks-1``)."""
        return self.topology.nranks

    def capacity_leaving(self, inside: np.ndarray) -> int:
        """Exact capacity (units) of the links leaving the node mask ``inside``."""
        crossing = np.flatnonzero(inside[self.src] & ~inside[self.dst])
        return sum(self.capacity[i] for i in crossing)

    def cut(self, inside: np.ndarray, weight: int) -> RatioCut:
        """The :class:`RatioCut` of node mask ``inside`` with ``weight`` blocks to move."""
        capacity = self.capacity_leaving(inside)
        nodes = tuple(int(i) for i in np.flatnonzero(inside))
        return RatioCut(nodes, weight, capacity, float(capacity * self.unit))

    def mask(self, nodes: Iterable[int]) -> np.ndarray:
        """Boolean node mask holding ``nodes``."""
        inside = np.zeros(self.nnodes, dtype=bool)
        inside[list(nodes)] = True
        return inside


def flow_network(topology: Topology, *, reverse: bool = False) -> FlowNetwork:
    """The links of ``topology`` as exact integer capacities (reversed when ``reverse``).

    Raises ``TopologyError`` when a bandwidth is not finite.
    """
    for link in topology.links:
        if not math.isfinite(link.bandwidth):
            raise TopologyError(
                f"{topology.name}: link {link.src} -> {link.dst} has bandwidth "
                f"{link.bandwidth}; lower bounds need finite bandwidths"
            )
    exact = [Fraction(link.bandwidth) for link in topology.links]
    denominator = math.lcm(*(f.denominator for f in exact)) if exact else 1
    numerators = [int(f * denominator) for f in exact]
    step = math.gcd(*numerators) if numerators else 1
    tails = np.array([link.src for link in topology.links], dtype=np.int64)
    heads = np.array([link.dst for link in topology.links], dtype=np.int64)
    if reverse:
        tails, heads = heads, tails
    return FlowNetwork(
        topology,
        reverse,
        tails,
        heads,
        tuple(n // step for n in numerators),
        Fraction(step, denominator),
    )


class _FlowGraph:
    """One max-flow instance over nodes ``0 .. n-1`` with integer arc capacities."""

    def __init__(self, n: int, src: np.ndarray, dst: np.ndarray, capacity: Sequence[int]):
        self._n = n
        self._scipy = max(capacity, default=0) <= _INT32_MAX
        if self._scipy:
            data = np.asarray(capacity, dtype=np.int32)
            self._csr = sp.csr_array((data, (src, dst)), shape=(n, n))
        else:
            import networkx as nx

            self._nx = nx.DiGraph()
            self._nx.add_nodes_from(range(n))
            for u, v, c in zip(src.tolist(), dst.tolist(), capacity, strict=True):
                self._nx.add_edge(u, v, capacity=c)

    def value(self, source: int, sink: int) -> int:
        """Maximum flow value from ``source`` to ``sink`` (capacity units)."""
        if self._scipy:
            return int(maximum_flow(self._csr, source, sink).flow_value)
        import networkx as nx

        return nx.maximum_flow_value(self._nx, source, sink)

    def source_side(self, source: int, sink: int) -> np.ndarray:
        """Node mask of the source side of a minimum ``source``-``sink`` cut."""
        side = np.zeros(self._n, dtype=bool)
        if not self._scipy:
            import networkx as nx

            side[list(nx.minimum_cut(self._nx, source, sink)[1][0])] = True
            return side
        residual = (self._csr - maximum_flow(self._csr, source, sink).flow).tocoo()
        keep = residual.data > 0
        arcs = sp.csr_array(
            (np.ones(int(keep.sum()), dtype=np.int8), (residual.row[keep], residual.col[keep])),
            shape=(self._n, self._n),
        )
        side[breadth_first_order(arcs, source, directed=True, return_predecessors=False)] = True
        return side


def _scaled(net: FlowNetwork, factor: int) -> list[int]:
    return [c * factor for c in net.capacity]


def _best(cuts: Iterable[RatioCut]) -> RatioCut:
    best: RatioCut | None = None
    for cut in cuts:
        if best is None or cut.beats(best):
            best = cut
    assert best is not None
    return best


def _connected(net: FlowNetwork, cut: RatioCut) -> RatioCut:
    """``cut`` itself; a ``TopologyError`` when blocks must cross it but no link does."""
    if cut.capacity == 0 and cut.weight > 0:
        side = "enter" if net.reverse else "leave"
        raise TopologyError(
            f"{net.topology.name}: no link can {side} nodes {list(cut.nodes)}, so the "
            f"collective cannot complete; connect them to the other ranks"
        )
    return cut


def _improved(net: FlowNetwork, new: RatioCut, old: RatioCut) -> RatioCut:
    """``new``, checked to be connected and strictly better than ``old`` (Dinkelbach step)."""
    if not new.beats(old):
        raise AssertionError(f"max-flow cut {new} does not improve on {old}")
    return _connected(net, new)


def allgather_search(net: FlowNetwork) -> list[RatioCut]:
    """Cuts tried by the exact allgather search, the binding one (max ``|S∩R| / B(S)``) last.

    For a trial rate x = B/k, a source s feeds every rank at x; every rank v receives
    ``maxflow(s, v) >= N*x`` iff no S has ``B(S) < x * |S∩R|``; a violating v's minimum cut
    is such an S and its ratio becomes the next x. Capacities are scaled by k so all stays
    integral. Raises ``TopologyError`` when some ranks cannot reach the others.
    """
    n, ranks = net.nnodes, net.nranks
    singles = [net.cut(net.mask([r]), 1) for r in range(ranks)]
    all_but = [net.cut(~net.mask([r]), ranks - 1) for r in range(ranks)]
    tried = [_connected(net, _best(singles + all_but))]
    source = n
    src = np.concatenate([net.src, np.full(ranks, source)])
    dst = np.concatenate([net.dst, np.arange(ranks)])
    while True:
        best = tried[-1]
        graph = _FlowGraph(n + 1, src, dst, _scaled(net, best.weight) + [best.capacity] * ranks)
        need = ranks * best.capacity
        violated = next((v for v in range(ranks) if graph.value(source, v) < need), None)
        if violated is None:
            return tried
        inside = graph.source_side(source, violated)[:n]
        tried.append(_improved(net, net.cut(inside, int(inside[:ranks].sum())), best))


def broadcast_cut(net: FlowNetwork, root: int) -> RatioCut:
    """The minimum ``root``-to-rank cut (weight 1): ``min over v != root of maxflow(root, v)``.

    Raises ``TopologyError`` when some rank cannot be reached from ``root``.
    """
    graph = _FlowGraph(net.nnodes, net.src, net.dst, net.capacity)
    flows = {v: graph.value(root, v) for v in range(net.nranks) if v != root}
    sink = min(flows, key=flows.__getitem__)
    return _connected(net, net.cut(graph.source_side(root, sink), 1))


def scatter_cut(net: FlowNetwork, root: int) -> RatioCut:
    """The binding scatter cut: S holding ``root`` with the largest ``|R \\ S| / B(S)``.

    For a trial rate x = B/k every rank v != root drains into a sink t at x; the root can
    feed them all (``maxflow(root, t) == (N-1)*x``) iff no S holding the root has
    ``B(S) < x * |R \\ S|``; otherwise the minimum cut is one and gives the next x.
    Raises ``TopologyError`` when some rank cannot be reached from ``root``.
    """
    n, ranks = net.nnodes, net.nranks
    others = [v for v in range(ranks) if v != root]
    start = [net.cut(net.mask([root]), ranks - 1)]
    start += [net.cut(~net.mask([v]), 1) for v in others]
    best = _connected(net, _best(start))
    sink = n
    src = np.concatenate([net.src, np.array(others, dtype=np.int64)])
    dst = np.concatenate([net.dst, np.full(len(others), sink)])
    while True:
        graph = _FlowGraph(
            n + 1, src, dst, _scaled(net, best.weight) + [best.capacity] * len(others)
        )
        if graph.value(root, sink) == len(others) * best.capacity:
            return best
        inside = graph.source_side(root, sink)[:n]
        best = _improved(net, net.cut(inside, ranks - int(inside[:ranks].sum())), best)


def alltoall_cut(net: FlowNetwork) -> tuple[RatioCut, bool]:
    """The alltoall cut with the largest ``|S∩R| * |R \\ S| / B(S)`` and whether it is exact.

    Up to :data:`ENUMERATION_LIMIT` nodes every subset is tried (exact). Beyond, the best of
    structured candidates, each with its complement: single ranks, aligned runs of 1, 2, 3, ...
    consecutive boxes, every switch/NIC with the nodes below it, the cuts the allgather search
    tries, and the lower half of the ranks by id (alone and with their boxes' switches and
    NICs). That is still a valid lower bound but may not be the largest cut. Raises
    ``TopologyError`` when ranks cannot reach each other.
    """
    if net.nnodes <= ENUMERATION_LIMIT:
        subsets = np.arange(1 << net.nnodes, dtype=np.uint32)
        members = np.stack([(subsets >> i & 1).astype(bool) for i in range(net.nnodes)])
        return _best_column(net, members), True
    candidates = _structured_candidates(net, allgather_search(net))
    return _best_column(net, np.concatenate([candidates, ~candidates], axis=1)), False


def _best_column(net: FlowNetwork, members: np.ndarray) -> RatioCut:
    """Best alltoall cut among the columns of ``members`` (node x candidate boolean)."""
    bandwidth = np.array(net.capacity, dtype=np.float64) * float(net.unit)
    leaving = np.zeros(members.shape[1])
    for u, v, b in zip(net.src.tolist(), net.dst.tolist(), bandwidth.tolist(), strict=True):
        leaving += b * (members[u] & ~members[v])
    inside = members[: net.nranks].sum(axis=0)
    weight = inside * (net.nranks - inside)
    stuck = np.flatnonzero((weight > 0) & (leaving == 0))
    column = (
        stuck[0]
        if stuck.size
        else np.argmax(np.divide(weight, leaving, out=np.zeros(len(weight)), where=weight > 0))
    )
    return _connected(net, net.cut(members[:, column], int(weight[column])))


def _structured_candidates(net: FlowNetwork, seeds: Sequence[RatioCut]) -> np.ndarray:
    """Candidate alltoall cuts as a node x candidate boolean matrix."""
    topo, ranks = net.topology, net.nranks
    sets: list[np.ndarray] = [net.mask([r]) for r in range(ranks)]
    sets += [net.mask(seed.nodes) for seed in seeds]
    boxes = sorted({node.box for node in topo.nodes if node.box is not None})
    box_of = np.array([-1 if node.box is None else boxes.index(node.box) for node in topo.nodes])
    for length in range(1, len(boxes) + 1):
        starts = range(0, len(boxes) - length + 1, length)
        sets += [(box_of >= i) & (box_of < i + length) for i in starts]
    half = net.mask(range(ranks // 2))
    half_boxes = np.isin(box_of, box_of[: ranks // 2]) & (box_of >= 0)
    sets += [half, half | half_boxes]
    sets += list(_below_switches(net))
    return np.stack(sets, axis=1)


def _below_switches(net: FlowNetwork) -> Iterable[np.ndarray]:
    """For every switch/NIC w: w and the nodes reached from it by stepping down in level.

    A node's level is its hop distance to the nearest rank (ranks are level 0), links taken
    in either direction.
    """
    n, ranks = net.nnodes, net.nranks
    neighbours: list[set[int]] = [set() for _ in range(n)]
    for u, v in zip(net.src.tolist(), net.dst.tolist(), strict=True):
        neighbours[u].add(v)
        neighbours[v].add(u)
    level = [0 if i < ranks else -1 for i in range(n)]
    frontier = list(range(ranks))
    while frontier:
        nxt = []
        for u in frontier:
            for v in neighbours[u]:
                if level[v] < 0:
                    level[v] = level[u] + 1
                    nxt.append(v)
        frontier = nxt
    below: dict[int, np.ndarray] = {}
    for w in sorted(range(n), key=lambda i: level[i]):
        below[w] = net.mask([w])
        for v in neighbours[w]:
            if 0 <= level[v] < level[w]:
                below[w] |= below[v]
        if w >= ranks and level[w] > 0:
            yield below[w]
