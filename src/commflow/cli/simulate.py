"""``commflow sim`` and ``commflow bound``: predicted times and lower bounds, nccl-tests style."""

from __future__ import annotations

from collections.abc import Iterable

import typer
from rich.markup import escape
from rich.progress import Progress

from commflow.algorithms import available, build_for
from commflow.bench.plot import plot_curves
from commflow.cli._output import (
    Codec,
    Model,
    Target,
    dtype_size,
    echo_json,
    err,
    gbps,
    number,
    out,
    parse_params,
    table,
    usec,
)
from commflow.collectives import parse_collective
from commflow.errors import AlgorithmError, CommflowError
from commflow.ir.program import ParticipantKind
from commflow.sim import Bound, SimResult, lower_bound
from commflow.topology import Topology, load
from commflow.units import format_size, parse_size, size_range

TOPO_HELP = "Topology: preset name (see `commflow topo list`) or file."


def cut_names(topology: Topology, bound: Bound) -> str:
    """The binding cut's node names, ``{box0.gpu0, box0.gpu1}``; a cut holding more than half
    the nodes is written by its complement, ``all but {box0.gpu0}``."""
    inside = set(bound.cut)
    if 2 * len(inside) <= topology.nnodes:
        return "{" + ", ".join(topology.nodes[i].name for i in bound.cut) + "}"
    rest = [n.name for n in topology.nodes if n.id not in inside]
    return "all but {" + ", ".join(rest) + "}"


def sim(
    collective: str = typer.Argument(..., help="Collective: allreduce, allgather, ..."),
    topo: str = typer.Option(..., "--topo", "-t", help=TOPO_HELP),
    algo: str = typer.Option(
        ..., "--algo", "-a",
        help="Algorithm name (see `commflow algos`), several comma-separated, or `all`."),
    begin: str = typer.Option("8", "-b", "--minbytes", help="Smallest size (64K, 16M, 1G)."),
    end: str = typer.Option("1G", "-e", "--maxbytes", help="Largest size."),
    factor: int = typer.Option(4, "-f", "--stepfactor", help="Size multiplier between rows."),
    dtype: str = typer.Option("float32", "-d", "--datatype", help="Element type (count column)."),
    chunks: int = typer.Option(
        None, "--chunks", help="Pieces each block is pipelined in (default 1; ina: 64)."),
    channels: int = typer.Option(1, "--channels", help="Independent channels."),
    root: int = typer.Option(None, "--root", help="Root rank of rooted collectives (default 0)."),
    param: list[str] = typer.Option(
        [], "--param", "-p", help="Extra algorithm parameter key=value (repeatable)."
    ),
    model: Model = typer.Option(
        Model("alphabeta"), "--model", "-m", help="Cost model."
    ),  # type: ignore[valid-type]
    target: Target = typer.Option(
        Target("live"), "--target",
        help="Where it runs: live (unbounded buffers), msccl, msccl-executor or rccl "
        "(bounded buffers: a program that would hang there is refused).",
    ),  # type: ignore[valid-type]
    codec: Codec = typer.Option(
        Codec("none"), "--codec",
        help="Compress the data on the wire (commflow.compress): bytes shrink, size does not.",
    ),  # type: ignore[valid-type]
    plot: str = typer.Option(None, "--plot", help="Draw busbw against size into this PNG."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
) -> None:
    """Simulate an algorithm on a topology over a range of sizes, like nccl-tests.

    The program is built for the topology's ranks with topology-aware defaults (a ring
    follows the fastest direct links; hierarchical takes one box per group). Columns:
    size(B) count type time(us) algbw(GB/s) busbw(GB/s), then the lower bound's time and
    %bound = bound / time * 100 (100 means the algorithm meets the bound; for programs whose
    switches aggregate, like ina, the bound with in-network aggregation). GB = 1e9 bytes;
    sizes take K/M/G suffixes. With several algorithms (`--algo ring,direct` or `--algo all`:
    every registered one that applies), one busbw column per algorithm, the fastest per
    size, and the (ranks-only) bound's busbw; --plot draws them. --codec int8 (fp16, bf16,
    int4) times the program on the encoded bytes (scales included, encoding not timed) and
    reports algbw/busbw on the uncompressed size.

    [bold]Examples[/bold]

      commflow sim allreduce --topo dgx1 --algo ring
      commflow sim allreduce --topo dgx1 --algo double_binary_tree -b 1K -e 64M -f 8
      commflow sim allgather --topo dgx-a100x2 --algo ring --model flow --json
      commflow sim allreduce --topo dgx1 --algo all -b 1K -e 1G -f 32 --plot dgx1.png
    """
    from commflow.compress import simulate_compressed, wire_fraction

    model, target, codec = model.value, target.value, codec.value
    topology = load(topo)
    name, elem = dtype_size(dtype)
    fraction = wire_fraction(codec, elem)
    sizes = size_range(parse_size(begin), parse_size(end), factor)
    extra = parse_params(param)
    if chunks is not None:
        extra["chunks"] = chunks
    if algo == "all" or "," in algo:
        _compare(collective, algo, topology, sizes, dict(extra, channels=channels, root=root),
                 (model, target, codec, elem), plot, as_json)
        return
    program = build_for(collective, algo, topology, channels=channels, root=root, **extra)
    root = program.root or 0
    in_network = any(p.kind is ParticipantKind.SWITCH for p in program.participants)
    records = []
    with Progress(console=err, transient=True, disable=as_json or not err.is_terminal) as bar:
        task = bar.add_task(f"simulating {program.name}", total=len(sizes))
        for size in sizes:
            result = simulate_compressed(program, topology, size, codec, element_bytes=elem,
                                         model=model, target=target)
            bound = lower_bound(program.collective, topology, size * fraction, root=root,
                                in_network=in_network)
            records.append((size, result, bound))
            bar.advance(task)
    if as_json:
        echo_json(
            [
                {
                    "collective": program.collective.value,
                    "algo": program.name,
                    "topology": topology.name,
                    "model": model,
                    "size": size,
                    "count": size // elem,
                    "dtype": name,
                    "time_us": usec(result.time),
                    "algbw": gbps(result.algbw),
                    "busbw": gbps(result.busbw),
                    "bound_time_us": usec(bound.time),
                    "bound_busbw": gbps(bound.busbw / fraction),
                }
                for size, result, bound in records
            ]
        )
        return
    last = records[-1][2]
    out.print(
        f"# {escape(program.collective.value)}/{escape(program.name)} on "
        f"{escape(topology.name)} ({topology.nranks} ranks), model {escape(model)}, "
        f"{program.nsteps} steps"
    )
    out.print(
        f"# binding cut {escape(cut_names(topology, last))}: "
        f"{number(gbps(last.cut_bandwidth))} GB/s across it"
    )
    for line in _table(records, name, elem):
        out.print(line, markup=False)
    if plot:
        plot_curves({program.name: [(size, r.busbw) for size, r, _ in records]}, plot,
                    title=f"{program.collective.value} on {topology.name}, model {model}",
                    reference=("lower bound", [(size, b.busbw) for size, _, b in records]))
        err.print(f"wrote {escape(plot)}")


def _compare(collective: str, algo: str, topology: Topology, sizes: list[int],
             params: dict, how: tuple[str, str, str, int], plot: str | None,
             as_json: bool) -> None:
    """``commflow sim --algo a,b`` / ``--algo all``: busbw per algorithm and size; ``how``
    is (model, target, codec, element bytes)."""
    from commflow.compress import simulate_compressed, wire_fraction

    model, target, codec, elem = how
    kind = parse_collective(collective)
    everything = algo == "all"
    names = ([a.name for a in available(kind, in_network=True)] if everything else
             [n.strip() for n in algo.split(",") if n.strip()])
    programs = {}
    for n in names:
        try:
            programs[n] = build_for(kind, n, topology, **params)
        except AlgorithmError:
            if not everything:
                raise
    if not programs:
        raise CommflowError(f"commflow sim: no {kind.value} algorithm applies to "
                            f"{topology.name}")
    results: dict[str, list[SimResult]] = {}
    with Progress(console=err, transient=True, disable=as_json or not err.is_terminal) as bar:
        task = bar.add_task("simulating", total=len(programs) * len(sizes))
        for n, program in programs.items():
            results[n] = []
            for size in sizes:
                results[n].append(simulate_compressed(program, topology, size, codec,
                                                      element_bytes=elem, model=model,
                                                      target=target))
                bar.advance(task)
    root = params.get("root") or 0
    fraction = wire_fraction(codec, elem)
    bounds = [lower_bound(kind, topology, size * fraction, root=root) for size in sizes]
    if plot:
        plot_curves({n: [(s, r.busbw) for s, r in zip(sizes, rs, strict=True)]
                     for n, rs in results.items()}, plot,
                    title=f"{kind.value} on {topology.name}, model {model}",
                    reference=("lower bound (ranks only)",
                               [(s, b.busbw) for s, b in zip(sizes, bounds, strict=True)]))
    if as_json:
        echo_json([{"collective": kind.value, "algo": n, "topology": topology.name,
                    "model": model, "size": size, "time_us": usec(r.time),
                    "algbw": gbps(r.algbw), "busbw": gbps(r.busbw)}
                   for n, rs in results.items() for size, r in zip(sizes, rs, strict=True)])
    else:
        out.print(f"# {escape(kind.value)} on {escape(topology.name)} ({topology.nranks} "
                  f"ranks), model {escape(model)}: busbw (GB/s) per algorithm")
        rows = table("size(B)", *results, "fastest", "bound", right=("size(B)", *results,
                                                                       "bound"))
        for i, size in enumerate(sizes):
            best = min(results, key=lambda n: results[n][i].time)
            rows.add_row(str(size), *(number(gbps(results[n][i].busbw)) for n in results),
                         best, number(gbps(bounds[i].busbw / fraction)))
        out.print(rows)
    if plot:
        err.print(f"wrote {escape(plot)}")


def _table(records: Iterable[tuple[int, SimResult, Bound]], dtype: str, elem: int) -> list[str]:
    """nccl-tests style rows: fixed-width, right-aligned columns."""
    header = ("size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
              "bound(us)", "%bound")  # fmt: skip
    widths = (12, 12, 9, 11, 12, 12, 11, 7)
    lines = ["#" + "".join(h.rjust(w) for h, w in zip(header, widths, strict=True))[1:]]
    for size, result, bound in records:
        share = bound.time / result.time * 100 if result.time > 0 else 100.0
        cells = (
            str(size),
            str(size // elem),
            dtype,
            number(usec(result.time)),
            number(gbps(result.algbw)),
            number(gbps(result.busbw)),
            number(usec(bound.time)),
            number(share, 1),
        )
        lines.append("".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    return lines


def bound(
    collective: str = typer.Argument(..., help="Collective: allreduce, allgather, ..."),
    topo: str = typer.Option(..., "--topo", "-t", help=TOPO_HELP),
    size: str = typer.Option("1G", "--size", "-s", help="Bytes the collective moves (1G, 64K)."),
    root: int = typer.Option(0, "--root", help="Root rank of rooted collectives."),
    as_json: bool = typer.Option(False, "--json", help="Print the bound as JSON."),
) -> None:
    """Lower bound on a collective's time on a topology (cut and latency bounds).

    Shows the bound time, the algbw/busbw it allows, its bandwidth and latency parts, the
    binding cut (node names and bandwidth across it) and whether the cut search was exact.

    [bold]Examples[/bold]

      commflow bound allgather --topo dgx1 --size 1G
      commflow bound alltoall --topo dgx-a100x2 --size 256M --json
    """
    topology = load(topo)
    nbytes = parse_size(size)
    b = lower_bound(collective, topology, nbytes, root=root)
    record = {
        "collective": b.collective.value,
        "topology": topology.name,
        "size": nbytes,
        "nranks": b.nranks,
        "time_us": usec(b.time),
        "algbw": gbps(b.algbw),
        "busbw": gbps(b.busbw),
        "bandwidth_time_us": usec(b.bandwidth_time),
        "latency_time_us": usec(b.latency_time),
        "steps": b.steps,
        "binding": b.binding,
        "cut": [topology.nodes[i].name for i in b.cut],
        "cut_bandwidth": gbps(b.cut_bandwidth),
        "exact": b.exact,
    }
    if as_json:
        echo_json(record)
        return
    out.print(
        f"[bold]{escape(b.collective.value)}[/bold] of {format_size(nbytes)} "
        f"({nbytes} B) on {escape(topology.name)} ({b.nranks} ranks)"
    )
    lines = [
        ("bound", f"{number(usec(b.time))} us ({b.binding} bound)"),
        ("algbw", f"{number(gbps(b.algbw))} GB/s"),
        ("busbw", f"{number(gbps(b.busbw))} GB/s"),
        ("bandwidth part", f"{number(usec(b.bandwidth_time))} us"),
        ("latency part", f"{number(usec(b.latency_time))} us ({b.steps} rank hops)"),
        (
            "binding cut",
            f"{cut_names(topology, b)}, {number(gbps(b.cut_bandwidth))} GB/s across it",
        ),
        ("exact", "yes" if b.exact else "no (structured candidate cuts only)"),
    ]
    for label, text in lines:
        out.print(f"  {label:<15}{escape(text)}")
