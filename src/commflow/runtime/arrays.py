"""Views of user arrays (numpy arrays, torch CPU tensors) as flat numpy arrays, zero-copy."""

from __future__ import annotations

import numpy as np

from commflow.errors import CommflowError
from commflow.runtime.ops import dtype_of


def as_numpy(x, what: str) -> np.ndarray:
    """A numpy view of ``x`` sharing its memory (torch CPU tensors included; bfloat16 tensors
    become ml_dtypes.bfloat16 arrays). Raises ``CommflowError`` for non-contiguous or
    non-CPU inputs, or unsupported dtypes."""
    if isinstance(x, np.ndarray):
        arr = x
    elif type(x).__module__.startswith("torch"):
        arr = _torch_view(x, what)
    else:
        raise CommflowError(f"{what}: expected a numpy array or torch tensor, got "
                            f"{type(x).__name__}")
    if not arr.flags.c_contiguous:
        raise CommflowError(f"{what}: the array must be C-contiguous (call .copy() or "
                            f".contiguous() first)")
    dtype_of(arr.dtype)
    return arr


def _torch_view(t, what: str) -> np.ndarray:
    import torch

    if t.device.type != "cpu":
        raise CommflowError(f"{what}: tensor is on {t.device}; commflow runs on CPU tensors")
    if not t.is_contiguous():
        raise CommflowError(f"{what}: tensor must be contiguous (call .contiguous())")
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtype_of("bfloat16"))
    return t.numpy()


def flat(arr: np.ndarray) -> np.ndarray:
    """A 1-D view of a contiguous array."""
    return arr.reshape(-1)


def like(x, shape: tuple[int, ...]):
    """A new uninitialised array (or tensor, if ``x`` is one) of ``x``'s dtype and ``shape``."""
    if isinstance(x, np.ndarray):
        return np.empty(shape, dtype=x.dtype)
    import torch

    return torch.empty(shape, dtype=x.dtype)
