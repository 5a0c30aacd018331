"""Argument checks and conversions of the ``commflow`` backend's calls
(:mod:`commflow.torch.backend`): tensors as flat numpy views, one tensor per call, the
reduction, root and per-rank lists checked against the group, and each call's algorithm and
timeout. Errors name the call, the rank and what to pass instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.runtime import Communicator
from commflow.runtime.arrays import as_numpy
from commflow.runtime.ops import reducer
from commflow.torch.algo import algorithm_for

_Red = dist.ReduceOp.RedOpType
_OPS = {_Red.SUM: "sum", _Red.PRODUCT: "prod", _Red.MIN: "min", _Red.MAX: "max", _Red.AVG: "avg"}

PIECE_BYTES = 1 << 20
"""Between hosts, an all-reduce of at least twice this many bytes runs as up to
``Communicator.slots`` pieces at once."""


def as_flat(tensor: torch.Tensor, what: str) -> np.ndarray:
    """A flat zero-copy numpy view of ``tensor`` (``what`` names it in errors)."""
    # detach: a tensor that requires grad (DDP's buckets under create_graph) shares the memory
    return as_numpy(tensor.detach(), what).reshape(-1)


def only(items: Sequence, call: str):
    """The one item of ``items``; ``NotImplementedError`` for more or fewer."""
    if len(items) != 1:
        raise NotImplementedError(
            f"commflow backend: {call} takes one tensor (list) per call, got {len(items)}"
        )
    return items[0]


def call_options(collective: Collective, opts) -> dict[str, object]:
    """The communicator's ``algo`` and ``timeout`` (s; None: the group's) for one call."""
    timeout = getattr(opts, "timeout", None)
    seconds = timeout.total_seconds() if timeout and timeout.total_seconds() > 0 else None
    return {"algo": algorithm_for(collective), "timeout": seconds}


def split_pieces(view: np.ndarray, slots: int) -> list[np.ndarray]:
    """``view`` cut into up to ``slots`` contiguous pieces of at least :data:`PIECE_BYTES`
    (the same cut on every rank for the same size), reduced at once on the lanes."""
    count = max(1, min(slots, view.nbytes // PIECE_BYTES))
    return np.array_split(view, count) if count > 1 else [view]


def describe(comm: Communicator, call: str) -> str:
    """``call`` on this rank, for messages."""
    return f"commflow {call} on rank {comm.rank} of {comm.size}"


def op_name(opts, call: str, array: np.ndarray) -> str:
    """The communicator's name of ``opts.reduceOp`` for ``array``'s dtype."""
    red = opts.reduceOp.op
    if red not in _OPS:
        raise NotImplementedError(
            f"commflow backend: {call} with ReduceOp.{red.name} is not supported; use SUM, "
            f"PRODUCT, MIN, MAX or AVG"
        )
    reducer(_OPS[red], array.dtype)
    return _OPS[red]


def checked_root(comm: Communicator, root: int, call: str) -> int:
    """``root`` if it is a rank of the group."""
    if not 0 <= root < comm.size:
        raise CommflowError(
            f"{describe(comm, call)}: root {root} is outside group ranks 0..{comm.size - 1}"
        )
    return root


def per_rank(comm: Communicator, tensors: Sequence[torch.Tensor], like: np.ndarray,
           call: str) -> list[np.ndarray]:
    """Views of the per-rank tensors of a list-style call, checked against ``like``."""
    if len(tensors) != comm.size:
        raise CommflowError(
            f"{describe(comm, call)}: expected {comm.size} tensors (one per rank), got "
            f"{len(tensors)}"
        )
    views = [as_flat(t, f"{call} tensor {i}") for i, t in enumerate(tensors)]
    for i, v in enumerate(views):
        if v.size != like.size or v.dtype != like.dtype:
            raise NotImplementedError(
                f"commflow backend: {call} with tensor {i} of {v.size} {v.dtype} elements "
                f"next to {like.size} {like.dtype} ones; every tensor must match"
            )
    return views


def check_sized(comm: Communicator, big: np.ndarray, small: np.ndarray, call: str) -> None:
    """``big`` must hold group size x ``small``'s elements, of its dtype."""
    if big.size != comm.size * small.size or big.dtype != small.dtype:
        raise CommflowError(
            f"{describe(comm, call)}: the large tensor must hold group size ({comm.size}) "
            f"x {small.size} elements of {small.dtype}, got {big.size} of {big.dtype}"
        )


def unsupported(call: str, hint: str) -> Callable:
    """A method that raises ``NotImplementedError`` naming ``call`` and ``hint``."""
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"commflow backend: {call} is not supported; {hint}")

    method.__doc__ = f"Not supported: raises ``NotImplementedError`` ({hint})."
    return method
