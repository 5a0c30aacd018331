"""Live goal of issue 16: ``auto`` against every fixed algorithm, from ``commflow bench --algo
all --json-out`` files (ratios within each run).

Run: ``.venv/bin/python benchmarks/auto_vs_fixed.py FILE.json ...``. Prints one markdown row
per (collective, ranks, placement): the sizes where ``auto`` is within 5% of the fastest fixed
algorithm, the worst size with its ratio and winner, ``auto``'s total over the sweep against
the best fixed algorithm's total (``commflow.tune.versus_fixed``), and against the fixed
``shm`` fast path's total (on one host ``auto`` runs the fast path, with the variants a loaded
tuning table names per size; ``shm`` runs its defaults), and ``auto``'s mean busbw over the
sizes against ``shm``'s (nccl-tests' ``# Avg bus bandwidth``, which weighs every size alike
where the totals are the large sizes').

Files of the same collective and rank count are repeated runs: the row then gives each run's
count of sizes within 5%, sweep ratios and mean busbw ratios, and judges the median over the
runs of each (algorithm, size) cell (the worst size and the totals are the median's).

A second table gives nccl-tests' own summary of a run, ``# Avg bus bandwidth``: the mean of
busbw over every size of both placements (``src/common.cu`` adds each out-of-place and
in-place busbw and divides by their count), ``auto``'s against that of the fixed algorithm
with the largest one, per (collective, ranks).

A third table gives, per size, the fastest *program* algorithm's time (every fixed one but
``shm``) over ``shm``'s, out of place, median over the runs: below 1 where a program beats
the fast path's defaults.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import numpy as np

from commflow.tune import Versus, versus_fixed
from commflow.units import format_size


def _within(versus: Versus) -> int:
    return sum(v.ratio <= 1.05 for v in versus.sizes)


def _median(runs: list[list[tuple[str, int, float]]]) -> list[tuple[str, int, float]]:
    cells: dict[tuple[str, int], list[float]] = defaultdict(list)
    for rows in runs:
        for algo, size, seconds in rows:
            cells[(algo, size)].append(seconds)
    return [(algo, size, float(np.median(t))) for (algo, size), t in cells.items()
            if len(t) == len(runs)]


def _means(rows: list[tuple[str, int, float]]) -> dict[str, float]:
    """Every algorithm's mean of size / time over ``rows`` (busbw is that times one factor
    per collective and rank count, which cancels in ratios)."""
    found: dict[str, list[float]] = defaultdict(list)
    for algo, size, seconds in rows:
        found[algo].append(size / seconds)
    return {algo: float(np.mean(values)) for algo, values in found.items()}


def _mean_busbw(rows: list[tuple[str, int, float]]) -> str:
    """``auto``'s mean busbw over the sizes against ``shm``'s."""
    mean = _means(rows)
    return f"{mean['auto'] / mean['shm']:.2f}"


def _avg_bus_bandwidth(rows: list[tuple[str, int, float]]) -> tuple[float, str]:
    """``auto``'s mean busbw over ``rows`` against the largest of the fixed algorithms',
    and that algorithm."""
    mean = _means(rows)
    best = max((m, a) for a, m in mean.items() if a != "auto")
    return mean["auto"] / best[0], best[1]


def main(paths: list[str]) -> None:
    """Print the table (see the module docstring)."""
    groups: dict[tuple[str, int], list[list[dict]]] = defaultdict(list)
    for path in paths:
        with open(path) as f:
            records = [r for r in json.load(f) if r["impl"] == "commflow"]
        groups[(records[0]["collective"], records[0]["nranks"])].append(records)
    print("| collective | ranks | placement | sizes within 5% | worst: auto / fastest "
          "(size, fastest) | sweep: auto / best fixed (algo) | sweep: auto / shm | "
          "mean busbw: auto / shm |")
    print("|---|---|---|---|---|---|---|---|")
    for (collective, nranks), runs in groups.items():
        for inplace in (False, True):
            rows = [[(r["algo"], r["size"], r["time_us"]) for r in records
                     if r["inplace"] == inplace] for records in runs]
            each = [versus_fixed(r) for r in rows]
            versus = versus_fixed(_median(rows)) if len(rows) > 1 else each[0]
            worst = versus.worst()
            mine = versus.totals["auto"]
            total, best = min((t, n) for n, t in versus.totals.items() if n != "auto")
            shm = versus.totals.get("shm", float("nan"))
            within = f"{_within(versus)} / {len(versus.sizes)}"
            sweep_shm = f"{mine / shm:.2f}"
            if len(rows) > 1:
                within += f" (runs: {', '.join(str(_within(v)) for v in each)})"
                sweep_shm += " (runs: " + ", ".join(
                    f"{v.totals['auto'] / v.totals.get('shm', float('nan')):.2f}"
                    for v in each) + ")"
            mean = _mean_busbw(_median(rows) if len(rows) > 1 else rows[0])
            if len(rows) > 1:
                mean += " (runs: " + ", ".join(_mean_busbw(r) for r in rows) + ")"
            print(f"| {collective} | {nranks} | {'in-place' if inplace else 'out-of-place'} | "
                  f"{within} | {worst.ratio:.2f} ({format_size(worst.size)}, {worst.best}) | "
                  f"{mine / total:.2f} ({best}) | {sweep_shm} | {mean} |")
    print()
    print("| collective | ranks | avg bus bandwidth, both placements: auto / best fixed "
          "(algo) |")
    print("|---|---|---|")
    for (collective, nranks), runs in groups.items():
        # median per (algorithm, size, placement) cell, then the sizes alone
        keyed = [[(r["algo"], (r["size"], r["inplace"]), r["time_us"]) for r in records]
                 for records in runs]
        rows = [[(a, key[0], t) for a, key, t in cells] for cells in keyed]
        median = [(a, key[0], t) for a, key, t in _median(keyed)]
        ratio, best = _avg_bus_bandwidth(median)
        cell = f"{ratio:.2f} ({best})"
        if len(rows) > 1:
            cell += " (runs: " + ", ".join(f"{_avg_bus_bandwidth(r)[0]:.2f}"
                                           for r in rows) + ")"
        print(f"| {collective} | {nranks} | {cell} |")
    _programs(groups)


def _programs(groups: dict[tuple[str, int], list[list[dict]]]) -> None:
    """Print the third table (see the module docstring)."""
    sizes = sorted({r["size"] for runs in groups.values() for rs in runs for r in rs})
    print()
    print("| collective | ranks | " + " | ".join(format_size(s) for s in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for (collective, nranks), runs in groups.items():
        median = _median([[(r["algo"], r["size"], r["time_us"]) for r in records
                           if not r["inplace"]] for records in runs])
        cells = []
        for size in sizes:
            times = {a: t for a, s, t in median if s == size}
            programs = [t for a, t in times.items() if a not in ("auto", "shm")]
            cells.append(f"{min(programs) / times['shm']:.2f}"
                         if programs and "shm" in times else "-")
        print(f"| {collective} | {nranks} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
