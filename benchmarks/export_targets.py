"""Synthesized programs lowered to MSCCL-family targets: what each loses at 1 GiB.

For each preset and collective: the default synthesis (thousands of chunks per root, one pass,
unbounded buffers) against the program that each target loads and runs fastest
(:func:`commflow.synth.synthesize_for`: pieces per share, and for programs with one stream
per edge channels by tree depth or streams cut into threadblocks), simulated with the flow
model on that target (bounded connection buffers, the kernel's loops of 2 MiB chunks for
Simple). ``order`` ``xbox``: a reduce-scatter whose partials bound for another box go first
(:func:`commflow.synth.cross_box.cross_box_first`). ``fused``: about how many pieces would
fit the target's XML elements with every receive fused with the send of what it wrote
(:func:`commflow.ir.msccl_fit.fused_pieces`; ``-`` where that is no limit; for a merged
program, pieces merged alike). ``merge``: head:group of a program whose trees' chunks travel
several to a message (:func:`commflow.synth.merge.merged`; ``1,1,2,2:3``: messages of 1, 1,
2 and 2 chunks at either end of a tree's, 3 between; ``2:3``: two single chunks).
``packed``: pairs of threadblocks joined (:func:`commflow.ir.pack.pack_channels`).
``rings``: a ring packing won (:mod:`commflow.synth.rings`), as rings x chunks per ring (no
pieces).

    .venv/bin/python benchmarks/export_targets.py dgx1 dgx-a100x2 mi250x2
"""

from __future__ import annotations

import sys
import time

from commflow.errors import CommflowError
from commflow.ir.msccl import chunks_per_loop
from commflow.ir.msccl_fit import fused_pieces
from commflow.ir.target import get_target
from commflow.sim import simulate
from commflow.synth import remembered, synthesize, synthesize_for
from commflow.topology import Topology, load

SIZE = 1 << 30
COLLECTIVES = ("allgather", "reducescatter", "allreduce")
TARGETS = ("msccl", "msccl-executor", "rccl")
ORDERS = {"cross-box first": "xbox"}
"""Short names of the ``order`` a program's steps were given (``-``: as synthesized)."""


def main(presets: list[str]) -> None:
    print(f"{'preset':<12}{'collective':<15}{'target':<16}{'rings':>6}{'pieces':>7}{'levels':>7}"
          f"{'merge':>12}{'split':>6}{'packed':>7}"
          f"{'order':>7}{'steps':>8}"
          f"{'chunks/loop':>12}{'GB/s':>9}{'default':>9}{'loss%':>8}{'fused':>7}{'secs':>7}")
    for name in presets:
        topo = load(name)
        for collective in COLLECTIVES:
            default = simulate(synthesize(collective, topo), topo, SIZE, model="flow").algbw
            with remembered():  # the targets' searches share their candidates
                rows(name, topo, collective, default)


def rows(name: str, topo: Topology, collective: str, default: float) -> None:
    """Print the row of each target for one preset and collective."""
    for target in TARGETS:
        start = time.perf_counter()
        try:
            program, _ = synthesize_for(collective, topo, target)
        except CommflowError as error:
            print(f"{name:<12}{collective:<15}{target:<16} refused: {error}")
            continue
        algbw = simulate(program, topo, SIZE, model="flow", target=target).algbw
        params = dict(program.params)
        ringed = params.get("packing") == "cycles"
        rings = f"{params['rings']}x{params['chunks']}" if ringed else "-"
        fused = None if ringed else fused_pieces(program, get_target(target),
                                                 int(params.get("pieces", 1)))
        fused = "-" if fused is None else fused
        print(f"{name:<12}{collective:<15}{target:<16}{rings!s:>6}"
              f"{params.get('pieces', '-')!s:>7}"
              f"{params.get('levels', '-')!s:>7}{params.get('merge', '-')!s:>12}"
              f"{params.get('split', '-')!s:>6}{params.get('packed', '-')!s:>7}"
              f"{ORDERS.get(params.get('order'), '-'):>7}{program.nsteps:>8}"
              f"{chunks_per_loop(program):>12}{algbw / 1e9:>9.2f}{default / 1e9:>9.2f}"
              f"{100 * (1 - algbw / default):>8.2f}{fused!s:>7}"
              f"{time.perf_counter() - start:>7.1f}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["dgx1", "dgx-a100x2", "mi250x2"])
