"""``--small-iters``: sizes up to 64 KiB run ``small_iters`` timed rounds (default ten times
``--iters``), larger sizes ``--iters``; the records say how many, the job's time budget counts
them, and nccl-tests mode keeps ``-n`` at every size."""

from __future__ import annotations

import importlib
import json
from dataclasses import replace

import pytest

from commflow.bench import SMALL_BYTES, BenchConfig, RunSpec, timed_rounds
from commflow.bench.harness import _budget

from .cli_runner import run_bench


def test_small_sizes_run_small_iters_rounds_and_larger_ones_iters(capsys, tmp_path):
    path = tmp_path / "records.json"
    code, out, err = run_bench(
        capsys, "allreduce", "-n", "2", "--algo", "auto,ring", "--vs", "none",
        "-b", "64K", "-e", "128K", "-f", "2", "-w", "1", "--iters", "4", "--small-iters", "7",
        "--json-out", str(path),
    )
    assert code == 0, err
    assert out.splitlines()[0] == (
        "# commflow bench: allreduce on 2 ranks, float32 sum; 1 warm-up + 7 timed iterations "
        "per size and placement up to 64K, 4 above"
    )
    records = json.loads(path.read_text())
    got = sorted((r["algo"], r["size"], r["inplace"], r["runs"]) for r in records)
    assert got == sorted(
        (algo, size, inplace, 7 if size == 65536 else 4)
        for algo in ("auto", "ring") for size in (65536, 131072) for inplace in (False, True)
    )
    assert all(r["wrong"] == 0 for r in records)


def test_the_rule_and_its_default():
    assert SMALL_BYTES == 65536
    assert [timed_rounds(s, 20, 300) for s in (1, 65536, 65537)] == [300, 300, 20]
    config = BenchConfig(nranks=2, iters=6)
    assert config.small_iters == 60
    assert [config.timed_rounds(s) for s in (8, 65536, 1 << 20)] == [60, 60, 6]
    assert BenchConfig(nranks=2, iters=6, small_iters=1).timed_rounds(8) == 1


def test_a_bad_count_exits_2_naming_the_option(capsys):
    code, _, err = run_bench(capsys, "-n", "2", "--small-iters", "0")
    assert code == 2
    assert "need --small-iters >= 1" in err and "got 0" in err and "Traceback" not in err


def test_the_time_budget_counts_each_sizes_rounds():
    spec = RunSpec(impl="commflow", collective="allreduce", algos=("auto", "ring"),
                   blocks=(16, 32768), dtype="float32", op="sum", root=0, warmup=5, iters=20,
                   small_iters=200, timeout=60.0)
    assert [spec.rounds(2, block) for block in spec.blocks] == [200, 20]  # 64 B, 128 KiB
    per_call = {16: 0.01 + 64 / 25e6, 32768: 0.01 + 131072 / 25e6}
    calls = 2 * 2  # placements x algorithms
    assert _budget(spec, 2) == pytest.approx(
        60.0 + calls * (205 * per_call[16] + 25 * per_call[32768]))
    more = _budget(replace(spec, small_iters=2000), 2) - _budget(spec, 2)
    assert more == pytest.approx(calls * 1800 * per_call[16])


def test_nccl_tests_mode_times_n_iterations_at_every_size(capsys, monkeypatch):
    configs = []

    def stop(config):
        configs.append(config)
        raise SystemExit(0)

    module = importlib.import_module("commflow.cli.nccl_tests")  # the package's name is the command
    monkeypatch.setattr(module, "measure", stop)
    code, _, _ = run_bench(capsys, "--nccl-tests", "-g", "2", "-b", "8", "-e", "8", "-n", "9")
    assert code == 0
    assert (configs[0].iters, configs[0].small_iters) == (9, 9)
