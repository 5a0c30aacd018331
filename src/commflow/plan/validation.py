"""Validation of the planner against published training runs.

``data/published_runs.json`` holds runs from several public sources (each row: model,
cluster, accelerator, precision, TP/PP/DP/CP/EP/VP, ZeRO, recompute, micro/global batch,
sequence, the published metric and where it was printed). Every metric is converted to
seconds per step the same way:

- ``step_time_s``: as published;
- ``tokens_per_s_per_gpu``: ``global_batch · seq / (gpus · value)``;
- ``mfu``: ``model FLOPs / (gpus · peak · value)``, the model FLOPs of
  :func:`~commflow.plan.compute.model_flops` (Megatron's formula, which is the one the MFU
  sources use).

Rows are split into a ``fit`` part (the constants of
:data:`~commflow.plan.compute.CALIBRATIONS` were chosen on it) and a ``test`` part (only
reported). :func:`validate` predicts every row; :func:`summarize` gives the median and largest
relative error and the median per row class (:data:`CLASSES`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

from commflow.errors import CommflowError
from commflow.plan.compute import CALIBRATION, Calibration, model_flops
from commflow.plan.evaluate import evaluate
from commflow.plan.hardware import get_accelerator
from commflow.plan.models import TransformerSpec, get_model
from commflow.plan.parallel import Plan

DEEP_PIPELINE = 16
"""Pipeline depth from which a run counts as ``deep-pp``."""

CLASSES = ("zero3", "h100", "fp8", "deep-pp", "cp", "moe")
"""Row classes whose median error is reported (a row may be in several)."""

_PLAN_KEYS = ("tp", "pp", "dp", "cp", "ep", "vp", "sp", "zero", "recompute", "mb",
              "global_batch", "overlap", "tp_overlap", "precision")


@dataclass(frozen=True)
class PublishedRun:
    """One published training run and its metric."""

    id: str
    source: str
    model: TransformerSpec
    cluster: str
    accelerator: str
    plan: Plan
    metric: str
    """``step_time_s``, ``tokens_per_s_per_gpu`` or ``mfu``."""
    value: float
    split: str
    """``fit`` or ``test``."""
    where: str
    """Table and row of the source."""

    @property
    def classes(self) -> tuple[str, ...]:
        """The :data:`CLASSES` this run belongs to."""
        p = self.plan
        tags = {
            "zero3": p.zero == 3,
            "h100": self.accelerator.startswith("h100"),
            "fp8": p.precision == "fp8",
            "deep-pp": p.pp >= DEEP_PIPELINE,
            "cp": p.cp > 1,
            "moe": self.model.experts > 1,
        }
        return tuple(name for name in CLASSES if tags[name])

    @property
    def published_step(self) -> float:
        """The published metric as seconds per step (module doc)."""
        p, spec = self.plan, self.model
        if self.metric == "step_time_s":
            return self.value
        if self.metric == "tokens_per_s_per_gpu":
            return p.global_batch * spec.seq / (p.gpus * self.value)
        if self.metric == "mfu":
            peak = get_accelerator(self.accelerator).peak(p.precision)
            return model_flops(spec, p.global_batch, recompute=False) / (p.gpus * peak * self.value)
        raise CommflowError(f"published run {self.id}: unknown metric {self.metric!r}")


@dataclass(frozen=True)
class Validated:
    """A run, its published and predicted step times and the relative error."""

    run: PublishedRun
    published: float
    predicted: float

    @property
    def error(self) -> float:
        """``predicted / published - 1``."""
        return self.predicted / self.published - 1


@cache
def _document() -> dict:
    text = resources.files("commflow.plan").joinpath("data/published_runs.json").read_text()
    return json.loads(text)


def sources() -> dict[str, dict]:
    """The sources of :func:`load_runs`, by key (title, URL, how the metric is converted)."""
    return dict(_document()["sources"])


def _spec(name: str, seq: int, models: dict) -> TransformerSpec:
    if name in models:
        return TransformerSpec(name=name, **{**models[name], "seq": seq})
    return get_model(name, seq=seq)


def load_runs(split: str | None = None) -> list[PublishedRun]:
    """The published runs (``split``: only ``fit`` or only ``test`` rows)."""
    doc = _document()
    runs = []
    for row in doc["runs"]:
        if split is not None and row["split"] != split:
            continue
        values = {key: row[key] for key in _PLAN_KEYS}
        schedule = "interleaved" if row["vp"] > 1 else "1f1b"
        runs.append(PublishedRun(
            id=row["id"], source=row["source"], model=_spec(row["model"], row["seq"],
                                                            doc["models"]),
            cluster=row["cluster"], accelerator=row["accelerator"],
            plan=Plan(schedule=schedule, **values), metric=row["metric"],
            value=float(row["value"]), split=row["split"], where=row["where"],
        ))
    return runs


def predict(run: PublishedRun) -> Validated:
    """The planner's step time for ``run`` next to the published one."""
    result = evaluate(run.model, run.cluster, run.plan, accelerator=run.accelerator)
    return Validated(run, run.published_step, result.step_time)


def validate(split: str | None = None) -> list[Validated]:
    """:func:`predict` for every run of ``split`` (all when ``None``)."""
    return [predict(run) for run in load_runs(split)]


def summarize(rows: list[Validated]) -> dict[str, float]:
    """``rows``, ``median`` and ``max`` of ``|error|`` and ``median <class>`` for each class
    with rows."""
    errors = [abs(r.error) for r in rows]
    out = {"rows": float(len(rows)), "median": statistics.median(errors), "max": max(errors)}
    for name in CLASSES:
        members = [abs(r.error) for r in rows if name in r.run.classes]
        if members:
            out[f"median {name}"] = statistics.median(members)
    return out


def calibration_key(run: PublishedRun) -> tuple[str, str]:
    """The :data:`~commflow.plan.compute.CALIBRATIONS` key that predicts ``run``."""
    from commflow.plan.compute import _FAMILIES

    name = run.accelerator
    family = next((f for prefix, f in _FAMILIES if name.startswith(prefix)), name)
    return family, run.plan.precision


FIT_FIELDS = ("gemm_efficiency", "gemm_half_flops", "attention_efficiency", "elementwise_passes",
              "moe_passes")
"""The constants :func:`fit_calibration` chooses (``step_overhead`` stays fixed)."""

_BOUNDS = ((0.2, 7.0, 0.05, 0.25, 0.0), (1.0, 11.5, 3.0, 8.0, 500.0))
"""Bounds of (gemm_efficiency, log10 gemm_half_flops, attention_efficiency,
elementwise_passes, moe_passes) for :func:`fit_calibration`."""


def _with(start: Calibration, x) -> Calibration:
    return replace(start, gemm_efficiency=float(x[0]), gemm_half_flops=float(10 ** x[1]),
                   attention_efficiency=float(x[2]), elementwise_passes=float(x[3]),
                   moe_passes=float(x[4]))


def log_errors(runs: list[PublishedRun], cal: Calibration) -> list[float]:
    """``log(predicted / published)`` of each run under ``cal``."""
    return [
        math.log(evaluate(run.model, run.cluster, run.plan, accelerator=run.accelerator,
                          calibration=cal).step_time / run.published_step)
        for run in runs
    ]


def fit_calibration(runs: list[PublishedRun], start: Calibration,
                    evaluations: int = 60) -> Calibration:
    """Constants (:data:`FIT_FIELDS`) minimizing the summed squared log error of ``runs`` (all
    of one :func:`calibration_key`), from ``start``: bounded least squares (SciPy, soft-L1
    loss so one odd run does not pull the rest), at most ``evaluations`` passes over
    ``runs``."""
    from scipy.optimize import least_squares

    x0 = [start.gemm_efficiency, math.log10(start.gemm_half_flops),
          start.attention_efficiency, start.elementwise_passes, start.moe_passes]
    x0 = [min(max(v, lo), hi) for v, lo, hi in zip(x0, *_BOUNDS, strict=True)]
    result = least_squares(lambda x: log_errors(runs, _with(start, x)), x0, bounds=_BOUNDS,
                           loss="soft_l1", f_scale=0.05, diff_step=0.02, max_nfev=evaluations)
    return _with(start, result.x)


FIT_START = replace(CALIBRATION, attention_efficiency=0.6, elementwise_passes=1.5,
                    flash_attention=True)
"""Where :func:`fit_calibration` starts for the calibrations fitted on published runs (their
software stacks use fused attention)."""
