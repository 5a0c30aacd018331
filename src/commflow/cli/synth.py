"""``commflow synth``: synthesize a program for a topology, compare it with the bound and with
ring and double binary tree in the simulator, and save it as JSON and MSCCL XML."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from commflow.algorithms import build_for
from commflow.cli._output import echo_json, gbps, number, out, table, usec
from commflow.errors import CommflowError
from commflow.ir import save_program, to_msccl_xml, verify
from commflow.sim import lower_bound, simulate
from commflow.topology import load
from commflow.units import format_size, parse_size, size_range

BASELINES = ("ring", "double_binary_tree")
"""Predefined algorithms shown for comparison (``-`` where one does not apply)."""


def _baseline_algbw(collective, name, topology, size, model) -> float | None:
    try:
        program = build_for(collective, name, topology)
    except CommflowError:
        return None
    return simulate(program, topology, size, model=model).algbw


def synth(
    collective: str = typer.Argument(..., help="Collective: allgather, allreduce, alltoall, ..."),
    topo: str = typer.Option(..., "--topo", "-t", help="Topology: preset name or file."),
    objective: str = typer.Option("bandwidth", "--objective", help="bandwidth or latency."),
    pieces: int = typer.Option(None, "--pieces", help="Chunks per share (default: library's)."),
    root: int = typer.Option(0, "--root", help="Root rank of broadcast/reduce."),
    begin: str = typer.Option("1M", "-b", "--minbytes", help="Smallest size (64K, 16M, 1G)."),
    end: str = typer.Option("1G", "-e", "--maxbytes", help="Largest size."),
    factor: int = typer.Option(32, "-f", "--stepfactor", help="Size multiplier between rows."),
    model: str = typer.Option("flow", "--model", "-m", help="Simulator model: flow or alphabeta."),
    output: Path = typer.Option(None, "-o", "--output", help="Save the program as JSON here."),
    xml: Path = typer.Option(None, "--xml", help="Save the program as MSCCL XML here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
) -> None:
    """Synthesize COLLECTIVE for a topology, verify it and compare it in the simulator.

    The schedule is verified with one chunk per share (larger instances repeat those steps
    chunk by chunk). Prints the synthesis time, then per size: the program's time, algbw
    and busbw, the lower bound's algbw and %bound, and ring / double binary tree algbw
    (GB = 1e9 bytes/s).

    [bold]Examples[/bold]

      commflow synth allgather --topo dgx1
      commflow synth allreduce --topo dgx-a100 -o ar.json --xml ar.xml
      commflow synth allgather --topo dgx1 --objective latency -b 1K -e 1M
    """
    from commflow.synth import synthesize

    topology = load(topo)
    start = time.perf_counter()
    program = synthesize(collective, topology, objective=objective, pieces=pieces, root=root)
    elapsed = time.perf_counter() - start
    # the same schedule with one chunk per share: small enough for the race checker
    verify(synthesize(collective, topology, objective=objective, pieces=1, root=root))
    if output is not None:
        save_program(program, output)
    if xml is not None:
        xml.write_text(to_msccl_xml(program))
    records = []
    for size in size_range(parse_size(begin), parse_size(end), factor):
        result = simulate(program, topology, size, model=model)
        bound = lower_bound(program.collective, topology, size, root=program.root or 0)
        base = {n: _baseline_algbw(program.collective, n, topology, size, model) for n in BASELINES}
        records.append(
            {
                "size": size,
                "time": result.time,
                "algbw": result.algbw,
                "busbw": result.busbw,
                "bound_algbw": bound.algbw,
                "bound_pct": 100 * bound.time / result.time,
                **{f"{n}_algbw": bw for n, bw in base.items()},
            }
        )
    if as_json:
        echo_json(
            {
                "program": program.name,
                "synthesis_seconds": elapsed,
                "steps": program.nsteps,
                "params": dict(program.params),
                "rows": records,
            }
        )
        return
    out.print(
        f"{program.name} on {topology.name}: {program.nsteps} steps (verified), "
        f"synthesized in {elapsed:.2f} s"
    )
    rows = table(
        "size",
        "time(us)",
        "algbw(GB/s)",
        "busbw(GB/s)",
        "bound(GB/s)",
        "%bound",
        *(f"{n}(GB/s)" for n in BASELINES),
    )
    for r in records:
        rows.add_row(
            format_size(r["size"]),
            number(usec(r["time"])),
            number(gbps(r["algbw"])),
            number(gbps(r["busbw"])),
            number(gbps(r["bound_algbw"])),
            number(r["bound_pct"], 1),
            *("-" if r[f"{n}_algbw"] is None else number(gbps(r[f"{n}_algbw"])) for n in BASELINES),
        )
    out.print(rows)
