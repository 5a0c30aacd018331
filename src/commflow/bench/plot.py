"""``--plot``: busbw against size for every benchmarked run, on one PNG (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from commflow.bench.harness import Measurement
from commflow.errors import CommflowError
from commflow.units import GB, format_size


def plot_busbw(
    measurements: Sequence[Measurement],
    path: str | Path,
    *,
    title: str = "",
    bound: float | None = None,
) -> None:
    """Draw busbw (GB/s, log axis) against size (log 2 axis) with one line per (implementation,
    algorithm, placement), and ``bound`` (bytes/s) as a dashed line, into the PNG ``path``.

    Raises ``CommflowError`` when matplotlib is missing or there is nothing to draw.
    """
    if not measurements:
        raise CommflowError("nothing to plot: no measurements")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CommflowError("--plot needs matplotlib: pip install 'commflow[plot]'") from None
    lines: dict[str, list[Measurement]] = {}
    for m in measurements:
        label = f"{m.impl} {m.algo}" if m.impl == "commflow" else m.impl
        lines.setdefault(f"{label} ({'in' if m.inplace else 'out-of'}-place)", []).append(m)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, points in lines.items():
        points = sorted(points, key=lambda m: m.size)
        ax.plot(
            [m.size for m in points],
            [m.busbw / GB for m in points],
            marker="o",
            markersize=3,
            linestyle="--" if "in-place" in label else "-",
            label=label,
        )
    if bound is not None:
        ax.axhline(bound / GB, color="black", linestyle=":", label="memory-bandwidth bound")
    sizes = sorted({m.size for m in measurements})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [format_size(s) for s in sizes], rotation=60, fontsize=7)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as err:
        raise CommflowError(f"cannot write plot {path}: {err}") from None
    finally:
        plt.close(fig)
