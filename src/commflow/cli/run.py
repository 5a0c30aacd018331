"""``commflow run``: start a job's ranks on this machine (or on emulated hosts)."""

from __future__ import annotations

import typer

from commflow.runtime.launcher import GRACE, launch, parse_hosts
from commflow.runtime.world import usable_cpus


def _torchrun_spelling(option: str) -> str:
    """An option's name (no leading dashes) with ``-`` for ``_``: torchrun takes both."""
    return option.replace("_", "-")


CONTEXT_SETTINGS = {"allow_interspersed_args": False, "ignore_unknown_options": True,
                    "token_normalize_func": _torchrun_spelling}
"""Options end at the command's first word: what follows belongs to the command."""


def run(
    command: list[str] = typer.Argument(
        ...,
        metavar="COMMAND",
        help="Program and its arguments; a .py file runs with Python; with -m a module.",
    ),
    nprocs: int = typer.Option(
        None,
        "-n",
        "--nproc-per-node",
        help="Number of ranks (on this node; default: the CPUs this process may use; with "
        "--hosts: all their slots).",
    ),
    module: bool = typer.Option(
        False, "-m", "--module", help="COMMAND is a Python module: run `python -m COMMAND`."
    ),
    hosts: str = typer.Option(
        None,
        "--hosts",
        help="Emulated hosts of `commflow cluster up` and their ranks: h0:2,h1:2.",
    ),
    nnodes: int = typer.Option(
        1, "--nnodes", help="Nodes of a multi-node job (one `commflow run` per node)."),
    node_rank: int = typer.Option(
        0, "--node-rank", help="This node's index, 0..nnodes-1."),
    master_addr: str = typer.Option(
        None, "--master-addr", help="Multi-node: address of node 0 (its rank "
        "0 serves the rendezvous)."),
    master_port: int = typer.Option(
        None, "--master-port", help="Multi-node: its port."),
    standalone: bool = typer.Option(
        False, "--standalone", help="As torchrun's: one node, a fresh job id (the default "
        "here; accepted so torchrun command lines work)."),
    job: str = typer.Option(
        None, "--job", help="Job id (default: a fresh random one; multi-node: from the master)."),
    timeout: float = typer.Option(
        None, "--timeout", help="Stop the ranks after this many seconds (exit status 124)."
    ),
    grace: float = typer.Option(
        GRACE, "--grace", help="Seconds between a forwarded signal and SIGKILL."
    ),
    max_restarts: int = typer.Option(
        0, "--max-restarts", help="When a rank fails, stop every rank and start the job again, "
        "at most this many times (COMMFLOW_RESTART_COUNT tells the ranks which attempt)."),
    keep_going: bool = typer.Option(
        False, "--keep-going", help="A rank killed by a signal does not stop the others (they "
        "may shrink past it); success when every rank not killed exits 0."),
    prefix: bool = typer.Option(
        True, "--prefix/--no-prefix", help="Prefix every output line with \\[rank N]."
    ),
) -> None:
    """Start ranks of COMMAND with the environment commflow.init() and
    torch.distributed code expect.

    Each rank gets COMMFLOW_RANK, COMMFLOW_WORLD_SIZE, COMMFLOW_LOCAL_RANK,
    COMMFLOW_LOCAL_SIZE, COMMFLOW_JOB and torchrun's RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Output lines are
    prefixed with \\[rank N], standard output and error kept apart. As torchrun,
    -m runs a module and OMP_NUM_THREADS is 1 unless set; the default rank
    count is the number of CPUs this process may run on (its affinity).

    Ctrl-C and SIGTERM are forwarded to every rank (SIGKILL after --grace
    seconds, or at a second Ctrl-C). When a rank fails the others are stopped
    and the exit status is that rank's (128 + signal number when killed). The
    job's shared memory is removed at the end.

    With --max-restarts N (torchrun's --max-restarts) a job stopped by a failed
    rank starts again, every rank anew, up to N times; each rank reads the
    attempt number in COMMFLOW_RESTART_COUNT (and TORCHELASTIC_RESTART_COUNT),
    0 first, and N in COMMFLOW_MAX_RESTARTS. A signal or --timeout (over all
    attempts) ends the job without restart; the exit status is the last
    attempt's. With --keep-going a rank killed by a signal leaves the others
    running, so that they can shrink their communicator and go on.

    [bold]Examples[/bold]

      commflow run -n 4 train.py --epochs 1
      commflow run -n 2 -m mypackage.train --epochs 1
      commflow run -n 2 -- python -c "import os; print(os.environ['RANK'])"
      commflow run -n 4 --max-restarts 3 train.py
      commflow run --hosts h0:2,h1:2 bench.py
      commflow run --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 -n 8 train.py

    As torchrun, --nnodes N --node-rank R --master-addr A --master-port P
    starts this node's ranks of an N-node job (run it on every node): global
    ranks R*n .. R*n+n-1, shared memory inside a node and the engine (gloo)
    between nodes. torchrun's spellings work too: --standalone, and
    underscores for dashes (--nproc_per_node, --node_rank, --master_addr).
    """
    if standalone and nnodes > 1:
        raise typer.BadParameter("--standalone is a one-node job; drop it or --nnodes",
                                 param_hint="--standalone")
    if nprocs is None:
        nprocs = usable_cpus() if hosts is None else sum(h.slots for h in parse_hosts(hosts))
    code = launch(
        command,
        nprocs,
        hosts=hosts,
        job=job,
        prefix_output=prefix,
        timeout=timeout,
        grace=grace,
        module=module,
        max_restarts=max_restarts,
        keep_going=keep_going,
        nodes=(node_rank, nnodes) if nnodes > 1 else None,
        master=None if master_addr is None or master_port is None else (master_addr,
                                                                          master_port),
    )
    raise typer.Exit(code)
