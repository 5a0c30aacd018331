"""Communicator.shrink: the survivors of a killed rank (or an abort) agree on one membership,
get dense ranks and exact results; a rank that comes too late or a coordinator that never
comes makes every caller raise; the random-kill stress run agrees every time."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from commflow.errors import CommflowError
from commflow.runtime import CommAbortedError, CommTimeoutError

from .harness import run_world

ROOT = Path(__file__).resolve().parents[2]


def _exact(comm) -> bool:
    """allreduce (fast path and ring) and allgather on ``comm`` equal numpy over its ranks."""
    me = comm.ranks[comm.rank]
    ok = True
    for n, algo in ((300, "auto"), (1 << 15, "ring")):
        x = np.arange(n, dtype=np.float64) * (me + 1)
        ok &= np.array_equal(comm.allreduce(x, algo=algo),
                             sum(np.arange(n, dtype=np.float64) * (r + 1) for r in comm.ranks))
    got = comm.allgather(np.full(3, me, np.int64), algo="direct")
    return bool(ok and np.array_equal(got, np.repeat(comm.ranks, 3)))


def _after_a_death(comm, victims):
    for victim in victims:
        if comm.ranks[comm.rank] == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        with pytest.raises(CommAbortedError):
            comm.allreduce(np.ones(1024, np.float32), timeout=20)
        comm = comm.shrink(timeout=10)
    return comm.rank, comm.size, comm.ranks, _exact(comm)


@pytest.mark.parametrize("victims", [[2], [0], [3, 0]], ids=["rank2", "coordinator", "twice"])
def test_survivors_of_a_killed_rank_agree_and_compute_exactly(victims):
    results = run_world(_after_a_death, 4, victims, timeout=30, expect_failure=True)
    survivors = [r for r in range(4) if r not in victims]
    assert [results[r] for r in survivors] == [
        (True, (i, len(survivors), survivors, True)) for i in range(len(survivors))]


def _coordinator_dies(comm, when):
    from commflow.runtime import shrink

    if comm.rank == 0 and when == "before the decision":  # after creating the segment
        create = shrink._Build.__init__

        def create_then_die(self, *args, **kwargs):
            create(self, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)

        shrink._Build.__init__ = create_then_die
    elif comm.rank == 0:  # after deciding, before committing the outcome
        shrink._commit = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
    new = comm.shrink(timeout=10)
    sizes = [new.size]
    if new.size == 4:  # rank 0 was ready when it died: its death shows at the first call
        with pytest.raises(CommAbortedError, match="rank 0"):
            new.allreduce(np.ones(8, np.float32))
        new = new.shrink(timeout=10)
        sizes.append(new.size)
    leftovers = sorted(p.name for p in Path("/dev/shm").glob(f"commflow.{comm.spec.job}.*"))
    return sizes, new.ranks, _exact(new), leftovers


@pytest.mark.parametrize("when", ["before the decision", "before the outcome"])
def test_a_successor_finishes_the_shrink_of_a_coordinator_that_died(when):
    results = run_world(_coordinator_dies, 4, when, timeout=30, expect_failure=True)
    sizes = [3] if when == "before the decision" else [4, 3]
    assert results[1:] == [(True, (sizes, [1, 2, 3], True, []))] * 3


def _after_abort(comm):
    if comm.rank == 1:
        comm.abort("test")
    else:
        with pytest.raises(CommAbortedError, match="aborted by rank 1"):
            comm.allreduce(np.ones(8, np.float32), timeout=20)
    new = comm.shrink(timeout=10)
    with pytest.raises(CommAbortedError, match="unusable after"):
        comm.allreduce(np.ones(8, np.float32))
    with pytest.raises(CommflowError, match="already called"):
        comm.shrink()
    return new.rank, new.ranks, _exact(new)


def test_shrink_after_abort_keeps_every_live_rank():
    assert run_world(_after_abort, 3, timeout=30) == [(r, [0, 1, 2], True) for r in range(3)]


def _segment(comm):
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    new = comm.shrink(timeout=10)
    name = new.transport.host.region.name
    maps = [line.split() for line in Path("/proc/self/maps").read_text().splitlines()
            if name in line]
    mode = os.stat(f"/proc/self/map_files/{maps[0][0]}").st_mode
    return name, stat.S_IMODE(mode), maps[0][-1], (Path("/dev/shm") / name).exists()


def test_the_new_segment_is_owner_only_and_unlinked():
    results = run_world(_segment, 3, timeout=30, expect_failure=True)
    for r in (0, 2):
        ok, (name, mode, deleted, exists) = results[r]
        assert ok and ".shrink" in name and mode == 0o600 and deleted == "(deleted)"
        assert not exists
    assert results[0][1][0] == results[2][1][0]


def _late(comm):
    if comm.rank == 3:
        time.sleep(1.8)  # alive, but calls after the others decided (half their timeout)
        with pytest.raises(CommAbortedError, match="formed a communicator without this rank"):
            comm.shrink(timeout=2)
        return None
    new = comm.shrink(timeout=2)
    return new.ranks, _exact(new)


def test_a_rank_that_calls_after_the_decision_is_left_out():
    assert run_world(_late, 4, timeout=30) == [([0, 1, 2], True)] * 3 + [None]


def _absent_coordinator(comm):
    if comm.rank == 0:
        time.sleep(2)  # alive, never calls in time: nobody else may decide
        with pytest.raises(CommAbortedError, match="rank 1 gave up"):
            comm.shrink(timeout=3)
        return "raised"
    start = time.monotonic()
    with pytest.raises(CommTimeoutError, match="rank 0 .the coordinator.* did not call"):
        comm.shrink(timeout=1)
    took = time.monotonic() - start
    time.sleep(3)  # alive (a rank that exited would simply be dead) when rank 0 calls
    return round(took)


def test_a_coordinator_that_never_calls_makes_every_rank_raise():
    assert run_world(_absent_coordinator, 3, timeout=30) == ["raised", 1, 1]


def _split(comm):
    sub = comm.split(comm.rank % 2)
    with pytest.raises(CommflowError, match="only a communicator that owns"):
        sub.shrink()
    return True


def test_a_split_communicator_cannot_shrink():
    assert run_world(_split, 2, timeout=30) == [True, True]


def test_random_kills_agree_and_stay_exact():
    # the stress run of docs/reliability.md (200 runs there), with fewer runs
    done = subprocess.run(
        [sys.executable, "benchmarks/shrink_stress.py", "--runs", "4", "--json"], cwd=ROOT,
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["runs"] == 4 and summary["shrinks"] >= 4 and summary["checked"] > 40
    assert (summary["split_brain"], summary["wrong"], summary["hangs"],
            summary["leftovers"]) == (0, 0, 0, 0)
