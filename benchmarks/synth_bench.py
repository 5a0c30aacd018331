"""Synthesis benchmark: synthesis time and simulated algbw against the lower bound, the
NVLink-following ring, the double binary tree and NCCL-like rings (one per NIC rail,
``multi_ring``).

Run: ``.venv/bin/python benchmarks/synth_bench.py [--model flow|alphabeta] [--size 1G]
[--max-sim-steps N] [--collectives allgather,...] [topology ...]`` (topology names as
``commflow topo list`` spells them; default: every topology of issue 5's goals). Prints one
markdown row per (topology, collective); programs with more than ``--max-sim-steps`` steps
are synthesized and timed but not simulated ("-").
"""

from __future__ import annotations

import argparse
import time

from commflow.algorithms import build_for
from commflow.errors import CommflowError
from commflow.sim import lower_bound, simulate
from commflow.synth import MOST_STEPS, synthesize
from commflow.topology import load
from commflow.units import parse_size

GOALS = (
    "dgx1",
    "dgx-a100",
    "mi250",
    "ndv2x2",
    "fat-tree4",
    "torus4x4",
    "dgx-h100x2",
    "dgx-a100x2",
    "ndv2x4",
    "dgx2x2",
    "dgx-a100x4",
    "mi250x2",
    "mi250x4",
)
"""Topologies of issue 5's goals, small first."""
COLLECTIVES = ("allgather", "reducescatter", "allreduce")


def _algbw(program, topo, size: float, model: str) -> float:
    return simulate(program, topo, size, model=model).algbw / 1e9


def _baseline(collective: str, name: str, topo, size: float, model: str) -> str:
    try:
        return f"{_algbw(build_for(collective, name, topo), topo, size, model):.1f}"
    except CommflowError:
        return "n/a"


def _row(name: str, collective: str, args: argparse.Namespace) -> str:
    topo = load(name)
    start = time.perf_counter()
    program = synthesize(collective, topo)
    elapsed = time.perf_counter() - start
    bound = lower_bound(collective, topo, args.size).algbw / 1e9
    params = dict(program.params)
    shape = f"{params['units']} x {params['pieces']}"
    if params.get("lowering") == "streams":
        shape += " streams"
    steps = len(program.table)
    if steps > args.max_sim_steps:
        got = ratio = ring = tree = rings = gain = "-"
    else:
        algbw = _algbw(program, topo, args.size, args.model)
        got, ratio = f"{algbw:.1f}", f"{100 * algbw / bound:.2f}"
        ring = _baseline(collective, "ring", topo, args.size, args.model)
        tree = _baseline(collective, "double_binary_tree", topo, args.size, args.model)
        rings = _baseline(collective, "multi_ring", topo, args.size, args.model)
        gain = "n/a" if rings == "n/a" else f"{algbw / float(rings):.2f}x"
    return (
        f"| {name} | {topo.nranks} | {collective} | {elapsed:.2f} | {shape} | {steps} "
        f"| {bound:.1f} | {got} | {ratio} | {ring} | {tree} | {rings} | {gain} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("topologies", nargs="*", default=list(GOALS))
    parser.add_argument("--model", default="flow", choices=("flow", "alphabeta"))
    parser.add_argument("--size", default="1G", type=parse_size, help="bytes, e.g. 1G")
    parser.add_argument("--max-sim-steps", default=MOST_STEPS, type=int)
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    args = parser.parse_args()
    print(f"model={args.model} size={args.size:.0f} bytes")
    print(
        "| topology | ranks | collective | synth time (s) | units x pieces | steps "
        "| bound GB/s | synth GB/s | % of bound | ring GB/s | tree GB/s | multi_ring GB/s "
        "| synth / multi_ring |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.topologies:
        for collective in args.collectives.split(","):
            print(_row(name, collective, args), flush=True)


if __name__ == "__main__":
    main()
