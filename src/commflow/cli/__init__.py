"""The ``commflow`` command line: one module per command group, formatting only.

Every command calls the library (:mod:`commflow.topology`, :mod:`commflow.algorithms`,
:mod:`commflow.ir`, :mod:`commflow.sim`) and prints the result; :func:`main` turns a
:class:`~commflow.errors.CommflowError` or a usage error into one red line on standard error
and exit code 2.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer
from rich.markup import escape

from commflow.cli import (
    algos,
    cluster,
    doctor,
    ina,
    p2p,
    plan,
    program,
    run,
    sched,
    simulate,
    synth,
    topo,
    tune,
)
from commflow.cli._group import CONTEXT, CommflowGroup, reflow_help
from commflow.cli._output import err, out
from commflow.cli.bench import bench
from commflow.cli.nccl_tests import nccl_tests
from commflow.errors import CommflowError

app = typer.Typer(
    name="commflow",
    help="Collective communication for distributed deep learning: topologies, algorithms as "
    "programs, verification, simulation, lower bounds and MSCCL export.",
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode="rich",
    cls=CommflowGroup,
    context_settings=CONTEXT,
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
app.command("nccl-tests", hidden=True)(nccl_tests)
app.command("p2p")(p2p.p2p)
app.command("plan")(plan.plan)
app.command("synth")(synth.synth)
app.command("sched")(sched.sched)
app.command("tune")(tune.tune)
app.command("calibrate")(tune.calibrate)
app.command("doctor")(doctor.doctor)
for _app in (app, topo.app, cluster.app, ina.app):
    reflow_help(_app)


def package_version() -> str:
    """The installed package's version (its metadata), ``unknown`` when not installed."""
    try:
        return version("commflow")
    except PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        out.print(f"commflow {package_version()}", markup=False)
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(
        False, "--version", "-V", is_eager=True, callback=_print_version,
        help="Print the version and exit.",
    ),
) -> None:
    """Options that come before the command."""


def main(argv: list[str] | None = None) -> None:
    """Run the CLI on ``argv`` (default: the process arguments).

    Exits with the command's status; a ``CommflowError`` prints ``error: <message>`` in red on
    standard error and exits with status 2, as does a usage error (unknown command or
    option, bad or missing value), with a pointer to the command's help.
    """
    try:
        code = app(args=argv, prog_name="commflow", standalone_mode=False)
    except CommflowError as error:
        err.print(f"[bold red]error:[/bold red] [red]{escape(str(error))}[/red]")
        raise SystemExit(2) from None
    except typer.TyperException as error:
        ctx = getattr(error, "ctx", None)
        hint = f" (see '{ctx.command_path} -h')" if ctx is not None else ""
        message = error.format_message().replace("Value error, ", "")
        err.print(f"[bold red]error:[/bold red] [red]{escape(message)}{hint}[/red]")
        raise SystemExit(error.exit_code) from None
    except typer.Abort:
        err.print("[bold red]aborted[/bold red]")
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)


__all__ = ["app", "main", "package_version"]
