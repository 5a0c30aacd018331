"""Bruck's algorithms (Bruck, Ho, Kipnis, Upfal & Weathersby 1997, "Efficient algorithms for
all-to-all communications in multiport message-passing systems"; Thakur, Rabenseifner & Gropp
2005), for any number of ranks ``p``, with ``n`` bytes and ``chunks = channels = 1``:

- allgather: rank ``r`` keeps blocks ``r, r+1, ...`` (mod ``p``) at the top of a scratch
  buffer; in step ``s`` it sends its first ``min(2^s, p-2^s)`` blocks to ``r-2^s`` and appends
  those of ``r+2^s``; a final local rotation puts the blocks in rank order:
  ``⌈lg p⌉·α + (p-1)/p·nβ``.
- alltoall: a local rotation puts the block for ``r+i`` at position ``i``; in step ``s`` the
  blocks at positions with bit ``s`` set are packed, sent to ``r+2^s`` and unpacked into the
  same positions; a final inverse rotation orders them (a rank's own block is copied straight
  to its output): ``⌈lg p⌉·α + Σ_s m_s·(n/p)·β`` with
  ``m_s`` the positions with bit ``s`` set (about ``⌈lg p⌉(α + n/2·β)``).

Every channel has its own contiguous scratch region, so a message is one run per channel;
``chunks`` cuts it into that many messages.
"""

from __future__ import annotations

import numpy as np

from commflow.algorithms.common import Action, ChunkLayout, copies, emit_eager, transfer
from commflow.algorithms.registry import register
from commflow.collectives import Collective
from commflow.ir import Buffer, Program, ProgramBuilder, Ref


def _spans(starts: np.ndarray | list[int], width: int) -> np.ndarray:
    """Chunk indices of ``width`` chunks from each start, flattened in order."""
    return (np.asarray(starts, dtype=np.int64)[:, None] + np.arange(width)).reshape(-1)


def _message(peer: int, start: int, count: int, pieces: int, *, receive: bool) -> list[Action]:
    """One side of a scratch-to-scratch message of ``count`` chunks at ``start``."""
    ref = Ref(Buffer.SCRATCH, start, count)
    return transfer(peer, ref, ref, pieces, receive=receive)


def _allgather(rank: int, p: int, layout: ChunkLayout, c: int) -> list[Action]:
    pc = layout.per_channel
    own = _spans([layout.index(0, c)], pc)
    if p == 1:
        return copies(Buffer.INPUT, own, Buffer.OUTPUT, own)
    base = c * p * pc
    actions = copies(Buffer.INPUT, own, Buffer.SCRATCH, _spans([base], pc))
    d = 1
    while d < p:
        count = min(d, p - d) * pc
        actions += _message((rank - d) % p, base, count, layout.chunks, receive=False)
        actions += _message((rank + d) % p, base + d * pc, count, layout.chunks, receive=True)
        d *= 2
    positions = np.arange(p)
    blocks = (rank + positions) % p
    return actions + copies(
        Buffer.SCRATCH,
        _spans(base + positions * pc, pc),
        Buffer.OUTPUT,
        _spans(layout.index(blocks, c), pc),
    )


def _alltoall(rank: int, p: int, layout: ChunkLayout, c: int) -> list[Action]:
    pc = layout.per_channel
    positions = np.arange(p)
    slots = max(
        (int(np.count_nonzero(positions & (1 << s))) for s in range((p - 1).bit_length())),
        default=0,
    )
    tmp = c * (p + 2 * slots) * pc
    send_at, recv_at = tmp + p * pc, tmp + (p + slots) * pc
    at = tmp + positions * pc
    own = _spans([layout.index(rank, c)], pc)
    actions = copies(Buffer.INPUT, own, Buffer.OUTPUT, own)
    actions += copies(
        Buffer.INPUT,
        _spans(layout.index((rank + positions[1:]) % p, c), pc),
        Buffer.SCRATCH,
        _spans(at[1:], pc),
    )
    d = 1
    while d < p:
        moving = at[(positions & d) != 0]
        staged = np.arange(len(moving)) * pc
        actions += copies(
            Buffer.SCRATCH, _spans(moving, pc), Buffer.SCRATCH, _spans(send_at + staged, pc)
        )
        actions += _message((rank + d) % p, send_at, len(moving) * pc, layout.chunks, receive=False)
        actions += _message((rank - d) % p, recv_at, len(moving) * pc, layout.chunks, receive=True)
        actions += copies(
            Buffer.SCRATCH, _spans(recv_at + staged, pc), Buffer.SCRATCH, _spans(moving, pc)
        )
        d *= 2
    sources = (rank - positions[1:]) % p
    return actions + copies(
        Buffer.SCRATCH, _spans(at[1:], pc), Buffer.OUTPUT, _spans(layout.index(sources, c), pc)
    )


def generate(
    collective: Collective, nranks: int, *, chunks: int, channels: int, root: int | None
) -> Program:
    """The Bruck program of ``collective`` (allgather or alltoall) on ``nranks`` ranks;
    ``cf = chunks * channels``."""
    layout = ChunkLayout(1, chunks, channels)
    b = ProgramBuilder(
        collective,
        nranks,
        chunk_factor=layout.cf,
        name="bruck",
        params={"chunks": chunks, "channels": channels},
    )
    per_rank = _allgather if collective is Collective.ALLGATHER else _alltoall
    for rank in range(nranks):
        for c in range(channels):
            emit_eager(b, rank, c, per_rank(rank, nranks, layout, c))
    return b.build()


register(
    [Collective.ALLGATHER],
    "bruck",
    generate,
    "ceil(lg p) steps for any p, final local rotation: ceil(lg p)*a + (p-1)/p*n*b",
)
register(
    [Collective.ALLTOALL],
    "bruck",
    generate,
    "ceil(lg p) steps of packed blocks with local rotations: ~ceil(lg p)*(a + n/2*b)",
)
