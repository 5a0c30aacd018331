"""The small-message runs of docs/benchmarks.md: ``commflow bench barrier`` (commflow's barrier
against gloo's and Open MPI's, one row each, the slowest rank's time per barrier) and the
8 B - 64 KiB allreduce sweep against Open MPI on 4 ranks."""

from __future__ import annotations

import json

import pytest

from commflow.bench.barrier import BarrierSpec, run_barrier
from commflow.errors import CommflowError

from .cli_runner import run_bench


def test_barrier_table_has_a_row_per_implementation_and_json(capsys, tmp_path):
    path = tmp_path / "barrier.json"
    code, out, _ = run_bench(capsys, "barrier", "-n", "2", "--vs", "gloo,mpi", "--iters", "30",
                             "-w", "2", "--json-out", str(path))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "# commflow bench: barrier on 2 ranks; 2 warm-up + 30 timed barriers"
    assert lines[4].split() == ["#", "impl", "time(us)", "ci95(us)", "ratio"]
    rows = {line.split()[0]: line.split() for line in lines[5:8]}
    assert set(rows) == {"commflow", "gloo", "mpi"}
    records = {r["impl"]: r for r in json.loads(path.read_text())}
    assert set(records) == set(rows)
    for impl, record in records.items():
        assert record["collective"] == "barrier" and record["nranks"] == 2
        assert record["runs"] == 30 and 0 < record["time_us"] < 1e5
        low, high = record["ci95_us"]
        assert low <= record["time_us"] <= high
        assert rows[impl][1] == f"{record['time_us']:.2f}"
        if impl != "commflow":
            ratio = records["commflow"]["time_us"] / record["time_us"]
            assert rows[impl][3] == f"{ratio:.2f}"


def test_barrier_runs_on_more_ranks_than_cores():
    # 4 ranks on this machine's cores: every timed barrier still ends after every rank
    # entered it, so no time is negative or zero and the median is finite
    result = run_barrier(BarrierSpec(impl="commflow", warmup=1, iters=8), 4)
    assert result.nranks == 4 and result.time.runs == 8
    assert 0 < result.time.median < 1.0


def test_bad_spec_is_refused():
    with pytest.raises(CommflowError, match="unknown implementation"):
        run_barrier(BarrierSpec(impl="nccl"), 2)
    with pytest.raises(CommflowError, match="--iters >= 1"):
        run_barrier(BarrierSpec(impl="commflow", iters=0), 2)


def test_small_allreduce_sweep_on_4_ranks_against_mpi(capsys, tmp_path):
    path = tmp_path / "ar.json"
    code, out, _ = run_bench(capsys, "-n", "4", "--vs", "mpi", "-b", "8", "-e", "64K",
                             "--iters", "6", "--small-iters", "6", "-w", "1",
                             "--json-out", str(path))
    assert code == 0, out
    records = json.loads(path.read_text())
    sizes = [8 << i for i in range(14)]
    for impl in ("commflow", "mpi"):
        mine = [r for r in records if r["impl"] == impl]
        assert sorted({r["size"] for r in mine}) == sizes
        assert all(r["wrong"] == 0 and r["nranks"] == 4 for r in mine)
