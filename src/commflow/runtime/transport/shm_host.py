"""A host's shared-memory segment as seen by one rank: the byte layout, the rings between
every ordered pair of local ranks (a head counter written only by the producer, a tail
counter written only by the consumer; x86-TSO store order makes a published header's payload
visible), the doorbells (futex words peers set after publishing or freeing a slot), the abort
word, the fast paths' staging areas, the straggler lines and the single-copy path's buffer lines."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from commflow.runtime._futex import futex_wait, futex_wake
from commflow.runtime.errors import CommAbortedError
from commflow.runtime.protocol import HEADER, HEADER_BYTES
from commflow.runtime.shm import SharedRegion

LINE = 64
_MAGIC = 0x636F6D6D666C6F77  # "commflow"
_SLEEP_SLICE = 0.002


@dataclass(frozen=True)
class ShmLayout:
    """Byte layout of a host's segment for ``nlocal`` ranks."""

    nlocal: int
    nslots: int
    slot_bytes: int
    stage_bytes: int

    @property
    def slot_stride(self) -> int:
        """Bytes per slot including its header."""
        return HEADER_BYTES + self.slot_bytes

    @property
    def ring_bytes(self) -> int:
        """Bytes per ring: head and tail lines, then slots."""
        return 2 * LINE + self.nslots * self.slot_stride

    @property
    def rings_offset(self) -> int:
        """Where the rings start (after the control block and the doorbells)."""
        return 4096 + self.nlocal * LINE

    def ring_offset(self, src: int, dst: int) -> int:
        """Offset of the ring carrying ``src -> dst``."""
        return self.rings_offset + (src * self.nlocal + dst) * self.ring_bytes

    @property
    def stage_offset(self) -> int:
        """Start of the per-rank staging areas (shared-buffer fast paths)."""
        return self.rings_offset + self.nlocal * self.nlocal * self.ring_bytes

    @property
    def flags_offset(self) -> int:
        """Start of the per-rank fast-path flag lines."""
        return self.stage_offset + self.nlocal * self.stage_bytes

    @property
    def straggler_offset(self) -> int:
        """Start of the per-rank straggler lines (:mod:`commflow.runtime.straggler`)."""
        return self.flags_offset + self.nlocal * LINE

    @property
    def cma_offset(self) -> int:
        """Start of the per-rank buffer lines of the single-copy fast path
        (:mod:`commflow.runtime.cma`)."""
        return self.straggler_offset + self.nlocal * LINE

    @property
    def total(self) -> int:
        """Segment size in bytes."""
        return self.cma_offset + self.nlocal * LINE


class ShmHost:
    """This rank's view of its host's segment: rings to and from every local peer, doorbells,
    the abort word and the staging areas."""

    def __init__(self, region: SharedRegion, layout: ShmLayout, local_rank: int) -> None:
        self.region = region
        self.layout = layout
        self.me = local_rank
        control = region.array(np.int64, 0, 8)
        if region.owner:
            control[0], control[1] = _MAGIC, layout.nlocal
        self.control = control
        self.abort_word = region.array(np.int64, 64, 3)  # code, rank, seq
        self.dump_word = region.array(np.int32, 88, 1)
        """0, or the global rank + 1 of the first rank that failed and asked every local rank
        to dump its flight record (:mod:`commflow.runtime.flight_dumps`)."""
        self.dump_address = region.address(88)
        self.attached = region.array(np.int32, 128, layout.nlocal)
        bells = region.array(np.int32, 4096, layout.nlocal * LINE // 4).reshape(layout.nlocal, -1)
        self.bells = bells
        self.bell_addr = [region.address(4096 + r * LINE) for r in range(layout.nlocal)]
        n = layout.nlocal
        self.head = [[None] * n for _ in range(n)]
        self.tail = [[None] * n for _ in range(n)]
        self.slots = [[None] * n for _ in range(n)]
        for s in range(n):
            for d in range(n):
                if s == d:
                    continue
                off = layout.ring_offset(s, d)
                self.head[s][d] = region.array(np.int64, off, 1)
                self.tail[s][d] = region.array(np.int64, off + LINE, 1)
                self.slots[s][d] = region.array(np.uint8, off + 2 * LINE,
                                                layout.nslots * layout.slot_stride
                                                ).reshape(layout.nslots, layout.slot_stride)
        self.stage = [region.array(np.uint8, layout.stage_offset + r * layout.stage_bytes,
                                   layout.stage_bytes) for r in range(n)]
        self.flags = [region.array(np.int64, layout.flags_offset + r * LINE, LINE // 8)
                      for r in range(n)]
        self.straggler_lines = [
            region.array(np.float64, layout.straggler_offset + r * LINE, LINE // 8)
            for r in range(n)]
        self.cma = [region.array(np.int64, layout.cma_offset + r * LINE, LINE // 8)
                    for r in range(n)]
        """Per rank: the addresses and lengths of its buffers in its current single-copy call
        (:mod:`commflow.runtime.cma`)."""

    def attach(self, timeout: float) -> None:
        """Announce this rank and wait until every local rank has attached; the creator then
        unlinks the segment's name. Raises ``CommAbortedError`` on timeout."""
        if self.control[0] != _MAGIC and not self.region.owner:
            deadline = time.monotonic() + timeout
            while self.control[0] != _MAGIC:
                if time.monotonic() > deadline:
                    raise CommAbortedError("shared memory segment never initialised by local "
                                           "rank 0")
                time.sleep(1e-3)
        self.attached[self.me] = os.getpid()
        deadline = time.monotonic() + timeout
        while not np.all(self.attached != 0):
            if time.monotonic() > deadline:
                missing = np.flatnonzero(self.attached == 0).tolist()
                raise CommAbortedError(f"local ranks {missing} never attached to shared memory "
                                       f"within {timeout:.0f} s; did they start?")
            time.sleep(1e-3)
        if self.region.owner:
            self.region.unlink()

    # -- rings --------------------------------------------------------------------------
    def free_slot(self, peer: int) -> np.ndarray | None:
        """The next free slot of the ring to ``peer`` (header + payload bytes), or ``None``."""
        head = int(self.head[self.me][peer][0])
        if head - int(self.tail[self.me][peer][0]) >= self.layout.nslots:
            return None
        return self.slots[self.me][peer][head % self.layout.nslots]

    def publish(self, peer: int) -> None:
        """Make the slot returned by :meth:`free_slot` visible to ``peer``."""
        self.head[self.me][peer][0] += 1
        self.ring(peer)

    def incoming(self, peer: int, depth: int = 0) -> np.ndarray | None:
        """The ``depth``-th unconsumed slot from ``peer``, or ``None``."""
        tail = int(self.tail[peer][self.me][0])
        if int(self.head[peer][self.me][0]) - tail <= depth:
            return None
        return self.slots[peer][self.me][(tail + depth) % self.layout.nslots]

    def consume(self, peer: int) -> None:
        """Free the oldest slot from ``peer``."""
        self.tail[peer][self.me][0] += 1
        self.ring(peer)

    @staticmethod
    def header(slot: np.ndarray) -> np.void:
        """The header of a slot."""
        return slot[:HEADER_BYTES].view(HEADER)[0]

    # -- doorbells ------------------------------------------------------------------------
    def ring(self, rank: int) -> None:
        """Tell ``rank`` something changed; wake it if it sleeps."""
        bell = self.bells[rank]
        bell[0] = 1
        if bell[1]:
            futex_wake(self.bell_addr[rank])

    def sleep(self, ready, timeout: float) -> None:
        """Block until the doorbell rings or ``timeout`` passes, unless ``ready()`` is already
        true after announcing the sleep (no lost wake-up beyond one time slice)."""
        bell = self.bells[self.me]
        bell[0] = 0
        bell[1] = 1
        try:
            futex_wake(self.bell_addr[self.me], 0)  # a syscall: orders the stores above
            if not ready() and not self.aborted():
                futex_wait(self.bell_addr[self.me], 0, min(timeout, _SLEEP_SLICE))
        finally:
            bell[1] = 0

    # -- abort ----------------------------------------------------------------------------
    def aborted(self) -> bool:
        """Whether some rank aborted the host."""
        return bool(self.abort_word[0])

    def abort(self, code: int, rank: int, seq: int) -> None:
        """Record an abort (first writer wins in practice) and wake every local rank."""
        if not self.abort_word[0]:
            self.abort_word[1], self.abort_word[2] = rank, seq
            self.abort_word[0] = code
        for r in range(self.layout.nlocal):
            if r != self.me:
                self.ring(r)
