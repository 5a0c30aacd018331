"""``commflow bench``: real collectives on this machine against gloo and Open MPI, nccl-tests
style."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import Progress, TaskID

from commflow.bench import (
    SMALL_BYTES,
    SMALL_ITERS_FACTOR,
    BenchConfig,
    BenchReport,
    Measurement,
    default_nranks,
    plot_busbw,
    run_benchmark,
)
from commflow.bench.barrier import compare_barriers
from commflow.bench.memory import PROBE_BYTES, PROBE_REPEATS
from commflow.cli._group import NCCL_TESTS_FLAG
from commflow.cli._output import Op, echo_json, err, gbps, number, out, usec
from commflow.errors import CommflowError
from commflow.runtime import DEFAULT_TIMEOUT
from commflow.units import format_size, parse_size, size_range

_KEYS = ("size(B)", "count", "type", "redop", "root")
_KEY_WIDTHS = (12, 12, 9, 7, 6)
_COLUMNS = ("time(us)", "ci95(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong")
_WIDTHS = (11, 20, 12, 12, 7)
_RATIO_WIDTH = 8


def bench(
    collective: str = typer.Argument(
        "allreduce", help="Collective: allreduce, allgather, ..., or barrier."
    ),
    nranks: int = typer.Option(None, "-n", "--nranks", help="Ranks (default: CPU cores, >= 2)."),
    begin: str = typer.Option("8", "-b", "--minbytes", help="Smallest size (8, 64K, 16M)."),
    end: str = typer.Option("64M", "-e", "--maxbytes", help="Largest size."),
    factor: int = typer.Option(2, "-f", "--stepfactor", help="Size multiplier between rows."),
    dtype: str = typer.Option("float32", "-d", "--datatype", help="Element type."),
    op: Op = typer.Option(Op("sum"), "-o", "--op", help="Reduction."),  # type: ignore[valid-type]
    root: int = typer.Option(0, "-r", "--root", help="Root rank of rooted collectives."),
    algo: str = typer.Option(
        "auto",
        "-a",
        "--algo",
        help="commflow algorithm(s), comma-separated, or 'all'; FILE.json runs a saved program.",
    ),
    vs: str = typer.Option("gloo", "--vs", help="Peers: gloo, mpi, gloo,mpi or none."),
    warmup: int = typer.Option(5, "-w", "--warmup", help="Untimed iterations per size."),
    iters: int = typer.Option(
        20, "--iters",
        help=f"Timed iterations per size above {format_size(SMALL_BYTES)} (barrier: barriers).",
    ),
    small_iters: int = typer.Option(
        None, "--small-iters",
        help=f"Timed iterations per size up to {format_size(SMALL_BYTES)} "
        f"(default: {SMALL_ITERS_FACTOR} x --iters).",
    ),
    timeout: float = typer.Option(DEFAULT_TIMEOUT, "--timeout", help="Seconds any wait may take."),
    hosts: int = typer.Option(
        1, "--hosts",
        help="Split commflow's ranks into this many emulated hosts of consecutive ranks: "
        "between them messages take the engine transport (gloo over loopback TCP).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the records as JSON on standard output instead of tables."
    ),
    json_file: Path = typer.Option(None, "--json-out", help="Also write the records as JSON here."),
    plot_file: Path = typer.Option(None, "--plot", help="Draw busbw vs size into this PNG."),
    nccl_tests_flag: bool = typer.Option(
        False, NCCL_TESTS_FLAG,
        help="nccl-tests' flags and output instead (-g ranks, -n iterations, ...); "
        "see `commflow bench --nccl-tests -h`.",
    ),
) -> None:
    """Measure real collectives between processes of this machine, like
    nccl-tests, with torch.distributed gloo and Open MPI on the same sizes.

    Defaults: allreduce, -n = CPU cores (at least 2), -b 8 -e 64M -f 2,
    float32 sum, --algo auto, --vs gloo, 5 warm-up and 20 timed iterations
    per size and placement, 200 (--small-iters, default 10 x --iters) for
    sizes up to 64K, as the OSU micro-benchmarks run more for small messages
    (the records' "runs" says how many). Every iteration starts with a
    barrier; its time is the slowest rank's. time(us) is the median over the
    iterations, ci95(us) the 95% confidence interval of the median (order
    statistics, Hoefler & Belli SC'15), #wrong the elements of the last
    result that differ from the expected values, over all ranks. Out-of-place
    columns come first, then in-place; a peer's ratio is commflow's busbw
    (algo auto, or the first --algo) over the peer's. GB = 1e9 bytes. The
    memory copy bandwidth is measured too, with the busbw bound it implies
    for a copy-in/copy-out shared-memory implementation. Exit status 1 when a
    result was wrong.

    `commflow bench barrier` times barriers instead (one row per
    implementation; sizes, --algo, --small-iters, -d, -o, -r and --plot do
    not apply).

    --hosts H measures commflow's transport between machines on this one:
    the ranks are split into H emulated hosts (COMMFLOW_HOST), and a message
    between two hosts crosses the engine (gloo over loopback TCP) where one
    inside a host takes shared memory; the shm fast path needs one host, so
    --algo all leaves it out. `commflow calibrate` fits the simulator to
    such runs (a host per rank, -n = --hosts) as it does to one host's.

    An --algo entry ending in .json is a program file (commflow synth -o,
    or commflow.ir.save_program): its collective, rank count and root must
    be the benchmark's; its rows are labelled with the file name.

    [bold]Examples[/bold]

      commflow bench
      commflow bench --vs gloo,mpi -n 2 -b 8 -e 64M
      commflow bench allgather --algo all --vs none -e 16M --json-out ag.json --plot ag.png
      commflow bench allreduce -n 2 -e 1M --vs none --json
      commflow bench barrier -n 4 --vs gloo,mpi --iters 200
      commflow bench allreduce -n 2 --hosts 2 --algo all --vs none -e 16M --json-out eng.json
      commflow bench --nccl-tests allreduce -g 4 -b 8 -e 128M -f 2 -n 20 -w 5
      commflow synth allgather --topo ring4 -o ag4.json
      commflow bench allgather -n 4 --algo ring,ag4.json --vs none
    """
    if collective.lower() == "barrier":
        if hosts != 1:
            raise CommflowError("--hosts does not apply to commflow bench barrier")
        _barrier(nranks, vs, warmup, iters, timeout, as_json, json_file)
        return
    config = BenchConfig(
        collective=collective,
        nranks=default_nranks() if nranks is None else nranks,
        sizes=tuple(size_range(parse_size(begin), parse_size(end), factor)),
        dtype=dtype,
        op=op.value,
        root=root,
        algos=tuple(a.strip() for a in algo.split(",")),
        peers=() if vs.strip() == "none" else tuple(p.strip() for p in vs.split(",")),
        warmup=warmup,
        iters=iters,
        small_iters=small_iters,
        timeout=timeout,
        hosts=hosts,
    )
    report = measure(config)
    records = [m.record() for m in report.measurements]
    if as_json:
        echo_json(records)
    else:
        _print(report)
    if json_file is not None:
        _write(json_file, json.dumps(records, indent=2))
    if plot_file is not None:
        plot_busbw(
            report.measurements,
            plot_file,
            bound=report.bound,
            title=f"{config.collective.value}, {config.nranks} ranks, {config.dtype}",
        )
    fail_if_wrong(report)


def _barrier(nranks: int | None, vs: str, warmup: int, iters: int, timeout: float,
             as_json: bool, json_file: Path | None) -> None:
    """``commflow bench barrier``: one row per implementation (sizes do not apply)."""
    n = default_nranks() if nranks is None else nranks
    peers = () if vs.strip() == "none" else tuple(p.strip() for p in vs.split(","))
    results, notes = compare_barriers(n, peers=peers, warmup=warmup, iters=iters,
                                      timeout=timeout)
    records = [r.record() for r in results]
    if json_file is not None:
        _write(json_file, json.dumps(records, indent=2))
    if as_json:
        echo_json(records)
        return
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    ours = results[0].time.median
    lines = [
        f"# commflow bench: barrier on {n} ranks; {warmup} warm-up + {iters} timed barriers",
        "# every timed barrier follows an untimed one and takes the slowest rank's time; "
        "time = median, ci95 = 95% confidence interval of the median",
        f"# host: {os.cpu_count()} cores, load average {load}",
        "# ratio = commflow time / peer time",
        f"#{'impl':>11}{'time(us)':>11}{'ci95(us)':>20}{'ratio':>8}",
    ]
    for r in results:
        ci = "-" if r.time.ci is None else \
            f"{number(usec(r.time.ci[0]))}-{number(usec(r.time.ci[1]))}"
        ratio = "-" if r.impl == "commflow" or not r.time.median else \
            number(ours / r.time.median)
        lines.append(f"{r.impl:>12}{_cell(number(usec(r.time.median)), 11)}{_cell(ci, 20)}"
                     f"{_cell(ratio, 8)}")
    lines += [f"# {note}" for note in notes]
    for line in lines:
        out.print(line, markup=False)


def measure(config: BenchConfig) -> BenchReport:
    """Run the benchmark, with a progress bar on standard error while it is a terminal."""
    with Progress(console=err, transient=True, disable=not err.is_terminal) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(impl: str, done: int, total: int) -> None:
            if impl not in tasks:
                tasks[impl] = bar.add_task(f"{impl}: sizes", total=total)
            bar.update(tasks[impl], completed=done)

        return run_benchmark(config, progress=progress)


def fail_if_wrong(report: BenchReport) -> None:
    """Exit with status 1, naming the implementations, when a result was wrong."""
    wrong = {m.impl for m in report.measurements if m.wrong}
    if wrong:
        err.print(
            f"[bold red]error:[/bold red] [red]wrong results from "
            f"{escape(', '.join(sorted(wrong)))} (see the #wrong column)[/red]"
        )
        raise typer.Exit(1)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text + "\n")
    except OSError as error:
        raise CommflowError(f"cannot write {path}: {error}") from None


def _print(report: BenchReport) -> None:
    c = report.config
    hosts = "" if c.hosts == 1 else \
        f" in {c.hosts} emulated hosts (between them the engine: gloo over loopback TCP)"
    out.print(
        f"# commflow bench: {c.collective.value} on {c.nranks} ranks{hosts}, {c.dtype} {c.op}; "
        f"{c.warmup} warm-up + {_timed(c, [m.size for m in report.measurements])}",
        markup=False,
    )
    out.print(
        "# every iteration starts with a barrier and takes the slowest rank's time; "
        "time = median, ci95 = 95% confidence interval of the median",
        markup=False,
    )
    load = " ".join(f"{x:.2f}" for x in report.load)
    out.print(f"# host: {os.cpu_count()} cores, load average {load} at the start", markup=False)
    reference = report.reference_algo()
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for m in report.measurements:
        groups.setdefault((m.impl, m.algo), []).append(m)
    for (impl, algo), rows in groups.items():
        ratios = None if impl == "commflow" else report.ratios(impl)
        title = (
            f"{impl}, algo {algo}"
            if impl == "commflow"
            else f"{impl} (ratio = commflow {reference} busbw / {impl} busbw)"
        )
        out.print(f"#\n# {title}", markup=False)
        for line in _table(rows, ratios):
            out.print(line, markup=False)
    if len(c.commflow_algos) > 1:
        out.print("#\n# fastest commflow algorithm (largest busbw) per size", markup=False)
        for m in report.best_algorithms():
            place = "in-place" if m.inplace else "out-of-place"
            out.print(
                f"#   {format_size(m.size):>6} {place:<13}{m.algo:<20}"
                f"{number(usec(m.time.median)):>11} us{number(gbps(m.busbw)):>8} GB/s",
                markup=False,
            )
        for inplace in (False, True):
            versus = report.auto_versus_fixed(inplace=inplace)
            if versus is None:
                continue
            place = "in-place" if inplace else "out-of-place"
            worst = versus.worst()
            fixed = min((t, n) for n, t in versus.totals.items() if n != "auto")
            out.print(
                f"# auto {place}: at most {number(worst.ratio)}x the fastest fixed algorithm "
                f"({worst.best} at {format_size(worst.size)}); over the sweep "
                f"{number(usec(versus.totals['auto']))} us, the best fixed algorithm "
                f"{fixed[1]} {number(usec(fixed[0]))} us (commflow.tune.versus_fixed)",
                markup=False,
            )
    out.print("#", markup=False)
    for note in report.notes:
        out.print(f"# {note}", markup=False)
    if report.copy_bandwidth is None or report.bound is None:  # across emulated hosts
        return
    out.print(
        f"# memory copy bandwidth: {number(gbps(report.copy_bandwidth))} GB/s "
        f"(numpy copy of {PROBE_BYTES >> 20} MiB, one process, best of {PROBE_REPEATS})",
        markup=False,
    )
    out.print(
        f"# memory-bandwidth bound: {number(gbps(report.bound))} GB/s busbw for buffers "
        f"beyond the caches (every rank copies its input into shared memory and its output "
        f"out of it; docs/benchmarks.md)",
        markup=False,
    )


def _timed(config: BenchConfig, sizes: list[int]) -> str:
    """The header's timed iterations: one count where every size of the run has the same."""
    counts = {config.timed_rounds(size) for size in sizes} or {config.iters}
    if len(counts) == 1:
        return f"{counts.pop()} timed iterations per size and placement"
    return (
        f"{config.small_iters} timed iterations per size and placement up to "
        f"{format_size(SMALL_BYTES)}, {config.iters} above"
    )


def _table(rows: list[Measurement], ratios: dict[tuple[int, bool], float] | None) -> list[str]:
    """nccl-tests rows: the keys, then out-of-place and in-place columns (and ratios)."""
    columns = (*_COLUMNS, "ratio") if ratios is not None else _COLUMNS
    widths = (*_WIDTHS, _RATIO_WIDTH) if ratios is not None else _WIDTHS
    half = sum(widths)
    keys = "".join(h.rjust(w) for h, w in zip(_KEYS, _KEY_WIDTHS, strict=True))
    lines = [
        "#" + " " * (len(keys) - 1) + "out-of-place".rjust(half) + "in-place".rjust(half),
        "#" + keys[1:] + "".join(h.rjust(w) for h, w in zip(columns, widths, strict=True)) * 2,
    ]
    by_size: dict[int, dict[bool, Measurement]] = {}
    for m in rows:
        by_size.setdefault(m.size, {})[m.inplace] = m
    for size in sorted(by_size):
        placed = by_size[size]
        first = next(iter(placed.values()))
        cells = [str(size), str(first.count), first.dtype, first.op, str(first.root)]
        line = "".join(_cell(c, w) for c, w in zip(cells, _KEY_WIDTHS, strict=True))
        for inplace in (False, True):
            m = placed.get(inplace)
            values = _cells(m, ratios) if m else ["-"] * len(columns)
            line += "".join(_cell(v, w) for v, w in zip(values, widths, strict=True))
        lines.append(line)
    return lines


def _cell(text: str, width: int) -> str:
    """``text`` right-aligned in ``width`` characters, after at least one space (a value wider
    than its column, e.g. a wide confidence interval, must not run into its neighbour)."""
    return f" {text}".rjust(width)


def _cells(m: Measurement, ratios: dict[tuple[int, bool], float] | None) -> list[str]:
    ci = "-" if m.time.ci is None else f"{number(usec(m.time.ci[0]))}-{number(usec(m.time.ci[1]))}"
    cells = [
        number(usec(m.time.median)),
        ci,
        number(gbps(m.algbw)),
        number(gbps(m.busbw)),
        str(m.wrong),
    ]
    if ratios is not None:
        ratio = ratios.get((m.size, m.inplace))
        cells.append("-" if ratio is None else number(ratio))
    return cells
