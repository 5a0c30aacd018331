"""Block-sparse allreduce (OmniReduce, Fei et al. SIGCOMM 2021): only blocks that hold a
non-zero value on some rank travel.

The array is cut into blocks of ``block`` elements. Ranks allgather one bit per block
(whether their block is non-zero), then allreduce, in float32, only the blocks non-zero on
at least one rank, packed together; every other block of the result is zero. The result is
the float32 allreduce of the whole array, exactly up to summation order. Bytes sent per rank:
``(n-1) * ceil(blocks / 8)`` for the bitmaps plus a float32 ring's ``2 (n-1)/n * 4 * u *
block`` for ``u`` blocks in the union (OmniReduce streams blocks to aggregators instead of a
ring; the bytes are the same).
"""

from __future__ import annotations

import numpy as np

from commflow.compress.allreduce import AllreduceStats
from commflow.errors import CommflowError


def block_sparse_allreduce(comm, x: np.ndarray, *, block: int = 256,
                           measure_error: bool = False) -> tuple[np.ndarray, AllreduceStats]:
    """Sum the 1-D float32 ``x`` over ``comm``'s ranks, sending only non-zero blocks.

    Raises ``CommflowError`` for non-float32 input or ``block`` < 1.
    """
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 1:
        raise CommflowError(f"block-sparse allreduce on rank {comm.rank}: expected a 1-D "
                            f"float32 array, got {x.dtype} of shape {x.shape}")
    if block < 1:
        raise CommflowError(f"block-sparse allreduce on rank {comm.rank}: block {block} must "
                            "be >= 1")
    n, size = x.size, comm.size
    blocks = -(-n // block)
    padded = np.zeros(blocks * block, np.float32)
    padded[:n] = x
    tiles = padded.reshape(blocks, block)
    mine = np.packbits(np.any(tiles != 0, axis=1))
    union = np.unpackbits(comm.allgather(mine).reshape(size, -1), axis=1,
                          count=blocks).any(axis=0)
    used = np.flatnonzero(union)
    out = np.zeros_like(tiles)
    if len(used):
        out[used] = comm.allreduce(np.ascontiguousarray(tiles[used]).ravel()).reshape(-1, block)
    result = out.ravel()[:n]
    err = None
    if measure_error:
        exact = comm.allreduce(x)
        norm = float(np.linalg.norm(exact))
        err = float(np.linalg.norm(result - exact)) / norm if norm else float(
            np.linalg.norm(result))
    sent = (size - 1) * len(mine) + int(2 * (size - 1) * 4 * -(-len(used) * block // size))
    return result, AllreduceStats(bytes_sent=sent,
                                  float32_bytes=2 * (size - 1) * 4 * -(-n // size),
                                  relative_error=err)
