"""``commflow build``, ``verify`` and ``export``: programs as files."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from commflow.algorithms import build as build_program
from commflow.cli._output import Protocol, Runtime, Target, err, out, parse_params
from commflow.errors import CommflowError, VerificationError
from commflow.ir import Program, get_target, load_program, save_program, to_msccl_xml
from commflow.ir import verify as verify_program
from commflow.units import parse_size


def describe(program: Program) -> str:
    """``<collective> <name> on N ranks, S steps``."""
    return (
        f"{program.collective.value} {program.name} on {program.nranks} ranks, "
        f"{program.nsteps} steps"
    )


def build(
    collective: str = typer.Argument(..., help="Collective: allreduce, allgather, ..."),
    algo: str = typer.Option(..., "--algo", "-a", help="Algorithm name (see `commflow algos`)."),
    nranks: int = typer.Option(..., "-n", "--nranks", help="Number of ranks."),
    chunks: int = typer.Option(1, "--chunks", help="Pieces each block is pipelined in."),
    channels: int = typer.Option(1, "--channels", help="Independent channels."),
    root: int = typer.Option(None, "--root", help="Root rank of rooted collectives (default 0)."),
    param: list[str] = typer.Option(
        [], "--param", "-p", help="Extra algorithm parameter key=value (repeatable)."
    ),
    output: Path = typer.Option(..., "-o", "--output", help="Program file to write (JSON)."),
) -> None:
    """Generate a program, verify it and save it as JSON.

    [bold]Examples[/bold]

      commflow build allreduce --algo ring -n 8 -o ring8.json
      commflow build allreduce --algo ring -n 16 --chunks 4 --channels 2 -o ring16.json
      commflow build allreduce --algo hierarchical -n 16 --param box=8 -o hier.json
      commflow build broadcast --algo binomial_tree -n 8 --root 3 -o bcast.json
    """
    program = build_program(
        collective, algo, nranks, chunks=chunks, channels=channels, root=root, **parse_params(param)
    )
    verify_program(program)
    save_program(program, output)
    out.print(f"wrote {escape(str(output))}: {escape(describe(program))} (verified)")


def verify(
    file: Path = typer.Argument(
        ..., help="Program file (JSON from `commflow build`, or MSCCL XML ending in .xml)."
    ),
    target: Target = typer.Option(
        Target("live"), "--target", help="Also prove it cannot hang there."
    ),  # type: ignore[valid-type]
    proto: Protocol = typer.Option(
        Protocol("Simple"), "--proto", help="NCCL protocol of --target."
    ),  # type: ignore[valid-type]
    max_bytes: str = typer.Option(
        None, "--max-bytes", help="Largest size it will run at on --target (default: any)."
    ),
) -> None:
    """Load a program file and prove it implements its collective.

    Prints `OK: <collective> <name> on N ranks, S steps`; a program that fails verification
    prints the problem (rank, channel, step, chunk) and exits with status 1. With --target,
    sends block when a connection's buffer is full, as on that runtime.

    [bold]Examples[/bold]

      commflow verify ring8.json
      commflow verify allreduce.xml --target rccl
    """
    program = load_program(file)
    try:
        verify_program(program, target=get_target(target.value, protocol=proto.value),
                       max_bytes=None if max_bytes is None else parse_size(max_bytes))
    except VerificationError as error:
        err.print(f"[bold red]FAILED:[/bold red] {escape(str(error))}")
        raise typer.Exit(1) from None
    out.print(f"OK: {escape(describe(program))}")


def import_xml(
    file: Path = typer.Argument(..., help="MSCCL XML file (msccl-tools, RCCL's algorithms)."),
    output: Path = typer.Option(..., "-o", "--output", help="Program file to write (JSON)."),
) -> None:
    """Import MSCCL XML as a commflow program, verify it and save it as JSON.

    Each threadblock's steps keep their order; fused steps (rcs, rrs, rrcs) become a receive
    and a send; in-place-only programs become out-of-place ones that first copy the input
    into the output buffer (docs/ir.md, "Importing MSCCL XML").

    [bold]Examples[/bold]

      commflow import allreduce-allpairs-8n-simple.xml -o allpairs.json
    """
    program = load_program(file)
    verify_program(program)
    save_program(program, output)
    out.print(f"wrote {escape(str(output))}: {escape(describe(program))} (verified)")


def export(
    file: Path = typer.Argument(..., help="Program file (JSON, from `commflow build`)."),
    xml: Path = typer.Option(..., "--xml", help="MSCCL XML file to write."),
    target: Runtime = typer.Option(
        Runtime("msccl"), "--target", "--runtime",
        help="Runtime that loads the file: msccl (MSCCL_XML_FILES), msccl-executor or rccl "
        "(MSCCL_ALGO_DIR).",
    ),  # type: ignore[valid-type]
    proto: Protocol = typer.Option(
        Protocol("Simple"), "--proto", help="NCCL protocol."
    ),  # type: ignore[valid-type]
    min_bytes: str = typer.Option("0", "--min-bytes", help="Smallest size to use it for."),
    max_bytes: str = typer.Option("1G", "--max-bytes", help="Largest size to use it for."),
) -> None:
    """Verify a program on a runtime (bounded buffers included) and export it as MSCCL XML.

    The runtimes differ in collective names (reduce_scatter in msccl, reducescatter in the
    others; gather and scatter only in the others) and limits (steps per threadblock:
    256 in msccl, 64 in the others); a program that would hang or exceed a limit there is
    refused. See docs/ir.md for how MSCCL and RCCL load the file.

    [bold]Examples[/bold]

      commflow export ring8.json --xml ring8.xml
      commflow export ring8.json --xml ring8.xml --target rccl --proto LL128 --max-bytes 64M
    """
    target, proto = target.value, proto.value
    program = load_program(file)
    try:
        text = to_msccl_xml(program, target, proto=proto, min_bytes=parse_size(min_bytes),
                            max_bytes=parse_size(max_bytes))
    except VerificationError as error:
        err.print(f"[bold red]FAILED:[/bold red] {escape(str(error))}; nothing written")
        raise typer.Exit(1) from None
    try:
        xml.write_text(text)
    except OSError as error:
        raise CommflowError(f"cannot write {xml}: {error.strerror}") from None
    out.print(f"wrote {escape(str(xml))}: {escape(describe(program))} as MSCCL XML ({target})")
