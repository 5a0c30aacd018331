"""Quantized allreduce on a live Communicator: reduce-scatter then allgather, both compressed.

Each rank encodes its ``n`` shards (shard ``j`` goes to rank ``j``), exchanges them with one
alltoall of bytes, decodes and sums the ``n`` contributions to its shard in float32, encodes the
reduced shard and allgathers the bytes. Bytes sent per rank: ``2 (n-1) B`` for a shard encoded
in ``B`` bytes, against ``2 (n-1) 4 S`` for a float32 ring on shards of ``S`` elements.

Error bound (int codecs, per element, exact arithmetic): ``|result - exact| <= sum_r s_r / 2 +
s_red / 2``, where ``s_r`` is rank r's scale for the element's block and ``s_red`` the scale of
the reduced block (``bound`` returns it); float32 sums add at most a few ulps of the sum.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from commflow.compress import kernels
from commflow.compress.codecs import _QMAX, Codec, ErrorFeedback, decode, encode
from commflow.errors import CommflowError

_PIECE_BYTES = 16 << 20
"""Encoded bytes per pipelined piece that ``quantized_allreduce`` aims at by default."""

_ARENAS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per communicator, the exchange buffers of its last quantized allreduce (reused)."""
_ARENAS_LOCK = threading.Lock()


def _arena(comm, nbytes: int) -> np.ndarray:
    """``nbytes`` of exchange buffer: the last call's on ``comm`` when large enough (its pages
    are mapped already: fresh ones cost a fault and zeroing each), else a new one. A call
    running at the same time on another thread finds none and takes its own."""
    with _ARENAS_LOCK:
        try:
            buf = _ARENAS.pop(comm, None)
        except TypeError:  # a communicator without weak references: nothing kept
            buf = None
    return buf if buf is not None and buf.size >= nbytes else np.empty(nbytes, np.uint8)


def _keep(comm, buf: np.ndarray) -> None:
    with _ARENAS_LOCK, contextlib.suppress(TypeError):  # TypeError: see _arena
        _ARENAS[comm] = buf


@dataclass(frozen=True)
class AllreduceStats:
    """What one compressed allreduce cost."""

    bytes_sent: int
    """Bytes this rank sent (alltoall plus allgather payloads, not counting itself)."""
    float32_bytes: int
    """Bytes a float32 ring allreduce of the same array sends per rank."""
    relative_error: float | None
    """``||result - exact|| / ||exact||`` when asked for (an extra float32 allreduce), else None."""


def _shard(n: int, nranks: int, block: int) -> int:
    return max(1, -(-n // (nranks * block))) * block


def _pieces(shard: int, block: int, pieces: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` element ranges cutting a shard into at most ``pieces`` whole blocks."""
    bounds = np.linspace(0, shard // block, min(pieces, shard // block) + 1).astype(int) * block
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))


def quantized_allreduce(comm, x: np.ndarray, *, codec: Codec = Codec(),
                        feedback: ErrorFeedback | None = None, key: str = "x",
                        measure_error: bool = False, pieces: int | None = None,
                        out: np.ndarray | None = None) -> tuple[np.ndarray, AllreduceStats]:
    """Sum the 1-D float32 ``x`` over ``comm``'s ranks with ``codec`` on the wire.

    ``feedback`` (with ``key`` naming the tensor) adds last step's residual before encoding this
    rank's contribution and keeps the new one. The shards are cut into ``pieces`` that are
    pipelined: piece ``k + 1`` is encoded while piece ``k`` is on the wire (the collectives run
    asynchronously), and each reduced piece is decoded, summed and re-encoded in one compiled
    pass (int codecs). ``None`` (the default): one piece per 16 MiB of a rank's encoded
    shards, at most 8 (smaller pieces cost more in per-message overhead than they save in
    overlap). The result does not depend on ``pieces``. ``out`` (a float32 array of
    ``x``'s shape) receives the sum instead of a new array. The exchange buffers (``3 n + 1``
    encoded shards for ``n`` ranks) are kept for the next call on ``comm``. Raises
    ``CommflowError`` for non-float32 input or a wrong ``out``.
    """
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 1:
        raise CommflowError(f"quantized allreduce on rank {comm.rank}: expected a 1-D float32 "
                            f"array, got {x.dtype} of shape {x.shape}")
    n, size = x.size, comm.size
    if out is not None and (not isinstance(out, np.ndarray) or out.dtype != np.float32
                            or out.shape != x.shape or not out.flags.c_contiguous):
        raise CommflowError(f"quantized allreduce on rank {comm.rank}: out must be a "
                            f"contiguous float32 array of shape {x.shape}")
    shard = _shard(n, size, codec.block)
    if pieces is None:
        pieces = min(8, max(1, size * codec.encoded_bytes(shard) // _PIECE_BYTES))
    if pieces < 1:
        raise CommflowError(f"quantized allreduce on rank {comm.rank}: pieces {pieces} must "
                            "be >= 1")
    src = x if feedback is None else feedback.compensate(key, x)
    if src.size != shard * size:
        padded = np.zeros(shard * size, np.float32)
        padded[:n] = src
        src = padded
    grid = src.reshape(size, shard)
    result = out if out is not None and n == shard * size else np.empty(shard * size,
                                                                          np.float32)
    sent = None if feedback is None else np.empty(shard * size, np.float32)
    sent_grid = None if sent is None else sent.reshape(size, shard)
    out_grid = result.reshape(size, shard)
    b = codec.encoded_bytes(shard)
    arena = _arena(comm, (3 * size + 1) * b)
    wires, gots, gathers_out = (arena[k * size * b:(k + 1) * size * b] for k in range(3))
    reduced = arena[3 * size * b:(3 * size + 1) * b]
    exchanges = []
    done = 0
    for lo, hi in _pieces(shard, codec.block, pieces):
        m = codec.encoded_bytes(hi - lo)
        wire = wires[size * done:size * (done + m)]
        for j, w in enumerate(np.split(wire, size)):
            _encode_into(grid[j, lo:hi], w, codec)
        if sent_grid is not None:
            for j, w in enumerate(np.split(wire, size)):
                _decode_into(w, sent_grid[j, lo:hi], codec)
        exchanges.append((lo, hi, done, m, comm.alltoall(
            wire, out=gots[size * done:size * (done + m)], async_op=True)))
        done += m
    gathers = []
    for lo, hi, at, m, pending in exchanges:
        got = pending.wait()
        gathers.append((lo, hi, comm.allgather(
            _reduce(got, size, hi - lo, codec, reduced[at:at + m]),
            out=gathers_out[size * at:size * (at + m)], async_op=True)))
    for lo, hi, pending in gathers:
        for j, part in enumerate(np.split(pending.wait(), size)):
            _decode_into(part, out_grid[j, lo:hi], codec)
    _keep(comm, arena)
    if feedback is not None:
        feedback.update(key, src[:n], sent[:n])
    if out is None:
        out = result[:n]
    elif result is not out:
        out[:] = result[:n]
    err = None
    if measure_error:
        exact = comm.allreduce(x)
        norm = float(np.linalg.norm(exact))
        err = float(np.linalg.norm(out - exact)) / norm if norm else float(np.linalg.norm(out))
    return out, AllreduceStats(bytes_sent=2 * (size - 1) * b,
                               float32_bytes=2 * (size - 1) * 4 * -(-n // size),
                               relative_error=err)


def _encode_into(x: np.ndarray, dst: np.ndarray, codec: Codec) -> None:
    """Encode the contiguous float32 ``x`` into the bytes ``dst``."""
    if codec.name in ("fp16", "bf16"):
        dst[:] = encode(x, codec)
    else:
        kernels.encode_blocks(x, codec.block, _QMAX[codec.name], dst)


def _decode_into(buf: np.ndarray, dst: np.ndarray, codec: Codec) -> None:
    """Decode ``buf`` into the contiguous float32 view ``dst``."""
    if codec.name in ("fp16", "bf16"):
        dst[:] = decode(buf, dst.size, codec)
    else:
        kernels.decode_blocks(buf, codec.block, _QMAX[codec.name], dst, False)


def _reduce(got: np.ndarray, nparts: int, n: int, codec: Codec, out: np.ndarray
            ) -> np.ndarray:
    """The encoded sum of the ``nparts`` encodings of ``n`` elements in ``got``, in ``out``."""
    if codec.name in ("fp16", "bf16"):
        total = np.zeros(n, np.float32)
        for part in np.split(got, nparts):
            decode(part, n, codec, add_to=total)
        out[:] = encode(total, codec)
        return out
    kernels.reduce_encode(np.ascontiguousarray(got), nparts, n, codec.block, _QMAX[codec.name],
                          out)
    return out
