"""Topology identity: a stable fingerprint, and isomorphism testing.

The fingerprint is a sha256 digest of a canonical form that ignores the topology's name, node
names, link order and the numbering of switches/NICs; it keeps the rank ids, node kinds and
boxes, and each link's bandwidth and latency rounded to :data:`SIGNIFICANT_DIGITS` significant
digits (the ``count`` of parallel links is bookkeeping and left out: a 12-NVLink port and one
300 GB/s port are the same link). Switches/NICs are named canonically by colour refinement
(1-dimensional Weisfeiler-Lehman) seeded with the rank ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterator

from commflow.topology.graph import NodeKind, Topology

SIGNIFICANT_DIGITS = 6
"""Bandwidth (bytes/s) and latency (s) are compared to this many significant digits."""

Colours = list[int]
Neighbours = tuple[list[list[tuple[str, int]]], list[list[tuple[str, int]]]]
"""Per node, its ``(link label, neighbour)`` pairs: outgoing, then incoming."""


def _link_label(bandwidth: float, latency: float) -> str:
    return f"{bandwidth:.{SIGNIFICANT_DIGITS}g}/{latency:.{SIGNIFICANT_DIGITS}g}"


def _neighbours(topology: Topology) -> Neighbours:
    outs: list[list[tuple[str, int]]] = [[] for _ in topology.nodes]
    ins: list[list[tuple[str, int]]] = [[] for _ in topology.nodes]
    for lk in topology.links:
        label = _link_label(lk.bandwidth, lk.latency)
        outs[lk.src].append((label, lk.dst))
        ins[lk.dst].append((label, lk.src))
    return outs, ins


def _refine(neighbours: Neighbours, seeds: list[Hashable]) -> Colours:
    """Colour refinement: split colour classes by the colours and link labels of each node's
    in- and out-neighbours until stable. Colours are the ranks of the sorted distinct
    signatures, so they depend only on the graph and the seeds (not on node numbering), and
    nodes matched by an isomorphism that preserves seeds and link labels get equal colours."""
    outs, ins = neighbours
    colours: list = seeds
    nclasses = len(set(seeds))
    while True:
        signatures = [
            (
                colour,
                tuple(sorted((label, colours[w]) for label, w in outs[v])),
                tuple(sorted((label, colours[w]) for label, w in ins[v])),
            )
            for v, colour in enumerate(colours)
        ]
        rank = {s: i for i, s in enumerate(sorted(set(signatures)))}
        refined = [rank[s] for s in signatures]
        # Refinement only splits classes, so an unchanged count means a stable partition.
        if len(rank) == nclasses:
            return refined
        colours, nclasses = refined, len(rank)


def fingerprint(topology: Topology) -> str:
    """Hex sha256 digest identifying ``topology`` up to names, link order and the numbering of
    switches/NICs (ranks keep their ids)."""
    seeds = [
        f"rank{n.id}/{n.box}" if n.kind is NodeKind.RANK else f"{n.kind.value}/{n.box}"
        for n in topology.nodes
    ]
    colours = _refine(_neighbours(topology), seeds)
    canonical = {
        "nranks": topology.nranks,
        "nodes": sorted(zip(colours, seeds, strict=True)),
        "links": sorted(
            [colours[lk.src], colours[lk.dst], _link_label(lk.bandwidth, lk.latency)]
            for lk in topology.links
        ),
    }
    return hashlib.sha256(json.dumps(canonical, separators=(",", ":")).encode()).hexdigest()


def _individualized(colours: Colours, node: int) -> list[Hashable]:
    return [-1 if v == node else c for v, c in enumerate(colours)]


def _branches(b: Neighbours, cb: Colours, refined_a: Colours, colour: int) -> Iterator:
    """Candidate images in ``b`` of a node of ``colour``, each as the refined pair."""
    for w, c in enumerate(cb):
        if c == colour:
            yield refined_a, _refine(b, _individualized(cb, w))


def _same_links(a: Topology, ca: Colours, b: Topology, cb: Colours) -> bool:
    """With every colour unique, whether mapping equal colours maps links onto links."""
    image = {colour: w for w, colour in enumerate(cb)}
    for lk in a.links:
        mapped = b.link(image[ca[lk.src]], image[ca[lk.dst]])
        if mapped is None or _link_label(mapped.bandwidth, mapped.latency) != _link_label(
            lk.bandwidth, lk.latency
        ):
            return False
    return True


def isomorphic(a: Topology, b: Topology) -> bool:
    """Whether some relabelling of nodes maps ``a`` onto ``b`` preserving node kinds (ranks go
    to ranks) and each link's direction, bandwidth and latency (to
    :data:`SIGNIFICANT_DIGITS` digits). Boxes and names are ignored.

    Exact search by colour refinement and individualization (the scheme of nauty): a node of
    the smallest ambiguous colour class of ``a`` is matched in turn to each node of that colour
    in ``b``, backtracking when colour counts differ. Symmetric networks (fat-trees, multi-box
    systems) rarely backtrack, where VF2 can take exponential time.
    """
    if (a.nnodes, a.nranks, len(a.links)) != (b.nnodes, b.nranks, len(b.links)):
        return False
    na, nb = _neighbours(a), _neighbours(b)
    start = (
        _refine(na, [n.kind.value for n in a.nodes]),
        _refine(nb, [n.kind.value for n in b.nodes]),
    )
    pending: list[Iterator] = [iter([start])]
    while pending:
        state = next(pending[-1], None)
        if state is None:
            pending.pop()
            continue
        ca, cb = state
        if sorted(ca) != sorted(cb):
            continue
        classes: dict[int, list[int]] = {}
        for v, colour in enumerate(ca):
            classes.setdefault(colour, []).append(v)
        ambiguous = [nodes for nodes in classes.values() if len(nodes) > 1]
        if not ambiguous:
            if _same_links(a, ca, b, cb):
                return True
            continue
        v = min(ambiguous, key=len)[0]
        pending.append(_branches(nb, cb, _refine(na, _individualized(ca, v)), ca[v]))
    return False
