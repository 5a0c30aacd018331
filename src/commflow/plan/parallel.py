"""A parallel training plan: how ranks are split (TP, PP, DP, CP, EP), batch, ZeRO stage,
recompute, pipeline schedule, overlap and precision; parsing and validation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from commflow.errors import CommflowError
from commflow.plan.hardware import PRECISION_BYTES
from commflow.plan.models import TransformerSpec

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "chimera")
TP_OVERLAPS = ("none", "pipelined")
DP_CODECS = ("none", "fp16", "bf16", "int8", "int4")
PARTITIONS = ("even", "balanced")
DP_SCHEDULES = ("ddp", "fifo", "horovod", "priority", "p3", "bytescheduler", "pace")
"""Policies of :mod:`commflow.sched` that finish the gradient reduction before the optimizer
step (the ones :func:`commflow.sched.drain` takes)."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How one training step is parallelized. Raises ``CommflowError`` for bad fields."""

    tp: int = 1
    """Tensor-parallel ranks (inside a box)."""
    pp: int = 1
    """Pipeline stages."""
    dp: int = 1
    """Data-parallel replicas."""
    cp: int = 1
    """Context-parallel ranks (sequence split for attention)."""
    ep: int = 1
    """Expert-parallel ranks (MoE; carved out of ``dp``)."""
    sp: bool = False
    """Sequence parallelism on top of TP (allgather/reduce-scatter instead of allreduce)."""
    mb: int = 1
    """Micro-batch size, sequences."""
    global_batch: int = 1
    """Global batch, sequences per step."""
    vp: int = 1
    """Virtual stages (model chunks) per pipeline stage; > 1 means interleaved 1F1B."""
    zero: int = 0
    """ZeRO stage 0-3 (3 is FSDP)."""
    recompute: str = "none"
    """Activation recompute: ``none``, ``selective`` or ``full``."""
    schedule: str = "1f1b"
    """Pipeline schedule: ``gpipe``, ``1f1b``, ``interleaved``, ``zb-h1``, ``zb-h2`` or
    ``chimera`` (docs/planner.md, "Pipeline schedules")."""
    overlap: bool = True
    """Overlap gradient reduction / parameter gathering with backward / forward compute."""
    precision: str = "bf16"
    """Training precision: ``bf16``, ``fp16`` or ``fp8``."""
    tp_overlap: str = "none"
    """TP/SP collectives against the layer's GEMMs: ``none`` (exposed, Megatron 2021) or
    ``pipelined`` (decomposed into ``tp`` steps each hidden behind a GEMM slice: collective
    matmul, Megatron-Core's TP comm overlap, Flux, Centauri)."""
    dp_codec: str = "none"
    """Gradient compression of the data-parallel reduction (:mod:`commflow.compress`):
    ``none``, ``fp16``, ``bf16``, ``int8`` or ``int4`` (block-quantized, scales included)."""
    dp_sched: str = "ddp"
    """How the overlapped gradient reduction is scheduled (:mod:`commflow.sched`): ``ddp``
    (25 MiB buckets), ``fifo``, ``horovod``, ``priority``, ``p3``, ``bytescheduler`` or
    ``pace``."""
    partition: str = "even"
    """Layers per pipeline stage: ``even`` (``layers / pp`` each) or ``balanced`` (in
    proportion to each stage's speed, within its memory: HetPipe/AMP-style, for stages on
    different accelerators or links, or a last stage slowed by the logits; needs ``vp = 1``;
    :func:`commflow.plan.hetero.partition_layers`)."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep", "mb", "global_batch", "vp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CommflowError(f"plan: {name} must be an integer >= 1, got {value!r}")
        if self.zero not in (0, 1, 2, 3):
            raise CommflowError(f"plan: zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise CommflowError(f"plan: recompute must be one of {', '.join(RECOMPUTE)}")
        if self.schedule not in SCHEDULES:
            raise CommflowError(f"plan: schedule must be one of {', '.join(SCHEDULES)}")
        if self.precision not in PRECISION_BYTES:
            raise CommflowError(f"plan: precision must be one of {', '.join(PRECISION_BYTES)}")
        if self.vp > 1 and self.schedule != "interleaved":
            raise CommflowError("plan: vp > 1 needs schedule=interleaved")
        if self.dp % self.ep:
            raise CommflowError(f"plan: ep {self.ep} must divide dp {self.dp}")
        if self.tp_overlap not in TP_OVERLAPS:
            raise CommflowError(
                f"plan: tp_overlap must be one of {', '.join(TP_OVERLAPS)}, got "
                f"{self.tp_overlap!r}")
        if self.dp_codec not in DP_CODECS:
            raise CommflowError(
                f"plan: dp_codec must be one of {', '.join(DP_CODECS)}, got {self.dp_codec!r}")
        if self.dp_sched not in DP_SCHEDULES:
            raise CommflowError(
                f"plan: dp_sched must be one of {', '.join(DP_SCHEDULES)}, got {self.dp_sched!r}")
        if self.partition not in PARTITIONS:
            raise CommflowError(
                f"plan: partition must be one of {', '.join(PARTITIONS)}, got {self.partition!r}")
        if self.partition == "balanced" and (self.vp > 1 or self.schedule == "chimera"):
            raise CommflowError(
                "plan: partition=balanced needs vp=1 and a schedule other than chimera (whose "
                "ranks each hold two stages)")

    @property
    def gpus(self) -> int:
        """Ranks the plan uses: ``tp * cp * pp * dp``."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def microbatches(self) -> int:
        """Micro-batches per step per pipeline: ``global_batch / (dp * mb)``."""
        return self.global_batch // (self.dp * self.mb)

    def describe(self) -> str:
        """The ``--plan`` string of this plan, e.g. ``tp=8,pp=16,dp=24,mb=1,...``."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            parts.append(
                f"{_ALIASES.get(f.name, f.name)}={int(value) if isinstance(value, bool) else value}"
            )
        return ",".join(parts)

    def to_dict(self) -> dict:
        """Fields as a JSON-ready dict."""
        return asdict(self)


_ALIASES = {"global_batch": "gbs"}
_KEYS = {_ALIASES.get(f.name, f.name): f for f in fields(Plan)}


def parse_plan(text: str, **defaults: object) -> Plan:
    """A plan from ``"tp=8,pp=16,dp=24,mb=1,vp=2,sp=1,zero=1,recompute=full"``; ``defaults``
    fill fields the text leaves out (e.g. ``global_batch``). ``vp > 1`` implies the
    interleaved schedule. Raises ``CommflowError`` for unknown keys or bad values."""
    values: dict[str, object] = dict(defaults)
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise CommflowError(
                f"plan: cannot read {item!r}; use key=value with keys {', '.join(_KEYS)}"
            )
        f = _KEYS[key]
        raw = raw.strip()
        try:
            if f.type in ("int", int):
                values[f.name] = int(raw)
            elif f.type in ("bool", bool):
                values[f.name] = raw.lower() in ("1", "true", "yes", "on")
            else:
                values[f.name] = raw.lower()
        except ValueError:
            raise CommflowError(f"plan: {key} needs an integer, got {raw!r}") from None
    if int(values.get("vp", 1)) > 1 and "schedule" not in values:  # type: ignore[call-overload]
        values["schedule"] = "interleaved"
    return Plan(**values)  # type: ignore[arg-type]


def check_plan(model: TransformerSpec, plan: Plan, *, gpus: int, gpus_per_box: int) -> None:
    """Raise ``CommflowError`` when ``plan`` does not divide ``model`` or the cluster."""
    problems = []
    if plan.gpus != gpus:
        problems.append(f"tp*cp*pp*dp = {plan.gpus} but the cluster has {gpus} GPUs")
    if gpus_per_box % plan.tp:
        problems.append(f"tp {plan.tp} must divide the {gpus_per_box} GPUs of a box")
    if model.heads % plan.tp or model.kv_count % plan.tp and plan.tp % model.kv_count:
        problems.append(f"tp {plan.tp} must divide the {model.heads} heads")
    if plan.partition == "balanced" and model.layers < plan.pp:
        problems.append(f"pp {plan.pp} must not exceed the {model.layers} layers")
    elif plan.partition == "even" and model.layers % (plan.pp * plan.vp):
        problems.append(f"pp*vp = {plan.pp * plan.vp} must divide the {model.layers} layers")
    if model.seq % plan.cp:
        problems.append(f"cp {plan.cp} must divide the sequence length {model.seq}")
    if model.experts % plan.ep:
        problems.append(f"ep {plan.ep} must divide the {model.experts} experts")
    if plan.global_batch % (plan.dp * plan.mb):
        problems.append(f"global batch {plan.global_batch} must be a multiple of dp*mb")
    elif plan.schedule == "interleaved" and plan.microbatches % plan.pp:
        problems.append(f"interleaved needs micro-batches ({plan.microbatches}) divisible by pp")
    elif plan.schedule == "chimera" and plan.pp % 2 == 0 and plan.microbatches % plan.pp:
        problems.append(
            f"chimera needs micro-batches ({plan.microbatches}) a multiple of pp ({plan.pp}): "
            "its scheduling unit is pp micro-batches, half down and half up; change the "
            "global batch or mb")
    if plan.schedule == "chimera" and plan.pp % 2:
        problems.append(
            f"chimera needs an even number of stages (pp={plan.pp}): each rank holds stage s "
            "of one pipeline and pp-1-s of the other; use an even pp or another schedule")
    if problems:
        raise CommflowError(f"plan {plan.describe()} is invalid: " + "; ".join(problems))
