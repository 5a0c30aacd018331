"""Synthesis of topology-aware collective programs.

- :func:`synthesize`: the front door.
- :mod:`~commflow.synth.links`: logical rank-to-rank edges (switches split off).
- :mod:`~commflow.synth.forest`: exact integer tree packings (ForestColl): ``k`` trees per
  root at the cut bound (:mod:`~commflow.synth.flow_kernels`: its incremental max-flows);
  :mod:`~commflow.synth.boxes`: the same for clusters of alike boxes, composed from one box's.
- :mod:`~commflow.synth.trees`: fractional spanning-tree packing by column generation
  (Blink), rounded to whole shares: the fallback.
- :mod:`~commflow.synth.lower`: packings to programs, every share on channels of its own;
  :mod:`~commflow.synth.streams`: one stream per edge (edges with links of their own),
  replaying the list schedule of :mod:`~commflow.synth.stream_schedule`, its messages
  merged by :mod:`~commflow.synth.merge`.
- :mod:`~commflow.synth.alltoall_lp`: alltoall by a multi-commodity flow LP.
- :mod:`~commflow.synth.steps`: SCCL (steps, rounds, chunks) MILP and :func:`pareto`.
- :mod:`~commflow.synth.show`: a program's link loads drawn on its topology.
- :mod:`~commflow.synth.for_target`: the fastest program a runtime (MSCCL, RCCL) loads.
- :func:`remembered`: a block within which :func:`synthesize` makes each program once.
"""

from commflow.synth.alltoall_lp import AlltoallFlow, Route, alltoall_flow, alltoall_program
from commflow.synth.api import (
    ALLTOALL_CHUNKS,
    MAX_STEPS,
    MOST_STEPS,
    OBJECTIVES,
    PIECES_PER_LEVEL,
    STREAM_PIECES,
    step_budget,
    synthesize,
)
from commflow.synth.bound_check import BoundWarning, check_trees
from commflow.synth.boxes import by_box
from commflow.synth.for_target import (
    LEVELS,
    PIECES_TRIED,
    lowered_shape,
    lowering_loss,
    synthesize_for,
)
from commflow.synth.forest import Forest, forest, mirror
from commflow.synth.links import LogicalEdges, logical_edges
from commflow.synth.lower import lower
from commflow.synth.remember import remembered
from commflow.synth.rounding import apportion
from commflow.synth.show import SchedulePicture, draw_schedule, schedule_picture
from commflow.synth.steps import StepSchedule, pareto, schedule_program, solve_instance
from commflow.synth.streams import lower_streams
from commflow.synth.trees import (
    TreePacking,
    WeightedTree,
    balanced_shares,
    integral_shares,
    pack_trees,
)

__all__ = [
    "BoundWarning",
    "check_trees",
    "Forest",
    "by_box",
    "forest",
    "mirror",
    "StepSchedule",
    "SchedulePicture",
    "draw_schedule",
    "schedule_picture",
    "pareto",
    "schedule_program",
    "solve_instance",
    "ALLTOALL_CHUNKS",
    "AlltoallFlow",
    "Route",
    "alltoall_flow",
    "alltoall_program",
    "MAX_STEPS",
    "MOST_STEPS",
    "step_budget",
    "PIECES_PER_LEVEL",
    "LEVELS",
    "PIECES_TRIED",
    "STREAM_PIECES",
    "OBJECTIVES",
    "LogicalEdges",
    "TreePacking",
    "WeightedTree",
    "apportion",
    "balanced_shares",
    "integral_shares",
    "logical_edges",
    "lower",
    "lower_streams",
    "lowered_shape",
    "lowering_loss",
    "pack_trees",
    "remembered",
    "synthesize",
    "synthesize_for",
]
