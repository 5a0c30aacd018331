"""Switches on loopback (a ``commflow ina switch`` process, or a forked ``run_switch``, which
starts in milliseconds), and worker threads that call them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict

import numpy as np
import pytest

from commflow.ina import Faults, WorkerStats, ina_allreduce, run_switch


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


class ForkedSwitch:
    """``run_switch`` in a forked child (no interpreter start-up): ``addr``, and ``stop()``
    returns its statistics (with the faults' ``dropped`` and ``duplicated``) as a dict."""

    def __init__(self, nranks: int, slots: int = 64, *, values: int = 256, loss: float = 0.0,
                 dup: float = 0.0, lease: float = 30.0) -> None:
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            status = 1
            try:
                os.close(read)
                stop = threading.Event()
                signal.signal(signal.SIGTERM, lambda *_: stop.set())
                faults = Faults(drop=loss, duplicate=dup, seed=7)
                stats = run_switch("127.0.0.1", 0, nranks, slots, values=values, faults=faults,
                                   lease=lease, stop=stop,
                                   ready=lambda a: os.write(write, f"{a[1]}\n".encode()))
                os.write(write, json.dumps({**asdict(stats), "dropped": faults.dropped,
                                            "duplicated": faults.duplicated}).encode())
                status = 0
            finally:
                os._exit(status)
        os.close(write)
        self.pipe = os.fdopen(read)
        self.addr = ("127.0.0.1", int(self.pipe.readline()))

    def stop(self) -> dict:
        os.kill(self.pid, signal.SIGTERM)
        stats = json.loads(self.pipe.read())
        assert os.waitpid(self.pid, 0)[1] == 0
        self.pipe.close()
        return stats


@pytest.fixture
def forked():
    """``forked(nranks, ...) -> ForkedSwitch``; every one started is stopped at the end."""
    started: list[ForkedSwitch] = []

    def start(*args, **kwargs) -> ForkedSwitch:
        started.append(ForkedSwitch(*args, **kwargs))
        return started[-1]

    yield start
    for s in started:
        if not s.pipe.closed:
            os.kill(s.pid, signal.SIGKILL)
            os.waitpid(s.pid, 0)


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


def on_threads(work: Callable[[int], object], n: int, timeout: float = 120.0) -> list:
    """``work(rank)`` on one thread per rank; the results by rank, or the first rank's
    exception re-raised."""
    outs: list = [None] * n
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            outs[rank] = work(rank)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    if errors:
        raise errors[0]
    return outs


def allreduce_threads(xs: list[np.ndarray], addr: tuple[str, int], *,
                      drop: float = 0.0, dup: float = 0.0,
                      call: Callable = ina_allreduce, **kwargs
                      ) -> tuple[list[np.ndarray], list[WorkerStats]]:
    """Run ``ina_allreduce`` on one thread per rank; re-raises a rank's exception."""
    n = len(xs)
    stats = [WorkerStats() for _ in range(n)]
    outs = on_threads(lambda rank: call(
        xs[rank], switch=addr, rank=rank, nranks=n, stats=stats[rank],
        faults=Faults(drop=drop, duplicate=dup, seed=100 + rank), **kwargs), n)
    return outs, stats
