"""Top-k sparse allreduce with error feedback (Aji and Heafield 2017; Stich et al. 2018).

Each rank keeps the ``k`` entries of largest magnitude of ``x`` (plus its residual), allgathers
their int32 indices and float32 values and adds every rank's entries: ``8 k (n-1)`` bytes sent
per rank. The residual keeps what was not sent.
"""

from __future__ import annotations

import numpy as np

from commflow.compress.allreduce import AllreduceStats
from commflow.compress.codecs import ErrorFeedback
from commflow.errors import CommflowError


def topk_allreduce(comm, x: np.ndarray, *, k: int, feedback: ErrorFeedback | None = None,
                   key: str = "x", measure_error: bool = False
                   ) -> tuple[np.ndarray, AllreduceStats]:
    """Sum every rank's ``k`` largest-magnitude entries of the 1-D float32 ``x``.

    Raises ``CommflowError`` for non-float32 input or ``k`` outside ``1..x.size``.
    """
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 1:
        raise CommflowError(f"top-k allreduce on rank {comm.rank}: expected a 1-D float32 "
                            f"array, got {x.dtype} of shape {x.shape}")
    if not 1 <= k <= x.size:
        raise CommflowError(f"top-k allreduce on rank {comm.rank}: k={k} must be in "
                            f"1..{x.size}")
    c = x if feedback is None else feedback.compensate(key, x)
    idx = np.sort(np.argpartition(np.abs(c), x.size - k)[x.size - k:]).astype(np.int32)
    vals = c[idx].astype(np.float32)
    if feedback is not None:
        sent = np.zeros_like(c)
        sent[idx] = vals
        feedback.update(key, c, sent)
    all_idx = comm.allgather(idx)
    all_vals = comm.allgather(vals)
    out = np.zeros(x.size, np.float32)
    np.add.at(out, all_idx, all_vals)
    err = None
    if measure_error:
        exact = comm.allreduce(x)
        norm = float(np.linalg.norm(exact))
        err = float(np.linalg.norm(out - exact)) / norm if norm else float(np.linalg.norm(out))
    n = comm.size
    return out, AllreduceStats(bytes_sent=8 * k * (n - 1),
                               float32_bytes=2 * (n - 1) * 4 * -(-x.size // n),
                               relative_error=err)
