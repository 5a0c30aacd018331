"""Ring vs double binary tree allreduce on a DGX-1: verify, simulate, compare with the bound.

Run: python examples/sim_dgx1.py
"""

from __future__ import annotations

import commflow

SIZES = [64 << 10, 1 << 20, 16 << 20, 256 << 20]


def main() -> None:
    topo = commflow.load_topology("dgx1")
    for algo in ("ring", "double_binary_tree"):
        program = commflow.build("allreduce", algo, topo.nranks, chunks=4)
        commflow.verify(program)
        print(f"{algo}: {program.nsteps} steps, verified")
        for size in SIZES:
            result = commflow.simulate(program, topo, size)
            bound = commflow.lower_bound("allreduce", topo, size)
            print(
                f"  {size:>10} B  time {result.time * 1e6:10.2f} us  "
                f"busbw {result.busbw / 1e9:7.2f} GB/s  "
                f"bound {bound.time * 1e6:10.2f} us ({bound.time / result.time:6.1%})"
            )
    bound = commflow.lower_bound("allreduce", topo, SIZES[-1])
    cut = ", ".join(topo.nodes[i].name for i in bound.cut)
    print(f"binding cut: {{{cut}}} at {bound.cut_bandwidth / 1e9:.2f} GB/s ({bound.binding})")


if __name__ == "__main__":
    main()
