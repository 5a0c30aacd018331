"""Collective times of a plan's groups, simulated with commflow's own algorithms.

Simulating every collective on thousands of ranks per plan would make a search slow, so each
group is reduced to its *shape*: ``k`` ranks in each of ``b`` boxes, on a small topology with
the cluster's real link bandwidths and latencies (one NVSwitch port per GPU inside a box, one
NIC per GPU to a non-blocking network switch across boxes). For each (collective, shape) each
applicable algorithm of :data:`CANDIDATES` (and, for groups spanning boxes, NCCL's rail rings:
:func:`rail_orders`) is ranked by :func:`commflow.tune.rank`
(alpha-beta model) and the fastest, simulated at two sizes, is kept as a line
``time = a + size / bw`` (the alpha-beta simulation is affine in size, so the fit
reproduces it to rounding; tests check a third size). Where the cluster's switches
aggregate (``in_network``), allreduce also tries ``ina``. Groups over :data:`SIM_MAX_RANKS`
ranks are simulated with fewer boxes and extrapolated with the ring cost
``(n-1)·α + (n-1)/n·size·β``. Results are cached per (collective, shape, cluster).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

from commflow import tune
from commflow.algorithms import build_for, multi_ring
from commflow.collectives import Collective
from commflow.errors import AlgorithmError, CommflowError
from commflow.sim import simulate
from commflow.topology import Link, Node, NodeKind, Topology, duplex, make_topology

_RINGED = {"allreduce": Collective.ALLREDUCE, "allgather": Collective.ALLGATHER,
           "reducescatter": Collective.REDUCESCATTER}

SIM_MAX_RANKS = 32
"""Largest group simulated directly; larger groups are extrapolated (see module doc)."""

CANDIDATES = {
    "allreduce": ("ring", "hierarchical", "double_binary_tree", "halving_doubling"),
    "allgather": ("ring", "recursive_doubling", "bruck"),
    "reducescatter": ("ring", "halving_doubling"),
    "alltoall": ("pairwise", "bruck", "direct"),
}
"""Algorithms tried per collective (those that suit megabyte-to-gigabyte messages)."""

FIT_SIZES = (16 * 2**20, 256 * 2**20)
"""Sizes (bytes) of the two simulations a collective's line is fitted through."""


@dataclass(frozen=True)
class BoxLinks:
    """One box of a cluster, as the planner sees it."""

    accelerator: str | None
    """What its ranks compute on (``Node.accelerator``); ``None`` when the topology is silent."""
    intra_bandwidth: float
    """Bytes/s one of its GPUs can send inside the box."""
    network_bandwidth: float
    """Bytes/s one of its GPUs can send out of the box along the actual path (0: no network)."""


@dataclass(frozen=True)
class ClusterLinks:
    """What the planner needs of a cluster topology: box size and per-GPU links (of the
    slowest box), and each box's own links and accelerator."""

    gpus: int
    """Ranks of the cluster."""
    gpus_per_box: int
    """Ranks per box."""
    intra_bandwidth: float
    """Bytes/s one GPU can send inside its box (sum of its intra-box links)."""
    network_bandwidth: float
    """Bytes/s one GPU can send out of its box (its NIC; 0 for a single box)."""
    intra_latency: float
    """Latency of an intra-box link, seconds."""
    network_latency: float
    """Latency of a network hop, seconds."""
    in_network: bool = False
    """Whether the network switches aggregate (SHARP, SwitchML): allreduce may then use
    ``ina`` (:mod:`commflow.algorithms.in_network`)."""
    boxes: tuple[BoxLinks, ...] = field(default=(), compare=False)
    """Per block of ``gpus_per_box`` consecutive ranks (a box when ranks are numbered box by
    box), its links and accelerator; empty: every box as the summary. Not compared (the
    collective cache keys on the summary fields, which are all a group shape uses)."""

    @cached_property
    def heterogeneous(self) -> bool:
        """Whether boxes differ in accelerator or links."""
        return len(set(self.boxes)) > 1


def cluster_links(topology: Topology, *, in_network: bool = False) -> ClusterLinks:
    """Summarize ``topology``: box size and, per GPU, the intra-box and network bandwidth of its
    slowest box (a collective spanning boxes runs at the pace of the slowest); ``in_network``:
    its switches aggregate.

    A box's network bandwidth follows the actual path out of it: each NIC carries the smaller
    of what its GPUs send into it and what it sends on (NIC to switch or to another box); links
    from a GPU straight into another box count as they are. Raises ``CommflowError`` when the
    boxes differ in size."""
    boxes = topology.nboxes
    if topology.nranks % boxes:
        raise CommflowError(f"topology {topology.name}: boxes of unequal size are not supported")
    per_box = topology.nranks // boxes
    nodes = topology.nodes
    members: dict[int, list[int]] = {}
    for rank in range(topology.nranks):
        members.setdefault(topology.box_of(rank), []).append(rank)
    intra, net, intra_lat, net_lat = math.inf, math.inf, 0.0, 0.0
    per_box_links: dict[int, BoxLinks] = {}
    for box, ranks in members.items():
        box_intra, box_net = 0.0, 0.0
        into_nic: dict[int, float] = {}
        for rank in ranks:
            for link in topology.out_links(rank):
                dst = nodes[link.dst]
                if dst.kind is NodeKind.NIC:
                    into_nic[dst.id] = into_nic.get(dst.id, 0.0) + link.bandwidth
                    hops = topology.out_links(dst.id)
                    net_lat = max(net_lat, link.latency, *(hop.latency for hop in hops))
                elif dst.box != nodes[rank].box:
                    box_net += link.bandwidth
                    net_lat = max(net_lat, link.latency)
                else:
                    box_intra += link.bandwidth
                    intra_lat = max(intra_lat, link.latency)
        for nic, inflow in into_nic.items():
            onward = sum(hop.bandwidth for hop in topology.out_links(nic)
                         if nodes[hop.dst].kind is not NodeKind.RANK
                         or nodes[hop.dst].box != nodes[nic].box)
            box_net += min(inflow, onward)
        labels = {nodes[rank].accelerator for rank in ranks}
        if len(labels) > 1:
            raise CommflowError(
                f"topology {topology.name}: box {box} mixes accelerators "
                f"{sorted(map(str, labels))}; give every rank of a box the same one")
        per_box_links[box] = BoxLinks(labels.pop(), box_intra / per_box, box_net / per_box)
        intra, net = min(intra, box_intra / per_box), min(net, box_net / per_box)
    blocks = tuple(
        _block(per_box_links, [topology.box_of(r) for r in range(start, start + per_box)],
               topology.name)
        for start in range(0, topology.nranks, per_box))
    return ClusterLinks(
        topology.nranks, per_box, intra, net, intra_lat, net_lat or intra_lat, in_network, blocks,
    )


def _block(boxes: dict[int, BoxLinks], members: list[int], name: str) -> BoxLinks:
    """The links of a block of consecutive ranks in ``members``' boxes: the slowest of each.
    Raises ``CommflowError`` when the boxes hold different accelerators."""
    links = [boxes[b] for b in sorted(set(members))]
    names = {link.accelerator for link in links}
    if len(names) > 1:
        raise CommflowError(
            f"topology {name}: ranks of boxes {sorted(set(members))} with different "
            "accelerators are numbered in one block; number the ranks box by box")
    return BoxLinks(names.pop(),
                    min(link.intra_bandwidth for link in links),
                    min(link.network_bandwidth for link in links))


def group_shape(size: int, stride: int, gpus_per_box: int) -> tuple[int, int]:
    """``(ranks per box, boxes)`` of a group of ``size`` ranks spaced ``stride`` apart when
    ranks are numbered box by box."""
    if size * stride <= gpus_per_box:
        return size, 1
    if stride >= gpus_per_box:
        return 1, size
    per_box = gpus_per_box // stride
    return per_box, math.ceil(size / per_box)


def shape_topology(per_box: int, boxes: int, links: ClusterLinks) -> Topology:
    """``boxes`` boxes of ``per_box`` ranks: an NVSwitch port per rank inside a box (when
    ``per_box > 1``) and one NIC link per rank to a network switch (when ``boxes > 1``)."""
    nodes = [
        Node(r, NodeKind.RANK, f"box{r // per_box}.gpu{r % per_box}", r // per_box)
        for r in range(per_box * boxes)
    ]
    edges: list[Link] = []
    if per_box > 1:
        for box in range(boxes):
            sw = len(nodes)
            nodes.append(Node(sw, NodeKind.SWITCH, f"box{box}.nvswitch", box))
            for local in range(per_box):
                edges += duplex(
                    box * per_box + local, sw, links.intra_bandwidth, links.intra_latency
                )
    if boxes > 1:
        if links.network_bandwidth <= 0:
            raise CommflowError("a group spans boxes but the cluster has no network links")
        net = len(nodes)
        nodes.append(Node(net, NodeKind.SWITCH, "network", None))
        for rank in range(per_box * boxes):
            edges += duplex(rank, net, links.network_bandwidth, links.network_latency)
    return make_topology(f"group{per_box}x{boxes}", nodes, edges)


def rail_orders(per_box: int, boxes: int) -> list[list[int]]:
    """NCCL's channels on a group of ``per_box`` ranks in each of ``boxes`` boxes, each rank
    with its own NIC: ring ``c`` enters every box at local rank ``c`` and leaves it from local
    rank ``c - 1``, so the ``per_box`` rings together use every NIC once each way."""
    return [[b * per_box + (c + j) % per_box for b in range(boxes) for j in range(per_box)]
            for c in range(per_box)]


@dataclass(frozen=True)
class CollectiveLine:
    """A collective's time as ``latency + size / bandwidth`` for one group shape."""

    algorithm: str
    """The fastest algorithm found."""
    latency: float
    """Seconds at size 0."""
    bandwidth: float
    """Bytes/s of the size term."""

    def time(self, size: float) -> float:
        """Seconds for ``size`` bytes (nccl-tests meaning); 0 for an empty collective."""
        return 0.0 if size <= 0 else self.latency + size / self.bandwidth


@lru_cache(maxsize=4096)
def collective_line(
    collective: str, per_box: int, boxes: int, links: ClusterLinks
) -> CollectiveLine:
    """Fit the fastest applicable algorithm's simulated time for a group shape (cached)."""
    n = per_box * boxes
    sim_boxes = boxes
    while per_box * sim_boxes > SIM_MAX_RANKS and sim_boxes > 2:
        sim_boxes //= 2
    topo = shape_topology(per_box, sim_boxes, links)
    best: tuple[float, str, float, float] | None = None
    names = CANDIDATES[collective]
    if links.in_network and collective == "allreduce":
        names = (*names, "ina")
    found = []
    for name in names:
        try:
            found.append(tune.Candidate(name, build_for(collective, name, topo)))
        except AlgorithmError:
            continue
    if per_box > 1 and sim_boxes > 1 and collective in _RINGED:
        orders = rail_orders(per_box, sim_boxes)
        found.append(tune.Candidate("multi_ring", multi_ring.generate(
            _RINGED[collective], per_box * sim_boxes, orders=orders)))
    for ranked in tune.rank(found, topo, FIT_SIZES[1]):  # fastest first
        t1, t2 = simulate(ranked.program, topo, FIT_SIZES[0]).time, ranked.seconds
        slope = (t2 - t1) / (FIT_SIZES[1] - FIT_SIZES[0])
        if slope > 0:
            best = (t2, ranked.method, t1 - slope * FIT_SIZES[0], slope)
            break
    if best is None:
        raise CommflowError(f"no {collective} algorithm applies to {n} ranks")
    _, name, alpha, beta = best
    m = per_box * sim_boxes
    if m != n:
        alpha *= (n - 1) / (m - 1)
        beta *= (n - 1) / n * m / (m - 1)
    return CollectiveLine(name, max(alpha, 0.0), 1.0 / beta)


def collective_time(
    collective: str, size: float, group: int, stride: int, links: ClusterLinks
) -> float:
    """Seconds of one ``collective`` of ``size`` bytes over a group of ``group`` ranks spaced
    ``stride`` apart (0 for a group of one)."""
    if group <= 1 or size <= 0:
        return 0.0
    per_box, boxes = group_shape(group, stride, links.gpus_per_box)
    return collective_line(collective, per_box, boxes, links).time(size)


def p2p_time(size: float, stride: int, links: ClusterLinks) -> float:
    """Seconds to send ``size`` bytes to the rank ``stride`` further (pipeline neighbour)."""
    if size <= 0:
        return 0.0
    if stride < links.gpus_per_box:
        return 2 * links.intra_latency + size / links.intra_bandwidth
    return 2 * links.network_latency + size / links.network_bandwidth
