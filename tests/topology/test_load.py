"""``load``: every preset name form, file dispatch by extension and content, unknown names."""

from __future__ import annotations

import shutil

import pytest

from commflow.errors import TopologyError
from commflow.topology import (
    dgx1,
    dgx2,
    dgx_a100,
    dgx_h100,
    fat_tree,
    fingerprint,
    fully_connected,
    line,
    load,
    mi250,
    ndv2,
    presets,
    ring,
    save,
    switch,
    torus,
)

from .helpers import DATA


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("dgx1", dgx1),
        ("DGX1", dgx1),
        ("ndv2", lambda: ndv2(1)),
        ("ndv2x2", lambda: ndv2(2)),
        ("NDv2X3", lambda: ndv2(3)),
        ("dgx2x2", lambda: dgx2(2)),
        ("dgx-a100", dgx_a100),
        ("dgx_a100x4", lambda: dgx_a100(4)),
        ("DGX-A100x2", lambda: dgx_a100(2)),
        ("dgx-h100x2", lambda: dgx_h100(2)),
        ("mi250x1", mi250),
        ("mi250x2", lambda: mi250(2)),
        ("ring8", lambda: ring(8)),
        ("line8", lambda: line(8)),
        ("fully-connected8", lambda: fully_connected(8)),
        ("fully_connected5", lambda: fully_connected(5)),
        ("fc8", lambda: fully_connected(8)),
        ("switch8", lambda: switch(8)),
        ("fat-tree16", lambda: fat_tree(16)),
        ("Fat_Tree4", lambda: fat_tree(4)),
        ("torus4x4", lambda: torus((4, 4))),
        ("torus4x4x4", lambda: torus((4, 4, 4))),
        (" ring3 ", lambda: ring(3)),
    ],
)
def test_preset_names(name, expected):
    topology, reference = load(name), expected()
    assert topology.name == reference.name
    assert fingerprint(topology) == fingerprint(reference)


def test_presets_lists_the_patterns():
    listed = presets()
    for pattern in ("dgx1", "ndv2[x<boxes>]", "dgx-a100[x<boxes>]", "mi250[x<boxes>]", "ring<n>"):
        assert pattern in listed
    assert any(p.startswith("torus") for p in listed) and any("fc<n>" in p for p in listed)


@pytest.mark.parametrize("name", ["foo", "dgx1x2", "ring", "torus4x", "dgx-a100y2", ""])
def test_unknown_names_list_presets_and_files(name):
    with pytest.raises(TopologyError, match=r"not a preset \(dgx1, ndv2.*existing file"):
        load(name)


def test_bad_preset_sizes_raise():
    with pytest.raises(TopologyError, match="boxes"):
        load("dgx-a100x0")
    with pytest.raises(TopologyError, match="even"):
        load("fat-tree5")


def test_files_by_extension_and_content(tmp_path):
    assert load(str(save(dgx1(), tmp_path / "a.json"))).name == "dgx1"
    sniffed_json = shutil.copy(tmp_path / "a.json", tmp_path / "plain")
    assert fingerprint(load(sniffed_json)) == fingerprint(dgx1())
    assert load(save(ring(4), tmp_path / "b.YML")).name == "ring4"
    xml = shutil.copy(DATA / "dgx1.xml", tmp_path / "dgx1.topo")
    assert load(xml).nranks == 8 and load(xml).name == "dgx1"
    smi = shutil.copy(DATA / "nvidia_smi_pcie.txt", tmp_path / "smi.out")
    assert load(str(smi)).nranks == 4


def test_unknown_file_content(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some text\n")
    with pytest.raises(TopologyError, match="notes.txt: unknown topology file format"):
        load(path)
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(TopologyError, match="cannot read topology file"):
        load(binary)
