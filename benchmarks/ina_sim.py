"""Simulated in-network aggregation (``ina``) against the ring and the hierarchical
allreduce, 8 to 1,024 workers on one switch and on fat-trees (25 GB/s links), 1 GiB,
alpha-beta model, with both lower bounds (ranks-only reduce-scatter + allgather, and with
switches aggregating).

    .venv/bin/python benchmarks/ina_sim.py [preset ...]
"""

from __future__ import annotations

import sys
import time

from commflow.algorithms import build_for
from commflow.errors import CommflowError
from commflow.sim import lower_bound, simulate
from commflow.topology import load

SIZE = 1 << 30
PRESETS = ("switch8", "switch64", "switch256", "switch1024", "fat-tree4", "fat-tree8",
           "fat-tree16")


def main(presets: list[str]) -> None:
    print("| topology | ranks | ina chunks | ina GB/s | ring GB/s | hierarchical GB/s | "
          "ina / ring | ina / size/B | bound RS+AG | bound in-network | secs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in presets:
        topo = load(name)
        start = time.perf_counter()
        chunks = 32 if topo.nranks > 128 and name.startswith("fat") else 64
        ina = simulate(build_for("allreduce", "ina", topo, chunks=chunks), topo, SIZE).algbw
        ring = simulate(build_for("allreduce", "ring", topo), topo, SIZE).algbw
        box = 8 if name.startswith("switch") else int(round((topo.nranks * 4) ** (1 / 3))) // 2
        try:
            hier = simulate(build_for("allreduce", "hierarchical", topo, box=box), topo,
                            SIZE).algbw / 1e9
            hier_text = f"{hier:.2f}"
        except CommflowError as error:
            hier_text = f"n/a ({error})"[:40]
        plain = lower_bound("allreduce", topo, SIZE).algbw
        innet = lower_bound("allreduce", topo, SIZE, in_network=True).algbw
        print(f"| {name} | {topo.nranks} | {chunks} | {ina / 1e9:.2f} | {ring / 1e9:.2f} | "
              f"{hier_text} | {ina / ring:.2f} | {ina / 25e9:.3f} | {plain / 1e9:.2f} | "
              f"{innet / 1e9:.2f} | {time.perf_counter() - start:.1f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(PRESETS))
