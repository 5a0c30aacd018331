"""Live goal of issue 16: ``auto`` against every fixed algorithm, from ``commflow bench --algo
all --json-out`` files (one run each; ratios within the run).

Run: ``.venv/bin/python benchmarks/auto_vs_fixed.py FILE.json ...``. Prints one markdown row
per (collective, ranks, placement): the sizes where ``auto`` is within 5% of the fastest fixed
algorithm, the worst size with its ratio and winner, ``auto``'s total over the sweep against
the best fixed algorithm's total (``commflow.tune.versus_fixed``), and against the fixed
``shm`` fast path's total (on one host ``auto`` runs the fast path, with the variants a loaded
tuning table names per size; ``shm`` runs its defaults).
"""

from __future__ import annotations

import json
import sys

from commflow.tune import versus_fixed
from commflow.units import format_size


def main(paths: list[str]) -> None:
    """Print the table (see the module docstring)."""
    print("| collective | ranks | placement | sizes within 5% | worst: auto / fastest "
          "(size, fastest) | sweep: auto / best fixed (algo) | sweep: auto / shm |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        with open(path) as f:
            records = [r for r in json.load(f) if r["impl"] == "commflow"]
        for inplace in (False, True):
            rows = [(r["algo"], r["size"], r["time_us"]) for r in records
                    if r["inplace"] == inplace]
            versus = versus_fixed(rows)
            worst = versus.worst()
            ok = sum(v.ratio <= 1.05 for v in versus.sizes)
            total, best = min((t, n) for n, t in versus.totals.items() if n != "auto")
            first = records[0]
            mine = versus.totals["auto"]
            shm = versus.totals.get("shm", float("nan"))
            print(f"| {first['collective']} | {first['nranks']} | "
                  f"{'in-place' if inplace else 'out-of-place'} | {ok} / {len(versus.sizes)} | "
                  f"{worst.ratio:.2f} ({format_size(worst.size)}, {worst.best}) | "
                  f"{mine / total:.2f} ({best}) | {mine / shm:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
