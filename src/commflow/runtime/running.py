"""How a communicator runs its calls: sequence numbers, flight records, lanes for
asynchronous operations, and each call on the shared-memory fast path or as a program's plan
over the transport (:class:`CallRunner`, the base of
:class:`~commflow.runtime.communicator.Communicator`, which checks the user's arguments)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from commflow.collectives import Collective
from commflow.errors import CommflowError
from commflow.ir import Program
from commflow.runtime import fastpath, flight, flight_dumps, programs, variants
from commflow.runtime.arrays import flat
from commflow.runtime.calls import Call, Handle, check_timeout, in_place
from commflow.runtime.errors import CommAbortedError, CommError, CommTimeoutError
from commflow.runtime.executor import run_plan
from commflow.runtime.ops import Reducer, finish, reducer
from commflow.runtime.protocol import Signature
from commflow.runtime.transport.shm import ShmEndpoint
from commflow.runtime.world import WorldSpec

_ROOTED = frozenset(c for c in Collective if c.rooted)
_REDUCES = frozenset(c for c in Collective if c.reduces)
_ALLREDUCE = Collective.ALLREDUCE.value

P2P_CHANNEL = 1 << 30
"""Channel id reserved for point-to-point messages."""
_Resolved = tuple[str, "variants.Variant | None"]
"""An algorithm's name as a call runs it and, on the fast path, its variant."""


def _as_run(name: str, coll: Collective, staged: int, nranks: int) -> _Resolved:
    """``name`` and no variant for a program; a fast-path variant by how it cuts a call of
    ``coll`` staging ``staged`` bytes (``shm`` where as the defaults), with that variant."""
    if not variants.is_fast(name):
        return name, None
    options = variants.effective(variants.variant(name), coll, staged, nranks)
    return options.name, options


class CallRunner:
    """Runs a communicator's calls in order; the subclass sets the attributes annotated here
    before it calls :meth:`__init__`."""

    spec: WorldSpec
    transport: object
    timeout: float
    ranks: list[int]
    comm_id: int
    rank: int
    size: int
    _flight: flight.FlightRecorder | None
    _fast: fastpath.SharedBufferPaths | None
    _host: object

    def __init__(self, slots: int) -> None:
        self._broken: str | None = None
        self._seq = 0
        self._p2p: dict[tuple[int, bool], int] = {}
        self._slots = slots
        self._lanes: list[ThreadPoolExecutor] | None = None
        self._scratch_buffers: dict[tuple[str, int], np.ndarray] = {}
        self._signatures: dict[tuple, Signature] = {}
        self._reducers: dict[tuple[str, str], Reducer] = {}
        self._resolved: dict[tuple, tuple[_Resolved, _Resolved]] = {}
        self._checked: set[tuple[Collective, str]] = set()

    def _submit(self, call: Call, result, async_op: bool, timeout: float | None):
        if timeout is not None:
            check_timeout(timeout, f"{call.collective.value} on rank {self.rank}")
        if not isinstance(call.algo, str | Program):
            raise CommflowError(f"{call.collective.value} on rank {self.rank}: algo must be "
                                f"'auto', an algorithm's name or a Program, got {call.algo!r}")
        if isinstance(call.algo, str):
            if (call.collective, call.algo) not in self._checked:  # once per name
                programs.check_algorithm(call.collective, call.algo)
                if len(self._checked) > 1024:
                    self._checked.clear()
                self._checked.add((call.collective, call.algo))
        else:
            call.algo = programs.adopt(call.algo, call.collective, self.size, call.root,
                                       self.rank)
        call.reduce = reducer(call.op, call.send.dtype)
        seq = self._next_seq()
        entry = None if self._flight is None else self._flight.record(
            seq, call.collective.value, call.send.dtype, call.unit * call.send.dtype.itemsize,
            started=False, peer=None, algo=call.algo,
            reduce=call.op if call.collective in _REDUCES else None,
            root=call.root if call.collective in _ROOTED else None)
        return self._dispatch(lambda: self._run(call, timeout, seq, entry), result, async_op,
                              seq, entry)

    def _small_allreduce(self, a: np.ndarray, b: np.ndarray, op: str,
                         timeout: float | None) -> None:
        """The latency path: a synchronous allreduce of at most ``variants.ONE_SHOT`` bytes
        on the shared-memory fast path, with what :meth:`_run` does for it and nothing
        else (same sequence numbers, signatures and errors)."""
        dtype = a.dtype
        key = (op, dtype.str)
        reduce = self._reducers.get(key)
        if reduce is None:
            reduce = self._reducers[key] = reducer(op, dtype)
        seq = self._next_seq()
        fr = self._flight
        entry = None if fr is None else fr.record(
            seq, _ALLREDUCE, dtype, a.nbytes, reduce=op, root=None, peer=None,
            algo=variants.NAME, started=True)
        signature = self._signature(Collective.ALLREDUCE, dtype, a.nbytes, op, 0,
                                    variants.NAME)
        recv = b.reshape(-1)
        send = a.reshape(-1)
        if np.may_share_memory(send, recv) and not in_place(send, recv, self.rank):
            send = send.copy()
        self._fast.small_allreduce(send, recv, reduce, seq, signature,
                                   self._deadline(timeout))
        finish(op, recv, self.size)
        if entry is not None:
            fr.complete(entry)

    def _dispatch(self, work: Callable[[], None], result, async_op: bool, seq: int,
                  entry=None):
        """Run ``work`` (operation ``seq``, flight record ``entry``) now, or once async
        operations were used on lane ``seq % slots``: a thread per slot of the transport (see
        :mod:`commflow.runtime.transport.engine`; one over shared memory), first in first out,
        so every rank runs the same operations in the same order on each lane, each lane on
        engine tags of its own, and up to ``slots`` operations progress at once."""
        self._check_usable()
        if not async_op and self._lanes is None:
            self._guarded(work, entry)
            return result
        if self._lanes is None:
            self._lanes = [ThreadPoolExecutor(1, thread_name_prefix=f"commflow-{i}")
                           for i in range(self._slots)]
        lane = self._lanes[seq % self._slots]
        handle = Handle(lane.submit(self._guarded, work, entry), result)
        return handle if async_op else handle.wait()

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise CommAbortedError(f"rank {self.rank}: this communicator is unusable after "
                                   f"{self._broken}; its ranks may be out of step, so create a "
                                   f"new communicator (commflow.init) to continue")

    def _guarded(self, work: Callable[[], None], entry=None) -> None:
        """Run ``work`` (the operation of flight record ``entry``, if known); a timeout
        marks the communicator unusable (see :meth:`_check_usable`); any failure dumps the
        flight record (see :func:`commflow.runtime.flight_dumps.report_failure`)."""
        self._check_usable()
        try:
            work()
        except CommError as err:
            if isinstance(err, CommTimeoutError):
                self._broken = f"a timeout ({err.op} #{err.seq})"
            if self._flight is not None:
                flight_dumps.report_failure(self._flight, self._host, self.spec.rank, err, entry)
            raise

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    def _deadline(self, timeout: float | None) -> float:
        return time.monotonic() + (self.timeout if timeout is None else timeout)

    def _scratch(self, elements: int, dtype: np.dtype, lane: int) -> np.ndarray:
        key = (dtype.str, lane)
        buf = self._scratch_buffers.get(key)
        if buf is None or len(buf) < elements:
            buf = np.empty(elements, dtype)
            self._scratch_buffers[key] = buf
        return buf

    def _signature(self, coll: Collective, dtype: np.dtype, nbytes: int, op: str, root: int,
                   name: str) -> Signature:
        key = (coll, dtype.str, nbytes, op, root, name)
        signature = self._signatures.get(key)
        if signature is None:
            if len(self._signatures) > 4096:
                self._signatures.clear()
            signature = Signature("collective", coll.value, str(dtype), nbytes, op, root, name)
            self._signatures[key] = signature
        return signature

    def _resolve(self, algo: str, coll: Collective, nbytes: int, sizes: tuple[int, int]
                 ) -> tuple[_Resolved, _Resolved]:
        """What a call of ``algo`` (``nbytes`` per unit of the call; ``sizes``: its flat input's
        and output's bytes) runs out of place and in place: the algorithm's name, a fast-path
        variant by the name it runs under (``shm`` where it cuts the call as the defaults do,
        :func:`~commflow.runtime.variants.effective`) with that variant, or a program's name
        with ``None``. ``auto`` follows :func:`~commflow.runtime.programs.choices`. Remembered
        per call shape and tuning-table generation, so that ``auto`` and a named algorithm
        cost one lookup alike."""
        key = (algo, coll, nbytes, sizes, programs.generation)
        resolved = self._resolved.get(key)
        if resolved is None:
            if len(self._resolved) > 4096:
                self._resolved.clear()
            names = (algo, algo) if algo != "auto" else programs.choices(
                coll, self.size, max(sizes), fast_path=self._fast is not None)
            staged = nbytes * (self.size if coll is Collective.REDUCESCATTER else 1)
            resolved = self._resolved[key] = tuple(
                _as_run(name, coll, staged, self.size) for name in names)
        return resolved

    def _run(self, call: Call, timeout: float | None, seq: int, entry) -> None:
        coll = call.collective
        dtype = call.send.dtype
        nbytes = call.unit * dtype.itemsize
        send, recv = flat(call.send), flat(call.recv)
        out_of_place, inside = self._resolve(call.algo, coll, nbytes, (send.nbytes, recv.nbytes))
        shared = np.may_share_memory(send, recv)  # cheap; in_place reads addresses
        placed = shared and in_place(send, recv, self.rank)
        name, options = inside if placed else out_of_place
        fast = options is not None
        if entry is not None:
            self._flight.start(entry, name)
        root = call.root if coll in _ROOTED else None
        if coll is not Collective.BROADCAST and shared and not (fast and placed):
            send = send.copy()  # a program may read input it has already overwritten
        signature = self._signature(coll, dtype, nbytes, call.op, call.root, name)
        reduce = call.reduce
        if fast:
            if self._fast is None:
                raise CommflowError(f"algo {name!r} runs only on the world communicator of "
                                    f"one host; use a program algorithm here")
            self._fast.run(coll, send, recv, call.unit, reduce, call.root, seq=seq,
                           signature=signature, deadline=self._deadline(timeout),
                           options=options, placed=placed)
        else:
            plan = programs.rank_plan(coll, name, self.size, root, self.rank, call.unit)
            what = f"{coll.value} #{seq} ({name}) on rank {self.rank}"
            endpoint = self.transport.endpoint(seq, signature, dtype, self.ranks, self.comm_id)
            scratch = self._scratch(plan.scratch_elements, dtype, seq % self._slots)
            run_plan(plan, (send, recv, scratch), endpoint,
                     reduce, deadline=self._deadline(timeout), what=what, seq=seq)
            if root is not None:
                self._agree(endpoint, seq, signature, timeout)
        if coll in _REDUCES and (coll is not Collective.REDUCE or self.rank == call.root):
            finish(call.op, recv, self.size)
        if entry is not None:
            self._flight.complete(entry)

    def _agree(self, endpoint, seq: int, signature: Signature, timeout: float | None) -> None:
        """End rooted call ``seq``: it may need no message from a peer that called something
        else (broadcasts whose roots differ), so compare the ranks' calls. With the fast
        path, every rank posts ``(seq, signature)`` and waits for the others' (those calls
        may be followed by fast-path calls only, which read no stray message); else, a
        local peer's posted call (a remote one's stray messages fail the next call)."""
        if self._fast is not None:
            self._fast.phase(endpoint, seq, signature, self._deadline(timeout))
        elif isinstance(endpoint, ShmEndpoint):
            endpoint.check_peers_calls()

    def _point(self, a: np.ndarray, peer: int, sending: bool, result, async_op: bool,
               timeout: float | None):
        if not 0 <= peer < self.size or peer == self.rank:
            raise CommflowError(f"{'send' if sending else 'recv'} on rank {self.rank}: peer "
                                f"{peer} must be another rank in 0..{self.size - 1}")
        if timeout is not None:
            check_timeout(timeout, f"{'send' if sending else 'recv'} on rank {self.rank}")

        count = self._p2p.get((peer, sending), 0)
        self._p2p[(peer, sending)] = count + 1
        fr = self._flight
        entry = None if fr is None else fr.record(
            count, "send" if sending else "recv", a.dtype, a.nbytes, reduce=None, root=None,
            peer=peer, algo="p2p", started=False)

        def work() -> None:
            if entry is not None:
                fr.start(entry, "p2p")
            signature = Signature("p2p", "sendrecv", a.dtype.name, a.nbytes, "none", 0, "p2p")
            endpoint = self.transport.endpoint(count, signature, a.dtype, self.ranks,
                                               self.comm_id)
            data = flat(a)
            if sending:
                pending = endpoint.start_send(peer, P2P_CHANNEL, [data])
            else:
                def sink(offset: int, chunk: np.ndarray) -> None:
                    data[offset:offset + len(chunk)] = chunk
                pending = endpoint.start_recv(peer, P2P_CHANNEL, data.size, sink)
            what = f"{'send to' if sending else 'recv from'} rank {peer} #{count}"
            deadline = self._deadline(timeout)
            rounds = 0
            while not pending.poll():
                rounds += 1
                if time.monotonic() > deadline:
                    raise CommTimeoutError(f"{what} on rank {self.rank}: timed out; rank {peer} "
                                           f"never matched it", op=what, seq=count,
                                           peers=(peer,))
                endpoint.idle(rounds, deadline)
            if entry is not None:
                fr.complete(entry)

        return self._dispatch(work, result, async_op, count, entry)
