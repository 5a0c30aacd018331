"""The engine wire over MPI (mpi4py): ``Isend``/``Irecv`` of numpy byte buffers with tags on a
duplicate of ``MPI.COMM_WORLD``. MPI progresses requests while they are tested, so waiters
poll (:attr:`MpiWire.polled`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from commflow.errors import CommflowError
from commflow.runtime.errors import CommAbortedError


class MpiRequest:
    """An MPI send or receive in flight."""

    __slots__ = ("request", "error_class")

    def __init__(self, request, error_class: type[Exception]) -> None:
        self.request, self.error_class = request, error_class

    def done(self) -> bool:
        """True once complete (tests the request); ``CommAbortedError`` when MPI failed it."""
        try:
            return self.request.Test()
        except self.error_class as err:
            raise CommAbortedError(f"MPI: {err}") from err


class MpiWire:
    """Tagged point-to-point messages over MPI; see :class:`.wire.Wire`."""

    polled = True
    threaded = False

    def __init__(self, comm, mpi) -> None:
        self.comm = comm
        self.mpi = mpi
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.on_complete: Callable[[], None] = lambda: None

    @classmethod
    def connect(cls, *, rank: int, size: int) -> MpiWire:
        """Duplicate ``MPI.COMM_WORLD`` (initialising MPI if needed); raises ``CommflowError``
        when mpi4py is missing or the MPI world disagrees with ``rank`` and ``size``."""
        try:
            from mpi4py import MPI
        except ImportError:
            raise CommflowError(
                "the MPI engine needs mpi4py: pip install mpi4py (and an MPI "
                "library), or choose COMMFLOW_ENGINE=gloo"
            ) from None
        comm = MPI.COMM_WORLD.Dup()
        if (comm.Get_rank(), comm.Get_size()) != (rank, size):
            raise CommflowError(
                f"MPI says rank {comm.Get_rank()} of {comm.Get_size()} but the environment says "
                f"rank {rank} of {size}: start the job with mpirun or choose COMMFLOW_ENGINE=gloo"
            )
        return cls(comm, MPI)

    def _post(self, start, data: np.ndarray, peer: int, tag: int) -> MpiRequest:
        try:
            request = start([data, self.mpi.BYTE], peer, tag)
        except self.mpi.Exception as err:
            raise CommAbortedError(f"MPI: {err}") from err
        return MpiRequest(request, self.mpi.Exception)

    def isend(self, data: np.ndarray, peer: int, tag: int) -> MpiRequest:
        """Start sending ``data``'s bytes to ``peer``."""
        return self._post(self.comm.Isend, data, peer, tag)

    def irecv(self, data: np.ndarray, peer: int, tag: int) -> MpiRequest:
        """Start receiving at most ``len(data)`` bytes from ``peer`` into ``data``."""
        return self._post(self.comm.Irecv, data, peer, tag)

    def allgather(self, data: bytes) -> list[bytes]:
        """Every rank's ``data`` (one length on every rank)."""
        mine = np.frombuffer(data, np.uint8)
        every = np.empty((self.size, len(mine)), np.uint8)
        self.comm.Allgather([mine, self.mpi.BYTE], [every, self.mpi.BYTE])
        return [row.tobytes() for row in every]
