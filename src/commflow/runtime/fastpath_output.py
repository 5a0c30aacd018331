"""How the fast path (:mod:`commflow.runtime.fastpath`) writes a call's output: plain
stores, or non-temporal ones (variant ``store="stream"``,
:mod:`commflow.runtime._stream_kernels`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class Output:
    """How a call writes its output: plain stores, or (``scratch`` given) non-temporal
    copies, with reductions computed into ``scratch``, a private segment that stays in the
    caches, and then streamed out (:attr:`Variant.store`)."""

    def __init__(self, scratch: np.ndarray | None) -> None:
        self.scratch = scratch
        if scratch is None:
            self.copy: Callable[[np.ndarray, np.ndarray], None] = np.copyto
        else:
            from commflow.runtime._stream_kernels import stream_copy
            self.copy = stream_copy

    def target(self, dst: np.ndarray) -> np.ndarray:
        """Where to compute what goes into ``dst`` (``dst`` itself for plain stores)."""
        return dst if self.scratch is None else self.scratch[:dst.size]

    def settle(self, dst: np.ndarray, into: np.ndarray) -> None:
        """Move what was computed into ``target(dst)`` to ``dst``."""
        if into is not dst:
            self.copy(dst, into)


PLAIN = Output(None)
"""The writer with plain stores (the defaults)."""
