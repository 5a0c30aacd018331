"""Recursive halving and doubling (Rabenseifner 2004; Thakur, Rabenseifner & Gropp 2005).

Reduce-scatter by recursive halving: in step ``s`` rank ``q`` exchanges with
``q xor p/2^(s+1)``, sends the half of its current range that the partner keeps and reduces the
half it keeps, so the range halves each step. Allreduce is that reduce-scatter followed by a
recursive-doubling allgather (Rabenseifner's algorithm). Costs for ``p`` a power of two,
``n`` bytes, ``chunks = channels = 1``:

- reducescatter: ``lg p·α + (p-1)/p·n(β+γ)``;
- allreduce: ``2 lg p·α + 2(p-1)/p·nβ + (p-1)/p·nγ``.

Other ``p`` fold as in Thakur et al.: the first ``2r`` ranks (``r = p - 2^⌊lg p⌋``) pair up,
the even rank sends its whole input to the odd one, which reduces it (``α + n(β+γ)``); the
``2^⌊lg p⌋`` others run the algorithm (for allreduce on ``2^⌊lg p⌋`` segments, for
reducescatter on the blocks each covers) and the odd ranks send the even ones their result
(``α + nβ`` for allreduce, ``α + n/p·β`` for reducescatter).

``chunks`` and ``channels`` behave as in :mod:`commflow.algorithms.recursive_doubling`.
"""

from __future__ import annotations

from commflow.algorithms.common import Action, ChunkLayout, Fold, copy, emit_eager
from commflow.algorithms.recursive_doubling import (
    Runs,
    doubling_actions,
    exchange,
    folded_allreduce,
)
from commflow.algorithms.registry import register
from commflow.collectives import Collective
from commflow.ir import Buffer, Program, ProgramBuilder, Ref


def halving_steps(new: int, pof2: int) -> list[tuple[int, int, int, int]]:
    """Recursive halving for new rank ``new`` of ``pof2``: per step ``(partner, sent, kept,
    half)``: new ranks ``sent .. sent+half-1`` go to the partner, ``kept .. kept+half-1`` stay
    (reduced with what the partner sends). After the last step ``new`` keeps only itself."""
    steps, lo, half = [], 0, pof2 // 2
    while half:
        upper = bool(new & half)
        kept, sent = (lo + half, lo) if upper else (lo, lo + half)
        steps.append((new ^ half, sent, kept, half))
        lo, half = kept, half // 2
    return steps


def halving_actions(
    new: int,
    fold: Fold,
    runs: Runs,
    pieces: int,
    src: Buffer,
    acc: Buffer,
    last_dst_shift: int | None = None,
) -> list[Action]:
    """Reduce-scatter by recursive halving of the ranges ``runs(new_lo, new_count)``, read from
    ``src`` in the first step and accumulated in ``acc``. With ``last_dst_shift`` the last
    step's result lands in the output, shifted by that many chunks."""
    actions: list[Action] = []
    steps = halving_steps(new, fold.pof2)
    for i, (partner, sent, kept, half) in enumerate(steps):
        peer = fold.old_rank(partner)
        last = i == len(steps) - 1 and last_dst_shift is not None
        actions += exchange(peer, runs(sent, half), src, acc, pieces, receive=False)
        actions += exchange(
            peer,
            runs(kept, half),
            src,
            Buffer.OUTPUT if last else acc,
            pieces,
            receive=True,
            reduce_with=src,
            dst_shift=last_dst_shift if last else 0,
        )
        src = acc
    return actions


def _reducescatter(rank: int, fold: Fold, layout: ChunkLayout, c: int) -> list[Action]:
    k, cf, p = layout.chunks, layout.cf, fold.nranks
    everything = layout.runs(0, p, c)
    partner = fold.partner(rank)
    new = fold.new_rank(rank)
    if p == 1:
        return [copy(Ref(Buffer.INPUT, s, n), Ref(Buffer.OUTPUT, s, n)) for s, n in everything]
    if new is None:
        return exchange(
            partner, everything, Buffer.INPUT, Buffer.SCRATCH, k, receive=False
        ) + exchange(
            partner,
            layout.runs(rank, 1, c),
            Buffer.SCRATCH,
            Buffer.OUTPUT,
            k,
            receive=True,
            dst_shift=-rank * cf,
        )

    def runs(lo: int, count: int) -> list[tuple[int, int]]:
        first = fold.first_rank(lo)
        return layout.runs(first, fold.first_rank(lo + count) - first, c)

    if partner is None:
        return halving_actions(
            new, fold, runs, k, Buffer.INPUT, Buffer.SCRATCH, last_dst_shift=-rank * cf
        )
    actions = exchange(
        partner, everything, Buffer.INPUT, Buffer.SCRATCH, k, receive=True, reduce_with=Buffer.INPUT
    )
    actions += halving_actions(new, fold, runs, k, Buffer.SCRATCH, Buffer.SCRATCH)
    actions += [
        copy(Ref(Buffer.SCRATCH, s, n), Ref(Buffer.OUTPUT, s - rank * cf, n))
        for s, n in layout.runs(rank, 1, c)
    ]
    return actions + exchange(
        partner, layout.runs(partner, 1, c), Buffer.SCRATCH, Buffer.OUTPUT, k, receive=False
    )


def _allreduce(rank: int, fold: Fold, layout: ChunkLayout, c: int) -> list[Action]:
    k = layout.chunks

    def runs(lo: int, count: int) -> list[tuple[int, int]]:
        return [(layout.index(0, c, lo), count * k)]

    def rabenseifner(new: int, src: Buffer) -> list[Action]:
        return halving_actions(new, fold, runs, k, src, Buffer.OUTPUT) + doubling_actions(
            new, fold, runs, k
        )

    return folded_allreduce(rank, fold, layout.runs(0, 1, c), k, rabenseifner)


def generate(
    collective: Collective, nranks: int, *, chunks: int, channels: int, root: int | None
) -> Program:
    """The halving-doubling program of ``collective`` (reducescatter or allreduce) on
    ``nranks`` ranks. Reducescatter has ``cf = chunks * channels``; allreduce cuts the array
    into ``2^⌊lg p⌋`` segments, ``cf = 2^⌊lg p⌋ * chunks * channels``."""
    fold = Fold(nranks)
    base = fold.pof2 if collective is Collective.ALLREDUCE else 1
    layout = ChunkLayout(base, chunks, channels)
    b = ProgramBuilder(
        collective,
        nranks,
        chunk_factor=layout.cf,
        name="halving_doubling",
        params={"chunks": chunks, "channels": channels},
    )
    per_rank = _allreduce if collective is Collective.ALLREDUCE else _reducescatter
    for rank in range(nranks):
        for c in range(channels):
            emit_eager(b, rank, c, per_rank(rank, fold, layout, c))
    return b.build()


register(
    [Collective.REDUCESCATTER],
    "halving_doubling",
    generate,
    "recursive halving: lg p*a + (p-1)/p*n*(b+g) (p a power of two)",
)
register(
    [Collective.ALLREDUCE],
    "halving_doubling",
    generate,
    "Rabenseifner: halving reduce-scatter + doubling allgather: "
    "2 lg p*a + 2(p-1)/p*n*b + (p-1)/p*n*g (p a power of two)",
)
