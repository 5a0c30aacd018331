"""Runtime errors surface in the calling rank, as gloo's do: a timeout, ranks calling
different operations (here: different algorithms through COMMFLOW_ALGO), and a dead peer, both
from torch.distributed calls and from inside DDP's backward pass."""

from __future__ import annotations

import os
import re
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import commflow.torch as cft

from .harness import run_group


def _describe(call) -> str:
    try:
        call()
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return "no error"


def _silent_peer() -> str:
    if dist.get_rank() == 0:
        return _describe(lambda: dist.all_reduce(torch.ones(4)))
    work = dist.irecv(torch.empty(2), 0)
    seen = _describe(lambda: work.wait(timedelta(seconds=0.3)))
    time.sleep(3)  # stay alive, silent, past rank 0's deadline
    return seen


def test_timeout_and_work_wait_timeout_raise_in_the_calling_rank():
    start = time.monotonic()
    all_reduce, wait = run_group(_silent_peer, 2, timeout=2)
    assert re.match(r"CommTimeoutError: allreduce #0 .*rank 0: .*\[1\]", all_reduce)
    assert wait == (
        "CommTimeoutError: commflow recv from rank 0 (tag 0) on rank 1 of 2: not "
        "complete after 0.3 s (Work.wait timeout)"
    )
    assert time.monotonic() - start < 20


def _different_algorithms() -> str:
    os.environ[cft.ENV_VAR] = "allreduce:ring" if dist.get_rank() == 0 else "allreduce:direct"
    return _describe(lambda: dist.all_reduce(torch.ones(4)))


def test_ranks_choosing_different_algorithms_get_a_mismatch_error():
    results = run_group(_different_algorithms, 2)
    assert all(res.startswith("CommMismatchError") for res in results)
    assert any("algo=ring" in res or "algo=direct" in res for res in results)


def _dead_peer() -> tuple[str, str]:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    if dist.get_rank() == 1:
        os._exit(3)
    collective = _describe(lambda: dist.all_reduce(torch.ones(3)))
    backward = _describe(lambda: model(torch.ones(2, 4)).sum().backward())
    return collective, backward


def test_dead_peer_raises_from_collectives_and_from_ddp():
    (ok, result), (peer_ok, peer) = run_group(_dead_peer, 2, timeout=10, expect_failure=True)
    assert (ok, peer_ok, peer) == (True, False, "died with exit code 3")
    collective, backward = result
    assert collective.startswith("CommAbortedError: allreduce #")
    assert "rank 1 (pid " in collective and "has exited" in collective
    assert backward.startswith("RuntimeError: ")
    assert "CommAbortedError" in backward and "rank 1 has exited" in backward
