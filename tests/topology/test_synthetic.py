"""Synthetic presets: exact node/link structure against closed forms and coordinate references."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commflow.errors import TopologyError
from commflow.topology import NodeKind, fat_tree, fully_connected, line, ring, switch, torus


def undirected(topology) -> set[frozenset[int]]:
    return {frozenset((lk.src, lk.dst)) for lk in topology.links}


@pytest.mark.parametrize("n", range(1, 10))
def test_ring_line_and_fully_connected_links(n):
    ring_pairs = {frozenset((i, (i + 1) % n)) for i in range(n) if (i + 1) % n != i}
    assert undirected(ring(n)) == ring_pairs
    assert len(ring(n).links) == 2 * len(ring_pairs)
    assert undirected(line(n)) == {frozenset((i, i + 1)) for i in range(n - 1)}
    assert len(fully_connected(n).links) == n * (n - 1)
    for topo in (ring(n), line(n), fully_connected(n)):
        assert topo.nranks == topo.nnodes == n
        assert all(lk.count == 1 for lk in topo.links)


def test_ring_of_two_is_the_line_of_two():
    assert [(lk.src, lk.dst, lk.bandwidth) for lk in ring(2).links] == [
        (0, 1, 25e9),
        (1, 0, 25e9),
    ]


def test_defaults_and_overrides():
    assert {(lk.bandwidth, lk.latency) for lk in ring(4).links} == {(25e9, 1e-6)}
    topo = switch(3, bandwidth=10e9, latency=2e-6)
    assert {(lk.bandwidth, lk.latency) for lk in topo.links} == {(10e9, 2e-6)}


def test_switch_star():
    topo = switch(5)
    assert topo.nranks == 5 and topo.nnodes == 6
    assert topo.nodes[5].kind is NodeKind.SWITCH
    assert {n.box for n in topo.nodes} == {0}
    assert undirected(topo) == {frozenset((i, 5)) for i in range(5)}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_torus_matches_coordinate_reference(dims):
    coords = list(itertools.product(*(range(d) for d in dims)))
    expected = set()
    for c in coords:
        for k, size in enumerate(dims):
            nb = list(c)
            nb[k] = (c[k] + 1) % size
            if tuple(nb) != c:
                expected.add(frozenset((coords.index(c), coords.index(tuple(nb)))))
    topo = torus(tuple(dims))
    assert topo.nranks == math.prod(dims)
    assert undirected(topo) == expected
    degree = sum(2 if d > 2 else d - 1 for d in dims)
    assert all(len(topo.out_links(r)) == degree for r in range(topo.nranks))


def test_torus_sizes():
    assert len(torus((4, 4)).links) == 16 * 4
    assert len(torus((4, 4, 4)).links) == 64 * 6
    assert torus((4, 4)).name == "torus4x4"


@pytest.mark.parametrize("k", [2, 4, 6, 8])
def test_fat_tree_structure(k):
    half = k // 2
    topo = fat_tree(k)
    assert topo.nranks == k**3 // 4
    switches = [n for n in topo.nodes if n.kind is NodeKind.SWITCH]
    assert len(switches) == k * k + half * half
    assert len(topo.links) == 2 * 3 * k**3 // 4
    for s in switches:  # every switch has k ports
        assert len(topo.out_links(s.id)) == k
    for host in range(topo.nranks):
        (uplink,) = topo.out_links(host)
        pod, edge = host // (half * half), host // half % half
        assert topo.nodes[uplink.dst].name == f"edge{pod}.{edge}"
    assert {n.box for n in topo.nodes} == {None}


def test_fat_tree_4_counts():
    topo = fat_tree(4)
    assert topo.nranks == 16 and topo.nnodes - topo.nranks == 20
    assert sum(n.name.startswith("core") for n in topo.nodes) == 4


@pytest.mark.parametrize(
    "build",
    [lambda: ring(0), lambda: line(-1), lambda: switch(1.5), lambda: fat_tree(3),
     lambda: fat_tree(0), lambda: torus(()), lambda: torus((4, 0))],
)  # fmt: skip
def test_bad_sizes_raise(build):
    with pytest.raises(TopologyError):
        build()
