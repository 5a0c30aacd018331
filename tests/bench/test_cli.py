"""``commflow bench`` on the command line: help, a tiny real run with --json-out and --json,
errors."""

from __future__ import annotations

import json

import pytest

from commflow.bench import BenchConfig, Measurement, Summary
from commflow.cli.bench import _table
from commflow.collectives import Collective

from .cli_runner import run_bench


def test_help_documents_the_defaults(capsys):
    code, out, _ = run_bench(capsys, "--help")
    assert code == 0
    for text in (
        "-b 8 -e 64M -f 2",
        "--vs",
        "--algo",
        "--json",
        "--json-out",
        "--plot",
        "--iters",
        "--small-iters",
        "confidence interval of the median",
    ):
        assert text in out


def test_tiny_run_prints_the_table_notes_bound_and_json(capsys, tmp_path):
    path = tmp_path / "records.json"
    code, out, _ = run_bench(
        capsys,
        "-n",
        "2",
        "-b",
        "8",
        "-e",
        "16",
        "-o",
        "avg",
        "--vs",
        "gloo,mpi",
        "--iters",
        "6",
        "-w",
        "1",
        "--json-out",
        str(path),
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "# commflow bench: allreduce on 2 ranks, float32 avg; 1 warm-up + 60 "
        "timed iterations per size and placement"  # 10 x --iters: every size is small
    )
    header = next(line for line in lines if "size(B)" in line).split()
    assert header == [
        "#",
        "size(B)",
        "count",
        "type",
        "redop",
        "root",
        *(["time(us)", "ci95(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"] * 2),
    ]
    rows = [line.split() for line in lines if not line.startswith("#")]
    assert [row[:5] for row in rows] == [
        ["8", "2", "float32", "avg", "-1"],
        ["16", "4", "float32", "avg", "-1"],
    ]
    assert all(row[9] == "0" and row[14] == "0" for row in rows)  # #wrong, twice
    assert "# gloo skipped: gloo has no 'avg' reduction" in out
    assert any(line.startswith("# mpi skipped: ") for line in lines)
    assert any(line.startswith("# memory-bandwidth bound: ") for line in lines)
    records = json.loads(path.read_text())
    assert [(r["impl"], r["algo"], r["size"], r["inplace"]) for r in records] == [
        ("commflow", "auto", 8, False),
        ("commflow", "auto", 8, True),
        ("commflow", "auto", 16, False),
        ("commflow", "auto", 16, True),
    ]
    table_times = [float(row[5]) for row in rows]
    assert table_times == [round(r["time_us"], 2) for r in records if not r["inplace"]]


def test_json_flag_prints_the_records_instead_of_the_tables(capsys):
    code, out, _ = run_bench(
        capsys, "-n", "2", "-b", "64", "-e", "64", "--vs", "none", "--iters", "3", "-w", "0",
        "--json",
    )
    assert code == 0
    records = json.loads(out)
    assert [(r["impl"], r["size"], r["inplace"], r["runs"]) for r in records] == [
        ("commflow", 64, False, 30),  # 10 x --iters up to 64 KiB
        ("commflow", 64, True, 30),
    ]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in records)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--vs", "nccl"), "unknown peer(s) nccl"),
        (("--algo", "spiral"), "no algorithm 'spiral' for allreduce"),
        (("-b", "1K", "-e", "8"), "bad size range"),
        (("--hosts", "3"), "--hosts 3 does not split 2 ranks evenly"),
        (("--hosts", "2", "--algo", "ring,shm:spin=0"), "fast path runs on one host"),
        (("barrier", "--hosts", "2"), "--hosts does not apply to commflow bench barrier"),
    ],
)
def test_errors_exit_2_with_one_line(capsys, args, message):
    code, _, err = run_bench(capsys, "-n", "2", *args)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_emulated_hosts_run_the_programs_over_the_engine(capsys, tmp_path):
    path = tmp_path / "records.json"
    code, out, err = run_bench(
        capsys, "allgather", "-n", "2", "--hosts", "2", "--algo", "ring,auto", "--vs", "none",
        "-b", "64", "-e", "1K", "-f", "16", "-w", "1", "--iters", "2", "--small-iters", "3",
        "--json-out", str(path),
    )
    assert code == 0, err
    assert out.startswith("# commflow bench: allgather on 2 ranks in 2 emulated hosts (between "
                          "them the engine: gloo over loopback TCP), float32 ")
    assert "memory-bandwidth bound" not in out  # a bound of the shared-memory path
    assert "memory copy bandwidth" not in out  # not measured: nothing uses it here
    records = json.loads(path.read_text())
    assert sorted({(r["algo"], r["size"]) for r in records}) == [
        ("auto", 64), ("auto", 1024), ("ring", 64), ("ring", 1024)]
    assert all(r["hosts"] == 2 and r["wrong"] == 0 for r in records)


def test_all_leaves_the_fast_path_out_across_emulated_hosts():
    one = BenchConfig(collective="allreduce", nranks=4, algos=("all",)).commflow_algos
    four = BenchConfig(collective="allreduce", nranks=4, hosts=4, algos=("all",)).commflow_algos
    assert "shm" in one and "ring" in four and "auto" in four
    assert four == tuple(name for name in one if not name.startswith("shm"))


def test_a_value_wider_than_its_column_stays_apart_from_its_neighbours():
    slow = Measurement(
        impl="commflow",
        collective=Collective.ALLGATHER,
        algo="p128.json",
        nranks=4,
        dtype="float32",
        op="none",
        root=-1,
        size=4096,
        count=256,
        inplace=False,
        time=Summary(median=0.78345147, ci=(0.73073870, 1.01405129), runs=10),
        algbw=4096 / 0.78345147,
        busbw=0.75 * 4096 / 0.78345147,
        wrong=0,
    )
    row = _table([slow], None)[-1].split()
    assert row[:5] == ["4096", "256", "float32", "none", "-1"]
    assert row[5:10] == ["783451.47", "730738.70-1014051.29", "0.00", "0.00", "0"]
    assert row[10:] == ["-"] * 5  # no in-place run
