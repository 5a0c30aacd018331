"""How the fast path (:mod:`commflow.runtime.fastpath`) writes a call's output: plain
stores, or non-temporal ones (variant ``store="stream"``,
:mod:`commflow.runtime._stream_kernels`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commflow.runtime.ops import Reducer


class Output:
    """How a call writes its output: plain stores, or (``scratch`` given) non-temporal ones:
    copies streamed, sums of common dtypes added and streamed by one kernel, and other
    reductions (and partial results) computed into ``scratch``, a private segment that
    stays in the caches, then streamed out (:attr:`Variant.store`)."""

    def __init__(self, scratch: np.ndarray | None) -> None:
        self.scratch = scratch
        if scratch is None:
            self.copy: Callable[[np.ndarray, np.ndarray], None] = np.copyto
        else:
            from commflow.runtime._stream_kernels import stream_add, stream_copy
            self.copy, self._add = stream_copy, stream_add

    def target(self, dst: np.ndarray) -> np.ndarray:
        """Where to compute a partial result bound for ``dst`` (``dst`` itself for plain
        stores, else the scratch segment)."""
        return dst if self.scratch is None else self.scratch[:dst.size]

    def reduce(self, reduce: Reducer, a: np.ndarray, b: np.ndarray, dst: np.ndarray) -> None:
        """``dst = reduce(a, b)``; streamed: a sum the kernel adds itself
        (:func:`~commflow.runtime._stream_kernels.stream_add`), else reduced into the
        scratch segment and streamed out."""
        if self.scratch is None:
            reduce(a, b, dst)
        elif not (reduce is np.add and self._add(dst, a, b)):
            into = self.scratch[:dst.size]
            reduce(a, b, into)
            self.copy(dst, into)


PLAIN = Output(None)
"""The writer with plain stores (the defaults)."""
