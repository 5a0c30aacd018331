"""``commflow synth``: synthesize a program for a topology, compare it with the bound and with
ring and double binary tree in the simulator, save it as JSON and MSCCL XML, and draw its
link loads (``--show``)."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape

from commflow.algorithms import build_for
from commflow.cli._output import (
    Model,
    Runtime,
    choices,
    echo_json,
    err,
    gbps,
    number,
    out,
    table,
    usec,
)
from commflow.collectives import parse_collective
from commflow.errors import CommflowError
from commflow.ir import Program, save_program, to_msccl_xml, verify
from commflow.sim import lower_bound, simulate
from commflow.topology import load
from commflow.units import format_size, parse_size, size_range

Objective = choices("Objective", ("bandwidth", "latency", "balanced"))
"""``--objective``: what the synthesized program is made for (``commflow.synth.OBJECTIVES``,
and ``balanced``: picked by size; kept here so that the CLI starts without the synthesizers)."""

BASELINES = ("ring", "multi_ring", "double_binary_tree")
"""Predefined algorithms shown for comparison (``-`` where one does not apply); ``multi_ring``
is NCCL's: one ring per NIC rail on clusters with a NIC per GPU."""


def _baseline_algbw(collective, name, topology, size, model) -> float | None:
    try:
        program = build_for(collective, name, topology)
    except CommflowError:
        return None
    return simulate(program, topology, size, model=model).algbw


def synth(
    collective: str = typer.Argument(..., help="Collective: allgather, allreduce, alltoall, ..."),
    topo: str = typer.Option(..., "--topo", "-t", help="Topology: preset name or file."),
    objective: Objective = typer.Option(
        Objective("bandwidth"), "--objective", help="What the program is made for."
    ),  # type: ignore[valid-type]
    size: str = typer.Option(
        None, "--size", help="balanced: the size to be fastest at (default 1M)."
    ),
    max_steps: int = typer.Option(
        None, "--max-steps", help="balanced: at most this many sequential messages."
    ),
    pieces: int = typer.Option(
        None, "--pieces", help="Chunks per share (balanced: the most tried; default: library's)."
    ),
    root: int = typer.Option(0, "--root", help="Root rank of broadcast/reduce."),
    begin: str = typer.Option("1M", "-b", "--minbytes", help="Smallest size (64K, 16M, 1G)."),
    end: str = typer.Option("1G", "-e", "--maxbytes", help="Largest size."),
    factor: int = typer.Option(32, "-f", "--stepfactor", help="Size multiplier between rows."),
    model: Model = typer.Option(
        Model("flow"), "--model", "-m", help="Simulator model."
    ),  # type: ignore[valid-type]
    output: Path = typer.Option(None, "-o", "--output", help="Save the program as JSON here."),
    xml: Path = typer.Option(
        None, "--xml",
        help="Save MSCCL XML for --target here: without --pieces, of the program that "
        "target loads and runs fastest at 1 GiB.",
    ),
    target: Runtime = typer.Option(
        Runtime("msccl"), "--target", help="Runtime of --xml."
    ),  # type: ignore[valid-type]
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
    show: Path = typer.Option(
        None, "--show", help="Draw the link loads at the largest size into this PNG."
    ),
    by_size: bool = typer.Option(
        False, "--by-size",
        help="A program set: the fastest candidate per size range over -b..-e (-o and --xml "
        "then name directories: one file per range).",
    ),
) -> None:
    """Synthesize COLLECTIVE for a topology, verify it and compare it in the simulator.

    A tree or flow schedule is verified with one chunk per share (larger instances repeat
    those steps chunk by chunk), any other program as it is. Prints the synthesis time, then
    per size: the program's time, algbw and busbw, the lower bound's algbw and %bound, and
    ring / double binary tree algbw (GB = 1e9 bytes/s).

    --by-size makes a program set instead: the fastest candidate (as balanced, alphabeta
    model) at each size from -b to -e, consecutive sizes with the same winner joined into a
    range (the first from 0 bytes, the last without end); -o DIR saves each range's program
    and --xml DIR its MSCCL XML with the range as minBytes/maxBytes (a synthesized program
    the target cannot load is replaced by the fastest one it can).

    --objective balanced picks, for one --size, the program with the least simulated time
    (alphabeta model) among the tree/flow synthesis with 1, 2, 4, ... pieces, the step
    schedule and the predefined algorithms, keeping those with at most --max-steps
    sequential messages; the pick is printed. --show draws every link's load at the
    largest size (its busy time over the busiest link's) on the topology.

    [bold]Examples[/bold]

      commflow synth allgather --topo dgx1
      commflow synth allreduce --topo dgx-a100 -o ar.json --xml ar.xml
      commflow synth allgather --topo dgx1 --objective latency -b 1K -e 1M
      commflow synth allreduce --topo dgx1 --objective balanced --size 64K --max-steps 4
      commflow synth allgather --topo dgx1 --show allgather.png
      commflow synth allgather --topo dgx1 --by-size -b 1K -e 4G -f 4 --xml ag-set/
    """
    from commflow.synth import lowered_shape, lowering_loss, synthesize, synthesize_for
    from commflow.synth.show import draw_schedule, schedule_picture
    from commflow.tune import choose

    objective, model, target = objective.value, model.value, target.value
    topology = load(topo)
    if by_size:
        _by_size(collective, topology, size_range(parse_size(begin), parse_size(end), factor),
                 pieces, root, (output, xml, target), as_json)
        return
    start = time.perf_counter()
    if objective == "balanced":
        program = choose(
            collective,
            topology,
            pieces=pieces,
            root=root,
            size=None if size is None else parse_size(size),
            max_steps=max_steps,
        )
    else:
        program = synthesize(collective, topology, objective=objective, pieces=pieces, root=root)
    elapsed = time.perf_counter() - start
    params = dict(program.params)
    if params.get("method", objective) == "bandwidth":
        # the same schedule with one chunk per share: the same steps, verified in seconds
        verify(synthesize(collective, topology, objective="bandwidth", pieces=1, root=root))
    else:
        verify(program)
    if output is not None:
        save_program(program, output)
    if xml is not None:
        if pieces is None and params.get("method", objective) == "bandwidth":
            fitted, text = synthesize_for(collective, topology, target, root=root)
            loss = lowering_loss(fitted, program, topology, target)
            side = "below" if loss >= 0 else "above"
            err.print(f"MSCCL XML for {target}: {lowered_shape(fitted)}, {fitted.nsteps} "
                      f"steps, {100 * abs(loss):.2f}% {side} the default synthesis at 1G "
                      "(flow model)")
        else:
            text = to_msccl_xml(program, target)
        xml.write_text(text)
    records = []
    result = None
    for nbytes in size_range(parse_size(begin), parse_size(end), factor):
        result = simulate(program, topology, nbytes, model=model)
        bound = lower_bound(program.collective, topology, nbytes, root=program.root or 0)
        base = {
            n: _baseline_algbw(program.collective, n, topology, nbytes, model) for n in BASELINES
        }
        records.append(
            {
                "size": nbytes,
                "time": result.time,
                "algbw": result.algbw,
                "busbw": result.busbw,
                "bound_algbw": bound.algbw,
                "bound_pct": 100 * bound.time / result.time,
                **{f"{n}_algbw": bw for n, bw in base.items()},
            }
        )
    if show is not None and result is not None:
        draw_schedule(schedule_picture(program, topology, result), show)
    if as_json:
        echo_json(
            {
                "program": program.name,
                "synthesis_seconds": elapsed,
                "steps": program.nsteps,
                "params": params,
                "rows": records,
            }
        )
        return
    out.print(
        f"{program.name} on {topology.name}: {program.nsteps} steps (verified), "
        f"synthesized in {elapsed:.2f} s"
    )
    if objective == "balanced":
        pick = params["method"]
        if pick == "bandwidth":
            pick += f" with {params.get('pieces', params.get('chunks'))} pieces"
        out.print(
            f"balanced pick for {format_size(params['balanced_size'])}: {pick}, "
            f"message depth {params['depth']}, "
            f"{number(usec(params['balanced_time']))} us (alphabeta model)"
        )
    if "packing" in params:
        how = "exact integer packing" if params["packing"] == "forest" else "column generation"
        if params.get("lowering") != "streams":
            shape = f"{params['units']} per root, {params['pieces']} pieces each"
        elif params["packing"] == "forest":
            shape = f"{params['units']} per root, {params['pieces']} pieces each, a stream per edge"
        else:
            shape = (
                f"{params['trees']} weighted per root, {params['pieces']} pieces per root, "
                "a stream per edge"
            )
        out.print(f"trees: {how}, {shape}")
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
    if show is not None:
        out.print(f"link loads drawn in {show}")


def _by_size(collective: str, topology, sizes: list[int], pieces: int | None, root: int,
             files: tuple[Path | None, Path | None, str], as_json: bool) -> None:
    """``commflow synth --by-size``: print (and save) :func:`commflow.tune.program_set`."""
    from commflow.synth import synthesize_for
    from commflow.tune import DEFAULT_PIECES, program_set

    output, xml, target = files
    ranges = program_set(collective, topology, sizes, pieces=pieces or DEFAULT_PIECES,
                         root=root if parse_collective(collective).rooted else None)
    records = []
    fitted: Program | None = None  # what the target loads, searched for once
    for r in ranges:
        stem = f"{r.program.collective.value}-{r.min_bytes}-{r.max_bytes}"
        record = {"min_bytes": r.min_bytes, "max_bytes": r.max_bytes, "method": r.method,
                  "pieces": dict(r.program.params).get("pieces"), "steps": r.program.nsteps,
                  "time_us": r.seconds * 1e6}
        if output is not None:
            output.mkdir(parents=True, exist_ok=True)
            save_program(r.program, output / f"{stem}.json")
            record["json"] = str(output / f"{stem}.json")
        if xml is not None:
            xml.mkdir(parents=True, exist_ok=True)
            try:
                program = r.program
                try:
                    text = to_msccl_xml(program, target, min_bytes=r.min_bytes,
                                        max_bytes=r.max_bytes)
                except CommflowError:
                    if r.method != "bandwidth":
                        raise
                    if fitted is None:
                        fitted, _ = synthesize_for(collective, topology, target, root=root)
                    program = fitted
                    text = to_msccl_xml(program, target, min_bytes=r.min_bytes,
                                        max_bytes=r.max_bytes)
                    record["xml_pieces"] = dict(program.params).get("pieces")
            except CommflowError as error:
                record["xml_refused"] = str(error)
            else:
                (xml / f"{stem}.xml").write_text(text)
                record["xml"] = str(xml / f"{stem}.xml")
        records.append(record)
    if as_json:
        echo_json(records)
        return
    out.print(f"# {escape(collective)} on {escape(topology.name)}: the fastest program per "
              f"size range (alphabeta model), {len(sizes)} sizes")
    rows = table("above", "up to", "method", "pieces", "steps", "time(us)",
                 right=("steps", "time(us)"))
    for rec in records:
        above = "-" if rec["min_bytes"] == 0 else format_size(rec["min_bytes"] - 1)
        top = "-" if rec["max_bytes"] == ranges[-1].max_bytes else format_size(rec["max_bytes"])
        rows.add_row(above, top, rec["method"], str(rec["pieces"] or "-"), str(rec["steps"]),
                     number(rec["time_us"]))
    out.print(rows)
    for rec in records:
        if "xml_pieces" in rec:
            err.print(f"XML for sizes {rec['min_bytes']}..{rec['max_bytes']}: "
                      f"{rec['xml_pieces']} piece(s) per share, the most {target} loads")
        if "xml_refused" in rec:
            err.print(f"no XML for sizes {rec['min_bytes']}..{rec['max_bytes']}: "
                      f"{escape(rec['xml_refused'])}")
