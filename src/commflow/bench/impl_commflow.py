"""commflow's own runtime as a benchmarked implementation (``impl = "commflow"``).

Ranks are started by :func:`commflow.runtime.launcher.launch` and join with
:func:`commflow.runtime.init`; ``algo`` is any name :meth:`Communicator.allreduce` and friends
accept (``auto``, a registered program algorithm, the ``shm`` fast path, or a
:class:`~commflow.ir.Program`). Broadcast and
reduce work in place, so their out-of-place variant copies the input first
(:func:`~commflow.bench.impl.via_recv`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commflow.bench.cases import Case
from commflow.bench.impl import via_recv
from commflow.collectives import Collective
from commflow.ir import Program
from commflow.runtime import Communicator, init


def missing() -> str | None:
    """Always available: commflow's runtime needs only numpy."""
    return None


def unsupported(collective: Collective, dtype: np.dtype, op: str) -> str | None:
    """Every collective, dtype and op of the benchmark runs on commflow."""
    return None


class CommflowRanks:
    """A rank of a commflow job."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.nranks = comm.size
        self.local_size = comm.local_size

    def barrier(self) -> None:
        """commflow's barrier."""
        self.comm.barrier()

    def operation(self, algo: str | Program, case: Case) -> Callable[[], object]:
        """The communicator call for ``case`` with ``algo``."""
        comm, spec, s, r = self.comm, case.spec, case.send, case.recv
        op, root = spec.op, spec.root
        calls = {
            Collective.ALLREDUCE: lambda: comm.allreduce(s, op, algo=algo, out=r),
            Collective.ALLGATHER: lambda: comm.allgather(s, algo=algo, out=r),
            Collective.REDUCESCATTER: lambda: comm.reduce_scatter(s, op, algo=algo, out=r),
            Collective.ALLTOALL: lambda: comm.alltoall(s, algo=algo, out=r),
            Collective.BROADCAST: via_recv(case, lambda: comm.broadcast(r, root, algo=algo)),
            Collective.REDUCE: via_recv(case, lambda: comm.reduce(r, root, op, algo=algo)),
            Collective.GATHER: lambda: comm.gather(
                s, root, algo=algo, out=r if self.rank == root else None
            ),
            Collective.SCATTER: lambda: comm.scatter(s, root, algo=algo, out=r),
        }
        return calls[spec.collective]

    def close(self) -> None:
        """Nothing to release: the shared memory goes with the process."""


def connect(timeout: float) -> CommflowRanks:
    """Join the job the launcher described in the environment."""
    return CommflowRanks(init(timeout=timeout))
