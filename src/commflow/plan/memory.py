"""Memory per GPU of a plan: weights, gradients and optimizer state per ZeRO stage,
activations per recompute mode and schedule (Korthikanti et al. 2022), temporary buffers."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from commflow.plan.compute import activation_bytes
from commflow.plan.hardware import GIB, PRECISION_BYTES
from commflow.plan.models import TransformerSpec
from commflow.plan.parallel import Plan

STATE_PARTS = (2, 2, 12)
"""Mixed-precision Adam bytes per parameter: weights, gradients, fp32 master and moments;
ZeRO-1 shards the last over the data-parallel group, ZeRO-2 also the gradients, ZeRO-3 all."""

WORKSPACE_BYTES = 2 * GIB
"""CUDA context, allocator fragmentation and library workspaces, bytes (modelling choice)."""


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU of the most loaded stage (the first)."""

    weights: float
    """Training-precision weights (sharded by ZeRO-3)."""
    gradients: float
    """Gradients (sharded by ZeRO-2 and 3)."""
    optimizer: float
    """fp32 master weights and Adam moments (sharded by ZeRO-1, 2 and 3)."""
    activations: float
    """Activations of the micro-batches in flight."""
    buffers: float
    """Workspace, logits, and ZeRO-3 gathered layers."""

    @property
    def states(self) -> float:
        """Weights, gradients and optimizer state after ZeRO sharding."""
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        """All bytes."""
        return self.states + self.activations + self.buffers

    def to_dict(self) -> dict[str, float]:
        """Parts and total in GiB."""
        return {k: v / GIB for k, v in {**asdict(self), "total": self.total}.items()}


def stage_params(model: TransformerSpec, plan: Plan, *, layers: float | None = None) -> float:
    """Parameters held by one GPU of the first stage (its ``layers``, by default
    ``model.layers / plan.pp``, and the embedding); TP splits everything, EP splits the
    experts. Chimera's ranks hold two stages' layers (stage ``s`` of the down pipeline and
    ``p - 1 - s`` of the up one: Li & Hoefler's ``2M_θ``); its first rank's two stages carry
    the input and the output embedding."""
    experts = model.expert_params / model.layers
    per_layer = model.layer_params - experts + experts / plan.ep
    copies = 2 if plan.schedule == "chimera" else 1
    count = model.layers / plan.pp if layers is None else layers
    return (copies * count * per_layer + model.embedding_params) / plan.tp


def in_flight(plan: Plan) -> float:
    """Micro-batches whose activations the first stage holds at its peak, in units of one
    micro-batch through all its layers: GPipe ``m``, 1F1B, ZB-H1 and Chimera ``min(p, m)``
    (Chimera's most loaded rank: ``D·M_a`` of Li & Hoefler's Table 2), ZB-H2 ``min(2p-1, m)``
    (Qi et al.'s ``(2p-1)M_B``), interleaved ``p·(1 + (p-1)/(p·v))`` (Korthikanti et al.)."""
    p, m = plan.pp, plan.microbatches
    if plan.schedule == "gpipe":
        return m
    if plan.schedule == "zb-h2":
        return min(2 * p - 1, m)
    if plan.schedule == "interleaved":
        return min(p * (1 + (p - 1) / (p * plan.vp)), m)
    return min(p, m)


def memory_per_gpu(model: TransformerSpec, plan: Plan, *, layers: float | None = None) -> Memory:
    """Peak bytes on a first-stage GPU holding ``layers`` layers (by default
    ``model.layers / plan.pp``; an uneven partition gives each stage its own count, the
    embedding and the first stage's micro-batches in flight counted on every stage).
    Activation bytes per layer follow Korthikanti et al.:
    ``sbh/t·(34 + 5as/h)`` with SP, ``sbh·(10 + 24/t + 5as/(ht))`` without, selective
    recompute drops the ``5as/h`` term, full recompute keeps ``2sbh`` per layer plus one
    layer's full activations."""
    params = stage_params(model, plan, layers=layers)
    weights, gradients, optimizer = (
        params * size / (plan.dp if plan.zero >= stage else 1)
        for size, stage in zip(STATE_PARTS, (3, 2, 1), strict=True)
    )
    linear, scores = activation_bytes(model, plan)
    scale = PRECISION_BYTES[plan.precision] / 2
    layers = model.layers / plan.pp if layers is None else layers
    full_layer = (linear + scores) * scale
    if plan.recompute == "full":
        sbh = model.seq / plan.cp * plan.mb * model.hidden
        per_layer = 2 * sbh * scale / (plan.tp if plan.sp else 1)
        activations = per_layer * layers * in_flight(plan) + full_layer
    else:
        per_layer = linear * scale if plan.recompute == "selective" else full_layer
        activations = per_layer * layers * in_flight(plan)
    logits = 4 * plan.mb * model.seq / plan.cp * model.vocab / plan.tp
    gathered = 2 * model.layer_params / plan.tp if plan.zero == 3 else 0.0
    return Memory(weights, gradients, optimizer, activations, WORKSPACE_BYTES + logits + gathered)
