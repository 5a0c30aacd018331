"""2D-torus allreduce (Mikami et al. 2018, "Massively distributed SGD: ImageNet/ResNet-50
training in a flash").

Ranks sit on a ``rows x cols`` grid, row-major (rank ``r`` is row ``r // cols``, column
``r % cols``): ring reduce-scatter along each row, ring allreduce of each shard along each
column, ring allgather along each row. A row is a box of ``cols`` consecutive ranks, so this
is :func:`~commflow.algorithms.hierarchical.two_level_allreduce` with ``box = cols``. Cost with
``chunks == channels == 1`` (n bytes):
``2(cols-1)·(alpha + n/cols·beta) + 2(rows-1)·(alpha + n/p·beta) + ((cols-1)/cols +
(rows-1)/p)·n·gamma``. ``rows`` must divide p; default: the largest divisor of p that is at
most ``sqrt(p)`` (1, a flat ring, for a prime p).
"""

from __future__ import annotations

from commflow.algorithms.hierarchical import check_divisor, default_group_size, two_level_allreduce
from commflow.algorithms.registry import register
from commflow.collectives import Collective
from commflow.ir import Program

NAME = "torus2d"


def _generate(
    collective: Collective,
    nranks: int,
    *,
    chunks: int,
    channels: int,
    root: int | None,
    rows: int | None = None,
) -> Program:
    rows = default_group_size(nranks) if rows is None else rows
    rows = check_divisor(NAME, "rows", rows, nranks)
    cols = nranks // rows
    return two_level_allreduce(
        nranks,
        cols,
        name=NAME,
        chunks=chunks,
        channels=channels,
        params={"rows": rows, "cols": cols},
    )


register(
    [Collective.ALLREDUCE],
    NAME,
    _generate,
    "ring reduce-scatter along rows, ring allreduce along columns, ring allgather along "
    "rows (Mikami et al. 2018): 2(c-1)(a + n/c·b) + 2(r-1)(a + n/p·b), r x c grid",
    params=("rows",),
)
