"""Logical rank-to-rank edges of a topology and the physical link load each one causes.

A program's transfer from rank ``u`` to rank ``v`` follows every route of
:func:`commflow.topology.weighted_routes` at once, as the simulator does: a link carries the
fractions of the routes through it (ECMP's ``k/m`` for a link on ``k`` of ``m`` equal-cost
routes, or a maximum flow's shares where the bandwidths call for it). A *logical edge* is a
pair whose routes pass through switches and NICs only (never through another rank); splitting
the switches off this way (ForestColl's edge splitting, done by the router) leaves a graph on
the ranks alone in which trees can be packed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from commflow.errors import TopologyError
from commflow.topology.graph import Topology
from commflow.topology.routing import weighted_routes


@dataclass(frozen=True, eq=False)
class LogicalEdges:
    """The logical edges of a topology, in the direction data moves.

    ``load[e, l]`` is the fraction of the bytes of edge ``e`` carried by link ``l``;
    ``seconds[e, l] = load[e, l] / bandwidth[l]`` (seconds per byte).
    """

    topology: Topology
    """The topology the edges run on."""
    src: np.ndarray
    """Sending rank of each edge (int64)."""
    dst: np.ndarray
    """Receiving rank of each edge (int64)."""
    load: sp.csr_array
    """Edge x link fraction of the edge's bytes on the link."""
    seconds: sp.csr_array
    """Edge x link seconds per byte: ``load / bandwidth``."""
    reverse: bool = False
    """Whether ``src`` and ``dst`` are swapped against the direction data moves (in-trees)."""

    @property
    def nranks(self) -> int:
        """Number of ranks."""
        return self.topology.nranks

    def subset(self, keep: np.ndarray) -> LogicalEdges:
        """The edges selected by ``keep`` (indices or a boolean mask), loads unchanged."""
        return LogicalEdges(
            self.topology,
            self.src[keep],
            self.dst[keep],
            self.load[keep],
            self.seconds[keep],
            self.reverse,
        )

    def reversed(self) -> LogicalEdges:
        """The same edges with ``src`` and ``dst`` swapped (loads unchanged): an out-tree of
        the reversed edges is an in-tree of the originals, as reductions need."""
        return LogicalEdges(
            self.topology, self.dst, self.src, self.load, self.seconds, not self.reverse
        )


def logical_edges(topology: Topology) -> LogicalEdges:
    """Every rank pair whose shortest routes transit no other rank, with its link loads.

    Raises ``TopologyError`` when some rank cannot reach every other rank along such edges.
    """
    n = topology.nranks
    rows, cols, frac, src, dst = [], [], [], [], []
    for u in range(n):
        for v in range(n):
            if u == v:
                continue
            paths = weighted_routes(topology, u, v)
            if any(topology.links[i].dst < n for p, _ in paths for i in p[:-1]):
                continue
            e = len(src)
            src.append(u)
            dst.append(v)
            for p, share in paths:
                rows.extend([e] * len(p))
                cols.extend(p)
                frac.extend([share] * len(p))
    shape = (len(src), len(topology.links))
    load = sp.csr_array((frac, (rows, cols)), shape=shape)
    load.sum_duplicates()
    bandwidth = np.array([link.bandwidth for link in topology.links])
    seconds = sp.csr_array(load @ sp.diags_array(1.0 / bandwidth))
    edges = LogicalEdges(
        topology, np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), load, seconds
    )
    _check_connected(edges)
    return edges


def connected(edges: LogicalEdges) -> bool:
    """Whether every rank reaches every other rank along ``edges``."""
    from scipy.sparse.csgraph import connected_components

    n = edges.nranks
    adj = sp.csr_array((np.ones(len(edges.src)), (edges.src, edges.dst)), shape=(n, n))
    return connected_components(adj, directed=True, connection="strong")[0] == 1


def _check_connected(edges: LogicalEdges) -> None:
    if not connected(edges):
        raise TopologyError(
            f"{edges.topology.name}: the ranks do not all reach each other; connect them"
        )
