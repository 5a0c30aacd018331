"""Calibration of issue 16: fit the simulator to live runs and report its error per
collective and rank count, for the alphabeta model (full mesh) and the flow model (a memory
bus the ranks share).

Run: ``.venv/bin/python benchmarks/calibrate_live.py FILE.json ...`` (``commflow bench
--algo all --json-out`` files). Per rank count and model: the fit on every other measurement
(``commflow.tune.calibrate``), then the median absolute error on the held-out ones, overall
and per collective. One markdown row each. The held-out half is drawn at random (seeded), so
every size is both fitted and reported (alternate sizes would leave the largest to
extrapolation, and the host's caches make that a different regime).
"""

from __future__ import annotations

import json
import random
import sys

import numpy as np

from commflow.tune import calibrate, from_records


def main(paths: list[str]) -> None:
    """Print the table (see the module docstring)."""
    records = []
    for path in paths:
        with open(path) as f:
            records += json.load(f)
    measured = from_records(records)
    print("| ranks | model | fit / held out | alpha (us) | transfer GB/s | bus GB/s | "
          "median \\|error\\| held out | allreduce | allgather | reducescatter |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for nranks in sorted({m.nranks for m in measured}):
        mine = sorted((m for m in measured if m.nranks == nranks),
                      key=lambda m: (m.collective, m.algo, m.size))
        random.Random(16).shuffle(mine)
        half = len(mine) // 2
        for model in ("alphabeta", "flow"):
            fit = calibrate(mine[:half], evaluate=mine[half:], model=model)
            errors = np.abs(fit.errors())
            per = {}
            for kind in ("allreduce", "allgather", "reducescatter"):
                picked = [e for (m, _), e in zip(fit.rows, errors, strict=True)
                          if m.collective == kind]
                per[kind] = f"{100 * np.median(picked):.1f}%" if picked else "-"
            bus = "-" if fit.bus_bandwidth is None else f"{fit.bus_bandwidth / 1e9:.2f}"
            print(f"| {nranks} | {model} | {half} / {len(mine) - half} | "
                  f"{fit.alpha * 1e6:.1f} | {fit.bandwidth / 1e9:.2f} | {bus} | "
                  f"{100 * fit.median_error():.1f}% | {per['allreduce']} | "
                  f"{per['allgather']} | {per['reducescatter']} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
