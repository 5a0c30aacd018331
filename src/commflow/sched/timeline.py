"""A schedule drawn as a timeline PNG: a compute lane and a communication lane, one colour
per iteration, forward and backward shaded apart."""

from __future__ import annotations

import os

from commflow.plotting import pyplot, save
from commflow.sched.engine import Schedule

COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
"""Fill colour of each iteration (cycled)."""


def draw_schedule(schedule: Schedule, path: str | os.PathLike, *, last: int = 3) -> None:
    """Write the ``last`` iterations of ``schedule`` to ``path`` (PNG, via matplotlib).

    Raises ``CommflowError`` when matplotlib is missing or ``path`` cannot be written."""
    plt = pyplot("drawing a schedule")
    first = max(0, len(schedule.iteration_starts) - last)
    t0 = schedule.iteration_starts[first]
    fig, ax = plt.subplots(figsize=(13, 2.6))
    for lane, y in (("compute", 1), ("comm", 0)):
        for span in schedule.spans:
            if span.lane != lane or span.iteration < first or span.end <= t0:
                continue
            backward = lane == "compute" and span.name.startswith("B")
            ax.broken_barh([((span.start - t0) * 1e3, (span.end - span.start) * 1e3)],
                           (y - 0.4, 0.8), facecolors=COLORS[span.iteration % len(COLORS)],
                           alpha=0.55 if backward else 0.95, edgecolor="white", linewidth=0.3)
    ax.set_yticks([0, 1], ["communication", "compute"])
    ax.set_xlabel("milliseconds (colour: iteration; compute: forward dark, backward light)")
    ax.set_title(f"{schedule.workload.name}, {schedule.policy.name} on {schedule.cost.name}: "
                 f"{schedule.iteration_time * 1e3:.2f} ms per iteration "
                 f"(bound {schedule.lower_bound * 1e3:.2f} ms)")
    fig.tight_layout()
    save(fig, path)
