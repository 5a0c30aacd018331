"""Shared helpers of the topology tests: link lookups and independent reference graphs."""

from __future__ import annotations

from pathlib import Path

import networkx as nx

from commflow.topology import NodeKind, Topology

DATA = Path(__file__).parent / "data"


def pair_counts(topology: Topology, nodes: range) -> dict[tuple[int, int], int]:
    """``{(a, b): count}`` of the links ``a -> b`` with ``a < b`` among ``nodes``."""
    return {
        (lk.src, lk.dst): lk.count
        for lk in topology.links
        if lk.src in nodes and lk.dst in nodes and lk.src < lk.dst
    }


def out_bandwidth(topology: Topology, node: int) -> float:
    return sum(lk.bandwidth for lk in topology.out_links(node))


def parse_pairs(text: str) -> set[tuple[int, int]]:
    """``"(0,1) (0,4)"`` as written in REFERENCES.md -> ``{(0, 1), (0, 4)}``."""
    return {tuple(int(x) for x in p.strip("()").split(",")) for p in text.split()}


def reference_graph(topology: Topology, src: int, dst: int) -> nx.DiGraph:
    """networkx graph in which routes from ``src`` to ``dst`` must be shortest: without the
    other ranks when a switch-only path exists, else the whole graph."""
    g = topology.to_networkx()
    others = [n.id for n in topology.nodes if n.kind is NodeKind.RANK and n.id not in (src, dst)]
    switched = g.subgraph(set(g) - set(others))
    return switched if nx.has_path(switched, src, dst) else g
