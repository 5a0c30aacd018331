"""One rank of ``commflow tune --live``: ``python -m commflow.tune.live_rank OUT SIZES
COLLECTIVES BUDGET`` (sizes and collectives comma-separated); rank 0 writes the table."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from commflow.tune.online import tune_live


def main(argv: Sequence[str] | None = None) -> None:
    """Tune the live world this process is a rank of (see the module docstring)."""
    from commflow.runtime import init

    out, sizes, names, budget = list(sys.argv[1:] if argv is None else argv)
    comm = init()
    table = tune_live(comm, [int(s) for s in sizes.split(",")], collectives=names.split(","),
                      budget=float(budget))
    if comm.rank == 0:
        table.save(out)


if __name__ == "__main__":
    main()
