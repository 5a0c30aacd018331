"""A rank that finds a mismatch lets its posted sends go out before it raises (bounded)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from commflow.collectives import Collective
from commflow.runtime import executor, programs
from commflow.runtime.errors import CommMismatchError, CommProtocolError
from commflow.runtime.executor import run_plan
from commflow.runtime.ops import reducer


class _Send:
    """A send that goes out after ``polls`` polls (gloo's, once the peer asked for it)."""

    def __init__(self, polls: int) -> None:
        self.left = polls

    def poll(self) -> bool:
        self.left -= 1
        return self.left <= 0

    def detach(self) -> None:
        """Sends here own their data."""


class _Recv:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def poll(self) -> bool:
        raise self.error

    def detach(self) -> None:
        """Receives own no source data."""


class _Endpoint:
    def __init__(self, send_polls: int, error: Exception) -> None:
        self.sends: list[_Send] = []
        self.send_polls, self.error = send_polls, error

    def start_send(self, peer, channel, parts):
        self.sends.append(_Send(self.send_polls))
        return self.sends[-1]

    def start_recv(self, peer, channel, elements, sink):
        return _Recv(self.error)

    def idle(self, rounds, deadline):
        time.sleep(0.001)


def _run(endpoint: _Endpoint, deadline: float) -> None:
    plan = programs.rank_plan(Collective.ALLREDUCE, "direct", 2, None, 0, 4)
    x = np.ones(4, np.float32)
    run_plan(plan, (x, np.empty_like(x), np.empty(plan.scratch_elements, np.float32)),
             endpoint, reducer("sum", x.dtype), deadline=deadline, what="allreduce #0",
             seq=0)


def test_a_mismatch_is_raised_after_the_posted_sends_went_out():
    endpoint = _Endpoint(50, CommMismatchError("rank 1 called allgather"))
    with pytest.raises(CommMismatchError, match="allgather"):
        _run(endpoint, time.monotonic() + 30)
    assert [s.left for s in endpoint.sends] == [0]


def test_the_grace_ends_at_the_deadline_and_other_errors_raise_at_once(monkeypatch):
    monkeypatch.setattr(executor, "MISMATCH_GRACE", 0.05)
    endpoint = _Endpoint(10**9, CommMismatchError("mismatch"))
    start = time.monotonic()
    with pytest.raises(CommMismatchError):
        _run(endpoint, time.monotonic() + 30)
    assert 0.05 <= time.monotonic() - start < 5
    endpoint = _Endpoint(50, CommProtocolError("bad header"))
    with pytest.raises(CommProtocolError):
        _run(endpoint, time.monotonic() + 30)
    assert endpoint.sends[0].left > 0
