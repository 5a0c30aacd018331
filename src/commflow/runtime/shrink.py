"""Shrinking a communicator to its surviving ranks (NCCL's ``ncclCommShrink``): the agreement
behind :meth:`commflow.runtime.Communicator.shrink`.

The ranks of one host agree through a board in the control block of the segment they already
share (``_AREA`` below): it survives any rank's death, and every survivor has it mapped.

- **Liveness** is the pid each rank wrote when it attached (the dead-rank detection of the
  transport): a rank that has exited, or was killed, is dead forever; a live one stays live
  until it exits.
- **One writer per decision.** Each rank writes only its own ``state`` word. The membership
  and the outcome are written only by the **coordinator**: the lowest live rank before the
  membership is decided, the lowest live member after. All lower ranks are dead for good, so
  two live ranks never both act as coordinator, and a successor takes over only after its
  predecessor has exited (its stores are then all visible and it writes no more).
- **Membership** (phase 1): the coordinator waits until every live rank has called ``shrink``
  (or given up), or half the timeout; the members are the live ranks that called, unless one
  of them gave up: then the outcome is that failure, for everyone. It creates the new segment
  *before* it commits ``decided``, so a committed membership names a segment that exists. A
  live rank that had not called by then is left out (it raises when it calls).
- **Outcome** (phase 2): members attach to the new segment and mark themselves ready; the
  coordinator commits success once every member is ready, or failure once a member died or
  gave up before being ready, or at the timeout. Every rank returns or raises what the
  committed outcome says, so survivors never disagree: the same members, or the same error.
- **Giving up** when its timeout passes before a membership: a rank marks itself withdrawn,
  fences, and reads the coordinator's state; the coordinator marks itself joined, fences, and
  reads the others' (Dekker's pattern, a futex syscall as the full barrier). One of the two
  sees the other: either the rank raises ``CommTimeoutError`` and the coordinator, when it
  comes, fails the shrink for everyone, or the rank waits for the coordinator, whose outcome
  then binds it.

A coordinator frozen (SIGSTOP) for longer than the timeout is indistinguishable from a slow
one; the others then raise ``CommTimeoutError`` after twice the timeout and agreement is not
guaranteed. Crashes, kills and exits at any point are covered.
"""

from __future__ import annotations

import os
import secrets
import time
import zlib
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from commflow.errors import CommflowError
from commflow.runtime._futex import futex_wait, futex_wake
from commflow.runtime.errors import CommAbortedError, CommTimeoutError
from commflow.runtime.init import shm_layout
from commflow.runtime.shm import SHM_DIR, SharedRegion, segment_name
from commflow.runtime.transport.shm import ShmHost, ShmTransport, _alive

if TYPE_CHECKING:
    from commflow.runtime.communicator import Communicator

MAX_RANKS = 256
"""Ranks a communicator may have to be shrunk (the board's size)."""

_AREA = 2048  # bytes into the segment's 4 KiB control block (below: abort, dump, pid words)
IDLE, JOINED, READY, WITHDRAWN = 0, 1, 2, 3
OK, DIED, GAVE_UP, LATE, NO_SEGMENT = 1, 2, 3, 4, 5
_NAP = 0.005


class _Board:
    """The shrink board in a host segment's control block."""

    def __init__(self, host: ShmHost) -> None:
        region = host.region
        self.host = host
        self.decided = region.array(np.int64, _AREA, 1)
        self.nonce = region.array(np.int64, _AREA + 8, 1)
        self.outcome = region.array(np.int64, _AREA + 16, 2)  # code, local rank it names
        self.member = region.array(np.uint8, _AREA + 64, MAX_RANKS)
        self.state = region.array(np.int32, _AREA + 64 + MAX_RANKS, MAX_RANKS)
        self.n = host.layout.nlocal
        self.pids = host.attached.tolist()

    def alive(self, local: int) -> bool:
        return local == self.host.me or _alive(self.pids[local])

    def members(self) -> list[int]:
        return [r for r in range(self.n) if self.member[r]]

    def coordinator(self) -> int | None:
        """The lowest live rank (before the membership is decided) or member (after)."""
        pool = self.members() if self.decided[0] else range(self.n)
        return next((r for r in pool if self.alive(r)), None)

    def set_state(self, value: int) -> None:
        self.state[self.host.me] = value
        self.fence()
        self.wake()

    def fence(self) -> None:
        """A full memory barrier: the futex syscall (see the module's docstring)."""
        futex_wake(self.host.bell_addr[self.host.me], 0)

    def wake(self) -> None:
        for r in range(self.n):
            if r != self.host.me:
                self.host.ring(r)

    def nap(self) -> None:
        """Sleep on this rank's doorbell for a few ms (not on the abort word: it is set)."""
        host = self.host
        bell = host.bells[host.me]
        bell[0] = 0
        bell[1] = 1
        try:
            futex_wait(host.bell_addr[host.me], 0, _NAP)
        finally:
            bell[1] = 0


class _Build:
    """This member's view of the new segment."""

    def __init__(self, name: str, nmembers: int, local: int, *, create: bool) -> None:
        layout = shm_layout(nmembers)
        region = (SharedRegion.create(name, layout.total) if create
                  else SharedRegion.attach(name, layout.total, 1.0))
        self.host = ShmHost(region, layout, local)
        self.host.attached[local] = os.getpid()


def shrink_communicator(comm: Communicator, timeout: float) -> Communicator:
    """The survivors of ``comm`` as a new communicator (see
    :meth:`~commflow.runtime.Communicator.shrink`, whose checks this assumes)."""
    host = comm.transport.host
    if host.layout.nlocal > MAX_RANKS:
        raise CommflowError(f"shrink on rank {comm.rank}: at most {MAX_RANKS} ranks can shrink, "
                            f"this communicator has {host.layout.nlocal}")
    board = _Board(host)
    me = host.me
    what = f"shrink of communicator {comm.comm_id} on rank {comm.rank}"
    if board.state[me] != IDLE:
        raise CommflowError(f"{what}: shrink() was already called on this communicator; use "
                            f"the communicator it returned")
    start = time.monotonic()
    board.set_state(JOINED)
    build: _Build | None = None
    withdrawn = False
    try:
        while not board.outcome[0] and not (board.decided[0] and not board.member[me]):
            coordinator = board.coordinator()
            if coordinator == me:
                build = _coordinate(board, build, start, timeout, comm.spec.job)
                continue
            now = time.monotonic()
            if board.decided[0] and build is None:
                build = _join(board, comm.spec.job)
            elif not board.decided[0] and not withdrawn and now > start + timeout:
                board.set_state(WITHDRAWN)
                withdrawn = True
                if board.state[coordinator] == IDLE and not board.decided[0]:
                    raise CommTimeoutError(
                        f"{what}: rank {_global(comm, coordinator)} (the coordinator, the lowest "
                        f"live rank) is alive but did not call shrink() within {timeout:g} s",
                        op="shrink", seq=-1, peers=(_global(comm, coordinator),))
            if now > start + 2.5 * timeout:
                raise CommTimeoutError(
                    f"{what}: rank {_global(comm, coordinator)} (the coordinator) decided nothing "
                    f"within {2.5 * timeout:g} s; is it stopped?", op="shrink", seq=-1,
                    peers=(_global(comm, coordinator),))
            board.nap()
        return _finish(comm, board, build, what)
    except BaseException:
        if build is not None:
            build.host.region.unlink()
        raise


def _join(board: _Board, job: str) -> _Build | None:
    """Attach to the decided segment and mark this rank ready; ``None`` when the segment is
    already gone (an outcome was committed: the caller reads it)."""
    members = board.members()
    name = segment_name(job, f"shrink{int(board.nonce[0]):x}")
    try:
        build = _Build(name, len(members), members.index(board.host.me), create=False)
    except CommflowError:
        return None
    board.set_state(READY)
    return build


def _coordinate(board: _Board, build: _Build | None, start: float, timeout: float,
                job: str) -> _Build | None:
    """Act as the coordinator from wherever a predecessor stopped: decide the membership if
    nobody did, then commit the outcome."""
    n, state = board.n, board.state
    if not board.decided[0]:
        while time.monotonic() < start + timeout / 2 and any(
                state[r] == IDLE and board.alive(r) for r in range(n)):
            board.nap()
        seen = state[:n].copy()
        quit_ = [r for r in range(n) if seen[r] == WITHDRAWN and board.alive(r)]
        if quit_:
            _commit(board, GAVE_UP, quit_[0])
            return None
        members = [r for r in range(n) if seen[r] == JOINED and board.alive(r)]
        if board.nonce[0]:  # a predecessor died before its decision: drop its segment
            (SHM_DIR / segment_name(job, f"shrink{int(board.nonce[0]):x}")).unlink(
                missing_ok=True)
        board.nonce[0] = nonce = secrets.randbits(63) or 1
        try:
            build = _Build(segment_name(job, f"shrink{nonce:x}"), len(members), 0, create=True)
        except CommflowError:
            _commit(board, NO_SEGMENT, board.host.me)
            raise
        board.member[:] = 0
        board.member[members] = 1
        board.state[board.host.me] = READY
        board.decided[0] = 1
        board.fence()
        board.wake()
    elif build is None:
        build = _join(board, job)
    members = board.members()
    while True:
        unready = [r for r in members if state[r] != READY]
        if not unready:
            code, culprit = OK, -1
            break
        dead = [r for r in unready if not board.alive(r)]
        quit_ = [r for r in unready if state[r] == WITHDRAWN]
        if dead or quit_:
            code, culprit = (DIED, dead[0]) if dead else (GAVE_UP, quit_[0])
            break
        if time.monotonic() > start + timeout:
            code, culprit = LATE, unready[0]
            break
        board.nap()
    # every member that will ever attach has: the name can go before anyone returns
    (SHM_DIR / segment_name(job, f"shrink{int(board.nonce[0]):x}")).unlink(missing_ok=True)
    _commit(board, code, culprit)
    return build


def _commit(board: _Board, code: int, culprit: int) -> None:
    """Write the outcome (the culprit first: ``code`` commits it) and wake every rank."""
    board.outcome[1] = culprit
    board.outcome[0] = code
    board.fence()
    board.wake()


def _finish(comm: Communicator, board: _Board, build: _Build | None,
            what: str) -> Communicator:
    """Return the new communicator, or raise the committed failure."""
    if board.decided[0] and not board.member[board.host.me]:
        raise CommAbortedError(
            f"{what}: the survivors formed a communicator without this rank (it called "
            f"shrink() after they had decided); it cannot rejoin: restart the job (commflow "
            f"run --max-restarts)")
    code, culprit = (int(x) for x in board.outcome)
    if code != OK or build is None:
        who = f"rank {_global(comm, culprit)}"
        reason = {DIED: f"{who} died before it joined the new communicator",
                  GAVE_UP: f"{who} gave up (its timeout passed) before it joined",
                  LATE: f"{who} did not join within the coordinator's timeout",
                  NO_SEGMENT: f"{who} could not create its shared memory (see its error)"}.get(
                      code, "this rank could not attach to the new communicator")
        raise CommAbortedError(f"{what}: no communicator was formed: {reason}; restart the job "
                               f"(commflow run --max-restarts)")
    members = board.members()
    ranks = [comm.transport.ranks[r] for r in members]
    local = members.index(board.host.me)
    spec = replace(comm.spec, local_rank=local, local_size=len(members))
    comm_id = zlib.crc32(f"{comm.comm_id}/shrink/{int(board.nonce[0])}".encode()) & 0x7FFFFFFF
    return type(comm)(spec, ShmTransport(build.host, ranks), timeout=comm.timeout, ranks=ranks,
                      comm_id=comm_id or 1, flight_config=comm.flight_config, owns_host=True)


def _global(comm: Communicator, local: int) -> int:
    return comm.transport.ranks[local]
