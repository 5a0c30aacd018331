"""DDP communication hooks that carry gradient buckets over commflow.

::

    state = hooks.HookState(algo="ring")  # on every rank, after init_process_group
    ddp.register_comm_hook(state, hooks.allreduce_hook)

    state = hooks.CompressionState(dtype=torch.bfloat16)  # error feedback on by default
    ddp.register_comm_hook(state, hooks.compressed_allreduce_hook)

The hooks work whatever DDP's own backend is (gloo included): the state's process group is a
``commflow`` group, by default the default group when it is commflow's, else a new commflow
group over every rank, created with the state (so every rank must create the state, as every
rank creates the DDP model). Compressed buckets travel as float16 or bfloat16 (half the bytes)
and, with error feedback (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD), each rank adds
the rounding error it made on a bucket to that bucket's gradients at the next step, so the
error does not accumulate in the parameters.

(No ``from __future__ import annotations`` here: DDP checks the hooks' annotations at run time.)
"""

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.ir import Program
from commflow.torch.algo import check_algorithm, use_algorithms
from commflow.torch.backend import BACKEND, CommflowProcessGroup

_WIRE_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(kw_only=True)
class HookState:
    """Where and how buckets are all-reduced."""

    algo: str | Program = "auto"
    """Allreduce algorithm (``"auto"``, a name from ``commflow.runtime.algorithm_names``, or an
    allreduce program file ``*.json``, loaded on construction)."""
    process_group: dist.ProcessGroup | None = None
    """The commflow group carrying the buckets; ``None``: the default group if it is
    commflow's, else a new commflow group over every rank (a collective call)."""

    def __post_init__(self) -> None:
        self.algo = check_algorithm(Collective.ALLREDUCE, self.algo, "HookState.algo")
        if self.process_group is None:
            default = dist.group.WORLD
            self.process_group = (
                default
                if isinstance(default, CommflowProcessGroup)
                else dist.new_group(backend=BACKEND)
            )
        elif not isinstance(self.process_group, CommflowProcessGroup):
            raise CommflowError(
                f"hook state: process_group must be a commflow group "
                f"(dist.new_group(backend='commflow')), got "
                f"{type(self.process_group).__name__}"
            )


@dataclass(kw_only=True)
class CompressionState(HookState):
    """A :class:`HookState` for :func:`compressed_allreduce_hook`."""

    dtype: torch.dtype = torch.float16
    """Dtype on the wire: ``torch.float16`` or ``torch.bfloat16``."""
    error_feedback: bool = True
    """Carry each bucket's rounding error into its next gradients."""
    residuals: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)
    """Rounding error per bucket index (float32, the bucket's size), for the next step."""

    def __post_init__(self) -> None:
        if self.dtype not in _WIRE_DTYPES:
            raise CommflowError(
                f"CompressionState: dtype must be torch.float16 or torch.bfloat16, got {self.dtype}"
            )
        super().__post_init__()


def _allreduce(
    state: HookState, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType
) -> torch.futures.Future:
    with use_algorithms(allreduce=state.algo):
        work = dist.all_reduce(tensor, op=op, group=state.process_group, async_op=True)
    return work.get_future()


def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over the ranks with ``state.algo`` (what DDP does by default)."""
    buffer = bucket.buffer()
    return _allreduce(state, buffer, dist.ReduceOp.AVG).then(lambda fut: fut.value()[0])


def compressed_allreduce_hook(
    state: CompressionState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in ``state.dtype``: each rank sends ``(g + e) / n`` rounded to the
    wire dtype (``e``: its rounding error on this bucket last step, when error feedback is
    on), the ranks sum those, and the result is written back to the bucket as float32."""
    buffer = bucket.buffer()
    nranks = state.process_group.size()
    compensated = buffer
    residual = state.residuals.get(bucket.index())
    if state.error_feedback and residual is not None and residual.shape == buffer.shape:
        compensated = buffer + residual
    wire = (compensated / nranks).to(state.dtype)
    if state.error_feedback:
        state.residuals[bucket.index()] = compensated - wire.to(buffer.dtype) * nranks

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0])
        return buffer

    return _allreduce(state, wire, dist.ReduceOp.SUM).then(decompress)
