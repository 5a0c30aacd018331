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
from commflow.topology import load

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
