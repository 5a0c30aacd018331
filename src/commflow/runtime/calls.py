"""What one call of a :class:`~commflow.runtime.communicator.Communicator` carries: the
:class:`Handle` of an asynchronous operation, the checked :class:`Call`, and the argument
checks shared with :mod:`commflow.runtime.init`."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.ir import Program
from commflow.runtime.errors import CommTimeoutError
from commflow.runtime.ops import Reducer


class Handle:
    """An operation started with ``async_op=True``."""

    def __init__(self, future: Future, result) -> None:
        self._future = future
        self._result = result

    def wait(self, timeout: float | None = None):
        """Block until the operation is done (at most ``timeout`` seconds, else
        ``CommTimeoutError``); returns its result; re-raises its error."""
        try:
            self._future.result(timeout)
        except TimeoutError:
            raise CommTimeoutError(f"async operation not done after {timeout} s", op="wait",
                                   seq=-1, peers=()) from None
        return self._result

    def is_completed(self) -> bool:
        """Whether the operation has finished (successfully or not)."""
        return self._future.done()

    def add_done_callback(self, fn: Callable[[BaseException | None], None]) -> None:
        """Call ``fn(error)`` once the operation has finished (``error`` is ``None`` on
        success), from the thread that ran it, or now if it has finished already."""
        self._future.add_done_callback(lambda future: fn(future.exception()))


@dataclass
class Call:
    """One collective call, checked: buffers, unit, op, root and algorithm."""

    collective: Collective
    send: np.ndarray
    recv: np.ndarray
    unit: int
    op: str
    root: int
    algo: str | Program
    reduce: Reducer | None = None


def check_timeout(timeout: float, what: str) -> float:
    """``timeout`` (s) if it is a finite number above zero, else ``CommflowError``."""
    if not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
        raise CommflowError(f"{what}: timeout must be a finite number of seconds above 0, got "
                            f"{timeout!r}")
    return float(timeout)


def in_place(send: np.ndarray, recv: np.ndarray, rank: int) -> bool:
    """Whether ``send`` and ``recv`` (flat) are an in-place call, which the fast path runs
    without a copy and ``auto`` may choose for apart (a tuning rule may hold for one
    placement): the same buffer, on any rank, or the smaller one exactly at block ``rank`` of
    the larger (allgather/gather input, reduce-scatter/scatter output). Any other overlap is
    copied."""
    if send.nbytes == recv.nbytes:
        return send.nbytes > 0 and send.ctypes.data == recv.ctypes.data
    small, large = sorted((send, recv), key=lambda a: a.nbytes)
    return (small.nbytes > 0 and large.nbytes % small.nbytes == 0
            and small.ctypes.data == large.ctypes.data + rank * small.nbytes
            and (rank + 1) * small.nbytes <= large.nbytes)
