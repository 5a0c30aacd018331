"""``commflow bench --nccl-tests``: read back by a parser of nccl-tests logs written from the
format of all_reduce_perf's output (rows of 13 fields, ``#`` comments, the footer), and by
the rule SuperBench's nccl-bw benchmark reads real nccl-tests logs with."""

from __future__ import annotations

import re

import pytest

from commflow.bench import BenchConfig, BenchReport, Measurement, Summary
from commflow.cli.nccl_tests import HEADER, format_report
from commflow.collectives import Collective

from .cli_runner import run_bench

ROW_FIELDS = ("size", "count", "type", "redop", "root",
              "time", "algbw", "busbw", "wrong", "ip_time", "ip_algbw", "ip_busbw", "ip_wrong")


def parse_nccl_tests(text: str) -> dict:
    """What a log parser takes from nccl-tests output: rows, out-of-bounds count and status,
    average bus bandwidth. Fails on any line that is neither a comment nor a 13-field row."""
    rows, footer = [], {}
    for line in text.splitlines():
        if match := re.fullmatch(r"# Out of bounds values : (\d+) (OK|FAILED)", line):
            footer["oob"], footer["status"] = int(match[1]), match[2]
        elif match := re.fullmatch(r"# Avg bus bandwidth\s+: (\S+) ", line):
            footer["avg_busbw"] = float(match[1])
        elif not line.startswith("#"):
            fields = line.split()
            assert len(fields) == len(ROW_FIELDS), line
            row = dict(zip(ROW_FIELDS, fields, strict=True))
            for key in ("size", "count", "root"):
                row[key] = int(row[key])
            for key in ("time", "algbw", "busbw", "ip_time", "ip_algbw", "ip_busbw"):
                row[key] = float(row[key])
            rows.append(row)
    return {"rows": rows, **footer}


def superbench_busbw(text: str) -> float:
    """The rule of Microsoft SuperBench's nccl-bw benchmark (``_process_raw_result`` of
    superbench/benchmarks/micro_benchmarks/cuda_nccl_bw_performance.py), restated: the rows
    from 4 lines after the ``out-of-place`` line to the ``Out of bounds values`` line, split
    on spaces, stop at a row of 10 fields or fewer, the maximum of field ``[-6]``."""
    lines = text.splitlines()
    first = max(i for i, line in enumerate(lines) if "out-of-place" in line) + 4
    last = max(i for i, line in enumerate(lines) if "Out of bounds values" in line)
    best = -1.0
    for line in lines[first:last]:
        fields = re.sub(r" +", " ", line.strip(" ")).split(" ")
        if len(fields) <= 10:
            break
        best = max(best, float(fields[-6]))
    return best


def test_a_real_run_reads_back_as_nccl_tests_output(capsys):
    code, out, _ = run_bench(
        capsys, "--nccl-tests", "allreduce", "-g", "2", "-b", "8", "-e", "512", "-f", "8",
        "-n", "4", "-w", "1", "-d", "float", "-o", "max",
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "# nThread 1 nGpus 2 minBytes 8 maxBytes 512 step: 8(factor) warmup iters: 1 "
        "iters: 4 agg iters: 1 validation: 1 graph: 0"
    )
    assert tuple(lines[lines.index(HEADER[0]):][:3]) == HEADER
    parsed = parse_nccl_tests(out)
    assert [(r["size"], r["count"], r["type"], r["redop"], r["root"]) for r in parsed["rows"]] == [
        (8, 2, "float", "max", -1), (64, 16, "float", "max", -1), (512, 128, "float", "max", -1)
    ]
    assert all(r["wrong"] == r["ip_wrong"] == "0" for r in parsed["rows"])
    assert all(r["time"] > 0 and r["ip_time"] > 0 for r in parsed["rows"])
    assert (parsed["oob"], parsed["status"]) == (0, "OK")
    busbw = [r[k] for r in parsed["rows"] for k in ("busbw", "ip_busbw")]
    assert parsed["avg_busbw"] == pytest.approx(sum(busbw) / len(busbw), abs=0.006)
    assert superbench_busbw(out) == max(r["busbw"] for r in parsed["rows"][1:])


def _measurement(size: int, inplace: bool, seconds: float, wrong: int) -> Measurement:
    """Ranks whose mean times average to ``seconds`` (rank 0 the fastest, rank 3 the
    slowest); the median, which nccl-tests' output does not use, is 1 s."""
    means = (0.5 * seconds, 0.9 * seconds, 1.1 * seconds, 1.5 * seconds)
    return Measurement(
        impl="commflow", collective=Collective.ALLGATHER, algo="auto", nranks=4,
        dtype="float16", op="none", root=-1, size=size, count=size // 8, inplace=inplace,
        time=Summary(median=1.0, ci=None, runs=5), algbw=size, busbw=0.75 * size,
        wrong=wrong, rank_means=means,
    )


def test_columns_footer_and_failures_as_nccl_tests_prints_them():
    config = BenchConfig(collective="allgather", nranks=4, sizes=(1 << 20, 1 << 30),
                         dtype="float16", peers=())
    report = BenchReport(
        config=config,
        measurements=[
            _measurement(1 << 20, False, 50e-6, 0),
            _measurement(1 << 20, True, 123.456e-6, 0),
            _measurement(1 << 30, False, 0.0123456, 2),
            _measurement(1 << 30, True, 0.0123456, 0),
        ],
        copy_bandwidth=1e10, load=(0.0, 0.0, 0.0), bound=1e10,
    )
    lines = format_report(report, begin=1 << 20, end=1 << 30, factor=1024)
    rows = [line for line in lines if not line.startswith("#")]
    assert rows == [
        "     1048576        131072      half    none      -1    50.00   20.97   15.73      0"
        "    123.5    8.49    6.37      0",
        "  1073741824     134217728      half    none      -1    12346   86.97   65.23      2"
        "    12346   86.97   65.23      0",
    ]
    runs = [(m.size, sum(m.rank_means) / 4) for m in report.measurements]
    average = sum(0.75 * size / seconds for size, seconds in runs) / len(runs) / 1e9
    assert lines[-3:] == [
        "# Out of bounds values : 2 FAILED",
        f"# Avg bus bandwidth    : {average:g} ",
        "#",
    ]
    slowest = format_report(report, begin=1 << 20, end=1 << 30, factor=1024, average=3)
    assert [line.split()[5:8] for line in slowest if not line.startswith("#")] == [
        ["75.00", "13.98", "10.49"], ["18518", "57.98", "43.49"]
    ]
    first = format_report(report, begin=1 << 20, end=1 << 30, factor=1024, average=0)
    assert [line.split()[5] for line in first if not line.startswith("#")] == ["25.00", "6172.8"]
    unchecked = format_report(report, begin=1 << 20, end=1 << 30, factor=1024, check=False)
    assert [line.split()[8] for line in unchecked if not line.startswith("#")] == ["N/A"] * 2
    assert unchecked[-3] == "# Out of bounds values : 0 OK"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-c", "2"), "-c 2: use -c 1 to check results or -c 0 not to"),
        (("-a", "4"), "-a 4: use one of 0 (rank 0), 1 (average), 2 (min), 3 (max)"),
    ],
)
def test_check_and_average_take_nccl_tests_values(capsys, args, message):
    code, _, err = run_bench(capsys, "--nccl-tests", "-g", "2", *args)
    assert code == 2 and message in err
