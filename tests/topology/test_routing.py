"""ECMP routes, rank hops and diameter against networkx references and closed forms."""

from __future__ import annotations

import gc
import time
import weakref

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.errors import TopologyError
from commflow.topology import (
    Node,
    NodeKind,
    dgx1,
    dgx_a100,
    diameter,
    fat_tree,
    make_topology,
    mi250,
    ndv2,
    rank_hops,
    ring,
    routes,
    switch,
    torus,
)

from .helpers import reference_graph

TOPOLOGIES = [
    dgx1(),
    ndv2(2),
    ndv2(3),
    dgx_a100(2),
    mi250(2),
    torus((3, 3)),
    fat_tree(4),
    switch(5),
]


def node_path(topology, path, src):
    nodes = [src]
    for index in path:
        link = topology.links[index]
        assert link.src == nodes[-1], "links of a path must chain"
        nodes.append(link.dst)
    return tuple(nodes)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(TOPOLOGIES), st.data())
def test_routes_are_all_shortest_paths_of_the_reference(topology, data):
    src = data.draw(st.integers(0, topology.nranks - 1))
    dst = data.draw(st.integers(0, topology.nranks - 1).filter(lambda d: d != src))
    got = {node_path(topology, p, src) for p in routes(topology, src, dst)}
    reference = reference_graph(topology, src, dst)
    assert got == {tuple(p) for p in nx.all_shortest_paths(reference, src, dst)}


def test_fat_tree_ecmp_counts():
    topo = fat_tree(4)
    assert len(routes(topo, 0, 1)) == 1  # same edge switch
    assert len(routes(topo, 0, 2)) == 2  # same pod: k/2 aggregation switches
    assert len(routes(topo, 0, 15)) == 4  # other pod: (k/2)^2 core switches
    assert {len(p) for p in routes(topo, 0, 15)} == {6}
    assert len(routes(fat_tree(6), 0, 53)) == 9


def test_direct_networks_transit_ranks():
    paths = routes(ring(8), 0, 4)
    assert {node_path(ring(8), p, 0) for p in paths} == {(0, 1, 2, 3, 4), (0, 7, 6, 5, 4)}
    topo = dgx1()
    assert {node_path(topo, p, 0) for p in routes(topo, 0, 5)} == {(0, 1, 5), (0, 4, 5)}
    assert routes(topo, 0, 1) == ((topo.link_index(0, 1),),)


def test_switch_only_path_wins_over_rank_transit():
    topo = mi250(2)  # GCDs 0 and 3 have no xGMI link; both reach the IB switch
    ib = topo.nranks
    assert {node_path(topo, p, 0) for p in routes(topo, 0, 3)} == {(0, ib, 3)}


def test_self_route_and_errors():
    assert routes(dgx1(), 3, 3) == ((),)
    two = make_topology("apart", [Node(0, NodeKind.RANK, "a"), Node(1, NodeKind.RANK, "b")], [])
    with pytest.raises(TopologyError, match="no route from node 0"):
        routes(two, 0, 1)
    with pytest.raises(TopologyError, match="not a node"):
        routes(dgx1(), 0, 8)
    with pytest.raises(TopologyError, match="must be a node id"):
        routes(dgx1(), "0", 1)


def test_routing_fat_tree_16_ring_neighbours_is_fast():
    topo = fat_tree(16)
    n = topo.nranks
    start = time.perf_counter()
    counts = [len(routes(topo, r, (r + 1) % n)) for r in range(n)]
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0
    # same edge switch: 1 path; next edge switch in the pod: k/2; next pod: (k/2)^2
    assert counts.count(64) == 16 and counts.count(8) == 16 * 7
    assert counts.count(1) == n - 16 * 8


def reference_hops(topology):
    g = topology.to_networkx()
    ranks = range(topology.nranks)
    switches = set(g) - set(ranks)
    hop = nx.DiGraph()
    hop.add_nodes_from(ranks)
    for a in ranks:
        via = nx.descendants(g.subgraph(switches | {a}), a) | {a}
        reach = {b for v in via for b in g.successors(v) if b in ranks and b != a}
        hop.add_edges_from((a, b) for b in reach)
    lengths = dict(nx.all_pairs_shortest_path_length(hop))
    return np.array([[lengths[a].get(b, -1) for b in ranks] for a in ranks])


@pytest.mark.parametrize("topology", TOPOLOGIES, ids=lambda t: t.name)
def test_rank_hops_match_reference(topology):
    assert np.array_equal(rank_hops(topology), reference_hops(topology))


def test_rank_hops_closed_forms():
    hops = rank_hops(ring(8))
    assert hops.dtype.kind == "i"
    assert all(hops[a, b] == min(abs(a - b), 8 - abs(a - b)) for a in range(8) for b in range(8))
    assert np.array_equal(rank_hops(switch(4)), 1 - np.eye(4, dtype=int))
    ndv2x2 = rank_hops(ndv2(2))
    assert ndv2x2[0, 9] == 1 and ndv2x2[9, 0] == 3  # IB runs GPU0 -> GPU1 only


def test_diameter():
    assert diameter(dgx1()) == 2
    assert diameter(switch(8)) == 1
    assert diameter(ring(8)) == 4
    assert diameter(torus((4, 4))) == 4
    assert diameter(fat_tree(4)) == 1
    apart = make_topology("apart", [Node(0, NodeKind.RANK, "a"), Node(1, NodeKind.RANK, "b")], [])
    assert rank_hops(apart).tolist() == [[0, -1], [-1, 0]]
    with pytest.raises(TopologyError, match="cannot reach"):
        diameter(apart)


def test_a_routed_topology_is_freed_with_its_routing_state():
    # The routing state is cached per topology, weakly: it must not keep the topology alive
    # (calibration builds a topology per evaluation and once grew by 15 MB/s).
    topology = fat_tree(4)
    assert routes(topology, 0, 15)
    gone = weakref.ref(topology)
    del topology
    gc.collect()
    assert gone() is None
