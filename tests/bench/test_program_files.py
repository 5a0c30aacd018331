"""``commflow bench --algo FILE.json``: a saved (synthesized) program runs for real, labelled
by its file name; the ranks get its path, and a program for another call is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commflow import topology
from commflow.bench import BenchConfig, run_benchmark, suite
from commflow.bench.algos import label
from commflow.ir import load_program, save_program
from commflow.runtime.programs import is_program_file
from commflow.synth import synthesize

from .cli_runner import run_bench

RING3 = topology.load("ring3")


def _save(path: Path, collective: str, root: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_program(synthesize(collective, RING3, pieces=2, root=root), path)
    return path




def test_entries_ending_in_json_are_program_files_labelled_by_file_name():
    assert is_program_file("out/ag.json") and not is_program_file("ring")
    assert label("/tmp/runs/ag.json") == "ag.json"
    assert label("ring") == "ring"


def test_bench_runs_a_program_file_beside_a_named_algorithm(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert 85 % load_program(_save(tmp_path / "ag3.json", "allgather")).chunk_factor
    records = tmp_path / "records.json"
    code, out, err = run_bench(
        capsys,
        "allgather",
        "-n",
        "3",
        "--algo",
        "ring,ag3.json",
        "--vs",
        "none",
        "-b",
        "1K",
        "-e",
        "1K",
        "-w",
        "1",
        "--iters",
        "2",
        "--json-out",
        str(records),
    )
    assert code == 0, err
    assert "# commflow, algo ag3.json" in out.splitlines()
    rows = [line.split() for line in out.splitlines() if not line.startswith("#")]
    assert [row[:2] for row in rows] == [["1020", "85"], ["1020", "85"]]  # -b 1K on 3 ranks
    assert all(row[9] == "0" and row[14] == "0" for row in rows)  # #wrong, twice
    got = [(r["algo"], r["inplace"], r["wrong"]) for r in json.loads(records.read_text())]
    assert got == [
        ("ring", False, 0),
        ("ag3.json", False, 0),
        ("ring", True, 0),
        ("ag3.json", True, 0),
    ]


def test_ranks_get_the_absolute_path_and_ratios_use_the_label(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _save(tmp_path / "rs.json", "reducescatter")
    specs = []
    monkeypatch.setattr(suite, "run_impl", lambda spec, nranks, progress: specs.append(spec) or [])
    monkeypatch.setattr(suite, "copy_bandwidth", lambda: 1e10)
    config = BenchConfig(collective="reducescatter", nranks=3, algos=("rs.json",), peers=())
    report = run_benchmark(config)
    assert [s.algos for s in specs] == [(str(tmp_path / "rs.json"),)]
    assert report.reference_algo() == "rs.json"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("allreduce", "-n", "3"), "implements allgather, not allreduce"),
        (("allgather", "-n", "2"), "is for 3 ranks, not 2"),
    ],
)
def test_a_program_for_another_collective_or_rank_count_exits_2(capsys, tmp_path, args, message):
    path = _save(tmp_path / "ag3.json", "allgather")
    code, _, err = run_bench(capsys, *args, "--algo", str(path), "--vs", "none")
    assert code == 2
    text = " ".join(err.split())
    assert f"--algo {path}: program 'allgather/synth_trees' {message}" in text
    assert "Traceback" not in err


def test_a_program_for_another_root_exits_2(capsys, tmp_path):
    path = _save(tmp_path / "bcast.json", "broadcast", root=2)
    code, _, err = run_bench(capsys, "broadcast", "-n", "3", "-r", "1", "--algo", str(path))
    assert code == 2
    assert "has root 2, not 1" in " ".join(err.split())


def test_missing_and_clashing_program_files_exit_2(capsys, tmp_path):
    code, _, err = run_bench(capsys, "allgather", "-n", "3", "--algo", str(tmp_path / "no.json"))
    assert code == 2 and "cannot read program file" in err
    first, second = _save(tmp_path / "a" / "ag.json", "allgather"), tmp_path / "b" / "ag.json"
    _save(second, "allgather")
    code, _, err = run_bench(capsys, "allgather", "-n", "3", "--algo", f"{first},{second}")
    assert code == 2 and "program files are labelled by file name" in " ".join(err.split())
