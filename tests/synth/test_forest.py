"""Exact integer tree packings (ForestColl): k whole trees per root at the cut bound."""

import numpy as np
import pytest

from commflow import topology
from commflow.ir import verify
from commflow.sim import lower_bound
from commflow.synth import logical_edges, synthesize
from commflow.synth.forest import forest, mirror
from commflow.synth.trees import tree_seconds

SIZE = 2**30

# Trees per root of the smallest exact packing: with k trees per root each link must carry a
# whole number of trees at the optimal rate x* = B(S*)/|S* ∩ ranks|, i.e. k * bandwidth / x*
# integral for every link (DGX-1: 6, as SCCL/TACCL's 6-chunk allgather; DGX H100 x2: the
# NIC cut gives x* = 100/3 GB/s per root and 50 GB/s NICs carry 1.5 k trees).
EXACT = {
    "dgx1": 6,
    "dgx-a100": 1,
    "ndv2x2": 1,
    "torus4x4": 4,
    "dgx-h100x2": 2,
    "dgx-a100x2": 13,
}


def _depth(parent: tuple[int, ...], v: int) -> int:
    hops = 0
    while parent[v] >= 0:
        v = parent[v]
        hops += 1
        assert hops <= len(parent), "parent pointers form a cycle"
    return hops


@pytest.mark.parametrize("name", sorted(EXACT))
@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_exact_packing_has_k_spanning_trees_per_root_at_the_cut_bound(name, collective):
    topo = topology.load(name)
    edges = logical_edges(topo)
    if collective == "reducescatter":
        edges = edges.reversed()
    found = forest(edges)
    assert found is not None and found.k == EXACT[name] and found.ratio == 1.0
    n = topo.nranks
    assert len(found.trees) == found.k * n
    for root in range(n):
        trees = [t for t in found.trees if t.root == root]
        assert len(trees) == found.k
        for tree in trees:
            assert tree.weight == 1 / found.k
            assert tree.parent[root] == -1 and sum(p == -1 for p in tree.parent) == 1
            assert all(_depth(tree.parent, v) < n for v in range(n))
    seconds = tree_seconds(edges, found.trees)
    bound = lower_bound(collective, topo, SIZE).bandwidth_time
    assert seconds.max() * SIZE / n == pytest.approx(bound, rel=1e-9)


def test_dgx1_trees_use_each_nvlink_for_whole_trees():
    edges = logical_edges(topology.dgx1())
    found = forest(edges)
    per_link = np.zeros((8, 8), dtype=int)
    for tree in found.trees:
        for v, p in enumerate(tree.parent):
            if p >= 0:
                per_link[p, v] += 1
    # 6 trees per root, 8 roots, 7 arcs each spread over 48 NVLink directions: 336 / 48 = 7
    # trees per NVLink (two NVLinks between the doubly connected pairs carry 14).
    nvlinks = topology.dgx1().bandwidth_matrix[:8, :8] / 25e9
    assert np.array_equal(per_link, 7 * nvlinks.astype(int))


def test_mirror_reuses_allgather_trees_for_reductions_on_symmetric_links():
    edges = logical_edges(topology.load("dgx-h100x2"))
    found = forest(edges)
    assert mirror(found, edges.reversed()) is found


def test_mirror_refuses_trees_that_miss_the_other_directions_bound():
    # DGX A100 x2 has the same shape as DGX H100 x2 but needs 13 trees per root, not 2.
    found = forest(logical_edges(topology.load("dgx-h100x2")))
    assert mirror(found, logical_edges(topology.load("dgx-a100x2")).reversed()) is None


def test_fat_tree_is_left_to_column_generation():
    # Splitting a three-level fat-tree only along shortest routes leaves capacity at the
    # core switches, so the construction gives up (synthesize falls back).
    assert forest(logical_edges(topology.load("fat-tree4"))) is None


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
def test_synthesize_uses_the_exact_packing_and_the_program_verifies(collective):
    topo = topology.load("dgx-h100x2")
    program = synthesize(collective, topo, pieces=1)
    params = dict(program.params)
    assert params["packing"] == "forest" and params["units"] == EXACT["dgx-h100x2"]
    verify(program)


def test_synthesize_falls_back_to_column_generation_on_the_fat_tree():
    params = dict(synthesize("allgather", topology.load("fat-tree4"), pieces=1).params)
    assert params["packing"] == "columns"
