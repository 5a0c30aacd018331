"""``commflow synth`` prints the comparison and writes JSON and MSCCL XML that load back."""

import json

import pytest

from commflow.cli import main
from commflow.ir import load_program, verify


def run(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code


def test_synth_alltoall_json_and_files(tmp_path, capsys):
    path, xml = tmp_path / "a2a.json", tmp_path / "a2a.xml"
    argv = ["synth", "alltoall", "--topo", "dgx1", "--pieces", "2", "-b", "1G", "-e", "1G"]
    assert run([*argv, "-o", str(path), "--xml", str(xml), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    row = record["rows"][0]
    assert record["program"] == "alltoall/synth_lp"
    assert row["size"] == 2**30
    assert 0 < row["bound_pct"] <= 100
    assert row["ring_algbw"] is None
    verify(load_program(path))
    assert "<algo" in xml.read_text()


def test_synth_unknown_objective_exits_2():
    assert run(["synth", "allgather", "--topo", "dgx1", "--objective", "fastest"]) == 2
