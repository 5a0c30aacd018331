"""``commflow bench --nccl-tests``: nccl-tests' flags and exactly its output columns, so that
scripts written for ``all_reduce_perf`` logs read commflow's."""

from __future__ import annotations

import os
import socket

import typer

from commflow.bench import BenchConfig, BenchReport, Measurement
from commflow.cli._output import Op
from commflow.cli.bench import fail_if_wrong, measure
from commflow.collectives import busbw_factor
from commflow.errors import CommflowError
from commflow.runtime import DEFAULT_TIMEOUT
from commflow.units import parse_size, size_range

NCCL_TYPES = {"float32": "float", "float16": "half", "float64": "double"}
"""nccl-tests' names of the data types whose names differ from commflow's."""

HEADER = (
    "#" + " " * 62 + "out-of-place" + " " * 23 + "in-place" + " " * 10,
    "#       size         count      type   redop    root"
    + "     time   algbw   busbw #wrong" * 2,
    "#        (B)    (elements)" + " " * 31 + "(us)  (GB/s)  (GB/s)" + " " * 12
    + "(us)  (GB/s)  (GB/s)" + " " * 7,
)
"""nccl-tests' three header lines: placements, column names, units."""

_KEY_WIDTHS = (12, 12, 8, 6, 6)

AVERAGES = {0: ("rank 0", lambda t: t[0]), 1: ("average", lambda t: sum(t) / len(t)),
            2: ("min", min), 3: ("max", max)}
"""``-a``: how the ranks' mean iteration times combine into the reported time."""


def nccl_tests(
    collective: str = typer.Argument("allreduce", help="Collective: allreduce, allgather, ..."),
    ranks: int = typer.Option(
        None, "-g", "--ngpus", "--ranks", help="Ranks (nccl-tests' -g; default: usable cores)."
    ),
    begin: str = typer.Option("32M", "-b", "--minbytes", help="Smallest size (8, 64K, 16M)."),
    end: str = typer.Option("32M", "-e", "--maxbytes", help="Largest size."),
    factor: int = typer.Option(2, "-f", "--stepfactor", help="Size multiplier between rows."),
    iters: int = typer.Option(20, "-n", "--iters", help="Timed iterations per size."),
    warmup: int = typer.Option(5, "-w", "--warmup_iters", help="Untimed iterations per size."),
    check: int = typer.Option(
        1, "-c", "--check", help="1: count wrong elements; 0: print N/A in #wrong."
    ),
    dtype: str = typer.Option("float", "-d", "--datatype", help="Element type (float, half...)."),
    op: Op = typer.Option(Op("sum"), "-o", "--op", help="Reduction."),  # type: ignore[valid-type]
    root: int = typer.Option(0, "-r", "--root", help="Root rank of rooted collectives."),
    average: int = typer.Option(
        1, "-a", "--average", help="Time over ranks: 0 rank 0, 1 average, 2 min, 3 max."
    ),
    timeout: float = typer.Option(DEFAULT_TIMEOUT, "--timeout", help="Seconds any wait may take."),
) -> None:
    """Run commflow's collective (algo auto) with nccl-tests' flags and print
    exactly nccl-tests' table, so that parsers of its logs read it.

    Flags as nccl-tests: -b -e -f -n -w -c -d -o -r -a, defaults as
    nccl-tests (-b 32M -e 32M -f 2 -n 20 -w 5 -c 1 -d float -a 1). -g gives
    the ranks (nccl-tests' GPUs; commflow bench's -n). Columns: size count
    type redop root, then time(us) algbw(GB/s) busbw(GB/s) #wrong
    out-of-place and in-place; the footer gives the out-of-bounds count and
    the average bus bandwidth over all rows. Time: each rank's mean over the
    timed iterations, combined over the ranks as -a says (every iteration
    starts with a barrier, which nccl-tests does not do). Not accepted: -m
    (one operation per iteration), -t (one thread per rank), -G (no CUDA
    graphs). Exit status 1 when a result was wrong.

    [bold]Examples[/bold]

      commflow bench --nccl-tests allreduce -g 4 -b 8 -e 128M -f 2
      commflow bench --nccl-tests allgather -g 2 -b 1K -e 1M -n 50 -w 10 -d half
    """
    if check not in (0, 1):
        raise CommflowError(f"-c {check}: use -c 1 to check results or -c 0 not to")
    if average not in AVERAGES:
        known = ", ".join(f"{k} ({label})" for k, (label, _) in AVERAGES.items())
        raise CommflowError(f"-a {average}: use one of {known}")
    config = BenchConfig(
        collective=collective,
        **({} if ranks is None else {"nranks": ranks}),
        sizes=tuple(size_range(parse_size(begin), parse_size(end), factor)),
        dtype={v: k for k, v in NCCL_TYPES.items()}.get(dtype, dtype),
        op=op.value,
        root=root,
        peers=(),
        warmup=warmup,
        iters=iters,
        small_iters=iters,  # nccl-tests times -n iterations at every size
        timeout=timeout,
    )
    report = measure(config)
    for line in format_report(report, begin=parse_size(begin), end=parse_size(end),
                              factor=factor, check=bool(check), average=average):
        print(line)
    fail_if_wrong(report)


def format_report(report: BenchReport, *, begin: int, end: int, factor: int,
                  check: bool = True, average: int = 1) -> list[str]:
    """nccl-tests' output for ``report``: the ``#`` header, one row per size (out-of-place
    then in-place), and the footer with the out-of-bounds count and the average busbw.
    A row's time combines the ranks' mean iteration times as nccl-tests' ``-a average``
    (:data:`AVERAGES`); algbw and busbw follow from it."""
    c = report.config
    combine = AVERAGES[average][1]
    bus_factor = busbw_factor(c.collective, c.nranks)
    rows = [m for m in report.measurements if m.impl == "commflow"]
    lines = [
        f"# nThread 1 nGpus {c.nranks} minBytes {begin} maxBytes {end} step: {factor}(factor) "
        f"warmup iters: {c.warmup} iters: {c.iters} agg iters: 1 validation: {int(check)} "
        f"graph: 0",
        "#",
        "# Using devices",
        *(
            f"#  Rank {r:2d} Group  0 on {socket.gethostname()} device {r:2d} [cpu] "
            f"commflow shared memory, {os.cpu_count()} cores"
            for r in range(c.nranks)
        ),
        "#",
        *HEADER,
    ]
    busbw: list[float] = []
    by_size: dict[int, dict[bool, Measurement]] = {}
    for m in rows:
        by_size.setdefault(m.size, {})[m.inplace] = m
    for size in sorted(by_size):
        placed = by_size[size]
        first = placed.get(False) or placed[True]
        dtype = NCCL_TYPES.get(first.dtype, first.dtype)
        keys = (str(size), str(first.count), dtype, first.op, str(first.root))
        line = "  ".join(k.rjust(w) for k, w in zip(keys, _KEY_WIDTHS, strict=True))
        for inplace in (False, True):
            m = placed.get(inplace)
            seconds = None if m is None else combine(m.rank_means)
            line += "".join(f"  {cell}" for cell in _cells(m, seconds, bus_factor, check))
            if m is not None:
                busbw.append(m.size / seconds * bus_factor)
        lines.append(line)
    wrong = sum(m.wrong for m in rows) if check else 0
    mean_busbw = sum(busbw) / len(busbw) / 1e9 if busbw else 0.0
    lines += [
        f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}",
        f"# Avg bus bandwidth    : {mean_busbw:g} ",
        "#",
    ]
    return lines


def _cells(m: Measurement | None, seconds: float | None, factor: float,
           check: bool) -> list[str]:
    """time, algbw, busbw and #wrong as nccl-tests prints them, for ``m`` taking
    ``seconds`` (``factor``: busbw over algbw)."""
    if m is None or seconds is None:
        return [c.rjust(w) for c, w in zip(("-", "-", "-", "-"), (7, 6, 6, 5), strict=True)]
    us = seconds * 1e6
    digits = 0 if us >= 10000 else 1 if us >= 100 else 2
    algbw = m.size / seconds
    wrong = str(m.wrong) if check else "N/A"
    return [
        f"{us:7.{digits}f}",
        f"{algbw / 1e9:6.2f}",
        f"{algbw * factor / 1e9:6.2f}",
        wrong.rjust(5),
    ]
