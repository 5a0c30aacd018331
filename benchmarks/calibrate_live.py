"""Calibration of issue 16: fit the simulator to live runs and report its error per
collective and rank count, for the alphabeta model (full mesh), the flow model (a memory bus
the ranks share) and the host model (that bus with a per-call overhead, CPU per message and a
cache knee).

Run: ``.venv/bin/python benchmarks/calibrate_live.py FILE.json ...`` (``commflow bench
--algo all --json-out`` files). Per transport (``shm``: one host; ``engine``: runs of
``commflow bench --hosts N`` with a host per rank), rank count and model: the fit on one half
of the measurements (``commflow.tune.calibrate``), then the median absolute error on the
other half, overall and per collective. One markdown row each. Halves:

- ``random``: a random half (seeded), so every size and algorithm is both fitted and reported;
- ``sizes``: every other size (16 B, 256 B, ... fitted; 64 B, 1 KiB, ... reported);
- ``algorithms``: every other algorithm of each collective (by name), so the reported
  programs are ones the fit never saw.

With several rank counts, a last row per transport fits the host model once to all of them
(random half): the CPU share (``ranks / 2`` CPUs) must then carry the difference between
them. The measuring host had 2 usable CPUs (``cpus=2``).
"""

from __future__ import annotations

import json
import random
import sys

import numpy as np

from commflow.tune import Measured, calibrate, from_records

SPLITS = {"alphabeta": ("random",), "flow": ("random",),
          "host": ("random", "sizes", "algorithms")}
"""Which halves each model is reported on (the host model on all three)."""


def halves(mine: list[Measured], split: str) -> tuple[list[Measured], list[Measured]]:
    """The fitted and the reported half of ``mine`` (see the module docstring)."""
    if split == "random":
        shuffled = list(mine)
        random.Random(16).shuffle(shuffled)
        return shuffled[:len(shuffled) // 2], shuffled[len(shuffled) // 2:]
    if split == "sizes":
        sizes = sorted({m.size for m in mine})
        fitted = set(sizes[::2])
        return ([m for m in mine if m.size in fitted], [m for m in mine if m.size not in fitted])
    names = {c: sorted({m.algo for m in mine if m.collective == c})
             for c in {m.collective for m in mine}}
    fitted = {(c, a) for c, algos in names.items() for a in algos[::2]}
    return ([m for m in mine if (m.collective, m.algo) in fitted],
            [m for m in mine if (m.collective, m.algo) not in fitted])


def main(paths: list[str]) -> None:
    """Print the table (see the module docstring)."""
    records = []
    for path in paths:
        with open(path) as f:
            records += json.load(f)
    measured = from_records(records)
    print("| transport | ranks | model | held out | fit / held out | alpha (us) | transfer GB/s | "
          "bus GB/s | call (us) | per message (us) | cache MiB, slowdown | "
          "median \\|error\\| held out | allreduce | allgather | reducescatter |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for engine in sorted({m.hosts > 1 for m in measured}):
        transport = "engine" if engine else "shm"
        runs = [m for m in measured if (m.hosts > 1) == engine]
        counts = sorted({m.nranks for m in runs})
        for nranks in counts:
            mine = [m for m in runs if m.nranks == nranks]
            for model, splits in SPLITS.items():
                for split in splits:
                    print(row(f"{transport} | {nranks}", mine, model, split), flush=True)
        if len(counts) > 1:  # one fit for every rank count: the CPU share carries the difference
            print(row(f"{transport} | {' + '.join(map(str, counts))}", runs, "host", "random"),
                  flush=True)


def row(ranks: str, measured: list[Measured], model: str, split: str) -> str:
    """One markdown row: ``model`` fitted on one half of ``measured``, reported on the other."""
    mine = sorted(measured, key=lambda m: (m.nranks, m.collective, m.algo, m.size))
    fit_on, held = halves(mine, split)
    fit = calibrate(fit_on, evaluate=held, model=model, cpus=2)
    errors = np.abs(fit.errors())
    per = {}
    for kind in ("allreduce", "allgather", "reducescatter"):
        picked = [e for (m, _), e in zip(fit.rows, errors, strict=True) if m.collective == kind]
        per[kind] = f"{100 * np.median(picked):.1f}%" if picked else "-"
    bus = "-" if fit.bus_bandwidth is None else f"{fit.bus_bandwidth / 1e9:.2f}"
    host = ("- | - | -" if fit.cache_bytes is None else
            f"{fit.call_overhead * 1e6:.1f} | {fit.message_cpu * 1e6:.1f} | "
            f"{fit.cache_bytes / 2**20:.1f}, {fit.cache_slowdown:.2f}")
    return (f"| {ranks} | {model} | {split} | {len(fit_on)} / {len(held)} | "
            f"{fit.alpha * 1e6:.1f} | {fit.bandwidth / 1e9:.2f} | {bus} | {host} | "
            f"{100 * fit.median_error():.1f}% | {per['allreduce']} | {per['allgather']} | "
            f"{per['reducescatter']} |")

if __name__ == "__main__":
    main(sys.argv[1:])
