"""Exact packings for clusters of alike boxes, composed from one box's packing
(:mod:`commflow.synth.forest`): trees one level deeper than the box's, where a packing grown
over the whole cluster is far deeper (MI250 x4: 9 levels against 21), so the pipeline fills
and drains in fewer pieces.

Root ``r``, local rank ``i`` of its box, sends each share straight to local rank ``i`` of
every other box (an *entry*, one route through the network); every box then spreads what its
rank ``i`` holds, its own data and the entries, along its copy of ``i``'s box trees. The box
packing is found on the box's links plus what the entries leave of its links to the network
switches at the cluster's cut bound, so a box may also route among its own ranks through the
network where it has capacity to spare. The composition is kept only when it is exact (the
cluster's busiest link at the cut bound), so it never trades bandwidth for depth: on MI250 x2
the spare network capacity does relieve the xGMI links into each GCD pair (the binding cut),
but whole trees per link reach the bound only with more trees per root than are tried.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from fractions import Fraction

import numpy as np

from commflow.synth.forest import Forest, at_bound, cut_bound, forest
from commflow.synth.links import LogicalEdges, connected, logical_edges
from commflow.synth.trees import WeightedTree, tree_seconds
from commflow.topology.graph import Link, NodeKind, Topology, make_topology

DENOMINATOR = 10**6
"""Largest denominator of the fraction of a link the entries leave (exact capacities)."""


def by_box(edges: LogicalEdges, most_trees: int) -> Forest | None:
    """``k`` trees per rank (all ranks roots) composed from a packing of one box with up to
    ``most_trees`` trees per root, whose busiest link takes exactly the cut bound; ``None``
    when the boxes differ, an entry is not a logical edge or the composition is not exact."""
    start = time.perf_counter()
    topology = edges.topology
    boxes = _alike_boxes(topology)
    if boxes is None:
        return None
    ranks = [[v for v in nodes if v < topology.nranks] for nodes in boxes]
    entries = [
        WeightedTree(r, _entry_parents(ranks, home, i, topology.nranks), 1.0)
        for home, mine in enumerate(ranks)
        for i, r in enumerate(mine)
    ]
    spent = tree_seconds(edges, entries)
    if spent is None:
        return None
    bound = cut_bound(edges)
    left = [1 - Fraction(s / bound).limit_denominator(DENOMINATOR) for s in spent]
    if min(left) < 0:
        return None
    box, scale = _box_topology(topology, boxes[0], left)
    inner_edges = logical_edges(box)
    inner_edges = inner_edges.reversed() if edges.reverse else inner_edges
    if len(boxes) * scale * cut_bound(inner_edges) > bound * (1 + 1e-9):
        return None  # a box's trees carry every box's roots: B times the cluster's rate
    inner = forest(inner_edges, most_trees=most_trees, ratios=(Fraction(1),))
    if inner is None:
        return None
    trees = []
    for home, mine in enumerate(ranks):
        for i, r in enumerate(mine):
            for t in (t for t in inner.trees if t.root == i):
                parent = list(_entry_parents(ranks, home, i, topology.nranks))
                for theirs in ranks:
                    for v, p in enumerate(t.parent):
                        if p >= 0:
                            parent[theirs[v]] = theirs[p]
                trees.append(WeightedTree(r, tuple(parent), t.weight))
    if not at_bound(edges, tuple(trees), bound):
        return None
    return Forest(tuple(trees), inner.k, 1.0, time.perf_counter() - start)


def dedicated_edges(edges: LogicalEdges) -> LogicalEdges | None:
    """The logical edges that have their links to themselves: direct rank-to-rank links,
    and, in clusters of alike boxes, the edges through the network between ranks of the same
    position in their boxes (one rail per rank, as NCCL's rail-aligned rings use). ``None``
    when some link would carry two of them or no edge goes through the network between
    boxes that need it (a box of NVSwitch: every edge shares its rank's switch port)."""
    topology = edges.topology
    n = topology.nranks
    boxes = _alike_boxes(topology)
    position = {}
    for b, nodes in enumerate(boxes or []):
        position.update({v: (b, i) for i, v in enumerate(v for v in nodes if v < n)})
    load = edges.load.tocsr()
    keep = []
    for e, (u, v) in enumerate(zip(edges.src.tolist(), edges.dst.tolist(), strict=True)):
        links = load.indices[load.indptr[e] : load.indptr[e + 1]].tolist()
        direct = all(topology.links[i].src < n and topology.links[i].dst < n for i in links)
        rail = bool(position) and position[u][0] != position[v][0]
        rail = rail and position[u][1] == position[v][1]
        if direct or rail:
            keep.append(e)
    own = edges.subset(np.array(keep, dtype=np.int64))
    if not keep or (own.load.toarray() > 0).sum(axis=0).max() > 1 or not connected(own):
        return None
    return own


def _entry_parents(ranks: list[list[int]], home: int, i: int, nranks: int) -> tuple[int, ...]:
    """Parents of the entries of root ``ranks[home][i]``: local rank ``i`` of every other box
    receives from it (-1 elsewhere)."""
    parent = [-1] * nranks
    for b, theirs in enumerate(ranks):
        if b != home:
            parent[theirs[i]] = ranks[home][i]
    return tuple(parent)


def _alike_boxes(topology: Topology) -> list[list[int]] | None:
    """Each box's nodes (ranks first, each kind in id order) when there are several boxes
    with as many ranks each and the same links among their nodes, position for position;
    else ``None``."""
    members: dict[int, list[int]] = {}
    for node in sorted(topology.nodes, key=lambda n: (n.kind is not NodeKind.RANK, n.id)):
        if node.box is not None:
            members.setdefault(node.box, []).append(node.id)
    boxes = [members[b] for b in sorted(members)]
    shapes = set()
    for nodes in boxes:
        local = {v: i for i, v in enumerate(nodes)}
        kinds = tuple(topology.nodes[v].kind for v in nodes)
        links = tuple(
            (local[lk.src], local[lk.dst], lk.bandwidth, lk.latency)
            for lk in topology.links
            if lk.src in local and lk.dst in local
        )
        shapes.add((kinds, links))
    ranks = sum(topology.nodes[v].kind is NodeKind.RANK for v in boxes[0]) if boxes else 0
    if len(boxes) < 2 or len(shapes) > 1 or ranks * len(boxes) != topology.nranks:
        return None
    return boxes


def _box_topology(
    topology: Topology, nodes: list[int], left: list[Fraction]
) -> tuple[Topology, int]:
    """The topology of ``nodes`` (one box, ranks first), the switches outside every box and
    the links among them that touch the box, each with the fraction ``left`` of its
    bandwidth, all multiplied by the returned factor to whole bytes/s (exact capacities for
    the cuts); only the links on some shortest route between two of its ranks (no tree can
    use the others, and the cut bound would count them)."""
    mine = set(nodes)
    order = nodes + [n.id for n in topology.nodes if n.box is None]
    known = set(order)
    kept = [
        (lk, Fraction(lk.bandwidth) * share)
        for lk, share in zip(topology.links, left, strict=True)
        if share > 0 and lk.src in known and lk.dst in known and (lk.src in mine or lk.dst in mine)
    ]
    scale = math.lcm(*(bw.denominator for _, bw in kept))
    links = [replace(lk, bandwidth=float(bw * scale)) for lk, bw in kept]
    name = f"{topology.name}.box"
    whole = _subgraph(name, topology, order, links, mine)
    routed = [whole.links[i] for i in np.unique(logical_edges(whole).load.indices)]
    return _subgraph(
        name, whole, list(range(whole.nnodes)), routed, set(range(whole.nranks))
    ), scale


def _subgraph(
    name: str, topology: Topology, order: list[int], links: list[Link], keep: set[int]
) -> Topology:
    """``links`` (between nodes of ``topology``) over the nodes of ``keep`` and those they
    touch, renumbered in the order of ``order``; nodes of a box are put in box 0, those
    outside every box stay outside (routes between the box's ranks do not leave it)."""
    touched = {lk.src for lk in links} | {lk.dst for lk in links} | keep
    position = {v: i for i, v in enumerate(v for v in order if v in touched)}
    return make_topology(
        name,
        [replace(topology.nodes[v], id=i, box=None if topology.nodes[v].box is None else 0)
         for v, i in position.items()],
        [replace(lk, src=position[lk.src], dst=position[lk.dst]) for lk in links],
    )
