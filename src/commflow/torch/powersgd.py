"""PowerSGD gradient compression as a DDP communication hook (Vogels et al., NeurIPS 2019).

::

    state = powersgd.PowerSGDState(rank=4)  # on every rank, after init_process_group
    ddp.register_comm_hook(state, powersgd.powersgd_hook)

Each gradient of two or more dimensions, seen as an ``n x m`` matrix ``M`` (plus its error
feedback ``E``), is sent as two thin factors: ``P = (M + E) Q`` is averaged over the ranks and
orthonormalised, then ``Q = (M + E)^T P`` is averaged and the gradient becomes ``P Q^T``;
``E`` keeps ``M + E - P Q^T`` for the next step, and ``Q`` starts the next step (warm start:
one power iteration per step refines it). ``(n + m) r`` floats travel instead of ``n m``;
gradients that would not shrink ``min_compression_rate`` times (vectors, small matrices) are
averaged as they are, in one allreduce per bucket. Every rank draws the first ``Q`` from the
same seed, so the factors agree without communication.

(No ``from __future__ import annotations`` here: DDP checks the hooks' annotations at run time.)
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from commflow.errors import CommflowError
from commflow.torch.hooks import HookState


@dataclass(kw_only=True)
class PowerSGDState(HookState):
    """Settings and per-gradient memory of :func:`powersgd_hook`."""

    rank: int = 2
    """Rank ``r`` of the low-rank approximation."""
    min_compression_rate: float = 2.0
    """Compress a matrix only when ``n m >= rate * (n + m) r``."""
    error_feedback: bool = True
    """Carry each matrix's approximation error into its next gradient."""
    warm_start: bool = True
    """Start each step's power iteration from the previous ``Q`` (else a fresh random one)."""
    seed: int = 0
    """Seed of the first ``Q`` (the same on every rank)."""
    errors: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)
    """Error feedback per (bucket index, gradient index)."""
    qs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict, repr=False)
    """The last ``Q`` per (bucket index, gradient index)."""
    bytes_sent: int = 0
    """Float32 bytes this rank has put on the wire (factors and uncompressed gradients)."""
    bytes_uncompressed: int = 0
    """Bytes the same gradients take uncompressed."""

    def __post_init__(self) -> None:
        if self.rank < 1 or self.min_compression_rate <= 0:
            raise CommflowError(
                f"PowerSGDState: rank must be >= 1 and min_compression_rate > 0 (got "
                f"{self.rank}, {self.min_compression_rate})")
        super().__post_init__()


def _compressible(state: PowerSGDState, grad: torch.Tensor) -> bool:
    if grad.dim() < 2:
        return False
    n, m = grad.shape[0], grad.numel() // grad.shape[0]
    r = min(state.rank, n, m)
    return n * m >= state.min_compression_rate * (n + m) * r


def _mean(state: PowerSGDState, tensor: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(tensor, group=state.process_group)
    state.bytes_sent += tensor.numel() * tensor.element_size()
    return tensor.div_(state.process_group.size())


def _orthonormal(p: torch.Tensor) -> torch.Tensor:
    """Columns of ``p`` made orthonormal (reduced QR; the same on every rank)."""
    q, _ = torch.linalg.qr(p, mode="reduced")
    return q


def _first_q(state: PowerSGDState, key: tuple[int, int], m: int, r: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(state.seed * 1_000_003 + key[0] * 1009 + key[1])
    return torch.randn(m, r, generator=generator)


def powersgd_hook(
    state: PowerSGDState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients over the ranks, matrices by PowerSGD (module
    docstring), the rest uncompressed; returns the bucket's buffer."""
    buffer = bucket.buffer()
    grads = bucket.gradients()
    plain = [g for g in grads if not _compressible(state, g)]
    if plain:
        flat = torch.cat([g.reshape(-1) for g in plain]).float()
        _mean(state, flat)
        offset = 0
        for g in plain:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    for i, g in enumerate(grads):
        state.bytes_uncompressed += g.numel() * 4
        if not _compressible(state, g):
            continue
        key = (bucket.index(), i)
        matrix = g.reshape(g.shape[0], -1).float()
        n, m = matrix.shape
        r = min(state.rank, n, m)
        if state.error_feedback and key in state.errors:
            matrix = matrix + state.errors[key]
        q = state.qs.get(key) if state.warm_start else None
        if q is None:
            q = _first_q(state, key, m, r)
        p = _orthonormal(_mean(state, matrix @ q))
        q = _mean(state, matrix.t() @ p)
        approx = p @ q.t()
        if state.error_feedback:
            state.errors[key] = matrix - approx
        state.qs[key] = q
        g.copy_(approx.view_as(g))
    offset = 0
    for g in grads:
        buffer[offset:offset + g.numel()].copy_(g.reshape(-1))
        offset += g.numel()
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
