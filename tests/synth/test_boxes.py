"""Exact packings composed from one box's packing (``synth.boxes.by_box``): each root's share
enters every other box at the root's local rank and spreads along that box's copy of the box
trees; kept only at the cut bound."""

from dataclasses import replace
from fractions import Fraction

import pytest

from commflow import topology
from commflow.ir import verify
from commflow.sim import lower_bound
from commflow.synth import api, by_box, forest, logical_edges, synthesize
from commflow.synth.boxes import _alike_boxes, _box_topology
from commflow.synth.lower import depth
from commflow.synth.trees import tree_seconds
from commflow.topology import make_topology

SIZE = 2**30


@pytest.mark.parametrize(
    ("name", "box", "k"), [("mi250x4", "mi250", 3), ("dgx-a100x4", "dgx-a100", 1)]
)
@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_composed_trees_span_every_box_at_the_cut_bound(name, box, k, collective):
    topo = topology.load(name)
    edges = logical_edges(topo)
    inner_edges = logical_edges(topology.load(box))
    if collective == "reducescatter":
        edges, inner_edges = edges.reversed(), inner_edges.reversed()
    found = by_box(edges, most_trees=24)
    inner = forest(inner_edges)
    assert found is not None and found.k == inner.k == k and found.ratio == 1.0
    g = topology.load(box).nranks
    assert len(found.trees) == k * topo.nranks
    assert depth(found.trees) <= depth(inner.trees) + 1
    for tree in found.trees:
        home, i = divmod(tree.root, g)
        assert tree.weight == 1 / k
        for b in range(topo.nranks // g):
            entry = b * g + i
            assert tree.parent[entry] == (-1 if b == home else tree.root)
            # inside the box: local parents are those of one of i's box trees
            local = tuple(-1 if v == i else tree.parent[b * g + v] - b * g for v in range(g))
            assert any(t.root == i and t.parent == local for t in inner.trees)
    bound = lower_bound(collective, topo, SIZE).bandwidth_time
    assert tree_seconds(edges, found.trees).max() * SIZE / topo.nranks == pytest.approx(
        bound, rel=1e-9
    )


def test_mi250x4_composition_is_far_shallower_than_the_whole_cluster_packing():
    edges = logical_edges(topology.load("mi250x4"))
    assert depth(by_box(edges, most_trees=24).trees) <= 9 < depth(forest(edges).trees)


def test_mi250x2_composition_is_not_exact_and_is_refused():
    """Entries leave 37/120 of each MI250 x2 NIC spare, which relieves the xGMI links into
    each GCD pair (the binding cut: 332 GB/s in for 30 roots' data), but a 50 GB/s xGMI link
    then carries 375/83 k trees: exact only with 83 trees per root, beyond those tried."""
    assert by_box(logical_edges(topology.load("mi250x2")), most_trees=24) is None


def test_refused_without_alike_boxes_or_direct_entries():
    assert by_box(logical_edges(topology.load("dgx1")), most_trees=24) is None  # one box
    # NDv2: one NIC per box (GPU 0 sends, GPU 1 receives), so GPU 3 cannot reach box 1's GPU 3
    assert by_box(logical_edges(topology.load("ndv2x2")), most_trees=24) is None
    topo = topology.load("mi250x2")
    slower = [
        replace(lk, bandwidth=lk.bandwidth / 2) if (lk.src, lk.dst) == (16, 17) else lk
        for lk in topo.links
    ]
    unlike = make_topology("mi250x2-unlike", topo.nodes, slower)
    assert by_box(logical_edges(unlike), most_trees=24) is None


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_programs_use_the_composition_and_verify(collective):
    topo = topology.load("dgx-a100x4")
    program = synthesize(collective, topo, pieces=2)
    params = dict(program.params)
    assert params["packing"] == "forest" and params["units"] == 1
    verify(program)


def test_default_pieces_follow_the_composed_depth():
    """DGX A100 x4: composed trees 2 levels deep, the whole-cluster packing's 4."""
    topo = topology.load("dgx-a100x4")
    edges = logical_edges(topo)
    assert depth(by_box(edges, most_trees=24).trees) == 2 < depth(forest(edges).trees) == 4
    params = dict(synthesize("allgather", topo).params)
    assert params["pieces"] == 2 * api.PIECES_PER_LEVEL


def test_box_topology_keeps_only_links_on_routes_between_its_ranks():
    """DGX A100 x4: the NICs and rail switches lie on no shortest route inside a box (the
    NVSwitch is shorter) and are dropped; MI250 x2 keeps the IB switch, two hops between
    GCDs with no xGMI link, as a loop-back with what the entries leave of each NIC."""
    for name, switch in [("dgx-a100x4", "box0.nvswitch"), ("mi250x2", "ib")]:
        topo = topology.load(name)
        box, _ = _box_topology(topo, _alike_boxes(topo)[0], [Fraction(1)] * len(topo.links))
        assert [n.name for n in box.nodes[box.nranks :]] == [switch]
        assert box.nranks == topo.nranks // topo.nboxes
