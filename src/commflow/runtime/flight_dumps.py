"""When flight records (:mod:`commflow.runtime.flight`) are written, and by whom.

:func:`attach` gives a communicator its recorder. When an operation fails,
:func:`report_failure` dumps that recorder and those of the process's other communicators, and
asks the other ranks of the host to dump theirs (:func:`request_dumps`): a :class:`DumpWatcher`
thread per communicator sleeps on a word in the host's shared memory and dumps when it changes,
even while its rank is busy outside commflow.
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from commflow.runtime._futex import futex_wait, futex_wake
from commflow.runtime.flight import FlightConfig, FlightRecorder, _Record
from commflow.runtime.straggler import StragglerBoard

_WATCH_SLICE = 1.0


class DumpWatcher:
    """Dumps a recorder when another rank of the host asks (see :func:`request_dumps`).

    A daemon thread sleeps on ``word`` (an int32 in the host's shared memory, 0 until some rank
    fails, then that rank's global rank + 1) in one-second futex waits; it dumps once and ends,
    or ends when the recorder is garbage-collected.
    """

    def __init__(self, word: np.ndarray, address: int, recorder: FlightRecorder) -> None:
        self._word = word
        self._address = address
        self._recorder = weakref.ref(recorder)
        self._thread = threading.Thread(target=self._watch, name="commflow-flight", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            value = int(self._word[0])
            recorder = self._recorder()
            if recorder is None:
                return
            if value:
                recorder.failed_at = time.monotonic()
                recorder.failed_peer = value - 1
                recorder.dump_after(f"requested by rank {value - 1} after it failed",
                                    failed=False)
                return
            del recorder
            futex_wait(self._address, 0, _WATCH_SLICE)


def request_dumps(word: np.ndarray, address: int, global_rank: int) -> None:
    """Ask every rank watching ``word`` to dump (first request wins) and wake them."""
    if not word[0]:
        word[0] = global_rank + 1
    futex_wake(address)


def attach(config: FlightConfig, *, meta: dict, host) -> FlightRecorder | None:
    """A recorder per ``config`` (``None`` when it is off), watched for dump requests on
    ``host`` (a :class:`~commflow.runtime.transport.shm_host.ShmHost`, or ``None`` for a rank
    alone on its host), and for the world communicator (``comm_id`` 0) comparing straggler
    windows with the host's other ranks."""
    if not config.capacity:
        return None
    recorder = FlightRecorder(config.capacity, dump_dir=config.dump_dir, meta=meta)
    _LIVE.add(recorder)
    if host is not None:
        DumpWatcher(host.dump_word, host.dump_address, recorder)
        straggle = config.stragglers
        if meta["comm_id"] == 0 and straggle.enabled and straggle.window < config.capacity:
            recorder.board = StragglerBoard(host.straggler_lines, host.me, meta["global_rank"],
                                            straggle)
            recorder.set_window_end(straggle.window - 1)
    return recorder


_LIVE: weakref.WeakSet[FlightRecorder] = weakref.WeakSet()
"""This process's recorders (one per communicator), for :func:`report_failure`."""


def report_failure(recorder: FlightRecorder, host, global_rank: int, error: Exception,
                   entry: _Record | None = None) -> None:
    """After ``error`` (a failed operation, recorded as ``entry``; default: the one started
    last): mark the operation failed, dump the record and those of this process's other
    communicators (now, not from their watcher threads: the process may exit right after the
    error), ask the host's other ranks to dump theirs, and name the file at the end of the
    message."""
    recorder.fail(entry)
    path = recorder.dump_after(f"{type(error).__name__}: {error}", failed=True)
    for other in list(_LIVE):
        if other is not recorder:
            other.dump_after(f"rank {global_rank} failed on another communicator",
                             failed=False)
    if host is not None:
        request_dumps(host.dump_word, host.dump_address, global_rank)
    if path is not None and error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]} [flight record: {path}; compare every rank's with "
                      f"`commflow doctor {path.parent}`]", *error.args[1:])
