"""Pairwise-exchange alltoall (Thakur, Rabenseifner & Gropp 2005, section 3.5).

In step ``k = 1 .. p-1`` rank ``r`` sends its block for ``r+k`` to that rank and receives
the block of ``r-k`` (mod ``p``); its own block is a local copy. One exchange at a time per
channel, so every rank sends and receives exactly one message per step: ``(p-1)(α + n/p·β)``
for ``n`` bytes (a rank's send buffer), ``chunks = channels = 1``. ``chunks`` cuts every
block into that many messages; ``channels`` runs that many exchanges on disjoint parts of
every block.
"""

from __future__ import annotations

from commflow.algorithms.common import ChunkLayout
from commflow.algorithms.registry import register
from commflow.collectives import Collective
from commflow.ir import Program, ProgramBuilder, inp, out


def generate(
    collective: Collective, nranks: int, *, chunks: int, channels: int, root: int | None
) -> Program:
    """The pairwise alltoall on ``nranks`` ranks; ``cf = chunks * channels``."""
    layout = ChunkLayout(1, chunks, channels)
    p, pc = nranks, layout.per_channel
    b = ProgramBuilder(
        collective,
        p,
        chunk_factor=layout.cf,
        name="pairwise",
        params={"chunks": chunks, "channels": channels},
    )
    for r in range(p):
        for c in range(channels):
            own = layout.index(r, c)
            b.copy(r, inp(own, pc), out(own, pc), channel=c)
            for k in range(1, p):
                dst, src = (r + k) % p, (r - k) % p
                for j in range(chunks):
                    b.send(r, dst, inp(layout.index(dst, c, 0, j)), channel=c)
                    b.recv(r, src, out(layout.index(src, c, 0, j)), channel=c)
    return b.build()


register(
    [Collective.ALLTOALL],
    "pairwise",
    generate,
    "p-1 exchanges, step k sends to r+k and receives from r-k: (p-1)(a + n/p*b)",
)
