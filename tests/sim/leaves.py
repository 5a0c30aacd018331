"""Two-leaf switch topologies whose binding cuts are not single ranks."""

from __future__ import annotations

from commflow.topology.graph import Link, Node, NodeKind, Topology, duplex, make_topology

LEAF_PORT = 25e9
"""Bandwidth of each rank's port on its leaf switch, bytes/s per direction."""


def two_leaves(
    sizes: tuple[int, int], up: float, down: float | None = None, *, interleave: bool = False
) -> Topology:
    """Ranks on two leaf switches: ``leaf0 -> leaf1`` at ``up``, back at ``down`` (default
    ``up``) bytes/s; rank ports at :data:`LEAF_PORT`. Without ``interleave`` the first
    ``sizes[0]`` ranks sit on leaf0; with it ranks alternate (``sizes`` must then be equal)."""
    n = sum(sizes)
    nodes = [Node(i, NodeKind.RANK, f"r{i}") for i in range(n)]
    nodes += [Node(n, NodeKind.SWITCH, "leaf0"), Node(n + 1, NodeKind.SWITCH, "leaf1")]
    links = [Link(n, n + 1, up, 1e-6), Link(n + 1, n, up if down is None else down, 1e-6)]
    for r in range(n):
        leaf = r % 2 if interleave else int(r >= sizes[0])
        links += duplex(r, n + leaf, LEAF_PORT, 1e-6)
    return make_topology("two-leaves", nodes, links)
