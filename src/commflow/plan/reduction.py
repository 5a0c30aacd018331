"""The data-parallel side of a stage's step: the gradient reduction left after its last
backward pass (scheduled by :mod:`commflow.sched`), ZeRO-1/2's all-gather of the updated
parameters, and Chimera's reduction over both pipelines' replicas of a stage."""

from __future__ import annotations

from commflow.plan.comm import ClusterLinks, collective_line, collective_time, group_shape
from commflow.plan.parallel import Plan
from commflow.plan.stagetime import WIRE_BYTES


def zero_gather(plan: Plan, grads: float, links: ClusterLinks) -> float:
    """Seconds of ZeRO-1/2's all-gather of the updated parameters over the DP group."""
    if plan.zero in (1, 2):
        return collective_time("allgather", grads, plan.dp, plan.tp * plan.cp, links)
    return 0.0


def exposed_gather(plan: Plan, grads: float, links: ClusterLinks, forward: float) -> float:
    """Seconds of ZeRO-1/2's parameter all-gather left after ``forward`` seconds of the next
    step's first forward pass (all of it without ``plan.overlap``)."""
    gather = zero_gather(plan, grads, links)
    return max(0.0, gather - forward) if plan.overlap else gather


def replica_collective(kind: str, size: float, plan: Plan, links: ClusterLinks) -> float:
    """Seconds of the gradient reduction ``kind`` of ``size`` bytes over a stage's replicas:
    the ``dp`` ranks of its data-parallel group, and for Chimera also the ``dp`` ranks that
    hold the same stage in the other pipeline (``2·dp``; counted in other boxes when a
    stage's ``tp·cp·dp`` ranks fill a box, else in the same box)."""
    stride = plan.tp * plan.cp
    if plan.schedule != "chimera":
        return collective_time(kind, size, plan.dp, stride, links)
    per_box, boxes = group_shape(plan.dp, stride, links.gpus_per_box)
    if stride * plan.dp >= links.gpus_per_box:
        boxes *= 2
    else:
        per_box *= 2
    return collective_line(kind, per_box, boxes, links).time(size)


def exposed_dp(plan: Plan, grads: float, links: ClusterLinks, window: float, forward: float,
               layers: float) -> float:
    """Seconds a stage's data-parallel gradient reduction adds after its last backward pass.

    The reduction (allreduce; reduce-scatter under ZeRO) of the last backward pass's
    gradients, layer by layer as backward produces them (``window`` seconds for the stage's
    ``layers`` layers, evenly), is scheduled by ``plan.dp_sched``
    (:func:`commflow.sched.drain`, with the message cost fitted to the simulated collective
    at one layer's and at all the stage's gradient bytes); without ``plan.overlap`` it all
    follows backward. ZeRO-1/2's all-gather of the updated parameters follows the optimizer
    step; with ``plan.overlap`` it hides behind the next step's first forward pass
    (``forward`` seconds), bucket by bucket, as Megatron-Core's ``overlap_param_gather``
    does. ``plan.dp_codec`` scales the gradient bytes on the wire
    (:func:`commflow.compress.wire_fraction`), not the parameters' all-gather.
    """
    from commflow.compress import wire_fraction
    from commflow.sched import Workload, drain, fitted_cost

    gather = exposed_gather(plan, grads, links, forward)
    grads *= wire_fraction(plan.dp_codec, WIRE_BYTES)
    kind = "allreduce" if plan.zero == 0 else "reducescatter"
    reduce = replica_collective(kind, grads, plan, links)
    layers = int(layers // plan.vp) * plan.vp
    if not plan.overlap or reduce <= 0 or layers <= 1:  # one layer: ready when backward ends
        return reduce + gather
    piece = grads / layers
    cost = fitted_cost({piece: replica_collective(kind, piece, plan, links),
                        grads: reduce}, name=f"{kind} over dp={plan.dp}")
    backward = Workload.from_lists("stage", [0.0] * layers, [window / layers] * layers,
                                   [piece] * layers)
    return drain(backward, plan.dp_sched, cost) + gather
