"""``commflow algos``: the registered algorithms."""

from __future__ import annotations

import typer

from commflow.algorithms import available
from commflow.cli._output import echo_json, out, table

COMMON_PARAMS = ("chunks", "channels")
"""Parameters every algorithm takes (rooted collectives also take ``root``)."""


def algos(
    collective: str = typer.Argument(
        None, help="Only this collective (allreduce, allgather, ...); all when omitted."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the table as JSON records."),
) -> None:
    """List registered algorithms: key, summary (with cost formula) and parameters.

    Every algorithm takes --chunks (pipelining) and --channels; rooted collectives also
    --root; extra parameters are given to `commflow build` and `commflow sim` as
    --param key=value.

    [bold]Examples[/bold]

      commflow algos
      commflow algos allreduce
      commflow algos allgather --json
    """
    algorithms = available(collective, in_network=True)
    if as_json:
        echo_json(
            [
                {
                    "key": a.key,
                    "collective": a.collective.value,
                    "name": a.name,
                    "summary": a.summary,
                    "in_network": a.in_network,
                    "params": [
                        *COMMON_PARAMS,
                        *(("root",) if a.collective.rooted else ()),
                        *a.params,
                    ],
                }
                for a in algorithms
            ]
        )
        return
    rows = table("key", "summary", "extra params")
    rows.columns[0].no_wrap = True
    for a in algorithms:
        rows.add_row(a.key, a.summary, ", ".join(a.params) or "-")
    out.print(rows)
