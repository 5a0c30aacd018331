"""Point-to-point messages of the ``commflow`` backend: tags, messages to oneself, and
batches that cannot deadlock.

``isend``/``irecv`` (and ``batch_isend_irecv``, which torch issues as single calls for a
backend without coalescing) are held until one of them is waited on or another operation is
issued; everything held then starts as one batch, ordered so that no message size and no order
of the calls can deadlock it: peers in ascending world rank, and with each peer the lower rank
sends before it receives (the pairwise-exchange order of MPI libraries). A batch runs on the
progress thread, one message after another.

A receive from any source (``recv``/``irecv`` without ``src``) runs after the other messages
of its batch and reads a message already set aside for its tag if there is one, else the next
message of the other ranks in turn (round robin from the rank after its last source): it
waits for that rank even when another rank sent first, so every rank must eventually send to
it (as in torch's own tests); ``Work._source_rank()`` and ``dist.recv`` return the sender.

Tags follow gloo: a receive takes the next message from its peer that carries its tag. Each
message is a 24-byte header (tag, bytes, dtype code) followed by the tensor's bytes; a message
for another tag is set aside until a receive with that tag asks for it.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from commflow.errors import CommflowError
from commflow.runtime import CommMismatchError, CommProtocolError, Communicator
from commflow.torch.work import Outcome, Progress


def dtype_code(dtype: torch.dtype) -> int:
    """A number naming ``dtype`` identically in every process."""
    return zlib.crc32(str(dtype).encode())


def tensor_bytes(tensor: torch.Tensor, what: str) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a uint8 array sharing its memory. Raises
    ``CommflowError`` for other tensors."""
    if tensor.device.type != "cpu":
        raise CommflowError(
            f"{what}: tensor is on {tensor.device}; the commflow backend moves CPU tensors"
        )
    if not tensor.is_contiguous():
        raise CommflowError(f"{what}: tensor must be contiguous (call .contiguous())")
    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


_LAST = 1 << 62


@dataclass(eq=False)
class Message:
    """One held send or receive."""

    comm: Communicator
    peer: int | None
    """Peer's rank in ``comm``; None for a receive from any source (set once it ran)."""
    tag: int
    tensor: torch.Tensor
    sending: bool
    what: str
    data: np.ndarray = field(init=False)
    code: int = field(init=False)
    outcome: Outcome = field(init=False, default_factory=Outcome)

    def __post_init__(self) -> None:
        self.data = tensor_bytes(self.tensor, self.what)
        self.code = dtype_code(self.tensor.dtype)

    def order(self) -> tuple[int, int]:
        """Sort key of the deadlock-free order: world rank of the peer, then sends first on
        the lower rank of the pair (and for messages to oneself); receives from any source
        last."""
        if self.peer is None:
            return _LAST, 1
        me, peer = self.comm.ranks[self.comm.rank], self.comm.ranks[self.peer]
        return peer, 0 if self.sending == (me <= peer) else 1


class PointToPoint:
    """Held messages of one commflow world, and the messages set aside by tag. Not
    thread-safe: the world calls :meth:`hold` and :meth:`flush` under its lock; batches run on
    the progress thread."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._held: list[Message] = []
        self._aside: dict[tuple[int, int, int], deque[tuple[int, np.ndarray]]] = {}
        self._next_source: dict[int, int] = {}

    def hold(self, message: Message) -> Outcome:
        """Hold ``message`` until the next :meth:`flush`; returns its outcome."""
        self._held.append(message)
        return message.outcome

    def flush(self) -> None:
        """Start every held message as one batch on the progress thread."""
        if not self._held:
            return
        batch = sorted(self._held, key=Message.order)
        self._held = []
        self._progress.run(lambda: self._run(batch))

    def _run(self, batch: list[Message]) -> None:
        for i, message in enumerate(batch):
            try:
                if message.sending:
                    self._send(message)
                else:
                    self._receive(message)
            except Exception as err:  # fails this message and the rest of its batch
                for failed in batch[i:]:
                    self._progress.settle(failed.outcome, error=err)
                return
            self._progress.settle(message.outcome, [message.tensor])

    def _send(self, m: Message) -> None:
        if m.peer == m.comm.rank:
            self._set_aside(m.comm, m.peer, m.tag, m.code, m.data.copy())
            return
        m.comm.send(np.array([m.tag, m.data.size, m.code], np.int64), m.peer)
        m.comm.send(m.data, m.peer)

    def _source(self, m: Message) -> int:
        """The peer a receive from any source reads: one with a message set aside for its
        tag, else the next other rank in turn after the last source."""
        comm, size = m.comm, m.comm.size
        start = self._next_source.get(comm.comm_id, (comm.rank + 1) % size)
        turn = [(start + i) % size for i in range(size)]
        waiting = [p for p in turn if self._aside.get((comm.comm_id, p, m.tag))]
        others = [p for p in turn if p != comm.rank]
        if not waiting and not others:
            raise CommflowError(f"{m.what}: no other rank to receive from (group of 1)")
        source = (waiting or others)[0]
        self._next_source[comm.comm_id] = (source + 1) % size
        return source

    def _receive(self, m: Message) -> None:
        if m.peer is None:
            m.peer = self._source(m)
        key = (m.comm.comm_id, m.peer, m.tag)
        while True:
            waiting = self._aside.get(key)
            if waiting:
                code, payload = waiting.popleft()
                _check_match(m, code, payload.size)
                m.data[:] = payload
                return
            if m.peer == m.comm.rank:
                raise CommflowError(
                    f"{m.what}: no message to itself with tag {m.tag} was sent before this receive"
                )
            header = np.empty(3, np.int64)
            m.comm.recv(header, m.peer)
            tag, nbytes, code = (int(v) for v in header)
            if nbytes < 0:
                raise CommProtocolError(f"{m.what}: message header announces {nbytes} bytes")
            if tag == m.tag and nbytes == m.data.size and code == m.code:
                m.comm.recv(m.data, m.peer)
                return
            payload = np.empty(nbytes, np.uint8)
            m.comm.recv(payload, m.peer)
            self._set_aside(m.comm, m.peer, tag, code, payload)

    def _set_aside(
        self, comm: Communicator, peer: int, tag: int, code: int, payload: np.ndarray
    ) -> None:
        self._aside.setdefault((comm.comm_id, peer, tag), deque()).append((code, payload))


def _check_match(m: Message, code: int, nbytes: int) -> None:
    if code != m.code or nbytes != m.data.size:
        kind = "another dtype" if code != m.code else str(m.tensor.dtype)
        raise CommMismatchError(
            f"{m.what}: the matching send carries {nbytes} bytes of {kind}, this receive "
            f"expects {m.data.size} bytes of {m.tensor.dtype}; send and receive tensors must "
            f"have the same size and dtype"
        )
