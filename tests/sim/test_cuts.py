"""Cut machinery: exact integer capacities, the Dinkelbach search, alltoall candidates."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from commflow.errors import TopologyError
from commflow.sim import cuts
from commflow.sim.cuts import allgather_search, alltoall_cut, flow_network
from commflow.topology import Link, Node, NodeKind, dgx1, duplex, fat_tree, make_topology, mi250

from .leaves import two_leaves

BW = 25e9


def test_capacities_are_exact_integers_of_a_common_unit():
    net = flow_network(dgx1())
    assert net.unit == 25_000_000_000
    assert sorted(set(net.capacity)) == [1, 2]
    net = flow_network(mi250(2))
    assert net.unit == 2_000_000_000
    assert sorted(set(net.capacity)) == [8, 25, 50, 100]
    for link, cap in zip(mi250(2).links, net.capacity, strict=True):
        assert cap * net.unit == link.bandwidth


def test_fractional_bandwidths_keep_an_exact_unit():
    nodes = [Node(i, NodeKind.RANK, f"r{i}") for i in range(2)]
    topo = make_topology("tiny", nodes, [Link(0, 1, 12.5, 0.0), Link(1, 0, 0.25, 0.0)])
    net = flow_network(topo)
    assert net.unit == Fraction(1, 4) and net.capacity == (50, 1)


def test_reverse_swaps_link_directions():
    topo = dgx1()
    forward, backward = flow_network(topo), flow_network(topo, reverse=True)
    assert np.array_equal(forward.src, backward.dst) and np.array_equal(forward.dst, backward.src)
    inside = forward.mask([0])
    assert forward.capacity_leaving(inside) == backward.capacity_leaving(~inside) == 6


def test_infinite_bandwidth_is_rejected():
    nodes = [Node(i, NodeKind.RANK, f"r{i}") for i in range(2)]
    with pytest.raises(TopologyError, match="finite"):  # refused when the topology is made
        flow_network(make_topology("inf", nodes, duplex(0, 1, math.inf, 0.0)))


def test_search_improves_strictly_until_the_leaf_cut():
    topo = two_leaves((4, 4), 5e9)
    tried = allgather_search(flow_network(topo))
    assert len(tried) >= 2
    for before, after in zip(tried, tried[1:], strict=False):
        assert after.weight * before.capacity > before.weight * after.capacity
    binding = tried[-1]
    assert binding.nodes in ((0, 1, 2, 3, 8), (4, 5, 6, 7, 9))
    assert (binding.weight, binding.bandwidth) == (4, 5e9)


def test_large_capacities_take_the_exact_networkx_path():
    # One extra byte/s on link 0 -> 1 leaves no common unit that fits int32.
    links = [
        Link(lk.src, lk.dst, lk.bandwidth + ((lk.src, lk.dst) == (0, 1)), lk.latency)
        for lk in dgx1().links
    ]
    topo = make_topology("dgx1-perturbed", dgx1().nodes, links)
    net = flow_network(topo)
    assert max(net.capacity) > 2**31
    binding = allgather_search(net)[-1]
    assert binding.weight == 7 and binding.bandwidth == 6 * BW


def test_structured_alltoall_candidates_match_enumeration(monkeypatch):
    exact, is_exact = alltoall_cut(flow_network(dgx1()))
    monkeypatch.setattr(cuts, "ENUMERATION_LIMIT", 0)
    structured, not_exact = alltoall_cut(flow_network(dgx1()))
    assert is_exact and not not_exact
    assert structured.weight * exact.capacity == exact.weight * structured.capacity


def test_alltoall_finds_an_interleaved_leaf_below_its_switch():
    topo = two_leaves((12, 12), 1e9, interleave=True)
    cut, exact = alltoall_cut(flow_network(topo))
    assert not exact
    assert (cut.weight, cut.bandwidth) == (12 * 12, 1e9)


def test_below_switches_of_a_fat_tree_are_its_subtrees():
    topo = fat_tree(4)
    below = [tuple(np.flatnonzero(m)) for m in cuts._below_switches(flow_network(topo))]
    edge0, agg0 = 16, 24
    assert (0, 1, edge0) in below
    assert (0, 1, 2, 3, edge0, edge0 + 1, agg0) in below
    assert len(below) == topo.nnodes - topo.nranks
