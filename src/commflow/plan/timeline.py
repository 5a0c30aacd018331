"""Draw one simulated step as a timeline PNG: one row per pipeline stage, an op per box
(forward, backward, weight gradient), the data-parallel reduction and optimizer after."""

from __future__ import annotations

import os

from commflow.errors import CommflowError
from commflow.plan.evaluate import Evaluation

COLORS = {"F": "#4c72b0", "B": "#dd8452", "W": "#55a868"}
"""Fill colour of each op kind."""


def draw_timeline(evaluation: Evaluation, path: str | os.PathLike) -> None:
    """Write ``evaluation``'s pipeline timeline to ``path`` (PNG, via matplotlib).

    Raises ``CommflowError`` when the evaluation's pipeline was extrapolated or estimated
    (evaluate with ``pipeline="exact"``) or matplotlib is missing."""
    run = evaluation.pipeline
    if run.extrapolated:
        raise CommflowError(
            "this evaluation has no full timeline: evaluate with pipeline='exact' to draw it"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CommflowError("drawing a timeline needs matplotlib: pip install matplotlib") from None
    stages = len(run.stage_end)
    fig, ax = plt.subplots(figsize=(12, 0.35 * stages + 1.5))
    for kind, color in COLORS.items():
        for s in range(stages):
            row = [
                (i.start, i.end - i.start) for i in run.intervals if i.kind == kind and i.stage == s
            ]
            if row:
                ax.broken_barh(
                    row,
                    (s - 0.4, 0.8),
                    facecolors=color,
                    edgecolor="white",
                    linewidth=0.3,
                    label=kind if s == 0 else None,
                )
    tail = evaluation.breakdown["dp"]
    end = max(run.stage_end)
    if tail > 0:
        ax.broken_barh(
            [(end, tail)], (-0.5, stages), facecolors="#c44e52", alpha=0.4, label="exposed DP"
        )
    ax.set_ylim(stages - 0.5, -0.5)
    ax.set_xlabel("seconds")
    ax.set_ylabel("pipeline stage")
    plan = evaluation.plan
    ax.set_title(
        f"{plan.schedule} tp={plan.tp} pp={plan.pp} dp={plan.dp} vp={plan.vp} "
        f"mb={plan.mb}: step {evaluation.step_time:.3f} s"
    )
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise CommflowError(f"cannot write timeline {path}: {e}") from None
    finally:
        plt.close(fig)
