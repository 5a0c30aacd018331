"""The sender thread of :class:`commflow.torch.PriorityScheduler` in ``background`` mode: it
runs the scheduler's launches and waits, one job after another in the order the training
thread's hooks post them (the same order on every rank)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable

import torch.distributed as dist

from commflow.errors import CommflowError


class Sender:
    """A thread running posted jobs in order. When a job fails, the thread stops and sets
    every event ``events()`` returns, so that no waiter blocks on a reduction that will not
    come; the next :meth:`post` or :meth:`wait` raises ``CommflowError``."""

    def __init__(self, events: Callable[[], Iterable[threading.Event]]) -> None:
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._events = events
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="commflow-sched", daemon=True)
        self._thread.start()

    def post(self, job: Callable[[object], None], arg: object) -> None:
        """Queue ``job(arg)`` behind what was posted before; raises the error that stopped
        the thread, if one did."""
        self._raise()
        self._inbox.put((job, arg))

    def wait(self, done: threading.Event) -> None:
        """Block until ``done`` is set (a layer's partitions are reduced); raises the
        thread's error."""
        while not done.wait(timeout=1.0):
            if not self._thread.is_alive():
                break
        self._raise()

    def stop(self) -> None:
        """End the thread after the jobs posted so far."""
        self._inbox.put(None)
        self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise CommflowError(
                f"PriorityScheduler on rank {dist.get_rank()}: a background reduction failed: "
                f"{self._error}; the gradients of this step are lost, create a new scheduler"
            ) from self._error

    def _serve(self) -> None:
        while (item := self._inbox.get()) is not None:
            job, arg = item
            try:
                job(arg)
            except Exception as err:  # handed to the training thread at its next wait
                self._error = err
                for event in self._events():
                    event.set()
                return
