"""The topology graph: compute ranks, switches and NICs joined by directed links.

Node ids ``0 .. nranks-1`` are the compute ranks (rank i is node i); switches and NICs follow.
A link is one direction of a connection with a bandwidth (bytes/s) and latency (s); parallel
links between the same pair are merged into one whose bandwidth is their sum (``count`` keeps
how many there were).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import numpy as np

from commflow.errors import TopologyError


class NodeKind(StrEnum):
    """What a node of the topology is."""

    RANK = "rank"
    SWITCH = "switch"
    NIC = "nic"


@dataclass(frozen=True)
class Node:
    """One node: a compute rank, a switch or a NIC.

    ``box`` is the index of the machine (server) the node belongs to, ``None`` for network
    switches outside any box. ``accelerator`` names what a rank computes on (``h100-sxm``,
    as :mod:`commflow.plan.hardware` names them), ``None`` when the topology does not say; it
    is no part of the fingerprint (links alone decide how collectives run).
    """

    id: int
    kind: NodeKind
    name: str
    box: int | None = None
    accelerator: str | None = None


@dataclass(frozen=True)
class Link:
    """One direction of a connection ``src -> dst``.

    ``bandwidth`` in bytes/s (the sum over ``count`` parallel links), ``latency`` in seconds.
    """

    src: int
    dst: int
    bandwidth: float
    latency: float
    count: int = 1


@dataclass(frozen=True, eq=False)
class Topology:
    """A directed graph of ranks, switches and NICs.

    Build one with :func:`make_topology` (which merges parallel links and validates), a preset
    (``commflow.topology.dgx1()``, ...) or :func:`commflow.topology.load`.
    """

    name: str
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    _index: dict[tuple[int, int], int] = field(repr=False, compare=False)

    @property
    def nranks(self) -> int:
        """Number of compute ranks (nodes ``0 .. nranks-1``)."""
        return sum(1 for n in self.nodes if n.kind is NodeKind.RANK)

    @property
    def nnodes(self) -> int:
        """Number of nodes of any kind."""
        return len(self.nodes)

    @cached_property
    def nboxes(self) -> int:
        """Number of distinct boxes the ranks live in (1 when no box is recorded)."""
        boxes = {n.box for n in self.nodes if n.kind is NodeKind.RANK and n.box is not None}
        return max(1, len(boxes))

    def link(self, src: int, dst: int) -> Link | None:
        """The merged link ``src -> dst``, or ``None`` when there is none."""
        i = self._index.get((src, dst))
        return None if i is None else self.links[i]

    def link_index(self, src: int, dst: int) -> int:
        """Position of link ``src -> dst`` in :attr:`links`; ``TopologyError`` when absent."""
        try:
            return self._index[(src, dst)]
        except KeyError:
            raise TopologyError(f"{self.name}: no link {src} -> {dst}") from None

    def out_links(self, node: int) -> list[Link]:
        """Links leaving ``node``."""
        return [self.links[i] for i in self._out[node]]

    @cached_property
    def _out(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for i, link in enumerate(self.links):
            out[link.src].append(i)
        return out

    @cached_property
    def bandwidth_matrix(self) -> np.ndarray:
        """``[src][dst]`` bandwidth in bytes/s over all nodes (0 where no link)."""
        m = np.zeros((self.nnodes, self.nnodes))
        for link in self.links:
            m[link.src, link.dst] = link.bandwidth
        return m

    def box_of(self, rank: int) -> int:
        """Box index of a rank (0 when boxes are not recorded)."""
        box = self.nodes[rank].box
        return 0 if box is None else box

    def fingerprint(self) -> str:
        """Stable hex digest of this topology; see :func:`commflow.topology.fingerprint`."""
        from commflow.topology.fingerprint import fingerprint

        return fingerprint(self)

    def to_networkx(self):  # -> networkx.DiGraph
        """The graph as a ``networkx.DiGraph`` with node ``kind``/``name``/``box`` and link
        ``bandwidth``/``latency``/``count`` attributes."""
        import networkx as nx

        g = nx.DiGraph(name=self.name)
        for n in self.nodes:
            g.add_node(n.id, kind=n.kind.value, name=n.name, box=n.box)
        for link in self.links:
            g.add_edge(
                link.src, link.dst, bandwidth=link.bandwidth, latency=link.latency, count=link.count
            )
        return g


def make_topology(
    name: str,
    nodes: Iterable[Node],
    links: Iterable[Link],
) -> Topology:
    """Build a :class:`Topology`, merging parallel links (bandwidths add, latency is the
    smallest) and checking that ids are dense, ranks come first and bandwidths are positive.

    Raises ``TopologyError`` naming the offending node or link.
    """
    nodes = tuple(nodes)
    for i, n in enumerate(nodes):
        if n.id != i:
            raise TopologyError(f"{name}: node {n.name!r} has id {n.id}, expected {i}")
    kinds = [n.kind is NodeKind.RANK for n in nodes]
    nranks = sum(kinds)
    if nranks == 0:
        raise TopologyError(f"{name}: a topology needs at least one rank")
    if not all(kinds[:nranks]):
        raise TopologyError(f"{name}: ranks must be nodes 0..{nranks - 1}, before switches/NICs")
    merged: dict[tuple[int, int], Link] = {}
    for link in links:
        if not (0 <= link.src < len(nodes) and 0 <= link.dst < len(nodes)):
            raise TopologyError(f"{name}: link {link.src} -> {link.dst} names an unknown node")
        if link.src == link.dst:
            raise TopologyError(f"{name}: link {link.src} -> {link.dst} is a self-loop")
        if not (0 < link.bandwidth < math.inf and 0 <= link.latency < math.inf):
            raise TopologyError(
                f"{name}: link {link.src} -> {link.dst} needs a finite bandwidth > 0 and a "
                f"finite latency >= 0, "
                f"got {link.bandwidth} B/s, {link.latency} s"
            )
        key = (link.src, link.dst)
        old = merged.get(key)
        if old is not None:
            link = Link(
                link.src,
                link.dst,
                old.bandwidth + link.bandwidth,
                min(old.latency, link.latency),
                old.count + link.count,
            )
        merged[key] = link
    ordered = tuple(sorted(merged.values(), key=lambda lk: (lk.src, lk.dst)))
    index = {(lk.src, lk.dst): i for i, lk in enumerate(ordered)}
    return Topology(name, nodes, ordered, index)


def duplex(src: int, dst: int, bandwidth: float, latency: float, count: int = 1) -> list[Link]:
    """Both directions of a connection, each with ``bandwidth`` bytes/s."""
    return [Link(src, dst, bandwidth, latency, count), Link(dst, src, bandwidth, latency, count)]
