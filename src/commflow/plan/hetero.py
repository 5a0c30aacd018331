"""Heterogeneous clusters: the accelerator and links of each pipeline stage, and stages sized
to their devices.

Ranks are ordered TP fastest, then CP, DP, PP, so stage ``s`` holds ranks ``[s·n, (s+1)·n)``
with ``n = tp·cp·dp``, and every TP, CP, EP and DP group lies inside one stage: a stage's
collectives run on its own boxes' links (the slowest of them, which is the slowest link on any
path between its ranks), and a pipeline send between two stages on the slower network of the
two boxes it leaves and enters. Uneven partitions follow HetPipe (Park et al., USENIX ATC
2020) and AMP (Li et al., NeurIPS 2022): each stage gets layers in proportion to its speed,
within its memory (:func:`partition_layers`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, replace

from commflow.errors import CommflowError
from commflow.plan.comm import BoxLinks, ClusterLinks
from commflow.plan.hardware import Accelerator, get_accelerator
from commflow.plan.parallel import Plan


@dataclass(frozen=True)
class StageDevice:
    """What one pipeline stage runs on."""

    accelerator: Accelerator
    """Its GPUs (the slowest in ``plan.precision`` when its boxes differ)."""
    links: ClusterLinks
    """Its boxes' links: the slowest intra-box and network bandwidth among them."""


def _summary(links: ClusterLinks, blocks: Sequence[BoxLinks]) -> ClusterLinks:
    return replace(links, intra_bandwidth=min(b.intra_bandwidth for b in blocks),
                   network_bandwidth=min(b.network_bandwidth for b in blocks), boxes=())


def _blocks(links: ClusterLinks, plan: Plan, first: int, last: int) -> tuple[BoxLinks, ...]:
    """The boxes of stages ``first`` to ``last`` (inclusive)."""
    n, g = plan.gpus // plan.pp, links.gpus_per_box
    return links.boxes[first * n // g: ((last + 1) * n - 1) // g + 1]


def stage_devices(links: ClusterLinks, plan: Plan, default: Accelerator) -> tuple[StageDevice, ...]:
    """Per pipeline stage, its accelerator (a box's ``accelerator`` label, ``default`` where
    the topology gives none) and links. Raises ``CommflowError`` for an unknown accelerator
    name or one without ``plan.precision``. Chimera runs stage ``s`` on ranks ``s`` and
    ``p - 1 - s`` (one per pipeline), so each of its stages gets the slower of the two."""
    if not links.heterogeneous:
        return (StageDevice(default, links),) * plan.pp
    devices, alike = [], {}  # stages on alike boxes share one StageDevice
    for s in range(plan.pp):
        blocks = _blocks(links, plan, s, s)
        if plan.schedule == "chimera":
            blocks += _blocks(links, plan, plan.pp - 1 - s, plan.pp - 1 - s)
        key = frozenset(blocks)
        if key not in alike:
            gpus = [get_accelerator(b.accelerator) if b.accelerator else default for b in key]
            gpu = min(gpus, key=lambda a: a.peak(plan.precision))
            alike[key] = StageDevice(gpu, _summary(links, blocks))
        devices.append(alike[key])
    return tuple(devices)


def boundary_links(links: ClusterLinks, plan: Plan) -> tuple[ClusterLinks, ...]:
    """Per boundary between stages ``s`` and ``s + 1``, the links a pipeline send crosses:
    the slower of the two stages' boxes."""
    if not links.heterogeneous:
        return (links,) * (plan.pp - 1)
    return tuple(_summary(links, _blocks(links, plan, s, s + 1)) for s in range(plan.pp - 1))


def partition_layers(total: int, per_layer: Sequence[float], fixed: Sequence[float],
                     capacity: Sequence[int]) -> tuple[int, ...]:
    """Layers per stage that minimize the slowest stage's time ``n_s·per_layer[s] +
    fixed[s]``, each stage holding at least one layer and at most ``capacity[s]`` (what fits
    in its memory). Each layer after the first per stage goes to the stage whose time after
    taking it is smallest, which is optimal for a min-max of per-stage times that grow with
    their layer count. Raises ``CommflowError`` when the stages cannot hold ``total`` layers."""
    p = len(per_layer)
    room = [min(c, total) for c in capacity]
    if total < p or min(room) < 1 or sum(room) < total:
        raise CommflowError(
            f"cannot split {total} layers over {p} stages holding at most {list(capacity)} "
            "layers each (memory): use fewer stages, more ZeRO or recompute, or more GPUs")
    counts = [1] * p
    heap = [((2 * per_layer[s] + fixed[s]), s) for s in range(p) if room[s] > 1]
    heapq.heapify(heap)
    for _ in range(total - p):
        _, s = heapq.heappop(heap)
        counts[s] += 1
        if counts[s] < room[s]:
            heapq.heappush(heap, ((counts[s] + 1) * per_layer[s] + fixed[s], s))
    return tuple(counts)
