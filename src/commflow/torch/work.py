"""Where the ``commflow`` backend's operations run, and the Work objects torch receives.

Every process group built on one commflow world shares one progress thread: operations are
issued there one after another in issue order, so each communicator numbers them the same way
on every rank. Most run there to completion; all-reduces are started on the communicator's
lanes instead (:meth:`Progress.start`), so that over the engine transport between hosts up to
its slots' worth of them progress at once (see ``Communicator``), their per-message waits
overlapping each other's transfers. Futures are completed from a small pool, not from the
progress thread, so that a future's callbacks may issue and wait on later operations (as
PowerSGD's hook does) without blocking the thread those operations need.

A failed operation fails its torch future at the C++ level, so that C++ consumers such as DDP's
reducer raise (a ``RuntimeError`` carrying commflow's message) instead of reading a bad value;
``CommflowWork.wait()`` re-raises the original commflow exception itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist

from commflow.errors import CommflowError
from commflow.runtime import CommTimeoutError
from commflow.runtime.calls import Handle

_COMPLETERS = 4
"""Threads completing futures: how deeply callbacks may nest blocking waits."""


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _unwrap(base: torch.futures.Future) -> object:
    value = base.value()
    if isinstance(value, _Failure):
        raise value.error
    return value


class Outcome:
    """The result of one operation: :attr:`future` is what torch sees (value, or an error at
    the C++ level); :meth:`error` keeps the original exception."""

    def __init__(self) -> None:
        self._base: torch.futures.Future = torch.futures.Future()
        self.future: torch.futures.Future = self._base.then(_unwrap)

    def complete(self, value: object = None, error: Exception | None = None) -> None:
        """Set the value, or fail with ``error``; runs the future's callbacks."""
        self._base.set_result(value if error is None else _Failure(error))

    def error(self) -> BaseException | None:
        """The operation's exception once it failed, else ``None``."""
        if not self._base.done():
            return None
        value = self._base.value()
        return value.error if isinstance(value, _Failure) else None


class Progress:
    """The progress thread of one commflow world and its completion pool."""

    def __init__(self, name: str = "commflow-torch") -> None:
        self._runner = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._completer = ThreadPoolExecutor(_COMPLETERS, thread_name_prefix=f"{name}-done")
        self._started = 0
        self._idle = threading.Condition()

    def run(self, job: Callable[[], None]) -> None:
        """Queue ``job`` behind everything queued before it. Raises ``CommflowError`` once
        :meth:`close` was called."""
        try:
            self._runner.submit(job)
        except RuntimeError:
            raise CommflowError(
                "commflow process group was destroyed; create a new one with "
                "dist.init_process_group('commflow')"
            ) from None

    def settle(
        self, outcome: Outcome, value: object = None, error: Exception | None = None
    ) -> None:
        """Complete ``outcome`` with ``value``, or fail it with ``error``, from the pool."""
        self._completer.submit(outcome.complete, value, error)

    def submit(self, job: Callable[[], object]) -> Outcome:
        """Queue ``job``; its outcome holds the result or the exception."""
        outcome = Outcome()

        def run() -> None:
            try:
                value = job()
            except Exception as err:  # handed to whoever waits on the outcome
                self.settle(outcome, error=err)
                return
            self.settle(outcome, value)

        self.run(run)
        return outcome

    def start(self, job: Callable[[], Sequence[Handle]], value: object) -> Outcome:
        """Queue ``job``, which starts operations on a communicator and returns their
        handles; the outcome completes with ``value`` once all of them have finished, or
        fails with the first error (or ``job``'s own)."""
        outcome = Outcome()

        def run() -> None:
            try:
                handles = list(job())
            except Exception as err:  # handed to whoever waits on the outcome
                self.settle(outcome, error=err)
                return
            if not handles:
                self.settle(outcome, value)
                return
            left, errors, lock = [len(handles)], [], threading.Lock()
            with self._idle:
                self._started += 1

            def finished(error: BaseException | None) -> None:
                with lock:
                    if error is not None:
                        errors.append(error)
                    left[0] -= 1
                    if left[0]:
                        return
                self.settle(outcome, value, errors[0] if errors else None)
                with self._idle:
                    self._started -= 1
                    self._idle.notify_all()

            for handle in handles:
                handle.add_done_callback(finished)

        self.run(run)
        return outcome

    def close(self) -> None:
        """Finish the queued operations (the started ones included) and completions, then
        stop the threads."""
        self._runner.shutdown(wait=True)
        with self._idle:
            self._idle.wait_for(lambda: self._started == 0)
        self._completer.shutdown(wait=True)


class CommflowWork(dist.Work):
    """The Work of one operation: ``wait()`` blocks until the data is in place and re-raises
    the operation's error (``CommTimeoutError``, ``CommMismatchError``,
    ``CommAbortedError``, ...) in the calling thread."""

    def __init__(
        self,
        outcome: Outcome,
        what: str,
        start: Callable[[], None] | None = None,
        source: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        self._source = source
        self._outcome = outcome
        self._what = what
        self._start = start

    def _begin(self) -> None:
        if self._start is not None:
            self._start()

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until done (at most ``timeout`` if positive, else ``CommTimeoutError``);
        re-raise the operation's error. Returns True."""
        self._begin()
        future = self._outcome.future
        seconds = timeout.total_seconds() if timeout is not None else 0.0
        if seconds > 0 and not _done_within(future, seconds):
            raise CommTimeoutError(
                f"{self._what}: not complete after {seconds:g} s (Work.wait timeout)",
                op=self._what,
                seq=-1,
                peers=(),
            )
        try:
            future.wait()
        except RuntimeError:
            original = self._outcome.error()
            if original is None:
                raise
            raise original from None
        return True

    def get_future(self) -> torch.futures.Future:
        """The future completed with the operation's output tensors."""
        self._begin()
        return self._outcome.future

    def is_completed(self) -> bool:
        """Whether the operation finished (successfully or not)."""
        self._begin()
        return self._outcome.future.done()

    def _source_rank(self) -> int:
        """Wait, then the group rank a receive from any source read from (torch's name)."""
        self.wait()
        if self._source is None:
            raise RuntimeError(f"{self._what}: not a receive from any source")
        return self._source()

    def result(self) -> list[torch.Tensor]:
        """Wait, then return the output tensors."""
        self.wait()
        return self._outcome.future.value()


def _done_within(future: torch.futures.Future, seconds: float) -> bool:
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    return done.wait(seconds)
