"""Run a function on N real processes that form a commflow world over shared memory."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue as queue_module
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

_CTX = mp.get_context("fork")


def _child(fn: Callable, rank: int, nranks: int, job: str, timeout: float, queue, args) -> None:
    try:
        import commflow.runtime as runtime

        comm = runtime.init(rank=rank, world_size=nranks, job=job, timeout=timeout)
        queue.put((rank, True, fn(comm, *args)))
    except BaseException as err:  # reported to the parent, which re-raises
        queue.put((rank, False, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    finally:
        queue.close()
        queue.join_thread()
        os._exit(0)


def run_world(fn: Callable, nranks: int, *args, timeout: float = 30.0,
              expect_failure: bool = False) -> list:
    """Run ``fn(comm, *args)`` on ``nranks`` processes; return the results by rank.

    Raises ``AssertionError`` with every failing rank's traceback unless ``expect_failure``,
    in which case the per-rank ``(ok, result_or_error_text)`` pairs are returned.
    """
    job = f"t{uuid.uuid4().hex[:12]}"
    return run_ranks(_child, lambda r, queue: (fn, r, nranks, job, timeout, queue, args),
                     nranks, timeout=timeout, expect_failure=expect_failure)


def run_ranks(target: Callable, make_args: Callable, nranks: int, *, timeout: float,
              expect_failure: bool, context=_CTX) -> list:
    """Start ``nranks`` processes (``context``: forked by default) running
    ``target(*make_args(rank, queue))``; each puts ``(rank, ok, value)`` on the queue. Collects
    them (a rank that dies without reporting counts as failed), then returns values as
    :func:`run_world` does."""
    queue = context.Queue()
    procs = [context.Process(target=target, args=make_args(r, queue)) for r in range(nranks)]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, object]] = {}
    give_up = time.monotonic() + timeout + 30
    try:
        while len(results) < nranks and time.monotonic() < give_up:
            try:
                rank, ok, value = queue.get(timeout=0.2)
                results[rank] = (ok, value)
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs)
                        if r not in results and p.exitcode is not None]
                for r in dead:
                    time.sleep(0.2)  # a result may still be in the pipe
                    if r not in results:
                        results[r] = (False, f"died with exit code {procs[r].exitcode}")
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if expect_failure:
        return [results.get(r, (False, "no result")) for r in range(nranks)]
    missing = [r for r in range(nranks) if r not in results]
    assert not missing, f"ranks {missing} neither reported nor exited in time"
    failures = [f"rank {r}: {v}" for r, (ok, v) in sorted(results.items()) if not ok]
    assert not failures, "\n".join(failures)
    return [results[r][1] for r in range(nranks)]


def bits_differ(comm, algo: str) -> list[str]:
    """A float32 allreduce of arbitrary values with ``algo``: ``[]`` when every rank got the
    same bits, else one line saying they differ."""
    floats = np.random.default_rng(comm.rank).standard_normal(70_001).astype(np.float32)
    everyone = comm.allgather(comm.allreduce(floats, algo=algo)).reshape(comm.size, -1)
    if all(np.array_equal(everyone[0].view(np.uint32), row.view(np.uint32)) for row in everyone):
        return []
    return [f"{algo}: ranks differ in the bits of a float32 sum"]


def flight_entries(comm) -> list[dict]:
    """The communicator's flight record (every call so far, oldest first), dumped into a
    temporary folder that is removed again."""
    with tempfile.TemporaryDirectory() as folder:
        path = comm.dump_flight_record(Path(folder) / "record.json")
        return json.loads(path.read_text())["entries"]
