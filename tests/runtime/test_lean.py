"""The compiled small-message path (commflow.runtime.lean): exact results for every dtype and
op, the same errors as the other paths, a barrier that waits, and the compile notice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from commflow.runtime import CommAbortedError, CommTimeoutError, dtype_of
from commflow.runtime.lean import COMPILING
from commflow.runtime.variants import ONE_SHOT
from commflow.runtime.world import shared_cpus

from .harness import run_world

DTYPES = ("float32", "float64", "int8", "uint8", "int32", "int64", "bool", "float16",
          "bfloat16")
UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
          "max": np.maximum}
SIZES = (1, 7, 100, None)  # elements; None: as many as fit the one-shot size (16 KiB)


def _ops(dtype: np.dtype) -> tuple[str, ...]:
    return ("sum", "prod", "min", "max") + (("avg",) if dtype.kind == "f" or
                                             dtype.name == "bfloat16" else ())


def _input(dtype: np.dtype, rank: int, count: int) -> np.ndarray:
    """Small values (exact in every type, products within range), with NaN and both zeros
    among the floats so min/max show which operand wins."""
    rng = np.random.default_rng(1000 * rank + count)
    x = rng.integers(-2, 3, count)
    if dtype == np.bool_:
        return (x > 0).astype(dtype)
    if dtype.kind == "u":
        x = np.abs(x)
    x = x.astype(dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        x[::5] = -0.0 if rank % 2 else 0.0
        if count > 3:
            x[3] = np.nan if rank == 1 else x[3]
    return x


def _expected(dtype: np.dtype, op: str, nranks: int, count: int) -> np.ndarray:
    """numpy's reduction of the ranks' inputs in rank order."""
    ufunc = UFUNCS[op]
    if dtype == np.bool_:
        ufunc = np.logical_or if op in ("sum", "max") else np.logical_and
    acc = _input(dtype, 0, count)
    for r in range(1, nranks):
        acc = ufunc(acc, _input(dtype, r, count)).astype(dtype)
    if op == "avg":
        acc = (acc / nranks).astype(dtype)
    return acc


def _every_case(comm):
    wrong = []
    for name in DTYPES:
        dtype = dtype_of(name)
        for op in _ops(dtype):
            for count in SIZES:
                count = count or ONE_SHOT // dtype.itemsize
                x = _input(dtype, comm.rank, count)
                want = _expected(dtype, op, comm.size, count)
                results = {"new": comm.allreduce(x, op)}
                if count == 7:
                    inplace = x.copy()
                    comm.allreduce(inplace, op, out=inplace)
                    results["inplace"] = inplace
                    shaped = x.reshape(1, -1)
                    results["2-d"] = comm.allreduce(shaped, op, out=np.empty_like(shaped))[0]
                for how, got in results.items():
                    if got.tobytes() != want.tobytes():
                        wrong.append(f"{name} {op} {count} {how}: {got[:8]} != {want[:8]}")
    return wrong, comm._lean is not None and len(comm._lean._plans) > 0


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_dtype_and_op_is_exact(nranks):
    for wrong, compiled in run_world(_every_case, nranks, timeout=120):
        assert compiled
        assert not wrong, "\n".join(wrong[:10])


def _mixed_paths(comm):
    # rank 0 hands in a torch tensor (the general small path), rank 1 a numpy array (the
    # compiled one): they share the protocol and reduce in the same order
    import torch

    x = np.array([0.0, -0.0, 1.0, np.nan], np.float32) * (1 if comm.rank else -1)
    if comm.rank == 0:
        got = comm.allreduce(torch.from_numpy(x), "min").numpy()
    else:
        got = comm.allreduce(x, "min")
    comm.barrier()
    return got.tobytes()


def test_general_and_compiled_paths_agree_bit_for_bit():
    a, b = run_world(_mixed_paths, 2)
    assert a == b
    x1 = np.array([0.0, -0.0, 1.0, np.nan], np.float32)
    assert a == np.minimum(x1 * -1, x1).tobytes()


def _mismatch(comm, what):
    x = np.arange(16, dtype=np.float32)
    if comm.rank == 0:
        comm.allreduce(x, timeout=20)
    elif what == "size":
        comm.allreduce(x[:8], timeout=20)
    elif what == "dtype":
        comm.allreduce(x.astype(np.int32), timeout=20)
    elif what == "op":
        comm.allreduce(x, "max", timeout=20)
    else:
        comm.barrier(timeout=20)


@pytest.mark.parametrize("what", ["size", "dtype", "op", "barrier"])
def test_mismatched_small_calls_raise_on_every_rank(what):
    for ok, text in run_world(_mismatch, 2, what, timeout=30, expect_failure=True):
        assert not ok and text.startswith("CommMismatchError"), text
        assert "#0" in text, text


def _absent(comm, what):
    call = comm.barrier if what == "barrier" else lambda **kw: comm.allreduce(
        np.ones(4, np.float32), **kw)
    call()  # the first call loads the kernels; time the second
    if comm.rank == 1:
        time.sleep(2.5)
        return None
    start = time.monotonic()
    try:
        call(timeout=1.0)
    except CommTimeoutError as error:
        elapsed = time.monotonic() - start
        try:
            comm.allreduce(np.ones(4, np.float32))
        except CommAbortedError as later:
            return elapsed, str(error), str(later)
    return None


@pytest.mark.parametrize("what", ["allreduce", "barrier"])
def test_timeout_at_the_deadline_then_unusable(what):
    elapsed, error, later = run_world(_absent, 2, what, timeout=30)[0]
    assert 1.0 <= elapsed < 2.0, elapsed
    assert f"{what} #1 (shm) on rank 0: timed out waiting for ranks [1]" in error
    assert "unusable" in later


def _dies(comm):
    if comm.rank == 1:
        os.kill(os.getpid(), 9)
    start = time.monotonic()
    try:
        comm.barrier(timeout=20)
    except CommAbortedError as error:
        return time.monotonic() - start, str(error)
    return None


def test_dead_rank_is_noticed_in_a_barrier():
    ok, (elapsed, text) = run_world(_dies, 2, timeout=30, expect_failure=True)[0]
    assert ok and elapsed < 5 and "has exited" in text, (elapsed, text)


def _aborts(comm):
    if comm.rank == 0:
        time.sleep(0.3)
        comm.abort("test")
        return None
    start = time.monotonic()
    try:
        comm.allreduce(np.ones(2, np.int64), timeout=20)
    except CommAbortedError as error:
        return time.monotonic() - start, str(error)
    return None


def test_abort_frees_a_rank_waiting_on_the_small_path():
    elapsed, text = run_world(_aborts, 2)[1]
    assert elapsed < 3 and "aborted by rank 0" in text


def _barrier_waits(comm, tmp):
    if comm.rank == 1:
        time.sleep(0.5)
    entered = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
    comm.barrier()
    left = time.monotonic()
    comm.allreduce(np.ones(3, np.int32))
    record = comm.dump_flight_record(os.path.join(tmp, f"r{comm.rank}.json"))
    return (entered, left), record.read_text()


def test_barrier_waits_for_every_rank_and_is_recorded(tmp_path):
    results = run_world(_barrier_waits, 3, str(tmp_path))
    spans = [span for span, _ in results]
    assert min(left for _, left in spans) >= max(entered for entered, _ in spans)
    for _, text in results:
        entries = json.loads(text)["entries"]
        assert [(e["seq"], e["op"], e["algorithm"], e["state"]) for e in entries] == [
            (0, "barrier", "shm", "completed"), (1, "allreduce", "shm", "completed")]
        assert entries[1]["bytes"] == 12 and entries[1]["reduce"] == "sum"


def _mixed_records(comm, tmp):
    small, large = np.ones(4, np.float32), np.ones(1 << 16, np.float32)
    for _ in range(5):
        comm.allreduce(small)  # seq 0-4, logged by the kernel
    comm.allreduce(large)  # 5, recorded from Python (the general path)
    for _ in range(3):
        comm.barrier()  # 6-8, logged
    comm.allgather(small)  # 9, recorded
    return json.loads(comm.dump_flight_record(os.path.join(tmp, f"r{comm.rank}.json"))
                      .read_text())


def test_kernel_logged_and_recorded_calls_merge_in_order_within_capacity(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("COMMFLOW_FLIGHT_RECORDER", "6")
    for record in run_world(_mixed_records, 2, str(tmp_path)):
        assert (record["recorded"], record["next_seq"]) == (10, 10)
        assert [(e["seq"], e["op"], e["bytes"], e["state"]) for e in record["entries"]] == [
            (4, "allreduce", 16, "completed"), (5, "allreduce", 1 << 18, "completed"),
            (6, "barrier", 0, "completed"), (7, "barrier", 0, "completed"),
            (8, "barrier", 0, "completed"), (9, "allgather", 16, "completed")]
        times = [e["t_start"] for e in record["entries"]]
        assert times == sorted(times) and abs(times[0] - time.time()) < 60


def _waiting_mode(comm):
    return comm._lean._shared, sorted(os.sched_getaffinity(0))


def test_ranks_with_a_cpu_each_spin_and_ranks_sharing_cpus_yield():
    # ranks bound to a CPU each (as init binds them when there are enough) must not be taken
    # for oversubscribed because each one's own mask is small: they spin rather than yield
    results = run_world(_waiting_mode, 2)
    union = {cpu for _, cpus in results for cpu in cpus}
    assert [shared for shared, _ in results] == [len(union) < 2] * 2, results
    pids = [os.getpid()]
    assert shared_cpus(pids) == len(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.sched_setaffinity(child.pid, {min(os.sched_getaffinity(0))})
        assert shared_cpus([child.pid]) == 1
        assert shared_cpus([child.pid, child.pid]) == 1  # two ranks on one CPU: shared
    finally:
        child.kill()
        child.wait()
    assert shared_cpus([child.pid]) == len(os.sched_getaffinity(0))  # exited: as ours


_SCRIPT = """
import commflow.runtime
comm = commflow.runtime.init()
comm.barrier()
print("done")
"""


def test_first_compilation_is_announced_once(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    script = tmp_path / "barrier.py"
    script.write_text(_SCRIPT)
    outputs = []
    for job in ("a", "b"):
        run = subprocess.run([sys.executable, "-m", "commflow.cli", "run", "-n", "1",
                              "--job", f"lean{job}", str(script)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        outputs.append(run.stderr)
    assert outputs[0].count(COMPILING) == 1, outputs[0]
    assert COMPILING not in outputs[1], outputs[1]
