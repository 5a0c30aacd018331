"""Lower bounds on the time of a collective on a topology (ForestColl; SCCL).

Bandwidth bound: for a node set S (switches and NICs included) whose boundary ``w`` blocks
must cross, no algorithm finishes before ``w * block / B(S)`` seconds, ``B(S)`` the bandwidth
leaving S (entering S for reducing collectives and gather). With ``N`` ranks R:

================ ====================================== ============== ==========
collective       S ranges over                          weight w       block
================ ====================================== ============== ==========
allgather        S holding some ranks but not all       ``|S∩R|``      size/N
reducescatter    same, bandwidth entering S             ``|S∩R|``      size/N
allreduce        reduce-scatter bound + allgather bound (an allreduce done as RS + AG)
broadcast        S holding the root, not every rank     1              size
reduce           same, bandwidth entering S             1              size
scatter          S holding the root                     ``|R \\ S|``    size/N
gather           same, bandwidth entering S             ``|R \\ S|``    size/N
alltoall         any S                                  ``|S∩R|·|R\\S|`` size/N
================ ====================================== ============== ==========

All maxima are exact (max-flow searches in :mod:`commflow.sim.cuts`) except alltoall's on
graphs of more than :data:`~commflow.sim.cuts.ENUMERATION_LIMIT` nodes (see ``Bound.exact``).

Latency bound: ``steps`` rank hops (a rank hop is one rank-to-rank transfer, switches and NICs
passed through) -- the rank-hop diameter, or the root's eccentricity for rooted collectives --
each costing at least the smallest latency sum of any one-hop path between two ranks.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from commflow.collectives import Collective, busbw_factor, check_root, parse_collective
from commflow.errors import CommflowError
from commflow.sim.cuts import (
    RatioCut,
    allgather_search,
    alltoall_cut,
    broadcast_cut,
    flow_network,
    scatter_cut,
)
from commflow.topology.graph import Topology
from commflow.topology.routing import diameter, rank_hops

_ENTERING = (Collective.REDUCESCATTER, Collective.REDUCE, Collective.GATHER)
_FROM_ROOT = (Collective.BROADCAST, Collective.SCATTER)
_TO_ROOT = (Collective.REDUCE, Collective.GATHER)
_BATCH = 512
"""Source ranks per shortest-path batch in :func:`_min_hop_latency`."""


@dataclass(frozen=True)
class Bound:
    """A lower bound on the time of one collective of ``size`` bytes on a topology."""

    collective: Collective
    """The collective bounded."""
    size: float
    """Bytes, as nccl-tests counts them (allgather: output, reducescatter: input, ...)."""
    nranks: int
    """Number of ranks N."""
    time: float
    """Seconds: ``max(bandwidth_time, latency_time)``; 0 when N == 1."""
    algbw: float
    """``size / time`` in bytes/s; ``inf`` when time is 0 (N == 1, or nothing to move)."""
    busbw: float
    """``algbw * busbw_factor`` in bytes/s; 0 when the factor is 0 (N == 1)."""
    bandwidth_time: float
    """Seconds the binding cut needs to carry the blocks that must cross it."""
    latency_time: float
    """Seconds: ``steps`` times the smallest latency of a one-rank-hop path; 0 when N == 1."""
    steps: int
    """Latency bound in rank hops: the rank-hop diameter, or the root's eccentricity (out of
    the root for broadcast/scatter, into it for reduce/gather)."""
    cut: tuple[int, ...]
    """Sorted node ids of the binding cut S (holding the root when rooted); ``()`` when N == 1.
    For allreduce, the cut of the larger of its reduce-scatter and allgather halves."""
    cut_bandwidth: float
    """Bytes/s leaving S (entering S for reducescatter, reduce, gather, and allreduce when
    its reduce-scatter half binds); ``inf`` when there is no cut."""
    binding: str
    """``"bandwidth"`` when ``bandwidth_time >= latency_time``, else ``"latency"``."""
    exact: bool
    """Whether ``bandwidth_time`` is the maximum over all cuts; ``False`` only for alltoall
    on more than ``ENUMERATION_LIMIT`` nodes, where structured candidate cuts are tried."""


def lower_bound(
    collective: Collective | str, topology: Topology, size: float, *, root: int = 0,
    in_network: bool = False,
) -> Bound:
    """Lower bound on the time of ``collective`` moving ``size`` bytes on ``topology``.

    ``root`` matters only for broadcast, reduce, scatter and gather. The table above assumes
    only ranks reduce; ``in_network=True`` lets switches and NICs add data on its way
    (SwitchML, SHARP; the ``ina`` algorithm): an allreduce then needs, for every set S
    holding some ranks but not all, ``size`` bytes out of S and ``size`` into it (S's partial
    sum must leave, the total must come in), so its bandwidth time is ``size / B`` for the
    smallest such boundary ``B`` either way (the reduce-scatter + allgather bound no longer
    holds: on one switch it is ``2(N-1)/N`` times larger). Other collectives ignore it. Raises
    ``CommflowError`` for an unknown collective, a negative or non-finite size or a root
    outside the ranks, and ``TopologyError`` when ranks that must exchange data are not
    connected.
    """
    kind = parse_collective(collective)
    if isinstance(size, bool) or not (
        isinstance(size, numbers.Real) and math.isfinite(size) and size >= 0
    ):
        raise CommflowError(f"lower_bound({kind.value}): size must be bytes >= 0, got {size!r}")
    n = topology.nranks
    root = check_root(kind, n, root)
    factor = busbw_factor(kind, n)
    if n == 1:
        return Bound(
            collective=kind,
            size=size,
            nranks=1,
            time=0.0,
            algbw=math.inf,
            busbw=math.inf if factor else 0.0,
            bandwidth_time=0.0,
            latency_time=0.0,
            steps=0,
            cut=(),
            cut_bandwidth=math.inf,
            binding="bandwidth",
            exact=True,
        )
    if in_network and kind is Collective.ALLREDUCE:
        cut, bandwidth_time, exact = _in_network_bound(topology, size)
    else:
        cut, bandwidth_time, exact = _bandwidth_bound(kind, topology, size, root)
    steps = _steps(kind, topology, root)
    latency_time = steps * _min_hop_latency(topology)
    time = max(bandwidth_time, latency_time)
    algbw = size / time if time > 0 else math.inf
    return Bound(
        collective=kind,
        size=size,
        nranks=n,
        time=time,
        algbw=algbw,
        busbw=algbw * factor if factor else 0.0,
        bandwidth_time=bandwidth_time,
        latency_time=latency_time,
        steps=steps,
        cut=cut.nodes,
        cut_bandwidth=cut.bandwidth,
        binding="bandwidth" if bandwidth_time >= latency_time else "latency",
        exact=exact,
    )


def _bandwidth_bound(
    kind: Collective, topology: Topology, size: float, root: int | None
) -> tuple[RatioCut, float, bool]:
    """The binding cut, the bandwidth time in seconds and whether it is exact."""
    n = topology.nranks
    net = flow_network(topology, reverse=kind in _ENTERING)
    if kind is Collective.ALLREDUCE:
        scatter = allgather_search(flow_network(topology, reverse=True))[-1]
        gather = allgather_search(flow_network(topology))[-1]
        times = scatter.seconds(size / n), gather.seconds(size / n)
        return (gather if times[1] >= times[0] else scatter), sum(times), True
    if kind in (Collective.BROADCAST, Collective.REDUCE):
        cut = broadcast_cut(net, root)
        return cut, cut.seconds(size), True
    exact = True
    if kind in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        cut = allgather_search(net)[-1]
    elif kind in (Collective.SCATTER, Collective.GATHER):
        cut = scatter_cut(net, root)
    else:
        cut, exact = alltoall_cut(net)
    return cut, cut.seconds(size / n), exact


def _in_network_bound(topology: Topology, size: float) -> tuple[RatioCut, float, bool]:
    """Allreduce with aggregation in the network: ``size`` over the smallest boundary, either
    way, of a set holding some ranks but not all (every such set holds rank 0 or its
    complement does, so rank 0's broadcast cuts forwards and backwards cover them)."""
    out = broadcast_cut(flow_network(topology), 0)
    into = broadcast_cut(flow_network(topology, reverse=True), 0)
    cut = out if out.bandwidth <= into.bandwidth else into
    return cut, size / cut.bandwidth, True


def _steps(kind: Collective, topology: Topology, root: int | None) -> int:
    """Rank hops on the longest shortest path the collective must cover.

    Called after the bandwidth bound, which has raised if a needed path is missing.
    """
    if kind in _FROM_ROOT:
        return int(rank_hops(topology)[root].max())
    if kind in _TO_ROOT:
        return int(rank_hops(topology)[:, root].max())
    return diameter(topology)


def _min_hop_latency(topology: Topology) -> float:
    """Smallest latency sum (s) of a path from a rank to another rank through no other rank.

    Links into a rank are redirected to a copy of it with no outgoing links, so shortest
    paths from the ranks stop at the first rank they reach. Sources go in batches of
    :data:`_BATCH` ranks to bound the distance table's memory.
    """
    n, ranks = topology.nnodes, topology.nranks
    tails = np.array([link.src for link in topology.links])
    heads = np.array([link.dst for link in topology.links])
    heads = np.where(heads < ranks, heads + n, heads)
    latency = np.array([link.latency for link in topology.links], dtype=np.float64)
    graph = sp.csr_array((latency, (tails, heads)), shape=(n + ranks,) * 2)
    best = math.inf
    for first in range(0, ranks, _BATCH):
        sources = np.arange(first, min(first + _BATCH, ranks))
        reach = dijkstra(graph, directed=True, indices=sources)[:, n:]
        reach[np.arange(len(sources)), sources] = math.inf
        best = min(best, float(reach.min()))
    return best
