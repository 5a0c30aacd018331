"""Seconds of one micro-batch on one pipeline stage: its layers' compute (for one model chunk)
plus the exposed TP/SP, CP, EP and ZeRO-3 collectives (:mod:`commflow.plan.comm`, simulated)
on the stage's own accelerator and links."""

from __future__ import annotations

from dataclasses import dataclass

from commflow.plan.comm import ClusterLinks, collective_time
from commflow.plan.compute import Calibration, layer_times
from commflow.plan.hardware import Accelerator
from commflow.plan.models import TransformerSpec
from commflow.plan.parallel import Plan

WIRE_BYTES = 2
"""Bytes per element of what travels between GPUs (activations, gradients, gathered weights):
16-bit in every precision, fp8 included (fp8 only feeds the GEMMs, as in Transformer
Engine)."""


@dataclass(frozen=True)
class PerMicrobatch:
    """Seconds per micro-batch on one stage, per model chunk (all chunks alike)."""

    forward: float
    backward: float
    weight: float
    parts: dict[str, float]  # exposed tp/cp/ep/zero3 seconds per micro-batch, all chunks
    op_comm: dict[str, tuple[float, float]]  # the same per forward / backward op of a chunk


def per_microbatch(
    model: TransformerSpec, plan: Plan, gpu: Accelerator, links: ClusterLinks, cal: Calibration,
    *, layers: float | None = None,
) -> PerMicrobatch:
    """Op seconds of one model chunk of ``layers`` layers (by default ``model.layers / (pp ·
    vp)``) for one micro-batch on ``gpu`` with ``links``."""
    lt = layer_times(model, plan, gpu, cal)
    width = WIRE_BYTES
    act = plan.mb * model.seq / plan.cp * model.hidden * width
    if plan.sp:
        tp = 2 * (
            collective_time("allgather", act, plan.tp, 1, links)
            + collective_time("reducescatter", act, plan.tp, 1, links)
        )
    else:
        tp = 2 * collective_time("allreduce", act, plan.tp, 1, links)
    kv = plan.mb * model.seq * model.kv_width * width
    cp = collective_time("allgather", kv / plan.tp, plan.cp, plan.tp, links)
    ep = 0.0
    if model.experts > 1:
        share = model.moe_layers / model.layers  # per layer, averaged over dense layers
        ep = share * 2 * collective_time(
            "alltoall", act * model.top_k / plan.tp, plan.ep, plan.tp * plan.cp, links
        )
    if layers is None:
        layers = model.layers / (plan.pp * plan.vp)
    passes = 3 if plan.recompute == "full" else 2  # forward, backward, recomputed forward
    gather = 0.0
    if plan.zero == 3:  # each pass gathers the stage's parameters: allgather of their bytes
        stage_bytes = layers * model.layer_params / plan.tp * width
        gather = collective_time("allgather", stage_bytes, plan.dp, plan.tp * plan.cp, links)
    fwd_compute = layers * lt.forward
    bwd_compute = layers * (lt.backward_input + lt.recompute)
    fwd_gather = max(0.0, gather - fwd_compute) if plan.overlap else gather
    bwd_gather = max(0.0, gather - bwd_compute) if plan.overlap else gather
    tp_fwd, tp_bwd = exposed_tp(tp, plan, lt.forward, lt.backward_input + lt.recompute)
    forward = fwd_compute + layers * (tp_fwd + cp + ep) + fwd_gather
    backward = bwd_compute + layers * (tp_bwd + (cp + ep) * (passes - 1)) + bwd_gather
    parts = {name: plan.vp * layers * passes * t for name, t in (("cp", cp), ("ep", ep))}
    parts = {"tp": plan.vp * layers * (tp_fwd + tp_bwd), **parts}
    parts["zero3_gather"] = plan.vp * (fwd_gather + bwd_gather)
    op_comm = {
        name: (layers * t, layers * t * (passes - 1)) for name, t in (("tp", tp), ("cp", cp),
                                                                    ("ep", ep))
    }
    op_comm["zero3_gather"] = (fwd_gather, bwd_gather)
    return PerMicrobatch(forward, backward, layers * lt.backward_weight, parts, op_comm)


def exposed_tp(tp: float, plan: Plan, forward: float, backward: float) -> tuple[float, float]:
    """Exposed TP/SP seconds per layer in the forward pass and in the backward passes (with
    recompute's extra forward), ``tp`` being one pass's collectives.

    ``pipelined``: each collective is cut into ``plan.tp`` steps, each overlapped with the
    GEMM slice that uses (or produces) the previous one, so a pass exposes its first step
    (``tp / plan.tp``) and whatever communication outlasts the pass's compute.
    """
    passes = 3 if plan.recompute == "full" else 2
    if plan.tp_overlap == "none" or tp <= 0:
        return tp, tp * (passes - 1)
    first = tp / plan.tp
    fwd = max(first, tp - forward)
    bwd = max(first * (passes - 1), tp * (passes - 1) - backward)
    return fwd, bwd
