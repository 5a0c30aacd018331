"""Helper of ``test_engine_exit.py`` (run as a script): ``TRIALS`` jobs of 3 ranks, each rank
its own host, so that every message goes through gloo; rank 2 is killed (SIGKILL) between two
allreduces, ranks 0 and 1 (each with a receive from the other pending) raise and exit through
the interpreter's normal finalization, which :class:`SlowExit` stretches to a second so that
the other survivor's exit (closing its gloo connections) lands in it. Ranks are forked from
this process (torch imported once); prints each rank's exit status as ``trial rank status``
lines (negative: killed by that signal)."""

import os
import signal
import sys
import time

import numpy as np

import commflow.runtime as runtime
from commflow.runtime.launcher import free_port
from commflow.runtime.transport.wire import tag_of


class SlowExit:
    """Finalizing the ``__main__`` module (after the exit handlers) takes a second."""

    def __del__(self) -> None:
        time.sleep(1.0)


keep = SlowExit()
TRIALS, BATCH, N = int(sys.argv[1]), int(sys.argv[2]), 3

children = {}
for first in range(0, TRIALS, BATCH):
    for trial in range(first, min(first + BATCH, TRIALS)):
        port = free_port()
        for rank in range(N):
            pid = os.fork()
            if pid:
                children[pid] = (trial, rank)
                continue
            os.environ.update(COMMFLOW_HOST=str(rank), MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(port))
            sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115  (the errors)
            comm = runtime.init(rank=rank, world_size=N, job=f"exit{os.getppid()}x{trial}",
                                timeout=60)
            x = np.ones(1 << 16, np.float32)
            comm.allreduce(x, algo="ring")
            if rank == N - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            # a receive from the other survivor that stays pending, as the ring's own
            # receives may (this makes the race certain rather than likely)
            pending = np.empty(64, np.uint8)
            comm.transport.engine.wire.irecv(pending, 1 - rank, tag_of(0x7FFF, 0xFFFE))
            comm.allreduce(x, algo="ring")
            raise SystemExit(3)  # not reached: the allreduce raises
    while len(children) > 0 and any(t >= first for t, _ in children.values()):
        pid, status = os.wait()
        trial, rank = children.pop(pid)
        print(trial, rank, os.waitstatus_to_exitcode(status), flush=True)
