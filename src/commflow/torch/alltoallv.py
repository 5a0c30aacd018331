"""All-to-all with uneven blocks (torch's ``all_to_all`` and ``all_to_all_single`` with split
sizes) on the runtime's even all-to-all.

The ranks first all-gather how many elements each sends to and expects from every other rank
and check that the two agree (every rank sees the same table, so every rank raises together on
a mismatch instead of one rank hanging). Blocks are then padded to the largest block anywhere
and exchanged with one even all-to-all: n·max_block elements per rank on the wire instead of
the exact sum, the price of reusing the runtime's verified programs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from commflow.errors import CommflowError
from commflow.runtime import Communicator


def alltoallv(
    comm: Communicator,
    send: np.ndarray,
    send_counts: Sequence[int],
    recv: np.ndarray,
    recv_counts: Sequence[int],
    *,
    algo: str = "auto",
    timeout: float | None = None,
) -> None:
    """Send ``send_counts[j]`` consecutive elements of the 1-D ``send`` to rank ``j`` and
    receive ``recv_counts[i]`` elements from rank ``i`` into consecutive parts of ``recv``.

    Raises ``CommflowError`` on every rank when a count is negative or some rank's send count
    does not match its peer's receive count."""
    n = comm.size
    mine = np.array([*send_counts, *recv_counts], np.int64)
    table = comm.allgather(mine, algo="direct", timeout=timeout).reshape(n, 2 * n)
    if table.min(initial=0) < 0:
        raise CommflowError(
            f"all_to_all on rank {comm.rank}: split sizes must be >= 0, got "
            f"{table.min()} on rank {int(np.argwhere(table < 0)[0][0])}"
        )
    sends, recvs = table[:, :n], table[:, n:]
    bad = np.argwhere(sends != recvs.T)
    if len(bad):
        src, dst = (int(v) for v in bad[0])
        raise CommflowError(
            f"all_to_all on rank {comm.rank}: rank {src} sends {int(sends[src, dst])} elements "
            f"to rank {dst}, which expects {int(recvs[dst, src])}; the split sizes of the two "
            f"ranks must agree"
        )
    block = int(table.max(initial=0))
    if block == 0:
        return
    padded = np.zeros((n, block), send.dtype)
    for j, (lo, hi) in enumerate(_spans(send_counts)):
        padded[j, : hi - lo] = send[lo:hi]
    got = comm.alltoall(padded.reshape(-1), algo=algo, timeout=timeout).reshape(n, block)
    for i, (lo, hi) in enumerate(_spans(recv_counts)):
        recv[lo:hi] = got[i, : hi - lo]


def split_counts(tensor: torch.Tensor, splits: Sequence[int], nranks: int, what: str) -> list[int]:
    """Elements per rank of ``tensor`` cut along its first dimension by ``splits`` (rows per
    rank; empty: even). Raises ``CommflowError`` (prefixed by ``what``) when the splits are
    not ``nranks`` numbers summing to the rows, or empty splits do not divide them."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row = tensor.numel() // rows if rows else 0
    if not splits:
        if rows % nranks:
            raise CommflowError(f"{what} has {rows} rows, not divisible into {nranks} even splits")
        splits = [rows // nranks] * nranks
    if len(splits) != nranks or sum(splits) != rows:
        raise CommflowError(
            f"{what} split sizes {list(splits)} must be {nranks} numbers summing to the {rows} rows"
        )
    return [int(s) * row for s in splits]


def _spans(counts: Sequence[int]) -> list[tuple[int, int]]:
    ends = np.cumsum(counts, dtype=np.int64)
    return [(int(e - c), int(e)) for c, e in zip(counts, ends, strict=True)]
