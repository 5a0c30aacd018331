"""NCCL topology XML: realistic DGX-1 and DGX A100 dumps, rank numbering, located errors."""

from __future__ import annotations

import re
import time

import pytest

from commflow.errors import TopologyError
from commflow.topology import NodeKind, dgx1, dgx_a100, fingerprint, load
from commflow.topology.formats.nccl_xml import parse

from .helpers import DATA, pair_counts
from .test_systems import DGX1_ONE, DGX1_TWO


def without_nics(text: str) -> str:
    return re.sub(r"<nic>.*?</nic>", "", text, flags=re.DOTALL)


def test_dgx_a100_dump():
    topo = load(DATA / "dgx_a100.xml")
    assert topo.name == "dgx_a100" and topo.nranks == 8
    (nvswitch,) = [n.id for n in topo.nodes if n.name == "nvswitch"]
    for gpu in range(8):  # 6 NVSwitch chips x 2 NVLink3 each, merged into one port
        port = topo.link(gpu, nvswitch)
        assert (port.bandwidth, port.count) == (300e9, 12)
        assert topo.link(nvswitch, gpu).bandwidth == 300e9
    nics = [n for n in topo.nodes if n.kind is NodeKind.NIC]
    assert [n.name for n in nics] == [f"nic{i}.mlx5_{i}" for i in range(8)]
    (network,) = [n.id for n in topo.nodes if n.name == "network"]
    for i, nic in enumerate(nics):
        # a PCIe switch holds GPUs 2s, 2s+1 and their two NICs
        gpus = {lk.dst for lk in topo.out_links(nic.id) if lk.dst < 8}
        assert gpus == {i // 2 * 2, i // 2 * 2 + 1}
        assert topo.link(nic.id, network).bandwidth == 200000 * 1e6 / 8 == 25e9
        assert topo.link(nic.id, network).latency == 5e-6
    assert fingerprint(parse(without_nics((DATA / "dgx_a100.xml").read_text()))) == fingerprint(
        dgx_a100()
    )


def test_dgx1_dump_numbers_ranks_by_dev():
    text = (DATA / "dgx1.xml").read_text()
    topo = parse(text)
    assert pair_counts(topo, range(8)) == {
        **dict.fromkeys(DGX1_TWO, 2),
        **dict.fromkeys(DGX1_ONE, 1),
    }
    assert topo.link(0, 1).bandwidth == 50e9  # sm 70: 25 GB/s per NVLink2
    # each NIC reaches the two GPUs of its PCIe switch
    nics = [n.id for n in topo.nodes if n.kind is NodeKind.NIC]
    assert [{lk.dst for lk in topo.out_links(n) if lk.dst < 8} for n in nics] == [
        {0, 1},
        {2, 3},
        {4, 5},
        {6, 7},
    ]
    assert topo.link(nics[0], 0).bandwidth == 12.5e9
    stripped = parse(without_nics(text))
    assert stripped.nnodes == 8
    assert fingerprint(stripped) == fingerprint(dgx1())


def gpu(busid: str, dev: int, rank: str = "", links: str = "", sm: str = 'sm="80"') -> str:
    return f'<pci busid="{busid}"><gpu dev="{dev}" {sm} {rank}>{links}</gpu></pci>'


def test_rank_attribute_and_dev_order():
    nvlink = '<nvlink target="{}" count="{}" tclass="0x030200"/>'
    text = (
        '<system version="1"><cpu numaid="0">'
        + gpu("0000:0b:00.0", 1, links=nvlink.format("0000:07:00.0", 4))
        + gpu("0000:07:00.0", 0, links=nvlink.format("0000:0b:00.0", 4))
        + gpu("0000:0c:00.0", 2)
        + "</cpu></system>"
    )
    topo = parse(text)  # no rank attributes: ranks follow dev
    assert topo.link(0, 1).bandwidth == 100e9 and topo.link(0, 1).count == 4
    assert topo.link(0, 2) is None and topo.nnodes == 3
    ranked = text.replace('dev="1"', 'dev="1" rank="2"').replace('dev="0"', 'dev="0" rank="0"')
    ranked = ranked.replace('dev="2"', 'dev="2" rank="1"')
    topo = parse(ranked)
    assert topo.link(0, 2).bandwidth == 100e9 and topo.link(0, 1) is None


def broken(inner: str) -> str:
    return f'<system version="1">\n<cpu numaid="0">\n{inner}\n</cpu>\n</system>\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '<system version="1">\n<cpu>\n<pci busid="x">\n</cpu>\n</system>',
            "topo.xml: line 4: malformed XML: mismatched tag",
        ),
        ("<topology/>", "topo.xml: line 1: <topology>: the root element must be <system>"),
        (broken(""), "line 1: <system>: no <gpu> elements"),
        (broken('<gpu dev="0" sm="80"/>'), "line 3: <gpu>: a <gpu> must sit inside the <pci>"),
        (broken('<pci><gpu dev="0"/></pci>'), "line 3: <pci>: missing attribute 'busid'"),
        (
            broken(gpu("a", 0, links='\n<nvlink target="a"/>')),
            "line 4: <nvlink>: missing attribute 'count'",
        ),
        (broken(gpu("a", 0, links='<nvlink target="b" count="2"/>')), "target b is neither"),
        (
            broken(gpu("a", 0, sm='sm="52"', links='<nvlink target="b" count="1"/>')),
            "unknown GPU architecture sm=52",
        ),
        (
            broken(gpu("a", 0, sm="", links='<nvlink target="b" count="1"/>')),
            "<gpu>: missing attribute 'sm'",
        ),
        (
            broken(gpu("a", 0, rank='rank="0"') + "\n" + gpu("b", 1, rank='rank="0"')),
            "line 4: <gpu>: rank 0 is out of range or repeated",
        ),
        (
            broken(gpu("a", 0, rank='rank="0"') + "\n" + gpu("b", 1)),
            "line 4: <gpu>: missing attribute 'rank'",
        ),
        (
            broken(gpu("a", 0, links='<nvlink target="b" count="x"/>')),
            "count='x' is not an integer",
        ),
        (
            broken(gpu("a", 0) + '\n<nic><net name="m" speed="fast"/></nic>'),
            "line 4: <net>: attribute speed='fast'",
        ),
    ],
)
def test_errors_name_line_and_element(text, message):
    with pytest.raises(TopologyError, match=re.escape(message)):
        parse(text, source="topo.xml")


def test_one_sided_nvlink_listing_is_a_duplex_connection():
    text = broken(gpu("a", 0) + gpu("b", 1, links='<nvlink target="a" count="2"/>'))
    topo = parse(text)
    assert topo.link(0, 1).bandwidth == topo.link(1, 0).bandwidth == 50e9


def test_disagreeing_nvlink_counts():
    text = broken(
        gpu("a", 0, links='<nvlink target="b" count="2"/>')
        + "\n"
        + gpu("b", 1, links='<nvlink target="a" count="3"/>')
    )
    with pytest.raises(TopologyError, match=r"line 4: <nvlink>: GPUs \(0, 1\) list different"):
        parse(text)


def test_deeply_nested_pci_and_many_gpus_load_without_recursion_or_quadratic_lookups():
    depth = 20_000
    gpus = "".join(
        f'<pci busid="{r // 256:04x}:{r % 256:02x}:00.0"><gpu dev="{4999 - r}" sm="80">'
        f'<nvlink target="ffff:ff:00.0" count="2" tclass="0x068000"/></gpu></pci>'
        for r in range(5000)
    )
    text = ('<system version="1"><cpu numaid="0">' + '<pci busid="f:0">' * depth + gpus
            + '<nic><net name="mlx5_0" speed="200000"/></nic>' + "</pci>" * depth
            + "</cpu></system>")
    start = time.monotonic()
    topo = parse(text)
    assert time.monotonic() - start < 10
    assert topo.nranks == 5000
    assert topo.nodes[0].name == "gpu0"
    nic = next(n.id for n in topo.nodes if n.kind is NodeKind.NIC)
    assert len([lk for lk in topo.links if lk.dst == nic]) == 5000 + 1  # every GPU and the switch
