"""ring_order: rings follow the fastest direct links."""

from __future__ import annotations

import pytest

from commflow.topology import dgx1, dgx_a100, load, mi250, ndv2, ring, ring_order, switch


def _links(topology, order):
    n = len(order)
    return [topology.link(order[i], order[(i + 1) % n]) for i in range(n)]


def _is_permutation(order, n):
    return sorted(order) == list(range(n))


def test_dgx1_ring_uses_double_nvlinks_only():
    topology = dgx1()
    order = ring_order(topology)
    assert _is_permutation(order, 8)
    assert all(link is not None and link.bandwidth == 50e9 for link in _links(topology, order))


def test_ndv2x2_ring_crosses_boxes_on_the_two_ib_links():
    topology = ndv2(2)
    order = ring_order(topology)
    links = _links(topology, order)
    assert all(link is not None for link in links)
    crossing = [lk for lk in links if topology.box_of(lk.src) != topology.box_of(lk.dst)]
    assert len(crossing) == 2 and all(lk.bandwidth == 12.5e9 for lk in crossing)


def test_mi250_ring_uses_direct_xgmi_links():
    topology = mi250(1)
    order = ring_order(topology)
    assert all(link is not None for link in _links(topology, order))


def test_multi_box_mi250_orders_each_box_contiguously():
    order = ring_order(mi250(2))
    assert sorted(order[:16]) == list(range(16)) and sorted(order[16:]) == list(range(16, 32))


@pytest.mark.parametrize("topology", [ring(6), switch(5), dgx_a100(2), load("fc8")])
def test_identity_when_nothing_is_gained(topology):
    assert ring_order(topology) == tuple(range(topology.nranks))


def test_nccl_rings_cross_boxes_rail_to_rail_and_use_every_nic_once_each_way():
    from commflow.topology import NodeKind, nccl_rings

    topology = load("dgx-a100x2")
    rings = nccl_rings(topology)
    assert len(rings) == 8
    nic_of = {link.src: link.dst for link in topology.links
              if link.src < topology.nranks and topology.nodes[link.dst].kind is NodeKind.NIC}
    rail = {r: [u.dst for u in topology.out_links(nic_of[r])
                if topology.nodes[u.dst].kind is NodeKind.SWITCH] for r in nic_of}
    sends, receives = [], []
    for order in rings:
        assert _is_permutation(order, 16)
        for i, src in enumerate(order):
            dst = order[(i + 1) % 16]
            if topology.box_of(src) != topology.box_of(dst):
                assert rail[src] == rail[dst]
                sends.append(src)
                receives.append(dst)
    assert sorted(sends) == sorted(receives) == list(range(16))
    assert nccl_rings(load("dgx-a100")) == (ring_order(load("dgx-a100")),)  # NVSwitch box


@pytest.mark.parametrize("make", [dgx1, mi250])
def test_nccl_rings_over_direct_links_take_each_parallel_link_at_most_once(make):
    from commflow.topology import nccl_rings

    topology = make()
    rings = nccl_rings(topology)
    assert len(rings) >= 4
    used: dict[tuple[int, int], int] = {}
    for order in rings:
        assert _is_permutation(order, topology.nranks)
        for i, src in enumerate(order):
            hop = (src, order[(i + 1) % len(order)])
            used[hop] = used.get(hop, 0) + 1
    for (src, dst), times in used.items():
        assert topology.link(src, dst) is not None and times <= topology.link(src, dst).count
