"""torch.distributed with the gloo backend as a benchmarked peer (``impl = "gloo"``).

Ranks are started like commflow's (the launcher sets ``MASTER_ADDR`` = 127.0.0.1 and a free
``MASTER_PORT``); rank 0 hosts the ``TCPStore``. Collectives run on CPU tensors that share the
numpy buffers (``torch.from_numpy``): ``all_reduce``, ``all_gather_single`` (formerly
``all_gather_into_tensor``), ``reduce_scatter_single`` (formerly ``reduce_scatter_tensor``),
``all_to_all_single``, ``broadcast``, ``reduce``, ``gather`` and ``scatter`` (into/from views
of one contiguous buffer). ``all_reduce``, ``broadcast`` and ``reduce`` work in place, so their
out-of-place variant copies the input first (:func:`~commflow.bench.impl.via_recv`);
``all_to_all_single`` gives wrong results when input and output are one tensor, so in place it
sends from a copy (``clone()``). Both copies are inside the timed call, as a user pays them.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from datetime import timedelta

import numpy as np

from commflow.bench.cases import Case
from commflow.bench.impl import via_recv
from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.runtime import detect_world

_OPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX"}


def missing() -> str | None:
    """Why torch.distributed cannot run here, or ``None``."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed: pip install torch (the CPU build is enough)"
    return None


def unsupported(collective: Collective, dtype: np.dtype, op: str) -> str | None:
    """gloo has no ``avg`` reduction (torch.distributed offers it with NCCL only)."""
    if collective.reduces and op not in _OPS:
        return f"gloo has no {op!r} reduction (torch.distributed's ReduceOp.AVG is NCCL-only)"
    return None


def _tensor(array: np.ndarray):
    """A torch tensor sharing ``array``'s memory (bfloat16 through an int16 view)."""
    import torch

    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class GlooRanks:
    """A rank of a torch.distributed gloo process group."""

    def __init__(self, timeout: float) -> None:
        import torch.distributed as dist

        world = detect_world()
        self.rank, self.nranks = world.rank, world.size
        try:
            address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        except (KeyError, ValueError):
            raise CommflowError(
                "gloo ranks need MASTER_ADDR and MASTER_PORT: start them with "
                "commflow.runtime.launcher.launch or torchrun"
            ) from None
        store = dist.TCPStore(
            address, port, self.nranks, self.rank == 0, timedelta(seconds=timeout)
        )
        dist.init_process_group(
            "gloo",
            store=store,
            rank=self.rank,
            world_size=self.nranks,
            timeout=timedelta(seconds=timeout),
        )
        self.dist = dist

    def barrier(self) -> None:
        """torch.distributed's barrier."""
        self.dist.barrier()

    def operation(self, algo: str, case: Case) -> Callable[[], object]:
        """The torch.distributed call for ``case`` (``algo`` is always gloo's own)."""
        dist, spec, n = self.dist, case.spec, self.nranks
        s, r, root = _tensor(case.send), _tensor(case.recv), spec.root
        op = getattr(dist.ReduceOp, _OPS.get(spec.op, "SUM"))
        at_root = self.rank == root
        allgather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        calls = {
            Collective.ALLREDUCE: via_recv(case, lambda: dist.all_reduce(r, op)),
            Collective.ALLGATHER: lambda: allgather(r, s),
            Collective.REDUCESCATTER: lambda: reduce_scatter(r, s, op),
            Collective.ALLTOALL: (lambda: dist.all_to_all_single(r, s.clone()))
            if spec.inplace
            else (lambda: dist.all_to_all_single(r, s)),
            Collective.BROADCAST: via_recv(case, lambda: dist.broadcast(r, root)),
            Collective.REDUCE: via_recv(case, lambda: dist.reduce(r, root, op)),
            Collective.GATHER: lambda: dist.gather(
                s, list(r.chunk(n)) if at_root else None, dst=root
            ),
            Collective.SCATTER: lambda: dist.scatter(
                r, list(s.chunk(n)) if at_root else None, src=root
            ),
        }
        return calls[spec.collective]

    def close(self) -> None:
        """Destroy the process group."""
        self.dist.destroy_process_group()


def connect(timeout: float) -> GlooRanks:
    """Join the gloo process group of the job the launcher described."""
    return GlooRanks(timeout)
