"""Lower bounds: known checks (REFERENCES.md), closed forms and brute-force cut enumeration."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commflow.collectives import Collective, busbw_factor
from commflow.errors import CommflowError, TopologyError
from commflow.sim.bounds import lower_bound
from commflow.topology import (
    Link,
    Node,
    NodeKind,
    Topology,
    dgx1,
    dgx_a100,
    fat_tree,
    fully_connected,
    make_topology,
    mi250,
    ndv2,
    ring,
    switch,
    torus,
)

from .leaves import two_leaves
from .references import ENTERING, brute_force, crossing, cut_time, hop_matrix, min_hop_latency

BW = 25e9
MB = 8e6
ROOTED = {Collective.BROADCAST, Collective.REDUCE, Collective.SCATTER, Collective.GATHER}
CUT_KINDS = [c for c in Collective if c is not Collective.ALLREDUCE]


# Known checks from REFERENCES.md.


def test_dgx1_allgather_two_steps_and_seven_sixths_shard_per_nvlink():
    bound = lower_bound("allgather", dgx1(), MB)
    shard = MB / 8
    assert bound.steps == 2
    assert bound.bandwidth_time == pytest.approx(7 / 6 * shard / BW, rel=1e-12)
    assert bound.algbw / 1e9 == pytest.approx(171.43, abs=0.005)
    assert bound.cut_bandwidth == 6 * BW
    assert bound.binding == "bandwidth" and bound.exact


def test_dgx1_alltoall_cut_bound_eight_thirds():
    bound = lower_bound(Collective.ALLTOALL, dgx1(), MB)
    assert bound.bandwidth_time == pytest.approx(8 / 3 * (MB / 8) / BW, rel=1e-12)
    assert bound.exact
    assert bound.cut_bandwidth == 6 * BW
    assert len(bound.cut) == 4


def test_dgx_a100_allgather_algbw():
    bound = lower_bound("allgather", dgx_a100(1), MB)
    assert bound.algbw == pytest.approx(8 * 300e9 / 7, rel=1e-12)
    assert bound.busbw == pytest.approx(bound.algbw * 7 / 8, rel=1e-12)
    assert bound.cut_bandwidth == 300e9


# Closed forms.


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_ring_allgather_is_n_minus_one_shards_over_two_links(n):
    bound = lower_bound("allgather", ring(n, bandwidth=BW), MB)
    assert bound.bandwidth_time == pytest.approx((MB / n) * (n - 1) / (2 * BW), rel=1e-12)
    assert len(bound.cut) == n - 1 and bound.cut_bandwidth == 2 * BW


@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_switch_allgather_is_n_minus_one_shards_over_one_port(n):
    bound = lower_bound("allgather", switch(n, bandwidth=BW), MB)
    assert bound.bandwidth_time == pytest.approx((MB / n) * (n - 1) / BW, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 7])
def test_fully_connected_allgather_is_one_shard_per_link(n):
    bound = lower_bound("allgather", fully_connected(n, bandwidth=BW), MB)
    assert bound.bandwidth_time == pytest.approx((MB / n) / BW, rel=1e-12)


@pytest.mark.parametrize("n", [3, 6])
@pytest.mark.parametrize("root", [0, 2])
def test_ring_broadcast_is_size_over_two_links(n, root):
    bound = lower_bound("broadcast", ring(n, bandwidth=BW), MB, root=root)
    assert bound.bandwidth_time == pytest.approx(MB / (2 * BW), rel=1e-12)
    assert root in bound.cut
    assert bound.steps == n // 2


@pytest.mark.parametrize("kind", ["scatter", "gather"])
def test_switch_scatter_and_gather_move_n_minus_one_blocks_through_the_root_port(kind):
    bound = lower_bound(kind, switch(6, bandwidth=BW), MB, root=4)
    assert bound.bandwidth_time == pytest.approx(5 * (MB / 6) / BW, rel=1e-12)
    assert bound.cut == (4,)


def test_fat_tree_alltoall_single_host_cut_and_not_exact():
    bound = lower_bound("alltoall", fat_tree(4, bandwidth=BW), MB)
    assert not bound.exact
    assert bound.bandwidth_time == pytest.approx(15 * (MB / 16) / BW, rel=1e-12)


def test_large_torus_alltoall_tries_the_rank_id_halves():
    topo = torus((8, 8), bandwidth=BW)
    bound = lower_bound("alltoall", topo, MB)
    halves = cut_time(topo, Collective.ALLTOALL, set(range(32)), MB, 0)
    assert halves == pytest.approx(32 * 32 * (MB / 64) / (16 * BW), rel=1e-12)
    assert bound.bandwidth_time >= halves * (1 - 1e-12)
    assert not bound.exact


def test_fat_tree_16_allgather():
    topo = fat_tree(16, bandwidth=BW)
    bound = lower_bound("allgather", topo, 1024 * MB)
    assert bound.bandwidth_time == pytest.approx(MB * 1023 / BW, rel=1e-12)
    assert bound.steps == 1
    assert bound.latency_time == pytest.approx(2e-6)


# Relations between collectives.


@pytest.mark.parametrize(
    "topo", [dgx1(), ndv2(2), ring(5), switch(4)], ids=["dgx1", "ndv2x2", "ring5", "switch4"]
)
def test_allreduce_is_reducescatter_plus_allgather(topo):
    allreduce = lower_bound("allreduce", topo, MB)
    rs = lower_bound("reducescatter", topo, MB)
    ag = lower_bound("allgather", topo, MB)
    assert allreduce.bandwidth_time == pytest.approx(rs.bandwidth_time + ag.bandwidth_time)
    assert allreduce.cut in (rs.cut, ag.cut)
    assert allreduce.busbw == pytest.approx(
        allreduce.algbw * busbw_factor(Collective.ALLREDUCE, topo.nranks)
    )


@pytest.mark.parametrize(
    "topo",
    [dgx1(), dgx_a100(2), fat_tree(4), torus((4, 4)), mi250(1)],
    ids=["dgx1", "a100x2", "fattree4", "torus4x4", "mi250"],
)
def test_reverse_graph_consistency_on_symmetric_graphs(topo):
    ag = lower_bound("allgather", topo, MB)
    assert lower_bound("reducescatter", topo, MB).bandwidth_time == pytest.approx(ag.bandwidth_time)
    assert lower_bound("gather", topo, MB, root=1).bandwidth_time == pytest.approx(
        lower_bound("scatter", topo, MB, root=1).bandwidth_time
    )
    assert lower_bound("reduce", topo, MB, root=1).bandwidth_time == pytest.approx(
        lower_bound("broadcast", topo, MB, root=1).bandwidth_time
    )


def test_directed_ndv2_pair_bounds_reduce_through_the_receiving_gpu():
    topo = ndv2(2)
    reduce = lower_bound("reduce", topo, MB, root=1)
    broadcast = lower_bound("broadcast", topo, MB, root=1)
    # Box 1 reaches box 0 only over GPU 8 -> GPU 1 (12.5 GB/s); box 0 reaches box 1 likewise.
    assert reduce.bandwidth_time == pytest.approx(MB / 12.5e9, rel=1e-12)
    assert broadcast.bandwidth_time == pytest.approx(MB / 12.5e9, rel=1e-12)
    hops = hop_matrix(topo)
    assert reduce.steps == max(hops[v][1] for v in range(16))
    assert broadcast.steps == max(hops[1][v] for v in range(16))


# Presets: finite bounds whose binding cut reproduces the reported time.


PRESETS = {
    "a100x2": dgx_a100(2),
    "ndv2x2": ndv2(2),
    "mi250": mi250(1),
    "fattree4": fat_tree(4),
    "torus4x4": torus((4, 4)),
}


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("kind", CUT_KINDS, ids=[c.value for c in CUT_KINDS])
def test_preset_bound_is_finite_and_reproduced_by_its_cut(name, kind):
    topo = PRESETS[name]
    root = 3 if kind in ROOTED else 0
    bound = lower_bound(kind, topo, MB, root=root)
    assert 0 < bound.time < math.inf
    assert bound.cut == tuple(sorted(bound.cut))
    assert cut_time(topo, kind, set(bound.cut), MB, root) == pytest.approx(
        bound.bandwidth_time, rel=1e-12
    )
    assert bound.cut_bandwidth == pytest.approx(
        crossing(topo, set(bound.cut), entering=kind in ENTERING), rel=1e-12
    )
    assert bound.time == max(bound.bandwidth_time, bound.latency_time)
    assert bound.algbw == pytest.approx(MB / bound.time)


# Latency bound.


def test_latency_binds_for_small_messages_on_a_ring():
    bound = lower_bound("allgather", ring(6, bandwidth=BW, latency=2e-6), 64)
    assert bound.steps == 3
    assert bound.latency_time == pytest.approx(3 * 2e-6)
    assert bound.binding == "latency" and bound.time == bound.latency_time


def test_hop_latency_counts_the_links_through_switches():
    bound = lower_bound("alltoall", fat_tree(4, latency=1e-6), 16)
    assert bound.steps == 1
    assert bound.latency_time == pytest.approx(2e-6)


# Edge cases and errors.


@pytest.mark.parametrize("kind", list(Collective), ids=[c.value for c in Collective])
def test_single_rank_is_free(kind):
    bound = lower_bound(kind, switch(1), MB)
    assert (bound.time, bound.steps, bound.cut, bound.latency_time) == (0.0, 0, (), 0.0)
    assert bound.algbw == math.inf
    assert bound.busbw == (math.inf if busbw_factor(kind, 1) else 0.0)


def test_numpy_sizes_are_accepted():
    assert lower_bound("allgather", ring(4), np.int64(4096)).size == 4096


def test_zero_size_with_zero_latency_has_infinite_algbw():
    bound = lower_bound("allgather", ring(4, latency=0.0), 0)
    assert bound.time == 0.0 and bound.algbw == math.inf


@pytest.mark.parametrize("size", [-1, math.nan, math.inf, "8M"])
def test_bad_size_is_rejected(size):
    with pytest.raises(CommflowError, match="size"):
        lower_bound("allgather", ring(4), size)


def test_unknown_collective_and_bad_root_are_rejected():
    with pytest.raises(CommflowError, match="unknown collective"):
        lower_bound("allshuffle", ring(4), MB)
    with pytest.raises(CommflowError, match="root 9"):
        lower_bound("broadcast", ring(4), MB, root=9)


def test_disconnected_ranks_raise_topology_error():
    nodes = [Node(i, NodeKind.RANK, f"r{i}") for i in range(3)]
    topo = make_topology("split", nodes, [Link(0, 1, BW, 0.0), Link(1, 0, BW, 0.0)])
    with pytest.raises(TopologyError, match=r"no link can leave nodes \[.*\]"):
        lower_bound("allgather", topo, MB)
    with pytest.raises(TopologyError, match="enter"):
        lower_bound("reduce", topo, MB)


@pytest.mark.parametrize(
    ("sizes", "up", "down"),
    [((3, 3), 5e9, 5e9), ((2, 5), 10e9, 30e9), ((1, 6), 40e9, 3e9), ((4, 3), 60e9, 20e9)],
)
@pytest.mark.parametrize("kind", CUT_KINDS, ids=[c.value for c in CUT_KINDS])
def test_two_leaf_bounds_equal_brute_force(sizes, up, down, kind):
    topo = two_leaves(sizes, up, down)
    for root in (0, topo.nranks - 1):
        bound = lower_bound(kind, topo, MB, root=root)
        expected = brute_force(topo, kind, MB, root)
        assert bound.bandwidth_time == pytest.approx(expected, rel=1e-12)


# Property: the flow searches equal brute-force enumeration on small random graphs.


@st.composite
def small_topologies(draw) -> tuple[Topology, int]:
    nnodes = draw(st.integers(2, 7))
    nranks = draw(st.integers(2, nnodes))
    latency = st.integers(0, 5).map(lambda k: k * 1e-6)
    pairs = [(u, v) for u in range(nnodes) for v in range(nnodes) if u != v]
    chosen = set(draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs))))
    if draw(st.integers(0, 3)):
        chosen |= {(i, (i + 1) % nnodes) for i in range(nnodes)}
    if draw(st.booleans()):
        chosen |= {(v, u) for u, v in chosen}
    # Whole GB/s keep capacities in int32 (scipy); arbitrary byte counts exceed it (networkx).
    if draw(st.booleans()):
        bandwidth = st.integers(1, 40).map(lambda k: k * 1e9)
    else:
        bandwidth = st.integers(10**9, 10**11).map(float)
    # Links between clusters are 16x thinner, so the binding cut is often a whole cluster.
    cluster = draw(st.lists(st.integers(0, 2), min_size=nnodes, max_size=nnodes))
    links = [
        Link(u, v, draw(bandwidth) / (1 if cluster[u] == cluster[v] else 16), draw(latency))
        for u, v in sorted(chosen)
    ]
    kinds = [NodeKind.RANK] * nranks + [NodeKind.SWITCH] * (nnodes - nranks)
    nodes = [Node(i, kind, f"n{i}") for i, kind in enumerate(kinds)]
    return make_topology("random", nodes, links), draw(st.integers(0, nranks - 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=small_topologies(), kind=st.sampled_from(CUT_KINDS))
def test_flow_bounds_equal_brute_force(case, kind):
    topo, root = case
    expected = brute_force(topo, kind, MB, root)
    if expected == math.inf:
        with pytest.raises(TopologyError):
            lower_bound(kind, topo, MB, root=root)
        return
    bound = lower_bound(kind, topo, MB, root=root)
    assert bound.bandwidth_time == pytest.approx(expected, rel=1e-9)
    assert bound.exact
    assert cut_time(topo, kind, set(bound.cut), MB, root) == pytest.approx(expected, rel=1e-9)
    hops = hop_matrix(topo)
    if kind in (Collective.BROADCAST, Collective.SCATTER):
        steps = max(hops[root])
    elif kind in (Collective.REDUCE, Collective.GATHER):
        steps = max(row[root] for row in hops)
    else:
        steps = max(map(max, hops))
    assert bound.steps == steps
    assert bound.latency_time == pytest.approx(steps * min_hop_latency(topo), abs=1e-15)
