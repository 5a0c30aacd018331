"""``commflow plan``: evaluate one parallel training plan or search for the best ones."""

from __future__ import annotations

import typer
from rich.markup import escape

from commflow.cli._output import choices, echo_json, out
from commflow.plan import (
    Evaluation,
    Plan,
    SearchSpace,
    evaluate,
    get_model,
    parse_plan,
    resolve_cluster,
    search,
)
from commflow.plan.hardware import PRECISION_BYTES, implied_accelerator
from commflow.plan.parallel import SCHEDULES
from commflow.plan.timeline import draw_timeline

Precision = choices("Precision", tuple(PRECISION_BYTES))
"""``--precision``: the training precisions the planner models."""

BREAKDOWN_PARTS = (
    "compute", "tp", "cp", "ep", "zero3_gather", "pp_bubble", "dp", "optimizer", "overhead"
)
"""Breakdown parts, in table order (every one is in ``--json``)."""

OPTIONAL_PARTS = ("cp", "ep", "zero3_gather")
"""Parts shown as table columns only when some listed plan has them non-zero."""

LABELS = {"zero3_gather": "zero3"}
"""Column header of a part whose name is too long for a column."""

HEADER = ("step(s)", "tokens/s", "TFLOPs_hw", "TFLOPs_mod", "MFU%", "GiB", "fits")

SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str) -> float:
    """``--train-tokens``: ``300e9``, ``1.4T``, ``300B`` or ``2000000``. Raises
    ``typer.BadParameter`` for anything else or a count that is not positive."""
    raw = text.strip().upper()
    scale = SUFFIXES.get(raw[-1:], 1.0)
    try:
        value = float(raw[:-1] if raw[-1:] in SUFFIXES else raw) * scale
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a token count: write 300e9, 300B or 1.4T"
        ) from None
    if not value > 0 or value == float("inf"):
        raise typer.BadParameter(f"the token count must be positive, got {text!r}")
    return value


def parse_schedules(text: str) -> tuple[str, ...]:
    """``--schedules``: comma-separated names of :data:`~commflow.plan.parallel.SCHEDULES`.
    Raises ``typer.BadParameter`` for an unknown or missing name."""
    names = tuple(filter(None, (part.strip().lower() for part in text.split(","))))
    unknown = [name for name in names if name not in SCHEDULES]
    if unknown or not names:
        raise typer.BadParameter(
            f"{text!r}: schedules are a comma-separated list of {', '.join(SCHEDULES)}")
    return names


def _short(p: Plan) -> str:
    """The plan in a table cell: sizes, then what differs from the defaults."""
    text = f"tp{p.tp} pp{p.pp} dp{p.dp} mb{p.mb}"
    extras = [
        f"cp{p.cp}" if p.cp > 1 else "",
        f"ep{p.ep}" if p.ep > 1 else "",
        f"vp{p.vp}" if p.vp > 1 else "",
        "sp" if p.sp else "",
        f"z{p.zero}" if p.zero else "",
        p.recompute if p.recompute != "none" else "",
        p.schedule if p.schedule not in ("1f1b", "interleaved") else "",
        p.partition if p.partition != "even" else "",
    ]
    return " ".join([text, *filter(None, extras)])


def _columns(results: list[Evaluation]) -> list[str]:
    """Breakdown parts to show: all but the optional ones every listed plan has at zero."""
    return [
        part for part in BREAKDOWN_PARTS
        if part not in OPTIONAL_PARTS or any(e.breakdown[part] > 0 for e in results)
    ]


def _row(e: Evaluation, parts: list[str], train_tokens: float | None) -> str:
    b = e.breakdown
    cells = [
        f"{e.step_time:.3f}",
        f"{e.tokens_per_s:.0f}",
        f"{e.tflops_per_gpu_hw:.1f}",
        f"{e.tflops_per_gpu_model:.1f}",
        f"{100 * e.mfu:.1f}",
        f"{e.memory.to_dict()['total']:.1f}",
        "yes" if e.fits else "NO",
        *(f"{b[p]:.3f}" for p in parts),
    ]
    if train_tokens is not None:
        training = e.training(train_tokens)
        cells += [f"{training['train_days']:.1f}", f"{training['gpu_hours']:.0f}"]
    return f"{_short(e.plan):<46}" + "".join(f"{c:>11}" for c in cells)


def plan(
    model: str = typer.Option(..., "--model", help="Model preset or Hugging Face config.json."),
    cluster: str = typer.Option(
        "dgx-a100", "--cluster", help="Topology preset (dgx-a100, dgx-h100, dgx-a100x16) or file."
    ),
    accelerator: str = typer.Option(
        None, "--accelerator",
        help="Accelerator preset (default: the cluster's: dgx-h100 -> h100-sxm, dgx-a100 -> "
        "a100-80gb, dgx1/ndv2 -> v100, mi250 -> mi250).",
    ),
    gpus: int = typer.Option(None, "--gpus", help="GPUs (sets the box count of the cluster)."),
    global_batch: int = typer.Option(..., "--global-batch", help="Sequences per step."),
    seq: int = typer.Option(None, "--seq", help="Sequence length (default: the model's)."),
    precision: Precision = typer.Option(
        Precision("bf16"), "--precision", help="Training precision."
    ),  # type: ignore[valid-type]
    top: int = typer.Option(10, "--top", help="Plans to list when searching."),
    plan_text: str = typer.Option(
        None, "--plan", help='Evaluate one plan: "tp=8,pp=16,dp=24,mb=1,vp=2,sp=1,zero=1,..."'
    ),
    timeline: str = typer.Option(None, "--timeline", help="With --plan: write a PNG timeline."),
    schedules: str = typer.Option(
        ",".join(SearchSpace().schedules), "--schedules",
        help=f"Pipeline schedules the search tries, comma-separated, of {', '.join(SCHEDULES)}."),
    in_network: bool = typer.Option(
        False, "--in-network",
        help="The network switches aggregate (SHARP): allreduce may use in-network aggregation."),
    train_tokens: str = typer.Option(
        None, "--train-tokens",
        help="Also print the days and GPU-hours to train this many tokens (300e9, 300B, 1.4T)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON records instead of a table."),
) -> None:
    """Predict step time, throughput, MFU and memory of parallel transformer training.

    For one plan (--plan) or the best plans of a search.

    Columns: plan, step time (s), tokens/s, hardware and model TFLOP/s per GPU, MFU (%),
    memory per GPU (GiB), fits, then seconds of compute, exposed TP, CP, EP and ZeRO-3 gathers
    (when some plan has them), pipeline bubble, exposed DP, optimizer and overhead; with
    --train-tokens, days and GPU-hours to train that many tokens (--json has every field, every
    part and the memory parts).

    [bold]Examples[/bold]

      commflow plan --model megatron-1t --cluster dgx-a100 --gpus 3072 --global-batch 3072
      commflow plan --model gpt3-175b --gpus 1024 --global-batch 1536
        --plan "tp=8,pp=16,dp=8,mb=1,vp=3,recompute=full" --timeline step.png
    """
    precision = precision.value
    tokens = parse_tokens(train_tokens) if train_tokens is not None else None
    space = SearchSpace(schedules=parse_schedules(schedules))
    spec = get_model(model, seq=seq)
    accelerator = accelerator or implied_accelerator(cluster)
    if plan_text is not None:
        chosen = parse_plan(plan_text, global_batch=global_batch, precision=precision)
        pipeline = "exact" if timeline else "simulate"
        topology = resolve_cluster(cluster, gpus or chosen.gpus)
        results = [evaluate(spec, topology, chosen, accelerator=accelerator, pipeline=pipeline,
                            in_network=in_network)]
        lanes = draw_timeline(results[0], timeline) if timeline else []
    else:
        lanes = []
        results = search(
            spec,
            cluster,
            gpus=gpus,
            global_batch=global_batch,
            accelerator=accelerator,
            precision=precision,
            top=top,
            in_network=in_network,
            space=space,
        )
    if as_json:
        echo_json([e.to_dict(train_tokens=tokens) for e in results])
        return
    kinds = dict.fromkeys(results[0].stage_accelerators) if results else {}
    if len(kinds) > 1:  # a heterogeneous cluster: its boxes' accelerators
        accelerator = "+".join(kinds)
    out.print(
        f"# {escape(spec.name)} on {escape(cluster)} x {escape(accelerator)}, "
        f"global batch {global_batch}, seq {spec.seq}"
        + (f" ({escape(spec.note)})" if spec.note else "")
    )
    if tokens is not None:
        out.print(f"# training {tokens:.4g} tokens: days and GPU-hours per plan")
    parts = _columns(results)
    header = [*HEADER, *(LABELS.get(p, p) for p in parts)]
    if tokens is not None:
        header += ["days", "GPU_hours"]
    out.print(f"{'plan':<46}" + "".join(f"{h:>11}" for h in header), markup=False)
    for e in results:
        out.print(_row(e, parts, tokens), markup=False)
    chosen_plan = results[0] if plan_text is not None else None
    if chosen_plan is not None and (chosen_plan.plan.partition != "even" or len(kinds) > 1):
        out.print("# layers per stage: " + ", ".join(
            f"{n:g} on {a}" for n, a in zip(chosen_plan.stage_layers,
                                            chosen_plan.stage_accelerators, strict=True)))
    if lanes:
        out.print(f"# timeline {escape(timeline)}: lanes per stage {', '.join(lanes)}")
