"""The ``commflow`` command line: one module per command group, formatting only.

Every command calls the library (:mod:`commflow.topology`, :mod:`commflow.algorithms`,
:mod:`commflow.ir`, :mod:`commflow.sim`) and prints the result; :func:`main` turns a
:class:`~commflow.errors.CommflowError` into one red line on standard error and exit code 2.
"""

from __future__ import annotations

import typer
from rich.markup import escape

from commflow.cli import (
    algos,
    cluster,
    ina,
    plan,
    program,
    run,
    sched,
    simulate,
    synth,
    topo,
    tune,
)
from commflow.cli._output import err
from commflow.cli.bench import bench
from commflow.errors import CommflowError

app = typer.Typer(
    name="commflow",
    help="Collective communication for distributed deep learning: topologies, algorithms as "
    "programs, verification, simulation, lower bounds and MSCCL export.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)
app.add_typer(topo.app, name="topo")
app.add_typer(cluster.app, name="cluster")
app.add_typer(ina.app, name="ina")
app.command("algos")(algos.algos)
app.command("build")(program.build)
app.command("verify")(program.verify)
app.command("export")(program.export)
app.command("import")(program.import_xml)
app.command("sim")(simulate.sim)
app.command("bound")(simulate.bound)
app.command("run", context_settings=run.CONTEXT_SETTINGS)(run.run)
app.command("bench")(bench)
app.command("plan")(plan.plan)
app.command("synth")(synth.synth)
app.command("sched")(sched.sched)
app.command("tune")(tune.tune)
app.command("calibrate")(tune.calibrate)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI on ``argv`` (default: the process arguments).

    Exits with the command's status; a ``CommflowError`` prints ``error: <message>`` in red on
    standard error and exits with status 2.
    """
    try:
        app(args=argv, prog_name="commflow")
    except CommflowError as error:
        err.print(f"[bold red]error:[/bold red] [red]{escape(str(error))}[/red]")
        raise SystemExit(2) from None


__all__ = ["app", "main"]
