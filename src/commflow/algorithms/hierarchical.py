"""Hierarchical allreduce (Jia et al. 2018, "Highly scalable deep learning training system
with mixed-precision"), and the ring phases it is built from.

Jia et al. reduce inside each group to a master, allreduce among the masters and broadcast
back; here every rank of a box masters one shard instead (the decomposition of BlueConnect,
Cho et al. 2019), so all ranks share the inter-box work. Ranks form boxes of ``box``
consecutive ranks (``box`` divides p; ``g = p/box`` boxes):

1. reduce-scatter around a ring inside each box: local rank ``j`` ends with shard ``j``
   (``1/box`` of the data) summed over its box;
2. allreduce (ring reduce-scatter + allgather) of shard ``j`` among the ``g`` ranks with local
   rank ``j``, one per box;
3. allgather around the ring inside each box.

Cost with ``chunks == channels == 1`` (n bytes, b = box):
``2(b-1)·(alpha + n/b·beta) + 2(g-1)·(alpha + n/(b·g)·beta) + ((b-1)/b + (g-1)/p)·n·gamma``:
only ``2(g-1)/p·n`` bytes per rank cross boxes. ``box = 1`` or ``box = p`` is a flat ring
allreduce, ``2(p-1)·alpha + 2(p-1)/p·n·beta``. Default ``box``: the largest divisor of p that
is at most ``sqrt(p)`` (1 for a prime p), so the algorithm applies to every p.

Every block is cut into ``p`` segments (``cf = p·chunks·channels``); shard ``j`` is segments
``j·g .. (j+1)·g - 1``. A rank's steps of all three phases are emitted with every send as
early as its data allows, so the phases pipeline into each other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from commflow.algorithms.common import Action, ChunkLayout, emit_eager, transfer
from commflow.algorithms.registry import register
from commflow.collectives import Collective
from commflow.errors import AlgorithmError
from commflow.ir import Buffer, Program, ProgramBuilder, Ref, inp, out

NAME = "hierarchical"


def default_group_size(nranks: int) -> int:
    """The largest divisor of ``nranks`` that is at most ``sqrt(nranks)``."""
    return max(d for d in range(1, math.isqrt(nranks) + 1) if nranks % d == 0)


def check_divisor(name: str, param: str, value: object, nranks: int) -> int:
    """``value`` when it is an integer dividing ``nranks``; else ``AlgorithmError`` listing the
    divisors."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or nranks % value != 0:
        divisors = ", ".join(str(d) for d in range(1, nranks + 1) if nranks % d == 0)
        raise AlgorithmError(
            f"{name}: {param}={value!r} does not divide nranks={nranks}; use one of {divisors}"
        )
    return value


def ring_actions(
    group: Sequence[int],
    member: int,
    *,
    start: int,
    size: int,
    pieces: int,
    reduce_scatter: bool,
    allgather: bool,
    src: Buffer = Buffer.OUTPUT,
) -> list[Action]:
    """One member's steps of a ring phase over ``group`` (member i sends to member i+1).

    The data is ``len(group)`` blocks of ``size`` chunks, block q at chunk ``start + q·size``
    of every member's buffers; each block moves as ``pieces`` messages. A reduce-scatter
    (Patarasuk & Yuan 2009) leaves block i summed over the group in member i's output,
    reading local contributions from ``src``; an allgather then copies every member's block
    i (already in its output) to all members' outputs. Empty for a group of one.
    """
    m = len(group)
    if m == 1:
        return []
    nxt, prv = group[(member + 1) % m], group[(member - 1) % m]

    def block(q: int, buf: Buffer = Buffer.OUTPUT) -> Ref:
        return Ref(buf, start + q % m * size, size)

    actions: list[Action] = []
    if reduce_scatter:
        for t in range(m - 1):
            sent, got = member - t - 1, member - t - 2
            actions += transfer(
                nxt,
                block(sent, src if t == 0 else Buffer.OUTPUT),
                block(sent),
                pieces,
                receive=False,
            )
            actions += transfer(
                prv, block(got), block(got), pieces, reduce_with=block(got, src), receive=True
            )
    if allgather:
        for t in range(m - 1):
            sent, got = member - t, member - t - 1
            actions += transfer(nxt, block(sent), block(sent), pieces, receive=False)
            actions += transfer(prv, block(got), block(got), pieces, receive=True)
    return actions


def two_level_allreduce(
    nranks: int, box: int, *, name: str, chunks: int, channels: int, params: Mapping[str, object]
) -> Program:
    """Allreduce as ring reduce-scatter inside boxes of ``box`` consecutive ranks, ring
    allreduce across boxes of each shard, ring allgather inside boxes (module docstring).
    ``box`` must divide ``nranks``."""
    groups = nranks // box
    layout = ChunkLayout(nranks, chunks, channels)
    shard = groups * chunks
    b = ProgramBuilder(
        Collective.ALLREDUCE,
        nranks,
        chunk_factor=layout.cf,
        name=name,
        params={"chunks": chunks, "channels": channels, **params},
    )
    for c in range(channels):
        first = layout.index(0, c)
        if nranks == 1:
            b.copy(0, inp(first, layout.per_channel), out(first, layout.per_channel), channel=c)
        for rank in range(nranks):
            g, j = divmod(rank, box)
            inside = range(g * box, (g + 1) * box)
            across = range(j, nranks, box)
            actions = ring_actions(
                inside,
                j,
                start=first,
                size=shard,
                pieces=chunks,
                reduce_scatter=True,
                allgather=False,
                src=Buffer.INPUT,
            )
            actions += ring_actions(
                across,
                g,
                start=first + j * shard,
                size=chunks,
                pieces=chunks,
                reduce_scatter=True,
                allgather=True,
                src=Buffer.OUTPUT if box > 1 else Buffer.INPUT,
            )
            actions += ring_actions(
                inside,
                j,
                start=first,
                size=shard,
                pieces=chunks,
                reduce_scatter=False,
                allgather=True,
            )
            emit_eager(b, rank, c, actions)
    return b.build()


def _generate(
    collective: Collective,
    nranks: int,
    *,
    chunks: int,
    channels: int,
    root: int | None,
    box: int | None = None,
) -> Program:
    box = default_group_size(nranks) if box is None else box
    box = check_divisor(NAME, "box", box, nranks)
    return two_level_allreduce(
        nranks, box, name=NAME, chunks=chunks, channels=channels, params={"box": box}
    )


register(
    [Collective.ALLREDUCE],
    NAME,
    _generate,
    "ring reduce-scatter in boxes, ring allreduce across boxes, ring allgather in boxes "
    "(Jia et al. 2018): 2(B-1)(a + n/B·b) + 2(g-1)(a + n/p·b), B = box, g = p/B",
    params=("box",),
)
