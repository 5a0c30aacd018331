"""How far the simulator scales: build and simulate large programs, print one table row each.

Usage::

    python benchmarks/sim_scale.py             # every row (the largest needs ~6 GB of memory)
    python benchmarks/sim_scale.py --small     # skip the two largest rows
    python benchmarks/sim_scale.py --only 1    # one row (0-based), e.g. under cProfile:
    python -m cProfile -s tottime benchmarks/sim_scale.py --only 1 | head -40

Columns: cost model, topology, program, ranks, steps, seconds to build the program (once),
seconds to simulate it (median of ``--repeat`` runs, default 3: wall clock, and CPU time of
this process, which is what to compare on a busy machine), then the predicted collective time
(microseconds) and bus bandwidth (GB/s) for a 1 GiB buffer.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from commflow.algorithms import build
from commflow.sim import simulate
from commflow.topology import Topology, fat_tree, ring, switch

SIZE = 1 << 30


@dataclass(frozen=True)
class Row:
    """One benchmark case."""

    model: str
    topology: Callable[[], Topology]
    collective: str
    algorithm: str
    nranks: int
    chunks: int = 1
    channels: int = 1
    large: bool = False


ROWS = [
    Row("alphabeta", lambda: switch(4096), "allreduce", "ring", 4096, large=True),
    Row("flow", lambda: fat_tree(16), "allreduce", "ring", 1024, chunks=8, large=True),
    Row("alphabeta", lambda: ring(1024), "allreduce", "ring", 1024),
    Row("flow", lambda: fat_tree(16), "allreduce", "ring", 1024, chunks=2, channels=2),
    Row("flow", lambda: fat_tree(16), "allreduce", "halving_doubling", 1024),
    Row("flow", lambda: fat_tree(8), "alltoall", "pairwise", 128),
]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(row: Row, repeat: int) -> str:
    topology = row.topology()
    t0 = time.perf_counter()
    program = build(
        row.collective, row.algorithm, row.nranks, chunks=row.chunks, channels=row.channels
    )
    built = time.perf_counter() - t0
    walls, cpus = [], []
    for _ in range(repeat):
        gc.collect()
        t1, c1 = time.perf_counter(), cpu_seconds()
        result = simulate(program, topology, SIZE, model=row.model)
        walls.append(time.perf_counter() - t1)
        cpus.append(cpu_seconds() - c1)
    name = f"{row.collective}/{row.algorithm} k={row.chunks} ch={row.channels}"
    line = (
        f"| {row.model:9} | {topology.name:12} | {name:36} | {row.nranks:5} | "
        f"{program.nsteps:10,} | {built:7.1f} | {statistics.median(walls):7.1f} | "
        f"{statistics.median(cpus):7.1f} | {result.time * 1e6:10.1f} | "
        f"{result.busbw / 1e9:6.2f} |"
    )
    del program, result
    gc.collect()
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="skip the two largest rows")
    parser.add_argument("--only", type=int, action="append", help="run only this row (0-based)")
    parser.add_argument("--repeat", type=int, default=3, help="simulations per row (median)")
    args = parser.parse_args()
    print(
        "| model     | topology     | program                              | ranks | "
        "     steps | build s | sim s   | sim cpu | time (us)  | busbw  |"
    )
    print(
        "|-----------|--------------|--------------------------------------|-------|"
        "------------|---------|---------|---------|------------|--------|"
    )
    for i, row in enumerate(ROWS):
        if (row.large and args.small) or (args.only and i not in args.only):
            continue
        print(run(row, args.repeat), flush=True)


if __name__ == "__main__":
    main()
