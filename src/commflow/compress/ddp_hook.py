"""Block-quantized gradient averaging as a DDP communication hook (int8 or int4 with one
float32 scale per block, as ZeRO++'s quantized gradients; error feedback as EF-SGD)::

    from commflow.compress import ddp_hook

    state = ddp_hook.QuantizedState(codec="int8")  # on every rank
    ddp.register_comm_hook(state, ddp_hook.quantized_allreduce_hook)

Each rank adds last step's residual to ``bucket / world_size``, encodes its ``n`` shards
(:func:`commflow.compress.encode`), exchanges them with one all-to-all of bytes, decodes and
adds the ``n`` contributions to its shard, encodes the sum and all-gathers the bytes: what
:func:`commflow.compress.quantized_allreduce` does on a communicator, here over the state's
process group, so ``2 (n-1)`` shards of ``encoded_bytes`` travel per rank instead of float32
ones. The residual keeps what encoding this rank's contribution lost.

Here, not in :mod:`commflow.torch`, because it uses the codecs (``compress`` sits above
``torch`` in the layers); it imports torch, so ``commflow.compress`` does not import it.

(No ``from __future__ import annotations`` here: DDP checks the hooks' annotations at run time.)
"""

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from commflow.compress.codecs import Codec, decode, encode
from commflow.errors import CommflowError
from commflow.torch.hooks import HookState


@dataclass(kw_only=True)
class QuantizedState(HookState):
    """Settings and residuals of :func:`quantized_allreduce_hook`."""

    codec: str = "int8"
    """``int8`` or ``int4``."""
    block: int = 256
    """Elements per scale block."""
    error_feedback: bool = True
    """Carry each bucket's encoding error into its next gradients."""
    residuals: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    """Encoding error per bucket index (float32), for the next step."""
    bytes_sent: int = 0
    """Bytes this rank has sent (all-to-all and all-gather payloads, itself excluded)."""

    def __post_init__(self) -> None:
        if self.codec not in ("int8", "int4"):
            raise CommflowError(
                f"QuantizedState: codec must be 'int8' or 'int4', got {self.codec!r} (fp16 and "
                f"bf16: hooks.CompressionState)")
        Codec(name=self.codec, block=self.block)
        super().__post_init__()


def quantized_allreduce_hook(
    state: QuantizedState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average the float32 bucket over the ranks with block-quantized shards on the wire
    (module docstring); returns the bucket's buffer. Raises ``CommflowError`` for a bucket
    that is not float32."""
    buffer = bucket.buffer()
    if buffer.dtype != torch.float32:
        raise CommflowError(f"quantized_allreduce_hook: buckets must be float32, got "
                            f"{buffer.dtype}")
    group, codec = state.process_group, Codec(name=state.codec, block=state.block)
    n = group.size()
    count = buffer.numel()
    shard = max(1, -(-count // (n * codec.block))) * codec.block
    padded = np.zeros(shard * n, np.float32)
    padded[:count] = buffer.detach().numpy() / n
    residual = state.residuals.get(bucket.index())
    if state.error_feedback and residual is not None and residual.size == padded.size:
        padded += residual
    wire = np.concatenate([encode(padded[j * shard:(j + 1) * shard], codec)
                           for j in range(n)])
    if state.error_feedback:
        sent = np.concatenate([decode(w, shard, codec) for w in np.split(wire, n)])
        state.residuals[bucket.index()] = padded - sent
    got = torch.empty(wire.size, dtype=torch.uint8)
    dist.all_to_all_single(got, torch.from_numpy(wire), group=group)
    reduced = np.zeros(shard, np.float32)
    for part in np.split(got.numpy(), n):
        decode(part, shard, codec, add_to=reduced)
    mine = encode(reduced, codec)
    gathered = torch.empty(mine.size * n, dtype=torch.uint8)
    dist.all_gather_single(gathered, torch.from_numpy(mine), group=group)
    out = np.concatenate([decode(p, shard, codec) for p in np.split(gathered.numpy(), n)])
    buffer.copy_(torch.from_numpy(out[:count]))
    state.bytes_sent += (n - 1) * (wire.size // n + mine.size)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
