"""ATP-style fallback: when another job holds every slot, ranks sum on their communicator, or
by a ring over UDP among the addresses the switch lists."""

import io
import socket
import sys

import numpy as np
import pytest

from commflow.ina import InaNoSlotsError
from commflow.ina.protocol import Header, Kind, pack, unpack
from commflow.runtime.launcher import launch
from tests.ina.conftest import allreduce_threads

SCRIPT = """
import sys
import numpy as np
import commflow.runtime
from commflow.ina import WorkerStats, ina_allreduce

comm = commflow.runtime.init()
switch = (sys.argv[1], int(sys.argv[2]))
x = np.arange(1000, dtype=np.float32) * (comm.rank + 1)
stats = WorkerStats()
y = ina_allreduce(x, switch=switch, rank=comm.rank, nranks=comm.size, comm=comm, stats=stats,
                  timeout=20)
exact = np.arange(1000, dtype=np.float32) * sum(range(1, comm.size + 1))
print(f"rank {comm.rank}: fell back {stats.fell_back}, slots {stats.slots}, "
      f"exact {np.array_equal(y, exact)}")
"""


def hog(addr, job, n, slots):
    """Join ``job`` as all ``n`` of its workers, asking for ``slots``: (socket, session)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    for w in range(n):
        s.sendto(pack(Header(Kind.JOIN, job, 0, w, n, slots)), addr)
    got = [unpack(s.recv(100))[0] for _ in range(n)]
    assert {h.kind for h in got} == {Kind.JOINED}
    return s, got[0].session


def test_fallback_to_the_communicator_when_slots_are_taken(switch, tmp_path):
    sw = switch("-n", "2", "--slots", "4", "--lease", "600")
    sock, session = hog(sw.addr, job=9, n=2, slots=4)
    script = tmp_path / "fallback.py"
    script.write_text(SCRIPT)
    out, err = io.BytesIO(), io.BytesIO()
    status = launch([sys.executable, str(script), *map(str, sw.addr)], 2, stdout=out,
                    stderr=err, timeout=60, env={"OMP_NUM_THREADS": "1"})
    assert status == 0, err.getvalue().decode()
    assert sorted(out.getvalue().decode().splitlines()) == [
        "[rank 0] rank 0: fell back True, slots 0, exact True",
        "[rank 1] rank 1: fell back True, slots 0, exact True"]

    xs = [np.ones(10), np.ones(10)]
    with pytest.raises(InaNoSlotsError, match="job 0 rank .*/2: the switch has no free "
                                              "aggregator slot .* fallback=True"):
        allreduce_threads(xs, sw.addr, timeout=5, fallback=False)

    rng = np.random.default_rng(4)
    ys = [rng.standard_normal(5000) for _ in range(2)]
    outs, stats = allreduce_threads(ys, sw.addr, drop=0.05, timeout=10)
    assert all(s.fell_back and s.slots == 0 for s in stats)
    assert all((out == ys[0] + ys[1]).all() for out in outs)
    assert sum(s.retransmits for s in stats) > 0

    for w in range(2):
        sock.sendto(pack(Header(Kind.LEAVE, 9, session, w, 2)), sw.addr)
    assert {unpack(sock.recv(100))[0].kind for _ in range(2)} == {Kind.LEFT}
    sock.close()
    outs, stats = allreduce_threads(xs, sw.addr, slots=8)
    assert [s.slots for s in stats] == [4, 4] and not stats[0].fell_back
    assert outs[0].tolist() == [2.0] * 10
    assert "5 sessions (3 refused)" in sw.stop()
