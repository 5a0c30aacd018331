"""Tree packing reaches the exact cut bound of sim.lower_bound; integral shares keep it."""

import pytest

from commflow import topology
from commflow.sim import lower_bound
from commflow.synth import integral_shares, logical_edges, pack_trees

SIZE = 2**30


@pytest.mark.parametrize(
    "topo",
    [
        topology.dgx1(),
        topology.dgx_a100(),
        topology.ndv2(2),
        topology.mi250(),
        topology.load("torus4x4"),
        topology.load("fat-tree4"),
    ],
    ids=lambda t: t.name,
)
@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_packing_time_equals_cut_bound(topo, collective):
    edges = logical_edges(topo)
    if collective == "reducescatter":
        edges = edges.reversed()
    packing = pack_trees(edges)
    shard = SIZE / topo.nranks
    bound = lower_bound(collective, topo, SIZE).bandwidth_time
    assert packing.seconds_per_byte * shard == pytest.approx(bound, rel=1e-9)
    for root in range(topo.nranks):
        trees = packing.of_root(root)
        assert sum(t.weight for t in trees) == pytest.approx(1.0, rel=1e-9)
        for t in trees:
            assert t.parent[root] == -1
            assert sum(p == -1 for p in t.parent) == 1


def test_dgx1_allgather_bound_is_seven_sixths_shard_times_per_nvlink():
    edges = logical_edges(topology.dgx1())
    packing = pack_trees(edges)
    assert packing.seconds_per_byte == pytest.approx(7 / 6 / 25e9, rel=1e-9)


def test_dgx1_integral_shares_are_sixths_at_the_optimum():
    edges = logical_edges(topology.dgx1())
    packing = pack_trees(edges)
    shares, units = integral_shares(edges, packing, slack=0.0001)
    assert units == 6
    for root in range(8):
        weights = [t.weight * units for t in shares if t.root == root]
        assert sum(weights) == pytest.approx(units)
        assert all(w == pytest.approx(round(w)) for w in weights)


def test_logical_edges_of_dgx1_are_its_nvlinks():
    edges = logical_edges(topology.dgx1())
    pairs = set(zip(edges.src.tolist(), edges.dst.tolist(), strict=True))
    nvlinks = {
        (0, 1),
        (0, 4),
        (1, 3),
        (2, 3),
        (2, 6),
        (4, 5),
        (5, 7),
        (6, 7),
        (0, 2),
        (0, 3),
        (1, 2),
        (1, 5),
        (3, 7),
        (4, 6),
        (4, 7),
        (5, 6),
    }
    assert pairs == nvlinks | {(v, u) for u, v in nvlinks}


def test_logical_edge_through_switch_loads_both_ports():
    topo = topology.dgx_a100()
    edges = logical_edges(topo)
    assert len(edges.src) == 8 * 7
    row = edges.load[[0]].toarray().ravel()
    assert row.sum() == pytest.approx(2.0)
