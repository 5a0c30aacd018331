"""How many pieces per root a synthesized stream program could hold on MSCCL targets even
with every receive fused with the send of what it wrote, and what it loses at best there.

For each collective and count of pieces per root: the fewest ``<tb>`` and ``<step>``
elements any export of the one-stream-per-edge program needs
(:func:`commflow.ir.msccl_fit.least_elements`: its steps less every possible ``rcs``/``rrcs``
fusion, plus the threadblocks its peers need) on the busiest rank (RCCL and msccl-executor
keep 4,096 elements of the loading rank) and in the whole file (MSCCL), and the program's
loss at 1 GiB in one pass without any runtime limit (flow model) against the default
synthesis: a lower bound on what the program loses on a target, where bounded buffers only
add waits (chunks under 2 MiB: one loop).

    .venv/bin/python benchmarks/fused_ceiling.py mi250x2 allgather:84-92,96,128 \\
        reducescatter:88-94,128 allreduce:48,52-56,64
"""

from __future__ import annotations

import sys
import time

from commflow.ir.msccl_fit import element_budget, least_elements
from commflow.ir.target import get_target
from commflow.sim import simulate
from commflow.synth import synthesize
from commflow.topology import load

SIZE = 1 << 30


def _counts(text: str) -> list[int]:
    """``84-86,96`` -> ``[84, 85, 86, 96]``."""
    counts = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        counts.extend(range(int(low), int(high or low) + 1))
    return counts


def main(preset: str, specs: list[str]) -> None:
    topo = load(preset)
    print(f"{'collective':<15}{'pieces':>7}{'rank min':>10}{'file min':>10}{'per rank fits':>15}"
          f"{'file fits':>11}{'GB/s':>9}{'default':>9}{'loss%':>8}{'secs':>7}")
    for spec in specs:
        collective, _, counts = spec.partition(":")
        default = simulate(synthesize(collective, topo), topo, SIZE, model="flow").algbw
        for pieces in _counts(counts):
            start = time.perf_counter()
            program = synthesize(collective, topo, pieces=pieces)
            least = least_elements(program)
            rank_budget = element_budget(program, get_target("rccl"))
            file_budget = element_budget(program, get_target("msccl"))
            algbw = simulate(program, topo, SIZE, model="flow").algbw
            print(f"{collective:<15}{pieces:>7}{least.max():>10,}{least.sum():>10,}"
                  f"{'yes' if least.max() <= rank_budget else 'no':>15}"
                  f"{'yes' if least.sum() <= file_budget else 'no':>11}{algbw / 1e9:>9.2f}"
                  f"{default / 1e9:>9.2f}{100 * (1 - algbw / default):>8.2f}"
                  f"{time.perf_counter() - start:>7.1f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
