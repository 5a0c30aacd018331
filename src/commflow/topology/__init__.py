"""Topologies: a graph of compute ranks, switches, NICs and links, with presets of synthetic
networks and real machines, file loaders, routing and fingerprints.

Bandwidth is bytes/s per link per direction, latency seconds; ranks are nodes ``0..nranks-1``.
"""

from commflow.topology.fingerprint import fingerprint, isomorphic
from commflow.topology.formats.json_yaml import dump, save
from commflow.topology.graph import Link, Node, NodeKind, Topology, duplex, make_topology
from commflow.topology.load import load, presets
from commflow.topology.rings import nccl_rings, ring_order
from commflow.topology.routing import diameter, rank_hops, routes, weighted_routes
from commflow.topology.synthetic import fat_tree, fully_connected, line, ring, switch, torus
from commflow.topology.systems import dgx1, dgx2, dgx_a100, dgx_h100, mi250, mixed, ndv2

__all__ = [
    "Link",
    "Node",
    "NodeKind",
    "Topology",
    "dgx1",
    "dgx2",
    "dgx_a100",
    "dgx_h100",
    "diameter",
    "dump",
    "duplex",
    "fat_tree",
    "fingerprint",
    "fully_connected",
    "isomorphic",
    "line",
    "load",
    "make_topology",
    "mi250",
    "mixed",
    "ndv2",
    "presets",
    "nccl_rings",
    "rank_hops",
    "ring",
    "ring_order",
    "routes",
    "weighted_routes",
    "save",
    "switch",
    "torus",
]
