"""A commflow world under torch.distributed, and how a process group joins one.

The default ``commflow`` process group creates the world: rank 0 draws a job token and
shares it through the group's store (so the same code works under torchrun, ``commflow run``
or any ``init_method``), then every rank calls :func:`commflow.runtime.init`. A sub-group
(``dist.new_group(ranks, backend="commflow")``) becomes a communicator over its global ranks
on the world's transport, named by torch's group name; when the default group is not
commflow's (e.g. gloo), a sub-group gets a world of its own the same way the default group
does.
"""

from __future__ import annotations

import secrets
import threading
import zlib
from collections.abc import Callable, Sequence
from datetime import timedelta

import commflow.runtime as runtime
from commflow.errors import CommflowError
from commflow.runtime import Communicator
from commflow.runtime.calls import Handle
from commflow.torch.p2p import Message, PointToPoint
from commflow.torch.work import Outcome, Progress

_TOKEN_KEY = "commflow/job"


class World:
    """A commflow world: its communicator, the progress thread that runs the operations of
    every commflow process group built on it (in issue order), and their held messages."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self._progress = Progress()
        self._p2p = PointToPoint(self._progress)
        self._lock = threading.Lock()
        self._groups = 0

    def submit(self, job: Callable[[], object]) -> Outcome:
        """Start the held messages, then queue ``job``; returns its outcome."""
        with self._lock:
            self._p2p.flush()
            return self._progress.submit(job)

    def start(self, job: Callable[[], Sequence[Handle]], value: object) -> Outcome:
        """Start the held messages, then queue ``job``, which starts asynchronous operations
        and returns their handles (see :meth:`Progress.start`)."""
        with self._lock:
            self._p2p.flush()
            return self._progress.start(job, value)

    def hold(self, message: Message) -> Outcome:
        """Hold a send or receive until the next operation or wait (see :mod:`.p2p`)."""
        with self._lock:
            return self._p2p.hold(message)

    def flush(self) -> None:
        """Start the held messages."""
        with self._lock:
            self._p2p.flush()

    def attach(self) -> None:
        """Count one more process group using this world."""
        with self._lock:
            self._groups += 1

    def detach(self) -> None:
        """Count one group fewer; the last one finishes the queued work and stops the
        threads."""
        with self._lock:
            self._p2p.flush()
            self._groups -= 1
            last = self._groups == 0
        if last:
            self._progress.close()


def subgroup(
    world: World, global_ranks: list[int], group_name: str, timeout: timedelta
) -> Communicator:
    """The communicator of the world ranks ``global_ranks`` (in group-rank order) on
    ``world``'s transport; its id comes from torch's group name, the same on every member."""
    base = world.comm
    comm_id = zlib.crc32(f"torch/{group_name}".encode()) & 0x7FFFFFFF
    return Communicator(
        base.spec,
        base.transport,
        timeout=timeout.total_seconds(),
        ranks=list(global_ranks),
        comm_id=comm_id or 1,
    )


def new_world(store, rank: int, size: int, timeout: timedelta, *, placement: bool) -> World:
    """Join a new commflow world of ``size`` ranks through ``store`` (rank 0 publishes the job
    token there). With ``placement``, this host's ranks come from torchrun's or commflow's
    environment when it describes the same world; otherwise all ranks share one host. Raises
    ``CommflowError`` when the ranks do not all arrive within ``timeout``."""
    if rank == 0:
        job = f"tc{secrets.token_hex(8)}"
        store.set(_TOKEN_KEY, job)
    else:
        job = store.get(_TOKEN_KEY).decode()
    local = _placement(rank, size) if placement else {}
    comm = runtime.init(
        rank=rank, world_size=size, job=job, timeout=timeout.total_seconds(), store=store,
        **local,
    )
    return World(comm)


def _placement(rank: int, size: int) -> dict[str, int]:
    try:
        spec = runtime.detect_world()
    except CommflowError:
        return {}
    if (spec.rank, spec.size) != (rank, size):
        return {}
    return {"local_rank": spec.local_rank, "local_size": spec.local_size}
