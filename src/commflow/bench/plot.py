"""``--plot``: busbw against size, one line per run or algorithm, on one PNG (matplotlib)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from commflow.bench.harness import Measurement
from commflow.errors import CommflowError
from commflow.plotting import pyplot, save
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
    lines: dict[str, list[tuple[int, float]]] = {}
    for m in measurements:
        label = f"{m.impl} {m.algo}" if m.impl == "commflow" else m.impl
        key = f"{label} ({'in' if m.inplace else 'out-of'}-place)"
        lines.setdefault(key, []).append((m.size, m.busbw))
    flat = None if bound is None else ("memory-bandwidth bound", bound)
    plot_curves(lines, path, title=title, level=flat,
                dashed=lambda label: "in-place" in label)


def plot_curves(
    curves: Mapping[str, Sequence[tuple[int, float]]],
    path: str | Path,
    *,
    title: str = "",
    level: tuple[str, float] | None = None,
    reference: tuple[str, Sequence[tuple[int, float]]] | None = None,
    dashed: Callable[[str], bool] = lambda label: False,
) -> None:
    """Draw each curve's ``(size, busbw bytes/s)`` points (GB/s on a log axis against size
    on a log 2 axis), a ``level`` (label, bytes/s) as a horizontal dotted line and a
    ``reference`` curve (label, points) dotted, into the PNG ``path``.

    Raises ``CommflowError`` when matplotlib is missing, there is nothing to draw or ``path``
    cannot be written.
    """
    if not curves:
        raise CommflowError("nothing to plot: no curves")
    plt = pyplot("--plot")
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, points in curves.items():
        points = sorted(points)
        ax.plot([s for s, _ in points], [b / GB for _, b in points], marker="o", markersize=3,
                linestyle="--" if dashed(label) else "-", label=label)
    if reference is not None:
        label, points = reference
        points = sorted(points)
        ax.plot([s for s, _ in points], [b / GB for _, b in points], color="black",
                linestyle=":", label=label)
    if level is not None:
        ax.axhline(level[1] / GB, color="black", linestyle=":", label=level[0])
    sizes = sorted({s for points in curves.values() for s, _ in points})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [format_size(s) for s in sizes], rotation=60, fontsize=7)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    save(fig, path, dpi=120)
