"""The progress engine: runs one rank's planned program over a transport endpoint.

All channels advance in one loop (no thread per step): each channel runs its steps in order,
a step starts once its dependencies are done, and communication steps progress fragment by
fragment. When no channel can move, the engine asks the endpoint to wait (spin briefly, then
block) until something changes or the deadline passes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from commflow.ir import Op
from commflow.runtime.errors import CommError, CommMismatchError, CommTimeoutError
from commflow.runtime.ops import Reducer
from commflow.runtime.plan import PlannedStep, RankPlan, Segment

MISMATCH_GRACE = 2.0
"""Seconds a rank that found a mismatch keeps sending what it posted before it raises, so
that its peers read its messages and name the mismatch too (over a rendezvous engine such as
gloo a message goes out only once the peer asked for it: raising and exiting first would
leave them a reset connection)."""


class Pending(Protocol):
    """A communication in progress."""

    def poll(self) -> bool:
        """Move what can move now; True once complete."""

    def detach(self) -> None:
        """(Sends only) copy the data not yet sent, so its source may be overwritten."""


Sink = Callable[[int, np.ndarray], None]
"""Receives a fragment: ``sink(element_offset, typed_elements)``."""


class Endpoint(Protocol):
    """What the engine needs from a transport, for one operation ``seq``."""

    def start_send(self, peer: int, channel: int, parts: Sequence[np.ndarray]) -> Pending:
        """Begin sending the concatenation of ``parts`` (typed arrays) to ``peer``."""

    def start_recv(self, peer: int, channel: int, elements: int, sink: Sink) -> Pending:
        """Begin receiving ``elements`` items from ``peer``, handed to ``sink`` in order."""

    def idle(self, rounds: int, deadline: float) -> None:
        """Nothing moved for ``rounds`` sweeps in a row: wait a little (spin at first, then
        block) until a peer signals progress; raise if the communicator was aborted."""


def _views(buffers: Sequence[np.ndarray], segments: tuple[Segment, ...]) -> list[np.ndarray]:
    return [buffers[b][s:s + n] for b, s, n in segments]


def _spans(views: list[np.ndarray], offset: int, count: int):
    """Yield ``(view_slice, position in the fragment)`` covering elements
    ``offset .. offset+count`` of the concatenation of ``views``."""
    pos = 0
    for v in views:
        n = len(v)
        if offset < pos + n and offset + count > pos:
            lo = max(offset, pos)
            hi = min(offset + count, pos + n)
            yield v[lo - pos:hi - pos], lo - offset
        pos += n
        if pos >= offset + count:
            return


def _pairwise(a: list[np.ndarray], b: list[np.ndarray]):
    """Aligned slices of two segment lists of equal total length."""
    total = sum(len(v) for v in a)
    pos = 0
    while pos < total:
        for va, at in _spans(a, pos, total - pos):
            n = len(va)
            for vb, bt in _spans(b, pos + at, n):
                yield va[bt:bt + len(vb)], vb
            pos += n
            break


class _Channel:
    __slots__ = ("steps", "index", "pending")

    def __init__(self, steps: tuple[int, ...]) -> None:
        self.steps = steps
        self.index = 0
        self.pending: Pending | None = None


def _overlaps(a: tuple[Segment, ...], b: tuple[Segment, ...]) -> bool:
    return any(x[0] == y[0] and x[1] < y[1] + y[2] and y[1] < x[1] + x[2] for x in a for y in b)


def run_plan(plan: RankPlan, buffers: Sequence[np.ndarray], endpoint: Endpoint,
             reduce: Reducer, *, deadline: float, what: str, seq: int) -> None:
    """Execute ``plan`` on ``buffers`` (input, output, scratch: flat typed arrays).

    Sends are eager, as the verifier assumes: a send step completes once posted and its
    fragments go out in the background, in order per peer; a later step that would overwrite
    data still waiting to go out first has the send copy it. ``what`` names the operation
    (e.g. ``"allreduce #12 (ring)"``) in errors. Raises ``CommTimeoutError`` when ``deadline``
    (``time.monotonic()`` seconds) passes with steps still waiting, naming the peers.
    """
    done = [False] * len(plan.steps)
    channels = [_Channel(c) for c in plan.channels if c]
    remaining = sum(len(c.steps) for c in channels)
    outbox: dict[int, deque[tuple[tuple[Segment, ...], Pending]]] = {}

    def protect(segments: tuple[Segment, ...]) -> None:
        for queue in outbox.values():
            for src, pending in queue:
                if _overlaps(src, segments):
                    pending.detach()

    def start(step: PlannedStep) -> Pending | None:
        if step.op is Op.SEND:
            pending = endpoint.start_send(step.peer, step.channel, _views(buffers, step.src))
            outbox.setdefault(step.peer, deque()).append((step.src, pending))
            return None
        protect(step.dst)
        if step.op.receives:
            dst = _views(buffers, step.dst)
            if step.op is Op.RECV:
                def sink(offset: int, data: np.ndarray, dst=dst) -> None:
                    for view, at in _spans(dst, offset, len(data)):
                        view[...] = data[at:at + len(view)]
            else:
                src = _views(buffers, step.src)

                def sink(offset: int, data: np.ndarray, dst=dst, src=src) -> None:
                    for view, at in _spans(dst, offset, len(data)):
                        for operand, bt in _spans(src, offset + at, len(view)):
                            piece = view[bt:bt + len(operand)]
                            reduce(operand, data[at + bt:at + bt + len(operand)], piece)
            return endpoint.start_recv(step.peer, step.channel, step.elements, sink)
        src, dst = _views(buffers, step.src), _views(buffers, step.dst)
        for a, b in _pairwise(src, dst):
            if step.op is Op.COPY:
                b[...] = a
            else:
                reduce(b, a, b)
        return None

    def advance(ch: _Channel) -> bool:
        nonlocal remaining
        moved = False
        while ch.index < len(ch.steps):
            i = ch.steps[ch.index]
            if ch.pending is None:
                step = plan.steps[i]
                if not all(done[d] for d in step.deps):
                    return moved
                ch.pending = start(step)
                moved = True
            if ch.pending is not None:
                if not ch.pending.poll():
                    return moved
                ch.pending = None
            done[i] = True
            ch.index += 1
            remaining -= 1
            moved = True
        return moved

    def flush() -> bool:
        moved = False
        for queue in outbox.values():
            while queue and queue[0][1].poll():
                queue.popleft()
                moved = True
        return moved

    try:
        rounds = 0
        while remaining or any(outbox.values()):
            moved = flush()
            for ch in channels:
                moved |= advance(ch)
            moved |= flush()
            if moved:
                rounds = 0
                continue
            rounds += 1
            if time.monotonic() > deadline:
                raise _timed_out(plan, channels, outbox, what, seq)
            endpoint.idle(rounds, deadline)
    except CommMismatchError:
        _drain(flush, outbox, endpoint, min(deadline, time.monotonic() + MISMATCH_GRACE))
        raise


def _timed_out(plan: RankPlan, channels: list[_Channel], outbox: dict, what: str,
               seq: int) -> CommTimeoutError:
    """The error of a call whose deadline passed, naming what waits and on which peers."""
    waiting = [plan.steps[c.steps[c.index]] for c in channels if c.index < len(c.steps)]
    peers = {s.peer for s in waiting if s.peer >= 0} | {p for p, q in outbox.items() if q}
    first = (f"channel {waiting[0].channel} waits in a {waiting[0].op.name.lower()} "
             f"with rank {waiting[0].peer}") if waiting else "sends are not consumed"
    return CommTimeoutError(
        f"{what}: timed out; {first}; peers not heard from: {sorted(peers)}. A peer "
        f"may have died or called a different operation; raise the timeout if the work "
        f"is just slow", op=what, seq=seq, peers=tuple(sorted(peers)))


def _drain(flush: Callable[[], bool], outbox: dict, endpoint: Endpoint, until: float) -> None:
    """Let the sends already posted go out until ``until`` (see :data:`MISMATCH_GRACE`); a
    peer that fails meanwhile ends it (the caller raises its own error)."""
    rounds = 0
    try:
        while any(outbox.values()) and time.monotonic() < until:
            if not flush():
                rounds += 1
                endpoint.idle(rounds, until)
    except CommError:
        return
