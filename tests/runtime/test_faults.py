"""Reliability: dead ranks, mismatched calls, corrupted messages and timeouts raise clear errors
on every rank, never hang."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from commflow.runtime import CommAbortedError, CommMismatchError

from .harness import run_world


def _errors(results) -> list[str]:
    assert all(not ok for ok, _ in results), results
    return [text.splitlines()[0] for _, text in results]


def _victim_dies(comm, algo):
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        comm.allreduce(np.ones(1 << 16, np.float32), algo=algo, timeout=20)
    finally:
        elapsed = time.monotonic() - start
        assert elapsed < 10, f"took {elapsed:.1f} s to notice the dead rank"


@pytest.mark.parametrize("algo", ["ring", "shm"])
def test_killed_rank_makes_the_others_raise(algo):
    results = run_world(_victim_dies, 3, algo, timeout=30, expect_failure=True)
    for rank in (0, 2):
        ok, text = results[rank]
        assert not ok
        assert "CommAbortedError" in text and "has exited" in text, text


def _mismatch(comm, what, algo):
    x = np.arange(64, dtype=np.float32)
    if comm.rank == 0 or what == "none":
        comm.allreduce(x, algo=algo, timeout=20)
    elif what == "collective":
        comm.allgather(x[:32], algo="ring" if algo == "ring" else "shm", timeout=20)
    elif what == "size":
        comm.allreduce(x[:32], algo=algo, timeout=20)
    elif what == "dtype":
        comm.allreduce(x.astype(np.float64), algo=algo, timeout=20)
    elif what == "op":
        comm.allreduce(x, "max", algo=algo, timeout=20)


@pytest.mark.parametrize("algo", ["ring", "shm"])
@pytest.mark.parametrize("what", ["collective", "size", "dtype", "op"])
def test_mismatched_calls_raise_on_every_rank(what, algo):
    results = run_world(_mismatch, 2, what, algo, timeout=30, expect_failure=True)
    for text in _errors(results):
        assert text.startswith("CommMismatchError"), text


def test_matching_calls_do_not_raise():
    run_world(_mismatch, 2, "none", "ring")


def _garbage(comm):
    host = comm.transport.host
    if comm.rank == 1:
        slot = host.free_slot(0)
        slot[:] = np.random.default_rng(0).integers(0, 256, len(slot), dtype=np.uint8)
        host.publish(0)
        time.sleep(1)
        return None
    comm.recv(np.zeros(16, np.float32), 1, timeout=10)


def test_garbage_in_the_transport_is_rejected():
    ok, text = run_world(_garbage, 2, timeout=30, expect_failure=True)[0]
    assert not ok and text.startswith("CommProtocolError") and "bad magic" in text, text


def _absent(comm):
    if comm.rank == 0:
        comm.allreduce(np.ones(4, np.float32), algo="ring", timeout=1.0)
    else:
        time.sleep(3)


def test_timeout_names_operation_sequence_and_peers():
    ok, text = run_world(_absent, 2, timeout=30, expect_failure=True)[0]
    assert not ok and text.startswith("CommTimeoutError"), text
    assert "allreduce #0" in text and "peers not heard from: [1]" in text, text


def _fast_path_against_a_program(comm, case):
    x = np.ones(1024, np.float32)
    start = time.monotonic()
    try:
        if case == "algo":
            comm.allreduce(x, algo="shm" if comm.rank == 0 else "ring")
        else:
            comm.allreduce(x) if comm.rank == 0 else comm.alltoall(x)
    except CommMismatchError as error:
        return "mismatch", time.monotonic() - start, str(error)
    return "ok", time.monotonic() - start, ""


@pytest.mark.parametrize("case", ["algo", "collective"])
def test_fast_path_against_a_program_path_is_a_mismatch_not_a_hang(case):
    # the fast path and a program exchange no messages: the ranks' posted current calls
    # tell them apart within a fraction of a second, not at the 30 s deadline
    results = run_world(_fast_path_against_a_program, 2, case, timeout=30)
    for kind, seconds, _ in results:
        assert kind == "mismatch" and seconds < 5, (kind, seconds)
    assert "called another operation in this slot" in results[0][2] + results[1][2]


def _roots_differ(comm, case, where):
    if where == "sub-communicator":  # no fast path: the stray messages fail the next call
        comm = comm.split(0)
    x = np.full(16, comm.rank + 1.0, np.float32)
    root = comm.rank if case == "each its own" else (2 if comm.rank == 2 else 0)
    done = []
    try:
        comm.broadcast(x, root=root, algo="binomial_tree", timeout=10)
        done.append("broadcast")
        if where == "sub-communicator":
            comm.allreduce(x, algo="ring", timeout=10)
        else:  # fast-path calls only, which read no message
            comm.allreduce(x[:4], timeout=10)
            comm.barrier(timeout=10)
        done.append("next")
    except (CommMismatchError, CommAbortedError) as error:
        return done, type(error).__name__
    return done, None


@pytest.mark.parametrize("where", ["world", "sub-communicator"])
@pytest.mark.parametrize("case", ["each its own", "two against one"])
def test_broadcasts_with_different_roots_are_caught(case, where):
    # roots that need no message from each other (every rank roots its own broadcast, or a
    # second root sends to ranks that never wait for it) would return different data: with
    # the fast path every rank compares the rooted call's signature (root included) with the
    # others' before it returns; without it, a local peer's posted call at the end of the
    # call (when the calls overlap) or the stray messages at the next call fail it
    results = run_world(_roots_differ, 3, case, where, timeout=30)
    for done, error in results:
        assert error is not None and "next" not in done, (case, where, results)
        if where == "world":
            assert done == [], (case, results)


def _abort_while_a_peer_waits(comm):
    x = np.ones(256, np.float32)
    if comm.rank == 0:
        time.sleep(0.5)
        comm.abort("the data loader failed")
        try:
            comm.allreduce(x)
        except CommAbortedError as error:
            return "later call", str(error)
        return "later call", "no error"
    start = time.monotonic()
    try:
        comm.allreduce(x)
    except CommAbortedError as error:
        return "waiting peer", time.monotonic() - start, str(error)
    return "waiting peer", time.monotonic() - start, "no error"


def test_abort_frees_waiting_peers_and_refuses_later_calls():
    aborter, waiter = run_world(_abort_while_a_peer_waits, 2, timeout=30)
    assert "abort() on rank 0 (the data loader failed)" in aborter[1]
    assert waiter[1] < 5 and "aborted by rank 0" in waiter[2]
