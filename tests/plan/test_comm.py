"""Collective times of plan groups: shapes, sub-topologies, fitted lines against simulation."""

from __future__ import annotations

import pytest

from commflow.algorithms import build_for
from commflow.plan.comm import (
    ClusterLinks,
    cluster_links,
    collective_line,
    collective_time,
    group_shape,
    p2p_time,
    shape_topology,
)
from commflow.sim import simulate
from commflow.topology import Node, NodeKind, Topology, duplex, load, make_topology

A100 = cluster_links(load("dgx-a100x4"))


def test_cluster_links_of_dgx_a100():
    assert ClusterLinks(32, 8, 300e9, 25e9, 1e-6, 5e-6) == A100
    single = cluster_links(load("dgx-h100"))
    assert (single.gpus_per_box, single.intra_bandwidth, single.network_bandwidth) == (8, 450e9, 0)


@pytest.mark.parametrize(
    ("size", "stride", "shape"),
    [(8, 1, (8, 1)), (4, 2, (4, 1)), (6, 8, (1, 6)), (8, 4, (2, 4)), (16, 1, (8, 2))],
)
def test_group_shape(size, stride, shape):
    assert group_shape(size, stride, 8) == shape


def test_fitted_line_reproduces_the_simulation_at_a_third_size():
    line = collective_line("allreduce", 2, 4, A100)
    topo = shape_topology(2, 4, A100)
    size = 3 * 2**30
    simulated = simulate(build_for("allreduce", line.algorithm, topo), topo, size).time
    assert line.time(size) == pytest.approx(simulated, rel=1e-3)


def test_ring_allreduce_over_nics_matches_closed_form():
    # one rank per box: the fastest program moves 2(n-1)/n of the array over a 25 GB/s NIC
    n, size = 4, 2**30
    time = collective_time("allreduce", size, n, 8, A100)
    assert time == pytest.approx(2 * (n - 1) / n * size / 25e9, rel=0.02)
    assert time >= 2 * (n - 1) / n * size / 25e9


def test_tp_inside_a_box_is_nvswitch_bound():
    size = 2**28
    time = collective_time("allreduce", size, 8, 1, A100)
    assert time == pytest.approx(2 * 7 / 8 * size / 300e9, rel=0.02)
    assert collective_time("allreduce", size, 1, 1, A100) == 0.0


def test_extrapolated_large_group_follows_the_ring_law():
    links = cluster_links(load("dgx-a100x2"))
    small, large = (collective_time("allreduce", 2**30, n, 8, links) for n in (32, 256))
    assert large / small == pytest.approx((255 / 256) / (31 / 32), rel=0.05)


def test_p2p_inside_and_across_boxes():
    assert p2p_time(1e9, 1, A100) == pytest.approx(2e-6 + 1e9 / 300e9)
    assert p2p_time(1e9, 8, A100) == pytest.approx(10e-6 + 1e9 / 25e9)


def _two_boxes(nic_up: tuple[float, float], intra: tuple[float, float], shared: bool) -> Topology:
    """2 boxes x 2 ranks: an NVSwitch per box (``intra`` per port), NICs (one per rank, or
    one shared per box) at 50 GB/s from the ranks and ``nic_up`` to one network switch."""
    nodes = [Node(r, NodeKind.RANK, f"r{r}", r // 2) for r in range(4)]
    edges = []
    for box in (0, 1):
        sw = len(nodes)
        nodes.append(Node(sw, NodeKind.SWITCH, f"nvs{box}", box))
        for r in (2 * box, 2 * box + 1):
            edges += duplex(r, sw, intra[box], 1e-6)
    net = len(nodes)
    nodes.append(Node(net, NodeKind.SWITCH, "net", None))
    for box in (0, 1):
        for r in ((2 * box,) if shared else (2 * box, 2 * box + 1)):
            nic = len(nodes)
            nodes.append(Node(nic, NodeKind.NIC, f"nic{r}", box))
            for member in ((2 * box, 2 * box + 1) if shared else (r,)):
                edges += duplex(member, nic, 50e9, 1e-6)
            edges += duplex(nic, net, nic_up[box], 5e-6)
    return make_topology("hetero", nodes, edges)


def test_cluster_links_take_the_slowest_box_and_link_on_the_path():
    links = cluster_links(_two_boxes((50e9, 10e9), (300e9, 100e9), shared=False))
    assert links.intra_bandwidth == 100e9  # box 1's NVSwitch ports
    assert links.network_bandwidth == 10e9  # box 1's NIC uplinks, not the 50 GB/s rank->NIC
    assert links.network_latency == 5e-6
    shared = cluster_links(_two_boxes((50e9, 50e9), (300e9, 300e9), shared=True))
    assert shared.network_bandwidth == 25e9  # one 50 GB/s NIC for two GPUs
