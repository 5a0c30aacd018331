"""``nvidia-smi topo -m`` matrices: NVLink pairs, NVSwitch detection, PCIe hub, located errors."""

from __future__ import annotations

import re

import pytest

from commflow.errors import TopologyError
from commflow.topology import NodeKind, dgx_a100, fingerprint, load
from commflow.topology.formats.nvidia_smi import parse

from .helpers import DATA, pair_counts
from .test_systems import DGX1_ONE, DGX1_TWO


def test_dgx1_matrix():
    topo = load(DATA / "nvidia_smi_dgx1.txt")  # sniffed: no known extension
    assert topo.name == "nvidia_smi_dgx1" and topo.nranks == 8
    assert pair_counts(topo, range(8)) == {
        **dict.fromkeys(DGX1_TWO, 2),
        **dict.fromkeys(DGX1_ONE, 1),
    }
    assert topo.link(0, 4).bandwidth == 50e9 and topo.link(0, 2).bandwidth == 25e9
    (pcie,) = [n for n in topo.nodes if n.kind is not NodeKind.RANK]
    assert pcie.name == "pcie" and pcie.kind is NodeKind.SWITCH
    assert {(lk.src, lk.bandwidth) for lk in topo.links if lk.dst == pcie.id} == {
        (g, 16e9) for g in range(8)
    }
    assert len(topo.links) == 32 + 16


def test_nvswitch_matrix_is_a_switch_not_a_mesh():
    text = (DATA / "nvidia_smi_dgx_a100.txt").read_text()
    assert "\x1b[4m" in text  # the header is underlined with terminal escapes, as printed
    topo = parse(text)
    assert topo.nnodes == 9 and len(topo.links) == 16
    assert fingerprint(topo) == fingerprint(dgx_a100())


def test_pcie_only_matrix():
    topo = load(DATA / "nvidia_smi_pcie.txt")
    assert topo.nranks == 4 and topo.nnodes == 5
    assert {(lk.src, lk.dst) for lk in topo.links} == {(g, 4) for g in range(4)} | {
        (4, g) for g in range(4)
    }


def matrix(rows: list[str]) -> str:
    header = "\t" + "\t".join(f"GPU{i}" for i in range(len(rows))) + "\tCPU Affinity\tNUMA Affinity"
    return "\n".join([header, *(f"GPU{i}\t{row}\t0-7\t0" for i, row in enumerate(rows))]) + "\n"


def test_fully_nvlinked_board_without_switch():
    topo = parse(matrix(["X NV4 NV4", "NV4 X NV4", "NV4 NV4 X"]))
    assert topo.nnodes == 3 and topo.link(0, 2).bandwidth == 100e9  # 8 links per GPU: direct


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\n", "no header row starting with GPU0"),
        (matrix(["X NV1", "NV2 X"]), "line 3: GPU1 shows NV2 to GPU0 but GPU0 shows NV1"),
        (matrix(["X FOO", "SYS X"]), "line 2: GPU0 column GPU1: unexpected entry 'FOO'"),
        (matrix(["SYS SYS", "SYS X"]), "line 2: GPU0 column GPU0: unexpected entry 'SYS'"),
        ("\tGPU0\tGPU1\nGPU0\tX\nGPU1\tSYS\tX\n", "line 2: row GPU0 has fewer than 2 entries"),
        (matrix(["X SYS", "SYS X"]).replace("GPU1\t", "GPU7\t", 1), "line 1: GPU columns"),
        ("\tGPU0\tGPU1\nGPU0\tX\tSYS\n\nLegend:\n", "line 1: no matrix row for GPU1"),
        (
            matrix(["X NV12 NV12", "NV12 X NV6", "NV12 NV6 X"]),
            "line 2: GPU0 shows 24 NVLinks (> 18, so an NVSwitch) but the pairs show different",
        ),
    ],
)
def test_errors_name_the_line(text, message):
    with pytest.raises(TopologyError, match=rf"^smi.txt: {re.escape(message)}"):
        parse(text, source="smi.txt")
