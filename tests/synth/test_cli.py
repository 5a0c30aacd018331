"""``commflow synth`` prints the comparison and writes JSON and MSCCL XML that load back."""

import json
import re

import pytest

from commflow.cli import main
from commflow.ir import load_program, verify
from tests.ir.msccl_conformance import violations


def run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code


def test_synth_alltoall_json_and_files(tmp_path, capsys):
    path, xml = tmp_path / "a2a.json", tmp_path / "a2a.xml"
    argv = ["synth", "alltoall", "--topo", "dgx1", "--pieces", "2", "-b", "1G", "-e", "1G"]
    assert run([*argv, "-o", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    row = record["rows"][0]
    assert record["program"] == "alltoall/synth_lp"
    assert row["size"] == 2**30
    assert 0 < row["bound_pct"] <= 100
    assert row["ring_algbw"] is None
    verify(load_program(path))
    assert run([*argv, "--xml", str(xml)]) == 0  # 7 channels of MSCCL's 32
    assert violations(xml.read_text(), "msccl") == []
    assert run(["synth", "allgather", "--topo", "dgx1", "--pieces", "2", "-b", "1G", "-e", "1G",
                "--xml", str(xml)]) == 0
    assert "<algo" in xml.read_text()


def test_synth_unknown_objective_exits_2():
    assert run(["synth", "allgather", "--topo", "dgx1", "--objective", "fastest"]) == 2


def test_synth_balanced_json_reports_the_pick(capsys):
    argv = ["synth", "allgather", "--topo", "dgx1", "--objective", "balanced", "--size", "1K"]
    argv += ["--max-steps", "2", "--pieces", "4", "-b", "1K", "-e", "1K", "-m", "alphabeta"]
    assert run([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    params, row = record["params"], record["rows"][0]
    assert params["balanced_size"] == 1024 and params["depth"] <= 2
    assert params["method"] == "direct" and record["program"] == "direct"
    assert row["time"] == params["balanced_time"]  # same size, same model


def test_synth_balanced_table_prints_the_pick(capsys):
    argv = ["synth", "allgather", "--topo", "dgx1", "--objective", "balanced", "--size", "1G"]
    assert run([*argv, "--pieces", "2", "-b", "1M", "-e", "1M", "-m", "alphabeta"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"allgather/synth_trees on dgx1: \d+ steps \(verified\)", lines[0])
    pick = r"balanced pick for 1G: bandwidth with 2 pieces, message depth \d+, [\d.]+ us"
    assert re.match(pick, lines[1])


def test_synth_balanced_max_steps_below_one_exits_2():
    argv = ["synth", "allgather", "--topo", "dgx1", "--objective", "balanced"]
    assert run([*argv, "--max-steps", "0"]) == 2


def test_synth_show_writes_a_png(tmp_path, capsys):
    png = tmp_path / "ag.png"
    argv = ["synth", "allgather", "--topo", "dgx1", "--pieces", "2", "-b", "1G", "-e", "1G"]
    assert run([*argv, "-m", "alphabeta", "--show", str(png)]) == 0
    assert f"link loads drawn in {png}" in capsys.readouterr().out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert 600 <= width <= 2000 and 600 <= height <= 2000
    assert 20_000 < len(data) < 2_000_000


def test_synth_table_names_the_packing(capsys):
    argv = ["synth", "allgather", "--topo", "dgx1", "--pieces", "2", "-b", "1M", "-e", "1M"]
    assert run([*argv, "-m", "alphabeta"]) == 0
    assert "trees: exact integer packing, 6 per root, 2 pieces each" in capsys.readouterr().out
