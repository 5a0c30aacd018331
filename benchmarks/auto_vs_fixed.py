"""Live goal of issue 16: ``auto`` against every fixed algorithm, from ``commflow bench --algo
all --json-out`` files (one run each; ratios within the run).

Run: ``.venv/bin/python benchmarks/auto_vs_fixed.py FILE.json ...``. Prints one markdown row
per (collective, ranks, placement): the sizes where ``auto`` is within 5% of the fastest fixed
algorithm, the worst size with its ratio and winner, and ``auto``'s total over the sweep against
the best fixed algorithm's total (``commflow.tune.versus_fixed``). On one host ``auto`` runs
the ``shm`` fast path, so the spread between the two (the largest ratio either way over the
sizes) is the run's noise floor: one program measured twice.
"""

from __future__ import annotations

import json
import sys

from commflow.tune import versus_fixed
from commflow.units import format_size


def main(paths: list[str]) -> None:
    """Print the table (see the module docstring)."""
    print("| collective | ranks | placement | sizes within 5% | worst: auto / fastest "
          "(size, fastest) | sweep: auto / best fixed (algo) | auto vs shm spread |")
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
            mine = {(a, size): t for a, size, t in rows}
            spread = max((max(mine[("auto", v.size)], mine[("shm", v.size)])
                          / min(mine[("auto", v.size)], mine[("shm", v.size)])
                          for v in versus.sizes if ("shm", v.size) in mine), default=1.0)
            print(f"| {first['collective']} | {first['nranks']} | "
                  f"{'in-place' if inplace else 'out-of-place'} | {ok} / {len(versus.sizes)} | "
                  f"{worst.ratio:.2f} ({format_size(worst.size)}, {worst.best}) | "
                  f"{versus.totals['auto'] / total:.2f} ({best}) | {spread:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
