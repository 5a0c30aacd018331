"""How close the planner comes to published training runs, on the rows it was fitted on and on
the held-out rows.

Usage::

    python benchmarks/plan_validation.py          # the table of docs/planner.md
    python benchmarks/plan_validation.py --fit    # refit the constants on the fit rows

Each row is one run of ``src/commflow/plan/data/published_runs.json`` (its source, table and
row are in the file): the published metric as seconds per step, the planner's step time, and
the relative error. Then the median and largest |error| of the fit part and of the held-out
(``test``) part, and the median per row class (ZeRO-3, H100, fp8, deep pipeline, context
parallel, MoE). ``--fit`` prints the constants of :data:`commflow.plan.compute.CALIBRATIONS`
that bounded least squares finds on the fit rows of each (accelerator, precision), starting
from the current ones (``FIT_START`` for a new pair).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from commflow.plan.compute import CALIBRATIONS
from commflow.plan.validation import (
    CLASSES,
    FIT_START,
    Validated,
    calibration_key,
    fit_calibration,
    load_runs,
    sources,
    summarize,
    validate,
)


def summary_line(name: str, rows: list[Validated]) -> str:
    """``name``: rows, median and max |error|, and the median of each class present."""
    s = summarize(rows)
    classes = ", ".join(
        f"{c} {100 * s[f'median {c}']:.1f}%" for c in CLASSES if f"median {c}" in s
    )
    return (f"{name}: {int(s['rows'])} rows, median |error| {100 * s['median']:.1f}%, "
            f"max {100 * s['max']:.1f}%; class medians: {classes}")


def report(rows: list[Validated]) -> list[str]:
    """The table and the two summary lines (fit part, held-out part)."""
    lines = [f"{'run':<34} {'split':<5} {'classes':<17} {'published s':>11} "
             f"{'predicted s':>11} {'error':>7}"]
    for r in rows:
        lines.append(
            f"{r.run.id:<34} {r.run.split:<5} {','.join(r.run.classes) or '-':<17} "
            f"{r.published:>11.3f} {r.predicted:>11.3f} {100 * r.error:>+6.1f}%"
        )
    for split, name in (("fit", "fit part"), ("test", "held-out part")):
        lines.append(summary_line(name, [r for r in rows if r.run.split == split]))
    return lines


def refit() -> list[str]:
    """The constants fitted on the fit rows, one line per (accelerator, precision)."""
    groups = defaultdict(list)
    for run in load_runs("fit"):
        groups[calibration_key(run)].append(run)
    lines = []
    for key, runs in sorted(groups.items()):
        cal = fit_calibration(runs, CALIBRATIONS.get(key, FIT_START))
        lines.append(f"{key}: {len(runs)} rows -> {cal}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the constants (minutes)")
    args = parser.parse_args()
    if args.fit:
        print("\n".join(refit()))
        return
    print(f"# {len(sources())} sources; table: src/commflow/plan/data/published_runs.json")
    print("\n".join(report(validate())))


if __name__ == "__main__":
    main()
