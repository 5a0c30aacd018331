"""Offline goal of issue 16: tune's choice against the NCCL-like baselines (``multi_ring``,
``double_binary_tree``) on DGX A100 x4 and DGX H100 x8, 1 KiB - 4 GiB, and synthesis's gain.

Run: ``.venv/bin/python benchmarks/tune_offline.py [--synth] [--collectives allreduce,...]
[topology ...]`` (default dgx-a100x4 dgx-h100x8). Per (topology, collective, size): the
program ``commflow.tune.rank`` puts first among the registered algorithms (with ``--synth``
also the bandwidth synthesis at 1, 4, 16 and 64 pieces per share), its simulated time
(alphabeta model), the fastest NCCL-like baseline's and the gain (baseline / chosen). One
markdown row each.
"""

from __future__ import annotations

import argparse

from commflow.synth import synthesize
from commflow.topology import load
from commflow.tune import Candidate, rank, registered
from commflow.units import format_size, size_range

BASELINES = ("multi_ring", "double_binary_tree")
SIZES = size_range(1 << 10, 4 << 30, 4)


def main() -> None:
    """Print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("topologies", nargs="*", default=["dgx-a100x4", "dgx-h100x8"])
    parser.add_argument("--collectives", default="allreduce,allgather,reducescatter")
    parser.add_argument("--synth", action="store_true")
    args = parser.parse_args()
    print("| topology | collective | size | tune's choice | time (us) | NCCL-like best | "
          "time (us) | gain |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.topologies:
        topo = load(name)
        for collective in args.collectives.split(","):
            found = registered(collective, topo)
            if args.synth:
                found += [Candidate(f"synth/{p}", synthesize(collective, topo, pieces=p))
                          for p in (1, 4, 16, 64)]
            for size in SIZES:
                ranked = rank(found, topo, size)
                base = [r for r in ranked if r.method in BASELINES][0]
                print(f"| {name} | {collective} | {format_size(size)} | {ranked[0].method} | "
                      f"{ranked[0].seconds * 1e6:.1f} | {base.method} | "
                      f"{base.seconds * 1e6:.1f} | {base.seconds / ranked[0].seconds:.2f}x |",
                      flush=True)


if __name__ == "__main__":
    main()
