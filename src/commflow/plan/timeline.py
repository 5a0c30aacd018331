"""Draw one simulated step as a timeline PNG: per pipeline stage a compute lane (forward,
backward, weight-gradient ops) and beside it one lane per kind of communication — the exposed
TP, CP, EP and ZeRO-3 collectives inside each op, the pipeline sends after it, the
data-parallel reduction left after the stage's last backward op and ZeRO-1/2's all-gather of
the updated parameters."""

from __future__ import annotations

import os

from commflow.errors import CommflowError
from commflow.plan.evaluate import Evaluation
from commflow.plotting import pyplot, save

COLORS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}
"""Fill colour of each compute op kind."""

COMM_LANES = {
    "tp": ("TP", "#8172b3"),
    "cp": ("CP", "#937860"),
    "ep": ("EP", "#da8bc3"),
    "zero3_gather": ("ZeRO-3 gather", "#ccb974"),
}
"""Collectives inside an op (:attr:`Evaluation.op_comm` keys): lane name and colour."""

SEND = ("PP send", "#64b5cd")
DP = ("DP reduce", "#c44e52")
ZERO = ("ZeRO param gather", "#8c8c8c")
LANE_ORDER = ("compute", "TP", "CP", "EP", "ZeRO-3 gather", "PP send", "DP reduce",
              "ZeRO param gather")
"""Lanes of a stage, top to bottom (those with nothing to draw are left out)."""

Boxes = dict[tuple[int, str], list[tuple[float, float]]]


def lane_boxes(evaluation: Evaluation) -> Boxes:
    """``(stage, lane) -> [(start, duration)]`` of every communication box."""
    run, plan = evaluation.pipeline, evaluation.plan
    boxes: Boxes = {}

    def add(stage: int, lane: str, start: float, duration: float) -> None:
        if duration > 0:
            boxes.setdefault((stage, lane), []).append((start, duration))

    for op in run.intervals:
        if op.kind not in ("F", "B"):
            continue
        side = 0 if op.kind == "F" else 1
        shares = [(COMM_LANES[k][0], v[side]) for k, v in evaluation.op_comm.items()]
        cursor = op.end - sum(d for _, d in shares)  # exposed comm ends each op
        for lane, duration in shares:
            add(op.stage, lane, cursor, duration)
            cursor += duration
        last_hop = (op.stage == plan.pp - 1 and op.chunk == plan.vp - 1) if side == 0 else (
            op.stage == 0 and op.chunk == 0)
        if plan.pp > 1 and not last_hop:
            add(op.stage, SEND[0], op.end, evaluation.p2p)
    reduce = evaluation.exposed_dp - evaluation.zero_gather
    for stage, end in enumerate(run.stage_end):
        add(stage, DP[0], end, reduce)
        add(stage, ZERO[0], end + reduce, evaluation.zero_gather)
    return boxes


def draw_timeline(evaluation: Evaluation, path: str | os.PathLike) -> list[str]:
    """Write ``evaluation``'s timeline to ``path`` (PNG, via matplotlib) and return the lanes
    drawn for each stage (``compute`` first, then the communication lanes that have boxes).

    Raises ``CommflowError`` when the evaluation's pipeline was extrapolated or estimated
    (evaluate with ``pipeline="exact"``), for Chimera (closed form only) or when matplotlib is
    missing."""
    run = evaluation.pipeline
    if evaluation.plan.schedule == "chimera":
        raise CommflowError(
            "chimera is timed by its closed form and has no op timeline to draw; draw the "
            "plan with another schedule (1f1b, zb-h2, ...)")
    if run.extrapolated:
        raise CommflowError(
            "this evaluation has no full timeline: evaluate with pipeline='exact' to draw it"
        )
    plt = pyplot("drawing a timeline")
    boxes = lane_boxes(evaluation)
    present = {lane for _, lane in boxes}
    lanes = [lane for lane in LANE_ORDER if lane == "compute" or lane in present]
    colors = {name: color for name, color in (*COMM_LANES.values(), SEND, DP, ZERO)}
    stages, rows = len(run.stage_end), len(lanes)
    fig, ax = plt.subplots(figsize=(12, 0.28 * stages * rows + 1.6))
    labelled: set[str] = set()

    def bar(spans: list[tuple[float, float]], y: float, height: float, color: str,
            label: str, edge: str) -> None:  # comm boxes edged in their colour: never hidden
        ax.broken_barh(spans, (y - height / 2, height), facecolors=color, edgecolor=edge,
                       linewidth=0.3, label=None if label in labelled else label)
        labelled.add(label)

    for s in range(stages):
        for kind, color in COLORS.items():
            row = [(i.start, i.end - i.start) for i in run.intervals
                   if i.kind == kind and i.stage == s]  # fmt: skip
            if row:
                bar(row, s * rows, 0.8, color, kind, "white")
        for offset, lane in enumerate(lanes[1:], start=1):
            if (s, lane) in boxes:
                bar(boxes[s, lane], s * rows + offset, 0.6, colors[lane], lane, colors[lane])
    ax.set_yticks(range(stages * rows))
    ax.set_yticklabels([f"stage {s}" if lane == "compute" else lane
                        for s in range(stages) for lane in lanes], fontsize="x-small")
    ax.set_ylim(stages * rows - 0.5, -0.5)
    ax.set_xlabel("seconds")
    plan = evaluation.plan
    ax.set_title(
        f"{plan.schedule} tp={plan.tp} cp={plan.cp} pp={plan.pp} dp={plan.dp} vp={plan.vp} "
        f"mb={plan.mb} zero={plan.zero}: step {evaluation.step_time:.3f} s"
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="x-small")
    fig.tight_layout()
    save(fig, path)
    return lanes
