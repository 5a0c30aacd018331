"""Ring algorithms (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for
clusters of workstations"; Thakur, Rabenseifner & Gropp 2005).

Rank ``r`` sends to ``r+1`` and receives from ``r-1`` (mod ``p``). Costs for ``p`` ranks,
``n`` bytes, ``chunks = channels = 1`` (α latency, β seconds/byte, γ reduction seconds/byte):

- allreduce: reduce-scatter then allgather around the ring, the array cut into ``p``
  segments: ``2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ``;
- allgather: ``(p-1)α + (p-1)/p·nβ``; reducescatter: ``(p-1)α + (p-1)/p·n(β+γ)``;
- broadcast, reduce: a chain from (to) the root along the ring, pipelined in ``k = chunks``
  pieces: ``(p-2+k)(α + n/k·β)``.

``chunks`` cuts every segment into that many messages; a rank forwards piece ``j`` as soon as
it has it, before receiving piece ``j+1``. ``channels`` runs that many rings, each on its own
part of every block. Allreduce, allgather and reducescatter are generated column-wise with
numpy (a 1024-rank ring allreduce with 8 chunks has 33 million steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commflow.algorithms.common import ChunkLayout, copy, emit_eager, recv, recv_reduce, send
from commflow.algorithms.registry import register
from commflow.collectives import Collective, check_root
from commflow.ir import Buffer, Op, Program, ProgramBuilder, inp, make_program, out, scr

_NONE = -1


@dataclass(frozen=True)
class _Operand:
    """Per template entry: buffer (-1: absent), and chunk ``((r + a) mod p) * m + b`` on rank
    ``r`` with ``b = channel * per_channel + piece``."""

    buf: np.ndarray
    a: np.ndarray
    m: np.ndarray
    piece: np.ndarray


@dataclass(frozen=True)
class _Template:
    """One channel's steps, the same on every rank up to a rotation of blocks; ``shift`` is the
    peer offset (``r + shift``), 0 for local steps; ``count`` in chunks."""

    op: np.ndarray
    shift: np.ndarray
    count: np.ndarray
    src: _Operand
    dst: _Operand

    @staticmethod
    def concat(first: _Template, second: _Template) -> _Template:
        """``first``'s steps, then ``second``'s."""

        def cat(x: _Operand, y: _Operand) -> _Operand:
            return _Operand(
                *(
                    np.concatenate((getattr(x, f), getattr(y, f)))
                    for f in ("buf", "a", "m", "piece")
                )
            )

        return _Template(
            np.concatenate((first.op, second.op)),
            np.concatenate((first.shift, second.shift)),
            np.concatenate((first.count, second.count)),
            cat(first.src, second.src),
            cat(first.dst, second.dst),
        )


def _ring_order(nsteps: int, chunks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Channel order of ``nsteps`` ring steps of ``chunks`` pieces: ``send(0, j)`` for every
    piece, then per step ``t`` and piece ``j`` ``recv(t, j)`` followed by ``send(t+1, j)`` (the
    forward of what just arrived). Returns ``(t, j, is_send)`` per entry."""
    t = np.repeat(np.arange(nsteps), 2 * chunks)
    j = np.tile(np.repeat(np.arange(chunks), 2), nsteps)
    is_send = np.tile(np.array([False, True]), nsteps * chunks)
    t = t + is_send
    keep = t < nsteps
    first = chunks if nsteps else 0
    return (
        np.concatenate((np.zeros(first, dtype=np.int64), t[keep])),
        np.concatenate((np.arange(first), j[keep])),
        np.concatenate((np.ones(first, dtype=bool), is_send[keep])),
    )


def _pass(collective: Collective, p: int, layout: ChunkLayout) -> _Template:
    """The ring pass: ``2(p-1)`` steps for allreduce, ``p-1`` for allgather/reducescatter.

    Allreduce segments (parts of block 0, ``m = chunks``): reduce-scatter step ``t`` sends
    ``r-t`` and reduces ``r-t-1`` into the output; allgather step ``u = t-(p-1)`` sends
    ``r+1-u`` and receives ``r-u``. Allgather step ``t`` sends block ``r-t``, receives
    ``r-t-1``. Reducescatter step ``t`` sends block ``r-t-1`` and reduces ``r-t-2``; partial
    sums wait in scratch at their input index, the last one (block ``r``) goes to the output.
    """
    nsteps = 2 * (p - 1) if collective is Collective.ALLREDUCE else p - 1
    t, j, is_send = _ring_order(nsteps, layout.chunks)
    later = is_send & (t > 0)
    if collective is Collective.ALLREDUCE:
        ag = t >= p - 1
        send_a = np.where(ag, p - t, -t)
        recv_a = np.where(ag, p - 1 - t, -t - 1)
        recv_op = np.where(ag, Op.RECV, Op.RECV_REDUCE)
        src_buf = np.where(
            is_send, np.where(later, Buffer.OUTPUT, Buffer.INPUT), np.where(ag, _NONE, Buffer.INPUT)
        )
        dst_buf = np.full(len(t), Buffer.OUTPUT)
        m_src = m_dst = np.full(len(t), layout.chunks)
    elif collective is Collective.ALLGATHER:
        send_a, recv_a = -t, -t - 1
        recv_op = np.full(len(t), Op.RECV)
        src_buf = np.where(is_send, np.where(later, Buffer.OUTPUT, Buffer.INPUT), _NONE)
        dst_buf = np.full(len(t), Buffer.OUTPUT)
        m_src = np.where(later, layout.cf, 0)
        m_dst = np.full(len(t), layout.cf)
    else:
        send_a, recv_a = -t - 1, -t - 2
        last = t == nsteps - 1
        recv_op = np.full(len(t), Op.RECV_REDUCE)
        src_buf = np.where(later, Buffer.SCRATCH, Buffer.INPUT)
        dst_buf = np.where(last, Buffer.OUTPUT, Buffer.SCRATCH)
        m_src = np.full(len(t), layout.cf)
        m_dst = np.where(last, 0, layout.cf)
    src = _Operand(src_buf, np.where(is_send, send_a, recv_a), m_src, j)
    dst = _Operand(np.where(is_send, _NONE, dst_buf), recv_a, m_dst, j)
    return _Template(
        np.where(is_send, Op.SEND, recv_op),
        np.where(is_send, 1, -1),
        np.ones(len(t), dtype=np.int64),
        src,
        dst,
    )


def _copy_in(layout: ChunkLayout, out_m: int) -> _Template:
    """One local copy per channel of its part of the input block to output block ``r``
    (``out_m = cf``) or block 0 (``out_m = 0``)."""
    one = np.ones(1, dtype=np.int64)
    zero = 0 * one
    return _Template(
        np.array([Op.COPY]),
        zero,
        layout.per_channel * one,
        _Operand(Buffer.INPUT + zero, zero, zero, zero),
        _Operand(Buffer.OUTPUT + zero, zero, out_m + zero, zero),
    )


def _rotate(p: int, shift: np.ndarray, dtype: type) -> np.ndarray:
    """``(r + shift) mod p`` for every rank ``r`` (rows) and template entry (columns)."""
    x = np.arange(p, dtype=dtype)[:, None] + (shift % p).astype(dtype)
    np.subtract(x, p, out=x, where=x >= p)
    return x


def _offsets(p: int, layout: ChunkLayout, o: _Operand) -> np.ndarray:
    """Chunk offsets of one operand for all ranks and channels, flattened (rank, channel,
    entry); -1 where the operand is absent."""
    used = o.buf != _NONE
    chan = np.arange(layout.channels, dtype=np.int64)[:, None] * layout.per_channel
    b = np.where(used, chan + o.piece, _NONE)
    small = p * layout.cf < np.iinfo(np.int32).max
    x = _rotate(p, o.a, np.int32 if small else np.int64)
    x *= np.where(used, o.m, 0).astype(x.dtype)
    result = np.empty((p, layout.channels, len(o.buf)), dtype=np.int64)
    np.add(x[:, None, :], b[None, :, :], out=result)
    return result.reshape(-1)


def _ring_program(
    collective: Collective, p: int, layout: ChunkLayout, params: dict[str, object]
) -> Program:
    """Generate the allreduce/allgather/reducescatter ring column-wise."""
    tmpl = _pass(collective, p, layout)
    if collective is Collective.ALLGATHER:
        tmpl = _Template.concat(_copy_in(layout, layout.cf), tmpl)
    elif p == 1:
        tmpl = _copy_in(layout, 0)
    size, c = len(tmpl.op), layout.channels
    reps = p * c
    ranks = np.arange(p, dtype=np.int32)
    neighbours = np.stack(
        (np.roll(ranks, 1), np.full(p, _NONE, dtype=np.int32), np.roll(ranks, -1)), axis=1
    )
    peer = np.take(neighbours, tmpl.shift + 1, axis=1)
    columns = {
        "part": np.repeat(np.arange(p, dtype=np.int32), c * size),
        "chan": np.tile(np.repeat(np.arange(c, dtype=np.int32), size), p),
        "op": np.tile(tmpl.op.astype(np.int8), reps),
        "peer": np.broadcast_to(peer[:, None, :], (p, c, size)).reshape(-1),
        "src_buf": np.tile(tmpl.src.buf.astype(np.int8), reps),
        "src_off": _offsets(p, layout, tmpl.src),
        "dst_buf": np.tile(tmpl.dst.buf.astype(np.int8), reps),
        "dst_off": _offsets(p, layout, tmpl.dst),
        "count": np.tile(tmpl.count.astype(np.int32), reps),
    }
    return make_program(
        "ring", collective, p, chunk_factor=layout.cf, columns=columns, params=params
    )


def _chain_program(
    collective: Collective, p: int, root: int, layout: ChunkLayout, params: dict[str, object]
) -> Program:
    """Broadcast down (reduce up) the chain ``root, root+1, ..., root+p-1`` (mod ``p``), each
    channel's part of the array in ``chunks`` pipelined pieces. Reduce runs from ``root+1``
    towards the root, partial sums in scratch (non-root outputs are left untouched)."""
    b = ProgramBuilder(collective, p, chunk_factor=layout.cf, name="ring", root=root, params=params)
    k = layout.chunks
    for c in range(layout.channels):
        base = c * layout.per_channel
        for i in range(p):
            rank, prev, nxt = (root + i) % p, (root + i - 1) % p, (root + i + 1) % p
            actions = []
            if p == 1:
                actions.append(copy(inp(base, k), out(base, k)))
            elif collective is Collective.BROADCAST:
                if i == 0:
                    actions.append(copy(inp(base, k), out(base, k)))
                for x in range(base, base + k):
                    actions += [send(nxt, inp(x))] if i == 0 else [recv(prev, out(x))]
                    if 0 < i < p - 1:
                        actions.append(send(nxt, out(x)))
            else:
                for x in range(base, base + k):
                    if i == 1:
                        actions.append(send(nxt, inp(x)))
                    elif i == 0:
                        actions.append(recv_reduce(prev, inp(x), out(x)))
                    else:
                        actions += [recv_reduce(prev, inp(x), scr(x)), send(nxt, scr(x))]
            emit_eager(b, rank, c, actions)
    return b.build()


def generate(
    collective: Collective, nranks: int, *, chunks: int, channels: int, root: int | None
) -> Program:
    """The ring program of ``collective`` on ``nranks`` ranks (see the module docstring).

    Allreduce has ``cf = nranks * chunks * channels`` chunks (``nranks`` segments per
    channel); the others have ``cf = chunks * channels``.
    """
    params: dict[str, object] = {"chunks": chunks, "channels": channels}
    if collective in (Collective.BROADCAST, Collective.REDUCE):
        root = check_root(collective, nranks, root)
        return _chain_program(collective, nranks, root, ChunkLayout(1, chunks, channels), params)
    base = nranks if collective is Collective.ALLREDUCE else 1
    return _ring_program(collective, nranks, ChunkLayout(base, chunks, channels), params)


register(
    [Collective.ALLREDUCE],
    "ring",
    generate,
    "reduce-scatter + allgather around a ring: 2(p-1)a + 2(p-1)/p*n*b + (p-1)/p*n*g",
)
register([Collective.ALLGATHER], "ring", generate, "ring allgather: (p-1)a + (p-1)/p*n*b")
register(
    [Collective.REDUCESCATTER], "ring", generate, "ring reduce-scatter: (p-1)a + (p-1)/p*n*(b+g)"
)
register(
    [Collective.BROADCAST, Collective.REDUCE],
    "ring",
    generate,
    "pipelined chain along the ring from/to the root: (p-2+k)(a + n/k*b), k = chunks",
)
