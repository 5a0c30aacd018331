"""Helpers shared by the algorithm families.

- :class:`ChunkLayout`: where a block's chunks lie for a given pipelining depth (``chunks``) and
  channel count (``channels``): chunk index ``block*cf + channel*(cf//channels) + part*chunks +
  piece``, with ``cf = base * chunks * channels`` (``base``: the algorithm's own parts per
  block, e.g. ``nranks`` segments for a ring allreduce, 1 for an allgather).
- :func:`merge_runs` and :func:`split`: chunk runs contiguous on both sides of a message, and
  their cutting into pipelined pieces.
- :class:`Fold`: rank relabelling for non-power-of-two recursive algorithms (Thakur,
  Rabenseifner & Gropp 2005): the first ``2*extra`` ranks pair up, the even rank of each pair
  hands its data to the odd one and sits out.
- :class:`Action` (made by :func:`send`, :func:`recv`, :func:`recv_reduce`, :func:`copy`,
  :func:`transfer` for a message cut into pieces, :func:`copies` for merged local copies) and
  :func:`emit_eager`: a channel's steps written in logical order, emitted with every send
  moved as early as its data allows, so that pipelined pieces are forwarded on arrival.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from commflow.errors import AlgorithmError
from commflow.ir import Buffer, Op, ProgramBuilder, Ref, StepId

IntLike = int | np.ndarray


@dataclass(frozen=True)
class ChunkLayout:
    """Chunk layout of one block for ``chunks``-deep pipelining over ``channels`` channels.

    ``base`` is the number of parts the algorithm itself cuts a block into. Raises
    ``AlgorithmError`` when a field is below 1.
    """

    base: int
    chunks: int
    channels: int

    def __post_init__(self) -> None:
        if min(self.base, self.chunks, self.channels) < 1:
            raise AlgorithmError(f"bad chunk layout {self}: base, chunks and channels must be >= 1")

    @property
    def cf(self) -> int:
        """Chunks per block (the program's ``chunk_factor``)."""
        return self.base * self.chunks * self.channels

    @property
    def per_channel(self) -> int:
        """Chunks of one block owned by one channel."""
        return self.base * self.chunks

    def index(
        self, block: IntLike, channel: IntLike, part: IntLike = 0, piece: IntLike = 0
    ) -> IntLike:
        """Chunk index of ``piece`` of ``part`` of ``block`` on ``channel`` (ints or numpy
        arrays, broadcast together)."""
        return block * self.cf + channel * self.per_channel + part * self.chunks + piece

    def runs(self, first_block: int, nblocks: int, channel: int) -> list[tuple[int, int]]:
        """``(start, count)`` runs of the chunks ``channel`` owns in blocks
        ``first_block .. first_block+nblocks-1``: one run when ``channels == 1``, else one
        per block."""
        if self.channels == 1:
            return [(first_block * self.cf, nblocks * self.cf)]
        return [
            (self.index(b, channel), self.per_channel)
            for b in range(first_block, first_block + nblocks)
        ]


def merge_runs(
    src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray
) -> list[tuple[int, int, int]]:
    """Group parallel chunk indices (``src[i]`` goes to ``dst[i]``) into maximal runs that are
    contiguous on both sides: ``[(src_start, dst_start, count), ...]`` in input order."""
    s = np.asarray(src, dtype=np.int64)
    d = np.asarray(dst, dtype=np.int64)
    if s.shape != d.shape or s.ndim != 1:
        raise AlgorithmError("merge_runs needs two flat index sequences of equal length")
    if len(s) == 0:
        return []
    breaks = np.flatnonzero((np.diff(s) != 1) | (np.diff(d) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    counts = np.diff(np.concatenate((starts, [len(s)])))
    return list(zip(s[starts].tolist(), d[starts].tolist(), counts.tolist(), strict=True))


def split(ref: Ref, pieces: int) -> list[Ref]:
    """Cut ``ref`` into ``min(pieces, ref.count)`` contiguous references of near-equal size
    (the first ones one chunk larger), in order."""
    n = min(pieces, ref.count)
    size, extra = divmod(ref.count, n)
    out, start = [], ref.index
    for k in range(n):
        count = size + (k < extra)
        out.append(Ref(ref.buffer, start, count))
        start += count
    return out


@dataclass(frozen=True)
class Fold:
    """Relabelling of ``nranks`` ranks onto the largest power of two ``pof2 <= nranks``.

    Ranks ``0 .. 2*extra-1`` pair up as ``(2i, 2i+1)``: the even rank hands its data to the
    odd one, which acts as new rank ``i``; rank ``r >= 2*extra`` is new rank ``r - extra``.
    New ranks cover consecutive old ranks, so a range of new ranks is a contiguous range of
    old blocks.
    """

    nranks: int

    def __post_init__(self) -> None:
        if self.nranks < 1:
            raise AlgorithmError(f"cannot fold {self.nranks} ranks: need at least 1")

    @property
    def pof2(self) -> int:
        """Ranks that take part in the power-of-two algorithm."""
        return 1 << (self.nranks.bit_length() - 1)

    @property
    def extra(self) -> int:
        """Ranks that sit out (``nranks - pof2``)."""
        return self.nranks - self.pof2

    def new_rank(self, rank: int) -> int | None:
        """New rank of ``rank``, or ``None`` if it sits out."""
        if rank < 2 * self.extra:
            return None if rank % 2 == 0 else rank // 2
        return rank - self.extra

    def old_rank(self, new: int) -> int:
        """The rank acting as new rank ``new``."""
        return 2 * new + 1 if new < self.extra else new + self.extra

    def first_rank(self, new: int) -> int:
        """Lowest old rank covered by new rank ``new`` (``nranks`` for ``new == pof2``); new
        ranks ``a .. b-1`` cover old ranks ``first_rank(a) .. first_rank(b)-1``."""
        return 2 * new if new < self.extra else new + self.extra

    def partner(self, rank: int) -> int | None:
        """The other rank of ``rank``'s pair, or ``None`` if it is not paired."""
        return rank ^ 1 if rank < 2 * self.extra else None


@dataclass(frozen=True)
class Action:
    """A step of one channel before ordering (see :func:`emit_eager`); ``peer`` is -1 for
    local steps. Fields mean what they mean in :class:`~commflow.ir.Step`."""

    op: Op
    src: Ref | None = None
    dst: Ref | None = None
    peer: int = -1


def send(peer: int, src: Ref) -> Action:
    """Send ``src`` to ``peer``."""
    return Action(Op.SEND, src, None, peer)


def recv(peer: int, dst: Ref) -> Action:
    """Receive from ``peer`` into ``dst``."""
    return Action(Op.RECV, None, dst, peer)


def recv_reduce(peer: int, src: Ref, dst: Ref) -> Action:
    """Receive from ``peer``, reduce with local ``src``, write ``dst``."""
    return Action(Op.RECV_REDUCE, src, dst, peer)


def copy(src: Ref, dst: Ref) -> Action:
    """Local copy ``src -> dst``."""
    return Action(Op.COPY, src, dst)


def transfer(
    peer: int, src: Ref, dst: Ref, pieces: int, *, reduce_with: Ref | None = None, receive: bool
) -> list[Action]:
    """One side of a message cut into ``pieces`` pipelined messages: the sends of ``src`` when
    not ``receive``, else the receives into ``dst`` (receive-reduces with local
    ``reduce_with`` when given). Both sides must pass equal-sized ``src`` and ``dst``."""
    if not receive:
        return [send(peer, s) for s in split(src, pieces)]
    dsts = split(dst, pieces)
    if reduce_with is None:
        return [recv(peer, d) for d in dsts]
    return [recv_reduce(peer, w, d) for w, d in zip(split(reduce_with, pieces), dsts, strict=True)]


def copies(
    src: Buffer,
    src_idx: Sequence[int] | np.ndarray,
    dst: Buffer,
    dst_idx: Sequence[int] | np.ndarray,
) -> list[Action]:
    """Local copies moving chunk ``src_idx[i]`` of ``src`` to ``dst_idx[i]`` of ``dst``, one
    copy per run contiguous on both sides."""
    return [copy(Ref(src, s, n), Ref(dst, d, n)) for s, d, n in merge_runs(src_idx, dst_idx)]


def emit_eager(
    builder: ProgramBuilder, rank: int, channel: int, actions: Sequence[Action]
) -> list[StepId]:
    """Add ``actions`` (one channel's steps in logical order) to ``builder``.

    Non-send steps keep their order; each send moves as early as the data it reads allows
    (right after the last earlier step writing any of its chunks). Sends keep their relative
    order, so FIFO matching per peer is unchanged, and no send overtakes a step that writes
    data it reads. Returns the step ids in emitted order.
    """
    refs = [r for a in actions for r in (a.src, a.dst) if r is not None]
    size = max((r.index + r.count for r in refs), default=0)
    last_write = np.full((len(Buffer), size), -1, dtype=np.int64)
    sends: list[tuple[int, Action]] = []
    others: list[Action] = []
    for a in actions:
        if a.op is Op.SEND:
            ready = int(last_write[a.src.buffer, a.src.index : a.src.index + a.src.count].max())
            sends.append((ready, a))
        else:
            last_write[a.dst.buffer, a.dst.index : a.dst.index + a.dst.count] = len(others)
            others.append(a)
    ids: list[StepId] = []
    j = 0
    for ready, a in sends:
        while j <= ready:
            ids.append(_add(builder, rank, channel, others[j]))
            j += 1
        ids.append(_add(builder, rank, channel, a))
    ids += [_add(builder, rank, channel, a) for a in others[j:]]
    return ids


def _add(builder: ProgramBuilder, rank: int, channel: int, a: Action) -> StepId:
    if a.op is Op.SEND:
        return builder.send(rank, a.peer, a.src, channel=channel)
    if a.op is Op.RECV:
        return builder.recv(rank, a.peer, a.dst, channel=channel)
    if a.op is Op.RECV_REDUCE:
        return builder.recv_reduce(rank, a.peer, a.src, a.dst, channel=channel)
    if a.op is Op.COPY:
        return builder.copy(rank, a.src, a.dst, channel=channel)
    return builder.reduce(rank, a.src, a.dst, channel=channel)
