"""Reliability fixes: overlapping output, read-only output, bad algo/timeout, a communicator
that timed out is unusable."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from .harness import run_world


def _overlap(comm):
    n, r = comm.size, comm.rank
    wrong = {}
    for algo in ("shm", "ring"):
        for size, shift in ((1 << 18, 3), (1000, 1)):
            buf = np.zeros(size + shift, dtype=np.float32)
            buf[:size] = np.arange(size, dtype=np.float32) % 1000 + r
            x, out = buf[:size], buf[shift:]
            comm.allreduce(x, out=out, algo=algo)
            expect = (np.arange(size, dtype=np.float32) % 1000) * n + sum(range(n))
            wrong[(algo, size)] = int(np.count_nonzero(out != expect))
    return wrong


def test_output_partially_overlapping_the_input_gives_right_results():
    for wrong in run_world(_overlap, 2):
        assert all(v == 0 for v in wrong.values()), wrong


def _bad_calls(comm):
    errors = []
    ro = np.ones(4)
    ro.flags.writeable = False
    for call in (lambda: comm.allreduce(np.ones(4), out=ro),
                 lambda: comm.allreduce(np.ones(4), algo=None),
                 lambda: comm.allreduce(np.ones(4), timeout=float("nan")),
                 lambda: comm.allreduce(np.ones(4), timeout=float("inf")),
                 lambda: comm.allreduce(np.ones(4), timeout=-1.0)):
        try:
            call()
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")
    return errors


def test_bad_output_algo_and_timeout_get_clear_errors():
    errors = run_world(_bad_calls, 2)[0]
    assert len(errors) == 5, errors
    for want, got in zip(["read-only", "algo must be", "timeout must be", "timeout must be",
                          "timeout must be"], errors, strict=True):
        assert got.startswith("CommflowError") and want in got, (want, got)


def _after_timeout(comm):
    from commflow.runtime import CommAbortedError, CommTimeoutError

    if comm.rank == 1:
        with contextlib.suppress(CommTimeoutError):
            comm.allreduce(np.ones(4), timeout=0.3)
        try:
            comm.allreduce(np.ones(4))
        except CommAbortedError as err:
            return str(err)
        return "usable"
    import time

    time.sleep(1.5)
    return "idle"


def test_communicator_unusable_after_a_timeout():
    got = run_world(_after_timeout, 2)[1]
    assert "create a new communicator" in got, got


def test_default_timeout_comes_from_commflow_timeout():
    from commflow.errors import CommflowError
    from commflow.runtime.init import DEFAULT_TIMEOUT, default_timeout

    assert default_timeout({}) == DEFAULT_TIMEOUT == 300.0
    assert default_timeout({"COMMFLOW_TIMEOUT": "12.5"}) == 12.5
    for bad in ("nan", "inf", "-3", "0", "soon"):
        with pytest.raises(CommflowError, match="COMMFLOW_TIMEOUT"):
            default_timeout({"COMMFLOW_TIMEOUT": bad})


def test_rendezvous_store_listens_on_loopback_only_for_a_loopback_master():
    import socket
    import subprocess

    from commflow.runtime.transport.gloo import GlooWire

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    wire = GlooWire.connect(rank=0, size=1, job="loopback", timeout=10,
                     env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                               text=True, check=True).stdout.split()
    assert listening[3] == f"127.0.0.1:{port}", listening
    assert wire.size == 1  # the store serves while the wire lives
