"""``commflow build``, ``verify`` and ``export``: programs as files."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from commflow.algorithms import build as build_program
from commflow.cli._output import err, out, parse_params
from commflow.errors import CommflowError, VerificationError
from commflow.ir import Program, load_program, save_program, to_msccl_xml
from commflow.ir import verify as verify_program


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
    file: Path = typer.Argument(..., help="Program file (JSON, from `commflow build`)."),
) -> None:
    """Load a program file and prove it implements its collective.

    Prints `OK: <collective> <name> on N ranks, S steps`; a program that fails verification
    prints the problem (rank, channel, step, chunk) and exits with status 1.

    [bold]Examples[/bold]

      commflow verify ring8.json
    """
    program = load_program(file)
    try:
        verify_program(program)
    except VerificationError as error:
        err.print(f"[bold red]FAILED:[/bold red] {escape(str(error))}")
        raise typer.Exit(1) from None
    out.print(f"OK: {escape(describe(program))}")


def export(
    file: Path = typer.Argument(..., help="Program file (JSON, from `commflow build`)."),
    xml: Path = typer.Option(..., "--xml", help="MSCCL XML file to write."),
    runtime: str = typer.Option(
        "msccl", "--runtime", help="msccl (MSCCL_XML_FILES) or rccl (MSCCL_ALGO_DIR)."
    ),
    proto: str = typer.Option("Simple", "--proto", help="NCCL protocol: Simple, LL or LL128."),
) -> None:
    """Export a program file as MSCCL XML.

    The two runtimes differ in collective names (reduce_scatter vs reducescatter; gather and
    scatter exist only in rccl). See docs/ir.md for how MSCCL and RCCL load the file.

    [bold]Examples[/bold]

      commflow export ring8.json --xml ring8.xml
      commflow export ring8.json --xml ring8.xml --runtime rccl --proto LL128
    """
    program = load_program(file)
    try:
        verify_program(program)
    except VerificationError as error:
        err.print(f"[bold red]FAILED:[/bold red] {escape(str(error))}; nothing written")
        raise typer.Exit(1) from None
    text = to_msccl_xml(program, runtime=runtime, proto=proto)
    try:
        xml.write_text(text)
    except OSError as error:
        raise CommflowError(f"cannot write {xml}: {error.strerror}") from None
    out.print(f"wrote {escape(str(xml))}: {escape(describe(program))} as MSCCL XML ({runtime})")
