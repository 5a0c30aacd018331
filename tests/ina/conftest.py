"""A ``commflow ina switch`` process on loopback, and worker threads that call it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import numpy as np
import pytest

from commflow.ina import Faults, WorkerStats, ina_allreduce


class SwitchProcess:
    """A running switch: ``addr`` to pass to workers, ``stop()`` returns its final line."""

    def __init__(self, *args: str) -> None:
        port = () if "--port" in args else ("--port", "0")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "commflow.cli", "ina", "switch", *port, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.line = self.proc.stdout.readline().rstrip("\n")
        found = re.match(r"listening on ([\d.]+):(\d+) ", self.line)
        assert found, self.line + self.proc.stderr.read()
        self.addr = (found.group(1), int(found.group(2)))

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=10)
        assert self.proc.returncode == 0, err
        return out


@pytest.fixture
def switch():
    """``switch(*cli_args) -> SwitchProcess``; every switch started is stopped at the end."""
    started: list[SwitchProcess] = []

    def start(*args: str) -> SwitchProcess:
        started.append(SwitchProcess(*args))
        return started[-1]

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


def allreduce_threads(xs: list[np.ndarray], addr: tuple[str, int], *,
                      drop: float = 0.0, dup: float = 0.0,
                      call: Callable = ina_allreduce, **kwargs
                      ) -> tuple[list[np.ndarray], list[WorkerStats]]:
    """Run ``ina_allreduce`` on one thread per rank; re-raises a rank's exception."""
    n = len(xs)
    outs: list = [None] * n
    stats = [WorkerStats() for _ in range(n)]
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            outs[rank] = call(xs[rank], switch=addr, rank=rank, nranks=n, stats=stats[rank],
                              faults=Faults(drop=drop, duplicate=dup, seed=100 + rank),
                              **kwargs)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return outs, stats
