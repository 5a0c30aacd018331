"""``commflow tune``: the fastest registered algorithm per size range, as a tuning table."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from commflow.cli._output import Model, echo_json, err, number, out, table
from commflow.errors import CommflowError
from commflow.topology import load
from commflow.tuning_table import ANY, TuningTable, check_nccl_options, load_table
from commflow.units import format_size, parse_size, size_range

_LARGEST = 2**63 - 1


def tune(
    collectives: str = typer.Argument(
        "allreduce", help="Collective(s), comma-separated: allreduce,allgather,..."
    ),
    topo: str = typer.Option(
        None, "--topo", "-t", help="Topology: preset name or file (offline tuning)."),
    live: int = typer.Option(
        None, "--live", help="Measure instead: tune a live shared-memory world of N ranks."),
    budget: float = typer.Option(60.0, "--budget", help="With --live: seconds to spend."),
    begin: str = typer.Option("1K", "-b", "--minbytes", help="Smallest size tuned."),
    end: str = typer.Option("4G", "-e", "--maxbytes", help="Largest size tuned."),
    factor: int = typer.Option(4, "-f", "--stepfactor", help="Size multiplier between sizes."),
    model: Model = typer.Option(
        Model("alphabeta"), "--model", "-m", help="Simulator model."
    ),  # type: ignore[valid-type]
    output: Path = typer.Option(None, "-o", "--output", help="Write the table (JSON) here."),
    nccl_csv: Path = typer.Option(
        None, "--nccl-csv", help="Write NCCL tuner-plugin rules (NCCL_TUNER_CONFIG_FILE) here."
    ),
    nccl_protocol: str = typer.Option(
        "simple", "--nccl-protocol",
        help="Protocol of the --nccl-csv rules: ll, ll128 or simple (NCCL's example plugin "
             "forces one with the algorithm)."),
    nccl_channels: int = typer.Option(
        -1, "--nccl-channels",
        help="Channels of the --nccl-csv rules; -1 means NCCL's own in the plugin's format, "
             "but NCCL's example plugin then reports 1 channel (docs/tuning.md)."),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON."),
) -> None:
    """Choose the fastest algorithm per size range: a tuning table that `auto` follows.

    Ranks every registered algorithm on a topology by the simulator at sizes -b to -e and
    keeps the fastest per size range (offline tuning); with --live N, measures them on a live
    world of N ranks instead (successive halving within --budget seconds; load the table
    with COMMFLOW_TUNING_TABLE=FILE or commflow.runtime.use_tuning_table and `auto` follows
    it).

    A rule covers the sizes above the previous rule's up to its own (inclusive); the first
    starts at 0 bytes and the last covers every larger size. time(us) is the winner's
    simulated time at the largest size of its range that was tuned. The table is keyed by
    the topology's fingerprint; --nccl-csv writes the rules whose algorithm NCCL has (ring and
    multi-ring as ring, double binary tree as tree for allreduce) for NCCL's example tuner
    plugin, with the protocol and channels --nccl-protocol and --nccl-channels name.

    [bold]Examples[/bold]

      commflow tune allreduce --topo dgx1
      commflow tune allreduce,allgather --topo dgx-a100x2 -o table.json --nccl-csv nccl.csv
      commflow tune allreduce --live 2 -b 1K -e 16M -f 16 --budget 30 -o live.json
    """
    from commflow.tune import offline_table

    sizes = size_range(parse_size(begin), parse_size(end), factor)
    names = [c.strip() for c in collectives.split(",") if c.strip()]
    if not names:
        raise CommflowError("commflow tune: name at least one collective")
    check_nccl_options(nccl_protocol, nccl_channels)
    if (topo is None) == (live is None):
        raise CommflowError("commflow tune: give --topo (offline) or --live N (measured)")
    result = (_live_table(live, sizes, names, budget) if live is not None else
              offline_table(names, load(topo), sizes, model=model.value))
    if output is not None:
        result.save(output)
    if nccl_csv is not None:
        try:
            nccl_csv.write_text(result.to_nccl_csv(protocol=nccl_protocol, channels=nccl_channels))
        except OSError as error:
            raise CommflowError(f"cannot write {nccl_csv}: {error.strerror}") from None
    if as_json:
        echo_json(json.loads(result.to_json()))
        return
    out.print(f"# {escape(result.topology)}, model {escape(result.model)}, "
              f"{len(sizes)} sizes {format_size(sizes[0])}..{format_size(sizes[-1])}")
    rows = table("collective", "above", "up to", "algo", "time(us)")
    for rule in result.rules:
        above = "-" if rule.min_bytes == 0 else format_size(rule.min_bytes - 1)
        top = "-" if rule.max_bytes == _LARGEST else format_size(rule.max_bytes)
        placed = "" if rule.placement == ANY else f" ({rule.placement.replace('_', ' ')})"
        rows.add_row(rule.collective.value + placed, above, top, rule.algo,
                     number(rule.time_us))
    out.print(rows)
    for path in (output, nccl_csv):
        if path is not None:
            err.print(f"wrote {escape(str(path))}")


def _live_table(nranks: int, sizes: list[int], names: list[str],
                budget: float) -> TuningTable:
    """Run :mod:`commflow.tune.live_rank` on a live world of ``nranks``; read its table."""
    import tempfile

    from commflow.runtime.launcher import launch
    with tempfile.TemporaryDirectory(prefix="commflow-tune-") as tmp:
        path = Path(tmp) / "table.json"
        status = launch(["commflow.tune.live_rank", str(path), ",".join(map(str, sizes)),
                         ",".join(names), str(budget)], nranks, module=True,
                        timeout=budget * 3 + 60)
        if status != 0:
            raise CommflowError(f"commflow tune --live: the ranks failed (exit {status})")
        return load_table(path)


def calibrate(
    files: list[Path] = typer.Argument(
        ..., help="JSON records of `commflow bench --json-out` (or --json)."
    ),
    holdout: bool = typer.Option(
        True, "--holdout/--no-holdout",
        help="Fit on every other measurement and report the others (else fit and report all).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the fit and rows as JSON."),
    model: str = typer.Option(
        "alphabeta", "--model",
        help="alphabeta (a full mesh), flow (a memory bus all transfers share) or host "
        "(that bus plus a per-call overhead, CPU per message and a cache knee).",
    ),
) -> None:
    """Fit the simulator's model of a transport to measured runs.

    Fits latency, bandwidth, reduce and copy bandwidth (with --model flow also the bus
    bandwidth; with --model host also the call overhead, CPU per message and the cache
    knee) to the measurements and prints the simulator's error on each.

    Uses the out-of-place runs of registered algorithms in the records; the model is a full
    mesh of ranks under the alphabeta simulator, or a memory bus under the flow simulator
    (docs/tuning.md). The transport is shared memory for runs on one host, the engine for
    runs of `commflow bench --hosts N` with a host per rank; give runs of one of them.

    [bold]Examples[/bold]

      commflow bench allreduce -n 2 --algo all --vs none -b 1K -e 16M -f 4 --json-out ar.json
      commflow calibrate ar.json
      commflow bench allreduce -n 2 --hosts 2 --algo all --vs none -e 16M --json-out eng.json
      commflow calibrate eng.json --model host
    """
    from commflow.tune.calibrate import calibrate as fit
    from commflow.tune.calibrate import from_records

    records: list = []
    for path in files:
        try:
            records += json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise CommflowError(f"cannot read bench records {path}: {error}") from None
    measured = from_records(records)
    result = (fit(measured[::2], evaluate=measured[1::2], model=model) if holdout
              else fit(measured, model=model))
    bus = "" if result.bus_bandwidth is None else (
        f", bus {number(result.bus_bandwidth / 1e9)} GB/s")
    if result.cache_bytes is not None:
        bus += (f", call {number(result.call_overhead * 1e6)} us, "
                f"{number(result.message_cpu * 1e6)} us CPU per message, bandwidths "
                f"{number(1 + result.cache_slowdown)}x slower beyond "
                f"{format_size(round(result.cache_bytes))}")
    errors = result.errors()
    if as_json:
        echo_json({
            "alpha_us": result.alpha * 1e6, "bandwidth": result.bandwidth / 1e9,
            "reduce_bandwidth": result.reduce_bandwidth / 1e9,
            "copy_bandwidth": result.copy_bandwidth / 1e9, "model": result.model,
            "bus_bandwidth": None if result.bus_bandwidth is None
            else result.bus_bandwidth / 1e9,
            "call_overhead_us": result.call_overhead * 1e6,
            "message_cpu_us": result.message_cpu * 1e6,
            "cache_bytes": result.cache_bytes, "cache_slowdown": result.cache_slowdown,
            "median_abs_error": result.median_error(), "holdout": holdout,
            "rows": [{"collective": m.collective, "algo": m.algo, "nranks": m.nranks,
                      "size": m.size, "time_us": m.time * 1e6, "predicted_us": p * 1e6}
                     for m, p in result.rows],
        })
        return
    used = len(measured[::2]) if holdout else len(measured)
    out.print(f"# fit on {used} of {len(measured)} measurements: alpha "
              f"{number(result.alpha * 1e6)} us, bandwidth {number(result.bandwidth / 1e9)} GB/s, "
              f"reduce {number(result.reduce_bandwidth / 1e9)} GB/s, copy "
              f"{number(result.copy_bandwidth / 1e9)} GB/s{bus} ({result.model} model)")
    rows = table("collective", "algo", "ranks", "size", "time(us)", "predicted(us)", "error")
    for (m, p), e in zip(result.rows, errors, strict=True):
        rows.add_row(m.collective, m.algo, str(m.nranks), format_size(m.size),
                     number(m.time * 1e6), number(p * 1e6), f"{100 * e:+.0f}%")
    out.print(rows)
    out.print(f"# median |error| {100 * result.median_error():.1f}% over {len(result.rows)} "
              f"{'held-out ' if holdout else ''}measurements")
