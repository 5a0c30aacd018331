"""Recursive doubling (Thakur, Rabenseifner & Gropp 2005, section 4).

In step ``s`` rank ``q`` exchanges with ``q xor 2^s`` everything it has so far, so after
``lg p`` steps every rank has everything. Costs for ``p`` a power of two, ``n`` bytes,
``chunks = channels = 1``:

- allgather: ``lg p·α + (p-1)/p·nβ`` (step ``s`` sends ``2^s`` blocks in one message);
- allreduce: full vectors exchanged and reduced, ``lg p·(α + nβ + nγ)``.

Other ``p`` fold (:class:`~commflow.algorithms.common.Fold`): the first ``2r`` ranks
(``r = p - 2^⌊lg p⌋``) pair up, the even rank of each pair hands its data to the odd one
(``α + n/p·β`` for allgather, ``α + nβ`` for allreduce), the ``2^⌊lg p⌋`` remaining ranks run
the algorithm, and the odd ranks hand the whole result back (``α + nβ``).

``chunks`` cuts every contiguous run of a message into that many messages; a rank forwards a
piece as soon as it has it. ``channels`` splits every block; with ``channels > 1`` a
channel's part of consecutive blocks is not contiguous, so its messages go block by block.
"""

from __future__ import annotations

from collections.abc import Callable

from commflow.algorithms.common import Action, ChunkLayout, Fold, copy, emit_eager, transfer
from commflow.algorithms.registry import register
from commflow.collectives import Collective
from commflow.ir import Buffer, Program, ProgramBuilder, Ref

Runs = Callable[[int, int], list[tuple[int, int]]]


def doubling_steps(new: int, pof2: int) -> list[tuple[int, int, int]]:
    """Recursive doubling for new rank ``new`` of ``pof2``: per step ``(partner, held,
    size)``, where ``new`` holds new ranks ``held .. held+size-1`` and receives the partner's
    as many, starting at ``held xor size``."""
    steps, size = [], 1
    while size < pof2:
        steps.append((new ^ size, new & ~(size - 1), size))
        size *= 2
    return steps


def exchange(
    peer: int,
    runs: list[tuple[int, int]],
    src: Buffer,
    dst: Buffer,
    pieces: int,
    *,
    receive: bool,
    reduce_with: Buffer | None = None,
    dst_shift: int = 0,
) -> list[Action]:
    """One side of a message made of ``runs`` (``(start, count)`` chunk ranges of ``src``,
    landing at ``start + dst_shift`` in ``dst``), each run cut into ``pieces`` messages; a
    receive-reduce takes its local operand from ``reduce_with`` at the ``runs`` offsets."""
    actions: list[Action] = []
    for start, count in runs:
        at = start + dst_shift
        operand = None if reduce_with is None else Ref(reduce_with, start, count)
        actions += transfer(
            peer,
            Ref(src, start, count),
            Ref(dst, at, count),
            pieces,
            receive=receive,
            reduce_with=operand,
        )
    return actions


def doubling_actions(new: int, fold: Fold, runs: Runs, pieces: int) -> list[Action]:
    """Allgather by recursive doubling of the output ranges ``runs(new_lo, new_count)``."""
    actions: list[Action] = []
    for partner, held, size in doubling_steps(new, fold.pof2):
        peer = fold.old_rank(partner)
        actions += exchange(
            peer, runs(held, size), Buffer.OUTPUT, Buffer.OUTPUT, pieces, receive=False
        )
        actions += exchange(
            peer, runs(held ^ size, size), Buffer.OUTPUT, Buffer.OUTPUT, pieces, receive=True
        )
    return actions


def unfold(
    rank: int, fold: Fold, everything: list[tuple[int, int]], pieces: int, actions: list[Action]
) -> list[Action]:
    """End a folded rank's ``actions`` with the hand-back of the whole output (runs
    ``everything``): the odd rank of a pair sends it, the even one receives it."""
    partner = fold.partner(rank)
    if partner is None:
        return actions
    receive = fold.new_rank(rank) is None
    return actions + exchange(
        partner, everything, Buffer.OUTPUT, Buffer.OUTPUT, pieces, receive=receive
    )


def _allgather(rank: int, fold: Fold, layout: ChunkLayout, c: int) -> list[Action]:
    k, cf, p = layout.chunks, layout.cf, fold.nranks
    mine = [(s - rank * cf, n) for s, n in layout.runs(rank, 1, c)]
    partner = fold.partner(rank)
    if fold.new_rank(rank) is None:
        hand_over = exchange(partner, mine, Buffer.INPUT, Buffer.OUTPUT, k, receive=False)
        return unfold(rank, fold, layout.runs(0, p, c), k, hand_over)
    actions = []
    if partner is not None:
        actions += exchange(
            partner, layout.runs(partner, 1, c), Buffer.OUTPUT, Buffer.OUTPUT, k, receive=True
        )

    def runs(lo: int, count: int) -> list[tuple[int, int]]:
        first = fold.first_rank(lo)
        return layout.runs(first, fold.first_rank(lo + count) - first, c)

    actions += [
        copy(Ref(Buffer.INPUT, s, n), Ref(Buffer.OUTPUT, s + rank * cf, n)) for s, n in mine
    ]
    actions += doubling_actions(fold.new_rank(rank), fold, runs, k)
    return unfold(rank, fold, layout.runs(0, p, c), k, actions)


def folded_allreduce(
    rank: int,
    fold: Fold,
    whole: list[tuple[int, int]],
    pieces: int,
    body: Callable[[int, Buffer], list[Action]],
) -> list[Action]:
    """An allreduce of the vector ``whole`` (runs) around the fold: the even rank of a pair
    hands its input over and gets the result back, the odd one first reduces it into its
    output; ``body(new_rank, src)`` is the power-of-two algorithm, reading ``src`` (input, or
    output after a fold) in its first step. One rank copies input to output."""
    partner = fold.partner(rank)
    new = fold.new_rank(rank)
    if new is None:
        hand_over = exchange(partner, whole, Buffer.INPUT, Buffer.OUTPUT, pieces, receive=False)
        return unfold(rank, fold, whole, pieces, hand_over)
    if fold.nranks == 1:
        return [copy(Ref(Buffer.INPUT, s, n), Ref(Buffer.OUTPUT, s, n)) for s, n in whole]
    actions: list[Action] = []
    src = Buffer.INPUT
    if partner is not None:
        actions = exchange(
            partner,
            whole,
            Buffer.INPUT,
            Buffer.OUTPUT,
            pieces,
            receive=True,
            reduce_with=Buffer.INPUT,
        )
        src = Buffer.OUTPUT
    return unfold(rank, fold, whole, pieces, actions + body(new, src))


def _allreduce(rank: int, fold: Fold, layout: ChunkLayout, c: int) -> list[Action]:
    k = layout.chunks
    whole = layout.runs(0, 1, c)

    def exchanges(new: int, src: Buffer) -> list[Action]:
        actions: list[Action] = []
        for other, _, _ in doubling_steps(new, fold.pof2):
            peer = fold.old_rank(other)
            actions += exchange(peer, whole, src, Buffer.OUTPUT, k, receive=False)
            actions += exchange(peer, whole, src, Buffer.OUTPUT, k, receive=True, reduce_with=src)
            src = Buffer.OUTPUT
        return actions

    return folded_allreduce(rank, fold, whole, k, exchanges)


def generate(
    collective: Collective, nranks: int, *, chunks: int, channels: int, root: int | None
) -> Program:
    """The recursive-doubling program of ``collective`` (allgather or allreduce) on ``nranks``
    ranks; ``cf = chunks * channels``."""
    layout = ChunkLayout(1, chunks, channels)
    fold = Fold(nranks)
    b = ProgramBuilder(
        collective,
        nranks,
        chunk_factor=layout.cf,
        name="recursive_doubling",
        params={"chunks": chunks, "channels": channels},
    )
    per_rank = _allgather if collective is Collective.ALLGATHER else _allreduce
    for rank in range(nranks):
        for c in range(channels):
            emit_eager(b, rank, c, per_rank(rank, fold, layout, c))
    return b.build()


register(
    [Collective.ALLGATHER],
    "recursive_doubling",
    generate,
    "lg p steps, step s exchanges 2^s blocks: lg p*a + (p-1)/p*n*b (p a power of two)",
)
register(
    [Collective.ALLREDUCE],
    "recursive_doubling",
    generate,
    "lg p exchanges of the full vector: lg p*(a + n*b + n*g) (p a power of two)",
)
