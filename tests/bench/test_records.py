"""A tiny real benchmark (2 ranks, 2 sizes up to 64 KiB, 6 iterations and so by default 60 per
small size): commflow, gloo and Open MPI records, their JSON keys and values."""

from __future__ import annotations

import os

import pytest

from commflow.bench import BenchConfig, impl_mpi, run_benchmark
from commflow.errors import AlgorithmError, CommflowError

KEYS = {
    "impl",
    "collective",
    "algo",
    "nranks",
    "hosts",
    "dtype",
    "op",
    "size",
    "inplace",
    "time_us",
    "ci95_us",
    "runs",
    "algbw",
    "busbw",
    "wrong",
}


def test_records_of_a_tiny_run_with_peers():
    config = BenchConfig(
        collective="allreduce",
        nranks=2,
        sizes=(8, 64 << 10),
        warmup=1,
        iters=6,
        peers=("gloo", "mpi"),
        timeout=60.0,
    )
    report = run_benchmark(config)
    records = [m.record() for m in report.measurements]
    impls = ["commflow", "gloo"] + (["mpi"] if impl_mpi.missing() is None else [])
    if impl_mpi.missing() is not None:
        assert report.notes == [f"mpi skipped: {impl_mpi.missing()}"]
    assert [(r["impl"], r["size"], r["inplace"]) for r in records] == [
        (impl, size, inplace) for impl in impls for size in (8, 65536) for inplace in (False, True)
    ]
    for r in records:
        assert set(r) == KEYS
        assert r["algo"] == ("auto" if r["impl"] == "commflow" else "default")
        assert (r["collective"], r["nranks"], r["dtype"], r["op"]) == (
            "allreduce",
            2,
            "float32",
            "sum",
        )
        assert r["runs"] == 60 and r["wrong"] == 0  # 10 x iters up to 64 KiB
        low, high = r["ci95_us"]
        assert 0 < low <= r["time_us"] <= high
        assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw"] == pytest.approx(r["algbw"])  # 2(n-1)/n = 1
    assert report.bound == pytest.approx(report.copy_bandwidth / 2)
    assert set(report.ratios("gloo")) == {(8, False), (8, True), (65536, False), (65536, True)}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"peers": ("nccl",)}, "unknown peer"),
        ({"op": "avg", "dtype": "int32"}, "floating-point"),
        ({"root": 2}, "outside ranks"),
        ({"iters": 0}, "--iters >= 1"),
        ({"small_iters": 0}, "--small-iters >= 1"),
        ({"small_iters": -3}, r"--small-iters >= 1 \(timed iterations per size up to 64 KiB"),
        ({"dtype": "complex64"}, "unsupported dtype"),
        ({"collective": "allsum"}, "unknown collective"),
    ],
)
def test_config_is_validated(fields, message):
    with pytest.raises(CommflowError, match=message):
        BenchConfig(**{"nranks": 2, **fields})


def test_unknown_algorithm_is_named():
    with pytest.raises(AlgorithmError, match="no algorithm 'spiral' for allreduce"):
        BenchConfig(nranks=2, algos=("spiral",))


def test_all_algorithms_include_auto_the_registry_and_the_fast_path():
    config = BenchConfig(collective="reduce_scatter", nranks=2, algos=("all",))
    assert config.commflow_algos[:2] == ("auto", "shm")
    assert {"ring", "direct", "halving_doubling"} <= set(config.commflow_algos)
    gather = BenchConfig(collective="gather", nranks=2, algos=("all",))
    assert "shm" not in gather.commflow_algos


def test_default_ranks_are_the_cores_at_least_two():
    assert BenchConfig().nranks == max(2, len(os.sched_getaffinity(0)))
