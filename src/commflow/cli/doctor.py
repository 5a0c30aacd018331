"""``commflow doctor``: which rank fell out of step, from every rank's flight record."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from commflow.cli._output import echo_json, out
from commflow.runtime.doctor import Diagnosis, diagnose, load_records
from commflow.runtime.straggler import StragglerConfig


def doctor(
    dumps: list[Path] = typer.Argument(
        ..., metavar="DUMP", help="Flight records (flight-rank<N>.json) or directories of them."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
) -> None:
    """Compare the flight records of a failed job's ranks and name the
    rank(s) out of step, and the collective.

    Each communicator keeps its last operations (COMMFLOW_FLIGHT_RECORDER,
    default 256); when one fails, every rank of the host writes them to
    COMMFLOW_DUMP_DIR (default <tmp>/commflow-<job>, named in the error).

    The first line is the finding: a rank that never entered a collective
    the others started, ranks that called different collectives with the
    same sequence number, a missing record, or OK when every rank completed
    the same collectives; then each rank's last collective, and stragglers:
    ranks that spent COMMFLOW_STRAGGLER_FACTOR (3) times the median time
    outside collectives over a window of COMMFLOW_STRAGGLER_WINDOW (100)
    collectives (warnings: they do not change the status). Exit status 0
    when consistent, 1 when a problem is found, 2 for unreadable or
    malformed files.

    [bold]Examples[/bold]

      commflow doctor /tmp/commflow-run-1234
      commflow doctor dumps/flight-rank*.json --json
    """
    findings = diagnose(load_records(dumps), stragglers=StragglerConfig.from_env(os.environ))
    if as_json:
        echo_json([_as_json(d) for d in findings])
    else:
        for i, finding in enumerate(findings):
            if i:
                out.print()
            _show(finding)
    if not all(d.ok for d in findings):
        raise typer.Exit(1)


def _last(finding: Diagnosis):
    for record in finding.records:
        colls = record.collectives
        yield record, colls.get(record.next_seq - 1)


def _show(finding: Diagnosis) -> None:
    out.print(f"{'OK' if finding.ok else 'FAILED'}: {finding.message}", markup=False)
    rows = [("rank", "last seq", "collective", "state", "record")] + [
        (str(record.rank), str(record.next_seq - 1), entry.describe() if entry else "-",
         entry.state if entry else "-", str(record.path))
        for record, entry in _last(finding)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:  # plain columns: a long path is printed whole, never cut
        out.print(f"{row[0]:>{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  "
                  f"{row[3]:<{widths[3]}}  {row[4]}", markup=False)
    for straggler in finding.stragglers:
        out.print(f"straggler: {straggler.describe()}", markup=False)


def _as_json(finding: Diagnosis) -> dict:
    return {
        "ok": finding.ok,
        "kind": finding.kind,
        "seq": finding.seq,
        "culprits": list(finding.culprits),
        "message": finding.message,
        "stragglers": [s.as_json() for s in finding.stragglers],
        "job": finding.job,
        "comm_id": finding.comm_id,
        "nranks": finding.nranks,
        "ranks": [
            {
                "rank": record.rank,
                "global_rank": record.global_rank,
                "last_seq": record.next_seq - 1,
                "op": entry.op if entry else None,
                "bytes": entry.nbytes if entry else None,
                "state": entry.state if entry else None,
                "trigger": record.trigger,
                "record": str(record.path),
            }
            for record, entry in _last(finding)
        ],
    }
