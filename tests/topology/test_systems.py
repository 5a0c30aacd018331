"""System presets against the facts of shared/REFERENCES.md ("Topologies")."""

from __future__ import annotations

import pytest

from commflow.errors import TopologyError
from commflow.topology import (
    NodeKind,
    dgx1,
    dgx2,
    dgx_a100,
    dgx_h100,
    diameter,
    fingerprint,
    isomorphic,
    mi250,
    ndv2,
)

from .helpers import out_bandwidth, pair_counts, parse_pairs

# Copied from REFERENCES.md, not from the code under test.
DGX1_TWO = parse_pairs("(0,1) (0,4) (1,3) (2,3) (2,6) (4,5) (5,7) (6,7)")
DGX1_ONE = parse_pairs("(0,2) (0,3) (1,2) (1,5) (3,7) (4,6) (4,7) (5,6)")
MI250_TEXT = """
0:{1:4,4:2,8:1} 1:{0:4,5:1,9:1,10:1} 2:{3:4,6:1,9:1,10:1} 3:{2:4,7:2,11:1}
4:{5:4,0:2,6:1} 5:{4:4,1:1,6:1,7:1} 6:{7:4,2:1,4:1,5:1} 7:{6:4,3:2,5:1}
8:{9:4,12:2,0:1} 9:{8:4,1:1,2:1,13:1} 10:{11:4,1:1,2:1,14:1} 11:{10:4,15:2,3:1}
12:{13:4,8:2,14:1} 13:{12:4,9:1,14:1,15:1} 14:{15:4,10:1,12:1,13:1} 15:{14:4,11:2,13:1}
"""


def mi250_reference() -> dict[tuple[int, int], int]:
    table = {}
    for entry in MI250_TEXT.split():
        src, peers = entry.split(":", 1)
        for peer in peers.strip("{}").split(","):
            dst, count = peer.split(":")
            table[int(src), int(dst)] = int(count)
    return table


def kinds(topology, kind):
    return [n for n in topology.nodes if n.kind is kind]


def test_dgx1_nvlinks():
    topo = dgx1()
    assert topo.name == "dgx1" and topo.nnodes == 8 and len(topo.links) == 32
    counts = pair_counts(topo, range(8))
    assert counts == {**{p: 2 for p in DGX1_TWO}, **{p: 1 for p in DGX1_ONE}}
    for gpu in range(8):
        assert sum(lk.count for lk in topo.out_links(gpu)) == 6
        assert out_bandwidth(topo, gpu) == 150e9
    assert {topo.link(a, b).bandwidth for a, b in DGX1_TWO} == {50e9}
    assert {topo.link(b, a).bandwidth for a, b in DGX1_ONE} == {25e9}
    assert {lk.latency for lk in topo.links} == {1e-6}
    assert diameter(topo) == 2


def test_dgx1_is_one_ndv2_box():
    assert ndv2().name == "ndv2"
    assert fingerprint(dgx1()) == fingerprint(ndv2(1))
    assert isomorphic(dgx1(), ndv2(1))


def test_ndv2_two_boxes_direct_ib():
    topo = ndv2(2)
    assert topo.name == "ndv2x2" and topo.nnodes == 16
    cross = [lk for lk in topo.links if topo.box_of(lk.src) != topo.box_of(lk.dst)]
    assert {(lk.src, lk.dst) for lk in cross} == {(0, 9), (8, 1)}
    assert {(lk.bandwidth, lk.latency) for lk in cross} == {(12.5e9, 5e-6)}
    assert pair_counts(topo, range(8, 16)) == {(a + 8, b + 8): c for (a, b), c in
                                               pair_counts(dgx1(), range(8)).items()}  # fmt: skip


def test_ndv2_more_boxes_share_an_ib_switch():
    topo = ndv2(3)
    (ib,) = kinds(topo, NodeKind.SWITCH)
    assert ib.box is None
    ib_links = {(lk.src, lk.dst) for lk in topo.links if ib.id in (lk.src, lk.dst)}
    assert ib_links == {(0, ib.id), (8, ib.id), (16, ib.id), (ib.id, 1), (ib.id, 9), (ib.id, 17)}
    assert {topo.link(*p).bandwidth for p in ib_links} == {12.5e9}


def test_dgx2_nvswitch_and_ib():
    one = dgx2()
    assert one.nranks == 16 and len(kinds(one, NodeKind.SWITCH)) == 1
    assert {(lk.bandwidth, lk.count) for lk in one.links} == {(125e9, 1)}
    assert len(one.links) == 32  # a port per GPU, never a full mesh
    topo = dgx2(3)
    ib = {(lk.src, lk.dst) for lk in topo.links if lk.bandwidth == 12.5e9}
    expected = {(b * 16 + 2 * k + 1, (b + 1) % 3 * 16 + 2 * k) for b in range(3) for k in range(8)}
    assert ib == expected and len(ib) == 24
    switches = kinds(topo, NodeKind.SWITCH)
    assert [s.box for s in switches] == [0, 1, 2]
    for s in switches:
        assert {lk.dst for lk in topo.out_links(s.id)} == set(range(s.box * 16, s.box * 16 + 16))


@pytest.mark.parametrize(
    ("build", "port", "nic"), [(dgx_a100, 300e9, 25e9), (dgx_h100, 450e9, 50e9)]
)
def test_rail_optimized_boxes(build, port, nic):
    one = build()
    assert one.nnodes == 9 and not kinds(one, NodeKind.NIC)
    assert {lk.bandwidth for lk in one.links} == {port}
    topo = build(2)
    nics, switches = kinds(topo, NodeKind.NIC), kinds(topo, NodeKind.SWITCH)
    assert len(nics) == 16
    rails = [s for s in switches if s.box is None]
    assert len(rails) == 2 and len(switches) == 4
    for rank in range(16):
        (gpu_nic,) = [lk.dst for lk in topo.out_links(rank) if lk.dst in {n.id for n in nics}]
        assert topo.nodes[gpu_nic].box == rank // 8
        assert topo.link(rank, gpu_nic).bandwidth == topo.link(gpu_nic, rank).bandwidth == nic
        (rail,) = [lk.dst for lk in topo.out_links(gpu_nic) if lk.dst != rank]
        assert rail == rails[rank % 2].id
        assert topo.link(gpu_nic, rail).bandwidth == nic
        assert topo.link(gpu_nic, rail).latency == 5e-6
    assert diameter(topo) == 2


def test_mi250_table_is_symmetric_with_seven_links_each():
    ref = mi250_reference()
    assert all(ref[b, a] == c for (a, b), c in ref.items())
    assert all(sum(c for (a, _), c in ref.items() if a == g) == 7 for g in range(16))
    topo = mi250()
    assert topo.nnodes == 16
    assert {(lk.src, lk.dst): lk.count for lk in topo.links} == ref
    for lk in topo.links:
        assert lk.bandwidth == 50e9 * lk.count
    assert all(out_bandwidth(topo, g) == 350e9 for g in range(16))


def test_mi250_boxes_share_one_ib_switch():
    topo = mi250(2)
    (ib,) = kinds(topo, NodeKind.SWITCH)
    for rank in range(32):
        assert topo.link(rank, ib.id).bandwidth == topo.link(ib.id, rank).bandwidth == 16e9


def test_overrides():
    topo = dgx1(bandwidth=20e9, latency=3e-6)
    assert topo.link(0, 1).bandwidth == 40e9 and topo.link(0, 2).bandwidth == 20e9
    assert {lk.latency for lk in topo.links} == {3e-6}
    topo = ndv2(2, network_bandwidth=25e9)
    assert topo.link(0, 9).bandwidth == 25e9 and topo.link(0, 9).latency == 5e-6
    assert {lk.latency for lk in ndv2(3, latency=0.0).links} == {0.0}
    assert dgx_a100(bandwidth=100e9).link(0, 8).bandwidth == 100e9
    assert mi250(bandwidth=10e9).link(0, 1).bandwidth == 40e9


def test_names_and_rank_numbering():
    topo = dgx_h100(3)
    assert topo.name == "dgx-h100x3"
    assert [topo.nodes[r].name for r in (0, 9, 23)] == ["box0.gpu0", "box1.gpu1", "box2.gpu7"]
    assert [topo.box_of(r) for r in (0, 9, 23)] == [0, 1, 2]


@pytest.mark.parametrize("build", [ndv2, dgx2, dgx_a100, dgx_h100, mi250])
@pytest.mark.parametrize("boxes", [0, -1, 1.5, True])
def test_bad_box_counts(build, boxes):
    with pytest.raises(TopologyError, match="boxes"):
        build(boxes)
