"""Data types and reduction operators of the runtime (numpy ufuncs; bfloat16 via ml_dtypes)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commflow.errors import CommflowError

OPS = ("sum", "prod", "min", "max", "avg")
"""Reduction operators, as torch.distributed and NCCL name them."""

_NAMES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool")

Reducer = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def dtype_of(spec: str | np.dtype | type) -> np.dtype:
    """The numpy dtype for a name (``"float32"``, ``"bfloat16"``, ...) or dtype.

    Raises ``CommflowError`` for unsupported types, listing the supported ones.
    """
    known = _KNOWN.get(spec)
    if known is not None:
        return known
    dt = _lookup(spec)
    _KNOWN[spec] = dt
    return dt


_KNOWN: dict[object, np.dtype] = {}


def _lookup(spec: str | np.dtype | type) -> np.dtype:
    if isinstance(spec, str) and spec == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        dt = np.dtype(spec)
    except TypeError:
        dt = None
    if dt is None or dt.name not in _NAMES:
        raise CommflowError(f"unsupported dtype {spec!r}; supported: {', '.join(_NAMES)}")
    return dt


def reducer(op: str, dtype: np.dtype) -> Reducer:
    """``f(a, b, out)`` computing ``out = a (op) b`` element-wise.

    ``avg`` reduces as ``sum`` (divide with :func:`finish`). Raises ``CommflowError`` for an
    unknown op, or ``avg`` on an integer or bool dtype.
    """
    if op not in OPS:
        raise CommflowError(f"unknown reduction op {op!r}; use one of {', '.join(OPS)}")
    if dtype == np.bool_:
        if op == "avg":
            raise CommflowError("op 'avg' needs a floating-point dtype, got bool")
        return np.logical_or if op in ("sum", "max") else np.logical_and
    if op == "avg" and dtype.kind in "iu":
        raise CommflowError(f"op 'avg' needs a floating-point dtype, got {dtype.name}")
    return {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
            "max": np.maximum}[op]


def finish(op: str, out: np.ndarray, nranks: int) -> None:
    """Post-process a reduced result in place (``avg``: divide by ``nranks``)."""
    if op == "avg":
        np.divide(out, nranks, out=out, casting="unsafe")
