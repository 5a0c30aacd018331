"""The engine transport between hosts, with hosts faked on loopback: every rank gets its own
``COMMFLOW_HOST``, so one job mixes shared memory (same host) and gloo or MPI (other hosts).

Results are compared exactly with numpy references (small integers, also in float types).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch.distributed  # imported once here, so that forked ranks start fast

import commflow.runtime as runtime
from commflow import algorithms
from commflow.errors import CommflowError
from commflow.runtime.cluster import link_delay
from commflow.runtime.errors import CommMismatchError
from commflow.runtime.launcher import free_port
from commflow.runtime.transport import engine, wire
from commflow.runtime.transport.routed import RoutedTransport, host_indices, host_key

from .harness import run_world

COLLECTIVES = (
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
)


@pytest.fixture
def place(monkeypatch):
    """``place(hosts, torch_first=False, **env)``: the ranks of the next ``run_world`` sit on
    hosts ``hosts[r]`` (their ``COMMFLOW_HOST``), meet through gloo on loopback (after
    creating torch's default process group when ``torch_first``), and get ``env`` too."""
    real_init = runtime.init

    def configure(hosts: list[int], torch_first: bool = False, **env: str) -> None:
        port = str(free_port())

        def init(*, rank: int, world_size: int, job: str, timeout: float):
            os.environ.update(
                COMMFLOW_HOST=str(hosts[rank]), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env
            )
            if torch_first:  # the job's own default process group holds the TCPStore
                torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
            return real_init(rank=rank, world_size=world_size, job=job, timeout=timeout)

        monkeypatch.setattr(runtime, "init", init)

    return configure


def _root(n: int) -> int:
    """The root of rooted collectives on ``n`` ranks: rank 2 of 4, never rank 0."""
    return n // 2


def _data(rank: int, n: int, dtype: str) -> np.ndarray:
    return ((np.arange(n) * 7 + rank * 13) % 19 - 9).astype(runtime.dtype_of(dtype))


def _call(comm, collective: str, algo: str, dtype: str, count: int):
    """Run one collective on this rank's data; returns what the rank holds afterwards."""
    x = _data(comm.rank, count * comm.size, dtype)
    root = _root(comm.size)
    if collective == "allreduce":
        return comm.allreduce(x, algo=algo)
    if collective == "allgather":
        return comm.allgather(x[:count], algo=algo)
    if collective == "reducescatter":
        return comm.reduce_scatter(x, algo=algo)
    if collective == "alltoall":
        return comm.alltoall(x, algo=algo)
    if collective == "broadcast":
        return comm.broadcast(x, root=root, algo=algo)
    if collective == "reduce":
        return comm.reduce(x, root=root, algo=algo)
    if collective == "gather":
        return comm.gather(x[:count], root=root, algo=algo)
    return comm.scatter(x, root=root, algo=algo)


def _expected(collective: str, rank: int, n: int, dtype: str, count: int):
    xs = [_data(r, count * n, dtype) for r in range(n)]
    total = np.sum(xs, axis=0, dtype=runtime.dtype_of(dtype))
    mine = slice(rank * count, (rank + 1) * count)
    root = _root(n)
    return {
        "allreduce": total,
        "allgather": np.concatenate([x[:count] for x in xs]),
        "reducescatter": total[mine],
        "alltoall": np.concatenate([x[mine] for x in xs]),
        "broadcast": xs[root],
        "reduce": total if rank == root else xs[rank],
        "gather": np.concatenate([x[:count] for x in xs]) if rank == root else None,
        "scatter": xs[root][mine],
    }[collective]


def _cases(n: int) -> list[tuple[str, str]]:
    """Every (collective, algorithm) that applies to ``n`` ranks, ``auto`` included."""
    cases = []
    for collective in COLLECTIVES:
        for name in ["auto", *(a.name for a in algorithms.available(collective))]:
            try:
                if name != "auto":
                    algorithms.build(
                        collective,
                        name,
                        n,
                        root=_root(n)
                        if collective in ("broadcast", "reduce", "gather", "scatter")
                        else None,
                    )
            except CommflowError:
                continue
            cases.append((collective, name))
    return cases


def _matrix(comm, cases, dtypes, count):
    kinds = {type(comm.transport).__name__}
    out = {}
    for dtype in dtypes:
        for collective, algo in cases:
            out[(collective, algo, dtype)] = _call(comm, collective, algo, dtype, count)
    return out, sorted(kinds), comm.local_rank, comm.local_size


def _check_matrix(results, n, count):
    wrong = []
    for rank, (out, _, _, _) in enumerate(results):
        for (collective, algo, dtype), got in out.items():
            want = _expected(collective, rank, n, dtype, count)
            if not (got is None and want is None or np.array_equal(got, want)):
                wrong.append(f"rank {rank} {collective}/{algo} {dtype}")
    assert not wrong, wrong


def test_every_collective_and_algorithm_over_two_hosts_of_two_ranks(place, monkeypatch):
    monkeypatch.setattr(engine, "FRAGMENT", 256)  # several fragments per message
    place([0, 0, 1, 1])
    cases = _cases(4)
    assert ("allreduce", "hierarchical") in cases and ("allreduce", "ring") in cases
    results = run_world(_matrix, 4, cases, ("int32", "float64", "bfloat16"), 37, timeout=60)
    _check_matrix(results, 4, 37)
    assert [r[1:] for r in results] == [
        (["RoutedTransport"], 0, 2),
        (["RoutedTransport"], 1, 2),
        (["RoutedTransport"], 0, 2),
        (["RoutedTransport"], 1, 2),
    ]


@pytest.mark.parametrize("hosts", [[0, 1], [0, 0, 1], [1, 0, 1, 0]])
def test_uneven_and_interleaved_hosts(place, hosts):
    place(hosts)
    n = len(hosts)
    cases = [c for c in _cases(n) if c[1] in ("ring", "direct", "hierarchical", "auto")]
    results = run_world(_matrix, n, cases, ("int64",), 5, timeout=60)
    _check_matrix(results, n, 5)
    sizes = [r[3] for r in results]
    assert sizes == [hosts.count(h) for h in hosts]


def _long_message(comm):
    x = np.arange(300_000, dtype=np.int64) * (comm.rank + 1)
    return comm.allreduce(x, algo="ring"), comm.allreduce(x, algo="hierarchical")


def test_messages_longer_than_the_receive_window(place, monkeypatch):
    monkeypatch.setattr(engine, "FRAGMENT", 4096)  # 75 000 int64 = 150 fragments > WINDOW
    place([0, 0, 1, 1])
    want = np.arange(300_000, dtype=np.int64) * 10
    for ring, hierarchical in run_world(_long_message, 4, timeout=60):
        assert np.array_equal(ring, want) and np.array_equal(hierarchical, want)


def _p2p(comm):
    got = {}
    if comm.rank == 0:
        comm.send(np.arange(10, dtype=np.int32), 3)
        comm.send(np.arange(5, dtype=np.float32), 1)
    if comm.rank == 3:
        got[0] = comm.recv(np.empty(10, np.int32), 0)
    if comm.rank == 1:
        got[0] = comm.recv(np.empty(5, np.float32), 0)
    return got


def test_send_and_recv_within_and_across_hosts(place):
    place([0, 0, 1, 1])
    results = run_world(_p2p, 4, timeout=60)
    assert np.array_equal(results[3][0], np.arange(10, dtype=np.int32))
    assert np.array_equal(results[1][0], np.arange(5, dtype=np.float32))


def _timed_allreduce(comm):
    comm.barrier()
    start = time.monotonic()
    out = comm.allreduce(np.full(8, comm.rank + 1, np.int32), algo="ring")
    return time.monotonic() - start, out.tolist()


def test_injected_delay_holds_every_message_between_hosts(place):
    place([0, 1], COMMFLOW_DELAY_US="50000")
    for elapsed, out in run_world(_timed_allreduce, 2, timeout=60):
        assert out == [3] * 8
        assert 0.1 <= elapsed < 0.1 + 1.0, elapsed  # 2 ring steps, each one message of 50 ms


def _mismatch(comm):
    comm.allreduce(np.ones(10 if comm.rank == 0 else 20, np.float32), algo="direct", timeout=20)


def test_mismatched_calls_across_hosts_raise_mismatch(place):
    place([0, 1])
    results = run_world(_mismatch, 2, timeout=30, expect_failure=True)
    for ok, text in results:
        assert not ok and text.startswith("CommMismatchError: rank"), text
        assert (
            "(engine): operation #0 allreduce(40 B of float32" in text
            or "(engine): operation #0 allreduce(80 B of float32" in text
        ), text


def _garbage(comm):
    if comm.rank == 1:
        garbage = np.full(engine.HEADER_BYTES + 16, 0x5A, np.uint8)
        request = comm.transport.engine.wire.isend(garbage, 0, wire.tag_of(0, 0))
        while not request.done():
            time.sleep(1e-3)
        return None
    comm.allreduce(np.ones(4, np.float32), algo="ring", timeout=10)


def test_garbage_on_the_wire_is_rejected_by_header_validation(place):
    place([0, 1])
    ok, text = run_world(_garbage, 2, timeout=30, expect_failure=True)[0]
    assert not ok
    assert text.startswith("CommProtocolError: rank 0 <- rank 1 (engine): bad magic 0x5a5a5a5a"), (
        text
    )


def _victim_on_other_host(comm):
    if comm.rank == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        comm.allreduce(np.ones(1 << 12, np.float32), algo="ring", timeout=20)
    finally:
        assert time.monotonic() - start < 10


def test_a_killed_rank_on_another_host_makes_every_rank_raise(place):
    place([0, 0, 1, 1])
    results = run_world(_victim_on_other_host, 4, timeout=30, expect_failure=True)
    for rank in (0, 1, 2):
        ok, text = results[rank]
        assert not ok and text.startswith("CommAbortedError"), text


def _late_message(comm):
    if comm.rank == 0:
        comm.send(np.arange(4), 3)
    return comm.recv(np.zeros(4, np.int64), 0).tolist() if comm.rank == 3 else None


def test_local_peers_that_finished_and_exited_do_not_abort_a_wait_on_another_host(place):
    place([0, 0, 1, 1], COMMFLOW_DELAY_US="300000")  # ranks 1 and 2 are gone long before
    assert run_world(_late_message, 4, timeout=60) == [None, None, None, [0, 1, 2, 3]]


def _beside_torch(comm):
    mine = comm.allreduce(np.full(3, comm.rank, np.int64), algo="hierarchical")
    theirs = torch.ones(2) * comm.rank
    torch.distributed.all_reduce(theirs)
    return mine.tolist(), theirs.tolist()


def test_joins_beside_an_initialised_torch_process_group(place):
    place([0, 0, 1, 1], torch_first=True)
    assert run_world(_beside_torch, 4, timeout=60) == [([6, 6, 6], [6.0, 6.0])] * 4


def test_gloo_socket_ifname_names_the_interface_gloo_uses(place):
    place([0, 1], GLOO_SOCKET_IFNAME="nosuch0")
    for ok, text in run_world(_transport_of, 2, timeout=30, expect_failure=True):
        assert not ok and text.startswith("CommflowError: rank"), text
        assert "gloo rendezvous at 127.0.0.1:" in text and "nosuch0" in text, text


def _transport_of(comm):
    return type(comm.transport).__name__, comm.local_size


def test_one_emulated_host_is_a_single_host_job(place):
    place([5, 5, 5])
    assert run_world(_transport_of, 3, timeout=60) == [("ShmTransport", 3)] * 3


MPI_SCRIPT = """
import os
os.environ["COMMFLOW_HOST"] = str(int(os.environ["OMPI_COMM_WORLD_RANK"]) // 2)
import numpy as np
import commflow.runtime
comm = commflow.runtime.init(timeout=60)
x = np.arange(1000, dtype=np.int64) * (comm.rank + 1)
for algo in ("hierarchical", "ring", "direct"):
    assert np.array_equal(comm.allreduce(x, algo=algo), np.arange(1000) * 10), algo
g = comm.allgather(np.full(3, comm.rank, np.int32))
assert g.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
wire = type(comm.transport.engine.wire).__name__
print(f"ok {comm.rank} {wire} {comm.local_size}", flush=True)  # one write: lines stay whole
"""


def test_mpi_engine_under_mpirun(tmp_path):
    script = tmp_path / "mpi_hosts.py"
    script.write_text(textwrap.dedent(MPI_SCRIPT))
    mpirun = shutil.which("mpirun")
    assert mpirun, "Open MPI's mpirun is needed on this machine"
    done = subprocess.run(
        [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "4", sys.executable, script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # mpirun may split a line between two ranks' writes: find the records anywhere
    assert sorted(re.findall(r"ok \d MpiWire \d", done.stdout)) == [
        f"ok {r} MpiWire 2" for r in range(4)
    ]


def test_host_keys_group_ranks_in_order_of_their_first_rank():
    assert host_indices([b"b", b"a", b"b", b"c", b"a"]) == [0, 1, 0, 2, 1]
    assert host_key({"COMMFLOW_HOST": "1"}) == host_key({"COMMFLOW_HOST": "1", "X": "y"})
    assert host_key({"COMMFLOW_HOST": "1"}) != host_key({"COMMFLOW_HOST": "2"})
    assert host_key({}) != host_key({"COMMFLOW_HOST": "0"}) and len(host_key({})) == 32


def test_tags_separate_communicators_slots_and_channels():
    assert wire.tag_of(0, 0) == 0
    assert wire.tag_of(3, 5) == 3 << 16 | 5
    assert wire.tag_of(3, 5, slot=2) == 3 << 16 | 2 << 12 | 5
    assert wire.tag_of(0, 1 << 30) == 0xFFF  # the point-to-point channel
    assert wire.tag_of(0, 1 << 30, slot=engine.SLOTS - 1) < wire.tag_of(1, 0)
    assert wire.tag_of(1 << 15, 0) == 0 and wire.tag_of(0x7FFF, 0xFFF, 15) < 2**31


def _in_flight_together(comm):
    """Async collectives of many sizes, a synchronous broadcast and messages between them,
    all issued back to back; which lane thread finished each asynchronous one."""
    sizes = [1, 300_000, 7, 70_000, 3, 150_000, 1, 5, 90_000]
    xs = [np.arange(n, dtype=np.int64) * (comm.rank + 1) + i for i, n in enumerate(sizes)]
    threads: dict[int, str] = {}
    handles = []
    for i, x in enumerate(xs):
        handle = comm.allreduce(x, out=x, algo="ring", async_op=True)
        handle.add_done_callback(
            lambda error, i=i: threads.__setitem__(i, threading.current_thread().name))
        handles.append(handle)
        if i == 4:
            b = comm.broadcast(np.full(11, comm.rank, np.int32), root=1)
            if comm.rank == 0:
                comm.send(np.arange(6, dtype=np.float64), 1)
            else:
                got = comm.recv(np.empty(6, np.float64), 0)
    gathered = comm.allgather(np.array([comm.rank], np.int64), async_op=True)
    for h in handles:
        h.wait()
    return (comm.slots, [x.tolist() for x in xs], b.tolist(), gathered.wait().tolist(),
            None if comm.rank == 0 else got.tolist(), [threads[i] for i in range(len(xs))])


def test_async_operations_run_on_lanes_between_hosts_of_one_rank(place, monkeypatch):
    monkeypatch.setattr(engine, "FRAGMENT", 4096)  # many fragments in flight per lane
    place([0, 1], COMMFLOW_DELAY_US="200")
    results = run_world(_in_flight_together, 2, timeout=60)
    sizes = [1, 300_000, 7, 70_000, 3, 150_000, 1, 5, 90_000]
    for slots, xs, b, gathered, _, threads in results:
        assert slots == engine.SLOTS == 4
        assert xs == [(np.arange(n, dtype=np.int64) * 3 + 2 * i).tolist()
                      for i, n in enumerate(sizes)]
        assert b == [1] * 11 and gathered == [0, 1]
        # operation seq runs on lane seq % 4; the broadcast and the send/recv took seq 5 and
        # lanes of their own in between
        lanes = [int(name.split("-")[1].split("_")[0]) for name in threads]
        assert lanes == [0, 1, 2, 3, 0, 2, 3, 0, 1]
    assert results[1][4] == list(range(6))


def _mismatch_on_a_lane(comm):
    comm.allreduce(np.ones(4, np.float32), async_op=True).wait()
    n = 10 if comm.rank == 0 else 20
    comm.allreduce(np.ones(n, np.float32), algo="ring", async_op=True, timeout=20).wait()


def test_a_mismatch_on_a_lane_raises_mismatch(place):
    place([0, 1])
    for ok, text in run_world(_mismatch_on_a_lane, 2, timeout=30, expect_failure=True):
        assert not ok and text.startswith("CommMismatchError: rank"), text
        assert "operation #1 allreduce(" in text, text


def _failure_among_lanes(comm):
    if comm.rank == 1:  # rank 0's operations #0 and #1 both run, waiting, when #0 fails there
        time.sleep(0.5)
    first = comm.allreduce(np.ones(10 if comm.rank == 0 else 20, np.float32), algo="ring",
                           async_op=True, timeout=20)
    second = comm.allreduce(np.ones(4, np.float32), algo="ring", async_op=True, timeout=20)
    with pytest.raises(CommMismatchError):
        first.wait()
    return second.wait().tolist()


def test_the_failed_operation_is_the_one_marked_failed_among_lanes(place, tmp_path):
    place([0, 1], COMMFLOW_DUMP_DIR=str(tmp_path))
    assert run_world(_failure_among_lanes, 2, timeout=30) == [[2.0] * 4] * 2
    entries = json.loads((tmp_path / "flight-rank0.json").read_text())["entries"]
    # #1 was running when #0 failed; by the dump it may have completed, but never failed
    assert [(e["seq"], e["state"]) for e in entries] in (
        [(0, "failed"), (1, "started")], [(0, "failed"), (1, "completed")])


def test_one_slot_over_shared_memory_or_mpi():
    class Wire:
        rank, size, polled, threaded = 0, 2, True, False

    assert RoutedTransport(Wire(), hosts=[0, 1], shm=None).slots == 1
    Wire.polled, Wire.threaded = False, True
    assert RoutedTransport(Wire(), hosts=[0, 1], shm=None).slots == engine.SLOTS
    assert RoutedTransport(Wire(), hosts=[0, 1, 1], shm=None).slots == 1


def test_fragments_cover_the_message():
    f = engine.FRAGMENT
    assert engine._fragments(0) == [(0, 0)]
    assert engine._fragments(f) == [(0, f)]
    assert engine._fragments(2 * f + 3) == [(0, f), (f, f), (2 * f, 3)]


def test_link_delay_reads_microseconds_and_rejects_nonsense():
    assert link_delay({"COMMFLOW_DELAY_US": "100"}) == pytest.approx(100e-6)
    assert link_delay({}) == 0.0
    assert link_delay({"COMMFLOW_HOST": "0"}) == 0.0  # not inside a cluster namespace
    for bad in ("-1", "fast", "2e6"):
        with pytest.raises(CommflowError, match="COMMFLOW_DELAY_US"):
            link_delay({"COMMFLOW_DELAY_US": bad})


def test_unknown_engine_and_missing_rendezvous_are_clear_errors():
    with pytest.raises(CommflowError, match="unknown engine 'nccl'"):
        wire.open_wire("nccl", rank=0, size=2, job="j", timeout=1, env={})
    with pytest.raises(CommflowError, match="set MASTER_ADDR and MASTER_PORT"):
        wire.open_wire("gloo", rank=0, size=2, job="j", timeout=1, env={})


def test_a_negative_delay_is_refused():
    class Wire:
        rank, size, polled = 0, 2, False

    with pytest.raises(CommflowError, match="injected delay must be >= 0"):
        RoutedTransport(Wire(), hosts=[0, 1], shm=None, delay=-1.0)
