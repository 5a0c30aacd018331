"""``commflow ina``: the live in-network aggregation switch."""

from __future__ import annotations

import signal
import threading

import typer

from commflow.cli._output import out

app = typer.Typer(help="Live in-network aggregation (SwitchML-style software switch on UDP).",
                  no_args_is_help=True)


@app.command("switch")
def switch(
    port: int = typer.Option(..., "--port", "-p", help="UDP port (0: any free one)."),
    nranks: int = typer.Option(..., "-n", "--nranks", help="Workers per job."),
    slots: int = typer.Option(64, "--slots", "-s", help="Aggregator slots in the pool."),
    values: int = typer.Option(256, "--values", help="int32 values per packet."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback)."),
    loss: float = typer.Option(0.0, "--loss", help="Drop probability on the switch's sends."),
    dup: float = typer.Option(0.0, "--dup", help="Duplicate probability on its sends."),
    seed: int = typer.Option(0, "--seed", help="Seed of the injected faults."),
    lease: float = typer.Option(30.0, "--lease", help="Seconds before an idle job is freed."),
) -> None:
    """Serve aggregator slots to `ina_allreduce` workers until Ctrl-C or SIGTERM.

    Prints `listening on HOST:PORT` first (the port chosen when --port is 0), and the
    switch's counters at the end.

    [bold]Example[/bold]

      commflow ina switch --port 9999 -n 4 --slots 64 --loss 0.01
    """
    from commflow.ina import Faults, run_switch

    faults = Faults(drop=loss, duplicate=dup, seed=seed)
    stop = threading.Event()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) if main else None

    def ready(addr: tuple[str, int]) -> None:
        out.print(f"listening on {addr[0]}:{addr[1]} ({nranks} workers per job, {slots} "
                  f"slots, {values} values per packet, loss {loss}, dup {dup})")
        out.file.flush()

    try:
        stats = run_switch(host, port, nranks, slots, values=values, faults=faults,
                           lease=lease, stop=stop, ready=ready)
    except KeyboardInterrupt:
        return
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    out.print(f"stopped: {stats.sessions} sessions ({stats.refused} refused), "
              f"{stats.aggregated} packets aggregated, {stats.results} results "
              f"({stats.multicast} multicast), "
              f"{stats.duplicates} duplicates, {stats.stale} stale, {stats.malformed} "
              f"malformed, {stats.rejected} rejected; {faults.dropped} sends dropped, "
              f"{faults.duplicated} duplicated")
