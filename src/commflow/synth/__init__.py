"""Synthesis of topology-aware collective programs.

- :func:`synthesize`: the front door.
- :mod:`~commflow.synth.links`: logical rank-to-rank edges (switches split off).
- :mod:`~commflow.synth.trees`: throughput-optimal spanning-tree packing (Blink, ForestColl).
- :mod:`~commflow.synth.lower`: packings to programs.
- :mod:`~commflow.synth.alltoall_lp`: alltoall by a multi-commodity flow LP.
- :mod:`~commflow.synth.steps`: SCCL (steps, rounds, chunks) MILP and :func:`pareto`.
"""

from commflow.synth.alltoall_lp import AlltoallFlow, Route, alltoall_flow, alltoall_program
from commflow.synth.api import ALLTOALL_CHUNKS, DEFAULT_PIECES, OBJECTIVES, synthesize
from commflow.synth.links import LogicalEdges, logical_edges
from commflow.synth.lower import lower
from commflow.synth.rounding import apportion
from commflow.synth.steps import StepSchedule, pareto, schedule_program, solve_instance
from commflow.synth.trees import TreePacking, WeightedTree, integral_shares, pack_trees

__all__ = [
    "StepSchedule",
    "pareto",
    "schedule_program",
    "solve_instance",
    "ALLTOALL_CHUNKS",
    "AlltoallFlow",
    "Route",
    "alltoall_flow",
    "alltoall_program",
    "DEFAULT_PIECES",
    "OBJECTIVES",
    "LogicalEdges",
    "TreePacking",
    "WeightedTree",
    "apportion",
    "integral_shares",
    "logical_edges",
    "lower",
    "pack_trees",
    "synthesize",
]
