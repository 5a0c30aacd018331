"""Top-k sparsified gradient averaging as a DDP communication hook, with error feedback
(Aji and Heafield 2017; Stich et al. 2018)::

    state = topk.TopKState(ratio=0.01)  # on every rank: keep 1% of each bucket
    ddp.register_comm_hook(state, topk.topk_allreduce_hook)

Each rank adds its residual to ``bucket / world_size``, keeps the ``k = ceil(ratio * size)``
entries of largest magnitude, all-gathers their int32 indices and float32 values (``8 k``
bytes per rank instead of ``4 size``) and adds every rank's entries; the residual keeps what
was not sent, so it reaches the parameters at a later step.

(No ``from __future__ import annotations`` here: DDP checks the hooks' annotations at run time.)
"""

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from commflow.errors import CommflowError
from commflow.torch.hooks import HookState


@dataclass(kw_only=True)
class TopKState(HookState):
    """Settings and residuals of :func:`topk_allreduce_hook`."""

    ratio: float = 0.01
    """Fraction of each bucket's entries sent, in (0, 1]."""
    residuals: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    """What was not sent, per bucket index (float32), for the next step."""
    bytes_sent: int = 0
    """Bytes this rank has contributed to the all-gathers (indices and values)."""

    def __post_init__(self) -> None:
        if not 0 < self.ratio <= 1:
            raise CommflowError(f"TopKState: ratio must be in (0, 1], got {self.ratio!r}")
        super().__post_init__()


def topk_allreduce_hook(
    state: TopKState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average the float32 bucket from every rank's top-k entries (module docstring);
    returns the bucket's buffer. Raises ``CommflowError`` for a bucket that is not float32."""
    buffer = bucket.buffer()
    if buffer.dtype != torch.float32:
        raise CommflowError(f"topk_allreduce_hook: buckets must be float32, got {buffer.dtype}")
    group = state.process_group
    n = group.size()
    compensated = buffer / n
    residual = state.residuals.get(bucket.index())
    if residual is not None and residual.shape == buffer.shape:
        compensated += residual
    k = max(1, math.ceil(state.ratio * buffer.numel()))
    index = compensated.abs().topk(k, sorted=False).indices.to(torch.int32)
    values = compensated[index.long()]
    kept = torch.zeros_like(compensated)
    kept[index.long()] = values
    state.residuals[bucket.index()] = compensated - kept
    indices = torch.empty(k * n, dtype=torch.int32)
    gathered = torch.empty(k * n, dtype=torch.float32)
    dist.all_gather_single(indices, index, group=group)
    dist.all_gather_single(gathered, values, group=group)
    buffer.zero_()
    buffer.index_add_(0, indices.long(), gathered)
    state.bytes_sent += 8 * k
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
