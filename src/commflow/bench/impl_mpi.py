"""Open MPI through mpi4py as a benchmarked peer (``impl = "mpi"``).

Ranks are started by ``mpirun`` and use ``MPI.COMM_WORLD``: ``Allreduce``, ``Allgather``,
``Reduce_scatter_block``, ``Alltoall``, ``Bcast``, ``Reduce``, ``Gather`` and ``Scatter`` on
the numpy buffers, in place with ``MPI.IN_PLACE``. MPI's in-place reduce-scatter leaves the
result in the first block of the buffer, so it is then copied to this rank's block (inside
the timed call); ``Bcast`` works in place, so its out-of-place variant copies the input first.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable

import numpy as np

from commflow.bench.cases import Case
from commflow.bench.impl import via_recv
from commflow.collectives import Collective

_OPS = {"sum": "SUM", "prod": "PROD", "min": "MIN", "max": "MAX"}
_BOOL_OPS = {"sum": "LOR", "max": "LOR", "prod": "LAND", "min": "LAND"}
_NO_MPI_TYPE = ("float16", "bfloat16")


def missing() -> str | None:
    """Why Open MPI cannot run here (no ``mpirun`` or no mpi4py), or ``None``."""
    if shutil.which("mpirun") is None:
        return (
            "mpirun is not on PATH: install Open MPI (e.g. apt-get install openmpi-bin "
            "libopenmpi-dev), then pip install mpi4py"
        )
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed: pip install mpi4py (needs Open MPI's mpicc)"
    return None


def unsupported(collective: Collective, dtype: np.dtype, op: str) -> str | None:
    """MPI has no ``avg`` reduction and no float16/bfloat16 datatype."""
    if dtype.name in _NO_MPI_TYPE:
        return f"MPI has no {dtype.name} datatype"
    if collective.reduces and op not in _OPS:
        return f"MPI has no {op!r} reduction"
    return None


class MpiRanks:
    """A rank of ``MPI.COMM_WORLD``."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self.mpi = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.nranks = self.comm.Get_rank(), self.comm.Get_size()

    def barrier(self) -> None:
        """``MPI_Barrier``."""
        self.comm.Barrier()

    def operation(self, algo: str, case: Case) -> Callable[[], object]:
        """The mpi4py call for ``case`` (``algo`` is always Open MPI's own choice)."""
        mpi, comm, spec = self.mpi, self.comm, case.spec
        s, r, root = case.send, case.recv, spec.root
        names = _BOOL_OPS if s.dtype == np.bool_ else _OPS
        op = getattr(mpi, names.get(spec.op, "SUM"))
        at_root = self.rank == root
        if not spec.inplace:
            calls = {
                Collective.ALLREDUCE: lambda: comm.Allreduce(s, r, op),
                Collective.ALLGATHER: lambda: comm.Allgather(s, r),
                Collective.REDUCESCATTER: lambda: comm.Reduce_scatter_block(s, r, op),
                Collective.ALLTOALL: lambda: comm.Alltoall(s, r),
                Collective.BROADCAST: via_recv(case, lambda: comm.Bcast(r, root)),
                Collective.REDUCE: lambda: comm.Reduce(s, r if at_root else None, op, root),
                Collective.GATHER: lambda: comm.Gather(s, r if at_root else None, root),
                Collective.SCATTER: lambda: comm.Scatter(s if at_root else None, r, root),
            }
            return calls[spec.collective]
        here = mpi.IN_PLACE
        calls = {
            Collective.ALLREDUCE: lambda: comm.Allreduce(here, r, op),
            Collective.ALLGATHER: lambda: comm.Allgather(here, r),
            Collective.REDUCESCATTER: lambda: self._reduce_scatter_in_place(s, r, op),
            Collective.ALLTOALL: lambda: comm.Alltoall(here, r),
            Collective.BROADCAST: lambda: comm.Bcast(r, root),
            Collective.REDUCE: lambda: comm.Reduce(
                *((here, r) if at_root else (s, None)), op, root
            ),
            Collective.GATHER: lambda: comm.Gather(*((here, r) if at_root else (s, None)), root),
            Collective.SCATTER: lambda: comm.Scatter(*((s, here) if at_root else (None, r)), root),
        }
        return calls[spec.collective]

    def _reduce_scatter_in_place(self, buffer: np.ndarray, block: np.ndarray, op) -> None:
        self.comm.Reduce_scatter_block(self.mpi.IN_PLACE, buffer, op)
        if self.rank:
            np.copyto(block, buffer[: len(block)])

    def close(self) -> None:
        """Nothing to do: mpi4py finalizes MPI at exit."""


def connect(timeout: float) -> MpiRanks:
    """Join ``MPI.COMM_WORLD`` (``timeout`` is not used: mpirun bounds the job instead)."""
    return MpiRanks()
