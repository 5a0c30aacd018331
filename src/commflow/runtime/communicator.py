"""The communicator: collectives and point-to-point messages between the ranks of a job.

Every collective takes ``algo=``: ``"auto"``, a registered algorithm's name, or a
:class:`~commflow.ir.Program` for this collective and communicator size (see
:func:`commflow.runtime.programs.adopt`).

Shapes follow torch.distributed: ``allgather`` concatenates the ranks' inputs along the first
axis in rank order, ``reduce_scatter`` takes nranks times the output's first axis and returns
this rank's block, ``alltoall`` splits the first axis into nranks blocks, block j to rank j.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.ir import Program
from commflow.runtime import fastpath, flight, flight_dumps, lean, programs, variants
from commflow.runtime.arrays import as_numpy, like
from commflow.runtime.calls import Call, check_timeout, in_place
from commflow.runtime.running import CallRunner
from commflow.runtime.transport.shm import ABORT_ERROR, ShmTransport
from commflow.runtime.world import WorldSpec


class Communicator(CallRunner):
    """A group of ranks that run collectives together. Create with :func:`commflow.init`.

    ``flight_config`` sets up its flight recorder (:mod:`commflow.runtime.flight`; default
    from ``COMMFLOW_FLIGHT_RECORDER`` and ``COMMFLOW_DUMP_DIR``)."""

    def __init__(self, spec: WorldSpec, transport: ShmTransport, *, timeout: float,
                 ranks: list[int] | None = None, comm_id: int = 0,
                 flight_config: flight.FlightConfig | None = None,
                 owns_host: bool = False) -> None:
        self.spec = spec
        self.transport = transport
        self.timeout = check_timeout(timeout, "communicator")
        self.ranks = ranks or list(range(spec.size))
        self.comm_id = comm_id
        self.flight_config = flight_config or flight.FlightConfig.from_env(os.environ, spec.job)
        shm = transport if isinstance(transport, ShmTransport) else getattr(transport, "shm", None)
        self._host = getattr(shm, "host", None)
        self._flight = flight_dumps.attach(self.flight_config, host=self._host, meta={
            "job": spec.job, "comm_id": comm_id, "rank": self.rank, "global_rank": spec.rank,
            "nranks": self.size, "ranks": list(self.ranks)})
        self._splits = 0
        super().__init__(getattr(transport, "slots", 1))
        # Only the world communicator (or one shrink() made, on a segment of its own) owns the
        # host's staging areas and flags: a sub-communicator over the same ranks (split with
        # one color, a torch group of every rank) would share them.
        world = owns_host or (comm_id == 0 and self.ranks == list(range(spec.size))
                              and spec.local_size == spec.size)
        self._owns_host = world and isinstance(transport, ShmTransport)
        self._fast = fastpath.SharedBufferPaths(
            lambda seq, sig, dt: transport.endpoint(seq, sig, dt, self.ranks, comm_id),
            self.size, self.rank) if world and transport.host.layout.stage_bytes else None
        self._lean = lean.attach(self, self._fast)

    @property
    def rank(self) -> int:
        """This process's rank in the communicator."""
        return self.ranks.index(self.spec.rank)

    @property
    def size(self) -> int:
        """Number of ranks in the communicator."""
        return len(self.ranks)

    @property
    def fast_path(self) -> bool:
        """Whether the shared-memory fast path (``algo="shm"`` and its variants) runs here:
        the world communicator of one host."""
        return self._fast is not None

    @property
    def slots(self) -> int:
        """How many asynchronous operations may progress at once: the transport's slots
        (several over the engine between hosts of one rank each, else 1)."""
        return self._slots

    @property
    def local_rank(self) -> int:
        """Rank among this host's ranks."""
        return self.spec.local_rank

    @property
    def local_size(self) -> int:
        """Number of ranks on this host."""
        return self.spec.local_size

    # -- collectives ----------------------------------------------------------------------
    def allreduce(self, x, op: str = "sum", *, algo: str | Program = "auto", out=None,
                  async_op: bool = False, timeout: float | None = None):
        """Reduce ``x`` over all ranks into ``out`` (a new array if ``None``; ``out=x`` for
        in-place). Returns ``out`` (or a :class:`Handle` when ``async_op``)."""
        if self._lean is not None and not async_op and type(algo) is str \
                and (algo == "auto" or algo == variants.NAME):
            if timeout is not None:
                check_timeout(timeout, f"allreduce on rank {self.rank}")
            result = self._lean.allreduce(x, op, out, timeout, algo)
            if result is not None:
                return result
        a = as_numpy(x, "allreduce input")
        out = like(x, a.shape) if out is None else out
        b = self._output(out, a.shape, a.dtype, "allreduce")
        if type(algo) is str and algo == "auto" and programs.tuned():
            algo = self._tuned_allreduce(a, b, out is x)
        if timeout is not None:
            check_timeout(timeout, f"allreduce on rank {self.rank}")
        if (self._fast is not None and not async_op and self._lanes is None
                and 0 < a.nbytes <= variants.ONE_SHOT and isinstance(algo, str)
                and algo in ("auto", variants.NAME)):
            self._guarded(lambda: self._small_allreduce(a, b, op, timeout))
            return out
        return self._submit(Call(Collective.ALLREDUCE, a, b, a.size, op, 0, algo), out,
                            async_op, timeout)

    def _tuned_allreduce(self, a: np.ndarray, b: np.ndarray, same: bool) -> str:
        """What ``auto`` runs for an allreduce of ``a`` into ``b`` under the loaded tuning
        table (``same``: ``b`` is ``a``): a fast-path variant by the name it runs under
        (``shm`` where it cuts the call as the defaults do), or an algorithm. The call is in
        place where ``b`` is ``a``'s memory (one shape and dtype, both C-contiguous), looked
        at only where the table's rules for the two placements differ."""
        out_of_place, inside = self._resolve("auto", Collective.ALLREDUCE, a.nbytes,
                                             (a.nbytes, b.nbytes))
        if out_of_place != inside and (same or np.may_share_memory(a, b)
                                       and in_place(a, b, self.rank)):
            return inside[0]
        return out_of_place[0]

    def allgather(self, x, *, algo: str | Program = "auto", out=None, async_op: bool = False,
                  timeout: float | None = None):
        """Concatenate every rank's ``x`` along the first axis, in rank order."""
        a = as_numpy(x, "allgather input")
        shape = (self.size * (a.shape[0] if a.ndim else 1), *a.shape[1:])
        out = like(x, shape) if out is None else out
        b = self._output(out, shape, a.dtype, "allgather")
        return self._submit(Call(Collective.ALLGATHER, a, b, a.size, "sum", 0, algo), out,
                            async_op, timeout)

    def reduce_scatter(self, x, op: str = "sum", *, algo: str | Program = "auto", out=None,
                       async_op: bool = False, timeout: float | None = None):
        """Reduce ``x`` over all ranks and return this rank's block of the first axis."""
        a = as_numpy(x, "reduce_scatter input")
        shape = (self._blocks(a, "reduce_scatter"), *a.shape[1:])
        out = like(x, shape) if out is None else out
        b = self._output(out, shape, a.dtype, "reduce_scatter")
        return self._submit(Call(Collective.REDUCESCATTER, a, b, b.size, op, 0, algo), out,
                            async_op, timeout)

    def alltoall(self, x, *, algo: str | Program = "auto", out=None, async_op: bool = False,
                 timeout: float | None = None):
        """Send block j of ``x``'s first axis to rank j; block i of the result is rank i's."""
        a = as_numpy(x, "alltoall input")
        self._blocks(a, "alltoall")
        out = like(x, a.shape) if out is None else out
        b = self._output(out, a.shape, a.dtype, "alltoall")
        return self._submit(Call(Collective.ALLTOALL, a, b, a.size // self.size, "sum", 0,
                                  algo), out, async_op, timeout)

    def broadcast(self, x, root: int = 0, *, algo: str | Program = "auto", async_op: bool = False,
                  timeout: float | None = None):
        """Copy root's ``x`` into every rank's ``x`` (in place); returns ``x``."""
        a = as_numpy(x, "broadcast buffer")
        self._check_root(root)
        send = a if self.rank == root else np.empty(0, a.dtype)
        return self._submit(Call(Collective.BROADCAST, send, a, a.size, "sum", root, algo), x,
                            async_op, timeout)

    def reduce(self, x, root: int = 0, op: str = "sum", *, algo: str | Program = "auto",
               async_op: bool = False, timeout: float | None = None):
        """Reduce every rank's ``x`` into root's ``x`` (in place there); returns ``x``."""
        a = as_numpy(x, "reduce buffer")
        self._check_root(root)
        recv = a if self.rank == root else np.empty_like(a)
        return self._submit(Call(Collective.REDUCE, a, recv, a.size, op, root, algo), x,
                            async_op, timeout)

    def gather(self, x, root: int = 0, *, algo: str | Program = "auto", out=None,
               async_op: bool = False, timeout: float | None = None):
        """Concatenate every rank's ``x`` at ``root`` (returns the result there, None
        elsewhere)."""
        a = as_numpy(x, "gather input")
        self._check_root(root)
        shape = (self.size * (a.shape[0] if a.ndim else 1), *a.shape[1:])
        if self.rank == root:
            out = like(x, shape) if out is None else out
            b = self._output(out, shape, a.dtype, "gather")
        else:
            out, b = None, np.empty(0, a.dtype)
        return self._submit(Call(Collective.GATHER, a, b, a.size, "sum", root, algo), out,
                            async_op, timeout)

    def scatter(self, x, root: int = 0, *, algo: str | Program = "auto", out=None,
                async_op: bool = False, timeout: float | None = None):
        """Split root's ``x`` along the first axis, block j to rank j; every rank passes an
        ``x`` of the same shape (used only at root) and gets its block."""
        a = as_numpy(x, "scatter input")
        self._check_root(root)
        shape = (self._blocks(a, "scatter"), *a.shape[1:])
        out = like(x, shape) if out is None else out
        b = self._output(out, shape, a.dtype, "scatter")
        send = a if self.rank == root else np.empty(0, a.dtype)
        return self._submit(Call(Collective.SCATTER, send, b, b.size, "sum", root, algo), out,
                            async_op, timeout)

    def split(self, color: int | None, key: int = 0, *,
              timeout: float | None = None) -> Communicator | None:
        """A sub-communicator of the ranks that pass the same ``color`` (like ``MPI_Comm_split``),
        ranked by ``key`` then by rank here; ``None`` for ranks passing ``color=None``. Every
        rank of this communicator must call it."""
        mine = np.array([-1 if color is None else color, key], dtype=np.int64)
        if color is not None and color < 0:
            raise CommflowError(f"split on rank {self.rank}: color must be >= 0 or None")
        table = self.allgather(mine, algo="direct", timeout=timeout).reshape(-1, 2)
        self._splits += 1
        if color is None:
            return None
        members = sorted((int(k), r) for r, (c, k) in enumerate(table.tolist()) if c == color)
        ranks = [self.ranks[r] for _, r in members]
        comm_id = zlib.crc32(f"{self.comm_id}/{self._splits}/{color}".encode()) & 0x7FFFFFFF
        return Communicator(self.spec, self.transport, timeout=self.timeout, ranks=ranks,
                            comm_id=comm_id or 1, flight_config=self.flight_config)

    def barrier(self, *, timeout: float | None = None) -> None:
        """Return once every rank has called ``barrier``."""
        if self._lean is not None:
            if timeout is not None:
                check_timeout(timeout, f"barrier on rank {self.rank}")
            if self._lean.barrier(timeout):
                return
        token = np.zeros(1, np.uint8)
        self.allreduce(token, "max", out=token, timeout=timeout)

    def abort(self, reason: str = "abort() called") -> None:
        """Give up on this communicator (NCCL's ``ncclCommAbort``): every later call on it
        raises ``CommAbortedError`` naming ``reason``, and the ranks of this host blocked in
        an operation with it raise ``CommAbortedError`` within milliseconds instead of
        waiting for their deadline. Ranks on other hosts find out at their next timeout.
        Create a new communicator (``commflow.init``) to go on."""
        self._broken = f"abort() on rank {self.rank} ({reason})"
        if self._host is not None:
            self._host.abort(ABORT_ERROR, self._host.me, self._seq)

    def shrink(self, *, timeout: float | None = None) -> Communicator:
        """A new communicator of the ranks still alive (NCCL's ``ncclCommShrink``), ranked
        densely in their old order; this one becomes unusable (as after :meth:`abort`, which
        it implies: peers blocked in an operation raise at once). Every live rank should call
        it, typically after a ``CommAbortedError``: within ``timeout`` seconds (default: the
        communicator's) every caller returns a communicator of the same members, or every
        caller raises the same ``CommAbortedError`` (or ``CommTimeoutError``). A rank that
        calls after the others decided without it raises. One host only; see
        :mod:`commflow.runtime.shrink` for the agreement and docs/reliability.md."""
        from commflow.runtime.shrink import shrink_communicator

        timeout = self.timeout if timeout is None else check_timeout(
            timeout, f"shrink on rank {self.rank}")
        if not self._owns_host:
            raise CommflowError(
                f"shrink on rank {self.rank}: only a communicator that owns its host's shared "
                f"memory can shrink (the world of one host, or one shrink returned), not a "
                f"split one or one across hosts; shrink the world and split again, or restart "
                f"the job (commflow run --max-restarts)")
        self._broken = self._broken or f"shrink() on rank {self.rank}"
        if not self._host.aborted():
            self._host.abort(ABORT_ERROR, self._host.me, self._seq)
        return shrink_communicator(self, timeout)

    def dump_flight_record(self, path: str | os.PathLike | None = None) -> Path:
        """Write this communicator's flight record (its last operations) as JSON to ``path``
        (default: ``COMMFLOW_DUMP_DIR``'s file for this rank) and return the path. Raises
        ``CommflowError`` when the recorder is off (``COMMFLOW_FLIGHT_RECORDER=0``)."""
        if self._flight is None:
            raise CommflowError(f"rank {self.rank}: the flight recorder is off "
                                f"(COMMFLOW_FLIGHT_RECORDER=0); nothing to dump")
        return self._flight.dump(path or self._flight.default_path(), "dump_flight_record")

    # -- point to point -------------------------------------------------------------------
    def send(self, x, dst: int, *, async_op: bool = False, timeout: float | None = None):
        """Send ``x`` to rank ``dst`` (matched in order with ``dst``'s ``recv`` from us)."""
        a = as_numpy(x, "send buffer")
        return self._point(a, dst, True, x, async_op, timeout)

    def recv(self, x, src: int, *, async_op: bool = False, timeout: float | None = None):
        """Receive into ``x`` from rank ``src``; the sizes and dtypes must match."""
        a = as_numpy(x, "recv buffer")
        return self._point(a, src, False, x, async_op, timeout)

    # -- machinery --------------------------------------------------------------------------
    def _output(self, out, shape, dtype, what: str) -> np.ndarray:
        b = as_numpy(out, f"{what} output")
        if not b.flags.writeable:
            raise CommflowError(f"{what} on rank {self.rank}: the output array is read-only; "
                                f"pass a writable out= (or none for a new array)")
        if tuple(b.shape) != tuple(shape) or b.dtype != dtype:
            raise CommflowError(f"{what} on rank {self.rank}: output must have shape "
                                f"{tuple(shape)} and dtype {dtype}, got {tuple(b.shape)} "
                                f"{b.dtype}")
        return b

    def _blocks(self, a: np.ndarray, what: str) -> int:
        if a.ndim == 0 or a.shape[0] % self.size:
            raise CommflowError(f"{what} on rank {self.rank}: the first axis ({a.shape[:1]}) "
                                f"must divide into {self.size} equal blocks")
        return a.shape[0] // self.size

    def _check_root(self, root: int) -> None:
        if not 0 <= root < self.size:
            raise CommflowError(f"root {root} is outside ranks 0..{self.size - 1}")
