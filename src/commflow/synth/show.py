"""``commflow synth --show``: a program's link loads drawn on its topology (PNG, matplotlib).

:func:`schedule_picture` computes what is drawn (node positions, the bytes each used link
carries per byte of collective size, the title); :func:`draw_schedule` draws it. Link loads
are honest for every kind of program (trees, flows, step schedules, predefined algorithms):
they are the simulator's per-link bytes, messages spread over all shortest routes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from commflow.errors import CommflowError
from commflow.ir import Program
from commflow.plotting import pyplot, save
from commflow.sim import SimResult, lower_bound
from commflow.topology.graph import NodeKind, Topology
from commflow.units import format_size

_NIC_RADIUS = 1.25
"""NICs sit outside the circle of ranks, next to their rank."""
_SWITCH_PULL = 0.6
"""A switch sits at this fraction of the mean position of the ranks it links."""
_CORE_RADIUS = 0.3
"""Nodes linking no rank (network switches) share a small inner circle."""


@dataclass(frozen=True)
class SchedulePicture:
    """What :func:`draw_schedule` draws."""

    title: str
    """Collective, topology, program, and % of the lower bound achieved in ``result``."""
    positions: dict[int, tuple[float, float]]
    """Drawing position of every topology node."""
    ranks: frozenset[int]
    """Nodes drawn as circles (compute ranks); the others (switches, NICs) are squares."""
    names: dict[int, str]
    """Label of every node: the rank number, or the switch/NIC name."""
    loads: dict[tuple[int, int], float]
    """Bytes each used link ``(src, dst)`` carries per byte of collective size."""
    busy: dict[tuple[int, int], float]
    """Per used link, its busy time (``load / bandwidth``) over the busiest link's, in (0, 1]."""
    unused: tuple[tuple[int, int], ...]
    """Links the program leaves idle, drawn faintly."""


def schedule_picture(program: Program, topology: Topology, result: SimResult) -> SchedulePicture:
    """The picture of ``program`` on ``topology``, from ``result`` = ``simulate(program,
    topology, size)`` (its link bytes and time; any model). Raises ``CommflowError`` when
    ``result`` is not a simulation of a program on this topology (link count differs) or has
    size 0."""
    if len(result.link_bytes) != len(topology.links) or result.size <= 0:
        raise CommflowError(
            f"--show: the simulation result does not match {topology.name} "
            f"({len(result.link_bytes)} links, size {result.size}); simulate the program on "
            "this topology at a size > 0"
        )
    per_byte = result.link_bytes / result.size
    seconds = per_byte / np.array([link.bandwidth for link in topology.links])
    busiest = float(seconds.max(initial=0.0))
    loads, busy, unused = {}, {}, []
    for link, load, time in zip(topology.links, per_byte, seconds, strict=True):
        if load > 0:
            loads[(link.src, link.dst)] = float(load)
            busy[(link.src, link.dst)] = float(time / busiest)
        else:
            unused.append((link.src, link.dst))
    bound = lower_bound(program.collective, topology, result.size, root=program.root or 0)
    pct = 100 * bound.time / result.time if result.time > 0 else math.nan
    title = (
        f"{program.collective.value} on {topology.name}: {program.name}\n"
        f"{pct:.1f}% of the lower bound at {format_size(result.size)} ({result.model} model)"
    )
    return SchedulePicture(
        title=title,
        positions=_layout(topology),
        ranks=frozenset(range(topology.nranks)),
        names={n.id: str(n.id) if n.kind is NodeKind.RANK else n.name for n in topology.nodes},
        loads=loads,
        busy=busy,
        unused=tuple(unused),
    )


def draw_schedule(picture: SchedulePicture, path: str | Path) -> None:
    """Draw ``picture`` into the PNG ``path``: ranks as circles, switches and NICs as squares,
    used links as arrows coloured and widened by their busy time (colour bar), idle links
    dotted grey.
    Raises ``CommflowError`` when matplotlib is missing or ``path`` cannot be written."""
    plt = pyplot("--show")
    import matplotlib
    from matplotlib.lines import Line2D

    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(8, 8.8))
    pos = picture.positions
    for src, dst in picture.unused:
        ax.plot(*zip(pos[src], pos[dst], strict=True), color="0.8", lw=0.6, ls=":", zorder=1)
    for (src, dst), share in sorted(picture.busy.items(), key=lambda item: item[1]):
        ax.annotate(
            "",
            xy=pos[dst],
            xytext=pos[src],
            arrowprops={
                "arrowstyle": "-|>",
                "color": cmap(share),
                "lw": 0.8 + 3.2 * share,
                "shrinkA": 11,
                "shrinkB": 11,
                "connectionstyle": "arc3,rad=0.12",
            },
            zorder=2,
        )
    for node, (x, y) in pos.items():
        rank = node in picture.ranks
        ax.scatter(
            x,
            y,
            s=420 if rank else 260,
            marker="o" if rank else "s",
            c="#f2f2f2" if rank else "#d9d9d9",
            edgecolors="black",
            zorder=3,
        )
        ax.annotate(
            picture.names[node],
            (x, y),
            ha="center",
            va="center" if rank else "top",
            xytext=(0, 0) if rank else (0, -11),
            textcoords="offset points",
            fontsize=9 if rank else 6,
            zorder=4,
        )
    legend = [
        Line2D([], [], marker="o", ls="", mfc="#f2f2f2", mec="black", ms=10, label="rank (GPU)")
    ]
    if len(pos) > len(picture.ranks):
        legend.append(
            Line2D(
                [], [], marker="s", ls="", mfc="#d9d9d9", mec="black", ms=8, label="switch / NIC"
            )
        )
    if picture.unused:
        legend.append(Line2D([], [], color="0.8", lw=0.6, ls=":", label="idle link"))
    ax.legend(handles=legend, loc="upper left", fontsize=8)
    scale = plt.cm.ScalarMappable(cmap=cmap, norm=matplotlib.colors.Normalize(0.0, 1.0))
    bar = fig.colorbar(scale, ax=ax, orientation="horizontal", fraction=0.04, pad=0.02)
    bar.set_label("link busy time (bytes / bandwidth) over the busiest link's", fontsize=8)
    ax.set_title(picture.title, fontsize=10)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    save(fig, path, bbox_inches="tight")


def _layout(topology: Topology) -> dict[int, tuple[float, float]]:
    """Ranks on the unit circle in id order; a NIC (one rank neighbour) just outside its rank,
    a switch linking ranks pulled towards them, other nodes on a small inner circle."""
    n = topology.nranks
    pos = {r: (math.cos(2 * math.pi * r / n), math.sin(2 * math.pi * r / n)) for r in range(n)}
    core = []
    for node in topology.nodes[n:]:
        near = sorted({lk.dst for lk in topology.out_links(node.id) if lk.dst < n})
        if len(near) == 1:
            x, y = pos[near[0]]
            pos[node.id] = (_NIC_RADIUS * x, _NIC_RADIUS * y)
        elif near:
            xs, ys = zip(*(pos[r] for r in near), strict=True)
            pos[node.id] = (_SWITCH_PULL * float(np.mean(xs)), _SWITCH_PULL * float(np.mean(ys)))
        else:
            core.append(node.id)
    radius = _CORE_RADIUS if len(core) > 1 else 0.0
    for i, node in enumerate(core):
        angle = 2 * math.pi * i / len(core)
        pos[node] = (radius * math.cos(angle), radius * math.sin(angle))
    return pos
