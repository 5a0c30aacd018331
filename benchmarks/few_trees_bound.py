"""How close to the optimal tree packing the busiest link can stay when each root's data
travels on at most ``T`` trees: MSCCL's file (4,096 elements for all 32 ranks of MI250 x2)
has room for very few trees per root.

The optimal fractional packing (:func:`commflow.synth.trees.pack_trees`, column generation)
needs 2-8 trees per root on MI250 x2. A MILP (scipy HiGHS) over every tree the column
generation produced chooses at most ``T`` per root, with any weights summing to 1 per root,
to load the busiest link least; printed: that load over the optimum's (the best found within
the time limit) and HiGHS's lower bound on it (1.000 when not closed).

    .venv/bin/python benchmarks/few_trees_bound.py mi250x2 allgather 1,2,3 300
"""

from __future__ import annotations

import sys
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from commflow.synth.links import logical_edges
from commflow.synth.trees import pack_trees, tree_loads
from commflow.topology import load


def few_trees(loads: np.ndarray, group: np.ndarray, most: int,
              seconds: float) -> tuple[float, float]:
    """``(best busiest load found, lower bound)`` with at most ``most`` columns per group
    (loads in units of the optimum's busiest link)."""
    links, n = loads.shape
    groups = int(group.max()) + 1
    member = np.zeros((groups, n))
    member[group, np.arange(n)] = 1
    zero_l, zero_g = np.zeros((links, n)), np.zeros((groups, n))
    # variables: weights y (n), chosen z (n, binary), busiest load s
    constraints = [
        LinearConstraint(np.hstack([loads, zero_l, -np.ones((links, 1))]), -np.inf, 0),
        LinearConstraint(np.hstack([member, zero_g, np.zeros((groups, 1))]), 1, 1),
        LinearConstraint(np.hstack([zero_g, member, np.zeros((groups, 1))]), 0, most),
        LinearConstraint(np.hstack([np.eye(n), -np.eye(n), np.zeros((n, 1))]), -np.inf, 0),
    ]
    res = milp(np.r_[np.zeros(2 * n), 1.0], constraints=constraints,
               integrality=np.r_[np.zeros(n), np.ones(n), 0],
               bounds=Bounds(0, np.r_[np.ones(2 * n), np.inf]),
               options={"time_limit": seconds})
    return float(res.fun), float(res.mip_dual_bound)


def main(preset: str, collective: str, counts: list[int], seconds: float) -> None:
    edges = logical_edges(load(preset))
    edges = edges.reversed() if collective == "reducescatter" else edges
    packing = pack_trees(edges)
    trees = packing.candidates
    loads = tree_loads(edges, trees)
    loads = loads[loads.any(axis=1)] / packing.seconds_per_byte
    roots = sorted({t.root for t in trees})
    group = np.searchsorted(roots, [t.root for t in trees])
    used = np.bincount(np.searchsorted(roots, [t.root for t in packing.trees]))
    print(f"# {preset} {collective}: {len(trees)} trees from column generation, the optimum "
          f"uses {used.min()}-{used.max()} per root; {seconds:g} s per row")
    print(f"{'trees/root':>10}{'busiest':>9}{'bound':>8}{'secs':>7}")
    for most in counts:
        start = time.perf_counter()
        best, bound = few_trees(loads, group, most, seconds)
        print(f"{most:>10}{best:>9.3f}{bound:>8.3f}{time.perf_counter() - start:>7.0f}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")],
         float(sys.argv[4]) if len(sys.argv) > 4 else 300.0)
