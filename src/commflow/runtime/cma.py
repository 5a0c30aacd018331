"""The single-copy fast path (``copy="cma"``, ``algo="shm:copy=cma"``): ranks read each other's
buffers with Linux cross-memory attach (``process_vm_readv``), as Open MPI's shared-memory
transport does for large messages, instead of copying through the staging areas.

Every rank writes the addresses and lengths of its input and output in its line of the
host's segment (:attr:`ShmHost.cma <commflow.runtime.transport.shm_host.ShmHost.cma>`;
nothing is pickled) and raises its flag (the fast path's flag protocol: sequence number and
signature, so ranks on different variants fail with ``CommMismatchError``); then:

- **allgather**: in place, rank r reads every peer's input straight into the peer's block of
  its output: one copy per byte, where the staged path copies in and out; out of place, it
  copies ``segment`` bytes of its input into its own block, raises a flag and reads the same
  piece of every peer's block from the peer's output, still in the peer's caches;
- **reduce-scatter**: rank r reads block r of every peer's input into a scratch of
  ``segment`` bytes at a time and reduces it into its output (its own block first, then the
  peers by rank);
- **allreduce** (two-shot): rank r reduces block r of the array that way into its output and
  writes each reduced segment, still in the caches, into every peer's output
  (``process_vm_writev``);
- **broadcast**: every rank but the root reads the root's input.

A last flag says that every rank finished reading and writing the others' buffers, so no rank
returns (and lets its caller reuse a buffer) while a peer still uses it. Each element is
reduced by one rank only, so every rank gets the same bits. In place, a block is read and
written by its reducing rank only, each segment read before it is written. Where the kernel
refuses the copy (``EPERM``: another user, Yama's ``ptrace_scope`` 2 or 3) the rank aborts
the host and raises :class:`~commflow.runtime.errors.CrossMemoryError` naming the operation,
the rank, the peer and what to do; :func:`permitted` asks every rank beforehand (online
tuning skips the variant where it is not).
"""

from __future__ import annotations

import errno
from collections.abc import Callable

import numpy as np

from commflow.collectives import Collective
from commflow.runtime import _cma
from commflow.runtime.errors import CrossMemoryError
from commflow.runtime.ops import Reducer
from commflow.runtime.protocol import Signature
from commflow.runtime.transport.shm import ABORT_ERROR, ShmEndpoint

_SEND, _SEND_BYTES, _RECV, _RECV_BYTES = 1, 2, 3, 4


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class CrossMemoryPaths:
    """The single-copy fast path of one rank (``phase`` is the fast path's flag wait)."""

    def __init__(self, nranks: int, rank: int,
                 phase: Callable[[ShmEndpoint, int, Signature, float, int], None]) -> None:
        self.n = nranks
        self.me = rank
        self.phase = phase
        self._scratch: dict[str, np.ndarray] = {}

    def run(self, endpoint: ShmEndpoint, collective: Collective, send: np.ndarray,
            recv: np.ndarray, unit: int, reduce: Reducer, root: int, *, seq: int,
            signature: Signature, deadline: float, segment: int, spin: int) -> None:
        """Run ``collective`` on flat arrays (contiguous, as the communicator passes them);
        reductions read ``segment`` bytes of a peer's block at a time."""
        host = endpoint.t.host
        _cma.allow_readers()
        line = host.cma[self.me]
        line[0] = seq
        line[_SEND], line[_SEND_BYTES] = _address(send), send.nbytes
        line[_RECV], line[_RECV_BYTES] = _address(recv), recv.nbytes
        wait = lambda: self.phase(endpoint, seq, signature, deadline, spin)  # noqa: E731
        wait()
        reader = _Reader(endpoint, self.me, seq, signature)
        n, me = self.n, self.me
        others = [r for r in range(n) if r != me]
        if collective is Collective.ALLGATHER:
            block = unit * send.itemsize  # every rank in place, by the published lines:
            if all(host.cma[r][_SEND] == host.cma[r][_RECV] + r * block for r in range(n)):
                for r in others:  # the same flags on every rank, whatever its own placement
                    reader.read(r, _SEND, 0, recv[r * unit:(r + 1) * unit])
            else:
                self._gather_copied(reader, others, send, recv, unit, segment, wait)
        elif collective is Collective.REDUCESCATTER:
            self._reduce(reader, others, send, me * unit, recv, unit, reduce, segment)
        elif collective is Collective.ALLREDUCE:
            bounds = [unit * r // n for r in range(n + 1)]
            lo, hi = bounds[me], bounds[me + 1]
            self._reduce(reader, others, send, lo, recv[lo:hi], hi - lo, reduce, segment,
                         push=True)
        elif me != root:
            reader.read(root, _SEND, 0, recv[:unit])
        wait()

    def _gather_copied(self, reader: _Reader, others: list[int], send: np.ndarray,
                       recv: np.ndarray, unit: int, segment: int, wait) -> None:
        """Allgather where some rank is out of place: copy ``segment`` bytes of the input into
        this rank's block of the output (unless in place), raise a flag, read the same piece
        of every peer's block from the peer's output while it is still in the peer's caches;
        then the next piece."""
        step = max(1, segment // send.itemsize)
        me, size = self.me, send.itemsize
        copy = _address(recv) + me * unit * size != _address(send)
        for lo in range(0, unit, step):
            hi = min(unit, lo + step)
            if copy:
                recv[me * unit + lo:me * unit + hi] = send[lo:hi]
            wait()
            for r in others:
                reader.read(r, _RECV, (r * unit + lo) * size, recv[r * unit + lo:r * unit + hi])

    def _reduce(self, reader: _Reader, others: list[int], send: np.ndarray, start: int,
                out: np.ndarray, count: int, reduce: Reducer, segment: int,
                push: bool = False) -> None:
        """``out[:count]`` = elements ``start:start + count`` of every rank's input, reduced
        (this rank's first, then the peers by rank), reading ``segment`` bytes at a time;
        ``push``: each reduced segment is also written to the same elements of every peer's
        output while it is in the caches."""
        step = max(1, segment // send.itemsize)
        scratch = self._scratch.get(send.dtype.str)
        if scratch is None or len(scratch) < step:
            scratch = self._scratch[send.dtype.str] = np.empty(step, send.dtype)
        for lo in range(0, count, step):
            hi = min(count, lo + step)
            own, dst = send[start + lo:start + hi], out[lo:hi]
            if not others:
                dst[...] = own
            for j, r in enumerate(others):
                piece = scratch[:hi - lo]
                reader.read(r, _SEND, (start + lo) * send.itemsize, piece)
                reduce(own if j == 0 else dst, piece, dst)
            if push:
                for r in others:
                    reader.read(r, _RECV, (start + lo) * send.itemsize, dst, write=True)


class _Reader:
    """Reads peers' published buffers for one call; a failed read aborts the host."""

    def __init__(self, endpoint: ShmEndpoint, me: int, seq: int, signature: Signature) -> None:
        self.host = endpoint.t.host
        self.me = me
        self.seq = seq
        self.signature = signature

    def read(self, peer: int, which: int, offset: int, into: np.ndarray, *,
             write: bool = False) -> None:
        """Fill ``into`` from ``peer``'s input (``_SEND``) or output (``_RECV``) at byte
        ``offset`` (``write``: write ``into`` there instead)."""
        nbytes = into.nbytes
        if not nbytes:
            return
        theirs = self.host.cma[peer]
        if offset + nbytes > theirs[which + 1]:
            self._fail(peer, f"rank {peer} published a {int(theirs[which + 1])}-byte buffer, "
                             f"{offset + nbytes} bytes needed: the ranks disagree on the call")
        pid = int(self.host.attached[peer])
        code = _cma.read(pid, _address(into), int(theirs[which]) + offset, nbytes, write=write)
        if code:
            what = f"process_vm_writev of {nbytes} bytes to" if write else \
                f"process_vm_readv of {nbytes} bytes from"
            self._fail(peer, f"{what} rank {peer} (pid {pid}) failed: "
                             f"{_cma.describe(code)}{_advice(code)}")

    def _fail(self, peer: int, why: str) -> None:
        self.host.abort(ABORT_ERROR, self.me, self.seq)
        sig = self.signature
        raise CrossMemoryError(f"{sig.collective} #{self.seq} ({sig.algorithm}) on rank {self.me}: "
                               f"{why}")


def _advice(code: int) -> str:
    if code not in (errno.EPERM, errno.EACCES):
        return ""
    scope = _cma.ptrace_scope()
    where = "" if scope is None else f" (kernel.yama.ptrace_scope is {scope})"
    return (f": this rank may not read its peers' memory{where}. Run every rank as the same "
            f"user with ptrace_scope 0 or 1 (sysctl kernel.yama.ptrace_scope=1), or in a "
            f"container with ptrace allowed, or use algo='shm' (copies through the staging "
            f"areas, no permission needed)")


def permitted(comm) -> bool:
    """Whether every rank of ``comm`` (the world communicator of one host, with the fast
    path) may read every other's memory; collective, every rank returns the same."""
    _cma.allow_readers()
    comm.barrier()
    host = comm.transport.host
    ok = all(_cma.probe(int(pid)) == 0 for pid in host.attached.tolist())
    return bool(comm.allreduce(np.array([int(ok)], np.int64), op="min")[0])
