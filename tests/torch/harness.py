"""Run a function on N forked processes that joined a torch.distributed process group."""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from datetime import timedelta

import torch
import torch._dynamo  # noqa: F401  (DDP imports it on first use: once here, not per rank)

from ..runtime.harness import run_ranks

# Ranks start from a clean fork server: forking pytest itself, whose earlier torch tests left
# threads behind, can deadlock a child on a lock one of those threads held.
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed", "commflow.torch"])


def free_port() -> int:
    """A TCP port free on the loopback address now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(
    fn: Callable,
    rank: int,
    nranks: int,
    port: int,
    backend: str | None,
    timeout: float,
    queue,
    args,
) -> None:
    try:
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(nranks),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(nranks),
        )
        import torch
        import torch.distributed as dist

        import commflow.torch  # noqa: F401  (registers the backend)

        torch.set_num_threads(1)
        if backend is None:
            result = fn(*args)
        else:
            dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
            result = fn(*args)
            dist.destroy_process_group()
        queue.put((rank, True, result))
    except BaseException as err:  # reported to the parent, which re-raises
        queue.put((rank, False, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    finally:
        queue.close()
        queue.join_thread()
        os._exit(0)


def run_group(
    fn: Callable,
    nranks: int,
    *args,
    backend: str | None = "commflow",
    timeout: float = 30.0,
    expect_failure: bool = False,
) -> list:
    """Run ``fn(*args)`` on ``nranks`` processes after ``dist.init_process_group(backend)``;
    return the results by rank. ``timeout`` (s) is the process group's timeout; with
    ``backend=None`` the ranks only get torchrun's environment and ``fn`` joins by itself.

    Raises ``AssertionError`` with every failing rank's traceback unless ``expect_failure``,
    in which case the per-rank ``(ok, result_or_error_text)`` pairs are returned."""
    port = free_port()
    return run_ranks(_child, lambda r, queue: (fn, r, nranks, port, backend, timeout, queue, args),
                     nranks, timeout=timeout, expect_failure=expect_failure, context=_CTX)


class Bucket:
    """What DDP communication hooks read of a ``dist.GradBucket``: its index, its flat
    ``buffer`` and, for hooks that reshape, gradients of ``shapes`` as views of the buffer
    (default: the whole buffer as one gradient)."""

    def __init__(self, index: int, buffer: torch.Tensor,
                 shapes: list[tuple[int, ...]] | None = None) -> None:
        self._index, self._buffer = index, buffer
        self._grads, offset = [], 0
        for shape in shapes or [tuple(buffer.shape)]:
            size = math.prod(shape)
            self._grads.append(buffer[offset:offset + size].view(shape))
            offset += size

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        return self._grads


def train_regression(model: torch.nn.Module, hook: tuple | None = None,
                     steps: int = 80) -> list[float]:
    """Losses of ``steps`` steps of DDP on this rank's random inputs regressing a fixed
    linear target (SGD with momentum), with ``hook`` = (state, hook function) registered."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model)
    if hook is not None:
        ddp.register_comm_hook(*hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    target = torch.nn.Linear(32, 1)
    torch.nn.init.normal_(target.weight, generator=torch.Generator().manual_seed(7))
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 32, generator=gen)
        with torch.no_grad():
            y = target(x)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses
