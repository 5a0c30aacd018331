"""Synthesis benchmark: synthesis time and simulated algbw at 1 GiB against the lower bound,
the NVLink-following ring and the double binary tree.

Run: ``.venv/bin/python benchmarks/synth_bench.py [preset ...]`` (default: a set of boxes).
Prints one markdown row per (topology, collective) with the flow model's numbers.
"""

from __future__ import annotations

import sys
import time

from commflow import topology
from commflow.algorithms import build_for
from commflow.errors import CommflowError
from commflow.sim import lower_bound, simulate
from commflow.synth import DEFAULT_PIECES, synthesize

SIZE = 2**30
TOPOLOGIES = {
    "dgx1": topology.dgx1,
    "dgx_a100": topology.dgx_a100,
    "mi250": topology.mi250,
    "ndv2x2": lambda: topology.ndv2(2),
    "dgx_a100x2": lambda: topology.dgx_a100(2),
    "dgx_h100x2": lambda: topology.dgx_h100(2),
}
PIECES = {"dgx_a100x2": 16, "dgx_h100x2": 16}
"""Pieces per share where the default makes programs too large to simulate quickly."""
COLLECTIVES = ("allgather", "reducescatter", "allreduce")


def _algbw(program, topo) -> float:
    return simulate(program, topo, SIZE, model="flow").algbw / 1e9


def _baseline(collective: str, name: str, topo) -> str:
    try:
        return f"{_algbw(build_for(collective, name, topo), topo):.1f}"
    except CommflowError:
        return "n/a"


def main(names: list[str]) -> None:
    print(
        "| topology | collective | synth time (s) | bound GB/s | synth GB/s | % of bound "
        "| ring GB/s | tree GB/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        topo = TOPOLOGIES[name]()
        for collective in COLLECTIVES:
            start = time.perf_counter()
            pieces = PIECES.get(name, DEFAULT_PIECES)
            program = synthesize(collective, topo, pieces=pieces)
            elapsed = time.perf_counter() - start
            bound = lower_bound(collective, topo, SIZE).algbw / 1e9
            got = _algbw(program, topo)
            tree = _baseline(collective, "double_binary_tree", topo)
            print(
                f"| {name} | {collective} | {elapsed:.2f} | {bound:.1f} | {got:.1f} | "
                f"{100 * got / bound:.1f} | {_baseline(collective, 'ring', topo)} | {tree} |",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:] or list(TOPOLOGIES))
