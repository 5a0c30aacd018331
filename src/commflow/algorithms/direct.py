"""Direct (one-shot) algorithms: every piece of data goes straight from the rank that has it
to every rank that needs it, each rank pair on its own channel (Thakur, Rabenseifner & Gropp
2005 discuss them as the latency-optimal, bandwidth-heavy baseline).

Rank ``r`` talks to ``r+d`` and ``r-d`` (mod ``p``, ``d = 1..p-1``) on channel
``c*(p-1) + d-1`` for data channel ``c``, so the ``p-1`` exchanges of a rank run concurrently
and nothing can deadlock. Reductions of several incoming messages into one chunk are ordered
by dependencies (``d = 1`` first). Costs on a fully connected network, ``p`` ranks, ``n``
bytes, ``chunks = channels = 1``:

- allreduce: ``α + nβ`` (each rank sends its whole array to every other rank: ``(p-1)``
  messages of ``n`` bytes per rank) plus ``(p-1)nγ`` of local reduction;
- allgather, reducescatter, alltoall, gather, scatter: ``α + n/p·β``;
- broadcast, reduce: ``α + nβ``.

``chunks`` cuts every message into that many pieces (separate messages).
"""

from __future__ import annotations

from commflow.algorithms.common import ChunkLayout
from commflow.algorithms.registry import register
from commflow.collectives import Collective, buffer_shape, check_root
from commflow.ir import Program, ProgramBuilder, StepId, inp, out


def _channel(p: int, c: int, d: int) -> int:
    """Channel of data channel ``c`` for the exchange at distance ``d`` (local copies: d=1)."""
    return c * max(p - 1, 1) + max(d - 1, 0)


def _talks(collective: Collective, root: int | None, src: int, dst: int) -> bool:
    """Whether ``src`` sends to ``dst`` (one-to-all from the root, all-to-one to the root,
    else all pairs)."""
    if collective in (Collective.BROADCAST, Collective.SCATTER):
        return src == root
    if collective in (Collective.REDUCE, Collective.GATHER):
        return dst == root
    return True


def direct_program(
    collective: Collective, p: int, root: int | None, layout: ChunkLayout, params: dict[str, object]
) -> Program:
    """The direct program of ``collective``; ``layout.base`` must be 1.

    A message from ``src`` to ``dst`` carries input block ``dst`` (or block 0 when the input
    is one block) into output block ``src`` (or block 0), received with a reduction when the
    collective reduces. Ranks whose output holds their own data copy it locally.
    """
    cf, k = layout.cf, layout.chunks
    shape = buffer_shape(collective, p, cf)
    multi_in, multi_out = shape.input > cf, shape.output > cf
    b = ProgramBuilder(collective, p, chunk_factor=cf, name="direct", root=root, params=params)
    last: dict[tuple[int, int], StepId] = {}
    for c in range(layout.channels):
        for d in range(1, p):
            ch = _channel(p, c, d)
            for r in range(p):
                dst, src = (r + d) % p, (r - d) % p
                first_in = (dst if multi_in else 0) * cf + c * layout.per_channel
                if _talks(collective, root, r, dst):
                    for j in range(k):
                        b.send(r, dst, inp(first_in + j), channel=ch)
                if not _talks(collective, root, src, r):
                    continue
                own_in = (r if multi_in else 0) * cf + c * layout.per_channel
                first_out = (src if multi_out else 0) * cf + c * layout.per_channel
                for j in range(k):
                    x = first_out + j
                    if not collective.reduces:
                        b.recv(r, src, out(x), channel=ch)
                        continue
                    prev = last.get((r, x))
                    operand = inp(own_in + j) if prev is None else out(x)
                    last[(r, x)] = b.recv_reduce(
                        r, src, operand, out(x), channel=ch, deps=() if prev is None else (prev,)
                    )
        _own_copies(b, collective, p, root, layout, c)
    return b.build()


def _own_copies(
    b: ProgramBuilder, collective: Collective, p: int, root: int | None, layout: ChunkLayout, c: int
) -> None:
    """Copy each rank's own data into its output where the collective needs it there."""
    cf = layout.cf
    shape = buffer_shape(collective, p, cf)
    for r in range(p):
        if (collective.reduces and p > 1) or (collective.rooted and r != root):
            continue
        src = (r if shape.input > cf else 0) * cf + c * layout.per_channel
        dst = (r if shape.output > cf else 0) * cf + c * layout.per_channel
        b.copy(
            r, inp(src, layout.per_channel), out(dst, layout.per_channel), channel=_channel(p, c, 1)
        )


def generate(
    collective: Collective, nranks: int, *, chunks: int, channels: int, root: int | None
) -> Program:
    """The direct program of ``collective`` on ``nranks`` ranks; ``cf = chunks * channels``."""
    params: dict[str, object] = {"chunks": chunks, "channels": channels}
    return direct_program(
        collective,
        nranks,
        check_root(collective, nranks, root),
        ChunkLayout(1, chunks, channels),
        params,
    )


register(
    [Collective.ALLREDUCE],
    "direct",
    generate,
    "every rank sends its array to every other rank, reduces locally: a + n*b + (p-1)n*g",
)
register(
    [Collective.BROADCAST, Collective.REDUCE],
    "direct",
    generate,
    "root sends to (receives from) every rank at once: a + n*b",
)
register(
    [
        Collective.ALLGATHER,
        Collective.REDUCESCATTER,
        Collective.ALLTOALL,
        Collective.GATHER,
        Collective.SCATTER,
    ],
    "direct",
    generate,
    "every block straight to its destination, all pairs at once: a + n/p*b",
)
