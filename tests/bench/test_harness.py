"""Combining the ranks' timings, ratios and fastest algorithms, the plot (synthetic data), and
the #wrong check catching a result spoiled through the worker's test hook (real ranks)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from commflow.bench import BenchConfig, BenchReport, RunSpec, plot_busbw, run_impl
from commflow.bench.harness import combine_ranks
from commflow.bench.stats import summarize
from commflow.errors import CommflowError

SPEC = RunSpec(
    impl="commflow",
    collective="allreduce",
    algos=("auto",),
    blocks=(2, 1024),
    dtype="float32",
    op="sum",
    root=0,
    warmup=1,
    iters=6,
    small_iters=6,
    timeout=60.0,
)


def _rank(times: list[list[float]], wrong: list[int]) -> dict:
    runs = []
    for i, (block, inplace) in enumerate([(2, False), (2, True), (1024, False), (1024, True)]):
        runs.append(
            {
                "algo": "auto",
                "block": block,
                "inplace": inplace,
                "times": times[i],
                "wrong": wrong[i],
            }
        )
    return {"rank": 0, "nranks": 2, "runs": runs}


def test_an_iteration_takes_the_slowest_rank_and_wrong_adds_up():
    a = [[1.0, 5.0, 3.0, 2.0, 2.0, 2.0]] * 4
    b = [[4.0, 2.0, 6.0, 1.0, 1.0, 3.0]] * 4
    ms = combine_ranks(SPEC, [_rank(a, [0, 1, 0, 0]), _rank(b, [0, 2, 0, 5])])
    assert [(m.size, m.inplace, m.count) for m in ms] == [
        (8, False, 2),
        (8, True, 2),
        (4096, False, 1024),
        (4096, True, 1024),
    ]
    slowest = [4.0, 5.0, 6.0, 2.0, 2.0, 3.0]
    assert ms[0].time == summarize(slowest)
    assert ms[0].time.median == 3.5 and ms[0].time.ci == (2.0, 6.0)
    assert [m.wrong for m in ms] == [0, 3, 0, 5]
    assert ms[2].algbw == 4096 / 3.5
    assert ms[2].busbw == ms[2].algbw  # 2(n-1)/n = 1 for two ranks
    record = ms[2].record()
    assert record["time_us"] == 3.5e6 and record["ci95_us"] == [2e6, 6e6]
    assert record["algbw"] == 4096 / 3.5 / 1e9 and record["op"] == "sum"


def test_ranks_that_disagree_are_reported():
    a = _rank([[1.0] * 6] * 4, [0] * 4)
    b = _rank([[1.0] * 6] * 4, [0] * 4)
    b["runs"][1]["block"] = 3
    with pytest.raises(CommflowError, match="disagree on run 1"):
        combine_ranks(SPEC, [a, b])


def _two_ranks(spec: RunSpec, seconds: list[float]):
    rank = _rank([[t] * 6 for t in seconds], [0] * 4)
    return combine_ranks(spec, [rank, rank])


def _measurements():
    ours = _two_ranks(SPEC, [1.0, 2.0, 1.0, 4.0])
    ring = [replace(m, algo="ring") for m in _two_ranks(SPEC, [2.0, 1.0, 2.0, 2.0])]
    gloo = _two_ranks(replace(SPEC, impl="gloo"), [4.0, 4.0, 8.0, 8.0])
    return ours + ring + gloo


def test_ratios_compare_auto_with_the_peer_and_best_picks_the_fastest():
    config = BenchConfig(nranks=2, sizes=(8, 4096), algos=("auto", "ring"), peers=("gloo",))
    report = BenchReport(
        config=config,
        measurements=_measurements(),
        copy_bandwidth=1.0,
        load=(0.0, 0.0, 0.0),
        bound=0.5,
    )
    assert report.reference_algo() == "auto"
    assert report.ratios("gloo") == {
        (8, False): 4.0,
        (8, True): 2.0,
        (4096, False): 8.0,
        (4096, True): 2.0,
    }
    best = [(m.size, m.inplace, m.algo) for m in report.best_algorithms()]
    assert best == [
        (8, False, "auto"),
        (8, True, "ring"),
        (4096, False, "auto"),
        (4096, True, "ring"),
    ]


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "busbw.png"
    plot_busbw(_measurements(), path, title="test", bound=5e3)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_of_nothing_is_an_error(tmp_path):
    with pytest.raises(CommflowError, match="nothing to plot"):
        plot_busbw([], tmp_path / "x.png")


def test_wrong_check_catches_a_spoiled_result():
    right = run_impl(replace(SPEC, iters=2, small_iters=2, blocks=(2, 37)), 2)
    assert [m.wrong for m in right] == [0, 0, 0, 0]
    spoiled = run_impl(replace(SPEC, iters=2, small_iters=2, blocks=(2, 37),
                                corrupt_rank=1), 2)
    assert [m.wrong for m in spoiled] == [1, 1, 1, 1]
